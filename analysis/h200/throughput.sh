#!/usr/bin/env bash
# Issue 23 item 4 on the GPU: `alibi bench conform` before and after units were judged in batches, in one call,
# with the per-unit results of both compared.
#
#   BEFORE=COMMIT bash analysis/h200/ecosystem_chain.sh throughput
#
# (through the chain, which unpacks gpu_payload/src.tar.gz, the "after" code, to /tmp/src and sets up the
# carried CUTLASS libraries and GGUF parts). gpu_payload/src-before.tar.gz holds the "before" commit
# (analysis/h200/pack_source.sh COMMIT gpu_payload/src-before.tar.gz). Sources, each for both commits, in turn:
# the Qwen3-1.7B preset at M = 512 (14 units), `smollm2-135m-full` at M = 512 (the SmolLM2 capture's 210 shapes,
# synthetic, 420 units) and, once both GGUF parts have arrived in /tmp/alibi, the SmolLM2-135M W8A8 capture
# itself (210 tiles, window 0 of wikipedia-8x512, captured with triton; 420 units). Pair cutlass vs triton, check
# device cuda, both regimes and every check, REPEATS (default 5) timed repeats of each kind after the bench's own
# warm-up. For each source `alibi conform` of each commit writes report.json with SOURCE_DATE_EPOCH fixed; their
# results (everything but the environment and the kernels' evidence) must be equal. Then the plain walls (no stage
# timer: what a user's `alibi conform` pays) of both commits by one driver, analysis/h200/wall_conform.py, 5 runs
# each, before and after in turn twice. A cProfile of the "after" bench closes.
# THROUGHPUT_PRESET=0 / THROUGHPUT_SYNTHETIC=0 leave the preset / the synthetic SmolLM2 shapes out; THROUGHPUT_WALLS=0
# leaves out the walls by wall_conform.py (the benches' own plain walls stay), THROUGHPUT_PROFILE=0 the cProfiles.
# AFTER_ARGS: options of the "after" commit's bench and conform only (e.g. --no-cuda-graphs); AFTER_ENV: its walls'
# environment (e.g. ALIBI_GRAPHS=0 or 1; unset, each commit's walls run its own default).
# Results: $OUT/throughput/ (bench-<commit>-<source>.json, .txt, the comparisons, profile-*.txt).
set -u
: "${OUT:?}"
W=${W:-/tmp/alibi}
R=$OUT/throughput
mkdir -p "$R"
AFTER_DIR=$PWD
BEFORE_DIR=/tmp/src-before
rm -rf "$BEFORE_DIR" && mkdir -p "$BEFORE_DIR" && tar -xzf gpu_payload/src-before.tar.gz -C "$BEFORE_DIR" \
  || { echo "throughput.sh: no gpu_payload/src-before.tar.gz"; exit 1; }
export SOURCE_DATE_EPOCH=1764633600
LIMIT=${LIMIT:-150}
KA=${KA:-cutlass} KB=${KB:-triton}  # the pair (other kernels only to try the script on a machine without a GPU)
log() { echo "$*" | tee -a "$R/steps.txt"; }
log "before $(cat "$BEFORE_DIR/SOURCE_COMMIT"), after $(cat "$AFTER_DIR/SOURCE_COMMIT"), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo no GPU)"

# one side: CODE (before|after) SOURCE_NAME SOURCE_ARGS...
side() {
  local code=$1 name=$2; shift 2
  local dir=$AFTER_DIR extra=${AFTER_ARGS:-}; [ "$code" = before ] && dir=$BEFORE_DIR extra=
  set -- "$@" $extra
  local s; s=$(date +%s)
  (cd "$dir" && PYTHONPATH=$dir timeout "$LIMIT" python -m alibi bench conform --kernel-a "$KA" --kernel-b "$KB" \
     "$@" --repeats "${REPEATS:-5}" --check-devices "${DEVICE:-cuda}" --quiet --out "$R/bench-$code-$name.json" > "$R/bench-$code-$name.txt" 2>&1)
  log "bench   $code $name rc=$? $(( $(date +%s) - s ))s: $(grep -E "^  ${DEVICE:-cuda} " "$R/bench-$code-$name.txt" | tr -s ' ')"
  s=$(date +%s)
  (cd "$dir" && PYTHONPATH=$dir timeout "$LIMIT" python -m alibi conform --kernel-a "$KA" --kernel-b "$KB" "$@" \
     --quiet --out "$R/conform-$code-$name" > "$R/conform-$code-$name.txt" 2>&1)
  log "conform $code $name rc=$? $(( $(date +%s) - s ))s"
}
wall() {  # SOURCE_NAME SOURCE_ARGS...: plain walls (no stage timer) of both commits, by one driver, twice in turn
  [ "${THROUGHPUT_WALLS:-1}" = 1 ] || return 0
  local name=$1; shift
  for round in 1 2; do
    for code in before after; do
      local dir=$AFTER_DIR; [ "$code" = before ] && dir=$BEFORE_DIR
      local env=${AFTER_ENV:-ALIBI_GRAPHS=}; [ "$code" = before ] && env=ALIBI_GRAPHS=
      (cd "$dir" && export "$env" && PYTHONPATH=$dir timeout "$LIMIT" python "$AFTER_DIR/analysis/h200/wall_conform.py" "$KA" "$KB" \
         "${DEVICE:-cuda}" 5 "$@" > "$R/wall-$code-$name-$round.txt" 2>&1)
      log "wall    $code $name round $round rc=$?: $(tail -1 "$R/wall-$code-$name-$round.txt")"
    done
  done
}
compare() {  # the results of both commits' report.json on one source
  python - "$R/conform-before-$1/report.json" "$R/conform-after-$1/report.json" <<'PY' | tee -a "$R/steps.txt"
import json, sys
def results(path):
    r = json.load(open(path))
    return {k: r[k] for k in ("created_at", "verdict", "equivalence", "inconclusive_because", "seed", "regimes",
                              "checks", "tiles")}
try:
    a, b = results(sys.argv[1]), results(sys.argv[2])
except (OSError, KeyError, ValueError) as exc:
    print(f"compare {sys.argv[1].split('/')[-2]}: cannot read both reports: {exc}")
    sys.exit(0)
same = sum(x == y for x, y in zip(a["tiles"], b["tiles"]))
print(f"compare {sys.argv[1].split('/')[-2].removeprefix('conform-before-')}: {len(a['tiles'])} units, "
      f"{same} identical; verdict {a['verdict']} / {b['verdict']}; whole results identical: {a == b}")
PY
}
profile() {  # NAME SOURCE_ARGS...: cProfile of the after bench (one timed run)
  [ "${THROUGHPUT_PROFILE:-1}" = 1 ] || return 0
  local name=$1; shift
  (cd "$AFTER_DIR" && timeout "$LIMIT" python analysis/h200/profile_conform.py "$R/profile-$name.txt" "$KA" "$KB" \
     "${DEVICE:-cuda}" "$@" --cuda > "$R/profile-$name.log" 2>&1)
  log "profile $name rc=$?"
}

if [ "${THROUGHPUT_PRESET:-1}" = 1 ]; then
  for code in before after; do side "$code" qwen3 --synthetic qwen3-1.7b --rows 512; done
  compare qwen3
  wall qwen3 --synthetic qwen3-1.7b
fi
if [ "${THROUGHPUT_SYNTHETIC:-1}" = 1 ]; then
  for code in before after; do side "$code" smollm2-full --synthetic smollm2-135m-full --rows 512; done
  compare smollm2-full
  wall smollm2-full --synthetic smollm2-135m-full
fi
if [ ! -f "$W/capture/manifest.json" ] && [ -f "$W/smollm2.gguf.part-aa" ] && [ -f "$W/smollm2.gguf.part-ab" ]; then
  s=$(date +%s)
  cat "$W/smollm2.gguf.part-aa" "$W/smollm2.gguf.part-ab" > "$W/s.gguf"
  (cd "$AFTER_DIR" && timeout 300 python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" \
     > "$R/prepare.txt" 2>&1 && timeout 300 python -m alibi capture --model "$W/model/w8a8" \
     --prompts experiments/prompts/wikipedia-8x512 --tokens 512 --kernel triton --quiet --out "$W/capture" \
     > "$R/capture.txt" 2>&1)
  log "model and capture rc=$? $(( $(date +%s) - s ))s"
fi
if [ -f "$W/capture/manifest.json" ]; then
  for code in before after; do side "$code" smollm2-capture --tiles "$W/capture"; done
  compare smollm2-capture
  wall smollm2-capture --tiles "$W/capture"
  profile smollm2-capture --tiles "$W/capture"
else
  log "no SmolLM2 capture in $W/capture (both GGUF parts are needed): the capture is left out"
  [ "${THROUGHPUT_SYNTHETIC:-1}" = 1 ] && profile smollm2-full --synthetic smollm2-135m-full
fi
[ "${THROUGHPUT_PRESET:-1}" = 1 ] && profile qwen3 --synthetic qwen3-1.7b

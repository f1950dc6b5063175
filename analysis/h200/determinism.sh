#!/usr/bin/env bash
# Issue 21 on one H200: the deterministic runner, its execution variations, and amendment 1 of
# prereg/smollm2-token-transfer (greedy reproduction and batch invariance, teacher-forced re-run).
#
#   bash analysis/h200/determinism.sh STAGE
#
# Carried: gpu_payload/{src.tar.gz (analysis/h200/pack_source.sh), cutlass_include.tar.xz,
# alibi_cache.tar.xz with kernel-pins.json (the CUTLASS libraries built on the CPU machine with nvcc
# 13.0, as the GPU machine's; nothing is compiled there), and one part of the SmolLM2 GGUF
# (split -n 2: part-aa, part-ab)}. The code that runs is the commit in src.tar.gz, unpacked to
# /tmp/src. The GGUF's parts travel in calls that follow each other within ~30 s (/tmp survives only
# while the machine stays warm); `alibi model prepare` checks the joined file's pinned sha256. Each
# call does useful work of its own, under a time limit per step:
#
#   probe    (part aa) every GPU test of the test suite, or of the TESTS paths (junit log)
#   tokens   (part ab) prepare the real and pow2 checkpoints; teacher-forced pairs and greedy at
#            batch 64 (each arm twice from a cold restart) on both checkpoints (T1-T7, A1, A2)
#   batch    the batch-1 (16 prompts) and batch-16 controls of each arm and `alibi locate`
#            against batch 64 (A3, A4); B1_ARMS, B16_ARMS (default "a b") pick the arms
#   variations  the runner throughput benchmark with a profile of its decode steps (BENCH=0 skips
#            it); `alibi variations` for (--nondeterministic) cutlass, cutlass, triton and
#            triton:w_then_a+fma while the call has time (KERNELS picks them; native = the first)
#
# SRC (default gpu_payload/src.tar.gz) names the source archive, so one call can run two commits
# (e.g. a criterion's run at the commit of the results it completes, and a benchmark at HEAD); SRC_DIR
# (default /tmp/src) where it is unpacked, so that two instances can run side by side.
#
# Results go to $OUT as <stage>.tgz plus <stage>-steps.txt. The criteria are judged afterwards by
# `alibi prereg evaluate` over the returned files (analysis/results/h200/determinism/README.md).
set -u
STAGE=$1
: "${OUT:?}"
REPO=$PWD
S=${SRC_DIR:-/tmp/src}  # where the archive is unpacked: two calls of this script side by side need two
SRC=${SRC:-gpu_payload/src.tar.gz}  # the commit that runs (pack_source.sh COMMIT OUT)
rm -rf "$S" && mkdir -p "$S" && tar -xzf "$SRC" -C "$S" || { echo "no source archive $SRC"; exit 1; }
ln -s "$REPO/gpu_payload" "$S/gpu_payload"
cd "$S" || exit 1
echo "source: commit $(cat SOURCE_COMMIT)"
W=/tmp/alibi
mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d "$W/cutlass_include" ] || tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz
[ -d "$W/alibi_cache" ] || tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz
export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
export TRITON_CACHE_DIR=$W/triton-cache  # compiled kernels kept from call to call while the machine is warm
. analysis/h200/kernel_pins.sh
NAME=${TAG:-$STAGE}  # the results folder: TAG tells two calls of one stage apart
R=$OUT/$NAME
mkdir -p "$R"
cp SOURCE_COMMIT "$R/"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$R/steps.txt"; }
for p in gpu_payload/smollm2.gguf.part-*; do [ -f "$p" ] && cp "$p" "$W/" && stamp "kept $(basename "$p")"; done
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; echo "commit $(cat SOURCE_COMMIT)"; } > "$R/env.txt" 2>&1
PROMPTS64=experiments/prompts/wikipedia-64x512
PROMPTS8=experiments/prompts/wikipedia-8x512
REAL=$W/model/w8a8 POW2=$W/model/w8a8-pow2-ceil
run() {  # run NAME LIMIT_S COMMAND...: log to $R/NAME.txt, record rc
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  local rc=$?
  stamp "$name rc=$rc"; tail -4 "$R/$name.txt"
  return $rc
}
prepare_model() {
  [ -f "$REAL/manifest.json" ] && [ -f "$POW2/manifest.json" ] && return 0
  for x in aa ab; do [ -f "$W/smollm2.gguf.part-$x" ] || { stamp "GGUF part $x missing"; return 1; }; done
  cat "$W"/smollm2.gguf.part-aa "$W"/smollm2.gguf.part-ab > "$W/s.gguf"
  run prepare 300 python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" || return 1
  run pow2 300 python -m alibi pow2-rewrite --mode ceil --requantize-from "$W/model/bf16" "$REAL" "$POW2"
}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }  # seconds left of this call's budget
LIMIT=${LIMIT:-560}
case $STAGE in
  probe)
    run gpu-tests $(( $(left) - 10 )) python -m pytest -q -m gpu ${TESTS:-tests} -p no:cacheprovider --continue-on-collection-errors \
      --junitxml "$R/pytest-gpu-junit.xml" ;;
  tokens)
    prepare_model || exit 1
    for ck in real pow2; do
      dir=$REAL; [ $ck = pow2 ] && dir=$POW2
      run "tf-$ck" 150 python -m alibi replay teacher-forced --model "$dir" --prompts $PROMPTS64 --kernel-a cutlass \
        --kernel-b triton --windows 64 --context 256 --positions 256 --quiet --out "$R/tf-$ck"
    done
    for ck in real pow2; do
      dir=$REAL; [ $ck = pow2 ] && dir=$POW2
      run "greedy-$ck" 170 python -m alibi replay greedy --model "$dir" --prompts $PROMPTS64 --kernel-a cutlass \
        --kernel-b triton --windows 64 --prompt-tokens 128 --new-tokens 64 --batch-size 64 --quiet --out "$R/greedy-$ck"
    done
    rm -rf "$W/batch64" && cp -r "$R/greedy-real/runs" "$W/batch64" ;;
  batch)  # needs tokens' greedy-real run folders: kept in /tmp/alibi/batch64 by the tokens call, or
          # carried as gpu_payload/batch64 (a committed greedy-real/runs folder)
    prepare_model || exit 1
    B64=$W/batch64; [ -d "$B64" ] || B64=$REPO/gpu_payload/batch64
    for arm in ${B1_ARMS:-a b}; do
      k=cutlass; [ $arm = b ] && k=triton
      run "b1-$arm" 200 python -m alibi replay greedy --model "$REAL" --prompts $PROMPTS64 --kernel $k --arm $arm \
        --windows 16 --prompt-tokens 128 --new-tokens 64 --batch-size 1 --quiet --out "$R/b1-$arm"
      run "locate-b1-$arm" 60 python -m alibi locate "$B64/$arm-1" "$R/b1-$arm" --out "$R/locate-b1-$arm"
    done
    for arm in ${B16_ARMS:-a b}; do
      k=cutlass; [ $arm = b ] && k=triton
      [ "$(left)" -gt 90 ] || { stamp "b16-$arm not run: the call's time is spent"; continue; }
      run "b16-$arm" $(( $(left) - 30 )) python -m alibi replay greedy --model "$REAL" --prompts $PROMPTS64 --kernel $k \
        --arm $arm --windows 64 --prompt-tokens 128 --new-tokens 64 --batch-size 16 --quiet --out "$R/b16-$arm"
      run "locate-b16-$arm" 30 python -m alibi locate "$B64/$arm-1" "$R/b16-$arm" --out "$R/locate-b16-$arm"
    done ;;
  variations)
    prepare_model || exit 1
    [ "${BENCH:-1}" = 1 ] && run bench-runner 150 python -m alibi bench runner --model "$REAL" --kernel cutlass \
      --prompts $PROMPTS64 --batch 64 --prompt-tokens 128 --new-tokens 64 --repeats 3 --out "$R/bench-runner.json"
    for k in ${KERNELS-native cutlass triton triton:w_then_a+fma}; do  # KERNELS="" runs none
      n=variations-${k//[:+]/_}; extra=""; kk=$k
      [ $k = native ] && { extra=--nondeterministic; kk=cutlass; }
      [ "$(left)" -gt 120 ] || { stamp "$n not run: the call's time is spent"; continue; }
      run "$n" $(( $(left) - 20 )) python -m alibi variations --model "$REAL" --kernel "$kk" --prompts $PROMPTS8 \
        --windows 8 --context 64 --positions 32 --batch-sizes 2,4,8 --chunk 16 $extra --quiet --out "$R/$n"
    done ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
stamp "stage $STAGE done (commit $(cat SOURCE_COMMIT))"
tar -C "$OUT" -czf "$OUT/$NAME.tgz" "$NAME" && cp "$R/steps.txt" "$OUT/$NAME-steps.txt" && rm -rf "$R"
ls -la "$OUT"

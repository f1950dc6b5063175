#!/usr/bin/env bash
# Issue 21 on one H200: the deterministic runner, its execution variations, and amendment 1 of
# prereg/smollm2-token-transfer (greedy reproduction and batch invariance, teacher-forced re-run).
#
#   bash analysis/h200/determinism.sh STAGE
#
# Carried: gpu_payload/{src.tar.gz (analysis/h200/pack_source.sh), cutlass_include.tar.xz, one
# smollm2.gguf.part-XX}. The code that runs is the commit in src.tar.gz, unpacked to /tmp/src. The
# GGUF travels in three parts over three calls that follow each other within ~30 s (/tmp survives
# only while the machine stays warm); each call does useful work of its own:
#
#   probe    (part aa) build the kernels into /tmp/alibi/alibi_cache (16 nvcc jobs); the SDPA probe
#            (which backend is nondeterministic / batch-variant at decode, and what the runner's
#            attention costs); every GPU test of the test suite
#   stash    (part ab) keep the part; nothing else
#   study    (part ac) prepare the real and pow2 checkpoints; `alibi variations` for cutlass, triton,
#            triton:w_then_a+fma and (--nondeterministic) cutlass; greedy at batch 64 for both
#            checkpoints, each arm twice from a cold restart; the batch-16 and batch-1 controls and
#            `alibi locate` against batch 64
#   tf       teacher-forced pairs on both checkpoints; the runner throughput benchmark
#
# Results go to $OUT as <stage>.tgz plus <stage>-summary.txt.
set -u
STAGE=$1
: "${OUT:?}"
REPO=$PWD
S=/tmp/src
rm -rf "$S" && mkdir -p "$S" && tar -xzf gpu_payload/src.tar.gz -C "$S" || { echo "no source archive"; exit 1; }
ln -s "$REPO/gpu_payload" "$S/gpu_payload"
cd "$S" || exit 1
echo "source: commit $(cat SOURCE_COMMIT)"
W=/tmp/alibi
mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d "$W/cutlass_include" ] || tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz
export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
. analysis/h200/kernel_pins.sh
R=$OUT/$STAGE
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
}
prepare_model() {
  [ -f "$REAL/manifest.json" ] && [ -f "$POW2/manifest.json" ] && return 0
  for x in aa ab ac; do [ -f "$W/smollm2.gguf.part-$x" ] || { stamp "GGUF part $x missing"; return 1; }; done
  cat "$W"/smollm2.gguf.part-aa "$W"/smollm2.gguf.part-ab "$W"/smollm2.gguf.part-ac > "$W/s.gguf"
  run prepare 300 python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" || return 1
  run pow2 300 python -m alibi pow2-rewrite --mode ceil --requantize-from "$W/model/bf16" "$REAL" "$POW2"
}
case $STAGE in
  probe)
    run build-cutlass 300 python -m alibi kernels build cutlass
    run sdpa-probe 120 python analysis/h200/sdpa_probe.py "$R/sdpa-probe.json"
    run gpu-tests 360 python -m pytest -q -m gpu tests -p no:cacheprovider --junitxml "$R/pytest-gpu-junit.xml" ;;
  stash) ;;
  study)
    prepare_model || exit 1
    for k in cutlass triton triton:w_then_a+fma; do
      n=variations-${k//[:+]/_}
      run "$n" 400 python -m alibi variations --model "$REAL" --kernel "$k" --prompts $PROMPTS8 --windows 8 \
        --context 64 --positions 32 --batch-sizes 2,4,8 --chunk 16 --quiet --out "$R/$n"
    done
    # with the cold restart: two processes at the same shapes isolate nondeterminism (cuDNN's attention at
    # decode) from batch variance (an RMSNorm's row reduction), which the batch variations name first
    run variations-native 400 python -m alibi variations --model "$REAL" --kernel cutlass --prompts $PROMPTS8 \
      --windows 8 --context 64 --positions 32 --batch-sizes 2,4,8 --chunk 16 --nondeterministic --quiet \
      --out "$R/variations-native"
    for ck in real pow2; do
      dir=$REAL; [ $ck = pow2 ] && dir=$POW2
      run "greedy-$ck" 300 python -m alibi replay greedy --model "$dir" --prompts $PROMPTS64 --kernel-a cutlass \
        --kernel-b triton --windows 64 --prompt-tokens 128 --new-tokens 64 --batch-size 64 --quiet --out "$R/greedy-$ck"
    done
    for arm in a b; do
      k=cutlass; [ $arm = b ] && k=triton
      run "b16-$arm" 200 python -m alibi replay greedy --model "$REAL" --prompts $PROMPTS64 --kernel $k --arm $arm \
        --windows 64 --prompt-tokens 128 --new-tokens 64 --batch-size 16 --quiet --out "$R/b16-$arm"
      run "b1-$arm" 300 python -m alibi replay greedy --model "$REAL" --prompts $PROMPTS64 --kernel $k --arm $arm \
        --windows 16 --prompt-tokens 128 --new-tokens 64 --batch-size 1 --quiet --out "$R/b1-$arm"
      for b in b16 b1; do
        run "locate-$b-$arm" 60 python -m alibi locate "$R/greedy-real/runs/$arm-1" "$R/$b-$arm" --out "$R/locate-$b-$arm"
      done
    done ;;
  tf)
    prepare_model || exit 1
    for ck in real pow2; do
      dir=$REAL; [ $ck = pow2 ] && dir=$POW2
      run "tf-$ck" 240 python -m alibi replay teacher-forced --model "$dir" --prompts $PROMPTS64 --kernel-a cutlass \
        --kernel-b triton --windows 64 --context 256 --positions 256 --quiet --out "$R/tf-$ck"
    done
    run bench-runner 200 python analysis/bench_runner.py --model "$REAL" --kernel cutlass --prompts $PROMPTS64 \
      --batch 64 --prompt-tokens 128 --new-tokens 64 --repeats 3 --out "$R/bench-runner.json" ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
stamp "stage $STAGE done"
tar -C "$OUT" -czf "$OUT/$STAGE.tgz" "$STAGE" && cp "$R/steps.txt" "$OUT/$STAGE-steps.txt" && rm -rf "$R"
ls -la "$OUT"

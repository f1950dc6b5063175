#!/usr/bin/env bash
# Issue 35 at model level on one GPU: what block-scaled FP8 does to SmolLM2-135M's tokens, on the fp8-block checkpoint
# (`alibi model prepare --format fp8-block`: e4m3 weights with fp32 weight_scale_inv per 128x128 block, dynamic 1x128
# activation groups).
#
#   STAGE=stash bash analysis/h200/fp8_block_model.sh   # call 1, carries $PAYLOAD/smollm2.gguf.part-aa (+ the torchao wheel)
#   STAGE=run   bash analysis/h200/fp8_block_model.sh   # call 2 (machine still warm), carries $PAYLOAD/smollm2.gguf.part-ab
#
# The GGUF (98 MB) travels in two parts as for analysis/h200/variations.sh (`split -n 2 SmolLM2-135M-Instruct.Q4_1.gguf
# gpu_payload/smollm2.gguf.part-`); each call keeps the part it brought in $W (/tmp/alibi), which lives as long as the
# machine stays warm; `alibi model prepare` checks the joined file's pinned sha256. The block checkpoint is kept in
# $W/model-fp8-block (analysis/h200/call.sh's prepare_model, which also sets up the call's clock, log and source), so a third call (STAGE=run, nothing carried but the source) reuses it: e.g. PARTS=flips in call 2
# and PARTS=variations in call 3. Stage stash also lists the kernels, runs the GPU tests of
# tests/kernels/test_fp8_block_kernels.py (each available block kernel against the emulator), reads every available
# block kernel's schedule by probe (analysis/h200/fp8_block_measure.py --parts identify: identify/identify.json;
# IDENTIFY_KERNELS narrows it) and runs the block matrix at M = 1 over them and the block emulators (matrix-m1/,
# FBGEMM included: its one activation scale per 256 rows takes decode tiles), so it is useful alone.
#
# Parts of stage run (PARTS, default "flips variations", in that order; each bounded by the call's time left):
#   flips       teacher-forced replay of the pair KERNEL_A / KERNEL_B (default cublaslt-fp8-block, torchao-fp8-block),
#               each arm a fresh `alibi replay teacher-forced --kernel K --arm a|b` process, then `alibi analyze flips`
#               (flip rate, margin ROC); PROMPTS (default experiments/prompts/wikipedia-64x512), WINDOWS=64, CONTEXT=256,
#               POSITIONS=256 (the sizes of analysis/h200/tokens.sh). When variations follow, flips leaves them
#               VAR_RESERVE_S (default 240) seconds of the call.
#   variations  `alibi variations` with VAR_KERNEL (default cublaslt-fp8-block) on the block checkpoint, the deterministic
#               runner and the native one (--nondeterministic), side by side (PARALLEL=0: one after the other), at the
#               span of variations.sh: VAR_PROMPTS experiments/prompts/wikipedia-8x512, VAR_WINDOWS=8, VAR_CONTEXT=64,
#               VAR_POSITIONS=32; VAR_ARGS adds options (e.g. "--batch-sizes 2 --repeats 2 --chunk 4" for a dry run); MODES
#               (default "native deterministic") picks the runs.
# Kernel payloads, set up when present (as analysis/h200/fp8_block.sh): $PAYLOAD/ecosystem/torchao-0.18.0-*.whl
# installed into $SITE (/tmp/site, kept while warm, on PYTHONPATH); vLLM's op library and fp8_utils.py when an earlier
# call left them in /tmp/alibi-vllm (ALIBI_VLLM_OPS, ALIBI_VLLM_FP8_UTILS); FBGEMM's Triton files in /tmp/fbg
# (ALIBI_FBGEMM_ROOT; unpacked from $PAYLOAD/ecosystem/ or $PAYLOAD/fbg/fbgemm_triton_gemm-1.6.0.tar.xz when
# carried). `alibi kernels` is recorded in kernels.txt.
#
# Source: SRC=gpu_payload/src.tar.gz (analysis/h200/pack_source.sh COMMIT) runs that commit, unpacked to
# /tmp/src-fp8_block_model-PID (a folder per run: another part or script can run beside it);
# without SRC the carried working tree runs as it is (recorded as such). PAYLOAD (default gpu_payload) names the
# folder the carried files are in.
# Results: $OUT/fp8_block_model-STAGE.tgz (env.txt, kernels.txt, prepare-fp8-block.txt, tf/arm-a, tf/arm-b, tf/flips/flips.json,
# var-<mode>/variations.json, a log per step) and $OUT/summary.txt, packed even when a part fails. BUDGET_S (default
# 570) bounds the call.
# CPU dry run of the plumbing (the exact block emulators, tiny sizes; W and SITE away from /tmp/alibi and /tmp/site;
# P1 holds part-aa and the torchao wheel, P2 part-ab). On 2 cores: stash ~15 s, run ~15 min (each tf arm ~3 min, each
# variations mode ~7 min side by side; the emulator decodes every weight at every call, so keep the spans this small):
#   export OMP_NUM_THREADS=1 W=/tmp/dry/w SITE=/tmp/dry/site
#   OUT=/tmp/dry/out1 PAYLOAD=/tmp/dry/p1 STAGE=stash bash analysis/h200/fp8_block_model.sh
#   OUT=/tmp/dry/out2 PAYLOAD=/tmp/dry/p2 BUDGET_S=1200 WINDOWS=2 CONTEXT=32 POSITIONS=8 \
#     KERNEL_A='emulator-fp8-block:block128:fma(sa*sw,p,acc):add_after_cast' \
#     KERNEL_B='emulator-fp8-block:block128:rescale:add_after_cast' \
#     VAR_KERNEL='emulator-fp8-block:block128:fma(sa*sw,p,acc):add_after_cast' \
#     VAR_WINDOWS=1 VAR_CONTEXT=8 VAR_POSITIONS=2 VAR_ARGS="--batch-sizes 2 --repeats 2 --chunk 4" \
#     STAGE=run bash analysis/h200/fp8_block_model.sh
set -u -o pipefail
: "${OUT:?set OUT}"
STAGE=${STAGE:-${1:-run}}
SITE=${SITE:-/tmp/site}
. analysis/h200/call.sh fp8_block_model
want() { case " ${PARTS:-flips variations} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
export TORCHAO_AUTOTUNER_DATA_PATH=$W/torchao-autotune.pkl  # kept while warm
pack() {  # always: whatever is in $R goes back
  trap - EXIT
  tar -C "$OUT" -czf "$OUT/fp8_block_model-$STAGE.tgz" fp8_block_model && rm -rf "$R"
  stamp "done (packed $OUT/fp8_block_model-$STAGE.tgz)"
}
trap pack EXIT

# kernel payloads
for whl in "$PAYLOAD"/ecosystem/torchao-0.18.0-*.whl; do
  [ -f "$whl" ] || continue
  python -m pip install -q --no-index --no-deps --target "$SITE" "$whl" > "$R/pip-torchao.txt" 2>&1
  stamp "torchao wheel into $SITE: rc $?"
done
for fbg in "$PAYLOAD"/ecosystem/fbgemm_triton_gemm-1.6.0.tar.xz "$PAYLOAD"/fbg/fbgemm_triton_gemm-1.6.0.tar.xz; do
  [ -f "$fbg" ] && mkdir -p /tmp/fbg && tar -C /tmp/fbg -xJf "$fbg"
done
[ -d /tmp/fbg ] && export ALIBI_FBGEMM_ROOT=/tmp/fbg
V=/tmp/alibi-vllm
if [ -f "$V/_C_stable_libtorch.abi3.so" ] && [ -f "$V/fp8_utils.py" ]; then
  export ALIBI_VLLM_OPS=$V/_C_stable_libtorch.abi3.so ALIBI_VLLM_FP8_UTILS=$V/fp8_utils.py
fi
echo "ALIBI_FBGEMM_ROOT=${ALIBI_FBGEMM_ROOT:-} ALIBI_VLLM_OPS=${ALIBI_VLLM_OPS:-} ALIBI_VLLM_FP8_UTILS=${ALIBI_VLLM_FP8_UTILS:-}" \
  >> "$R/env.txt"
python -m alibi kernels > "$R/kernels.txt" 2>&1
stamp "kernels: rc $?; block kernels available: $(grep -E -- '-block[^ ]* +fp8_e4m3_block +[a-z]+ +yes ' "$R/kernels.txt" | grep -v '^emulator' | cut -d' ' -f1 | tr '\n' ' ')"

KA=${KERNEL_A:-cublaslt-fp8-block} KB=${KERNEL_B:-torchao-fp8-block} VK=${VAR_KERNEL:-cublaslt-fp8-block}
case $STAGE in
  stash)
    timeout $(( $(left) - 20 )) python -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_fp8_block_kernels.py \
      > "$R/pytest-gpu.txt" 2>&1
    stamp "block kernel gpu tests: rc $?"; tail -n 3 "$R/pytest-gpu.txt" | tee -a "$OUT/summary.txt"
    # every available block kernel's schedule read by probe at this commit (IDENTIFY_KERNELS, default all of them)
    avail=$(grep -E -- '-block[^ ]* +fp8_e4m3_block +[a-z]+ +yes ' "$R/kernels.txt" | grep -v '^emulator' | cut -d' ' -f1 | paste -sd,)
    [ -n "$avail" ] || { stamp "no project block kernel available here: no identify, no matrix"; exit 0; }
    timeout $(( $(left) - ${MATRIX_RESERVE_S:-90} )) python analysis/h200/fp8_block_measure.py "$R/identify" --parts identify \
      --kernels "${IDENTIFY_KERNELS:-$avail}" > "$R/identify.txt" 2>&1
    stamp "identify ${IDENTIFY_KERNELS:-$avail}: rc $?"
    grep -E "^identify [^ ]+: |NO MATCH|RAISED" "$R/identify.txt" | cut -c1-300 | tee -a "$OUT/summary.txt"
    # the block matrix at M = 1 (decode), where FBGEMM's one scale per 256 rows takes every tile, over the available
    # project kernels and this project's four block emulators
    E="emulator-fp8-block:block128:fma(sa*sw,p,acc):add_after_cast,emulator-fp8-block:block128:acc+(p*sa)*sw:add_after_cast"
    E="$E,emulator-fp8-block:block128:fma(p*sa,sw,acc):add_after_cast,emulator-fp8-block:block128:rescale:add_after_cast"
    timeout $(( $(left) - 15 )) python -m alibi matrix --available-only --kernels "$avail,$E" \
      --synthetic smollm2-135m-fp8-block-decode --out "$R/matrix-m1" --quiet > "$R/matrix-m1.txt" 2>&1
    stamp "matrix M=1 ($avail and the emulators): rc $?"; grep -E "bitwise|explained|unexplained" "$R/matrix-m1.txt" \
      | head -n 4 | tee -a "$OUT/summary.txt" ;;
  run)
    prepare_model fp8-block || exit 1
    cp "$MODEL/manifest.json" "$R/checkpoint-manifest.json"
    step() {  # step NAME RESERVE_S COMMAND...: run under timeout (time left - RESERVE_S), log $R/NAME.txt, rc in $RC
      local name=$1 reserve=$2; shift 2
      local limit=$(( $(left) - reserve ))
      if [ "$limit" -lt 15 ]; then stamp "$name: skipped, ${limit}s left after the ${reserve}s reserve"; RC=124; return; fi
      local t=$(date +%s)
      timeout "$limit" "$@" > "$R/$name.txt" 2>&1
      RC=$?; stamp "$name: rc $RC in $(( $(date +%s) - t ))s (limit ${limit}s)"
      case "$RC:$name" in 0:*|1:var-*) return ;; esac  # variations' rc 1 (some variation fails) is summarized below
      grep -v -E "^Failed to load|^W[0-9]{4} |^Skipping import" "$R/$name.txt" | tail -n 4 | cut -c1-400 | tee -a "$OUT/summary.txt"
    }
    if want flips; then
      reserve=20; want variations && reserve=$(( 20 + ${VAR_RESERVE_S:-240} ))
      mkdir -p "$R/tf"
      for arm in a b; do
        k=$KA; [ $arm = b ] && k=$KB
        step "tf-arm-$arm" $(( reserve + 10 )) python -m alibi replay teacher-forced --model "$MODEL" \
          --prompts "${PROMPTS:-experiments/prompts/wikipedia-64x512}" --kernel "$k" --arm $arm \
          --windows "${WINDOWS:-64}" --context "${CONTEXT:-256}" --positions "${POSITIONS:-256}" --out "$R/tf/arm-$arm"
        eval "rc_$arm=\$RC"
      done
      rc_f=skipped
      if [ "$rc_a" = 0 ] && [ "$rc_b" = 0 ]; then  # relative arm paths, as `alibi replay teacher-forced --kernel-a/-b` records them
        (cd "$R/tf" && step flips "$reserve" python -m alibi analyze flips arm-a arm-b --out flips --quiet; exit $RC); rc_f=$?
      fi
      stamp "part flips: rc arm a $rc_a, arm b $rc_b, analyze $rc_f ($KA vs $KB)"
      python - "$R/tf/flips/flips.json" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
try:
    f = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"flips: no flips.json ({exc.__class__.__name__})")
print(f"flips: positions {f['n_positions']}, flips {f['n_flips']} (rate {f['flip_rate']:.4f}), logits identical "
      f"{f.get('logits_identical')}/{f.get('logits_compared')}, AUC {f.get('roc_auc')} CI90 {f.get('roc_auc_ci90')}, "
      f"Brier {f.get('brier_heldout')} vs {f.get('brier_baseline')}")
EOF
    fi
    if want variations; then
      variations() {  # variations MODE: one `alibi variations` run into $R/var-MODE, its log $R/var-MODE.txt
        local mode=$1 flag=""
        [ "$mode" = native ] && flag=--nondeterministic
        # VAR_ARGS is split on purpose (extra options)
        step "var-$mode" 20 python -m alibi variations --model "$MODEL" --kernel "$VK" \
          --prompts "${VAR_PROMPTS:-experiments/prompts/wikipedia-8x512}" --windows "${VAR_WINDOWS:-8}" \
          --context "${VAR_CONTEXT:-64}" --positions "${VAR_POSITIONS:-32}" $flag ${VAR_ARGS:-} --out "$R/var-$mode"
        stamp "part variations $mode: rc $RC (0 every variation holds, 1 some fail) with $VK"
      }
      if [ "$(left)" -lt 60 ]; then
        stamp "part variations: skipped, $(left)s left (run again with PARTS=variations: the checkpoint stays in $W)"
      elif [ "${PARALLEL:-1}" = 1 ]; then  # side by side: each run is launch-bound, the GPU has room for both
        for mode in ${MODES:-native deterministic}; do variations "$mode" & done
        wait
      else
        for mode in ${MODES:-native deterministic}; do variations "$mode"; done
      fi
      for mode in ${MODES:-native deterministic}; do
        [ -f "$R/var-$mode.txt" ] && grep -E "^variations:|a pass certifies|FAILS" "$R/var-$mode.txt" | cut -c1-400 | sed "s/^/$mode: /" | tee -a "$OUT/summary.txt"
      done
    fi ;;
  *) stamp "unknown stage $STAGE (stash | run)"; exit 2 ;;
esac

#!/usr/bin/env bash
# Issues 21 and 22 in three chained H200 calls (each started within ~30 s of the last, while /tmp survives):
#
#   bash analysis/h200/ecosystem_chain.sh vllm      carry gpu_payload/{vllm,src.tar.gz}
#        vLLM's op library decompressed into /tmp/alibi-vllm; `alibi identify` of the int8 kernels that need
#        nothing else carried (vllm-cutlass, vllm-triton, triton, triton:w_then_a+fma, cublas)
#   bash analysis/h200/ecosystem_chain.sh kernels   carry gpu_payload/{smollm2.gguf.part-aa,ecosystem,
#        alibi_cache.tar.xz,kernel-pins.json,cutlass_include.tar.xz,src.tar.gz,src-b5db8e0.tar.gz}
#        the other projects' wheels installed; identify of the rest and their GPU tests; `alibi matrix` over
#        every available int8 kernel on biased bf16/fp16 tiles (and bnb-int8 on 17-bit scales) and over every
#        fp8 kernel (analysis/h200/ecosystem.sh, parts identify synthetic fp8)
#   bash analysis/h200/ecosystem_chain.sh model     carry gpu_payload/{smollm2.gguf.part-ab,src.tar.gz,
#        src-b5db8e0.tar.gz}
#        SmolLM2-135M W8A8 prepared from the joined GGUF; side by side: `alibi variations` for triton and for
#        triton:w_then_a+fma at b5db8e0, the commit of amendment 1's other results (criteria A5-triton and
#        A5-triton_fma, analysis/h200/determinism.sh); the SmolLM2 capture and the matrix over it; the
#        teacher-forced flips of torchao-int8 against vllm-cutlass (ecosystem.sh, parts capture flips)
#
#   bash analysis/h200/ecosystem_chain.sh gputests  carry gpu_payload/{vllm,ecosystem,alibi_cache.tar.xz,kernel-pins.json,
#        cutlass_include.tar.xz,src.tar.gz}: the ecosystem GPU tests and the kernel contract over every GPU kernel
#        (GPUTESTS_PARTS, default "identify fp8": with the fp8 matrix)
#   bash analysis/h200/ecosystem_chain.sh throughput  carry gpu_payload/{src.tar.gz,src-before.tar.gz} and what
#        analysis/h200/throughput.sh needs: `alibi bench conform` before and after (issue 23 item 4)
#   bash analysis/h200/ecosystem_chain.sh profile   carry gpu_payload/{src.tar.gz} and the CUTLASS libraries:
#        analysis/h200/profile_conform.py --cuda on the Qwen3 preset and the SmolLM2 shapes
#   bash analysis/h200/ecosystem_chain.sh stash     carry one GGUF part: kept in /tmp/alibi for the next call
#
# The GGUF is split unevenly (head -c 45000000 for part aa, tail -c +45000001 for part ab) so that each call stays under
# the 64 MiB a call carries with the checkout (analysis/results left out of the travelling tree).
# Results: $OUT/<stage>.tgz and $OUT/<stage>-summary.txt (at most 8 files come back from a call).
set -u
STAGE=$1
: "${OUT:?set OUT to the results folder}"
REPO=$PWD
S=/tmp/src
rm -rf "$S" && mkdir -p "$S" && tar -xzf gpu_payload/src.tar.gz -C "$S" || { echo "no source archive"; exit 1; }
ln -s "$REPO/gpu_payload" "$S/gpu_payload"
cd "$S" || exit 1
echo "source: commit $(cat SOURCE_COMMIT)"
W=/tmp/alibi
mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d "$W/cutlass_include" ] || { [ -f gpu_payload/cutlass_include.tar.xz ] && tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz; }
[ -d "$W/alibi_cache" ] || { [ -f gpu_payload/alibi_cache.tar.xz ] && tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz; }
[ -d "$W/cutlass_include" ] && export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include
export ALIBI_CACHE=$W/alibi_cache
# The pins of the carried CUTLASS libraries (analysis/h200/kernel_pins.sh) come with the cache, in the call that
# carries them; later calls keep $W/alibi_config as it is, with any library built and pinned there since.
if [ -f gpu_payload/kernel-pins.json ]; then
  mkdir -p -m 700 "$W/alibi_config" && cp gpu_payload/kernel-pins.json "$W/alibi_config/kernel-pins.json" \
    && chmod 600 "$W/alibi_config/kernel-pins.json"
fi
[ -f "$W/alibi_config/kernel-pins.json" ] && export ALIBI_CONFIG=$W/alibi_config
export TRITON_CACHE_DIR=$W/triton-cache
T0=$(date +%s)
export ECO_DEADLINE=$(( T0 + ${BUDGET_S:-540} ))  # every ecosystem.sh step ends by then (the call's limit is 600 s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/$STAGE-summary.txt"; }
for p in gpu_payload/smollm2.gguf.part-*; do [ -f "$p" ] && cp "$p" "$W/" && stamp "kept $(basename "$p")"; done
finish() {  # pack $OUT/ecosystem (and any extra folders) into $OUT/$STAGE.tgz
  cat "$OUT/ecosystem/summary.txt" >> "$OUT/$STAGE-summary.txt" 2>/dev/null
  tar -C "$OUT" -czf "$OUT/$STAGE.tgz" ecosystem "$@" && rm -rf "$OUT/ecosystem" "${@/#/$OUT/}"
  stamp "stage $STAGE done (commit $(cat SOURCE_COMMIT))"
  ls -la "$OUT"
}
case $STAGE in
  vllm)
    bash analysis/h200/vllm.sh --unpack || exit 1
    ECO_PARTS=identify ECO_PYTEST=0 ECO_IDENTIFY="vllm-cutlass vllm-triton triton triton:w_then_a+fma cublas" \
      bash analysis/h200/ecosystem.sh
    finish ;;
  kernels)
    ECO_PARTS="identify synthetic fp8" ECO_IDENTIFY="cutlass cutlass-sm80 torchao-int8 torchao-int-scaled-mm bnb-int8 sgl-int8" \
      bash analysis/h200/ecosystem.sh
    finish ;;
  matrices)  # one call: carry gpu_payload/{vllm,ecosystem,alibi_cache.tar.xz,kernel-pins.json,cutlass_include.tar.xz,
             # src.tar.gz} with a travelling tree of analysis/h200 alone (the code runs from src.tar.gz)
    bash analysis/h200/vllm.sh --unpack || exit 1
    # first, alone on the GPU: where conform's time goes (issue 23 item 4), then the matrices and GPU tests
    mkdir -p "$OUT/profile"
    for preset in qwen3-1.7b smollm2-135m-full; do
      timeout 120 python analysis/h200/profile_conform.py "$OUT/profile/$preset.txt" cutlass triton cuda \
        --synthetic "$preset" >> "$OUT/profile/profile.log" 2>&1; stamp "profile $preset rc=$?"
    done
    ECO_PARTS="identify synthetic fp8" ECO_IDENTIFY="torchao-int-scaled-mm" bash analysis/h200/ecosystem.sh
    finish profile ;;
  gputests)  # carry gpu_payload/{vllm,ecosystem,alibi_cache.tar.xz,kernel-pins.json,cutlass_include.tar.xz,src.tar.gz}:
             # the fp8 matrix, the ecosystem GPU tests and the kernel contract over every GPU kernel
    bash analysis/h200/vllm.sh --unpack || exit 1
    ECO_PARTS="${GPUTESTS_PARTS:-identify fp8}" ECO_IDENTIFY=" " bash analysis/h200/ecosystem.sh
    finish ;;
  profile)  # carry gpu_payload/{src.tar.gz,alibi_cache.tar.xz,kernel-pins.json,cutlass_include.tar.xz}: where conform's
            # time goes on the GPU (cProfile, torch.profiler, untimed walls) on the Qwen3 preset and the SmolLM2 shapes
    mkdir -p "$OUT/profile" "$OUT/ecosystem"
    for preset in qwen3-1.7b smollm2-135m-full; do
      timeout 240 python analysis/h200/profile_conform.py "$OUT/profile/$preset.txt" cutlass triton cuda \
        --synthetic "$preset" --cuda >> "$OUT/profile/profile.log" 2>&1; stamp "profile $preset rc=$?"
    done
    finish profile ;;
  stash)  # carry one GGUF part (and src.tar.gz): kept in /tmp/alibi for a later call
    stamp "kept the carried GGUF parts in $W" ;;
  throughput)  # issue 23 item 4: carry gpu_payload/{src.tar.gz,src-before.tar.gz} (+ the CUTLASS libraries where
               # no earlier call left them, + a GGUF part): analysis/h200/throughput.sh
    bash analysis/h200/throughput.sh
    mkdir -p "$OUT/ecosystem"
    finish throughput ;;
  model)
    for x in aa ab; do [ -f "$W/smollm2.gguf.part-$x" ] || { stamp "GGUF part $x missing"; exit 1; }; done
    if [ ! -f "$W/model/w8a8-pow2-ceil/manifest.json" ]; then
      cat "$W/smollm2.gguf.part-aa" "$W/smollm2.gguf.part-ab" > "$W/s.gguf"
      python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" > "$OUT/prepare.txt" 2>&1 \
        && python -m alibi pow2-rewrite --mode ceil --requantize-from "$W/model/bf16" "$W/model/w8a8" \
          "$W/model/w8a8-pow2-ceil" >> "$OUT/prepare.txt" 2>&1 || { cat "$OUT/prepare.txt"; exit 1; }
      tail -3 "$OUT/prepare.txt"; stamp "model prepared"
    fi
    # A5 at b5db8e0: two instances of determinism.sh, each in its own source folder; results in $OUT/variations-*.
    for k in triton triton:w_then_a+fma; do
      tag=variations-${k//[:+]/_}
      (cd "$REPO" && SRC=gpu_payload/src-b5db8e0.tar.gz SRC_DIR=/tmp/src-$tag TAG=$tag KERNELS=$k BENCH=0 \
        LIMIT=${LIMIT:-540} bash analysis/h200/determinism.sh variations > "$OUT/$tag.log" 2>&1; stamp "$tag rc=$?") &
    done
    ECO_PARTS="capture flips" bash analysis/h200/ecosystem.sh &
    wait
    mkdir -p "$OUT/a5"
    for f in "$OUT"/variations-*; do [ -e "$f" ] && mv "$f" "$OUT/a5/"; done
    finish a5 ;;
  *) echo "unknown stage $STAGE (vllm, kernels, model, matrices, gputests, throughput, profile, stash)"; exit 2 ;;
esac

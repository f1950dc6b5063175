#!/usr/bin/env bash
# One H200 session for issues 9, 10, 11 and 14, in calls of at most 10 minutes each:
#
#   bash analysis/h200/session.sh STAGE
#
#   sweeps    carry gpu_payload/{smollm2.gguf.part-aa,cutlass_include.tar.xz,alibi_cache.tar.xz,src.tar.gz}:
#             keeps GGUF part aa in /tmp/alibi, then analysis/h200/sweeps.sh
#   controls  (part ab) analysis/h200/positive_controls.sh
#   tokens    (part ac) joins the GGUF, prepares the real and the pow2 checkpoints, then
#             analysis/h200/tokens.sh's pre-registered parts (prereg/smollm2-token-transfer)
#   stash     only keeps the GGUF part it carries (calls must follow within ~30 s to keep /tmp)
#   explore   tokens.sh's exploratory parts (prefill vs decode, replay throughput)
#   vllm-unpack, vllm   analysis/h200/vllm.sh in its two-call form: the first call carries
#             gpu_payload/vllm (or the first part of its .xz) and only keeps or decompresses it, the
#             next runs it (see that script), on the capture `e2e` left in /tmp when it is there
#   (the old pipeline's "before" throughput of issue 12 came from a stage of commit 36e9031, with
#   analysis/conform_throughput.py of that commit; `alibi bench conform` measures it now: pipeline.sh)
#   e2e       (part ac) prepare, capture, triton:w_then_a+fma vs cutlass on the capture and end to end
#   ecosystem TorchAO, bitsandbytes, FBGEMM, SGLang kernels: identify and `alibi matrix` (issue 22;
#             analysis/h200/ecosystem.sh says what to carry and which parts to run in which call)
#   pipeline  (part ac) prepare, capture, then analysis/h200/pipeline.sh (issue 12); `vllm` after it with
#             VLLM_PARTS=conform re-runs only vLLM's conform pairs
#
# The code that runs is not the working tree that travels but `gpu_payload/src.tar.gz`, a
# `git archive` of one commit (analysis/h200/pack_source.sh), unpacked into /tmp/src: so every
# result's recorded source digest is that commit's tree (`alibi manifest provenance` finds it),
# whatever else the working tree held when the call was made.
set -u
STAGE=$1
: "${OUT:?}"
REPO=$PWD
S=/tmp/src
rm -rf "$S" && mkdir -p "$S" && tar -xzf gpu_payload/src.tar.gz -C "$S" || { echo "no source archive"; exit 1; }
ln -s "$REPO/gpu_payload" "$S/gpu_payload"
cd "$S" || exit 1
echo "source: commit $(cat SOURCE_COMMIT)"; cp SOURCE_COMMIT "$OUT/"
source analysis/h200/setup.sh
case $STAGE in
  sweeps)
    stash_gguf_part
    bash analysis/h200/sweeps.sh ;;
  tokens)
    prepare_model || exit 1
    PARTS="tf greedy" PROMPT_TOKENS=128 BUDGET_S=${BUDGET_S:-480} bash analysis/h200/tokens.sh "$W/model/w8a8" \
      "$W/model/w8a8-pow2-ceil" experiments/prompts/wikipedia-64x512 tokens ;;
  stash)  # only keep the GGUF part this call carries
    stash_gguf_part ;;
  controls)
    stash_gguf_part
    bash analysis/h200/positive_controls.sh ;;
  explore)
    prepare_model || exit 1
    PARTS="pvd bench" BUDGET_S=${BUDGET_S:-300} bash analysis/h200/tokens.sh "$W/model/w8a8" \
      "$W/model/w8a8-pow2-ceil" experiments/prompts/wikipedia-64x512 tokens-exploratory ;;
  vllm-unpack)  # carries gpu_payload/vllm (56 MB) alone, or one part of its .xz: keep/decompress it in /tmp
    bash analysis/h200/vllm.sh --unpack ;;
  vllm)  # with the SmolLM2 capture of an earlier `e2e` or `pipeline` call when it is still in /tmp
    VLLM_PARTS=${VLLM_PARTS:-identify conform bench pytest} bash analysis/h200/vllm.sh "$W/capture" ;;
  pipeline)  # (GGUF part ac) prepare, capture SmolLM2 W8A8 at M = 512 (kept in /tmp), then analysis/h200/pipeline.sh
    prepare_model || exit 1
    if [ ! -f "$W/capture/manifest.json" ]; then
      python -m alibi capture --model "$W/model/w8a8" --prompts experiments/prompts/wikipedia-8x512 --tokens 512 \
        --kernel triton --quiet --out "$W/capture" > "$OUT/capture.txt" 2>&1 || { cat "$OUT/capture.txt"; exit 1; }
    fi
    stamp "capture: $(ls "$W/capture" | grep -c safetensors) tiles"
    bash analysis/h200/pipeline.sh "$W/capture" ;;
  gpu-tests)  # every GPU test (vLLM's too when an earlier vllm call left its files in /tmp/alibi-vllm)
    V=/tmp/alibi-vllm
    [ -f "$V/_C_stable_libtorch.abi3.so" ] && export ALIBI_VLLM_OPS=$V/_C_stable_libtorch.abi3.so ALIBI_VLLM_TRITON=$V/triton_scaled_mm.py
    timeout 420 python -m pytest -q -m gpu tests -p no:cacheprovider --continue-on-collection-errors \
      --junitxml "$OUT/pytest-gpu-junit.xml" > "$OUT/pytest-gpu.txt" 2>&1
    stamp "GPU tests rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.txt" | head -20; tail -2 "$OUT/pytest-gpu.txt"
    # issue 15 on one GPU: the sharded path (--devices all = cuda:0 here) against the plain run, byte for byte
    mkdir -p "$W/shard"; export SOURCE_DATE_EPOCH=1764547200
    for how in plain sharded; do
      extra=""; [ $how = sharded ] && extra="--devices all"
      python -m alibi conform --kernel-a cutlass --kernel-b triton --synthetic qwen3-1.7b --quiet $extra \
        --out "$W/shard/$how" > "$OUT/shard-$how.txt" 2>&1; stamp "conform $how rc=$?"
    done
    for f in report.json report.md junit.xml report.html; do
      cmp -s "$W/shard/plain/$f" "$W/shard/sharded/$f" && echo "shard one GPU: $f identical" || echo "shard one GPU: $f DIFFERS"
    done | tee "$OUT/shard-one-gpu.txt" ;;
  e2e)  # (GGUF part ac) prepare, capture SmolLM2 W8A8 at M = 512 (kept in /tmp for `vllm`), then
        # triton:w_then_a+fma against cutlass on the capture and end to end (teacher-forced and greedy,
        # real-scale checkpoint)
    prepare_model || exit 1
    rm -rf "$W/capture"
    python -m alibi capture --model "$W/model/w8a8" --prompts experiments/prompts/wikipedia-8x512 --tokens 512 \
      --kernel triton --quiet --out "$W/capture" > "$OUT/capture.txt" 2>&1 || { cat "$OUT/capture.txt"; exit 1; }
    stamp "capture: $(ls "$W/capture" | grep -c safetensors) tiles"
    mkdir -p "$OUT/fma"
    python -m alibi conform --kernel-a triton:w_then_a+fma --kernel-b cutlass --tiles "$W/capture" --no-invariance \
      --quiet --out "$OUT/fma/conform-capture-triton-w_then_a+fma-vs-cutlass" > "$OUT/fma/conform-capture.txt" 2>&1
    stamp "conform triton:w_then_a+fma vs cutlass on the capture rc=$?"; tail -8 "$OUT/fma/conform-capture.txt"
    KERNEL_A=cutlass KERNEL_B=triton:w_then_a+fma CHECKPOINTS=real PARTS="tf greedy" BUDGET_S=${BUDGET_S:-300} \
      bash analysis/h200/tokens.sh "$W/model/w8a8" "$W/model/w8a8-pow2-ceil" experiments/prompts/wikipedia-64x512 fma-tokens
    tar -C "$OUT" -czf "$OUT/fma.tgz" fma && rm -rf "$OUT/fma" ;;
  ecosystem)  # other projects' kernels (issue 22): identify + matrices, analysis/h200/ecosystem.sh (ECO_PARTS picks
              # parts); keeps a GGUF part it carries, so `capture flips` can follow the two stash calls
    stash_gguf_part
    source analysis/h200/ecosystem.sh ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
stamp "stage $STAGE done"

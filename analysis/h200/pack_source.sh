#!/usr/bin/env bash
# gpu_payload/src.tar.gz (or OUT): the toolkit, scripts, prompt sets and protocols of one commit
# (default HEAD), for the analysis/h200 scripts; refuses a commit that is not in the history.
#   bash analysis/h200/pack_source.sh [COMMIT [OUT]]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
commit=$(git rev-parse --verify "${1:-HEAD}^{commit}")
mkdir -p gpu_payload
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# tests/fixtures (recorded outputs the CPU tests replay; no GPU test reads them) stay home: the archive travels
# beside vLLM's 56 MB library within one call's 64 MiB
git archive --format=tar "$commit" -- alibi analysis/h200 analysis/bench_replay.py analysis/fit_block_schedule.py analysis/fit_mma_step.py experiments docs/schemas prereg tests ':(exclude)tests/fixtures' pyproject.toml README.md .ci > "$tmp/src.tar"
echo "$commit" > "$tmp/SOURCE_COMMIT"
tar -rf "$tmp/src.tar" -C "$tmp" SOURCE_COMMIT
out=${2:-gpu_payload/src.tar.gz}
gzip -9 -c "$tmp/src.tar" > "$out"
echo "$out: commit $commit, $(stat -c %s "$out") bytes"

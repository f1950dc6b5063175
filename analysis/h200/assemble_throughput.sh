#!/usr/bin/env bash
# A throughput call's files into a results folder: the benches, conform reports, walls, profiles and steps of
# ecosystem_chain.sh throughput (its tgz), and, given, the GPU tests' log and summary of fp8_block.sh launches.
#   bash analysis/h200/assemble_throughput.sh DEST THROUGHPUT_TGZ [LAUNCHES_TGZ LAUNCHES_SUMMARY]
# Then: python analysis/pin_results.py, and the folder's README digest in analysis/results/UNPINNED.yaml.
set -eu
DEST=$(realpath -m "$1"); TGZ=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
tar -xzf "$TGZ" -C "$T"
mkdir -p "$DEST"
R=$T/throughput
cp "$R"/steps.txt "$R"/bench-*.json "$R"/bench-*.txt "$R"/conform-*.txt "$R"/wall-*.txt "$DEST"/ 2>/dev/null || true
for f in capture.txt prepare.txt profile-qwen3.txt profile-qwen3-cuda.txt profile-smollm2-capture.txt \
    profile-smollm2-capture-cuda.txt profile-smollm2-full.txt profile-smollm2-full-cuda.txt; do
  [ -f "$R/$f" ] && cp "$R/$f" "$DEST/"
done
(cd "$R" && tar -cJf "$DEST/conform-reports.tar.xz" conform-*/)
if [ $# -ge 3 ]; then
  L=$(mktemp -d)
  tar -xzf "$3" -C "$L"
  cp "$L"/fp8_block/pytest-gpu-launches.txt "$DEST/"
  for f in "$L"/fp8_block/gc-census.txt "$L"/fp8_block/host-timeline-*.txt; do [ -f "$f" ] && cp "$f" "$DEST/"; done
  [ $# -ge 4 ] && cp "$4" "$DEST/launches-summary.txt"
  rm -rf "$L"
fi
head -1 "$R/steps.txt" | sed -E 's/.*after ([0-9a-f]{40}).*/\1/' > "$DEST/SOURCE_COMMIT"
ls -la "$DEST"
cat "$DEST/SOURCE_COMMIT"

#!/usr/bin/env bash
# Whether `alibi conform` gives the same report run after run, commit against commit, eager against replayed: the
# Qwen3-1.7B preset at M = 512 (cutlass vs triton, check device cuda) written REPEATS times by the "before" commit
# (gpu_payload/src-before.tar.gz), REPEATS times by the "after" one (gpu_payload/src.tar.gz) eagerly and REPEATS
# times with --cuda-graphs, each in a process of its own; then every report's results against the first "after"
# eager one, naming each unit field that differs.
#   REPEATS=2 bash analysis/h200/repeat_reports.sh          (results: $OUT/repeat-reports/)
# (KA, KB, PRESET: another pair or preset, e.g. to try the script on a machine without a GPU; EAGER_ARGS: how the
# "after" commit is told to launch eagerly, --no-cuda-graphs, or nothing for a commit where eager is the default)
set -u
: "${OUT:?}"
R=$OUT/repeat-reports
mkdir -p "$R"
for side in before after; do
  d=/tmp/src-$side; rm -rf "$d" && mkdir -p "$d"
  tar -xzf "gpu_payload/src$([ $side = before ] && echo -before).tar.gz" -C "$d" || exit 1
done
export SOURCE_DATE_EPOCH=1764633600
run() {  # LABEL SIDE ARGS...
  local label=$1 side=$2; shift 2
  (cd /tmp/src-$side && PYTHONPATH=/tmp/src-$side timeout 120 python -m alibi conform --kernel-a "${KA:-cutlass}" \
     --kernel-b "${KB:-triton}" --synthetic "${PRESET:-qwen3-1.7b}" --rows 512 "$@" --quiet --out "$R/$label" \
     > "$R/$label.txt" 2>&1)
  local rc=$?
  echo "$label ($(cut -c1-7 /tmp/src-$side/SOURCE_COMMIT)): rc $rc"
}
for i in $(seq "${REPEATS:-2}"); do
  run "after-eager-$i" after ${EAGER_ARGS:---no-cuda-graphs}
  run "after-graphs-$i" after --cuda-graphs
  run "before-$i" before
done
python - "$R" <<'PY' | tee "$R/compare.txt"
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
reports = {p.parent.name: json.loads(p.read_text()) for p in sorted(folder.glob("*/report.json"))}
base_name = "after-eager-1"
base = {(u["tile"], u["regime"]): u for u in reports[base_name]["tiles"]}
for name, report in reports.items():
    diffs = [f"{u['tile']}[{u['regime']}].{k}: {base[(u['tile'], u['regime'])][k]} -> {v}"
             for u in report["tiles"] for k, v in u.items() if base[(u["tile"], u["regime"])][k] != v]
    print(f"{name} against {base_name}: {len(report['tiles'])} units, verdict {report['verdict']}, "
          f"{len(diffs)} differing fields" + "".join(f"\n  {d}"[:400] for d in diffs[:20]))
PY

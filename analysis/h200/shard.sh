#!/usr/bin/env bash
# Issue 15 on a machine with several GPUs: the SmolLM2 capture conformed (cutlass vs triton) once in one
# process on one GPU and once sharded over the GPUs (`conform --devices`), the two report folders compared
# byte for byte (the manifests: equal once the sharded one's `parameters.sharding` is taken out), and the
# speed-up measured. Ray local too, where ray is installed.
#
#   bash analysis/h200/shard.sh W8A8_DIR_OR_CAPTURE [DEVICES]
#
# W8A8_DIR_OR_CAPTURE: the SmolLM2-135M W8A8 checkpoint (captured here with the triton kernel, M = 512, as in
# model_session.sh), or an existing tiles folder. DEVICES: default all; on a one-GPU machine `cuda:0` shows
# the sharded path works (one worker; no speed-up to expect). Runs from the repository root with the CUTLASS
# headers and kernel cache exported (setup.sh). Results: $OUT/shard.tgz and $OUT/shard-summary.txt.
set -u
: "${OUT:?}"
SRC=${1:?give the SmolLM2 W8A8 checkpoint folder or a capture folder}
DEVICES=${2:-all}
read -r KA KB <<< "${SHARD_KERNELS:-cutlass triton}"  # SHARD_KERNELS="torch-cpu emulator:a_then_w": a CPU dry run
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SOURCE_DATE_EPOCH=1700000000
R=$OUT/shard
W=/tmp/alibi-shard
mkdir -p "$R" "$W"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$R/steps.txt"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python -c "import torch; print('torch', torch.__version__, 'visible GPUs', torch.cuda.device_count())"; } > "$R/env.txt" 2>&1
cat "$R/env.txt"

if [ -f "$SRC/config.json" ]; then
  CAP=$W/capture
  rm -rf "$CAP"
  python -m alibi capture --model "$SRC" --prompts experiments/prompts/wikipedia-8x512 --tokens 512 --kernel triton \
    --out "$CAP" > "$R/capture.txt" 2>&1
  stamp "capture rc=$?"
else
  CAP=$SRC
fi
N_TILES=$(ls "$CAP"/*.safetensors 2>/dev/null | wc -l)
stamp "capture $CAP: $N_TILES tiles"

run() {  # run NAME FLAGS...: conform the capture into $W/NAME, wall time into $R/NAME.time
  local name=$1; shift
  rm -rf "$W/$name"
  local t=$(date +%s.%N)
  timeout 400 python -m alibi conform --kernel-a "$KA" --kernel-b "$KB" --tiles "$CAP" --out "$W/$name" "$@" \
    > "$R/$name.txt" 2>&1
  local rc=$?
  python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t" "$(date +%s.%N)" > "$R/$name.time"
  echo "$rc" > "$R/$name.rc"
  stamp "$name rc=$rc $(cat "$R/$name.time") s"
  tail -4 "$R/$name.txt"
}
# The first run also warms the Triton and CUTLASS caches every later run (and every worker) reads.
run warmup --quiet
run single
run sharded --devices "$DEVICES"
python -c "import ray" 2>/dev/null && run ray --ray local

python - "$W" "$R" <<'PY' | tee "$R/compare.txt"
import json, sys
from pathlib import Path
W, R = Path(sys.argv[1]), Path(sys.argv[2])
single = W / "single"
for name in ("sharded", "ray"):
    got = W / name
    if not (R / f"{name}.rc").exists():
        continue
    if not (got / "report.json").exists():
        print(f"{name}: no report (rc {(R / f'{name}.rc').read_text().strip()})"); continue
    same = {f: (got / f).read_bytes() == (single / f).read_bytes()
            for f in ("report.json", "report.md", "junit.xml", "report.html")}
    a = json.loads((single / "manifest.json").read_text())["predicate"]
    b = json.loads((got / "manifest.json").read_text())["predicate"]
    sharding = b["parameters"].pop("sharding", None)
    same["manifest.json predicate without parameters.sharding"] = a == b
    print(f"{name}: sharding {json.dumps(sharding)}")
    for f, ok in same.items():
        print(f"  {f}: {'identical' if ok else 'DIFFERS'}")
    (R / f"{name}.identical").write_text("yes\n" if all(same.values()) else "no\n")
    for f in ("report.json", "manifest.json"):
        (R / f"{name}-{f}").write_bytes((got / f).read_bytes())
(R / "single-report.json").write_bytes((single / "report.json").read_bytes())
(R / "single-manifest.json").write_bytes((single / "manifest.json").read_bytes())
PY
stamp compared

{
  echo "issue 15: SmolLM2 capture ($N_TILES tiles × real,pow2), $KA vs $KB, SOURCE_DATE_EPOCH fixed"
  grep -c '^[0-9]' "$R/env.txt" | sed 's/^/GPUs listed by nvidia-smi: /'
  printf '%-10s %-22s %4s %9s %9s %s\n' run flags rc wall_s speedup identical
  base=$(cat "$R/single.time")
  for name in single sharded ray; do
    [ -f "$R/$name.rc" ] || continue
    case $name in single) flags="(one process)";; sharded) flags="--devices $DEVICES";; ray) flags="--ray local";; esac
    t=$(cat "$R/$name.time")
    sp=$(python -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$base" "$t")
    ident=$(cat "$R/$name.identical" 2>/dev/null || echo "-")
    printf '%-10s %-22s %4s %9s %9s %s\n' "$name" "$flags" "$(cat "$R/$name.rc")" "$t" "$sp" "$ident"
  done
  grep -h "units computed by" "$R"/sharded.txt "$R"/ray.txt 2>/dev/null
} > "$OUT/shard-summary.txt"
tar -C "$OUT" -czf "$OUT/shard.tgz" shard && rm -rf "$R"
cat "$OUT/shard-summary.txt"

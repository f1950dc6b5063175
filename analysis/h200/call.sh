# Sourced by the analysis/h200 scripts that run one stage per device call: the call's clock and log, the GGUF parts it
# carries, the source it runs, the environment record, and SmolLM2's W8A8 checkpoint.
#
#   . analysis/h200/call.sh NAME     # results go to $OUT/NAME ($R); the log to $OUT/summary.txt
#
# Sets T0, W (/tmp/alibi: kept while the machine stays warm), R and SOURCE; defines stamp (log a line), left (seconds
# left of the call, BUDGET_S default 570) and prepare_w8a8 (the model in $W/model/w8a8 from the two GGUF parts, once);
# copies every carried gpu_payload/smollm2.gguf.part-* into $W; with SRC=gpu_payload/src.tar.gz
# (analysis/h200/pack_source.sh COMMIT) unpacks that commit to /tmp/src-NAME (a folder per script, so that two run
# side by side) and runs there, else the carried working tree
# (recorded as such); writes $R/env.txt.
: "${OUT:?set OUT}"
W=/tmp/alibi
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( ${BUDGET_S:-570} - ($(date +%s) - T0) )); }
for p in gpu_payload/smollm2.gguf.part-*; do [ -f "$p" ] && cp "$p" "$W/" && stamp "kept $(basename "$p") in $W"; done
if [ -n "${SRC:-}" ]; then
  S=/tmp/src-$1; rm -rf "$S"; mkdir -p "$S"; tar -xzf "$SRC" -C "$S" || { stamp "no source archive $SRC"; exit 1; }
  cd "$S" || exit 1
  SOURCE="commit $(cat SOURCE_COMMIT)"
else
  SOURCE="working tree as carried (HEAD $(git rev-parse HEAD 2>/dev/null || echo unknown), changes not recorded)"
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export TRITON_CACHE_DIR=$W/triton-cache  # compiled kernels kept from call to call while the machine is warm
R=$OUT/$1
mkdir -p "$R"
{ echo "source: $SOURCE"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$R/env.txt" 2>&1
stamp "stage ${STAGE:-}; $(head -3 "$R/env.txt" | tr '\n' ' ')"

prepare_w8a8() {  # SmolLM2-135M W8A8 in $W/model/w8a8, joined from the GGUF parts the calls carried (once per machine)
  MODEL=$W/model/w8a8
  [ -f "$MODEL/manifest.json" ] && return 0
  for x in aa ab; do [ -f "$W/smollm2.gguf.part-$x" ] || { stamp "GGUF part $x missing: run STAGE=stash first"; return 1; }; done
  cat "$W/smollm2.gguf.part-aa" "$W/smollm2.gguf.part-ab" > "$W/s.gguf"
  timeout 240 python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" > "$R/prepare.txt" 2>&1
  local rc=$?; stamp "prepare: rc $rc"; [ $rc = 0 ] || { tail -n 5 "$R/prepare.txt"; return 1; }
}

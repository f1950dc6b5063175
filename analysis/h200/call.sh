# Sourced by the analysis/h200 scripts that run one stage per device call: the call's clock and log, the GGUF parts it
# carries, the source it runs, the environment record, and SmolLM2's prepared checkpoints.
#
#   . analysis/h200/call.sh NAME     # results go to $OUT/NAME ($R); the log to $OUT/summary.txt
#
# Sets T0, W (default /tmp/alibi: kept while the machine stays warm), PAYLOAD (default gpu_payload, made absolute),
# R and SOURCE; defines stamp (log a line), left (seconds left of the call, BUDGET_S default 570) and prepare_model
# FORMAT (SmolLM2-135M in $W/model-FORMAT/FORMAT, `alibi model prepare --format FORMAT`, from the two GGUF parts,
# once per machine; sets MODEL). Copies every carried $PAYLOAD/smollm2.gguf.part-* into $W. With
# SRC=gpu_payload/src.tar.gz (analysis/h200/pack_source.sh COMMIT) unpacks that commit to /tmp/src-NAME-PID (a folder
# per run, so that runs go side by side) and runs there, else the carried working tree (recorded as such). SITE, when
# set, goes on PYTHONPATH after the source (packages installed there). Writes $R/env.txt.
: "${OUT:?set OUT}"
W=${W:-/tmp/alibi}
PAYLOAD=${PAYLOAD:-gpu_payload}
case $PAYLOAD in /*) ;; *) PAYLOAD=$PWD/$PAYLOAD ;; esac
mkdir -p "$W" "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( ${BUDGET_S:-570} - ($(date +%s) - T0) )); }
for p in "$PAYLOAD"/smollm2.gguf.part-*; do [ -f "$p" ] && cp "$p" "$W/" && stamp "kept $(basename "$p") in $W"; done
if [ -n "${SRC:-}" ]; then
  S=/tmp/src-$1-$$; rm -rf "$S"; mkdir -p "$S"; tar -xzf "$SRC" -C "$S" || { stamp "no source archive $SRC"; exit 1; }
  cd "$S" || exit 1
  SOURCE="commit $(cat SOURCE_COMMIT)"
else
  SOURCE="working tree as carried (HEAD $(git rev-parse HEAD 2>/dev/null || echo unknown), changes not recorded)"
fi
export PYTHONPATH=$PWD${SITE:+:$SITE} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export TRITON_CACHE_DIR=$W/triton-cache  # compiled kernels kept from call to call while the machine is warm
R=$OUT/$1
mkdir -p "$R"
{ echo "source: $SOURCE"
  if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  else echo "no nvidia-smi"; fi
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$R/env.txt" 2>&1
stamp "stage ${STAGE:-}; $(head -3 "$R/env.txt" | tr '\n' ' ')"

prepare_model() {  # prepare_model FORMAT: SmolLM2-135M in $W/model-FORMAT/FORMAT (MODEL), from the carried GGUF parts
  MODEL=$W/model-$1/$1
  [ -f "$MODEL/manifest.json" ] && { stamp "$1 checkpoint kept from an earlier call: $MODEL"; return 0; }
  for x in aa ab; do [ -f "$W/smollm2.gguf.part-$x" ] || { stamp "GGUF part $x missing: run STAGE=stash first"; return 1; }; done
  local joined=$W/s-$1.gguf  # one per format: two scripts may prepare side by side
  cat "$W/smollm2.gguf.part-aa" "$W/smollm2.gguf.part-ab" > "$joined"
  rm -rf "$W/model-$1"
  timeout 240 python -m alibi model prepare smollm2-135m --gguf "$joined" --format "$1" --out "$W/model-$1" \
    > "$R/prepare-$1.txt" 2>&1
  local rc=$?; rm -f "$joined"; stamp "prepare $1: rc $rc"
  [ $rc = 0 ] || { tail -n 5 "$R/prepare-$1.txt" | tee -a "$OUT/summary.txt"; return 1; }
}

#!/usr/bin/env bash
# Issue 9 on the H200: from one-ulp layer differences to tokens, cutlass against triton.
#
#   bash analysis/h200/tokens.sh MODEL_DIR POW2_MODEL_DIR PROMPTS64 OUTSUB
#
# MODEL_DIR: the real-scale W8A8 SmolLM2 checkpoint; POW2_MODEL_DIR: its pow2 ceil + requantized
# rewrite; PROMPTS64: the 64 × 512-token Wikipedia prompt set; OUTSUB: the name of the result folder.
# Runs from the repository root (PYTHONPATH=$PWD) with the CUTLASS headers and kernel cache already
# exported (ALIBI_CUTLASS_INCLUDE, ALIBI_CACHE). Everything goes to $OUT/OUTSUB, packed into
# $OUT/OUTSUB.tgz (the folder is removed), plus $OUT/OUTSUB-summary.txt; the summary table is
# printed last. Expected on one H200: about 8 minutes in all (times per part below).
#
#   tf-real, tf-pow2        teacher-forced, 64 windows × 256 scored positions after 256 tokens of
#                           context, each arm a fresh process, then `alibi analyze flips` (≈ 1 min each)
#   greedy-real, greedy-pow2 64 prompts (the first 128 tokens of each window) × 64 new tokens, batch 64,
#                           each arm twice, every run a fresh process (≈ 1 min each: 4 process
#                           starts dominate)
#                           (the sizes of tf and greedy are those of prereg/smollm2-token-transfer)
#   pvd-<ckpt>-<arm>        prefill vs decode with module attribution, 4 windows × 64 positions
#                           after 256 tokens, per arm and checkpoint (≈ 30 s each, 4 runs)
#   bench-<arm>             replay throughput and its ratio to a plain forward, 16 windows (≈ 30 s each)
#
# One device call may run 10 minutes: the parts run in the order above and a part whose time
# estimate no longer fits in BUDGET_S (default 540 s) is skipped and named in the summary, so the
# results are always packed. PARTS (default "tf greedy pvd bench") selects parts, e.g. to split
# the work over two calls: PARTS="tf greedy" then PARTS="pvd bench" with another OUTSUB.
set -u
if [ $# -ne 4 ]; then echo "usage: $0 MODEL_DIR POW2_MODEL_DIR PROMPTS64 OUTSUB" >&2; exit 2; fi
MODEL=$1 POW2=$2 PROMPTS=$3 SUB=$4
: "${OUT:?OUT must name the folder that comes back}"
PARTS=${PARTS:-tf greedy pvd bench}
BUDGET_S=${BUDGET_S:-540}
# The sizes and kernels above, overridable for a dry run of the plumbing elsewhere (e.g. on a CPU
# with KERNEL_A=torch-cpu KERNEL_B=emulator:a_then_w and a small model and prompt set).
KA=${KERNEL_A:-cutlass} KB=${KERNEL_B:-triton}
N=${WINDOWS:-64} T=${CONTEXT:-256} P=${POSITIONS:-256}
GT=${PROMPT_TOKENS:-128} GN=${NEW_TOKENS:-64} GB=${BATCH_SIZE:-64}
PN=${PVD_WINDOWS:-4} PP=${PVD_POSITIONS:-64} BN=${BENCH_WINDOWS:-16}
CKPTS=${CHECKPOINTS:-real pow2}  # which checkpoints the tf, greedy and pvd parts run on
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/$SUB
mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$R/steps.txt"; }
want() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
step() {  # step NAME ESTIMATE_S TIMEOUT_S COMMAND...: run if it fits, log to $R/NAME.txt, record rc
  local name=$1 estimate=$2 limit=$3; shift 3
  local left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ $estimate -gt $left ]; then stamp "$name skipped: needs ~${estimate}s, ${left}s of the budget left"; return; fi
  [ $limit -gt $left ] && limit=$left
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  local rc=$?
  stamp "$name rc=$rc"
  [ $rc -eq 0 ] || tail -5 "$R/$name.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'
  git rev-parse HEAD 2>/dev/null || cat SOURCE_COMMIT 2>/dev/null; git status --porcelain --untracked-files=no 2>/dev/null | head; } > "$R/env.txt" 2>&1
cat "$R/env.txt"

for ck in $CKPTS; do
  dir=$MODEL; [ $ck = pow2 ] && dir=$POW2
  want tf && step "tf-$ck" 90 240 python -m alibi replay teacher-forced --model "$dir" --prompts "$PROMPTS" \
    --kernel-a "$KA" --kernel-b "$KB" --windows $N --context $T --positions $P --out "$R/tf-$ck"
done
for ck in $CKPTS; do
  dir=$MODEL; [ $ck = pow2 ] && dir=$POW2
  want greedy && step "greedy-$ck" 60 180 python -m alibi replay greedy --model "$dir" --prompts "$PROMPTS" \
    --kernel-a "$KA" --kernel-b "$KB" --windows $N --prompt-tokens $GT --new-tokens $GN --batch-size $GB \
    --out "$R/greedy-$ck"
done
for ck in $CKPTS; do
  dir=$MODEL; [ $ck = pow2 ] && dir=$POW2
  for arm in a b; do
    k=$KA; [ $arm = b ] && k=$KB
    want pvd && step "pvd-$ck-$arm" 30 120 python -m alibi replay prefill-vs-decode --model "$dir" \
      --prompts "$PROMPTS" --kernel "$k" --windows $PN --context $T --positions $PP --out "$R/pvd-$ck-$arm"
  done
done
for arm in a b; do
  k=$KA; [ $arm = b ] && k=$KB
  want bench && step "bench-$arm" 30 120 python analysis/bench_replay.py --model "$MODEL" --kernel "$k" \
    --prompts "$PROMPTS" --windows $BN --context $T --positions $P --repeats 3 --out "$R/bench-$arm.json"
done

python - "$R" "$KA" "$KB" > "$R/summary.txt" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
r = Path(sys.argv[1])
kernels = {"a": sys.argv[2], "b": sys.argv[3]}
def load(p):
    try:
        return json.loads((r / p).read_text())
    except (OSError, ValueError):
        return None
print(f"{'part':<32} result   (arm a = {kernels['a']}, arm b = {kernels['b']})")
for ck in ("real", "pow2"):
    f = load(f"tf-{ck}/flips/flips.json")
    if f:
        ci = f.get("roc_auc_ci90")
        print(f"{'teacher-forced ' + ck:<32} positions {f['n_positions']}, flips {f['n_flips']} (rate {f['flip_rate']:.4f}), "
              f"logits identical {f.get('logits_identical')}/{f.get('logits_compared')}, AUC {f.get('roc_auc')} CI90 {ci}, "
              f"Brier {f.get('brier_heldout')} vs {f.get('brier_baseline')}")
    else:
        print(f"{'teacher-forced ' + ck:<32} MISSING (see tf-{ck}.txt)")
for ck in ("real", "pow2"):
    g = load(f"greedy-{ck}/greedy.json")
    if g:
        d = [x for x in g["first_divergence"] if x is not None]
        print(f"{'greedy ' + ck:<32} identical {g['identical_sequences']}/{g['n_prompts']}, reproduce a {g['arm_a_reproduces']} "
              f"b {g['arm_b_reproduces']}, first divergence min {min(d) if d else None} max {max(d) if d else None}")
    else:
        print(f"{'greedy ' + ck:<32} MISSING (see greedy-{ck}.txt)")
for ck in ("real", "pow2"):
    for arm, k in kernels.items():
        p = load(f"pvd-{ck}-{arm}/prefill_decode.json")
        if p:
            top = ", ".join(f"{m} {n}" for m, n in list(p["first_kind_counts"].items())[:3])
            print(f"{'prefill-decode ' + ck + ' ' + k:<32} logits differ {p['logits_differ']}/{p['n_positions']}, "
                  f"flips {p['argmax_flips']}, unattributed {p['unattributed']}; first: {top}")
        else:
            print(f"{'prefill-decode ' + ck + ' ' + k:<32} MISSING (see pvd-{ck}-{arm}.txt)")
for arm, k in kernels.items():
    b = load(f"bench-{arm}.json")
    if b:
        print(f"{'bench ' + k:<32} replay {b['replay_positions_per_s']} positions/s, ratio to forward {b['ratio']} "
              f"(goal <= {b['goal_ratio']}: {b['goal_met']})")
    else:
        print(f"{'bench ' + k:<32} MISSING (see bench-{arm}.txt)")
EOF
stamp "summary"
cp "$R/summary.txt" "$OUT/$SUB-summary.txt"
tar -C "$OUT" -czf "$OUT/$SUB.tgz" "$SUB" && rm -rf "$R"
cat "$OUT/$SUB-summary.txt"

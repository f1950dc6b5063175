#!/usr/bin/env bash
# The GPU half of issue 6: does the recommended pow2 checkpoint make `cutlass` and `triton`
# generate the same greedy text, and does it cost kernel time?
#
#   PYTHONPATH=. bash analysis/pow2_gpu.sh MODEL_DIR OUT_DIR
#
# MODEL_DIR: the output of `alibi model prepare smollm2-135m` (holds bf16/ and w8a8/).
# OUT_DIR:   small results only (JSON, logs); the rewritten checkpoint goes to $WORK
#            (default /tmp/alibi-pow2), since it is ~160 MB.
# Runs from the repository root on a CUDA machine with the `cutlass` and `triton` kernels
# available (ALIBI_CUTLASS_INCLUDE / ALIBI_CACHE as for any other GPU run). About 1–2 minutes
# on an H200 once CUTLASS is built; `timeout 240` is a safe bound.
#
# Steps: (1) rewrite w8a8/ with the variant analysis/results/cpu/pow2-cost/pow2_cost.md recommends
# (--mode ceil --requantize-from bf16/); (2) `alibi eval generate`, 8 prompts × 32 new tokens,
# with --kernel cutlass and --kernel triton on the real-scale and on the pow2 checkpoint;
# (3) in one process: count sequences on which the kernels agree, and time the kernels on both
# checkpoints (all 210 Linears at M = 512 and M = 1, CUDA-graph and eager; plus a 512-token
# prefill of the whole model), reporting pow2/real time ratios. Writes OUT_DIR/pow2_gpu.json.
#
# KERNEL_A / KERNEL_B / DEVICE (default cutlass / triton / cuda) exist to smoke-test the script
# on a CPU: KERNEL_A=torch-cpu KERNEL_B=emulator:a_then_w DEVICE=cpu REPEATS=1 (timing then uses
# wall time). REPEATS (default 3): interleaved timing repeats.
set -euo pipefail
MODEL=${1:?usage: bash analysis/pow2_gpu.sh MODEL_DIR OUT_DIR}
OUT=${2:?usage: bash analysis/pow2_gpu.sh MODEL_DIR OUT_DIR}
PROMPTS=${PROMPTS:-experiments/prompts/wikipedia-8x512}
WORK=${WORK:-/tmp/alibi-pow2}
MODE=ceil
KERNEL_A=${KERNEL_A:-cutlass}
KERNEL_B=${KERNEL_B:-triton}
export DEVICE=${DEVICE:-cuda}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
T0=$(date +%s); stamp() { echo "[pow2-gpu $(( $(date +%s) - T0 ))s] $*"; }

REAL="$MODEL/w8a8"
POW2="$WORK/w8a8-pow2-$MODE-requantize"
python -m alibi pow2-rewrite "$REAL" "$POW2" --mode $MODE --requantize-from "$MODEL/bf16" --overwrite \
  | tee "$OUT/rewrite.txt"
cp "$POW2/manifest.json" "$OUT/pow2-checkpoint.manifest.json"
stamp "rewrote $REAL -> $POW2 (--mode $MODE --requantize-from $MODEL/bf16)"

for ckpt in real pow2; do
  dir=$REAL; [ $ckpt = pow2 ] && dir=$POW2
  for arm in a b; do
    kernel=$KERNEL_A; [ $arm = b ] && kernel=$KERNEL_B
    python -m alibi eval generate --model "$dir" --prompts "$PROMPTS" --kernel "$kernel" --device "$DEVICE" \
      --windows 8 --new-tokens 32 --out "$OUT/generate-$ckpt-$arm.json" > "$OUT/generate-$ckpt-$arm.txt" 2>&1 \
      || { cat "$OUT/generate-$ckpt-$arm.txt"; exit 1; }
    stamp "generated: $ckpt checkpoint, --kernel $kernel"
  done
done

python - "$REAL" "$POW2" "$PROMPTS" "$OUT" "$KERNEL_A" "$KERNEL_B" <<'PY'
"""Agreement of the generated sequences, and kernel time on the pow2 vs the real-scale checkpoint."""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from alibi.governance.environment import environment_record, toolkit_record
from alibi.model.prompts import load_prompt_set
from alibi.model.runner import load_model

real_dir, pow2_dir, prompts_dir, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
KERNELS = {"a": sys.argv[5], "b": sys.argv[6]}
DEVICE = os.environ["DEVICE"]
CKPTS = {"real": real_dir, "pow2": pow2_dir}
REPEATS, REP_MS = int(os.environ.get("REPEATS", "3")), 100


def generated(ckpt, arm):
    return json.loads((out / f"generate-{ckpt}-{arm}.json").read_text())


def sequences(ckpt, arm):
    return {row["window"]: row["ids"] for row in generated(ckpt, arm)["sequences"]}


def first_divergence(x, y):
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)


agreement = {}
for ckpt in CKPTS:
    a, b = sequences(ckpt, "a"), sequences(ckpt, "b")
    div = {w: first_divergence(a[w], b[w]) for w in sorted(a)}
    agreement[ckpt] = {"sequences": len(a), "agree": sum(d is None for d in div.values()),
                       "first_divergence_by_window": div}
cross = {KERNELS[arm]: sum(first_divergence(x, sequences("pow2", arm)[w]) is None
                           for w, x in sequences("real", arm).items()) for arm in KERNELS}


def eager_ms(fn):
    if DEVICE == "cuda":
        from alibi.kernels.bench import timer
        return timer(fn, REP_MS)
    start = time.perf_counter()  # CPU smoke test: one wall-clock sample per repeat
    fn()
    return 1e3 * (time.perf_counter() - start)


def graph_ms(fn):
    if DEVICE != "cuda":
        return None
    from alibi.kernels.bench import graph_timer
    return graph_timer(fn, REP_MS)


# Kernel time: the same activations through every Linear of each checkpoint, real and pow2
# interleaved and repeated so that clock drift hits both alike.
ps = load_prompt_set(prompts_dir)
ids = ps.input_ids[0].reshape(1, -1)
models = {(c, arm): load_model(d, KERNELS[arm], DEVICE) for c, d in CKPTS.items() for arm in KERNELS}
g = torch.Generator(device=DEVICE).manual_seed(0)
acts = {}
for lin in next(iter(models.values())).linears():
    for m in (1, 512):
        if (m, lin.in_features) not in acts:
            acts[(m, lin.in_features)] = (
                torch.randint(-127, 128, (m, lin.in_features), dtype=torch.int8, device=DEVICE, generator=g),
                torch.rand(m, device=DEVICE, generator=g) * 1e-2 + 1e-3)


def all_linears(lm, m):
    layers = list(lm.linears())

    def run():
        for lin in layers:
            a_q, s_a = acts[(m, lin.in_features)]
            lin.kernel.scaled_mm(a_q, s_a, lin.w_q, lin.s_w, None, torch.bfloat16)
    return run


WHATS = ("linears_m512", "linears_m1", "prefill_512")
times = {(arm, what, c): {"eager_ms": [], "graph_ms": []} for arm in KERNELS for what in WHATS for c in CKPTS}
for arm in KERNELS:
    for what in WHATS:
        for _ in range(REPEATS):
            for c in CKPTS:
                lm = models[(c, arm)]
                if what == "prefill_512":
                    fn = lambda lm=lm: lm.logits(ids)
                else:
                    fn = all_linears(lm, 512 if what == "linears_m512" else 1)
                fn()
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                times[(arm, what, c)]["eager_ms"].append(eager_ms(fn))
                gm = graph_ms(fn) if what != "prefill_512" else None
                if gm is not None:
                    times[(arm, what, c)]["graph_ms"].append(gm)

timing = []
for arm, kernel in KERNELS.items():
    for what in WHATS:
        row = {"kernel": kernel, "what": what}
        for clock in ("eager", "graph"):
            for c in CKPTS:
                vals = times[(arm, what, c)][f"{clock}_ms"]
                row[f"{c}_{clock}_ms"] = statistics.median(vals) if vals else None
            r, p = row[f"real_{clock}_ms"], row[f"pow2_{clock}_ms"]
            row[f"ratio_pow2_over_real_{clock}"] = None if not (r and p) else p / r
        timing.append(row)

gen = generated("real", "a")
doc = {"study": "pow2 checkpoint on the GPU: greedy agreement of two kernels, and kernel time (issue 6)",
       "kernels": KERNELS, "device": DEVICE, "real_checkpoint": real_dir, "pow2_checkpoint": pow2_dir,
       "prompts": prompts_dir, "prompts_digest": ps.digest,
       "generation": {"prompts": len(gen["sequences"]), "prompt_tokens": gen["prompt_tokens"],
                      "new_tokens": gen["new_tokens"]},
       "agreement_a_vs_b": agreement, "same_kernel_real_vs_pow2_agree": cross,
       "timing": timing,
       "timing_note": f"median over {REPEATS} interleaved repeats of triton.testing.do_bench (eager) and "
                      "do_bench_cudagraph (graph); linears_*: all 210 Linears called back to back on fixed random "
                      "int8 activations at M = 512 or 1; prefill_512: one forward pass of window 0 (eager only)",
       "environment": environment_record(), "toolkit": toolkit_record()}
(out / "pow2_gpu.json").write_text(json.dumps(doc, indent=2) + "\n")

n = doc["generation"]
print(f"\n=== greedy generation, {n['prompts']} prompts x {n['new_tokens']} tokens: "
      f"{KERNELS['a']} vs {KERNELS['b']} ===")
for c, a in agreement.items():
    print(f"  {c:>4} checkpoint: {a['agree']}/{a['sequences']} sequences identical "
          f"(first divergence by window: {a['first_divergence_by_window']})")
print(f"  same kernel, real vs pow2 checkpoint, identical sequences: {cross}")
print("=== kernel time, pow2 / real (median ms; a ratio near 1.00 means unchanged) ===")
for row in timing:
    cells = []
    for clock in ("eager", "graph"):
        r, p, q = row[f"real_{clock}_ms"], row[f"pow2_{clock}_ms"], row[f"ratio_pow2_over_real_{clock}"]
        cells.append(f"{clock} " + ("n/a" if q is None else f"{r:.4f} -> {p:.4f} ms (x{q:.3f})"))
    print(f"  {row['kernel']:>18} {row['what']:<13} " + "   ".join(cells))
print(f"wrote {out / 'pow2_gpu.json'}")
PY
stamp done

"""Host cost per call of the pieces of a conformance unit, on the GPU: N calls queued without a sync."""
import sys, time, torch
from alibi.conform.pipeline import choose_pair, source_from_preset, prepare_tiles, run_unit, sub_batches, run_units
import alibi.conform.pipeline as P
from alibi.conform.judge import measure, judged
from alibi.kernels.base import private_copy, operands
pair = choose_pair("cutlass", "triton")
src = source_from_preset(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-full", rows=512)
dev = torch.device("cuda")
tiles = [t for t in src.tiles if (t.M, t.N, t.K) == (src.tiles[0].M, src.tiles[0].N, src.tiles[0].K)][:20]
print("tile", tiles[0].M, tiles[0].N, tiles[0].K, "n", len(tiles), "bias", tiles[0].bias is not None, flush=True)
N = 300
def cost(name, fn, n=N):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"{name:40s} host {1e6*(t1-t0)/n:8.1f} us/call   with drain {1e6*(t2-t0)/n:8.1f}", flush=True)
prep = prepare_tiles([(t, ("real", "pow2")) for t in tiles], dev)
p = prep[0]; t = p.regimes["real"]
ka, kb = pair.a, pair.b
x = torch.zeros(512, 576, device=dev)
cost("torch add_ (baseline op)", lambda: x.add_(1))
cost("torch.empty 512x576 bf16", lambda: torch.empty((512, 576), dtype=torch.bfloat16, device=dev))
cost("current_stream", lambda: torch.cuda.current_stream(dev))
cost("private_copy", lambda: private_copy(t, dev))
rows = sub_batches(t.M)
if hasattr(P, "sub_tile"): cost("sub_tile", lambda: P.sub_tile(t, rows[1]))
cost("tile.replace", lambda: t.replace(a_q=t.a_q))
o = operands(t)
cost("cutlass.scaled_mm raw", lambda: ka.scaled_mm(o["a_q"], o["s_a"], o["w_q"], o["s_w"], o["bias"], t.out_dtype))
cost("triton.scaled_mm raw", lambda: kb.scaled_mm(o["a_q"], o["s_a"], o["w_q"], o["s_w"], o["bias"], t.out_dtype))
cost("cutlass Kernel.run (no evidence)", lambda: ka.run(t, on_device=True, evidence=False, wait=False))
cost("triton Kernel.run (no evidence)", lambda: kb.run(t, on_device=True, evidence=False, wait=False))
cost("cutlass Kernel.run (evidence)", lambda: ka.run(t, on_device=True, wait=False))
cost("triton Kernel.run (evidence)", lambda: kb.run(t, on_device=True, wait=False))
cost("cutlass accumulator", lambda: ka.accumulator(o["a_q"], o["w_q"]))
cost("triton accumulator", lambda: kb.accumulator(o["a_q"], o["w_q"]))
cost("run_unit real", lambda: run_unit(pair, p, "real"), 100)
cost("run_unit pow2", lambda: run_unit(pair, p, "pow2"), 100)
cost("prepare_tiles 20 tiles x2 regimes", lambda: prepare_tiles([(tt, ("real", "pow2")) for tt in tiles], dev), 10)
work = [(q, r) for r in ("real", "pow2") for q in prep]
runs = run_units(pair, work)
stage = lambda name: __import__("contextlib").nullcontext()
cost("run_units 40 units", lambda: run_units(pair, work), 5)
cost("measure 40 units", lambda: measure(pair, runs, stage), 5)
ms = measure(pair, runs, stage)
def collect_judge():
    judged(measure(pair, runs, stage), len(runs), stage)
cost("measure+judged 40 units", collect_judge, 5)

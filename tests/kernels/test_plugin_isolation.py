"""Plugins are isolated and cannot impersonate (issue 36, item 3).

A plugin (a kernel registered under the `alibi.kernels` entry-point group) whose import raises, calls `sys.exit`
or hangs, whose `available()` raises or answers something else than (bool, reason), whose `Kernel.name` is not its
entry-point name, or whose entry-point name is a built-in's: `alibi kernels` still lists the rest, the broken one
marked with its reason; `alibi conform` exits 3 (or 4, when the kernel fails while it runs) with one line, never 0
without a report, and never writes a report that attributes a plugin's outputs to another kernel. Each plugin here
is a real dist-info folder on sys.path, read by importlib.metadata as pip's install would be, with modules under
names of their own for each test (an imported module stays in `sys.modules`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from hostile import REPO, main_one_line

KERNEL = '''
import torch
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.kernels.base import Kernel


class K(Kernel):
    name = {name!r}
    formats = ("int8",)
    device = "cpu"
    epilogue = EpilogueModel("w_then_a")

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)
'''

# Waits for the test to release it (or, on code that does not bound the wait, for `ISO_HANG_S` seconds), then
# defines a working kernel: what it would have been, had its import returned.
HANGS = '''
import os, time
from pathlib import Path

_release = Path(__file__).with_name("release")
_deadline = time.monotonic() + float(os.environ.get("ISO_HANG_S", "20"))
while not _release.exists() and time.monotonic() < _deadline:
    time.sleep(0.05)
''' + KERNEL


def install(site: Path, monkeypatch, entries: dict[str, str], package: str = "iso-plugins") -> None:
    """Install `package` into `site` (put on sys.path) with one entry point per `entries` item (entry-point name ->
    module source, whose `K` is the factory), each module under a name no other test uses."""
    site.mkdir(exist_ok=True)
    tag = re.sub(r"\W", "_", site.parent.name)
    lines = []
    for i, (name, source) in enumerate(entries.items()):
        module = f"iso_{tag}_{package.replace('-', '_')}_{i}"
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        lines.append(f"{name} = {module}:K")
    info = site / f"{package.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[alibi.kernels]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(site))


def kernel(name: str, source: str = "") -> str:
    """A working kernel module whose kernel is named `name`, with `source` appended (an override of K)."""
    return KERNEL.format(name=name) + textwrap.dedent(source)


@pytest.fixture
def site(tmp_path):
    folder = tmp_path / "site"
    yield folder
    (folder / "release").touch()  # a hanging import still waiting in its thread returns now


def listing(capsys) -> dict[str, dict]:
    """`alibi kernels --json` in this process, by row name (every name once)."""
    from alibi.cli import main

    capsys.readouterr()
    assert main(["kernels", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    return {r["name"]: r for r in rows}


def conform_args(kernel_a: str, out: Path) -> list[str]:
    return ["conform", "--kernel-a", kernel_a, "--kernel-b", "emulator:w_then_a", "--synthetic", "tiny", "--out",
            str(out), "--quiet"]


def test_a_plugin_whose_import_calls_sys_exit_is_listed_unavailable_with_the_reason_and_the_rest_still_listed(
        site, monkeypatch, capsys, tmp_path):
    install(site, monkeypatch, {"iso-exits": "import sys\nsys.exit(0)\n", "iso-fine": kernel("iso-fine")})
    rows = listing(capsys)
    assert rows["iso-exits"]["available"] is False and "sys.exit(0)" in rows["iso-exits"]["reason"]
    assert rows["iso-fine"]["available"] is True and rows["torch-cpu"]["available"] is True
    main_one_line(capsys, conform_args("iso-exits", tmp_path / "r"), "iso-exits", "sys.exit(0)", code=3)
    assert not (tmp_path / "r").exists()


def test_a_plugin_whose_import_hangs_is_refused_after_the_timeout_and_the_rest_still_listed(
        site, monkeypatch, capsys):
    monkeypatch.setenv("ALIBI_PLUGIN_TIMEOUT", "1")
    install(site, monkeypatch, {"iso-hangs-listed": HANGS.format(name="iso-hangs-listed"),
                                "iso-fine": kernel("iso-fine")})
    start = time.monotonic()
    rows = listing(capsys)
    assert time.monotonic() - start < 15
    hung = rows["iso-hangs-listed"]
    assert hung["available"] is False and "did not finish loading within 1 s" in hung["reason"], hung
    assert "ALIBI_PLUGIN_TIMEOUT" in hung["reason"]
    assert rows["iso-fine"]["available"] is True and rows["torch-cpu"]["available"] is True
    # Asked again, it is refused at once: its import, still waiting in its thread, is not started a second time.
    from alibi.kernels.registry import get_kernel

    start = time.monotonic()
    assert get_kernel("iso-hangs-listed").available()[0] is False
    assert time.monotonic() - start < 0.5


def test_conform_with_a_plugin_whose_import_hangs_exits_3_with_one_line_and_does_not_wait_for_it(site, monkeypatch,
                                                                                                 tmp_path):
    """In a process of its own: the daemon thread still hanging in the plugin's import does not keep `alibi` from
    exiting (on code without the bound, the import returns after 120 s, past the 90 s this waits)."""
    from hostile import assert_one_line_error

    install(site, monkeypatch, {"iso-hangs": HANGS.format(name="iso-hangs")})
    proc = subprocess.run([sys.executable, "-m", "alibi", *conform_args("iso-hangs", tmp_path / "r")], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=90,
                          env={**os.environ, "PYTHONPATH": f"{site}:{REPO}", "ALIBI_PLUGIN_TIMEOUT": "2",
                               "ISO_HANG_S": "120"})
    assert_one_line_error(proc, "iso-hangs", "did not finish loading within 2 s", code=3)
    assert proc.stdout == "" and not (tmp_path / "r").exists()


@pytest.mark.parametrize("available, said", [
    ("raise RuntimeError('no such device')", "its available() raised (RuntimeError: no such device)"),
    ("raise SystemExit(0)", "its available() raised (it called sys.exit(0))"),
    ("return 'yes'", "its available() returned 'yes', not (True or False, reason)"),
    ("return None", "its available() returned None"),
], ids=["raises", "exits", "a-string", "none"])
def test_a_plugin_whose_available_raises_or_answers_no_pair_is_listed_unavailable_and_conform_exits_3(
        site, monkeypatch, capsys, tmp_path, available, said):
    body = f"\nclass K(K):\n    def available(self):\n        {available}\n"
    install(site, monkeypatch, {"iso-asks": kernel("iso-asks", body), "iso-fine": kernel("iso-fine")})
    rows = listing(capsys)
    assert rows["iso-asks"]["available"] is False and said in rows["iso-asks"]["reason"], rows["iso-asks"]
    assert rows["iso-fine"]["available"] is True
    main_one_line(capsys, conform_args("iso-asks", tmp_path / "r"), "iso-asks", said, code=3)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("claimed", ["torch-cpu", "emulator:w_then_a", "iso-someone-else"])
def test_a_plugin_whose_kernel_name_is_not_its_entry_point_name_gets_no_report_under_either_name(
        site, monkeypatch, capsys, tmp_path, claimed):
    install(site, monkeypatch, {"iso-impostor": kernel(claimed)})
    rows = listing(capsys)
    assert rows["iso-impostor"]["available"] is False
    assert f"its kernel is named {claimed!r}, not 'iso-impostor'" in rows["iso-impostor"]["reason"]
    main_one_line(capsys, conform_args("iso-impostor", tmp_path / "r"), "iso-impostor", repr(claimed), code=3)
    assert not (tmp_path / "r").exists()


def test_a_plugin_registered_under_a_builtin_name_is_listed_apart_as_refused_and_the_name_keeps_meaning_the_builtin(
        site, monkeypatch, capsys):
    install(site, monkeypatch, {"torch-cpu": kernel("torch-cpu"), "emulator:iso": kernel("emulator:iso"),
                                "mutant:iso:triton": kernel("mutant:iso:triton"), "iso-fine": kernel("iso-fine")})
    rows = listing(capsys)
    assert rows["torch-cpu"]["available"] is True and "torch._int_mm" in rows["torch-cpu"]["reason"]
    for name, what in (("torch-cpu", "the built-in kernel 'torch-cpu'"),
                       ("emulator:iso", "the built-in family emulator:"),
                       ("mutant:iso:triton", "the built-in family mutant:")):
        refused = [r for r in rows.values() if r["name"] != name and r["name"].startswith(name + " ")]
        assert len(refused) == 1 and refused[0]["available"] is False, (name, refused)
        assert f"plugin entry point {name} = 'iso_" in refused[0]["reason"] and what in refused[0]["reason"]
    assert rows["iso-fine"]["available"] is True
    from alibi.kernels.registry import get_kernel

    assert type(get_kernel("torch-cpu")).__module__ == "alibi.kernels.cpu"


def test_two_packages_registering_one_name_are_refused_naming_both_not_one_picked_silently(site, monkeypatch, capsys,
                                                                                            tmp_path):
    install(site, monkeypatch, {"iso-twice": kernel("iso-twice")}, package="iso-first")
    install(site, monkeypatch, {"iso-twice": kernel("iso-twice")}, package="iso-second")
    rows = listing(capsys)
    reason = rows["iso-twice"]["reason"]
    assert rows["iso-twice"]["available"] is False
    assert "(package iso-first)" in reason and "(package iso-second)" in reason, reason
    main_one_line(capsys, conform_args("iso-twice", tmp_path / "r"), "iso-twice", "registered by 2 entry points",
                  code=3)


def test_a_plugin_with_a_malformed_declaration_is_listed_unavailable_naming_the_attribute(site, monkeypatch, capsys):
    install(site, monkeypatch, {"iso-formats": kernel("iso-formats", "\nK.formats = 8\n"),
                                "iso-epilogue": kernel("iso-epilogue", "\nK.epilogue = 'w_then_a'\n")})
    rows = listing(capsys)
    assert rows["iso-formats"]["available"] is False and "formats = 8" in rows["iso-formats"]["reason"]
    assert rows["iso-epilogue"]["available"] is False and "epilogue = 'w_then_a'" in rows["iso-epilogue"]["reason"]


def test_a_plugin_kernel_that_calls_sys_exit_while_it_runs_is_exit_4_in_one_line_not_exit_0_without_a_report(
        site, monkeypatch, capsys, tmp_path):
    body = "\nclass K(K):\n    def scaled_mm(self, *args, **kwargs):\n        raise SystemExit(0)\n"
    install(site, monkeypatch, {"iso-quits": kernel("iso-quits", body)})
    main_one_line(capsys, conform_args("iso-quits", tmp_path / "r"), "iso-quits", "SystemExit", code=4)
    assert not (tmp_path / "r").exists()


def test_a_bad_plugin_timeout_is_one_line_naming_the_setting(site, monkeypatch, capsys):
    monkeypatch.setenv("ALIBI_PLUGIN_TIMEOUT", "soon")
    install(site, monkeypatch, {"iso-fine": kernel("iso-fine")})
    main_one_line(capsys, ["kernels"], "ALIBI_PLUGIN_TIMEOUT='soon'", code=2)


def test_the_previous_readmes_plugin_import_keeps_working_and_names_the_new_one():
    import alibi.kernels.base

    with pytest.warns(DeprecationWarning, match=r"from alibi\.kernels\.base import Kernel"):
        from alibi.kernels import Kernel
    assert Kernel is alibi.kernels.base.Kernel


def test_a_plugin_written_against_the_previous_readme_loads_and_runs(site, monkeypatch):
    install(site, monkeypatch, {"iso-old-api": kernel("iso-old-api").replace("from alibi.kernels.base import Kernel",
                                                                             "from alibi.kernels import Kernel")})
    from alibi.kernels.registry import get_kernel
    from alibi.testing import assert_interchangeable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = get_kernel("iso-old-api")
    assert loaded.available() == (True, "runs on the CPU"), loaded.available()
    assert assert_interchangeable("iso-old-api", "emulator:w_then_a", "tiny").equivalence == "bitwise"

"""The README's "Certify your own kernel" example runs as written: its kernel module, installed as a package
with the README's entry point, is listed by `alibi kernels`, and the README's pytest test passes importing it.

The blocks are taken from README.md itself, so the example cannot drift from the code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _python_blocks() -> list[str]:
    return _blocks("python")


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory) -> Path:
    """The README's my_kernel.py and its pyproject.toml entry point, pip-installed into a folder of its own
    (--target: this environment is left as it was)."""
    root = tmp_path_factory.mktemp("readme-kernel")
    pkg, site = root / "pkg", root / "site"
    pkg.mkdir()
    (pkg / "my_kernel.py").write_text(next(b for b in _python_blocks() if b.startswith("# my_kernel.py")))
    entry_point = next(b for b in _blocks("toml") if "alibi.kernels" in b)
    (pkg / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
                                        '[project]\nname = "my-kernel"\nversion = "0.1"\n\n'
                                        '[tool.setuptools]\npy-modules = ["my_kernel"]\n\n' + entry_point)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(pkg)], check=True, capture_output=True, timeout=300)
    return site


def test_the_installed_readme_kernel_is_listed_by_alibi_kernels_through_its_entry_point(installed_example):
    repo = README.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed_example), str(repo)])}
    listing = subprocess.run([sys.executable, "-m", "alibi", "kernels"], capture_output=True, text=True,
                             env=env, timeout=300, cwd=installed_example)
    assert listing.returncode == 0, listing.stderr
    line = next(ln for ln in listing.stdout.splitlines() if "my-kernel" in ln)
    assert "a_then_w+add_before_cast" in line and "unavailable" not in line, line


def test_the_readme_kernel_example_declares_its_model_and_passes_its_own_readme_test(installed_example, monkeypatch):
    monkeypatch.syspath_prepend(str(installed_example))
    monkeypatch.delitem(sys.modules, "my_kernel", raising=False)
    import my_kernel

    assert my_kernel.MyKernel().epilogue.name == "a_then_w+add_before_cast"
    test_src = next(b for b in _python_blocks() if "assert_interchangeable" in b)
    namespace: dict = {}
    exec(compile(test_src, "README.md:test", "exec"), namespace)  # noqa: S102 - our own README
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()


def test_the_readme_example_kernel_is_identified_as_the_model_it_declares():
    from alibi.controls.identify import identify
    from alibi.tiles.synthetic import synthetic_tiles

    namespace: dict = {}
    exec(compile(next(b for b in _python_blocks() if b.startswith("# my_kernel.py")), "README.md", "exec"), namespace)  # noqa: S102
    found = identify(namespace["MyKernel"](), synthetic_tiles("epilogue-probe-bias", seed=0))
    assert [c.model for c in found if c.matches] == ["a_then_w+add_before_cast"]

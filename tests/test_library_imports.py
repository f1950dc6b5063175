"""The library never imports the CLI: only `alibi/cli/` and `alibi/__main__.py` may.

Why it matters: the CLI imports every command module (and so the whole toolkit) and owns process
concerns (exit codes, Ctrl-C, printing); a library module that reaches into it drags all of that
into `import alibi.<x>` and makes an import cycle one edit away. The scan reads every module's
syntax tree (no import is executed), so imports inside functions, relative imports and
`importlib.import_module("alibi.cli...")` with a literal name are all seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import alibi

CLI = "alibi.cli"
ALLOWED = ("cli/", "__main__.py")  # paths relative to the package folder that may import the CLI


def _module_name(package_dir: Path, path: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` written in `module`."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


def _is_cli(name: str) -> bool:
    return name == CLI or name.startswith(CLI + ".")


def cli_imports(package_dir: Path) -> list[str]:
    """`"<module>:<line> imports <name>"` for every import of `alibi.cli` outside the allowed files."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if "__pycache__" in rel or rel.startswith(ALLOWED):
            continue
        module = _module_name(package_dir, path)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                origin = node.module if node.level == 0 else _resolve(module, is_package, node.level, node.module)
                names = [origin] + [f"{origin}.{a.name}" for a in node.names]  # `from alibi import cli`
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
                names = [node.args[0].value]
            hits = sorted({n for n in names if n and _is_cli(n)})
            if hits:
                found.append(f"{module}:{node.lineno} imports {hits[0]}")
    return found


def test_no_library_module_imports_the_cli():
    offenders = cli_imports(Path(alibi.__file__).resolve().parent)
    assert offenders == [], "library modules import the CLI (move the code they need out of alibi/cli/): " + \
        "; ".join(offenders)


def test_the_scan_names_each_form_of_cli_import_and_spares_the_cli_and_main(tmp_path):
    """The scanner itself can fail: a fake package with one offender per import form is flagged module by module."""
    pkg = tmp_path / "alibi"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "sub").mkdir()
    files = {
        "__init__.py": "",
        "cli/__init__.py": "from alibi.cli import conform\n",          # allowed: the CLI itself
        "cli/conform.py": "import alibi.cli\n",
        "__main__.py": "from alibi.cli import main\n",                 # allowed: the entry point
        "plain.py": "import alibi.cli.conform as c\n",
        "from_package.py": "from alibi import cli\n",
        "relative.py": "def f():\n    from .cli import main\n",
        "sub/__init__.py": "",
        "sub/deeper.py": "from ..cli.pow2 import run\n",
        "dynamic.py": "import importlib\nimportlib.import_module('alibi.cli.run')\n",
        "innocent.py": "import alibi.client_side\nfrom alibi import climate\nfrom . import clinic\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    assert cli_imports(pkg) == [
        "alibi.dynamic:2 imports alibi.cli.run",
        "alibi.from_package:1 imports alibi.cli",
        "alibi.plain:1 imports alibi.cli.conform",
        "alibi.relative:2 imports alibi.cli",
        "alibi.sub.deeper:1 imports alibi.cli.pow2",
    ]

"""No two modules of the package import each other, directly or around a longer circle (issue 23).

The scan reads every module's syntax tree (nothing is executed), so an import inside a function
counts like one at the top: hiding a circle behind a function-level import does not make it go
away, it only moves the failure from import time to the first call.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import alibi

PACKAGE = Path(alibi.__file__).parent


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def resolve(known: dict[str, Path], name: str) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(known: dict[str, Path], module: str, path: Path) -> list[tuple[int, str, bool, str]]:
    """(line, imported toolkit module, inside a function?, the source line) for every import in `module`."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    lines = path.read_text().splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
            for t in targets:
                r = resolve(known, t) if t.split(".")[0] == "alibi" else None
                if r and r != module:
                    found.append((child.lineno, r, in_function, lines[child.lineno - 1]))
            visit(child, nested)

    visit(tree, False)
    return found


def import_circles() -> list[list[str]]:
    known = modules()
    edges = {m: {t for _, t, _, _ in imports(known, m, p)} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def strongconnect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return circles


def test_no_two_modules_import_each_other_directly_or_around_a_circle():
    assert import_circles() == []


def test_the_check_finds_a_planted_circle_even_behind_a_function_level_import(tmp_path, monkeypatch):
    copy = tmp_path / "alibi"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "csrc", "templates"))
    (copy / "exact/quant.py").write_text((copy / "exact/quant.py").read_text() + "\n\ndef _f():\n    from alibi.exact import numerics\n")
    (copy / "exact/numerics.py").write_text((copy / "exact/numerics.py").read_text() + "\nfrom alibi.exact import quant\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    assert import_circles() == [["alibi.exact.numerics", "alibi.exact.quant"]]

"""The package is layered: a module imports only modules of its own layer and of the layers below it, no two
modules import each other (directly or around a circle), and an import inside a function is there only to keep
a heavy library out of start-up (issue 23).

`LAYERS` lists the folders of `alibi/` (and its few top-level modules) from the bottom up; docs/architecture.md
draws them. The CLI is the top layer but one, so "the library never imports the CLI" is one case of the rule.

The scan reads every module's syntax tree and executes nothing, so an import inside a function counts like one
at the top (hiding an upward import or a circle behind a function-level import does not make it go away: it
moves the failure from import time to the first call), relative imports are resolved, and
`importlib.import_module("alibi.…")` / `__import__("alibi.…")` with a literal name are seen. An import under
`if TYPE_CHECKING:` is exempt from the layering, and only from it: it never runs, so it adds no dependency; it
lets an annotation name a type of a higher layer (`exact/emulator.py` annotates with `tiles.tile.Tile`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import alibi

PACKAGE = Path(alibi.__file__).resolve().parent

# Bottom first. A folder is named by its name, a top-level module by its file name.
LAYERS = (
    "__init__.py",     # the version string
    "errors.py",       # the error types and their exit codes
    "io",              # atomic writes, bounded readers, typed JSON, digests, limits, progress
    "governance",      # manifests, the identity contract, pre-registration, provenance
    "exact",           # numerics, quantization conventions, the emulator and its epilogue models
    "tiles",           # Tile and its files, synthetic and probe tiles
    "kernels",         # the kernel interface, the registry and every implementation
    "model",           # checkpoints, the deterministic runner, capture, the module trace
    "tokens",          # replay and the flip statistics
    "engine",          # capture and kernel arms inside vLLM
    "conform",         # the conformance pipeline, checks, results, reports
    "controls",        # the mutant detection matrix, boundary facts, identify
    "sweep",           # depth and rows sweeps and their fits
    "html",            # the HTML report
    "experiment.py",   # pre-registered experiment runs
    "testing.py",      # assert_interchangeable, for kernel authors' test suites
    "cli",             # the `alibi` command
    "__main__.py",     # `python -m alibi`
)

# Libraries whose import costs start-up time, and what importing each also loads (measured with
# `python -c "import torch, sys; print('numpy' in sys.modules)"`): an import inside a function must keep one of
# these out of the importing module's start-up, or it belongs at the top.
HEAVY = frozenset({"torch", "triton", "transformers", "tokenizers", "vllm", "ray", "torchao", "bitsandbytes",
                   "fbgemm_gpu", "sgl_kernel", "scipy", "sklearn", "matplotlib", "jinja2", "markupsafe", "numpy",
                   "pandas", "tqdm"})
ALSO_LOADS = {"torch": {"numpy", "tqdm"}, "matplotlib": {"numpy"}, "scipy": {"numpy"}, "sklearn": {"numpy", "scipy"},
              "pandas": {"numpy"}, "transformers": {"numpy"}, "jinja2": {"markupsafe"}}


@dataclass(frozen=True)
class Import:
    module: str          # the importing module, e.g. alibi.exact.emulator
    line: int
    target: str          # what it imports: a toolkit module, or the top-level name of another package
    toolkit: bool        # target is a module of the package
    in_function: bool
    type_checking: bool  # under `if TYPE_CHECKING:`


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path) -> dict[str, Path]:
    return {module_name(package, p): p for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts}


def _owner(known: dict[str, Path], name: str) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(package: Path) -> list[Import]:
    """Every import statement of every module, resolved to a toolkit module or another package's top-level name."""
    known = modules(package)
    root = package.name
    found: list[Import] = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
            for child in ast.iter_child_nodes(node):
                nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                guarded = type_checking or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        pkg = module if is_package else module.rpartition(".")[0]
                        for _ in range(child.level - 1):
                            pkg = pkg.rpartition(".")[0]
                        base = f"{pkg}.{base}" if base else pkg
                    # `from alibi.x import y` imports the module alibi.x.y when there is one, else names of alibi.x
                    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
                elif (isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant)
                      and isinstance(child.args[0].value, str)
                      and getattr(child.func, "attr", getattr(child.func, "id", None)) in ("import_module", "__import__")):
                    names = [child.args[0].value]
                for name in names:
                    if name.split(".")[0] == root:
                        owner = _owner(known, name)
                        if owner and owner != module:
                            found.append(Import(module, child.lineno, owner, True, in_function, type_checking))
                    elif name:
                        found.append(Import(module, child.lineno, name.split(".")[0], False, in_function,
                                            type_checking))
                visit(child, nested, guarded)

        visit(ast.parse(path.read_bytes(), filename=str(path)), False, False)
    return found


def layer(package: Path, module: str) -> str:
    """The entry of LAYERS a module belongs to: its folder under the package, or its own file name."""
    return modules(package)[module].relative_to(package).parts[0]


def unplaced(package: Path, layers: tuple[str, ...]) -> list[str]:
    """Folders and top-level modules of the package that LAYERS does not place."""
    entries = {p.name for p in package.glob("*.py")} | {p.parent.name for p in package.glob("*/__init__.py")}
    return sorted(entries - set(layers))


def upward_imports(package: Path, layers: tuple[str, ...]) -> list[str]:
    """`"<module>:<line> imports <module> (<layer> → higher layer <layer>)"` for every import that runs upward."""
    rank = {name: i for i, name in enumerate(layers)}
    found = []
    for imp in imports(package):
        if not imp.toolkit or imp.type_checking:
            continue
        low, high = layer(package, imp.module), layer(package, imp.target)
        if low in rank and high in rank and rank[high] > rank[low]:
            found.append(f"{imp.module}:{imp.line} imports {imp.target} ({low} → higher layer {high})")
    return sorted(found)


def import_circles(package: Path) -> list[list[str]]:
    """Every set of modules that import each other around a circle (Tarjan's strongly connected components);
    every import counts, inside functions and under TYPE_CHECKING too."""
    edges: dict[str, set[str]] = {m: set() for m in modules(package)}
    for imp in imports(package):
        if imp.toolkit:
            edges[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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
    return sorted(circles)


def _loads(package: Path) -> dict[str, set[str]]:
    """For each module: the heavy libraries importing it loads, through its top-level imports (not those under
    TYPE_CHECKING), the top-level imports of the toolkit modules it imports, and its parent packages."""
    known = modules(package)
    top: dict[str, list[Import]] = {m: [] for m in known}
    for imp in imports(package):
        if not imp.in_function and not imp.type_checking:
            top[imp.module].append(imp)
    memo: dict[str, set[str]] = {}

    def loads(m: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if m in memo:
            return memo[m]
        if m in seen:
            return set()
        out: set[str] = set()
        parts = m.split(".")
        for parent in (".".join(parts[:i]) for i in range(1, len(parts))):
            out |= loads(parent, seen | {m})
        for imp in top[m]:
            out |= loads(imp.target, seen | {m}) if imp.toolkit else ({imp.target} & HEAVY)
        out |= {also for lib in list(out) for also in ALSO_LOADS.get(lib, ())}
        memo[m] = out
        return out

    return {m: loads(m) for m in known}


def idle_function_imports(package: Path) -> list[str]:
    """Imports inside functions that keep nothing heavy out of their module's start-up: what they import loads no
    library of HEAVY that the module's own top-level imports do not load already. They belong at the top."""
    loads = _loads(package)
    found = []
    for imp in imports(package):
        if not imp.in_function or imp.type_checking:
            continue
        brings = loads[imp.target] if imp.toolkit else ({imp.target} | ALSO_LOADS.get(imp.target, set())) & HEAVY
        if not brings - loads[imp.module]:
            found.append(f"{imp.module}:{imp.line} imports {imp.target}")
    return sorted(found)


def uncommented_function_imports(package: Path) -> list[str]:
    """Imports inside functions with no comment saying why: none on the statement's lines, and none on the line
    above the run of adjacent import statements it belongs to."""
    found = []
    for module, path in modules(package).items():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                for body in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
                    if not isinstance(body, list):
                        continue
                    run: list[ast.stmt] = []
                    for stmt in [*body, None]:
                        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and (
                                not run or run[-1].end_lineno + 1 == stmt.lineno):
                            run.append(stmt)
                            continue
                        if run and not (run[0].lineno >= 2 and lines[run[0].lineno - 2].lstrip().startswith("#")):
                            found += [f"{module}:{i.lineno}" for i in run
                                      if not any("#" in line for line in lines[i.lineno - 1:i.end_lineno])]
                        run = [stmt] if isinstance(stmt, (ast.Import, ast.ImportFrom)) else []
    return sorted(set(found))


# --- the package as it is ----------------------------------------------------------------------------------

def test_every_folder_and_top_level_module_of_the_package_has_a_layer():
    assert unplaced(PACKAGE, LAYERS) == [], "add each to LAYERS (and to docs/architecture.md) where it belongs"


def test_no_module_imports_a_layer_above_its_own():
    offenders = upward_imports(PACKAGE, LAYERS)
    assert offenders == [], "move the code so that it imports only its own layer and those below (see " \
        "docs/architecture.md):\n" + "\n".join(offenders)


def test_no_two_modules_import_each_other_directly_or_around_a_circle():
    assert import_circles(PACKAGE) == []


def test_every_import_inside_a_function_keeps_a_heavy_library_out_of_start_up():
    idle = idle_function_imports(PACKAGE)
    assert idle == [], "these imports defer nothing heavy; move them to the top of their module:\n" + "\n".join(idle)


def test_every_import_inside_a_function_says_why_it_is_there():
    assert uncommented_function_imports(PACKAGE) == []


def test_the_architecture_page_and_the_readme_layout_list_the_layers_in_order():
    """docs/architecture.md draws the layers top down and the README's layout lists them: each names every layer
    (but the package's own __init__.py and __main__.py), in the order of LAYERS, bottom up or top down."""
    repo = PACKAGE.parent
    names = [n for n in LAYERS if n not in ("__init__.py", "__main__.py")]
    for page in (repo / "docs" / "architecture.md", repo / "README.md"):
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)
        where = [[m.start() if (m := re.search(rf"(?<![\w/.]){re.escape(n if n.endswith('.py') else n + '/')}", b))
                  else -1 for n in names] for b in blocks]
        found = [w for w in where if -1 not in w]
        assert found, f"{page.name}: no code block names every layer ({', '.join(names)})"
        order = [n for _, n in sorted(zip(found[0], names))]
        assert order in (names, names[::-1]), f"{page.name} lists the layers out of order: {order}"


# --- the checks themselves can fail ------------------------------------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "alibi"
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


TOY_LAYERS = ("__init__.py", "low", "mid", "top.py")


def test_the_layering_check_names_each_form_of_upward_import_and_spares_the_rest(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "top.py": "from alibi.low import plain\nfrom alibi.mid import b\n",        # downward: fine
        "low/__init__.py": "",
        "low/plain.py": "from alibi.mid import b\n",
        "low/in_function.py": "def f():\n    from alibi.mid.b import x\n",
        "low/relative.py": "from ..mid import b\n",
        "low/package_attribute.py": "from alibi import top\n",
        "low/dynamic.py": "import importlib\n\ndef f():\n    importlib.import_module('alibi.top')\n",
        "low/dotted.py": "import alibi.mid.b as b\n",
        "low/annotation.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from alibi.mid.b import B\n",
        "low/sideways.py": "from alibi.low import plain\nfrom alibi import __version__\n",  # own layer, and below
        "mid/__init__.py": "",
        "mid/b.py": "from alibi.low import plain\nx = 1\n",
    })
    assert upward_imports(pkg, TOY_LAYERS) == [
        "alibi.low.dotted:1 imports alibi.mid.b (low → higher layer mid)",
        "alibi.low.dynamic:4 imports alibi.top (low → higher layer top.py)",
        "alibi.low.in_function:2 imports alibi.mid.b (low → higher layer mid)",
        "alibi.low.package_attribute:1 imports alibi.top (low → higher layer top.py)",
        "alibi.low.plain:1 imports alibi.mid.b (low → higher layer mid)",
        "alibi.low.relative:1 imports alibi.mid.b (low → higher layer mid)",
    ]


def test_a_folder_missing_from_the_layers_is_named(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "top.py": "", "low/__init__.py": "", "mid/__init__.py": "",
                              "stray/__init__.py": "", "loose.py": ""})
    assert unplaced(pkg, TOY_LAYERS) == ["loose.py", "stray"]


def test_the_circle_check_finds_a_planted_circle_even_behind_a_function_level_import(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from alibi.low import b\n",
        "low/b.py": "from alibi.low.c import x\n",
        "low/c.py": "from alibi.low import a\nx = 1\n",
        "low/d.py": "from alibi.low import a\n",                       # imports into the circle, is not on it
    })
    assert import_circles(pkg) == [["alibi.low.a", "alibi.low.b", "alibi.low.c"]]


def test_the_start_up_check_keeps_deferred_heavy_imports_and_names_idle_ones(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "light.py": "import json\n",
        "heavy.py": "import torch\n",
        "uses_numpy.py": "import numpy as np\n",
        "cli.py": ("def a():\n    import torch  # deferred\n\n"                # keeps torch out: fine
                   "def b():\n    from alibi import heavy  # deferred\n\n"     # loads torch: fine
                   "def c():\n    from alibi import light\n\n"                # loads nothing heavy: idle
                   "def d():\n    import json\n"),                              # the standard library: idle
        "lib.py": ("import torch\n\n"
                   "def e():\n    from alibi import uses_numpy\n\n"           # torch loads numpy already: idle
                   "def f():\n    import matplotlib\n"),                       # not loaded by torch: fine
    })
    assert idle_function_imports(pkg) == ["alibi.cli:11 imports json", "alibi.cli:8 imports alibi.light",
                                          "alibi.lib:4 imports alibi.uses_numpy"]
    assert uncommented_function_imports(pkg) == ["alibi.cli:11", "alibi.cli:8", "alibi.lib:4", "alibi.lib:7"]

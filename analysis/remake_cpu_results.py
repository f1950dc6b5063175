"""Re-make the CPU results that no manifest tied to a commit, from a clean worktree of a commit (issue 26).

Some CPU results under analysis/results/cpu were made in a working tree that held uncommitted changes
(of other sessions), or written with no manifest at all, so the code that made them was unknown. This
script makes them again from committed code only and gives each a manifest that names the commit:

1. `git worktree add --detach TMP COMMIT` (default HEAD): a checkout with nothing uncommitted in it;
2. this same script, from that worktree (`--in-worktree`, `PYTHONPATH=TMP`), refuses to go on unless
   the running toolkit's sources are exactly the commit's (`alibi.governance.environment.working_tree`);
3. each result's documented command(s) run there, one after another, with their output written into
   `OUT/<result>/` (outside the worktree, so the tree stays clean while it runs);
4. each folder gets `manifest.json` (kind `results`; `alibi matrix` and `alibi mutants` write their own),
   whose `toolkit` names the commit, the source digest and `git_dirty: false`, and whose
   `parameters.commands` lists the commands verbatim with their exit codes and wall times.

Then copy `OUT/<result>/` over `analysis/results/cpu/<result>/` and commit. A README.md a result folder
holds is prose written by hand: it is copied from the commit's own tree, so the manifest pins it too.

    python analysis/remake_cpu_results.py --out /tmp/remade [--commit HEAD] [RESULT ...]

RESULT: any of the names in RESULTS (default: all). Wall time on the 2-core AMD EPYC: about 10 minutes
without pow2-cost, most of it ecosystem-matrix (the Triton interpreter) and mutants/emulator-w_then_a.
pow2-cost (a real SmolLM2-135M: 6 pow2 rewrites, 8 perplexities, 7 captures and conforms) took 264 s when it
was first made, with the libraries' own kernels; with the deterministic runner, the default since, its first
perplexity alone took over 7 minutes here, so the committed pow2-cost is instead pinned from the clean-tree
toolkit record its own JSON carries (analysis/pin_results.py, RECORDED_IN_RESULT).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KIND = "results"
MADE_BY = "analysis/remake_cpu_results.py"

# The tiles `alibi identify bnb-int8` ran on (analysis/results/cpu/bnb-identify/README.md).
BNB_TILES = """
import sys, torch; from pathlib import Path
from alibi.kernels.bnb import with_exact_statistics
from alibi.tiles.out_bias_probe import out_bias_probe_tiles
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile
root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
tiles = [with_exact_statistics(t) for t in synthetic_tiles("epilogue-probe-bias")]
tiles += [with_exact_statistics(t) for dt in (torch.bfloat16, torch.float16) for t in out_bias_probe_tiles(dt, seed=0)]
for t in tiles: save_tile(t, root / f"{t.name}.safetensors")
"""
# The tiles of the ecosystem matrix (analysis/results/cpu/ecosystem-matrix.README.md).
MATRIX_TILES = """
import sys, torch; from pathlib import Path
from alibi.kernels.bnb import with_exact_statistics
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile
root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
tiles = [with_exact_statistics(t) for t in synthetic_tiles("smollm2-135m-bias", seed=0, M=16)]
tiles = [t.replace(name=f"bf16-{t.name}") for t in tiles] + [
    t.replace(name=f"fp16-{t.name}", out_dtype=torch.float16, bias=t.bias.to(torch.float16)) for t in tiles]
tiles.append(with_exact_statistics(synthetic_tiles("epilogue-probe-bias")[0].rows(slice(0, 16))).replace(name="probe-rows0-15"))
for t in tiles: save_tile(t, root / f"{t.name}.safetensors")
"""
MATRIX_KERNELS = "torch-cpu,triton,torchao-int8,bnb-int8,emulator:w_then_a,emulator:a_then_w+add_after_cast"
TORCHAO_PRESETS = ("epilogue-probe-bias", "epilogue-probe", "smollm2-135m-bias")

# result -> (what it is, whether the command writes the folder's manifest itself)
RESULTS = {
    "boundary": ("alibi boundary on torch-cpu and triton (docs/positive-controls.md)", False),
    "exact-accumulator": ("the exact accumulator against a plain fp64 GEMM (analysis/bench_exact_accumulator.py)", False),
    "pow2-cost": ("what a pow2 checkpoint costs on SmolLM2-135M (analysis/pow2_cost.py, docs/models.md)", False),
    "torchao-identify": ("alibi identify torchao-int8 on three presets (docs/other-kernels.md)", False),
    "bnb-identify": ("alibi identify bnb-int8 on exact-statistics tiles (docs/other-kernels.md)", False),
    "ecosystem-matrix": ("alibi matrix over six CPU kernels (analysis/results/cpu/ecosystem-matrix.README.md)", True),
    "mutants/emulator-w_then_a": ("alibi mutants on emulator:w_then_a, the exposing set (docs/positive-controls.md)",
                                  True),
}


class Steps:
    """Runs commands in the worktree one after another and records each (argv as typed, exit code, wall time)."""

    def __init__(self, tree: Path, scratch: Path) -> None:
        self.tree, self.scratch, self.commands = tree, scratch, []

    def run(self, argv: list[str], *, stdout: Path | None = None, ok: tuple[int, ...] = (0,),
            env: dict[str, str] | None = None, shown: str | None = None) -> None:
        """Run `argv` (a `python ...` command: this interpreter) with cwd the worktree; `stdout` (a file) gets
        its standard output; `shown` is how the command is recorded (default: argv with OUT and the scratch
        folder written as such)."""
        full = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
        text = shown or shlex.join(argv)
        print(f"$ {text}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with open(stdout, "w") if stdout is not None else open(os.devnull, "w") as sink:
            proc = subprocess.run(full, cwd=self.tree, stdout=sink, stderr=subprocess.PIPE, text=True, check=False,
                                  env={**os.environ, "PYTHONPATH": str(self.tree), **(env or {})})
        seconds = round(time.perf_counter() - start, 2)
        if proc.returncode not in ok:
            sys.exit(f"remake: command failed ({proc.returncode}): {text}\n{proc.stderr[-4000:]}")
        record = {"command": text, "exit_code": proc.returncode, "wall_s": seconds}
        if env:
            record["env"] = dict(sorted(env.items()))
        if stdout is not None:
            record["stdout"] = stdout.name
        self.commands.append(record)


def remake(name: str, out: Path, steps: Steps) -> None:
    """Run `name`'s command(s), writing into `out` (a fresh folder)."""
    scratch = steps.scratch / name.replace("/", "-")
    if name == "boundary":
        steps.run(["python", "-m", "alibi", "boundary", "--kernel", "torch-cpu", "--kernel", "triton", "--quiet",
                   "--out", str(out / "boundary.json")], stdout=out / "boundary.txt", ok=(0, 1),
                  shown="alibi boundary --kernel torch-cpu --kernel triton --quiet --out boundary.json > boundary.txt")
    elif name == "exact-accumulator":
        steps.run(["python", "analysis/bench_exact_accumulator.py", "--out", str(out / "exact_accumulator.json")],
                  stdout=out / "bench.txt",
                  shown="python analysis/bench_exact_accumulator.py --out exact_accumulator.json > bench.txt")
    elif name == "pow2-cost":
        steps.run(["python", "analysis/pow2_cost.py", "--prompts", "experiments/prompts/wikipedia-8x512",
                   "--work", str(scratch), "--out", str(out / "pow2_cost")], stdout=out / "pow2_cost.log",
                  shown="python analysis/pow2_cost.py --prompts experiments/prompts/wikipedia-8x512 --work WORK "
                        "--out pow2_cost > pow2_cost.log")
    elif name == "torchao-identify":
        env = {"TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
        for preset in TORCHAO_PRESETS:
            for fmt, suffix in (("--json", "json"), (None, "txt")):
                argv = ["python", "-m", "alibi", "identify", "torchao-int8", "--synthetic", preset, *([fmt] if fmt else [])]
                steps.run(argv, stdout=out / f"{preset}.{suffix}", env=env,
                          shown=shlex.join(["alibi", *argv[3:]]) + f" > {preset}.{suffix}")
    elif name == "bnb-identify":
        tiles = scratch / "tiles"
        steps.run(["python", "-c", BNB_TILES, str(tiles)], shown="python -c BNB_TILES TILES  # the snippet in README.md")
        for fmt, file in (("--json", "identify.json"), (None, "identify.txt")):
            argv = ["python", "-m", "alibi", "identify", "bnb-int8", "--tiles", str(tiles), *([fmt] if fmt else [])]
            steps.run(argv, stdout=out / file, shown=f"alibi identify bnb-int8 --tiles TILES{' --json' if fmt else ''} > {file}")
    elif name == "ecosystem-matrix":
        tiles = scratch / "tiles"
        steps.run(["python", "-c", MATRIX_TILES, str(tiles)], shown="python -c MATRIX_TILES TILES  # ecosystem-matrix.README.md")
        steps.run(["python", "-m", "alibi", "matrix", "--kernels", MATRIX_KERNELS, "--tiles", str(tiles), "--quiet",
                   "--out", str(out)], env={"SOURCE_DATE_EPOCH": "1764633600", "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"},
                  shown=f"alibi matrix --kernels {MATRIX_KERNELS} --tiles TILES --quiet --out ecosystem-matrix")
    elif name == "mutants/emulator-w_then_a":
        steps.run(["python", "-m", "alibi", "mutants", "--base", "emulator:w_then_a", "--quiet", "--out", str(out)],
                  stdout=out.parent / "emulator-w_then_a.txt",
                  shown="alibi mutants --base emulator:w_then_a --quiet --out emulator-w_then_a > emulator-w_then_a.txt")
    else:  # pragma: no cover - names are checked in main
        raise AssertionError(name)


def in_worktree(out: Path, names: list[str]) -> int:
    """Step 2-4, run by the worktree's copy of this script with the worktree's toolkit."""
    sys.path.insert(0, str(REPO))
    import alibi
    from alibi.governance.environment import toolkit, working_tree
    from alibi.governance.manifest import build_predicate, write_manifest

    if Path(alibi.__file__).resolve().parent.parent != REPO:
        sys.exit(f"remake: the toolkit imported is {alibi.__file__}, not this worktree's ({REPO})")
    tree, tk = working_tree(), toolkit()
    if tree.clean is not True or tk.git_dirty is not False or tk.git_commit is None:
        sys.exit(f"remake: {REPO} is not a clean checkout of a commit (working tree {tree.as_dict()}, "
                 f"git_dirty {tk.git_dirty}); run from a fresh `git worktree`")
    with tempfile.TemporaryDirectory(prefix="alibi-remake-") as scratch:
        for name in names:
            folder = out / name
            if folder.exists():
                sys.exit(f"remake: {folder} exists; pass a fresh --out")
            folder.parent.mkdir(parents=True, exist_ok=True)
            writes_own_manifest = RESULTS[name][1]
            if not writes_own_manifest:
                folder.mkdir()
            steps = Steps(REPO, Path(scratch))
            start = time.perf_counter()
            remake(name, folder, steps)
            readme = REPO / "analysis" / "results" / "cpu" / name / "README.md"
            if readme.is_file():
                shutil.copy(readme, folder / "README.md")
            if not writes_own_manifest:
                predicate = build_predicate(parameters={
                    "result": f"analysis/results/cpu/{name}", "what": RESULTS[name][0], "made_by": MADE_BY,
                    "commands": steps.commands, "wall_s": round(time.perf_counter() - start, 1)})
                write_manifest(folder, KIND, predicate)
            print(f"remade {name} at {tk.git_commit[:12]} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="*", help=f"which results (default all): {', '.join(RESULTS)}")
    ap.add_argument("--out", type=Path, required=True, help="a fresh folder to write OUT/<result>/ into")
    ap.add_argument("--commit", default="HEAD", help="the commit to make them from (default HEAD)")
    ap.add_argument("--in-worktree", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = args.results or list(RESULTS)
    unknown = [n for n in names if n not in RESULTS]
    if unknown:
        ap.error(f"unknown result {unknown[0]!r}; choose from {', '.join(RESULTS)}")
    out = args.out.resolve()
    if args.in_worktree:
        return in_worktree(out, names)
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {args.out}: exists and is not empty; pass a fresh folder")
    if out.is_relative_to(REPO):
        ap.error(f"--out {args.out}: inside the repository; write outside it and copy the folders in")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{args.commit}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="alibi-remake-tree-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
        try:
            done = subprocess.run([sys.executable, str(tree / "analysis" / "remake_cpu_results.py"), "--in-worktree",
                                   "--out", str(out), *names], cwd=tree, check=False,
                                  env={**os.environ, "PYTHONPATH": str(tree)})
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)
    if done.returncode == 0:
        print(f"made at {commit}: " + ", ".join(str(out / n) for n in names))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

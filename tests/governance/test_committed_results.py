"""Every manifest committed under analysis/results verifies file by file, and every result file is tied
to a commit or registered as not (issue 26).

A folder whose large files are kept in an archive beside it (so the working tree stays small) is
verified after the archive is extracted into a copy; the archive must lie outside the folder it
restores, or the folder could never verify (its manifest cannot cover the archive). A folder whose
files are pinned but deliberately not committed (NOT_COMMITTED) must miss exactly those files.

The walk: every file under analysis/results is either covered by a manifest that ties it to a commit
(the manifest's `toolkit.source_digest` is the digest of some commit's `alibi/` sources: the commit it
names, or — for a result made on a copy without git history, `git_commit: null` — the commits
`alibi manifest provenance` finds), or listed, with its sha256, why its commit is unknown and what
would make it again, in the register analysis/results/UNPINNED.yaml. A new result that is neither
fails here, and so does a registered file that changed or that a manifest now pins (a stale entry)."""

from __future__ import annotations

import fnmatch
import functools
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

import pytest
from hostile import REPO

from alibi.governance.manifest import read_manifest, verify_files
from alibi.io.digests import sha256_file

RESULTS = REPO / "analysis" / "results"
# folder (relative to RESULTS) -> (archive, the folder inside it that holds the folder's missing files,
# relative to the archive's own top; "" when the archive's members are the folder's own paths)
ARCHIVES = {
    "h200/tokens/tf-real": ("h200/tokens/teacher-forced-arms.tar.xz", "tf-real"),
    "h200/tokens/tf-pow2": ("h200/tokens/teacher-forced-arms.tar.xz", "tf-pow2"),
    "h200/fma-e2e/tokens/tf-real": ("h200/fma-e2e/tokens/tf-real-arms.tar.xz", ""),
    "h200/determinism/b5db8e0/tokens/tf-real": ("h200/determinism/b5db8e0/tokens/teacher-forced-arms.tar.xz", "tf-real"),
    "h200/determinism/b5db8e0/tokens/tf-pow2": ("h200/determinism/b5db8e0/tokens/teacher-forced-arms.tar.xz", "tf-pow2"),
    "h200/ecosystem/a2e1235/flips-torchao-int8-vs-vllm-cutlass": ("h200/ecosystem/a2e1235/flips-arms.tar.xz", ""),
}
# folder -> (the pattern of the files its manifest pins by sha256 but the repository leaves out, why)
NOT_COMMITTED = {
    "cpu/vllm-engine/capture": ("*.safetensors", "the 120 tiles hold the whole int8 model (135 MB)"),
}
MANIFEST_FOLDERS = sorted(p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("manifest.json"))


def test_the_walk_finds_the_committed_manifests():
    assert len(MANIFEST_FOLDERS) >= 40 and set(ARCHIVES) <= set(MANIFEST_FOLDERS)


@pytest.mark.parametrize("folder", MANIFEST_FOLDERS)
def test_every_committed_result_manifest_verifies(folder, tmp_path):
    path = RESULTS / folder
    if folder in ARCHIVES:
        archive, inside = ARCHIVES[folder]
        assert not (RESULTS / archive).resolve().is_relative_to(path.resolve()), \
            f"{archive} lies inside {folder}, the folder it restores"
        copy = tmp_path / "copy"
        shutil.copytree(path, copy)
        with tarfile.open(RESULTS / archive) as tar:
            members = [m for m in tar.getmembers() if not inside or m.name.startswith(inside + "/")]
            for m in members:
                m.name = m.name[len(inside) + 1:] if inside else m.name
            tar.extractall(copy, members=members, filter="data")
        path = copy
    problems = verify_files(path)
    if folder in NOT_COMMITTED:
        pattern, _why = NOT_COMMITTED[folder]
        left_out = [s.name for s in read_manifest(path).subjects if fnmatch.fnmatch(s.name, pattern)]
        assert left_out, f"{folder}: its manifest pins no {pattern} file, so nothing is left out"
        expected = {f"file {n}: listed in {read_manifest(path).path} but missing" for n in left_out}
        # every left-out file is absent (none half-committed) and every other file verifies
        assert set(problems) == expected and len(problems) == len(expected)
    else:
        assert problems == []


def test_a_folder_holding_a_file_its_manifest_does_not_cover_fails(tmp_path):
    """The check fires: the state the fma-e2e tf-real folder was in, with its archive inside it."""
    folder = "h200/fma-e2e/tokens/tf-real"
    copy = tmp_path / "copy"
    shutil.copytree(RESULTS / folder, copy)
    archive, _ = ARCHIVES[folder]
    with tarfile.open(RESULTS / archive) as tar:
        tar.extractall(copy, filter="data")
    shutil.copy(RESULTS / archive, copy / "teacher-forced-arms.tar.xz")
    problems = verify_files(copy)
    assert len(problems) == 1 and "teacher-forced-arms.tar.xz" in problems[0]


@pytest.mark.parametrize("folder", MANIFEST_FOLDERS)
def test_every_committed_result_manifest_records_a_source_digest(folder):

    toolkit = read_manifest(RESULTS / folder).predicate.get("toolkit") or {}
    assert isinstance(toolkit.get("source_digest"), dict) and len(toolkit["source_digest"].get("sha256", "")) == 64


SOURCE_COMMIT_FOLDERS = sorted({p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("SOURCE_COMMIT*")})


@pytest.mark.parametrize("folder", SOURCE_COMMIT_FOLDERS)
def test_a_result_that_names_its_commit_in_a_text_file_has_a_manifest_pinning_that_commits_sources(folder):
    """Issue 26: these folders named their commit in SOURCE_COMMIT only (analysis/pin_results.py)."""
    from alibi.governance.provenance import commit_source_digest

    path = RESULTS / folder
    assert (path / "manifest.json").is_file(), f"{folder}: no manifest; run analysis/pin_results.py"
    commit = {p.read_text().split()[0] for p in path.glob("SOURCE_COMMIT*")}.pop()
    toolkit = read_manifest(path).predicate["toolkit"]
    assert toolkit["git_commit"] == commit
    if not (REPO / ".git").exists():
        pytest.skip("no git history here to compute the commit's source digest")
    assert toolkit["source_digest"]["sha256"] == commit_source_digest(REPO, commit)


@pytest.mark.parametrize("folder, judged", [("h200/tokens", "h200/tokens/criteria.json"),
                                            ("h200/determinism/greedy", "h200/determinism/criteria.json")])
def test_a_pre_registered_result_pins_the_lock_and_amendments_it_was_measured_under(folder, judged):
    """Issue 26: the manifests of a pre-registered run did not record the lock hash; each such folder's
    manifest carries the protocol record of the commit it names, which equals the record the locked
    criteria were judged against (lock and amendment head)."""
    import json


    protocol = read_manifest(RESULTS / folder).predicate["protocol"]
    record = json.loads((RESULTS / judged).read_text())["protocol"]
    assert {k: protocol[k] for k in ("folder", "lock_sha256", "head_sha256", "amendments")} == \
        {k: record[k] for k in ("folder", "lock_sha256", "head_sha256", "amendments")}


def test_the_pre_registered_token_study_pins_the_lock_it_was_measured_under():
    """Issue 26: its manifests did not record the lock hash; the folder's manifest now carries the protocol
    record of the commit it names, which equals the lock hash the locked criteria were judged against."""
    import json


    folder = RESULTS / "h200" / "tokens"
    protocol = read_manifest(folder).predicate["protocol"]
    judged = json.loads((folder / "criteria.json").read_text())
    assert protocol["folder"] == "prereg/smollm2-token-transfer"
    assert protocol["lock_sha256"] == judged["protocol"]["lock_sha256"]
    assert protocol["as_of_commit"] == (folder / "SOURCE_COMMIT").read_text().split()[0]


# --- every result file tied to a commit, or registered as not ----------------------------------------

REGISTER = RESULTS / "UNPINNED.yaml"


def is_manifest(name: str) -> bool:
    return name == "manifest.json" or name.endswith(".manifest.json")


def result_files(root: Path, register: Path) -> list[str]:
    """Every file under `root` (relative, POSIX) but manifests, the register and hidden or cache entries."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p != register and not is_manifest(p.name)
                  and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))


def pinning_commit(toolkit: Mapping, history: Mapping[str, list[str]]) -> str | None:
    """The commit a manifest's `toolkit` record ties its files to: the commit it names when that commit's
    sources have the recorded digest, else the oldest commit whose sources have it (a result made on a
    copy without history names none; one made in a tree with uncommitted changes outside `alibi/` names
    a commit whose sources are the same); None when no commit has the digest — the code is unknown."""
    digest = ((toolkit or {}).get("source_digest") or {}).get("sha256")
    commits = history.get(digest, []) if isinstance(digest, str) else []
    named = (toolkit or {}).get("git_commit")
    return named if named in commits else (commits[0] if commits else None)


def unpinned(root: Path, history: Mapping[str, list[str]], register: Mapping[str, str]) -> dict[str, str]:
    """{file: why} for each result file under `root` that no commit-tying manifest covers and the register
    (file -> sha256) does not list with its present bytes."""
    pinned: set[str] = set()
    for m in (p for p in root.rglob("*") if p.is_file() and is_manifest(p.name)):
        manifest = read_manifest(m)
        if pinning_commit(manifest.predicate.get("toolkit"), history) is not None:
            base = m.parent.relative_to(root)  # a subject counts only with the bytes its manifest pins
            pinned |= {(base / s.name).as_posix() for s in manifest.subjects
                       if (m.parent / s.name).is_file() and sha256_file(m.parent / s.name) == s.sha256}
    problems = {}
    for rel in result_files(root, root / REGISTER.name):
        if rel in pinned:
            continue
        if rel not in register:
            problems[rel] = ("no manifest that ties it to a commit covers it, and analysis/results/UNPINNED.yaml does "
                             "not list it: make it from committed code with a manifest, or register it")
        elif sha256_file(root / rel) != register[rel]:
            problems[rel] = "changed since it was registered in UNPINNED.yaml (its sha256 differs)"
    return problems


@functools.lru_cache(maxsize=1)
def repository_history() -> dict[str, list[str]]:
    """Source digest -> the commits reachable from HEAD whose `alibi/` sources have it, oldest first."""
    from alibi.governance.provenance import commit_source_digest

    if not (REPO / ".git").exists():
        pytest.skip("no git history here to tie results to commits")
    shallow = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"], capture_output=True,
                             text=True, check=False).stdout.strip()
    if shallow == "true":
        pytest.skip("a shallow clone: the commits results name are not all here (fetch the full history)")
    commits = subprocess.run(["git", "-C", str(REPO), "rev-list", "--reverse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.split()
    history: dict[str, list[str]] = {}
    for c in commits:
        history.setdefault(commit_source_digest(REPO, c), []).append(c)
    return history


def read_register(path: Path = REGISTER) -> list[dict]:
    import yaml

    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert doc["schema"] == "alibi.unpinned-results/1"
    return doc["entries"]


def registered_files(entries: list[dict]) -> dict[str, str]:
    files: dict[str, str] = {}
    for entry in entries:
        for name, digest in entry["files"].items():
            assert name not in files, f"{name} is registered twice"
            files[name] = digest
    return files


def test_every_committed_result_is_tied_to_a_commit_or_registered_as_not():
    problems = unpinned(RESULTS, repository_history(), registered_files(read_register()))
    assert problems == {}, "\n".join(f"analysis/results/{k}: {v}" for k, v in sorted(problems.items()))


def test_every_register_entry_says_why_and_what_would_make_it_again_and_is_still_unpinned():
    """No stale entry: each registered file exists, and no commit-tying manifest covers it (a file made
    again with a manifest must leave the register, or the register would hide nothing but still grant)."""
    entries = read_register()
    assert entries, "an empty register: drop it rather than keep an empty gate"
    for entry in entries:
        assert set(entry) == {"why", "remake", "files"}, entry
        assert len(entry["why"].split()) >= 8 and len(entry["remake"].split()) >= 4, entry
        assert entry["files"], entry
    files = registered_files(entries)
    missing = [f for f in files if not (RESULTS / f).is_file()]
    assert missing == [], f"registered but not there (remove them from UNPINNED.yaml): {missing}"
    # with an empty register every registered file must be reported: none is pinned by a manifest
    reported = unpinned(RESULTS, repository_history(), {})
    assert sorted(f for f in files if f not in reported) == [], "pinned now: remove them from UNPINNED.yaml"


def _fake_results(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """A results tree: a/ pinned by a manifest naming commit C whose sources have digest D; b/ by a manifest
    of a copy without history (no commit) whose digest no commit has; c.txt with no manifest."""
    from alibi.governance.manifest import write_manifest

    root = tmp_path / "results"
    d, c = "d" * 64, "c" * 40
    for folder, toolkit in (("a", {"git_commit": c, "source_digest": {"sha256": d}}),
                            ("b", {"git_commit": None, "source_digest": {"sha256": "e" * 64}}),
                            ("a/nested-copy", {"git_commit": None, "source_digest": {"sha256": d}})):
        (root / folder).mkdir(parents=True)
        (root / folder / "result.json").write_text(f'{{"folder": "{folder}"}}\n')
        write_manifest(root / folder, "results", {"toolkit": toolkit})
    (root / "c.txt").write_text("a log beside the folders\n")
    return root, {d: [c]}


def test_the_walk_fires_on_a_result_no_commit_tying_manifest_covers_and_on_a_changed_registered_file(tmp_path):
    root, history = _fake_results(tmp_path)
    assert set(unpinned(root, history, {})) == {"b/result.json", "c.txt"}
    assert pinning_commit({"git_commit": None, "source_digest": {"sha256": "d" * 64}}, history) == "c" * 40
    assert pinning_commit({"git_commit": "f" * 40, "source_digest": {"sha256": "e" * 64}}, history) is None
    register = {"b/result.json": sha256_file(root / "b" / "result.json"), "c.txt": sha256_file(root / "c.txt")}
    assert unpinned(root, history, register) == {}
    (root / "c.txt").write_text("edited\n")
    assert set(unpinned(root, history, register)) == {"c.txt"}
    (root / "new.json").write_text("{}\n")  # a new result with nothing to tie it to a commit
    assert set(unpinned(root, history, register)) == {"c.txt", "new.json"}
    (root / "a" / "result.json").write_text("{}\n")  # bytes its manifest does not pin: not tied to anything
    assert set(unpinned(root, history, register)) == {"a/result.json", "c.txt", "new.json"}


def _pin_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pin_results", REPO / "analysis" / "pin_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED_IN_RESULT = {"cpu/runner-bench": "bench-runner.json", "cpu/pow2-cost": "pow2_cost.json"}


@pytest.mark.parametrize("folder", sorted(RECORDED_IN_RESULT))
def test_a_result_that_names_its_commit_only_inside_its_json_has_a_manifest_pinning_that_commit(folder):
    """cpu/runner-bench's and cpu/pow2-cost's JSON carry the toolkit record their run wrote (a clean tree at
    220a03a, 4c0fb39), and no manifest did: analysis/pin_results.py pins each after the fact, from that
    record only."""
    import json

    from alibi.governance.provenance import commit_source_digest

    assert _pin_results().RECORDED_IN_RESULT == RECORDED_IN_RESULT
    path = RESULTS / folder
    recorded = json.loads((path / RECORDED_IN_RESULT[folder]).read_text())["toolkit"]
    toolkit = read_manifest(path).predicate["toolkit"]
    assert recorded["git_dirty"] is False and toolkit["git_commit"] == recorded["git_commit"]
    assert toolkit["source_digest"] == recorded["source_digest"] and toolkit["pinned_after_the_fact"] is True
    if not (REPO / ".git").exists():
        pytest.skip("no git history here to compute the commit's source digest")
    assert toolkit["source_digest"]["sha256"] == commit_source_digest(REPO, toolkit["git_commit"])


def test_a_json_result_of_a_dirty_tree_cannot_be_pinned_after_the_fact(tmp_path):
    import json

    pin = _pin_results()
    recorded = json.loads((RESULTS / "cpu" / "runner-bench" / "bench-runner.json").read_text())
    recorded["toolkit"]["git_dirty"] = True
    (tmp_path / "r.json").write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match="names no commit of a clean tree"):
        pin.recorded_commit(tmp_path / "r.json")
    recorded["toolkit"]["git_dirty"] = False
    recorded["toolkit"]["source_digest"]["sha256"] = "0" * 64  # a digest the commit's sources do not have
    (tmp_path / "r.json").write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match="do not have the digest"):
        pin.recorded_commit(tmp_path / "r.json")

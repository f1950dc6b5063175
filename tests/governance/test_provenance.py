"""Provenance: a result made from a copy without git history is tied back to the commit whose tree ran."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from alibi.cli import main
from alibi.errors import InputError
from alibi.governance.provenance import commit_source_digest, find_provenance, source_digest


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


def _result(path: Path, digest: str) -> Path:
    path.write_text(json.dumps({"predicate": {"toolkit": {"git_commit": None, "source_digest": {"sha256": digest}}}}))
    return path


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    return root


def test_a_result_is_tied_to_every_commit_whose_tree_has_its_source_digest_and_no_other(repo, tmp_path):
    v1 = {"alibi/__init__.py": "x = 1\n", "alibi/kernels/csrc/k.cu": "// k\n", "alibi/sub-dir/a.py": "a\n",
          "alibi/sub/b.py": "b\n", "README.md": "r\n"}
    first = _commit(repo, v1, "v1")
    docs_only = _commit(repo, {"README.md": "docs changed\n", "alibi/notes.txt": "not source\n"}, "docs")
    _commit(repo, {"alibi/__init__.py": "x = 2\n"}, "v2")
    ran = source_digest({rel[len("alibi/"):]: text.encode() for rel, text in v1.items() if rel.startswith("alibi/")})
    p = find_provenance(_result(tmp_path / "r.json", ran), repo)
    assert p.matches == (first, docs_only) and p.searched == 3


def test_the_object_store_listing_equals_the_working_tree_listing(repo):
    files = {"alibi/a.py": "1\n", "alibi/b/c.h": "2\n", "alibi/b-c.py": "3\n", "alibi/__pycache__/a.py": "4\n"}
    commit = _commit(repo, files, "one")
    from_tree = {p.relative_to(repo / "alibi").as_posix(): p.read_bytes() for p in (repo / "alibi").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    assert commit_source_digest(repo, commit) == source_digest(from_tree)


def test_provenance_exits_1_for_a_result_made_from_uncommitted_code(repo, tmp_path, capsys):
    _commit(repo, {"alibi/a.py": "1\n"}, "one")
    result = _result(tmp_path / "r.json", "0" * 64)
    assert main(["manifest", "provenance", str(result), "--repo", str(repo)]) == 1
    assert "matches none of 1 commits: it ran on uncommitted code" in capsys.readouterr().out


def test_a_json_without_a_toolkit_source_digest_is_refused(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    with pytest.raises(InputError, match="records no toolkit source digest"):
        find_provenance(f, tmp_path)


def test_provenance_outside_a_git_checkout_says_to_give_repo(tmp_path, capsys):
    not_a_checkout = tmp_path / "copy"
    not_a_checkout.mkdir()
    result = _result(tmp_path / "r.json", "0" * 64)
    assert main(["manifest", "provenance", str(result), "--repo", str(not_a_checkout)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "not a git repository" in err and "--repo PATH" in err

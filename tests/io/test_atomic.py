import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from alibi.io import atomic


def test_a_staged_folder_appears_whole_with_normal_permissions(tmp_path):
    out = tmp_path / "artifact"
    with atomic.staged_dir(out) as stage:
        (stage / "a.txt").write_text("x")
        os.chmod(stage / "a.txt", 0o600)
        assert not out.exists()
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((out / "a.txt").stat().st_mode) == 0o666 & ~mask


def test_a_failure_inside_a_staged_folder_leaves_nothing(tmp_path):
    out = tmp_path / "artifact"
    with pytest.raises(RuntimeError), atomic.staged_dir(out) as stage:
        (stage / "a.txt").write_text("x")
        raise RuntimeError("killed")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_atomic_file_gets_the_permissions_of_a_plain_open(tmp_path):
    mask = os.umask(0)
    os.umask(mask)
    p = atomic.write_text(tmp_path / "f.json", "{}")
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask


def test_an_existing_output_is_refused_unless_overwrite_is_allowed(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(atomic.InputError, match="already exists"):
        with atomic.staged_dir(tmp_path / "out", overwrite=False):
            pass


# --- issue 16: paths that broke writes ------------------------------------------------------------

def test_a_file_is_never_written_over_an_existing_folder(tmp_path):
    """Guards: `predict --out DIR` / `eval --out DIR` naming an existing folder raised IsADirectoryError."""
    (tmp_path / "out.json").mkdir()
    (tmp_path / "out.json" / "keep").write_text("x")
    with pytest.raises(atomic.InputError, match="out.json: is a folder; name a file"):
        atomic.write_text(tmp_path / "out.json", "{}")
    assert (tmp_path / "out.json" / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_an_output_under_proc_is_refused_by_probing_even_as_root():
    """Guards: root passes `os.access(W_OK)` on /proc, so the write failed late with a traceback."""
    with pytest.raises(atomic.InputError, match="cannot create anything in /proc"):
        atomic.check_writable_dir("/proc/alibi-report")
    with pytest.raises(atomic.InputError, match="/proc"):
        atomic.write_text("/proc/alibi.json", "{}")


def test_checking_a_folder_leaves_nothing_behind(tmp_path):
    atomic.check_writable_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stage_name(dest: Path, pid: int, suffix: str) -> str:
    return f".{dest.name}.alibi.{atomic._host()}.{pid}.abc123{suffix}"


def test_stages_left_by_killed_processes_are_removed_by_the_next_write(tmp_path):
    """Guards: a killed pow2-rewrite left hidden .partial folders (up to 159 MB) nothing removed."""
    dest = tmp_path / "ckpt"
    dead = tmp_path / _stage_name(dest, _dead_pid(), ".partial")
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"x" * 1000)
    moved_aside = tmp_path / _stage_name(dest, _dead_pid(), ".old")
    moved_aside.mkdir()
    live = tmp_path / _stage_name(dest, os.getppid(), ".partial")  # a running process's stage
    live.mkdir()
    foreign = tmp_path / f".{dest.name}.alibi.another-host.{_dead_pid()}.abc.partial"  # may be alive elsewhere
    foreign.mkdir()
    with atomic.staged_dir(dest) as stage:
        (stage / "f").write_text("new")
    assert not dead.exists() and not moved_aside.exists()
    assert live.exists() and foreign.exists()
    assert (dest / "f").read_text() == "new"


def _earlier_output(dest: Path) -> None:
    """An output alibi wrote at `dest`: its file `f` ("old") and a manifest listing it."""
    from alibi.governance.manifest import build_predicate, write_manifest

    dest.mkdir()
    (dest / "f").write_text("old")
    write_manifest(dest, "tiles", build_predicate())


def test_an_existing_folder_is_swapped_for_the_new_one_in_one_exchange(tmp_path, monkeypatch):
    """Guards: `--overwrite` swapped with two renames, so a kill between them left no folder at all."""
    dest = tmp_path / "ckpt"
    _earlier_output(dest)
    seen = []
    real = atomic.exchange

    def watching(a, b):
        seen.append((Path(a).name, Path(b).name, (Path(b) / "f").read_text()))
        done = real(a, b)
        assert done, "renameat2(RENAME_EXCHANGE) is available on this file system"
        seen.append(("after", (Path(b) / "f").read_text()))
        return done

    monkeypatch.setattr(atomic, "exchange", watching)
    monkeypatch.setattr(atomic.os, "replace", lambda *a: pytest.fail("an existing folder must not be renamed away"))
    with atomic.staged_dir(dest) as stage:
        (stage / "f").write_text("new")
    assert seen[0][1:] == ("ckpt", "old") and seen[1] == ("after", "new")
    assert (dest / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_without_an_atomic_exchange_the_old_folder_is_moved_aside_then_replaced(tmp_path, monkeypatch):
    dest = tmp_path / "ckpt"
    _earlier_output(dest)
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    with atomic.staged_dir(dest) as stage:
        (stage / "f").write_text("new")
    assert (dest / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("out,inp", [("a", "a"), ("a/b", "a"), ("a", "a/b"), ("a/./b/../b", "a/b")])
def test_an_output_overlapping_an_input_is_refused(tmp_path, out, inp):
    with pytest.raises(atomic.InputError, match="overlaps --tiles"):
        atomic.refuse_overlap(tmp_path / out, {"--tiles": tmp_path / inp})


def test_a_symlinked_output_into_an_input_is_an_overlap(tmp_path):
    (tmp_path / "tiles").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "tiles")
    with pytest.raises(atomic.InputError, match="overlaps"):
        atomic.refuse_overlap(tmp_path / "link" / "report", {"--tiles": tmp_path / "tiles"})
    atomic.refuse_overlap(tmp_path / "tiles-report", {"--tiles": tmp_path / "tiles", "--replay": None})

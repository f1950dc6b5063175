import os
import stat

import pytest

from alibi import atomic


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

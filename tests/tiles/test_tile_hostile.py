"""Hostile tile files: every malformed file is one InputError naming it, never a traceback, and no
file can make the loader (or the emulator after it) allocate more than its element budget."""

from __future__ import annotations

import json
import os
import struct
import textwrap

import pytest
import torch
from hostile import GIB, NOBODY, assert_one_line_error, run_alibi, run_python, world_readable_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alibi.errors import InputError
from alibi.io.limits import MAX_ELEMENTS_ENV
from alibi.tiles.tile import Tile, load_tile, save_tile, tile_bytes


def _raw(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _good_tile(M=3, K=4, N=2) -> Tile:
    return Tile("t", torch.ones((M, K), dtype=torch.int8), torch.ones(M), torch.ones((N, K), dtype=torch.int8),
                torch.ones(N))


@pytest.mark.parametrize("header", [[1, 2, 3], "a string", 42, None, True])
def test_a_header_that_is_valid_json_but_not_an_object_is_refused_naming_the_file(tmp_path, header):
    """Guards: `header.get(...)` on a list/str/int header raised AttributeError (traceback)."""
    path = tmp_path / "h.safetensors"
    path.write_bytes(_raw(header))
    with pytest.raises(InputError, match=r"h\.safetensors: not a valid tile: its header is .* not an object"):
        load_tile(path)


@pytest.mark.parametrize("metadata", [["name", "x"], "name=x", {"name": 3}, {"name": ["x"]}, {"n": None}])
def test_a_metadata_entry_that_is_not_a_string_map_is_refused(tmp_path, metadata):
    """Guards: `dict(header["__metadata__"])` of a list raised, and non-string values reached Tile.meta."""
    path = tmp_path / "m.safetensors"
    path.write_bytes(_raw({"__metadata__": metadata}))
    with pytest.raises(InputError, match="__metadata__ is .* not an object of strings"):
        load_tile(path)


def test_deeply_nested_json_in_a_header_is_refused_not_a_recursion_error(tmp_path):
    """Guards: json.loads raised RecursionError on a 100,000-level header (a 200 kB file)."""
    text = b"[" * 100_000 + b"]" * 100_000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(InputError, match="nested too deeply"):
        load_tile(path)


def test_a_header_longer_than_the_file_is_refused_without_reading_the_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(InputError, match=r"claims 1099511627776 bytes but only 2 follow"):
        load_tile(path)


def test_an_unreadable_tile_is_one_line_for_a_user_without_permission():
    """Guards: the header read raised PermissionError (a traceback) for a non-root user.

    Root bypasses file permissions, so the child process imports what it needs, then drops to
    uid/gid 65534 (nobody) with os.setuid before loading the tile and running `alibi predict`.
    """
    folder = world_readable_dir()
    tiles = folder / "tiles"
    tiles.mkdir()
    os.chmod(tiles, 0o755)
    save_tile(_good_tile(), tiles / "t.safetensors")
    os.chmod(tiles / "t.safetensors", 0o000)
    code = textwrap.dedent(f"""
        import os, sys
        import alibi.cli, alibi.model.predictions, alibi.tiles.tile, alibi.errors
        alibi.cli.build_parser()  # imports every command module while the interpreter's files are readable
        os.setgid({NOBODY}); os.setuid({NOBODY})
        try:
            alibi.tiles.tile.load_tile({str(tiles / "t.safetensors")!r})
        except alibi.errors.InputError as exc:
            print("library:", exc)
        sys.exit(alibi.cli.main(["predict", "--tiles", {str(tiles)!r}, "--out", {str(folder / "p.json")!r}]))
    """)
    proc = run_python(code)
    assert "library: " in proc.stdout and "Permission denied" in proc.stdout, proc.stdout + proc.stderr
    assert_one_line_error(proc, "t.safetensors", "cannot read the tile (Permission denied)")
    assert not (folder / "p.json").exists()


def test_a_600_kb_tile_asking_for_a_60000_by_60000_output_is_refused_under_a_2_gib_memory_limit(tmp_path):
    """Guards: M = N = 60,000 with K = 1 made the emulator allocate ~14 GB (a MemoryError or the OOM
    killer). Now the header's shapes are checked against the element budget before any tensor is read."""
    tiles = tmp_path / "tiles"
    tiles.mkdir()
    save_tile(_good_tile(M=60_000, K=1, N=60_000), tiles / "wide.safetensors")
    assert (tiles / "wide.safetensors").stat().st_size < 700_000
    proc = run_alibi(["conform", "--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w",
                      "--tiles", str(tiles), "--out", str(tmp_path / "r"), "--quiet"], memory_limit=2 * GIB)
    assert_one_line_error(proc, "wide.safetensors", "3,600,000,000 elements", MAX_ELEMENTS_ENV)
    assert not (tmp_path / "r").exists()


def test_the_element_budget_is_raised_by_its_environment_variable(tmp_path, monkeypatch):
    path = save_tile(_good_tile(M=40, K=1, N=40), tmp_path / "t.safetensors")
    monkeypatch.setenv(MAX_ELEMENTS_ENV, "1000")
    with pytest.raises(InputError, match="1,600 elements .* over the element budget of 1,000"):
        load_tile(path)
    monkeypatch.setenv(MAX_ELEMENTS_ENV, "1600")
    assert load_tile(path).M == 40


def test_an_8_gib_sparse_tile_is_refused_reading_only_its_header_under_a_1_gib_memory_limit(tmp_path):
    """Guards: the metadata read called `path.read_bytes()` — all 8 GiB — before looking at the header."""
    path = tmp_path / "sparse.safetensors"
    path.write_bytes(tile_bytes(_good_tile()))
    with open(path, "r+b") as fh:
        fh.truncate(8 * GIB)  # a hole: no disk space used
    code = f"from alibi.tiles.tile import load_tile\nload_tile({str(path)!r})"
    proc = run_python(code, memory_limit=GIB)
    assert proc.returncode == 1 and "MemoryError" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("alibi.errors.InputError: "), proc.stderr


# --- property: no bytes make the loader raise anything but InputError ------------------------------

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False,
                       allow_infinity=False), st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                                                               max_size=4),
                     max_leaves=20)
_names = st.sampled_from(["a_q", "s_a", "w_q", "s_w", "bias", "__metadata__", "other"])
_dtypes = st.sampled_from(["I8", "F32", "BF16", "F16", "F8_E4M3", "I64", "U8", "BOOL", "F4", "x"])
_entry = st.one_of(_json, st.fixed_dictionaries({
    "dtype": _dtypes | _json, "shape": st.lists(st.integers(-2, 70_000), max_size=3) | _json,
    "data_offsets": st.lists(st.integers(-4, 400), min_size=2, max_size=2) | _json}))
_headers = st.dictionaries(_names, _entry, max_size=6) | _json


def _check_loader(tmp_path, raw: bytes) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(raw)
    try:
        tile = load_tile(path)
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(tile, Tile)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300))
def test_random_bytes_never_make_the_tile_loader_raise_anything_but_input_error(tmp_path, raw):
    _check_loader(tmp_path, raw)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=_headers, data=st.binary(max_size=400), lie=st.integers(-3, 3))
def test_random_json_headers_never_make_the_tile_loader_raise_anything_but_input_error(tmp_path, header, data, lie):
    text = json.dumps(header).encode()
    _check_loader(tmp_path, struct.pack("<Q", max(0, len(text) + lie)) + text + data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 200), flip=st.integers(0, 10_000), value=st.integers(0, 255))
def test_truncated_or_corrupted_real_tiles_never_raise_anything_but_input_error(tmp_path, cut, flip, value):
    good = bytearray(tile_bytes(_good_tile(M=5, K=16, N=4)))
    good[flip % len(good)] = value
    _check_loader(tmp_path, bytes(good[: len(good) - cut]))


def _with_dtype(tile: Tile, tensor: str, dtype: str) -> bytes:
    """The tile's bytes with one tensor's header dtype replaced (same byte count: F8_E8M0 is one byte, as int8)."""
    data = tile_bytes(tile)
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header[tensor] = {**header[tensor], "dtype": dtype}
    return _raw(header, data[8 + n:])


@pytest.mark.parametrize("dtype", ["F8_E8M0", "F4"])
def test_a_tile_whose_header_declares_an_operand_dtype_no_tile_has_is_one_line_naming_it(tmp_path, capsys, dtype):
    """Issue 26: F8_E8M0 (a dtype safetensors.torch has no torch name for) ended in a KeyError traceback
    from the library; a header dtype that maps to no torch dtype a tile could hold is now refused before
    the library reads the tensors (dtypes torch knows keep their own messages, from `Tile.validate`)."""
    from alibi.cli import main

    folder = tmp_path / "tiles"
    folder.mkdir()
    (folder / "x.safetensors").write_bytes(_with_dtype(_good_tile(), "a_q", dtype))
    out = tmp_path / "out" / "report"
    assert main(["conform", "--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--quiet",
                 "--tiles", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder / "x.safetensors") in err[0] and dtype in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_tile_with_the_dtypes_a_tile_has_is_read(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(_with_dtype(_good_tile(), "a_q", "I8"))
    assert load_tile(path).fmt == "int8"

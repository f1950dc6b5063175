"""A cached kernel library is checked against its build record before `ctypes` loads it.

No GPU and no nvcc needed: the libraries here are small C shared objects built with the system C
compiler, carrying the C entry points of a CUTLASS library (entry_points.h) so that
`CutlassLibrary` binds them, and installed in a private cache (`ALIBI_CACHE`) with
`nvcc.install`, the function a real build ends with, which also pins them in a private config
folder (`ALIBI_CONFIG`). Digests are recomputed here with hashlib,
independently of `alibi.io.digests`. The last two tests use the real cached CUTLASS libraries when
this machine has them (`~/.cache/alibi/kernels`) and skip otherwise.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from alibi.errors import KernelUnavailable
from alibi.governance.manifest import build_predicate, build_statement, kernel_build_digest, statement_problems, \
    treatment_of
from alibi.kernels import nvcc
from alibi.kernels.cutlass import CutlassInt8Kernel, CutlassLibrary, int8_library

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler here to build a stand-in library")

KEY = "0123456789abcdef0123" + "4" * 44  # a build key; the file name carries its first 20 hex digits
NAME = "alibi_cutlass_int8_sm90"

ENTRY_POINTS = """
int alibi_int8_scaled_mm(void) { return 0; }
int alibi_int8_accumulate(void) { return 0; }
int alibi_choose_config(int m, int n) { return 0; }
const char *alibi_config_name(int c) { return "stand-in"; }
const char *alibi_path(void) { return "%s"; }
int alibi_cutlass_version(void) { return 0; }
const char *alibi_last_error(void) { return ""; }
"""


def _compile(folder: Path, variant: str) -> Path:
    """A shared object whose `alibi_path()` returns `variant` (so a test can tell which file was loaded)."""
    folder.mkdir(parents=True, exist_ok=True)
    src, so = folder / f"{variant}.c", folder / f"{variant}.so"
    src.write_text(ENTRY_POINTS % variant)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(so), str(src)], check=True, capture_output=True)
    return so


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cached(tmp_path, monkeypatch) -> Path:
    """A stand-in library installed in a private kernel cache, as `nvcc.build` would leave it."""
    monkeypatch.setenv("ALIBI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ALIBI_CONFIG", str(tmp_path / "config"))
    monkeypatch.delenv("ALIBI_ACCEPT_UNPINNED_KERNELS", raising=False)
    monkeypatch.setattr(nvcc, "_LOADED", {})  # loads are per process: start from none
    root = nvcc.cache_root()
    root.mkdir(parents=True)
    work = root / ".work.building"  # inside the cache, as a build's work folder is
    built = _compile(work, "original")
    return nvcc.install(built, root / f"{NAME}-{KEY[:20]}.so", {"library": NAME, "key": KEY})


def _flip_a_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _rewrite_record(path: Path, change) -> None:
    record = json.loads(path.with_suffix(".json").read_text())
    change(record)
    path.with_suffix(".json").write_text(json.dumps(record))


@needs_cc
def test_installing_a_built_library_pins_its_sha256_in_the_build_record_and_leaves_no_staging_file(cached):
    assert nvcc.build_record(cached)["sha256"] == _sha256(cached)
    assert sorted(p.name for p in cached.parent.iterdir() if p.is_file()) == [cached.with_suffix(".json").name,
                                                                               cached.name]


@needs_cc
def test_an_untampered_library_is_verified_then_loaded_and_its_digest_is_of_the_bytes_loaded(cached):
    handle, check = nvcc.load_path(cached)
    handle.alibi_path.restype = ctypes.c_char_p
    assert handle.alibi_path() == b"original"
    assert check == nvcc.LibraryCheck(cached, _sha256(cached), True, check.why) and check.verified
    assert "equals" in check.why and str(cached.with_suffix(".json")) in check.why


@needs_cc
def test_a_cached_library_with_one_flipped_byte_is_refused_before_ctypes_loads_it(cached, monkeypatch):
    _flip_a_byte(cached)
    opened = []
    monkeypatch.setattr(nvcc.ctypes, "CDLL", lambda name: opened.append(name))
    with pytest.raises(KernelUnavailable) as info:
        nvcc.load_path(cached)
    message = str(info.value)
    assert opened == [] and cached not in nvcc._LOADED
    assert "\n" not in message and str(cached) in message and f"delete {cached} to rebuild it" in message
    assert _sha256(cached) in message and nvcc.build_record(cached)["sha256"] in message


@needs_cc
def test_a_record_without_a_sha256_still_has_its_bytes_pinned_outside_the_cache(cached):
    _rewrite_record(cached, lambda r: r.pop("sha256"))
    assert nvcc.verify_library(cached).verified is True
    _flip_a_byte(cached)
    with pytest.raises(KernelUnavailable, match=r"the pin in .*kernel-pins\.json written when it was built"):
        nvcc.verify_library(cached)


@needs_cc
def test_a_library_without_a_build_record_is_verified_by_its_pin(cached):
    cached.with_suffix(".json").unlink()
    handle, check = nvcc.load_path(cached)
    assert check.verified is True and check.sha256 == _sha256(cached) and "kernel-pins.json" in check.why


# --- issue 26: the cache does not vouch for itself --------------------------------------------------

@needs_cc
def test_a_library_and_record_both_replaced_in_the_cache_are_refused_by_the_pin_outside_it(cached, monkeypatch):
    """Whoever can write the cache can replace a library and its build record together: the record then
    agrees with the bytes, and only the pin in the user's config folder tells."""
    forged = _compile(cached.parent.parent / "forged", "forged")
    shutil.copyfile(forged, cached)
    _rewrite_record(cached, lambda r: r.update(sha256=_sha256(cached)))
    monkeypatch.setattr(nvcc.ctypes, "CDLL", lambda name: pytest.fail(f"loaded {name}"))
    with pytest.raises(KernelUnavailable, match=r"changed since it was built"):
        nvcc.load_path(cached)


@needs_cc
def test_a_library_no_build_of_yours_pinned_is_refused_unless_the_recorded_flag_is_set(cached, monkeypatch):
    pins = nvcc.config_root() / nvcc.PINS_FILE
    pins.unlink()  # e.g. a cache copied from elsewhere: the record beside it agrees, nothing else vouches
    monkeypatch.setattr(nvcc.ctypes, "CDLL", lambda name: pytest.fail(f"loaded {name}"))
    with pytest.raises(KernelUnavailable, match=r"no build of yours pinned it .*ALIBI_ACCEPT_UNPINNED_KERNELS=1"):
        nvcc.load_path(cached)
    monkeypatch.undo()
    monkeypatch.setenv(nvcc.UNPINNED_ENV, "1")
    check = nvcc.verify_library(cached)
    assert check.verified is False and "loaded unverified because ALIBI_ACCEPT_UNPINNED_KERNELS=1" in check.why
    assert check.to_json()["verified"] is False  # what the kernel's evidence carries into the report


@needs_cc
@pytest.mark.parametrize("what", ["cache", "library", "pins"])
def test_a_cache_library_or_pin_file_others_can_write_is_refused(cached, what):
    target = {"cache": cached.parent, "library": cached, "pins": nvcc.config_root() / nvcc.PINS_FILE}[what]
    target.chmod(target.stat().st_mode | 0o002)
    with pytest.raises(KernelUnavailable, match=r"writable by group or others"):
        nvcc.verify_library(cached)
    target.chmod(target.stat().st_mode & ~0o022)
    assert nvcc.verify_library(cached).verified is True


@needs_cc
@pytest.mark.skipif(__import__("os").getuid() != 0, reason="giving a file to another user needs root")
def test_a_library_owned_by_another_user_is_refused(cached):
    import os

    os.chown(cached, 65534, 65534)
    with pytest.raises(KernelUnavailable, match=r"owned by uid 65534, not by you"):
        nvcc.verify_library(cached)


@needs_cc
def test_a_build_record_of_another_build_key_is_refused(cached):
    _rewrite_record(cached, lambda r: r.update(key="f" * 64))
    with pytest.raises(KernelUnavailable, match=r"is for build key f{20}, not this file's; delete .* to rebuild"):
        nvcc.verify_library(cached)


@needs_cc
def test_the_file_loaded_is_the_one_verified_even_if_its_name_is_replaced_in_between(cached, monkeypatch):
    """Guards the descriptor pinning: the digest is taken of the open file, and that file is loaded."""
    replacement = _compile(cached.parent.parent / "other", "replacement")
    verify = nvcc.verify_library

    def verify_then_swap(path, fh=None):
        check = verify(path, fh)
        shutil.copyfile(replacement, path.with_name("swap.so"))
        (path.with_name("swap.so")).replace(path)  # a new file at the name, after the check
        return check

    monkeypatch.setattr(nvcc, "verify_library", verify_then_swap)
    handle, check = nvcc.load_path(cached)
    handle.alibi_path.restype = ctypes.c_char_p
    assert handle.alibi_path() == b"original" and check.verified
    assert _sha256(cached) == _sha256(replacement) != check.sha256


@needs_cc
def test_cutlass_evidence_and_treatment_carry_the_digest_of_the_verified_library_as_a_digest_set(cached, monkeypatch):
    monkeypatch.setattr(nvcc, "build", lambda lib: cached)
    monkeypatch.setattr(nvcc, "cutlass_version", lambda *a: "4.2.0")
    kernel = CutlassInt8Kernel()
    source_digest = kernel_build_digest(kernel)  # nothing ran yet: the sources
    kernel._ran = CutlassLibrary(int8_library("sm90", "sm_90a"), "int8")  # what scaled_mm sets on a GPU
    ev = kernel.evidence()
    assert ev["build_digest"] == {"sha256": _sha256(cached)} and ev["binary"]["verified"] is True
    assert ev["code_path"] == "original" and ev["library"] == str(cached)
    assert kernel_build_digest(kernel) == _sha256(cached) != source_digest
    arms = {"a": treatment_of(kernel, "a")}
    predicate = build_predicate(arms=arms, created_at="2000-01-01T00:00:00Z")
    assert predicate["arms"]["a"]["kernel_build_digest"] == {"sha256": _sha256(cached)}
    assert statement_problems(build_statement("report", predicate, [])) == []


# --- the real cache, when this machine has one ---------------------------------------------------

def _real_cached(name: str) -> Path:
    found = sorted((Path.home() / ".cache" / "alibi" / "kernels").glob(f"{name}-*.so"))
    if not found:
        pytest.skip(f"no cached {name} library on this machine")
    return found[0]


def test_a_real_cached_cutlass_library_with_one_flipped_byte_is_refused_once_its_record_pins_it(tmp_path, monkeypatch):
    real = _real_cached(NAME)
    monkeypatch.setenv("ALIBI_CACHE", str(tmp_path))
    monkeypatch.setattr(nvcc, "_LOADED", {})
    monkeypatch.setenv("ALIBI_CONFIG", str(tmp_path / "config"))
    copy = nvcc.cache_root() / real.name
    copy.parent.mkdir()
    shutil.copyfile(real, copy)
    shutil.copyfile(real.with_suffix(".json"), copy.with_suffix(".json"))
    with pytest.raises(KernelUnavailable, match="no build of yours pinned it"):  # a copy: nothing vouches for it
        nvcc.verify_library(copy)
    nvcc.pin_library(copy.name, nvcc.build_record(real)["key"], _sha256(real))  # what `install` pins
    check = nvcc.verify_library(copy)
    assert check.verified is True and check.sha256 == _sha256(real)
    _flip_a_byte(copy, offset=len(copy.read_bytes()) // 2)
    monkeypatch.setattr(nvcc.ctypes, "CDLL", lambda name: pytest.fail(f"loaded {name}"))
    with pytest.raises(KernelUnavailable, match=r"changed since it was built.*delete .* to rebuild it"):
        nvcc.load_path(copy)


def test_the_cache_key_computed_today_is_the_full_key_recorded_when_the_cached_library_was_built():
    """The loader change must not rename cached libraries: the key `build_key` computes now equals the
    64-hex key the build wrote into the record of the library cached under today's name."""
    lib = int8_library("sm90", "sm_90a")
    try:
        nv, inc = nvcc.find_nvcc(), nvcc.cutlass_include_dirs()
    except KernelUnavailable as exc:
        pytest.skip(f"no toolchain to compute the key: {exc}")
    path = nvcc.library_path(lib)
    if not path.is_file():
        pytest.skip(f"no library cached under today's key ({path.name}): the sources or toolchain changed")
    assert nvcc.build_record(path)["key"] == nvcc.build_key(lib, nv, inc)


@needs_cc
def test_two_libraries_loaded_one_after_the_other_each_give_their_own_code(cached):
    """dlopen knows loaded libraries by name: had the first library's /proc/self/fd/<n> been closed, the
    second would get the same name and the first library's handle (the H200 fp8 library lost its symbols
    that way). Each load must hand back the library it verified."""
    second_key = "fedcba9876543210fedc" + "5" * 44
    other = nvcc.install(_compile(cached.parent / ".work.other", "second"),
                         cached.parent / f"{NAME}-{second_key[:20]}.so", {"library": NAME, "key": second_key})
    first, _ = nvcc.load_path(cached)
    second, _ = nvcc.load_path(other)
    for handle in (first, second):
        handle.alibi_path.restype = ctypes.c_char_p
    assert (first.alibi_path(), second.alibi_path()) == (b"original", b"second")

"""The CUTLASS sources compile (no GPU needed), the build cache works, and missing tools are named.

The compile tests run nvcc for real: a broken kernel source fails here, on the CPU machine. They
build into the ordinary kernel cache (`$ALIBI_CACHE/kernels`, default `~/.cache/alibi/kernels`):
its key covers every source, flag, target and toolchain version, so a cached library proves these
exact sources compiled, and any change to them compiles again. A cold build of the three libraries
is about 1,400 s of CPU (833 s of wall time on two shared cores; docs/testing.md), so it happens
only where asked: with `ALIBI_TEST_CUTLASS_BUILD=1` (CI sets it) the build runs in the background
from the end of collection and these tests run last (tests/cutlass_route.py); without it a library
not yet cached skips its tests, saying how to include them. Each build announces itself on stderr,
and the fixtures let that line through pytest's output capture so a cold run does not look hung.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cutlass_route
import pytest

from alibi.errors import InputError, KernelUnavailable
from alibi.kernels import nvcc
from alibi.kernels.cutlass import CutlassInt8Kernel, declare_entry_points, int8_library
from alibi.kernels.fp8 import CutlassFp8Kernel, fp8_library

try:
    nvcc.find_nvcc()
    NVCC_REASON = None
except KernelUnavailable as exc:
    NVCC_REASON = str(exc)
needs_nvcc = pytest.mark.skipif(NVCC_REASON is not None, reason=f"nvcc is not installed here: {NVCC_REASON}")


@pytest.fixture(scope="module")
def cache() -> Path:
    """The kernel cache the builds below use (the ambient one; see the module docstring)."""
    return nvcc.cache_root().parent


@pytest.fixture(scope="module")
def uncaptured(request):
    """A context in which stderr reaches the terminal: the one-line build announcement must be seen."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    return capture.global_and_fixture_disabled if capture is not None else contextlib.nullcontext


def built(request, uncaptured, lib: nvcc.Library, build) -> Path:
    """`build()`'s library: from the cache, from the background build (waiting for it), or compiled here;
    skipped when it is not cached and compiling was not asked for (tests/cutlass_route.py)."""
    if NVCC_REASON is None and cutlass_route.toolchain_problem() is None and not nvcc.library_path(lib).is_file():
        if not cutlass_route.requested():
            pytest.skip(f"{lib.name} is not compiled here; {cutlass_route.HOW}")
        background = getattr(request.config, "alibi_cutlass_build", None)
        with uncaptured():
            print(f"\nalibi tests: {lib.name} is not cached yet; waiting for "
                  f"{background.describe() if background else 'its build'}", file=sys.stderr, flush=True)
    with uncaptured():
        return build()


@pytest.fixture(scope="module")
def int8_sm90(cache, uncaptured, request) -> Path:
    return built(request, uncaptured, int8_library("sm90", "sm_90a"), lambda: CutlassInt8Kernel().build("sm_90"))


@pytest.fixture(scope="module")
def fp8_sm90(cache, uncaptured, request) -> Path:
    return built(request, uncaptured, fp8_library(), lambda: CutlassFp8Kernel().build("sm_90a"))


@pytest.fixture(scope="module")
def int8_sm80(cache, uncaptured, request) -> Path:
    return built(request, uncaptured, int8_library("sm80", "sm_80"), lambda: CutlassInt8Kernel().build("sm_80"))


def cuobjdump_candidates() -> list[Path]:
    """Where a cuobjdump may be, in order: beside nvcc (the real one, not a wrapper script), on PATH, in
    the CUDA toolkit's bin/ (`$CUDA_HOME`, `/usr/local/cuda*`), and the copy Triton ships for its NVIDIA
    back end (`triton/backends/nvidia/bin/cuobjdump`)."""
    found: list[Path] = []
    with contextlib.suppress(KernelUnavailable):
        nv = nvcc.find_nvcc()
        found += [nv.with_name("cuobjdump"), nv.resolve().with_name("cuobjdump")]
    if shutil.which("cuobjdump"):
        found.append(Path(shutil.which("cuobjdump")))
    found += [Path(os.environ[v]) / "bin" / "cuobjdump" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    found += sorted(Path("/usr/local").glob("cuda*/bin/cuobjdump"))
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        found.append(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    return list(dict.fromkeys(found))


def find_cuobjdump() -> Path | None:
    return next((c for c in cuobjdump_candidates() if c.is_file() and os.access(c, os.X_OK)), None)


def test_cuobjdump_is_found_where_triton_ships_it_when_the_toolkit_lacks_it():
    """Triton's wheel carries a cuobjdump; with triton installed the SASS check below never lacks one."""
    spec = importlib.util.find_spec("triton")
    bundled = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump" if spec else None
    if bundled is None or not bundled.is_file():
        pytest.skip("this triton build ships no cuobjdump")
    assert bundled in cuobjdump_candidates()
    assert find_cuobjdump() is not None


def _host_api(path: Path, fmt: str) -> ctypes.CDLL:
    # Loading needs no GPU: the CUDA runtime is linked statically and starts only at the first
    # CUDA call; the configuration and version functions are host code.
    lib = ctypes.CDLL(str(path))
    declare_entry_points(lib, fmt)
    return lib


@needs_nvcc
def test_cutlass_int8_sm90a_sources_compile_and_export_the_c_entry_points(int8_sm90):
    lib = _host_api(int8_sm90, "int8")
    assert lib.alibi_cutlass_version() == int("".join(f"{int(x):02d}" for x in nvcc.cutlass_version().split(".")))
    assert b"sm_90a" in lib.alibi_path()
    # vLLM's sm90 int8 dispatch: M<=32 splits on N at 8192, then 64, 128, larger.
    assert [lib.alibi_choose_config(m, n) for m, n in
            [(1, 4096), (32, 8191), (32, 8192), (33, 4096), (64, 1), (65, 1), (128, 1), (129, 1), (4096, 4096)]] \
        == [0, 0, 1, 2, 2, 3, 3, 4, 4]
    assert b"128x128x128" in lib.alibi_config_name(4)


@needs_nvcc
def test_cutlass_fp8_sm90a_sources_compile_and_export_the_c_entry_points(fp8_sm90):
    lib = _host_api(fp8_sm90, "fp8")
    assert b"FP8 fast accumulation" in lib.alibi_path()
    assert [lib.alibi_choose_config(m, 4096) for m in (1, 64, 65, 128, 129)] == [2, 2, 3, 3, 4]


@needs_nvcc
def test_cutlass_int8_sm80_path_compiles_for_sm80(int8_sm80):
    lib = _host_api(int8_sm80, "int8")
    assert b"CUTLASS 2" in lib.alibi_path()
    assert [lib.alibi_choose_config(m, n) for m, n in [(16, 1), (17, 1), (64, 1), (128, 4096), (128, 8192)]] \
        == [0, 1, 2, 2, 3]


@needs_nvcc
def test_the_epilogue_is_compiled_to_fmul_ffma_and_i2f_without_flush_to_zero(int8_sm90):
    """The SASS multiplies with FMUL, fuses the bias with FFMA and converts with I2F, never .FTZ.

    Needs a cuobjdump: the CUDA toolkit's, or the one Triton bundles (see `cuobjdump_candidates`).
    """
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (looked beside nvcc, on PATH, in the CUDA toolkit's bin/ and in triton's "
                    "backends/nvidia/bin/); install the toolkit's cuobjdump (Debian/Ubuntu: the cuda-cuobjdump "
                    "package of your CUDA version) or the triton package, which ships one")
    path = int8_sm90
    proc = subprocess.run([str(cuobjdump), "--dump-sass", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{cuobjdump} --dump-sass failed: {proc.stderr.strip()[-500:]}"
    sass = proc.stdout
    assert "FFMA" in sass and "FMUL" in sass and "I2F" in sass
    assert ".FTZ" not in sass


@needs_nvcc
def test_a_second_build_reuses_the_cached_library_without_compiling_locking_or_writing(int8_sm90, monkeypatch):
    """The work a cache hit does, counted: no compiler run, no build lock taken, none of the library's files in the
    cache (library, build record, lock) written."""
    compiled, locked = [], []
    monkeypatch.setattr(nvcc, "_run", lambda cmd: compiled.append(cmd) or pytest.fail(f"recompiled: {cmd}"))
    monkeypatch.setattr(nvcc, "build_lock", lambda path: locked.append(path) or contextlib.nullcontext())
    def files() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in int8_sm90.parent.iterdir() if int8_sm90.stem in p.name}

    before = files()
    again = CutlassInt8Kernel().build("sm_90a")
    assert again == int8_sm90
    assert compiled == [] and locked == []
    assert files() == before and len(before) >= 2  # the .so and its build record at least


@needs_nvcc
def test_a_build_leaves_only_the_library_its_record_and_a_lock(int8_sm90, cache):
    kernels = cache / "kernels"
    record = nvcc.build_record(int8_sm90)
    assert record["cutlass"] == nvcc.cutlass_version() and record["gencode"] == ["arch=compute_90a,code=sm_90a"]
    assert set(record["compile_seconds"]) == set(int8_library("sm90", "sm_90a").sources)
    assert not [p for p in kernels.iterdir() if p.name.endswith(".building")]


@needs_nvcc
def test_alibi_kernels_build_cutlass_compiles_without_a_gpu(int8_sm90, cache):
    proc = subprocess.run([sys.executable, "-m", "alibi", "kernels", "build", "cutlass", "--arch", "sm_90"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert str(int8_sm90) in proc.stdout


@needs_nvcc
def test_a_compile_error_is_reported_with_the_failing_file(tmp_path, monkeypatch, cache):
    broken = tmp_path / "csrc"
    broken.mkdir()
    (broken / "broken.cu").write_text("this is not C++\n")
    monkeypatch.setattr(nvcc, "CSRC", broken)
    with pytest.raises(nvcc.BuildError, match="broken.cu"):
        nvcc.build(nvcc.Library("broken", ("broken.cu",), (nvcc.gencode_for("sm_80"),)))
    assert not [p for p in (cache / "kernels").iterdir() if p.name.startswith("broken")]


def test_cache_key_depends_on_the_target_architecture():
    if NVCC_REASON:
        pytest.skip(NVCC_REASON)
    nv, inc = nvcc.find_nvcc(), nvcc.cutlass_include_dirs()
    k80 = nvcc.build_key(int8_library("sm80", "sm_80"), nv, inc)
    k89 = nvcc.build_key(int8_library("sm80", "sm_89"), nv, inc)
    assert k80 != k89 and k80 == nvcc.build_key(int8_library("sm80", "sm_80"), nv, inc)


def test_missing_nvcc_is_kernel_unavailable_naming_the_cuda_toolkit(monkeypatch, tmp_path):
    for var in ("ALIBI_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(nvcc, "NVCC_FALLBACK", tmp_path / "no-nvcc")
    with pytest.raises(KernelUnavailable, match="install the CUDA toolkit"):
        nvcc.find_nvcc()


def test_missing_cutlass_headers_say_pip_install_nvidia_cutlass(monkeypatch):
    monkeypatch.delenv("ALIBI_CUTLASS_INCLUDE", raising=False)
    monkeypatch.setattr(nvcc.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(KernelUnavailable, match="pip install nvidia-cutlass"):
        nvcc.cutlass_include_dirs()


def test_alibi_cutlass_include_must_hold_cutlass_headers(monkeypatch, tmp_path):
    monkeypatch.setenv("ALIBI_CUTLASS_INCLUDE", str(tmp_path))
    with pytest.raises(KernelUnavailable, match="ALIBI_CUTLASS_INCLUDE"):
        nvcc.cutlass_include_dirs()


@pytest.mark.parametrize("arch", ["90", "sm90", "compute_90", "sm_9x", ""])
def test_a_malformed_architecture_is_bad_input(arch):
    with pytest.raises(InputError, match="sm_80"):
        nvcc.gencode_for(arch)


def test_the_fp8_kernel_refuses_to_build_for_anything_but_sm90a():
    with pytest.raises(InputError, match="sm_90a"):
        CutlassFp8Kernel().build("sm_89")

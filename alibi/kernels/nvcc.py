"""Build the CUDA libraries in `alibi/kernels/csrc` with nvcc at first use, into a content-keyed cache.

A library is a set of translation units compiled for one GPU target and linked into a shared
object that `ctypes` loads (no PyTorch C++ extension: the entry points take raw device pointers
and a `cudaStream_t`, so the build depends neither on torch's headers nor on its ABI).

Cache. `$ALIBI_CACHE/kernels` (default `~/.cache/alibi/kernels`) holds
`<library>-<key>.so`, where `key` is the sha256 of everything that shapes the binary: every file
in `csrc/` (sources and headers), the nvcc flags, the `-gencode` targets, the CUTLASS version and
the nvcc version. The same key means the same inputs, so a second run loads the cached object
without compiling; any change to a source, a flag, the target, CUTLASS or nvcc builds anew.

Atomicity. Objects are compiled into a private temporary folder inside the cache and the finished
`.so` is renamed into place (`os.replace`, atomic on one file system), after its build record
(`.json`). A crash leaves at most a stray temporary folder, never a half-written library; a file
lock serialises concurrent builders of the same key so the work is done once.

Where things come from (first match wins):
  * nvcc: `$ALIBI_NVCC`, `$CUDA_HOME/bin/nvcc`, `$CUDA_PATH/bin/nvcc`, `nvcc` on `PATH`,
    `/usr/local/cuda/bin/nvcc`;
  * CUTLASS headers: `$ALIBI_CUTLASS_INCLUDE` (one folder holding `cutlass/cutlass.h`, `cute/`
    and `cutlass/util/packed_stride.hpp`, e.g. a copy carried to a machine without the package),
    then the installed `nvidia-cutlass` package (`cutlass_library/source/include` and
    `cutlass_library/source/tools/util/include`).
Anything missing raises KernelUnavailable naming what to install.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from alibi.errors import InputError, KernelUnavailable

CSRC = Path(__file__).resolve().with_name("csrc")

# Flags of every translation unit. No fast-math family flag: the epilogue relies on IEEE fp32
# (subnormals kept, -ftz=false; correctly rounded division and square root are nvcc's defaults
# too, spelled out so a reader need not know them). The explicit __fmul_rn/__fmaf_rn intrinsics
# make -fmad irrelevant for the epilogue.
NVCC_FLAGS: tuple[str, ...] = (
    "-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
    "-ftz=false", "-prec-div=true", "-prec-sqrt=true",
    "-Xcompiler", "-fPIC",
)
# The CUDA runtime is linked statically, so the library needs nothing from the CUDA toolkit at
# run time (only the driver); streams from torch's runtime are driver streams and work across.
LINK_FLAGS: tuple[str, ...] = ("-shared", "-cudart", "static")


@dataclass(frozen=True)
class Library:
    """One shared library: its name, the .cu files in csrc/ it is built from, and its GPU targets.

    gencode: nvcc `-gencode` values, e.g. ``("arch=compute_90a,code=sm_90a",)``.
    """

    name: str
    sources: tuple[str, ...]
    gencode: tuple[str, ...]


def gencode_for(arch: str) -> str:
    """`sm_90a` → `arch=compute_90a,code=sm_90a`; InputError for anything that is not `sm_<digits>[a]`."""
    m = re.fullmatch(r"sm_(\d{2,3})([af]?)", arch)
    if not m:
        raise InputError(f"--arch {arch!r} is not a GPU architecture; use a name like sm_80, sm_89 or sm_90a")
    return f"arch=compute_{m[1]}{m[2]},code=sm_{m[1]}{m[2]}"


def cache_root() -> Path:
    """Where built libraries live: `$ALIBI_CACHE/kernels`, default `~/.cache/alibi/kernels`."""
    base = os.environ.get("ALIBI_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "alibi"
    return root / "kernels"


# --- toolchain discovery ---------------------------------------------------------------------------

NVCC_FALLBACK = Path("/usr/local/cuda/bin/nvcc")


def find_nvcc() -> Path:
    """The nvcc to use (see the module docstring for the search order)."""
    candidates: list[Path] = []
    if os.environ.get("ALIBI_NVCC"):
        candidates.append(Path(os.environ["ALIBI_NVCC"]))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(NVCC_FALLBACK)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise KernelUnavailable(
        "nvcc not found: install the CUDA toolkit (12.4 or newer; CUTLASS 3 sm_90a kernels need it) "
        "and put its bin/ on PATH, or set CUDA_HOME or ALIBI_NVCC")


@functools.cache
def nvcc_version(nvcc: Path) -> str:
    """nvcc's own version line, e.g. `Cuda compilation tools, release 13.0, V13.0.88` + build id."""
    try:
        text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailable(f"{nvcc} --version failed ({exc}); reinstall the CUDA toolkit") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-2:])


def cutlass_include_dirs() -> tuple[Path, ...]:
    """Folders to pass as -I for CUTLASS (see the module docstring for the search order)."""
    env = os.environ.get("ALIBI_CUTLASS_INCLUDE")
    if env:
        root = Path(env)
        if not (root / "cutlass" / "cutlass.h").is_file():
            raise KernelUnavailable(f"ALIBI_CUTLASS_INCLUDE={env} holds no cutlass/cutlass.h; point it at a "
                                    "CUTLASS include folder or unset it to use the nvidia-cutlass package")
        return (root,)
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise KernelUnavailable("CUTLASS headers not found: pip install nvidia-cutlass "
                                "(or set ALIBI_CUTLASS_INCLUDE to a CUTLASS include folder)")
    source = Path(next(iter(spec.submodule_search_locations))) / "source"
    dirs = (source / "include", source / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise KernelUnavailable(f"the installed nvidia-cutlass package has no headers under {dirs[0]}; "
                                "reinstall it: pip install --force-reinstall nvidia-cutlass")
    return tuple(d for d in dirs if d.is_dir())


def cutlass_version(include_dirs: tuple[Path, ...] | None = None) -> str:
    """`major.minor.patch` read from `cutlass/version.h`."""
    dirs = include_dirs if include_dirs is not None else cutlass_include_dirs()
    text = (dirs[0] / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise KernelUnavailable(f"cannot read the CUTLASS version from {dirs[0] / 'cutlass' / 'version.h'}")
    return ".".join(m[1] for m in parts)  # type: ignore[index]


# --- building ----------------------------------------------------------------------------------------

def _csrc_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in CSRC.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_key(lib: Library, nvcc: Path, include_dirs: tuple[Path, ...]) -> str:
    """sha256 over sources, flags, targets, CUTLASS version and nvcc version (the cache key)."""
    record = {"library": lib.name, "sources": lib.sources, "gencode": lib.gencode,
              "csrc": _csrc_digest(), "flags": NVCC_FLAGS, "link": LINK_FLAGS,
              "cutlass": cutlass_version(include_dirs), "nvcc": nvcc_version(nvcc)}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def library_path(lib: Library) -> Path:
    """Where `lib` is (or will be) cached for this toolchain."""
    nvcc, inc = find_nvcc(), cutlass_include_dirs()
    return cache_root() / f"{lib.name}-{build_key(lib, nvcc, inc)[:20]}.so"


# One CUTLASS translation unit takes about two minutes of one core: a cold test run, which builds
# the three libraries (12 units), took 833 s against 94 s warm on 2 shared cores. Only the
# announcement of a build uses this figure.
MINUTES_PER_UNIT = 2


def _announce_build(lib: Library, workers: int) -> None:
    """Say once, on stderr, that a one-time compilation starts, what it builds and roughly how long it takes.

    Without this line a first run sits silent for minutes and looks hung; a cached build says nothing.
    """
    minutes = -(-len(lib.sources) // workers) * MINUTES_PER_UNIT
    print(f"alibi: compiling {lib.name} ({len(lib.sources)} CUDA/CUTLASS files for {', '.join(lib.gencode)}) "
          f"with nvcc, once: roughly {minutes} minutes with {workers} parallel job(s); later runs load it "
          f"from {cache_root()}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def build_lock(path: Path):
    """Hold an exclusive `flock` on the lock file `path` for the block.

    Opened with O_CREAT and without O_TRUNC (an existing lock file is opened unchanged) and with
    O_NOFOLLOW: a symbolic link planted at the lock's name in a shared cache makes the open fail,
    where `open(path, "w")` followed it and truncated its target. Anything but a regular file there
    is refused too. KernelUnavailable (exit 3) names the path and the fix.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise KernelUnavailable(f"cannot open the build lock {path} ({exc.strerror}; a symbolic link there is refused); "
                                "remove it, or set ALIBI_CACHE to a folder only you can write") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KernelUnavailable(f"the build lock {path} is not a regular file; remove it, or set ALIBI_CACHE to "
                                    "a folder only you can write")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class BuildError(KernelUnavailable):
    """nvcc rejected a source: a defect in this package or an incompatible nvcc/CUTLASS (exit 3)."""


def _compile_commands(lib: Library, nvcc: Path, include_dirs: tuple[Path, ...], work: Path) -> list[list[str]]:
    includes = [f"-I{CSRC}"] + [f"-I{d}" for d in include_dirs]
    gencodes = [f"-gencode={g}" for g in lib.gencode]
    return [[str(nvcc), *NVCC_FLAGS, *gencodes, *includes, "-c", str(CSRC / src),
             "-o", str(work / (Path(src).stem + ".o"))] for src in lib.sources]


def _run(cmd: list[str]) -> tuple[list[str], float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return cmd, time.perf_counter() - t0, proc


def build(lib: Library, *, jobs: int | None = None) -> Path:
    """Compile and link `lib` unless the cache already holds it; return the `.so` path.

    jobs: parallel nvcc processes (default: CPU count, at most one per translation unit).
    """
    missing = [s for s in lib.sources if not (CSRC / s).is_file()]
    if missing:
        raise BuildError(f"library {lib.name}: source file(s) {', '.join(missing)} missing from {CSRC}")
    nvcc, inc = find_nvcc(), cutlass_include_dirs()
    key = build_key(lib, nvcc, inc)
    root = cache_root()
    target = root / f"{lib.name}-{key[:20]}.so"
    if target.is_file():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelUnavailable(f"cannot create the kernel cache {root} ({exc.strerror}); "
                                "set ALIBI_CACHE to a writable folder") from None
    lock_path = root / f".{lib.name}-{key[:20]}.lock"
    with build_lock(lock_path):  # another process may be building the same key
        if target.is_file():
            return target
        work = Path(tempfile.mkdtemp(prefix=f".{lib.name}-", suffix=".building", dir=root))
        try:
            commands = _compile_commands(lib, nvcc, inc, work)
            workers = max(1, min(len(commands), jobs or os.cpu_count() or 1))
            _announce_build(lib, workers)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                results = list(pool.map(_run, commands))
            failures = [(cmd, proc) for cmd, _, proc in results if proc.returncode != 0]
            if failures:
                cmd, proc = failures[0]
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-40:])
                raise BuildError(f"nvcc failed to compile {Path(cmd[-3]).name} for {lib.name} "
                                 f"({', '.join(lib.gencode)}):\n{tail}")
            timings = {Path(cmd[-3]).name: round(t, 1) for cmd, t, _ in results}
            link = [str(nvcc), *LINK_FLAGS, *(f"-gencode={g}" for g in lib.gencode),
                    *(str(work / (Path(s).stem + ".o")) for s in lib.sources), "-o", str(work / "lib.so")]
            _, t_link, proc = _run(link)
            if proc.returncode != 0:
                raise BuildError(f"nvcc failed to link {lib.name}:\n{proc.stderr.strip()[-3000:]}")
            record = {"library": lib.name, "key": key, "sources": list(lib.sources),
                      "gencode": list(lib.gencode), "flags": list(NVCC_FLAGS), "nvcc": str(nvcc),
                      "nvcc_version": nvcc_version(nvcc), "cutlass": cutlass_version(inc),
                      "include_dirs": [str(d) for d in inc], "compile_seconds": timings,
                      "link_seconds": round(t_link, 1), "workers": workers}
            (work / "build.json").write_text(json.dumps(record, indent=2))
            os.replace(work / "build.json", target.with_suffix(".json"))
            os.replace(work / "lib.so", target)
            return target
        finally:
            shutil.rmtree(work, ignore_errors=True)


def build_record(path: Path) -> dict:
    """The build record (flags, timings, versions) written next to a cached library."""
    with contextlib.suppress(OSError, json.JSONDecodeError):
        return json.loads(path.with_suffix(".json").read_text())
    return {}


_LOADED: dict[Path, ctypes.CDLL] = {}


def load(lib: Library) -> tuple[ctypes.CDLL, Path]:
    """Build if needed and load `lib` (once per process); returns the handle and its path."""
    path = build(lib)
    if path not in _LOADED:
        try:
            _LOADED[path] = ctypes.CDLL(str(path))
        except OSError as exc:
            raise KernelUnavailable(f"cannot load {path} ({exc}); delete it to force a rebuild") from None
    return _LOADED[path], path

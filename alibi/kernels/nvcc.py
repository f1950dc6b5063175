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

Integrity and trust (docs/digests.md, "The kernel cache"). A cache folder can be written by whoever
can write it, so nothing in it vouches for itself:
  * the cache folder and every library loaded from it must be owned by the user running alibi and
    not writable by group or others; otherwise nothing is loaded (KernelUnavailable, exit 3);
  * when a build installs a library, its build key and sha256 are also pinned outside the cache, in
    the user's own config folder (`$ALIBI_CONFIG`, default `$XDG_CONFIG_HOME/alibi` or
    `~/.config/alibi`: `kernel-pins.json`, owned by the user, not writable by others). `load` opens the
    cached file once, checks its owner and mode through that descriptor, digests the bytes, compares
    them with the pin (and the build record beside it) and only then lets `ctypes` load the same open
    file (`/proc/self/fd/<n>`), so the digest it reports is of the bytes loaded even if the name is
    replaced meanwhile. A mismatch is refused (KernelUnavailable: delete the file to rebuild);
  * a library with no pin (built elsewhere, or before pins) is refused unless
    `ALIBI_ACCEPT_UNPINNED_KERNELS=1` is set; it then loads `verified: false`, and the kernel's
    evidence (report and manifest) records that it was loaded unpinned, and why (`LibraryCheck`).

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
from typing import BinaryIO

from alibi.errors import InputError, KernelUnavailable
from alibi.io import atomic
from alibi.io.digests import sha256_bytes, sha256_file, sha256_stream

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

# The cache key's own serialisations (not the toolkit's `sha256_listing`): every cached library is
# named by them, so they stay byte for byte what they were when the caches were built.

def _csrc_digest() -> str:
    """sha256 over `name NUL bytes NUL` of every file in csrc/, by name."""
    return sha256_bytes(b"".join(path.name.encode() + b"\0" + path.read_bytes() + b"\0"
                                 for path in sorted(p for p in CSRC.iterdir() if p.is_file())))


def build_key(lib: Library, nvcc: Path, include_dirs: tuple[Path, ...]) -> str:
    """sha256 over sources, flags, targets, CUTLASS version and nvcc version (the cache key)."""
    record = {"library": lib.name, "sources": lib.sources, "gencode": lib.gencode,
              "csrc": _csrc_digest(), "flags": NVCC_FLAGS, "link": LINK_FLAGS,
              "cutlass": cutlass_version(include_dirs), "nvcc": nvcc_version(nvcc)}
    return sha256_bytes(json.dumps(record, sort_keys=True).encode())


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
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise KernelUnavailable(f"cannot create the kernel cache {root} ({exc.strerror}); "
                                "set ALIBI_CACHE to a writable folder") from None
    require_private(root, "kernel cache")  # a cache others can write is not built into either
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
            return install(work / "lib.so", target, record)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def install(built: Path, target: Path, record: dict) -> Path:
    """Put the linked library `built` in the cache as `target`, its build record beside it.

    The record gains `sha256`, the digest of the library's bytes, which `load` checks. It is written
    first (from a temporary file, renamed), then the library is renamed into place: a library is
    never visible without the record that pins it. Both renames stay on one file system (`built`
    lies in a temporary folder inside the cache), so each is atomic.
    """
    record = {**record, "sha256": sha256_file(built)}
    staged = built.with_name(built.name + ".json")
    staged.write_text(json.dumps(record, indent=2))
    os.chmod(built, 0o755)
    pin_library(target.name, str(record.get("key", "")), record["sha256"])  # outside the cache, before it is visible
    os.replace(staged, target.with_suffix(".json"))
    os.replace(built, target)
    return target


# --- the pins outside the cache ---------------------------------------------------------------------

UNPINNED_ENV = "ALIBI_ACCEPT_UNPINNED_KERNELS"
PINS_FILE = "kernel-pins.json"


def config_root() -> Path:
    """The user's alibi config folder: `$ALIBI_CONFIG`, else `$XDG_CONFIG_HOME/alibi`, else `~/.config/alibi`."""
    if os.environ.get("ALIBI_CONFIG"):
        return Path(os.environ["ALIBI_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base else Path.home() / ".config") / "alibi"


def require_private(path: Path, what: str, st: os.stat_result | None = None) -> None:
    """KernelUnavailable unless `path` (or the `st` of its open descriptor) is owned by this user and not
    writable by group or others: whoever else can write it could replace what alibi loads."""
    st = os.lstat(path) if st is None else st
    fix = "or set ALIBI_CACHE (and ALIBI_CONFIG) to folders only you can write"
    if stat.S_ISLNK(st.st_mode):
        raise KernelUnavailable(f"{path}: the {what} is a symbolic link; remove it, {fix}")
    if st.st_uid != os.getuid():
        raise KernelUnavailable(f"{path}: the {what} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                                f"nothing in it is trusted: remove it, {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KernelUnavailable(f"{path}: the {what} is writable by group or others (mode "
                                f"{stat.S_IMODE(st.st_mode):o}); `chmod go-w {path}`, {fix}")


def read_pins() -> dict[str, dict]:
    """{library file name: {"key", "sha256"}} pinned by this user's builds (empty when none was pinned)."""
    path = config_root() / PINS_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    require_private(path.parent, "config folder")
    require_private(path, "kernel pin file")
    try:
        pins = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KernelUnavailable(f"{path}: unreadable kernel pins ({exc.__class__.__name__}); delete it and the "
                                "cached libraries (they are rebuilt and pinned again)") from None
    if not isinstance(pins, dict) or not all(isinstance(v, dict) for v in pins.values()):
        raise KernelUnavailable(f"{path}: not a kernel pin file; delete it and the cached libraries (they are "
                                "rebuilt and pinned again)")
    return pins


def pin_library(name: str, key: str, sha256: str) -> None:
    """Record `name`'s build key and sha256 in the user's pin file (one writer at a time)."""
    root = config_root()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise KernelUnavailable(f"cannot create the config folder {root} ({exc.strerror}); set ALIBI_CONFIG to a "
                                "folder only you can write") from None
    require_private(root, "config folder")
    with build_lock(root / f".{PINS_FILE}.lock"):
        pins = read_pins()
        pins[name] = {"key": key, "sha256": sha256}
        path = atomic.write_text(root / PINS_FILE, json.dumps(pins, indent=1, sort_keys=True) + "\n")
        os.chmod(path, 0o600)


def build_record(path: Path) -> dict:
    """The build record (flags, timings, versions, the library's sha256) written next to a cached library."""
    with contextlib.suppress(OSError, json.JSONDecodeError, UnicodeDecodeError):
        record = json.loads(path.with_suffix(".json").read_text())
        if isinstance(record, dict):
            return record
    return {}


@dataclass(frozen=True)
class LibraryCheck:
    """What `verify_library` found for one cached library.

    path: the `.so`; sha256: digest of the bytes read (those then loaded); verified: they equal the
    sha256 its build record pins; why: one line saying how that was decided (for `verified: false`,
    why nothing could be compared and how to get a record that can).
    """

    path: Path
    sha256: str
    verified: bool
    why: str

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "sha256": self.sha256, "verified": self.verified, "why": self.why}


def verify_library(path: Path, fh: BinaryIO | None = None) -> LibraryCheck:
    """Check the cached library `path` (through the open file `fh` when given) before anything loads it.

    KernelUnavailable, naming the file and the fix, when the cache folder or the file is not this user's
    alone (`require_private`), when the pin in the user's config folder or the build record beside the
    file pins a different sha256 or another build key than the one in the file name, and when no pin
    exists, unless `ALIBI_ACCEPT_UNPINNED_KERNELS=1` (then `verified: false`, with why).
    """
    if fh is None:
        with open(path, "rb") as own:
            return verify_library(path, own)
    require_private(path.parent, "kernel cache")
    require_private(path, "cached library", os.fstat(fh.fileno()))
    fh.seek(0)
    actual = sha256_stream(fh)
    json_path = path.with_suffix(".json")
    record = build_record(path)
    fix = f"delete {path} to rebuild it"
    key = record.get("key")
    if isinstance(key, str) and not path.stem.endswith("-" + key[:20]):
        raise KernelUnavailable(f"{path}: its build record {json_path} is for build key {key[:20]}, not this "
                                f"file's; {fix} (and {json_path.name})")
    recorded = record.get("sha256")
    if recorded is not None and recorded != actual:
        raise KernelUnavailable(f"{path}: its sha256 is {actual}, its build record {json_path} pins {recorded} "
                                f"(changed since it was built); {fix}")
    pins_path = config_root() / PINS_FILE
    pin = read_pins().get(path.name)
    if pin is None:
        if os.environ.get(UNPINNED_ENV) == "1":
            return LibraryCheck(path, actual, False, f"no pin in {pins_path} (not built by this user here, or built "
                                                     f"before pins); loaded unverified because {UNPINNED_ENV}=1")
        raise KernelUnavailable(f"{path}: no build of yours pinned it in {pins_path}, so nothing outside the cache "
                                f"vouches for its bytes; {fix} here, or set {UNPINNED_ENV}=1 to load it unverified "
                                "(the kernel's evidence then says so)")
    if not (isinstance(pin.get("key"), str) and path.stem.endswith("-" + pin["key"][:20])):
        raise KernelUnavailable(f"{path}: the pin in {pins_path} is for build key {str(pin.get('key'))[:20]}, not "
                                f"this file's; {fix}")
    if pin.get("sha256") != actual:
        raise KernelUnavailable(f"{path}: its sha256 is {actual}, the pin in {pins_path} written when it was built "
                                f"is {pin.get('sha256')} (changed since it was built); {fix}")
    return LibraryCheck(path, actual, True, f"sha256 equals the one pinned in {pins_path} when it was built "
                                            f"(and by {json_path})")


def _loadable_name(fh: BinaryIO, path: Path) -> str:
    """A name `dlopen` resolves to the very file open as `fh` (not to whatever `path` names now)."""
    pinned = Path(f"/proc/self/fd/{fh.fileno()}")
    return str(pinned) if pinned.exists() else str(path)


_LOADED: dict[Path, tuple[ctypes.CDLL, LibraryCheck]] = {}
# The descriptor each library was loaded through stays open for the life of the process: `dlopen`
# recognises an already loaded library by its name, so a closed `/proc/self/fd/<n>` whose number is
# reused for the next library would hand back the first library's handle (seen on the H200: the fp8
# library "lacked" its symbols because the int8 library had been loaded as /proc/self/fd/53 before).
_LOADED_THROUGH: list[BinaryIO] = []


def load_path(path: Path) -> tuple[ctypes.CDLL, LibraryCheck]:
    """Verify the cached library at `path` (`verify_library`) and only then load it, once per process."""
    if path not in _LOADED:
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise KernelUnavailable(f"cannot open {path} ({exc.strerror}); delete it to force a rebuild") from None
        try:
            check = verify_library(path, fh)
            handle = ctypes.CDLL(_loadable_name(fh, path))
        except OSError as exc:
            fh.close()
            raise KernelUnavailable(f"cannot load {path} ({exc}); delete it to force a rebuild") from None
        except BaseException:
            fh.close()
            raise
        _LOADED_THROUGH.append(fh)
        _LOADED[path] = (handle, check)
    return _LOADED[path]


def load(lib: Library) -> tuple[ctypes.CDLL, LibraryCheck]:
    """Build if needed, verify and load `lib` (once per process); returns the handle and its check
    (`check.path` is the cached file, `check.sha256` the digest of the bytes loaded)."""
    return load_path(build(lib))

"""Where a result was computed: the toolkit's own version and commit, and the software and hardware.

Two runs are comparable only if these agree, so every manifest predicate carries them and the
identity contract compares them field by field. Everything here is read, never guessed: a value
that cannot be found is `None`, not a default. Nothing depends on the clock or on the host name,
so the same machine gives the same record on every call (the resume of an interrupted run relies
on that).
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

from pathlib import Path
from typing import Any

import alibi
from alibi.governance.provenance import commit_source_digest, is_source_file, source_digest

_GIT_TIMEOUT_S = 5


@dataclass(frozen=True)
class Toolkit:
    """This package: `version` (alibi.__version__), `git_commit` (HEAD of the source checkout it runs
    from, None outside one), `git_dirty` (tracked files differ from HEAD; None when unknown), and
    `source_digest` (`{"sha256"}` over the package's own files: identifies the code that ran even
    in a dirty tree or a copy without git history)."""

    name: str
    version: str
    git_commit: str | None
    git_dirty: bool | None
    source_digest: dict[str, str]


@dataclass(frozen=True)
class Environment:
    """Software and hardware: versions of Python/torch/triton/numpy, the CUDA runtime torch was
    built for, the NVIDIA driver, the GPUs torch sees (name and compute capability), the CPU model
    and `cpu_isa`, the CPU's instruction-set extensions that decide which int8 code path a CPU
    kernel takes (`INT8_ISA_FLAGS` present in /proc/cpuinfo; empty when unknown).

    Why the ISA: CPU results depend on the CPU. With the same pinned versions and digests, W8A8
    SmolLM2 perplexity was 23.242 on an AMD EPYC and 23.311 on an Intel Xeon: oneDNN and torch
    pick int8 and bf16 kernels by these flags (AVX2 without VNNI pairs products through a
    saturating 16-bit intermediate, AVX512-VNNI and AMX do not), and fp32/bf16 reductions change
    order with the vector width."""

    python: str
    platform: str
    cpu: str | None
    cpu_isa: tuple[str, ...]
    torch: str | None
    triton: str | None
    numpy: str | None
    cuda: str | None
    driver: str | None
    gpus: tuple[dict[str, str], ...]


def _git(root: Path, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def toolkit() -> Toolkit:
    """The running toolkit's version and, when it runs from a git checkout, its commit."""
    root = Path(alibi.__file__).resolve().parent.parent
    commit = dirty = None
    if (root / ".git").exists():
        commit = _git(root, "rev-parse", "--verify", "--quiet", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        dirty = None if status is None or commit is None else bool(status)
    return Toolkit("integer-alibi", alibi.__version__, commit or None, dirty, {"sha256": _source_sha256()})


@dataclass(frozen=True)
class WorkingTree:
    """Whether the code that runs is exactly a commit's: `clean` is True when the package's source
    digest equals that of HEAD's tree, False when they differ (`changed`: the package's source
    files git reports as modified, added or untracked), None outside a git checkout — a copy
    without history, which `alibi manifest provenance` ties to a commit afterwards. `head`: the
    commit compared with."""

    clean: bool | None
    changed: tuple[str, ...]
    head: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"clean": self.clean, "changed": list(self.changed), "head": self.head}


def working_tree() -> WorkingTree:
    """Compare the running package's sources with HEAD's (see `WorkingTree`)."""
    tk = toolkit()
    if tk.git_commit is None:
        return WorkingTree(None, (), None)
    root = Path(alibi.__file__).resolve().parent.parent
    package = Path(alibi.__file__).resolve().parent.name
    try:
        head_digest = commit_source_digest(root, tk.git_commit)
    except Exception:  # noqa: BLE001 - git unusable here: unknown, as outside a checkout
        return WorkingTree(None, (), tk.git_commit)
    if head_digest == tk.source_digest["sha256"]:
        return WorkingTree(True, (), tk.git_commit)
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "--", package + "/") or ""
    changed = tuple(line[3:] for line in status.splitlines()
                    if line[3:].startswith(package + "/") and is_source_file(line[3:][len(package) + 1:]))
    return WorkingTree(False, changed, tk.git_commit)


def _source_sha256() -> str:
    """The source digest of the running package's own files."""
    package = Path(alibi.__file__).resolve().parent
    files = {p.relative_to(package).as_posix(): p for p in package.rglob("*") if p.is_file()}
    return source_digest({rel: p.read_bytes() for rel, p in files.items() if is_source_file(rel)})


def _version(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except Exception:  # noqa: BLE001 - an absent or broken package is recorded as unknown
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# x86 (flags) and aarch64 (Features) extensions that select int8/bf16 code paths in oneDNN,
# FBGEMM and torch's CPU kernels.
INT8_ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                  "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2")


def cpu_isa(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The `INT8_ISA_FLAGS` the CPU reports (first processor's `flags` or `Features` line), sorted;
    `cpuinfo` is the text of /proc/cpuinfo (read when None; empty tuple when unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return tuple(sorted(f for f in INT8_ISA_FLAGS if f in present))
    return ()


def _driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def _gpus() -> tuple[dict[str, str], ...]:
    try:
        # deferred: keeps torch out of start-up
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    out = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        out.append({"name": torch.cuda.get_device_name(i), "capability": f"{major}.{minor}"})
    return tuple(out)


@functools.lru_cache(maxsize=1)
def environment() -> Environment:
    """The software and hardware this process runs on (computed once per process)."""
    try:
        # deferred: keeps torch out of start-up
        import torch
        cuda = torch.version.cuda
    except ImportError:
        cuda = None
    return Environment(
        python=platform.python_version(),
        platform=f"{platform.system()}-{platform.machine()}",
        cpu=_cpu_model(),
        cpu_isa=cpu_isa(),
        torch=_version("torch"),
        triton=_version("triton"),
        numpy=_version("numpy"),
        cuda=cuda,
        driver=_driver(),
        gpus=_gpus(),
    )


def toolkit_record() -> dict[str, Any]:
    """`toolkit()` as a plain dict, ready for a manifest predicate."""
    return asdict(toolkit())


def torch_flags() -> dict[str, Any] | None:
    """The process-wide torch settings that decide whether the libraries' kernels are deterministic, read
    now (they change when a model is loaded in one execution mode or the other, `alibi.model.execution`):
    deterministic algorithms (and whether they fill new tensors), cuBLAS's workspace setting, reduced-precision GEMM reductions, and which
    scaled-dot-product-attention back ends torch may pick. None without torch."""
    try:
        # deferred: keeps torch out of start-up
        import torch
    except ImportError:
        return None
    cuda = torch.backends.cuda
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "bf16_reduced_precision_reduction": cuda.matmul.allow_bf16_reduced_precision_reduction,
        "fp16_reduced_precision_reduction": cuda.matmul.allow_fp16_reduced_precision_reduction,
        "sdpa_backends": {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
                          "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()},
    }


def environment_record() -> dict[str, Any]:
    """`environment()` as a plain dict (GPU list as a JSON list), ready for a manifest predicate, with
    `torch_flags()` as they stand when the record is made."""
    record = asdict(environment())
    record["gpus"] = [dict(g) for g in record["gpus"]]
    record["cpu_isa"] = list(record["cpu_isa"])
    record["torch_flags"] = torch_flags()
    return record


__all__ = ["INT8_ISA_FLAGS", "Environment", "Toolkit", "WorkingTree", "cpu_isa", "environment", "environment_record",
           "toolkit", "toolkit_record", "torch_flags", "working_tree"]

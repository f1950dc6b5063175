"""The route by which the test suite compiles the CUTLASS sources (tests/kernels/test_cutlass_build.py).

A cold build of the three CUTLASS libraries costs about 1,400 s of CPU (12 translation units of 1–4
minutes of one core each: docs/testing.md), more than the rest of the suite. So:

* the libraries are cached (`~/.cache/alibi/kernels`, keyed by every source, flag and tool
  version): the compile tests run on them, since a cached library proves these exact sources
  compiled;
* not cached and `ALIBI_TEST_CUTLASS_BUILD=1` (CI sets it: .ci/run): the three builds start at
  the end of collection in one background process at low CPU priority (`nice`), so they overlap
  the rest of the suite, and the compile tests are moved to the end of the run, where they wait for
  the build (by the cache's own build lock) and then test what it produced;
* not cached and the variable unset (the README's test command on a fresh machine): the compile
  tests skip, and the run's summary says how to include them.

Without nvcc or the CUTLASS headers they skip, naming what is missing, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from interrupts import sigint_as_at_a_terminal

ENV = "ALIBI_TEST_CUTLASS_BUILD"
MODULE = "tests/kernels/test_cutlass_build.py"
HOW = (f"{ENV}=1 python3 -m pytest -q {MODULE} compiles them (about 12 minutes on 2 cores, once; what CI does), "
       "then every later run tests the cached libraries")
# The libraries the compile tests build, in the order their fixtures ask for them.
BUILD_SCRIPT = """
from alibi.kernels import nvcc
from alibi.kernels.cutlass import int8_library
from alibi.kernels.fp8 import fp8_library
for lib in (int8_library("sm90", "sm_90a"), fp8_library(), int8_library("sm80", "sm_80")):
    print(nvcc.build(lib), flush=True)
"""


def requested() -> bool:
    return os.environ.get(ENV) == "1"


def toolchain_problem() -> str | None:
    from alibi.kernels.cutlass import toolchain_reason

    return toolchain_reason()


def missing_libraries() -> list[str]:
    """Names of the compile tests' libraries not in the kernel cache for this toolchain."""
    from alibi.kernels import nvcc
    from alibi.kernels.cutlass import int8_library
    from alibi.kernels.fp8 import fp8_library

    libs = (int8_library("sm90", "sm_90a"), fp8_library(), int8_library("sm80", "sm_80"))
    return [lib.name for lib in libs if not nvcc.library_path(lib).is_file()]


def _niced_and_interruptible() -> None:
    """In the build child: low priority, and SIGINT as at a terminal (`stop` interrupts the build with it)."""
    os.nice(15)
    sigint_as_at_a_terminal()


class BackgroundBuild:
    """The three builds in one niced child process; its output goes to `log`."""

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="alibi-cutlass-build-", suffix=".log")
        self.log = Path(name)
        with os.fdopen(fd, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_niced_and_interruptible)

    def describe(self) -> str:
        state = "running" if self.proc.poll() is None else f"exited with {self.proc.returncode}"
        return f"background CUTLASS build (pid {self.proc.pid}, {state}; log {self.log})"

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self) -> None:
        """Interrupt the build and its nvcc processes (SIGINT to its own process group: the build removes its
        work folder on the way out, as after a Ctrl-C), then kill whatever is left after 30 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

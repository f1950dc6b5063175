"""The two ways a request can fail before any check runs, each with its own exit code.

A check that *fires* is not an error: it is a result (exit 1). These exceptions are for input the
toolkit refuses (exit 2) and for kernels that cannot run on this machine (exit 3). Messages name
the offending input and say what to do; the CLI prints them on one line.
"""


class InputError(ValueError):
    """Bad input or usage: a malformed tile, an unknown name, an unwritable path (exit code 2)."""

    exit_code = 2


class KernelUnavailable(RuntimeError):
    """A requested kernel cannot run here: no CUDA, no nvcc, a missing package (exit code 3)."""

    exit_code = 3

"""Children a test interrupts with SIGINT get it as at a terminal, however pytest was started.

A shell that starts pytest as a background job (`cmd &` without job control, a CI runner, `trap "" INT`) leaves
SIGINT ignored; an ignored signal stays ignored across fork and exec, and a Python started so installs no
KeyboardInterrupt handler, so the test's Ctrl-C would never arrive. `subprocess.Popen(...,
preexec_fn=sigint_as_at_a_terminal)` puts SIGINT back to its default disposition in the child before it executes.
"""

from __future__ import annotations

import signal


def sigint_as_at_a_terminal() -> None:
    """SIGINT at its default disposition (run in the child between fork and exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

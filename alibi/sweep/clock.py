"""Wall time per phase of a sweep, each phase fenced by device synchronization.

CUDA work is asynchronous: without a synchronize before and after, a phase's time would be billed to
whichever later call happens to wait for it. Every phase is therefore `synchronize → run →
synchronize`, so the kernel phases hold exactly the kernels' calls (their Python launch overhead
included — that is part of what a sweep pays for them) and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from alibi.sweep.records import SweepTiming, timing

T = TypeVar("T")
PHASES = ("operands", "warmup", "kernel_a", "kernel_b", "reference", "reference_check", "compare")


def synchronize(*devices: torch.device) -> None:
    for d in {d for d in devices if d.type == "cuda"}:
        torch.cuda.synchronize(d)


class PhaseClock:
    """Accumulates seconds per phase (`PHASES`) over a sweep that runs on `devices`."""

    def __init__(self, *devices: torch.device):
        self.devices = devices
        self.seconds = dict.fromkeys(PHASES, 0.0)
        synchronize(*devices)
        self.start = time.perf_counter()

    def timed(self, phase: str, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """Run `fn(*args)` as part of `phase`; returns its value and the seconds it took."""
        synchronize(*self.devices)
        t0 = time.perf_counter()
        value = fn(*args)
        synchronize(*self.devices)
        dt = time.perf_counter() - t0
        self.seconds[phase] += dt
        return value, dt

    def finish(self) -> SweepTiming:
        synchronize(*self.devices)
        return timing(time.perf_counter() - self.start, **self.seconds)

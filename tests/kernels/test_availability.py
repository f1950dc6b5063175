"""A kernel's availability is asked once per instance, not once per launch, and a refusal is never remembered."""

from __future__ import annotations

import pytest
from faulty_kernels import Reference

from alibi.errors import KernelUnavailable
from alibi.tiles.synthetic import synthetic_tiles


class Counted(Reference):
    """The reference kernel, counting how often it is asked whether it can run; `answers` scripts the replies."""

    name = "counted"

    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.asked = answers, 0

    def available(self) -> tuple[bool, str]:
        self.asked += 1
        ok = self.answers[min(self.asked, len(self.answers)) - 1]
        return ok, "ready" if ok else "the library is missing"


def test_a_kernel_found_available_is_not_asked_again_on_later_launches():
    kernel, tile = Counted([True]), synthetic_tiles("default", seed=0)[0]
    for _ in range(3):
        kernel.run(tile)
    assert kernel.asked == 1


def test_an_unavailable_answer_is_asked_again_and_refuses_every_launch_until_the_kernel_can_run():
    kernel, tile = Counted([False, False, True]), synthetic_tiles("default", seed=0)[0]
    for _ in range(2):
        with pytest.raises(KernelUnavailable, match="the library is missing"):
            kernel.run(tile)
    kernel.run(tile)
    kernel.run(tile)
    assert kernel.asked == 3

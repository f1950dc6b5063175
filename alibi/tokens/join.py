"""Joining two arms position by position: the flips, arm A's margins, and what could not be joined.

The join key is (prompt, position): (window, position) for alibi arms and the per-prompt list,
(prompt_sha, pos) for envelopes. It fails closed on

- a key that occurs twice in one arm (which of the two would be the arm's answer is unknowable),
- a joined key where the arms saw different text: different `prompt_sha256`, or a different
  forced token — compared wherever both arms carry the field,
- arms keyed differently (an envelope against a window-keyed arm: a prompt sha and a window
  index name prompts in different ways, so nothing could be joined soundly),
- no joined position at all.

Keys present in one arm only are counted (`only_a`, `only_b`) and reported, not silently
dropped. A flip at a joined key is `top1_id` of A ≠ `top1_id` of B. Joined positions keep A's
order; the prompts are numbered 0, 1, … in the order they first appear in A among the joined
positions (`cluster`), which is the unit of every prompt-level resampling and of the
calibration split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alibi.errors import InputError
from alibi.tokens.steps import ENVELOPE_SHAPE, ArmSteps, Step


@dataclass(frozen=True)
class Joined:
    """Two arms joined (module docstring). Arrays have one entry per joined position, in A's order.

    prompts: the prompt keys in cluster order; cluster: the prompt number of each position;
    position, margin_a, margin_b, flip: per position; logits_compared: positions where both
    arms carry `logits_sha256`; logits_identical: of those, how many are equal; only_a, only_b:
    keys in one arm only.
    """

    prompts: tuple[int | str, ...]
    cluster: np.ndarray = field(repr=False)
    position: np.ndarray = field(repr=False)
    margin_a: np.ndarray = field(repr=False)
    margin_b: np.ndarray = field(repr=False)
    flip: np.ndarray = field(repr=False)
    logits_compared: int
    logits_identical: int
    only_a: int
    only_b: int

    @property
    def n_positions(self) -> int:
        return int(self.flip.size)


def _show_key(arm: ArmSteps, key: tuple[int | str, int]) -> str:
    prompt, position = key
    return f"(prompt_sha {prompt}, pos {position})" if arm.shape == ENVELOPE_SHAPE else \
        f"(window {prompt}, position {position})"


def _index(arm: ArmSteps) -> dict[tuple[int | str, int], Step]:
    index: dict[tuple[int | str, int], Step] = {}
    for step in arm.steps:
        if step.key in index:
            raise InputError(f"{arm.records_file}: the key {_show_key(arm, step.key)} occurs twice; each scored "
                             "position must appear once (the file is damaged or two runs were concatenated)")
        index[step.key] = step
    return index


def require_same_keying(a: ArmSteps, b: ArmSteps) -> None:
    """InputError unless both arms name prompts the same way (both by prompt sha, or both by window index)."""
    if (a.shape == ENVELOPE_SHAPE) != (b.shape == ENVELOPE_SHAPE):
        raise InputError(f"{a.path} ({a.shape}) and {b.path} ({b.shape}) name prompts differently (prompt_sha "
                         "against window index) and cannot be joined; compare two envelopes, or two window-keyed arms")


def join_arms(a: ArmSteps, b: ArmSteps) -> Joined:
    """Join arm `a` with arm `b` (module docstring); InputError for every fail-closed case."""
    require_same_keying(a, b)
    ia, ib = _index(a), _index(b)
    joined = [k for k in ia if k in ib]
    if not joined:
        raise InputError(f"{a.path} and {b.path} share no scored position: they were run on different windows "
                         "or prompt sets; replay both arms on the same prompts")
    for key in joined:
        sa, sb = ia[key], ib[key]
        for name in ("prompt_sha256", "forced_id"):
            va, vb = getattr(sa, name), getattr(sb, name)
            if va is not None and vb is not None and va != vb:
                raise InputError(f"{a.path} and {b.path} disagree at {_show_key(a, key)}: {name} is {va!r} in A and "
                                 f"{vb!r} in B, so the arms did not see the same text; replay both on one prompt set")
    prompts = tuple(dict.fromkeys(k[0] for k in joined))
    number = {p: i for i, p in enumerate(prompts)}
    steps_a = [ia[k] for k in joined]
    steps_b = [ib[k] for k in joined]
    compared = [(x.logits_sha256, y.logits_sha256) for x, y in zip(steps_a, steps_b)
                if x.logits_sha256 is not None and y.logits_sha256 is not None]
    return Joined(
        prompts=prompts,
        cluster=np.array([number[k[0]] for k in joined], dtype=np.int64),
        position=np.array([k[1] for k in joined], dtype=np.int64),
        margin_a=np.array([s.margin for s in steps_a], dtype=np.float64),
        margin_b=np.array([s.margin for s in steps_b], dtype=np.float64),
        flip=np.array([x.top1_id != y.top1_id for x, y in zip(steps_a, steps_b)], dtype=bool),
        logits_compared=len(compared),
        logits_identical=sum(x == y for x, y in compared),
        only_a=len(ia) - len(joined),
        only_b=len(ib) - len(joined),
    )


__all__ = ["Joined", "join_arms", "require_same_keying"]

"""Check 7's input: a flips.json read for `conform --replay`, its digest, and the pair it belongs to."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokens.builders import write_flips

from alibi.conform.token_risk import DEFAULT_FLIP_THRESHOLD, load_replay
from alibi.errors import InputError
from alibi.governance.manifest import sha256_file
from alibi.tokens.flips import analyze_flips

MARGINS = [[0.1, 2.0, 5.0, 0.3], [4.0, 0.2, 3.0, 6.0]]
FLIPS = [[True, False, False, False], [False, True, False, False]]  # 2 of 8: rate 0.25
FIXTURES = Path(__file__).parents[1] / "tokens" / "fixtures"


def test_a_replay_carries_the_analysis_flip_rate_the_file_digest_and_the_default_bound(tmp_path):
    flips = write_flips(tmp_path, MARGINS, FLIPS)
    replay = load_replay(flips.parent)  # the analysis folder works as well as the file
    assert (replay.flip_rate, replay.n_flips, replay.n_positions) == (0.25, 2, 8)
    assert replay.path == str(flips) and replay.sha256 == sha256_file(flips)
    assert replay.bound == DEFAULT_FLIP_THRESHOLD == 0.05 and replay.verified
    assert replay.verdict().fired
    assert load_replay(flips, 0.25).verdict().status == "passed"


def test_the_pair_check_ignores_the_order_of_the_arms_but_not_the_kernels(tmp_path):
    replay = load_replay(write_flips(tmp_path, MARGINS, FLIPS))
    replay.require_pair("emulator:a_then_w", "emulator:w_then_a")
    with pytest.raises(InputError, match="replay the pair under test"):
        replay.require_pair("emulator:a_then_w", "torch-cpu")


def test_a_replay_of_foreign_records_cannot_be_tied_to_a_pair_and_says_so(tmp_path):
    analyze_flips(FIXTURES / "envelope_arm_a.json", FIXTURES / "envelope_arm_b.json", tmp_path / "f", bootstrap=10)
    replay = load_replay(tmp_path / "f")
    replay.require_pair("cutlass", "triton")  # nothing to compare against: not refused ...
    assert replay.as_dict()["pair_checked"] is False  # ... and recorded as unchecked


@pytest.mark.parametrize("bound", [-0.01, 1.01, float("nan"), True])
def test_a_bound_outside_zero_to_one_is_refused(tmp_path, bound):
    with pytest.raises(InputError, match="must be a flip rate between 0 and 1"):
        load_replay(write_flips(tmp_path, MARGINS, FLIPS), bound)

"""Capture inputs refused where they enter (alibi.model.capture)."""

from __future__ import annotations

import pytest
import torch

from alibi.errors import InputError
from alibi.model.capture import capture_overhead, capture_to_folder


@pytest.mark.parametrize("repeats", [0, -1, 2.5, True])
def test_capture_overhead_with_no_timed_repeat_is_refused(repeats):
    """Guards: `capture-overhead --repeats 0` took the median of no timings (StatisticsError)."""
    class NoModel:  # never reached: the repeats are checked first
        device = torch.device("cpu")

    with pytest.raises(InputError, match="--repeats must be a positive integer"):
        capture_overhead(NoModel(), torch.zeros((1, 4), dtype=torch.long), repeats)


@pytest.mark.parametrize("where", ["model", "prompts"])
def test_a_capture_folder_inside_the_model_or_the_prompts_is_refused(tmp_path, where):
    model, prompts = tmp_path / "model", tmp_path / "prompts"
    model.mkdir()
    prompts.mkdir()
    out = (model if where == "model" else prompts) / "tiles"
    with pytest.raises(InputError, match=f"the capture folder overlaps --{where}"):
        capture_to_folder(model, prompts, out)
    assert not out.exists()


@pytest.mark.parametrize("repeats", ["0", "-3"])
def test_capture_overhead_refuses_no_timed_repeat_before_loading_or_printing_anything(tmp_path, capsys, repeats):
    """Issue 26: `--repeats 0` printed its progress line ("timing 0 forwards ...") before the error; the
    count is now checked first, before the model or the prompts are read."""
    from alibi.cli import main

    assert main(["capture-overhead", "--model", str(tmp_path / "no-model"), "--prompts", str(tmp_path / "no-set"),
                 "--repeats", repeats]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and "--repeats must be a positive integer" in err[0], err

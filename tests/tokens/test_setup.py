"""Bad input to the replay commands: one line, exit 2 (3 for an unavailable kernel), nothing written, inputs untouched."""

from __future__ import annotations

import pytest

from alibi.cli import main
from alibi.governance.manifest import digest_tree
from alibi.tokens.setup import resolve_span

from .conftest import needs_model_extra


class _Set:
    windows, tokens = 3, 48


def test_default_span_scores_the_second_half_of_every_window():
    span = resolve_span(_Set(), None, None, None, "SET")
    assert (span.windows, span.context, span.positions, span.fed) == ((0, 1, 2), 24, 24, 48)


def test_span_may_end_exactly_at_the_last_token_of_the_window():
    assert resolve_span(_Set(), 2, 47, 1, "SET").fed == 48


def _tf(tiny, *extra):
    return ["replay", "teacher-forced", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"), *extra]


def _greedy(tiny, *extra):
    return ["replay", "greedy", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"), *extra]


def _pvd(tiny, *extra):
    return ["replay", "prefill-vs-decode", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"), *extra]


BAD = {
    "window index out of range": (_tf, ["--kernel", "torch-cpu", "--windows", "4"], "window index 3 is out of range"),
    "no windows": (_tf, ["--kernel", "torch-cpu", "--windows", "0"], "--windows 0"),
    "context plus positions past the window": (_tf, ["--kernel", "torch-cpu", "--context", "40", "--positions", "9"],
                                               "exceeds the 48 tokens per window"),
    "no context": (_tf, ["--kernel", "torch-cpu", "--context", "0", "--positions", "4"], "--context 0"),
    "negative positions": (_tf, ["--kernel", "torch-cpu", "--positions", "-1"], "--positions -1"),
    "pair form missing arm b": (_tf, ["--kernel-a", "torch-cpu"], "--kernel-a and --kernel-b go together"),
    "both forms at once": (_tf, ["--kernel", "torch-cpu", "--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu"],
                           "give one form"),
    "pair form window out of range": (_tf, ["--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu", "--windows", "9"],
                                      "window index 3 is out of range"),
    "unknown kernel": (_tf, ["--kernel", "no-such-kernel"], "no-such-kernel"),
    "greedy prompt longer than a window": (_greedy, ["--kernel", "torch-cpu", "--prompt-tokens", "49",
                                                     "--new-tokens", "2"], "--prompt-tokens 49"),
    "greedy no new tokens": (_greedy, ["--kernel", "torch-cpu", "--prompt-tokens", "8", "--new-tokens", "0"],
                             "--new-tokens 0"),
    "greedy batch of zero": (_greedy, ["--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu", "--prompt-tokens", "8",
                                       "--new-tokens", "2", "--batch-size", "0"], "--batch-size 0"),
    "greedy window out of range": (_greedy, ["--kernel", "torch-cpu", "--prompt-tokens", "8", "--new-tokens", "2",
                                             "--windows", "5"], "window index 3 is out of range"),
    "greedy zero runs": (_greedy, ["--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu", "--prompt-tokens", "8",
                                   "--new-tokens", "2", "--runs", "0"], "--runs 0"),
    "prefill-vs-decode past the window": (_pvd, ["--kernel", "torch-cpu", "--context", "30", "--positions", "19"],
                                          "exceeds the 48 tokens per window"),
    "prefill-vs-decode no positions": (_pvd, ["--kernel", "torch-cpu", "--positions", "0"], "--positions 0"),
}


@needs_model_extra
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_exits_2_with_one_line_naming_it_and_writes_nothing(case, tiny, tmp_path, capsys):
    build, extra, expected = BAD[case]
    before = {d: digest_tree(tiny / d) for d in ("w8a8", "set")}
    out = tmp_path / "out"
    assert main(build(tiny, *extra, "--out", str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert {d: digest_tree(tiny / d) for d in ("w8a8", "set")} == before


@needs_model_extra
@pytest.mark.parametrize("where", ["inside the checkpoint", "the prompt set itself", "around the prompt set"])
def test_output_overlapping_an_input_is_refused_and_the_input_left_unchanged(where, tiny, tmp_path, capsys):
    import shutil

    root = tmp_path / "copy"
    for d in ("w8a8", "set"):
        shutil.copytree(tiny / d, root / d)
    out = {"inside the checkpoint": root / "w8a8" / "replay", "the prompt set itself": root / "set",
           "around the prompt set": root}[where]
    before = {d: digest_tree(root / d) for d in ("w8a8", "set")}
    code = main(["replay", "teacher-forced", "--model", str(root / "w8a8"), "--prompts", str(root / "set"),
                 "--kernel", "torch-cpu", "--out", str(out), "--overwrite"])
    assert code == 2 and "overlaps" in capsys.readouterr().err
    assert {d: digest_tree(root / d) for d in ("w8a8", "set")} == before
    assert not (root / "w8a8" / "replay").exists()


@needs_model_extra
def test_existing_output_is_kept_without_overwrite_and_a_foreign_folder_even_with_it(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = _tf(tiny, "--kernel", "torch-cpu", "--windows", "1", "--positions", "2", "--out", str(out))
    assert main(args) == 2 and "already exists" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 2 and "holds 'notes.txt', which alibi did not write" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@needs_model_extra
def test_a_kernel_that_cannot_run_here_exits_3_and_writes_nothing(tiny, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("cutlass can run on this machine")
    out = tmp_path / "out"
    assert main(_tf(tiny, "--kernel", "cutlass", "--out", str(out))) == 3
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not out.exists()

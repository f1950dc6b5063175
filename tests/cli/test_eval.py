"""`alibi eval --out` naming an existing folder: one InputError, the folder untouched."""

from __future__ import annotations

import argparse

import pytest

from alibi.errors import InputError


def test_eval_out_naming_an_existing_folder_is_an_input_error_not_is_a_directory_error(tmp_path):
    """Guards: the final atomic write raised IsADirectoryError (a traceback) after the whole evaluation."""
    from alibi.cli.eval import _emit

    (tmp_path / "ppl").mkdir()
    with pytest.raises(InputError, match="ppl: is a folder"):
        _emit(argparse.Namespace(out=tmp_path / "ppl"), {"perplexity": 1.0})
    assert list((tmp_path / "ppl").iterdir()) == []


@pytest.mark.parametrize("where", ["folder", "inside-model"])
def test_eval_refuses_a_bad_out_before_loading_anything(tmp_path, capsys, where):
    """issue 16: `eval --out` naming a folder, or a file inside the checkpoint, was refused only after
    the whole evaluation had run; now before the prompt set or the model is even read (the prompt
    set given here does not exist, so reaching it would be a different error)."""
    from alibi.cli import main

    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "out" if where == "folder" else model / "ppl.json"
    if where == "folder":
        out.mkdir()
    rc = main(["eval", "perplexity", "--model", str(model), "--prompts", str(tmp_path / "missing"),
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and ("is a folder" in err or "overlaps --model" in err), err
    assert list(model.iterdir()) == []

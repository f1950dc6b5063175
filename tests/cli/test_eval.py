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

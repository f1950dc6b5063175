"""Hostile prompt sets (alibi.model.prompts.load_prompt_set): one line, exit 2, for every consumer."""

from __future__ import annotations

import pytest
import torch
from hostile import main_one_line
from safetensors.torch import save_file

from alibi.cli import main
from alibi.errors import InputError
from alibi.model.prompts import load_prompt_set


def _hand_pinned(folder, ids: torch.Tensor, capsys, tokenizer: bool = False):
    folder.mkdir()
    save_file({"input_ids": ids}, str(folder / "tokens.safetensors"))
    (folder / "windows.jsonl").write_text("{}\n")
    args = ["manifest", "write", str(folder), "--kind", "prompts"]
    if tokenizer:
        (folder.parent / "tokenizer.json").write_text("{}")
        args += ["--input", f"tokenizer={folder.parent / 'tokenizer.json'}"]
    assert main(args) == 0
    capsys.readouterr()
    return folder


def test_a_prompt_set_pinned_by_hand_without_a_tokenizer_input_is_one_line(tmp_path, capsys):
    """Guards: `predicate["inputs"]["tokenizer"]` raised KeyError (a traceback) for a set pinned with
    `alibi manifest write DIR --kind prompts` and no --input tokenizer=…"""
    folder = _hand_pinned(tmp_path / "p", torch.zeros((2, 8), dtype=torch.int32), capsys)
    with pytest.raises(InputError, match="records no tokenizer input"):
        load_prompt_set(folder)
    main_one_line(capsys, ["prompts", "show", str(folder)], "records no tokenizer input")


@pytest.mark.parametrize("shape", [(8,), (1, 2, 4), (0, 8), (2, 0)])
def test_a_prompt_set_whose_input_ids_are_not_n_by_t_is_one_line(tmp_path, capsys, shape):
    """Guards: 1-D input_ids made `ids.shape[1]` (PromptSet.tokens) raise IndexError downstream."""
    folder = _hand_pinned(tmp_path / "p", torch.zeros(shape, dtype=torch.int32), capsys, tokenizer=True)
    with pytest.raises(InputError, match=r"a prompt set holds int32 token ids \[N windows, T tokens\]"):
        load_prompt_set(folder)
    main_one_line(capsys, ["prompts", "show", str(folder)], "input_ids is I32")


def test_float_or_negative_token_ids_are_refused(tmp_path, capsys):
    folder = _hand_pinned(tmp_path / "f", torch.zeros((2, 4), dtype=torch.float32), capsys, tokenizer=True)
    with pytest.raises(InputError, match="input_ids is F32"):
        load_prompt_set(folder)
    folder = _hand_pinned(tmp_path / "n", torch.full((2, 4), -3, dtype=torch.int32), capsys, tokenizer=True)
    with pytest.raises(InputError, match="negative token ids"):
        load_prompt_set(folder)


def test_a_prompt_set_written_over_its_own_tokenizer_folder_is_refused(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    model = tmp_path / "model"
    model.mkdir()
    main_one_line(capsys, ["prompts", "build", "--text", str(text), "--tokenizer", str(model), "--out",
                           str(model / "prompts")], "the prompt set overlaps --tokenizer")
    assert list(model.iterdir()) == []

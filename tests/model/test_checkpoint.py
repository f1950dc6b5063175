"""Hostile checkpoint folders (alibi.model.checkpoint): a shard index naming files outside the
folder, malformed index values, config.json fields of the wrong type or of impossible size, and a
bad `re:` pattern in `quantization_config.ignore` — each one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from hostile import GIB, assert_one_line_error, main_one_line, run_alibi, run_python

from alibi.errors import InputError
from alibi.model.checkpoint import read_config, read_tensors, weight_files
from alibi.model.compressed_tensors import read_w8a8
from model.builders import LLM_COMPRESSOR_W8A8, TINY_LLAMA, tiny_dense_tensors, write_dense, write_llm_compressor_style

INDEX = "model.safetensors.index.json"


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    folder = tmp_path / "w8a8"
    write_llm_compressor_style(folder, tiny_dense_tensors(seed=3), shards=2)
    return folder


def _move_shard_out(folder: Path, target: str) -> str:
    """Move the second shard to `target` (relative to the folder, may leave it) and point the index there."""
    index = json.loads((folder / INDEX).read_text())
    moved = "model-00002-of-00002.safetensors"
    destination = (folder / target) if not Path(target).is_absolute() else Path(target)
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(folder / moved, destination)
    index["weight_map"] = {k: (target if v == moved else v) for k, v in index["weight_map"].items()}
    (folder / INDEX).write_text(json.dumps(index))
    return target


@pytest.mark.parametrize("where", ["../elsewhere/shard.safetensors", "ABSOLUTE", ".hidden/shard.safetensors",
                                   "sub/../../x.safetensors"])
def test_pow2_rewrite_refuses_an_index_entry_outside_the_folder_naming_it_and_writes_nothing(sharded, tmp_path, where):
    """Guards the silent wrong output: an index mapping tensors to `../elsewhere/…` (or an absolute
    path) was read from outside the folder; pow2-rewrite then left that shard's scales unchanged,
    exited 0 and wrote a manifest that verified."""
    target = str(tmp_path / "abs" / "shard.safetensors") if where == "ABSOLUTE" else where
    _move_shard_out(sharded, target)
    out = tmp_path / "pow2"
    proc = run_alibi(["pow2-rewrite", str(sharded), str(out), "--mode", "ceil", "--keep-weights"])
    line = assert_one_line_error(proc, INDEX, "a shard index may only name files inside its own folder")
    assert repr(target) in line
    assert not out.exists()
    with pytest.raises(InputError, match="inside its own folder"):
        read_tensors(sharded)


def test_shards_in_a_subfolder_are_inside_the_folder_and_are_rewritten(sharded, tmp_path):
    _move_shard_out(sharded, "shards/part-2.safetensors")
    assert [p.relative_to(sharded).as_posix() for p in weight_files(sharded)] == [
        "model-00001-of-00002.safetensors", "shards/part-2.safetensors"]
    out = tmp_path / "pow2"
    proc = run_alibi(["pow2-rewrite", str(sharded), str(out), "--mode", "ceil", "--keep-weights"])
    assert proc.returncode == 0, proc.stderr
    from alibi.exact.numerics import is_pow2

    ckpt = read_w8a8(out)
    assert len(ckpt.linears) == 14 and all(bool(is_pow2(lin.scale).all()) for lin in ckpt.linears.values())


@pytest.mark.parametrize("value", [7, None, ["a.safetensors"], {"f": 1}, ""])
def test_an_index_value_that_is_not_a_file_name_is_one_line(sharded, tmp_path, capsys, value):
    """Guards: `sorted(set(weight_map.values()))` over ints/lists raised TypeError (a traceback)."""
    index = json.loads((sharded / INDEX).read_text())
    first = min(index["weight_map"])
    index["weight_map"][first] = value
    (sharded / INDEX).write_text(json.dumps(index))
    main_one_line(capsys, ["pow2-rewrite", str(sharded), str(tmp_path / "o"), "--mode", "ceil", "--keep-weights"],
                  INDEX, first)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("field,value,expected", [
    ("hidden_size", "576", "hidden_size is '576', expected a positive integer"),
    ("num_hidden_layers", 2.0, "num_hidden_layers is 2.0, expected a positive integer"),
    ("vocab_size", 2e9, "vocab_size is 2000000000.0, expected a positive integer"),
    ("rms_norm_eps", "tiny", "rms_norm_eps is 'tiny', expected a finite number"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings is 'yes', expected true or false"),
    ("architectures", "LlamaForCausalLM", "architectures is 'LlamaForCausalLM', expected a list"),
    ("quantization_config", [1], "quantization_config is [1], expected an object"),
])
def test_a_config_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, capsys, field, value, expected):
    """Guards: transformers raised TypeError deep inside model construction for e.g. `"hidden_size": "576"`."""
    folder = write_dense(tmp_path / "bf16", tiny_dense_tensors(), dict(TINY_LLAMA, **{field: value}))
    with pytest.raises(InputError, match="config.json: " + expected.replace("[", r"\[").replace("]", r"\]")):
        read_config(folder)
    main_one_line(capsys, ["pow2-rewrite", str(folder), str(tmp_path / "o"), "--mode", "ceil", "--keep-weights"],
                  "config.json", field)


def test_a_config_with_vocab_size_2e9_is_refused_before_the_model_is_built_under_a_2_gib_limit(tmp_path):
    """Guards: `vocab_size: 2000000000` made transformers allocate a 2·10⁹ × hidden embedding (TBs)
    before any shape was compared. Now config sizes are checked against the shards' headers first."""
    folder = write_dense(tmp_path / "bf16", tiny_dense_tensors(), dict(TINY_LLAMA, vocab_size=2_000_000_000))
    code = textwrap.dedent(f"""
        from alibi.errors import InputError
        from alibi.model.runner import load_model
        try:
            load_model({str(folder)!r})
        except InputError as exc:
            print("refused:", exc)
    """)
    proc = run_python(code, memory_limit=2 * GIB)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "vocab_size = 2000000000, larger than every stored tensor dimension" \
        in proc.stdout, proc.stdout


@pytest.mark.parametrize("field,value,fragment", [
    ("vocab_size", 319, "the embedding is [320, 64] but config.json says vocab_size × hidden_size = [319, 64]"),
    ("num_hidden_layers", 3, "config.json says num_hidden_layers = 3"),
    ("intermediate_size", 127, "mlp.gate_proj.weight is [128, 64] but config.json says intermediate_size = 127"),
])
def test_config_dimensions_that_disagree_with_the_stored_shapes_are_refused(tmp_path, field, value, fragment):
    folder = write_dense(tmp_path / "bf16", tiny_dense_tensors(), dict(TINY_LLAMA, **{field: value}))
    with pytest.raises(InputError) as info:
        read_tensors(folder)
    assert fragment in str(info.value)


@pytest.mark.parametrize("pattern", ["re:(unclosed", "re:*lm_head", "re:[z-a]"])
def test_a_bad_re_pattern_in_quantization_ignore_is_one_line_naming_it(tmp_path, capsys, pattern):
    """Guards: re.match raised re.error (a traceback) while matching module names against `ignore`."""
    qc = json.loads(json.dumps(LLM_COMPRESSOR_W8A8))
    qc["ignore"] = ["lm_head", pattern]
    folder = tmp_path / "w8a8"
    write_llm_compressor_style(folder, tiny_dense_tensors(), quantization_config=qc)
    with pytest.raises(InputError, match="quantization_config.ignore"):
        read_w8a8(folder)
    main_one_line(capsys, ["pow2-rewrite", str(folder), str(tmp_path / "o"), "--mode", "ceil", "--keep-weights"],
                  "quantization_config.ignore", pattern)

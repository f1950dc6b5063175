"""`alibi pow2-rewrite`: power-of-two weight scales, everything else untouched, bad input refused.

Checkpoints are built by hand (tests/model/builders.py) in two layouts: llm-compressor's (sharded,
with an index) and alibi's own writer (one file). Expected values are computed here with plain
torch, not through alibi.exact.quant.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model.builders import (
    LLM_COMPRESSOR_W8A8,
    TINY_LLAMA,
    tiny_dense_tensors,
    write_dense,
    write_llm_compressor_style,
)
from safetensors.torch import load_file, save_file

from alibi.cli import main
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bitwise_equal, is_pow2, pow2_round
from alibi.governance.manifest import digest_tree, read_manifest, verify_files
from alibi.io import atomic
from alibi.model.checkpoint import read_tensors
from alibi.model.compressed_tensors import quantize_dense, read_w8a8, write_w8a8

REPO = Path(__file__).resolve().parents[2]
MODES = ("nearest", "ceil", "floor")
SIDE_FILES = {"tokenizer.json": b'{"model": "a tokenizer, byte for byte"}\n', "generation_config.json": b'{"x": 1}'}
POW2_ROW = ("model.layers.1.mlp.up_proj", 5)  # a channel whose absmax/127.5 is exactly 2^-7


def _dense_tensors() -> dict[str, torch.Tensor]:
    t = tiny_dense_tensors(seed=7)
    name, row = POW2_ROW
    w = t[f"{name}.weight"].clone()
    w[row] = 0
    w[row, 3] = 127.5 / 128  # = 255/256, exact in bf16; absmax/127.5 = 2^-7 in any dtype
    t[f"{name}.weight"] = w
    return t


def _with_side_files(folder: Path) -> Path:
    for name, content in SIDE_FILES.items():
        (folder / name).write_bytes(content)
    return folder


@pytest.fixture
def dense_dir(tmp_path: Path) -> Path:
    return _with_side_files(write_dense(tmp_path / "bf16", _dense_tensors()))


def _alibi_layout(folder: Path, dense_dir: Path, scale_dtype: torch.dtype = torch.bfloat16) -> Path:
    ckpt = quantize_dense(TINY_LLAMA, read_tensors(dense_dir), scale_dtype=scale_dtype)
    with atomic.staged_dir(folder) as stage:
        write_w8a8(ckpt, stage, copy_from=dense_dir)
    return folder


def _llm_compressor_layout(folder: Path, dense_dir: Path) -> Path:
    write_llm_compressor_style(folder, read_tensors(dense_dir), shards=2)
    return _with_side_files(folder)


@pytest.fixture(params=["llm-compressor", "alibi"])
def w8a8_dir(request, tmp_path: Path, dense_dir: Path) -> Path:
    build = _llm_compressor_layout if request.param == "llm-compressor" else _alibi_layout
    return build(tmp_path / "w8a8", dense_dir)


def _rewrite(src: Path, out: Path, mode: str, dense: Path | None, *extra: str) -> int:
    policy = ["--keep-weights"] if dense is None else ["--requantize-from", str(dense)]
    return main(["pow2-rewrite", str(src), str(out), "--mode", mode, *policy, *extra])


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def _scale_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k for k in tensors if k.endswith(".weight_scale"))


# --- what the rewrite produces ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("requantize", [False, True], ids=["keep-weights", "requantize"])
def test_every_rewritten_scale_is_an_exact_power_of_two_of_the_requested_rounding(tmp_path, w8a8_dir, dense_dir,
                                                                                  mode, requantize):
    assert _rewrite(w8a8_dir, tmp_path / "out", mode, dense_dir if requantize else None) == 0
    before, after = read_tensors(w8a8_dir), read_tensors(tmp_path / "out")
    names = _scale_names(before)
    assert names and names == _scale_names(after)
    for name in names:
        old, new = before[name], after[name]
        assert new.dtype == old.dtype and new.shape == old.shape  # stored as the checkpoint records it
        assert bool(is_pow2(new).all())
        assert torch.equal(new.to(torch.float64), pow2_round(old.to(torch.float64), mode))
        ratio = [math.log2(n / o) for n, o in zip(new.double().flatten().tolist(), old.double().flatten().tolist())]
        bounds = {"nearest": (-0.5, 0.5), "ceil": (0.0, 1.0), "floor": (-1.0, 0.0)}[mode]
        assert all(bounds[0] <= r <= bounds[1] for r in ratio)
        assert not (mode == "ceil" and any(r == 1.0 for r in ratio)) and not (mode == "floor" and -1.0 in ratio)


def test_keep_weights_leaves_every_other_tensor_and_file_byte_identical(tmp_path, w8a8_dir):
    assert _rewrite(w8a8_dir, tmp_path / "out", "nearest", None) == 0
    before, after = read_tensors(w8a8_dir), read_tensors(tmp_path / "out")
    assert set(before) == set(after)
    for name in before:
        if not name.endswith(".weight_scale"):
            assert before[name].dtype == after[name].dtype and _bits(before[name]) == _bits(after[name]), name
    _assert_side_files_identical(w8a8_dir, tmp_path / "out")


def test_requantize_changes_nothing_but_the_quantized_weights_and_their_scales(tmp_path, w8a8_dir, dense_dir):
    assert _rewrite(w8a8_dir, tmp_path / "out", "ceil", dense_dir) == 0
    before, after = read_tensors(w8a8_dir), read_tensors(tmp_path / "out")
    quantized = {k.removesuffix("_scale") for k in _scale_names(before)} | set(_scale_names(before))
    assert set(before) == set(after)
    for name in set(before) - quantized:
        assert before[name].dtype == after[name].dtype and _bits(before[name]) == _bits(after[name]), name
    assert any(_bits(before[k]) != _bits(after[k]) for k in quantized if not k.endswith("_scale"))
    _assert_side_files_identical(w8a8_dir, tmp_path / "out")


def _assert_side_files_identical(src: Path, out: Path) -> None:
    weights = {n for n in _files(src) if n.endswith(".safetensors")}
    src_files, out_files = _files(src), _files(out)
    assert set(out_files) == (set(src_files) | {"manifest.json"})  # same layout: shards and index kept
    for name, content in src_files.items():
        if name not in weights and name != "manifest.json":
            assert out_files[name] == content, name


@pytest.mark.parametrize("mode", MODES)
def test_requantized_weights_equal_an_independent_requantization(tmp_path, w8a8_dir, dense_dir, mode):
    assert _rewrite(w8a8_dir, tmp_path / "out", mode, dense_dir) == 0
    dense, after = read_tensors(dense_dir), read_tensors(tmp_path / "out")
    for scale_name in _scale_names(after):
        module = scale_name.removesuffix(".weight_scale")
        s = after[scale_name].float().reshape(-1, 1)
        expected = torch.clamp(torch.round(dense[f"{module}.weight"].float() / s), -128, 127).to(torch.int8)
        assert torch.equal(after[f"{module}.weight"], expected), module


def test_ceil_requantization_saturates_only_weights_the_original_scale_saturated(tmp_path, w8a8_dir, dense_dir):
    assert _rewrite(w8a8_dir, tmp_path / "out", "ceil", dense_dir) == 0
    dense, before = read_tensors(dense_dir), read_tensors(w8a8_dir)
    layers = read_manifest(tmp_path / "out").predicate["parameters"]["pow2_rewrite"]["layers"]
    for layer in layers:
        w = dense[f"{layer['name']}.weight"].float()
        r = torch.round(w / before[f"{layer['name']}.weight_scale"].float().reshape(-1, 1))
        assert layer["weights_saturated"] <= int(((r > 127) | (r < -128)).sum())


def test_floor_requantization_saturates_the_largest_weights_and_counts_them(tmp_path, w8a8_dir, dense_dir):
    assert _rewrite(w8a8_dir, tmp_path / "out", "floor", dense_dir) == 0
    dense, after = read_tensors(dense_dir), read_tensors(tmp_path / "out")
    rewrite = read_manifest(tmp_path / "out").predicate["parameters"]["pow2_rewrite"]
    expected = 0
    for layer in rewrite["layers"]:
        s = after[f"{layer['name']}.weight_scale"].float().reshape(-1, 1)
        r = torch.round(dense[f"{layer['name']}.weight"].float() / s)
        count = int(((r > 127) | (r < -128)).sum())
        assert layer["weights_saturated"] == count
        expected += count
    assert rewrite["weights_saturated"] == expected > 0


def test_manifest_records_input_digests_mode_policy_and_per_layer_counts(tmp_path, w8a8_dir, dense_dir):
    out = tmp_path / "out"
    assert _rewrite(w8a8_dir, out, "nearest", dense_dir) == 0
    manifest = read_manifest(out)
    assert verify_files(out) == []
    assert manifest.kind == "checkpoint"
    inputs = manifest.predicate["inputs"]
    assert inputs["checkpoint"]["digest"]["sha256"] == digest_tree(w8a8_dir)
    assert inputs["dense_checkpoint"]["digest"]["sha256"] == digest_tree(dense_dir)
    rewrite = manifest.predicate["parameters"]["pow2_rewrite"]
    assert (rewrite["mode"], rewrite["weight_policy"], rewrite["scale_dtypes"]) == ("nearest", "requantize", ["bfloat16"])
    before, after = read_tensors(w8a8_dir), read_tensors(out)
    for layer in rewrite["layers"]:
        old, new = before[f"{layer['name']}.weight_scale"], after[f"{layer['name']}.weight_scale"]
        w_old, w_new = before[f"{layer['name']}.weight"], after[f"{layer['name']}.weight"]
        assert layer["channels"] == old.shape[0]
        assert layer["scales_changed"] == int((old.float() != new.float()).sum())
        assert layer["weights_changed"] == int((w_old != w_new).sum())
    by_name = {layer["name"]: layer for layer in rewrite["layers"]}
    name, _ = POW2_ROW
    assert by_name[name]["scales_changed"] == by_name[name]["channels"] - 1  # its 2^-7 channel stays
    assert rewrite["scales_changed"] == sum(x["scales_changed"] for x in rewrite["layers"])
    assert rewrite["source_agreement"]["exact"] is True
    from alibi.model.digests import tensors_sha256
    assert manifest.predicate["parameters"]["tensors_digest"]["sha256"] == tensors_sha256(after)
    assert manifest.predicate["parameters"]["input_tensors_digest"]["sha256"] == tensors_sha256(before)


def test_rewritten_checkpoint_reads_back_and_both_epilogue_orders_agree_bitwise(tmp_path, w8a8_dir):
    assert _rewrite(w8a8_dir, tmp_path / "out", "nearest", None) == 0
    ckpt = read_w8a8(tmp_path / "out")
    g = torch.Generator().manual_seed(0)
    for lin in ckpt.linears.values():
        a_q = torch.randint(-127, 128, (16, lin.K), dtype=torch.int8, generator=g)
        s_a = torch.rand(16, generator=g) * 1e-2 + 1e-3
        acc = exact_accumulator(a_q, lin.weight)
        w_first = apply_epilogue(EpilogueModel("w_then_a", "fma"), acc, s_a, lin.scale)
        a_first = apply_epilogue(EpilogueModel("a_then_w", "fma"), acc, s_a, lin.scale)
        assert bitwise_equal(w_first, a_first), lin.name


def test_per_tensor_scales_stay_per_tensor(tmp_path, dense_dir):
    qc = json.loads(json.dumps(LLM_COMPRESSOR_W8A8))
    qc["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"
    src = tmp_path / "ct"
    write_llm_compressor_style(src, read_tensors(dense_dir), shards=1, quantization_config=qc)
    shard = src / "model-00001-of-00001.safetensors"
    tensors = load_file(str(shard))
    for key in [k for k in tensors if k.endswith("weight_scale")]:
        tensors[key] = tensors[key].max().reshape(1)
    save_file(tensors, str(shard))
    assert _rewrite(src, tmp_path / "out", "ceil", None) == 0
    after = read_tensors(tmp_path / "out")
    for key in _scale_names(after):
        assert after[key].shape == (1,) and torch.equal(after[key].double(), pow2_round(tensors[key].double(), "ceil"))


def test_a_dense_source_that_did_not_produce_the_weights_is_recorded_and_warned_about(tmp_path, w8a8_dir, dense_dir,
                                                                                      capsys):
    other = tiny_dense_tensors(seed=99)
    write_dense(tmp_path / "other", other)
    assert _rewrite(w8a8_dir, tmp_path / "out", "ceil", tmp_path / "other") == 0
    agreement = read_manifest(tmp_path / "out").predicate["parameters"]["pow2_rewrite"]["source_agreement"]
    assert agreement["exact"] is False and agreement["weights_reproduced"] < agreement["weights_total"]
    assert "model.layers.0.input_layernorm.weight" in agreement["dense_tensors_differing"]
    assert "warning" in capsys.readouterr().out


def test_overwrite_replaces_an_existing_rewritten_checkpoint(tmp_path, w8a8_dir):
    out = tmp_path / "out"
    assert _rewrite(w8a8_dir, out, "floor", None) == 0
    assert _rewrite(w8a8_dir, out, "ceil", None, "--overwrite") == 0
    assert read_manifest(out).predicate["parameters"]["pow2_rewrite"]["mode"] == "ceil"
    assert verify_files(out) == []


def test_python_m_alibi_pow2_rewrite_runs_the_command_and_refuses_an_existing_output(tmp_path, w8a8_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "alibi", "pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil"]
    ok = subprocess.run([*cmd, "--keep-weights"], capture_output=True, text=True, env=env, cwd=tmp_path,
                        check=False)
    assert ok.returncode == 0, ok.stderr
    assert read_w8a8(tmp_path / "out").linears
    again = subprocess.run([*cmd, "--keep-weights"], capture_output=True, text=True, env=env, cwd=tmp_path,
                        check=False)
    assert again.returncode == 2 and "already exists" in again.stderr and len(again.stderr.splitlines()) == 1


# --- refusals: exit 2, nothing written ----------------------------------------------------------


def _assert_refused_without_trace(tmp_path: Path, argv: list[str], needle: str, capsys) -> None:
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err, err
    assert len(err.strip().splitlines()) == 1
    after = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    assert after == before  # nothing added, removed or changed, not even a hidden staging folder


def test_a_nonexistent_input_is_refused(tmp_path, capsys):
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(tmp_path / "nope"), str(tmp_path / "out"),
                                             "--mode", "ceil", "--keep-weights"], "no such checkpoint folder", capsys)


def test_a_dense_checkpoint_is_refused_as_not_w8a8(tmp_path, dense_dir, capsys):
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(dense_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             "--keep-weights"], "not W8A8", capsys)


def test_a_malformed_w8a8_checkpoint_is_refused(tmp_path, w8a8_dir, capsys):
    for shard in w8a8_dir.glob("*.safetensors"):
        tensors = load_file(str(shard))
        for key in [k for k in tensors if k.endswith("_proj.weight")]:
            tensors[key] = tensors[key].to(torch.bfloat16)  # weights saved uncompressed
        save_file(tensors, str(shard))
    (w8a8_dir / "manifest.json").unlink(missing_ok=True)
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             "--keep-weights"], "must be int8", capsys)


def test_an_edited_checkpoint_that_no_longer_matches_its_manifest_is_refused(tmp_path, dense_dir, capsys):
    src = _alibi_layout(tmp_path / "w8a8", dense_dir)
    from alibi.governance.manifest import build_predicate, write_manifest
    write_manifest(src, "checkpoint", build_predicate())
    (src / "tokenizer.json").write_bytes(b"edited")
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(src), str(tmp_path / "out"), "--mode", "ceil",
                                             "--keep-weights"], "does not match its manifest", capsys)


@pytest.mark.parametrize("where", ["same", "inside"])
def test_writing_into_the_input_is_refused_even_with_overwrite(tmp_path, w8a8_dir, where, capsys):
    out = w8a8_dir if where == "same" else w8a8_dir / "pow2"
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(out), "--mode", "ceil",
                                             "--keep-weights", "--overwrite"], "overlaps the input", capsys)


def test_writing_into_the_dense_source_is_refused(tmp_path, w8a8_dir, dense_dir, capsys):
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(dense_dir), "--mode", "ceil",
                                             "--requantize-from", str(dense_dir), "--overwrite"],
                                  "overlaps --requantize-from", capsys)


def test_an_existing_output_is_refused_without_overwrite(tmp_path, w8a8_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(out), "--mode", "ceil",
                                             "--keep-weights"], "already exists", capsys)


def test_overwrite_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, w8a8_dir, capsys):
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(out), "--mode", "ceil",
                                             "--keep-weights", "--overwrite"], "holds 'notes.txt', which alibi did not write",
                                  capsys)


def test_overwrite_refuses_a_rewritten_checkpoint_holding_a_file_it_did_not_write(tmp_path, w8a8_dir, capsys):
    """Issue 36 #2. Guards: any folder with a config.json was replaced whole, the user's hidden files with it."""
    out = tmp_path / "out"
    assert _rewrite(w8a8_dir, out, "floor", None) == 0
    (out / ".notes").write_text("mine")
    capsys.readouterr()
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(out), "--mode", "ceil",
                                             "--keep-weights", "--overwrite"], "holds '.notes', which alibi did not write",
                                  capsys)


def test_a_dense_source_with_other_shapes_is_refused(tmp_path, w8a8_dir, dense_dir, capsys):
    tensors = read_tensors(dense_dir)
    tensors["model.layers.1.self_attn.k_proj.weight"] = tensors["model.layers.1.self_attn.k_proj.weight"][:16]
    write_dense(tmp_path / "bad", tensors)
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             "--requantize-from", str(tmp_path / "bad")], "k_proj.weight", capsys)


def test_a_dense_source_missing_a_quantized_layer_is_refused(tmp_path, w8a8_dir, dense_dir, capsys):
    tensors = read_tensors(dense_dir)
    del tensors["model.layers.0.mlp.down_proj.weight"]
    write_dense(tmp_path / "bad", tensors)
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             "--requantize-from", str(tmp_path / "bad")], "down_proj.weight", capsys)


def test_a_quantized_folder_as_dense_source_is_refused(tmp_path, w8a8_dir, dense_dir, capsys):
    other = _alibi_layout(tmp_path / "other-w8a8", dense_dir)
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             "--requantize-from", str(other)], "is a quantized checkpoint", capsys)


@pytest.mark.parametrize("flags", [[], ["--keep-weights", "--requantize-from", "X"]], ids=["neither", "both"])
def test_exactly_one_weight_policy_is_required(tmp_path, w8a8_dir, flags, capsys):
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             *flags], "--keep-weights", capsys)


def test_a_power_of_two_outside_the_stored_scale_dtype_is_refused(tmp_path, dense_dir, capsys):
    tensors = read_tensors(dense_dir)
    w = tensors["model.layers.0.self_attn.q_proj.weight"].clone()
    w[0, 0] = 127.5 * 40000  # fp16 scale 40000: ceil → 2^16, beyond float16's largest finite 65504
    tensors["model.layers.0.self_attn.q_proj.weight"] = w
    write_dense(tmp_path / "big", tensors)
    src = _alibi_layout(tmp_path / "w8a8", tmp_path / "big", scale_dtype=torch.float16)
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(src), str(tmp_path / "out"), "--mode", "ceil",
                                             "--keep-weights"], "outside the range of float16", capsys)
    assert _rewrite(src, tmp_path / "out", "nearest", None) == 0  # 2^15 fits
    assert read_tensors(tmp_path / "out")["model.layers.0.self_attn.q_proj.weight_scale"].dtype == torch.float16


# --- atomicity ----------------------------------------------------------------------------------


def test_a_failure_while_writing_leaves_no_output(tmp_path, w8a8_dir, monkeypatch, capsys):
    from alibi.model import pow2_rewrite

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pow2_rewrite, "write_manifest", fail)
    listing = _listing(tmp_path)
    capsys.readouterr()
    assert _rewrite(w8a8_dir, tmp_path / "out", "ceil", None) == 2  # the CLI's last resort: one line, exit 2
    assert capsys.readouterr().err.startswith("alibi: error: disk full")
    assert _listing(tmp_path) == listing


def test_a_killed_run_leaves_no_checkpoint_at_the_destination(tmp_path, w8a8_dir):
    script = (
        "import os, signal, sys\n"
        "import alibi.model.pow2_rewrite as p\n"
        "real = p.save_file\n"
        "def save_then_die(*a, **k):\n"
        "    real(*a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "p.save_file = save_then_die\n"
        f"p.pow2_rewrite({str(w8a8_dir)!r}, {str(tmp_path / 'out')!r}, 'ceil')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (tmp_path / "out").exists()
    # the half-written stage is hidden beside it and never taken for a checkpoint
    assert all(p.name.startswith(".") for p in tmp_path.iterdir() if p.name not in {"w8a8", "bf16"})


def test_a_write_that_leaves_a_non_power_of_two_scale_is_refused_and_nothing_is_written(w8a8_dir, tmp_path,
                                                                                       monkeypatch):
    """Guards the final check: whatever path leaves a shard unrewritten (the index bug of issue 16
    did), the written checkpoint is read back, every weight_scale must be a power of two, and the
    output is never renamed into place otherwise."""
    from alibi.model import pow2_rewrite as pow2

    real_write = pow2._write

    def write_then_restore_one_scale(src, stage, replaced):
        real_write(src, stage, replaced)
        name = min(k for k in replaced if k.endswith(".weight_scale"))
        for shard in sorted(stage.rglob("*.safetensors")):
            part = load_file(str(shard))
            if name in part:
                part[name] = read_tensors(src)[name]  # the original, real-valued scales
                save_file(part, str(shard))

    monkeypatch.setattr(pow2, "_write", write_then_restore_one_scale)
    out = tmp_path / "pow2"
    with pytest.raises(atomic.InputError, match=r"after writing, .*weight_scale holds \d+ scale\(s\) that are not "
                                                "powers of two; nothing was written"):
        pow2.pow2_rewrite(w8a8_dir, out, "ceil")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".pow2")]


def test_a_shard_whose_tensor_data_is_cut_short_is_refused_in_one_line_naming_it(tmp_path, w8a8_dir, capsys):
    shard = sorted(w8a8_dir.glob("*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-64])  # the header still parses; the last tensor's bytes are missing
    _assert_refused_without_trace(tmp_path, ["pow2-rewrite", str(w8a8_dir), str(tmp_path / "out"), "--mode", "ceil",
                                             "--keep-weights"], shard.name, capsys)

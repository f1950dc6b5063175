import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from alibi.errors import InputError
from alibi.tiles.synthetic import PRESETS, synthetic_tiles
from alibi.tiles.tile import Tile, load_tile, load_tile_dir, save_tile, tile_bytes


def make_tile(M=4, K=8, N=3, **changes) -> Tile:
    g = torch.Generator().manual_seed(1)
    t = Tile("t", torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8), torch.rand(M, generator=g) + 0.1,
             torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8), torch.rand(N, generator=g) + 0.1)
    return t.replace(**changes)


def test_a_tile_round_trips_bit_for_bit(tmp_path):
    t = make_tile(bias=torch.randn(3).to(torch.bfloat16), out_dtype=torch.float16, meta={"layer": "7"})
    path = save_tile(t, tmp_path / "t.safetensors")
    u = load_tile(path)
    for k in ("a_q", "s_a", "w_q", "s_w", "bias"):
        assert torch.equal(getattr(t, k).view(torch.uint8) if getattr(t, k).dtype != torch.int8 else getattr(t, k),
                           getattr(u, k).view(torch.uint8) if getattr(u, k).dtype != torch.int8 else getattr(u, k))
    assert (u.name, u.out_dtype, u.meta["layer"]) == ("t", torch.float16, "7")
    assert tile_bytes(t) == tile_bytes(u)


def test_a_tile_written_by_another_program_loads_with_defaults(tmp_path):
    g = torch.Generator().manual_seed(0)
    save_file({"a_q": torch.randint(-128, 128, (2, 16), generator=g, dtype=torch.int8),
               "s_a": torch.tensor([0.5, 0.25]), "w_q": torch.randint(-128, 128, (5, 16), generator=g, dtype=torch.int8),
               "s_w": torch.full((5,), 0.01)}, str(tmp_path / "layer3.safetensors"))
    t = load_tile(tmp_path / "layer3.safetensors")
    assert (t.name, t.out_dtype, t.M, t.K, t.N, t.bias) == ("layer3", torch.bfloat16, 2, 16, 5, None)


def _write(tmp_path, name="bad.safetensors", metadata=None, **tensors):
    t = make_tile()
    base = {"a_q": t.a_q, "s_a": t.s_a, "w_q": t.w_q, "s_w": t.s_w}
    base.update(tensors)
    base = {k: v for k, v in base.items() if v is not None}
    path = tmp_path / name
    save_file(base, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize("tensors, message", [
    ({"a_q": torch.zeros(4, 8, dtype=torch.int16)}, "a_q has dtype int16"),
    ({"w_q": torch.zeros(3, 9, dtype=torch.int8)}, "K mismatch"),
    ({"s_a": torch.ones(5)}, "s_a has shape \\[5\\]"),
    ({"s_w": torch.ones(3, dtype=torch.float64)}, "s_w has dtype float64"),
    ({"s_w": torch.tensor([1.0, float("inf"), 1.0])}, "non-finite"),
    ({"s_a": torch.tensor([1.0, 0.0, 1.0, 1.0])}, "zero or negative"),
    ({"s_w": torch.tensor([1.0, -2.0, 1.0])}, "zero or negative"),
    ({"s_w": None}, "missing tensor\\(s\\) s_w"),
    ({"bias": torch.ones(4)}, "bias has shape"),
    ({"extra": torch.ones(1)}, "unknown tensor"),
])
def test_malformed_tiles_are_refused_with_the_file_named(tmp_path, tensors, message):
    path = _write(tmp_path, **tensors)
    with pytest.raises(InputError, match=message) as err:
        load_tile(path)
    assert str(path) in str(err.value)


def test_an_unknown_out_dtype_is_refused(tmp_path):
    path = _write(tmp_path, metadata={"out_dtype": "float32"})
    with pytest.raises(InputError, match="out_dtype 'float32'"):
        load_tile(path)


def test_truncated_and_foreign_files_are_refused(tmp_path):
    good = _write(tmp_path, name="good.safetensors")
    (tmp_path / "trunc.safetensors").write_bytes(good.read_bytes()[:-10])
    (tmp_path / "text.safetensors").write_text("hello, not tensors")
    header = json.dumps({"a_q": {"dtype": "I8", "shape": [1000], "data_offsets": [0, 1000]}}).encode()
    (tmp_path / "short.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    for name in ("trunc", "text", "short"):
        with pytest.raises(InputError, match="safetensors"):
            load_tile(tmp_path / f"{name}.safetensors")


def test_an_empty_tile_folder_is_refused(tmp_path):
    with pytest.raises(InputError, match="holds no"):
        load_tile_dir(tmp_path)


def test_subnormal_scales_are_accepted():
    t = make_tile(s_w=torch.full((3,), 1e-40))
    assert t.validate() is t


def test_synthetic_presets_are_deterministic_and_realistic():
    a, b = synthetic_tiles("tiny", seed=3), synthetic_tiles("tiny", seed=3)
    assert [tile_bytes(x) for x in a] == [tile_bytes(y) for y in b]
    assert tile_bytes(synthetic_tiles("tiny", seed=4)[0]) != tile_bytes(a[0])
    assert {"smollm2-135m", "qwen3-1.7b", "smollm2-135m-full", "qwen3-1.7b-full"} <= set(PRESETS)
    full = PRESETS["smollm2-135m-full"]
    assert full.layers * len(full.block) == 210
    shapes = {(t.K, t.N) for t in synthetic_tiles("smollm2-135m", M=1)}
    assert shapes == {(576, 576), (576, 192), (576, 1536), (1536, 576)}


def test_unknown_preset_is_refused():
    with pytest.raises(InputError, match="unknown synthetic preset 'nope'"):
        synthetic_tiles("nope")

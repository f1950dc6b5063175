"""`alibi predict --out`: refused when it is a folder or lies inside the tiles (alibi.model.predictions)."""

from __future__ import annotations

from hostile import main_one_line

from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile


def _tiles(tmp_path):
    folder = tmp_path / "tiles"
    folder.mkdir()
    save_tile(synthetic_tiles("tiny")[0], folder / "t.safetensors")
    return folder


def test_predict_out_naming_an_existing_folder_is_one_line(tmp_path, capsys):
    """Guards: `predict --out DIR` raised IsADirectoryError (a traceback) at the final write."""
    tiles = _tiles(tmp_path)
    (tmp_path / "p").mkdir()
    main_one_line(capsys, ["predict", "--tiles", str(tiles), "--out", str(tmp_path / "p")], "is a folder")
    assert list((tmp_path / "p").iterdir()) == []


def test_predict_out_inside_the_tiles_folder_is_refused_and_adds_nothing_there(tmp_path, capsys):
    tiles = _tiles(tmp_path)
    main_one_line(capsys, ["predict", "--tiles", str(tiles), "--out", str(tiles / "p.json")],
                  "the prediction file overlaps --tiles")
    assert sorted(p.name for p in tiles.iterdir()) == ["t.safetensors"]

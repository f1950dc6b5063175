"""What the HTML tests share: tiles with hostile names and a faulty kernel registered under a test name."""

from __future__ import annotations

from pathlib import Path

from faulty_kernels import OneUlpUp, divergent_tile

from alibi.kernels.registry import register
from alibi.tiles.tile import save_tile

# Tile names are untrusted input: markup, a newline, mathtext and an ampersand must all arrive as text.
HOSTILE_NAMES = ('<script>alert("tile")</script>', "line one\nline two & <b>bold</b>", "layers.2.$\\frac{x$")
FAULTY = "test-html:one-ulp-up"
register(FAULTY, OneUlpUp)


def write_hostile_tiles(folder: Path) -> Path:
    """Three small tiles on which the two epilogue orders differ, named `HOSTILE_NAMES`."""
    folder.mkdir(parents=True)
    for i, name in enumerate(HOSTILE_NAMES):
        save_tile(divergent_tile(seed=i).replace(name=name), folder / f"tile{i}.safetensors")
    return folder

"""A conform run with fired and inapplicable checks on tiles with hostile names, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_pages import FAULTY, write_hostile_tiles

from alibi.cli import main


@pytest.fixture(scope="session")
def fired_run(tmp_path_factory) -> Path:
    """`alibi conform` of a kernel that adds one ulp to every 7th output against the emulator of its declared model.

    It fires pow2-identity, epilogue-model and m-invariance; token-level-risk is inapplicable
    (tiles have no tokens); pow2-identity is inapplicable in the real regime.
    """
    root = tmp_path_factory.mktemp("fired")
    tiles = write_hostile_tiles(root / "tiles")
    out = root / "report"
    code = main(["conform", "--kernel-a", FAULTY, "--kernel-b", "emulator:a_then_w", "--tiles", str(tiles),
                 "--out", str(out), "--quiet"])
    assert code == 1  # a check fired
    return out


@pytest.fixture(scope="session")
def fired_report(fired_run) -> dict:
    return json.loads((fired_run / "report.json").read_text(encoding="utf-8"))

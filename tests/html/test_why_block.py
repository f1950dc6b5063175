"""report.html leads with the "why", as report.md and the terminal do: the sentence drawn from the checks and,
per regime, how many units the declared models predict exactly and what causes the differences (issue 25)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from html import unescape
from pathlib import Path

import pytest
from browser import FLAGS, NO_CHROMIUM, chromium
from faulty_kernels import divergent_tile

from alibi.cli import main
from alibi.conform.report import explanation, read_report, why_sentence
from alibi.tiles.tile import save_tile


@pytest.fixture(scope="module")
def orders_run(tmp_path_factory) -> Path:
    """The two scale orders on tiles where they differ under real scales; the models explain it."""
    root = tmp_path_factory.mktemp("why")
    (root / "tiles").mkdir()
    for i in (1, 2):
        save_tile(divergent_tile(seed=i).replace(name=f"differs{i}"), root / "tiles" / f"{i}.safetensors")
    assert main(["conform", "--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--tiles",
                 str(root / "tiles"), "--out", str(root / "r"), "--quiet"]) == 0
    return root / "r"


def _why_text(html: str) -> str:
    section = re.search(r'<section class="why" id="why">(.*?)</section>', html, re.DOTALL)
    assert section is not None, "the page has no Why block"
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", section.group(1))).split())


def test_the_page_states_why_the_arms_differ_with_predicted_explained_and_cause(orders_run):
    report = read_report(orders_run)
    html = (orders_run / "report.html").read_text(encoding="utf-8")
    why = _why_text(html)
    assert " ".join(why_sentence(report).split()) in why
    real = explanation(report, "real")
    assert real is not None and real.causes == ("scale order",)
    assert f"real scales: {real.line()}" in why and "cause: scale order" in why
    # it comes before the checks table, as report.md puts it first
    assert html.index('id="why"') < html.index("<h2>Checks</h2>")


def test_the_why_block_of_an_undeclared_arm_makes_no_claim_about_its_model(tmp_path):
    from alibi.kernels.registry import register
    from conform.test_undeclared_epilogue import Undeclared

    register("test-undeclared-html", Undeclared)
    main(["conform", "--kernel-a", "test-undeclared-html", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
          "--out", str(tmp_path / "r"), "--quiet"])
    why = _why_text((tmp_path / "r" / "report.html").read_text(encoding="utf-8"))
    assert "declares no epilogue model" in why and "alibi identify" in why
    assert "equals its declared epilogue model" not in why


def test_a_browser_shows_the_why_block(orders_run):
    browser = chromium()
    if browser is None:
        pytest.skip(NO_CHROMIUM)
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                               (orders_run / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
    why = _why_text(done.stdout)
    assert "cause: scale order" in why and why_sentence(read_report(orders_run)).split(",")[0] in why

"""The replay, sweep and positive-control sections, rendered from folders their own commands wrote."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from browser import NO_CHROMIUM, chromium, probe

from alibi.cli import main
from alibi.html import render_folder, write_report_html
from alibi.html.sections.flips import decile_roc
from alibi.tokens.margin import MarginDecile

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/tokens/fixtures"


def _pngs(html: str) -> list[np.ndarray]:
    return [matplotlib.image.imread(io.BytesIO(base64.b64decode(d)), format="png")
            for d in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


@pytest.fixture(scope="module")
def flips_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("flips")
    arms = []
    for arm in ("a", "b"):  # an arm path with markup: it is shown on the page and must stay text
        arms.append(root / f"<b>arm-{arm}.json")  # a file name cannot hold "/", so the tag stays open
        shutil.copy(FIXTURES / f"list_arm_{arm}.json", arms[-1])
    out = root / "flips"
    assert main(["analyze", "flips", str(arms[0]), str(arms[1]), "--out", str(out), "--allow-unverified",
                 "--bootstrap", "200", "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def depth_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("depth")
    rng = np.random.default_rng(0)
    rising, silent = ["seed,K,frac_differ,n,n_differing"], ["seed,K,frac_differ,n,n_differing"]
    for seed in range(4):
        for K in (512, 1024, 2048, 4096, 8192):
            k = int(rng.binomial(50_000, 1 - np.exp(-0.003 * K ** 0.5)))
            rising.append(f"{seed},{K},{k / 50_000!r},50000,{k}")
            silent.append(f"{seed},{K},0.0,50000,0")
    (root / "rising.csv").write_text("\n".join(rising) + "\n")
    (root / "silent.csv").write_text("\n".join(silent) + "\n")
    out = root / "fits"
    assert main(["analyze", "depth", str(root / "rising.csv"), str(root / "silent.csv"), "--bootstrap", "50",
                 "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def mutants_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mutants") / "m"
    assert main(["mutants", "--base", "emulator:w_then_a", "--faults", "null,scale-bf16", "--severity", "all",
                 "--scales", "real", "--out", str(out), "--quiet"]) in (0, 1)
    return out


def test_the_flips_page_states_the_analysis_numbers_and_keeps_paths_inert(flips_folder):
    doc = json.loads((flips_folder / "flips.json").read_text())
    page = render_folder(flips_folder)
    assert [p.name for p in page.sources] == ["flips.json"]
    assert f"{doc['n_flips']} of {doc['n_positions']} teacher-forced positions flip" in page.html
    assert "&lt;b&gt;arm-a.json" in page.html and "<b>arm-a" not in page.html
    decile_rows = page.html.split("<h2>Margin deciles</h2>", 1)[1].split("</table>", 1)[0].count("<tr>")
    assert decile_rows == len(doc["deciles"]) + 1  # header row + one per decile
    images = _pngs(page.html)
    drawn = 1 + (decile_roc([MarginDecile(**d) for d in doc["deciles"]]) is not None) + \
        any(b["flip_rate_evaluation"] is not None for b in doc["bins"])
    assert len(images) == drawn and all(im.shape[0] > 100 for im in images)


def test_the_decile_roc_runs_from_the_origin_to_one_one_admitting_the_lowest_margins_first():
    deciles = [MarginDecile(0, 10, 4, 0.4, 0.0, 0.1), MarginDecile(1, 10, 1, 0.1, 0.1, 0.5),
               MarginDecile(2, 10, 0, 0.0, 0.5, 2.0)]
    points = decile_roc(deciles)
    assert points == [(0.0, 0.0), (6 / 25, 4 / 5), (15 / 25, 1.0), (1.0, 1.0)]
    assert decile_roc([MarginDecile(0, 5, 0, 0.0, 0.0, 1.0)]) is None  # no flip: no curve


def test_the_depth_page_lists_every_model_and_marks_the_selected_one(depth_folder):
    doc = json.loads((depth_folder / "fits.json").read_text())
    html = render_folder(depth_folder).html
    rising, silent = doc["analyses"]
    assert silent["status"] == "all-zero" and rising["selected"] is not None
    for m in rising["models"]:
        assert f'<td class="mono">{m["model"]}' in html
    assert f'{rising["selected"]} (selected)' in html and html.count("(selected)") == 1
    (chart,) = _pngs(html)
    assert chart.shape[1] == 800  # 8 in at 100 dpi


def test_the_mutants_page_shows_the_matrix_heatmap_and_every_row(mutants_folder):
    doc = json.loads((mutants_folder / "detection.json").read_text())
    html = render_folder(mutants_folder).html
    (heat,) = _pngs(html)
    assert heat.shape[0] > 100
    rows = html.split("All ", 1)[1].split("</tbody>", 1)[0].count("<tr")
    assert rows == len(doc["faults"]) + 1
    assert ("ALL CAUGHT" in html) == (doc["null_silent"] and doc["all_detected"])


def test_a_folder_with_a_report_and_a_flip_analysis_gets_both_sections_and_a_contents_line(fired_run, flips_folder,
                                                                                          tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    shutil.copy(fired_run / "report.json", both / "report.json")
    shutil.copy(flips_folder / "flips.json", both / "flips.json")
    # No command writes such a folder (one manifest, one kind): a command that did would render its stage so.
    html = write_report_html(both).read_text(encoding="utf-8")
    assert '<a href="#conform">' in html and '<a href="#flips">' in html
    assert html.count('<section id="conform">') == 1 and html.count('<section id="flips">') == 1
    assert html.index('<section id="conform">') < html.index('<section id="flips">')


@pytest.fixture(scope="module")
def browser():
    found = chromium()
    if found is None:
        pytest.skip(NO_CHROMIUM)
    return found


def test_chromium_opens_every_section_kind_without_errors(flips_folder, depth_folder, mutants_folder, browser, tmp_path):
    for folder in (flips_folder, depth_folder, mutants_folder):
        page = tmp_path / f"{folder.name}.html"
        page.write_text(render_folder(folder).html, encoding="utf-8")
        seen, console = probe(browser, page)
        assert console == [] and seen["errors"] == [], folder
        assert seen["images"] >= 1 and seen["decoded"] == seen["images"], folder


def test_write_report_html_puts_the_folders_page_inside_it(depth_folder, tmp_path):
    stage = tmp_path / "stage"
    shutil.copytree(depth_folder, stage)
    (stage / "manifest.json").unlink()  # as inside a staged folder, before its manifest is written
    from alibi.html import write_report_html

    written = write_report_html(stage)
    assert written == stage / "report.html"
    assert written.read_text(encoding="utf-8") == render_folder(depth_folder).html

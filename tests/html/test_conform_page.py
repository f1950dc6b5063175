"""The conform page: what `alibi conform` writes as report.html, read as HTML and opened in a real browser."""

from __future__ import annotations

import base64
import hashlib
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import NO_CHROMIUM, chromium, probe, screenshot
from report_pages import HOSTILE_NAMES

from alibi.conform.results import Report
from alibi.governance.manifest import read_manifest, verify_files
from alibi.html import conform_html
from alibi.html.sections.conform import TOP_TILES


class Page(HTMLParser):
    """Every start tag with its attributes, the text of each <td>, and each <script>'s text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.cells: list[str] = []
        self.cell_classes: list[str | None] = []
        self._in: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in.append(tag)
        if tag == "script":
            self.scripts.append("")
        if tag == "td":
            self.cells.append("")
            self.cell_classes.append(dict(attrs).get("class"))

    def handle_endtag(self, tag):
        if tag in self._in:
            while self._in.pop() != tag:
                pass

    def names(self) -> list[str]:
        """The tile-name cells, in page order."""
        return [text for text, cls in zip(self.cells, self.cell_classes) if cls == "name mono"]

    def handle_data(self, data):
        if self._in and self._in[-1] == "script":
            self.scripts[-1] += data
        if "td" in self._in:
            self.cells[-1] += data


def _html(run: Path) -> str:
    return (run / "report.html").read_text(encoding="utf-8")


def test_conform_writes_report_html_beside_report_json_and_its_manifest_covers_it(fired_run):
    names = {s.name for s in read_manifest(fired_run).subjects}
    assert {"report.html", "report.json", "report.md", "junit.xml"} <= names
    assert verify_files(fired_run) == []


def test_the_page_is_the_rendering_of_the_report_json_beside_it(fired_run, fired_report):
    text = (fired_run / "report.json").read_text(encoding="utf-8")
    assert Report.from_json(text).to_json() == text  # the typed report is the file, byte for byte
    assert _html(fired_run) == conform_html(Report.from_json(text))


def test_the_page_shows_the_verdict_and_every_check_with_its_status_and_reason(fired_run, fired_report):
    html = _html(fired_run)
    statuses = {c["check"]: c["status"] for c in fired_report["checks"]}
    assert fired_report["verdict"] == "fail" and '<div class="verdict fail">' in html
    assert {"fired", "inapplicable", "passed"} <= set(statuses.values())
    rows = re.findall(r'<td class="mono">([a-z0-9-]+)</td>\s*<td><span class="badge (\w+)">(\w+)</span>', html)
    assert {check: status for check, status, _ in rows} == statuses
    assert {word for _, status, word in rows if status == "fired"} == {"FIRED"}
    page = Page(html)
    for c in fired_report["checks"]:
        assert c["detail"] in page.cells  # the reason, as text


def test_hostile_tile_names_render_as_inert_text(fired_run):
    page = Page(_html(fired_run))
    assert [t for t, _ in page.tags].count("script") == 1  # only the page's own script
    assert not any(t == "b" for t, _ in page.tags)
    for name in HOSTILE_NAMES:
        shown = name.replace("\n", "⏎")
        assert shown in page.cells, name
    assert "&lt;script&gt;alert(&#34;tile&#34;)&lt;/script&gt;" in _html(fired_run)


def test_the_page_loads_nothing_from_outside_and_allows_only_its_own_script(fired_run):
    html = _html(fired_run)
    page = Page(html)
    assert not re.search(r"(?i)\b(?:https?|ftp|wss?):|//[a-z0-9.-]+\.[a-z]{2,}/|url\(|@import", html)
    for tag, attrs in page.tags:
        for key in ("src", "href", "srcset", "action", "data", "poster"):
            value = attrs.get(key)
            if value is None:
                continue
            if key == "src":
                assert tag == "img" and value.startswith("data:image/png;base64,"), (tag, value[:40])
            else:
                assert key == "href" and value.startswith("#"), (tag, key, value)
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'" and directives["img-src"] == "data:"
    (script,) = page.scripts
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    assert directives["script-src"] == f"'sha256-{digest}'"


def _many_tiles(report: dict, n: int) -> dict:
    """`report` with `n` tiles (two units each, copied from its first tile) whose differing counts vary by tile."""
    units = []
    for i in range(n):
        differing = (i * 7) % 41
        for u in report["tiles"][:2]:
            unit = {**u, "tile": f"model.layers.{i}.proj", "n_differing": differing, "bitwise_equal": differing == 0}
            if differing == 0:  # an equal tile of a sound pair: nothing fired
                unit["verdicts"] = {k: {**v, "fired": False, "status": "passed" if v["applicable"] else v["status"]}
                                    for k, v in u["verdicts"].items()}
            if "differences" in u:
                unit["differences"] = {**u["differences"], "count": differing,
                                       "elements": u["differences"]["elements"][:differing]}
            units.append(unit)
    return {**report, "tiles": units}


def test_tiles_are_listed_most_differing_first_then_in_report_order(fired_report):
    big = _many_tiles(fired_report, 60)
    total = {}
    for u in big["tiles"]:
        total[u["tile"]] = total.get(u["tile"], 0) + u["n_differing"]
    order = list(total)
    differing = sorted((t for t in order if total[t]), key=lambda t: (-total[t], order.index(t)))
    equal = [t for t in order if not total[t]]
    assert Page(conform_html(Report.from_dict(big))).names() == differing + equal


def test_a_report_of_hundreds_of_tiles_folds_all_but_the_most_differing(fired_report):
    html = conform_html(Report.from_dict(_many_tiles(fired_report, 300)))  # 600 units
    assert len(html.encode("utf-8")) < 3_000_000
    tables = html.split('<table class="sortable">')[1:]  # the tile tables (the checks table is not sortable)
    rows = [t.split("<tbody>", 1)[1].split("</tbody>", 1)[0].count("<tr") for t in tables]
    assert sum(rows) == 300 and rows[0] == TOP_TILES and len(rows) == 3
    # the rest of the differing tiles and the equal ones each fold away under a closed <details>
    folds = re.findall(r"<details><summary>(\d+) (more tile\(s\) that differ|tile\(s\) bitwise equal)", html)
    assert [(int(n), what.split()[0]) for n, what in folds] == [(rows[1], "more"), (rows[2], "tile(s)")]


@pytest.fixture(scope="module")
def browser():
    found = chromium()
    if found is None:
        pytest.skip(NO_CHROMIUM)
    return found


def test_chromium_opens_the_page_without_errors_decodes_every_image_and_sorts(fired_run, browser, tmp_path):
    page = tmp_path / "report.html"
    page.write_bytes((fired_run / "report.html").read_bytes())
    seen, console = probe(browser, page)
    assert console == [] and seen["errors"] == []
    assert seen["images"] == 3 and seen["decoded"] == 3
    order = [int(x) for x in seen["sort"]["all"]]
    assert seen["sort"]["aria"] == "descending" and order == sorted(order, reverse=True)
    shot = tmp_path / "report.png"
    assert screenshot(browser, page, shot) == []
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2400, 1280) and float(pixels[..., :3].std()) > 0.05  # a page, not a blank


def test_chromium_reports_an_image_that_does_not_decode_and_a_blocked_load(fired_run, browser, tmp_path):
    """The browser check can fail: bytes that are no image, and an external image, are both caught."""
    html = _html(fired_run)
    src = re.search(r'src="(data:image/png;base64,[^"]+)"', html).group(1)
    junk = "data:image/png;base64," + base64.b64encode(b"these bytes are not a PNG").decode("ascii")
    broken = html.replace(src, junk, 1).replace("</main>", '<img src="http://example.invalid/x.png"></main>')
    page = tmp_path / "broken.html"
    page.write_text(broken, encoding="utf-8")
    seen, console = probe(browser, page)
    assert seen["images"] == 4 and seen["decoded"] == 2
    assert any("example.invalid" in e for e in seen["errors"]) and console


def test_every_embedded_png_decodes_completely(fired_run):
    """A truncated PNG can still show in a browser (decoded in part); a full decode catches it."""
    import matplotlib.image

    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', _html(fired_run))
    assert len(uris) == 3
    for data in uris:
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100

"""Every committed conform report, of schema v1 and of v2, renders to the page it rendered to before the page
read `alibi.conform.results.Report` itself (issue 23, item 3).

The digests were recorded at c3668e5, when the conform section read report.json through view classes of its
own. Rendering is a pure function of the JSON and the toolkit version (no clock, no machine name, PNGs without a
software stamp; `alibi.html.render`), so each page is compared as bytes, with only the version string put aside
(a release must not fail this test). Two digests per page: of the whole page, and of the page with the PNG
payloads blanked, so a failure says whether the text changed or only a figure (a new matplotlib may draw other
pixels; re-record only after a diff of the page's text shows nothing else changed).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from alibi import __version__
from alibi.conform.results import Report
from alibi.html import conform_html

REPO = Path(__file__).resolve().parents[2]
RESULTS = "analysis/results/"

# report.json under analysis/results -> (sha256 of the page, sha256 of the page without its PNG payloads)
PAGES = {
    "cpu/vllm-engine/conform-vllm-cpu-onednn-vs-emulator/report.json": (  # v2
        "2263ff406a8fefd47508aff7b07772982b7962ba2c25d75fb64cf4948584f327",
        "4612e984f1684c9927fbf17f917e7c48a9d9d8a8c4304f1658aa3476ad38bfab"),
    "cpu/vllm-engine/conform-vllm-cpu-onednn-vs-torch-cpu/report.json": (  # v2
        "02b92a0d77231c630d9153a7a546d0317ad293eec49f9d916e91d9d2d3b3c93f",
        "f0820306472674b1ac54171090c7b18a7f7f9d7e71895bff56cf28fd0f3651fc"),
    "h200/conform-cutlass-cublas/report.json": (  # v1
        "4a9aa4ca379037f5e89f1fdf82a09bb659134ee9221e45a223f624546804675b",
        "7e582b4e3a68ba42ca11b78c3a986eb1490681b0b044932de70d77cd8289b4dc"),
    "h200/conform-cutlass-triton/report.json": (  # v1
        "6c3470049be2fff87ebc7de26b762b10a58873aad8af78eb4c989205b8f439cc",
        "60dc4af4aaa8c667878d4363288b85cb9d416ec3eb63d2410a76e1a31cb17e76"),
    "h200/conform-default/report.json": (  # v1, written before units carried `differences`
        "a55aa94569e42b646725607c9cf637f8ca9a9641f134e10a18e4e9e1203ad265",
        "c4e5108ea684463ae10ff5fd0e8a59d9869171d4c201c1a368b2de0243cce0e0"),
    "h200/conform-fp8-cutlass-triton/report.json": (  # v1, fp8
        "d7aa992dbba45386007180670e39f4d21c0cba093d35dd558e26037a2b9cba76",
        "42abfde70b9281b5d4e0f51e25daac882280bec68921690779e933139a9167b5"),
    "h200/conform-triton-cublas/report.json": (  # v1
        "82433cf705904d36ce5e300f0c191a500bc23898782c96eefb6adf82f4bded18",
        "46dfcdb7c3b6e6c615451b7c35655ef5ad1b3b7d0f5e1c1eccd93edbf076f505"),
    "h200/smollm2-layer-verification/report/report.json": (  # v1 with `differences`, 420 units
        "52c28e847ab5ef967d0871b4e1b253f07fddee8fbd2c02cc9989421ebbb277a4",
        "0ec3b7d20ed486e448d11ef90619be4d7c45bad53e6bb8d7c5e73e162569786c"),
}


def digests(html: str) -> tuple[str, str]:
    html = html.replace(f"alibi {__version__}", "alibi <version>")
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,", html)
    return hashlib.sha256(html.encode()).hexdigest(), hashlib.sha256(text.encode()).hexdigest()


def test_the_pages_cover_every_committed_conform_report_of_both_schemas():
    committed = {p.relative_to(REPO / RESULTS).as_posix() for p in (REPO / RESULTS).rglob("report.json")
                 if str(json.loads(p.read_text(encoding="utf-8")).get("schema")).startswith("alibi.conform/")}
    assert committed == set(PAGES), "record the digest of each new committed report's page here"


@pytest.mark.parametrize("report", sorted(PAGES))
def test_a_committed_report_renders_to_the_same_bytes_as_before(report):
    # The page of the report alone (three of these folders have no manifest, so `alibi report html` refuses them).
    page, text = digests(conform_html(Report.from_json((REPO / RESULTS / report).read_bytes(), report)))
    want_page, want_text = PAGES[report]
    assert text == want_text, "the page's text changed"
    assert page == want_page, "the text is the same but a figure's PNG bytes changed"

"""One Jinja2 environment and the page shell: self-contained HTML, inert to untrusted text.

Why a page rendered here is safe to open and to attach anywhere:

- **Autoescaping is on for every template** (`autoescape=True`, not by file extension): tile
  names, kernel evidence and paths come from operands and machines we do not control, and a name
  such as `<script>…` must arrive as text. Only two things are inserted unescaped (`Markup`):
  HTML that these templates rendered themselves (a section's body), and the page's own script,
  read from package data.
- **Nothing is fetched**: figures are PNG data URIs, styles and the script are inline, fonts are
  the reader's system fonts. A Content-Security-Policy in the page (`default-src 'none'`, images
  only from `data:`, scripts only with the sha256 of the page's own script) makes the browser
  refuse any other load or script, so even a rendering bug cannot reach the network or run
  injected code.
- **The page works without its script**: tables are sorted and grouped when rendered, and
  collapsed with `<details>`; the script only adds click-to-sort on table headers.

Rendering is a pure function of the result JSON and the toolkit version (no clock, no machine
name, PNGs without a software stamp), so re-rendering a folder gives the same bytes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import jinja2
from markupsafe import Markup

from alibi import __version__
from alibi.html.figures import Chart

SCRIPT_FILE = "table-sort.js"


@dataclass(frozen=True)
class RenderedSection:
    """One result's part of a page: `key` (the anchor id), `title`, `body` (HTML these templates rendered)."""

    key: str
    title: str
    body: Markup


@dataclass(frozen=True)
class FigureView:
    """A figure as a page shows it: title, caption, the image as a data URI (or why it is not drawn)."""

    title: str
    caption: str
    src: str | None
    width: int | None
    height: int | None
    alt: str
    missing: str | None = None

    @classmethod
    def of(cls, title: str, caption: str, chart: Chart) -> FigureView:
        return cls(title, caption, png_data_uri(chart.png), chart.width, chart.height, chart.alt)

    @classmethod
    def absent(cls, title: str, why: str) -> FigureView:
        return cls(title, "", None, None, None, "", why)


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja2 environment for every alibi page: package templates, autoescaping always on."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("alibi.html", "templates"),
        autoescape=True,  # every template, whatever its extension (select_autoescape keys on names)
        undefined=jinja2.StrictUndefined,  # a missing field is a bug in the renderer, never an empty cell
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )
    env.filters["count"] = format_count
    env.filters["ppm"] = format_ppm
    env.filters["bits"] = format_bits
    env.filters["visible"] = visible_text
    return env


def format_count(n: int | None) -> str:
    """Thousands separated with a thin space (12 345 678), `n/a` for a missing count."""
    return "n/a" if n is None else f"{n:,}".replace(",", "\u2009")


def format_ppm(part: int, whole: int) -> str:
    """`part` of `whole` to two significant digits: in ppm below 0.1 %, in percent from there (`0 ppm` when none)."""
    if whole <= 0 or part == 0:
        return "0 ppm"
    ppm = 1e6 * part / whole
    if ppm >= 1000:
        pct = ppm / 1e4
        return f"{pct:.2g} %" if pct < 10 else f"{pct:.0f} %"
    return f"{ppm:.2g} ppm" if ppm < 10 else f"{ppm:.0f} ppm"


def visible_text(text: str) -> str:
    """Control characters (a newline in a tile name) shown as ⏎ rather than collapsed into a space by HTML."""
    return re.sub(r"[\x00-\x1f\x7f]+", "⏎", text)


def format_bits(x: float | None) -> str:
    return "∞" if x is None else f"{x:.2f}"


def png_data_uri(png: bytes) -> str:
    """A PNG as a `data:` URI: the image travels inside the page."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("png_data_uri: the bytes are not a PNG file")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@functools.lru_cache(maxsize=1)
def page_script() -> str:
    return resources.files("alibi.html").joinpath("templates", SCRIPT_FILE).read_text(encoding="utf-8")


def script_hash(script: str) -> str:
    """The CSP source expression that allows exactly this inline script (`'sha256-<base64>'`)."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(script: str) -> str:
    """No network, no plugins, no forms; images only inline, scripts only the page's own."""
    return ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
            f"script-src {script_hash(script)}; base-uri 'none'; form-action 'none'")


def render_page(title: str, sections: Sequence[RenderedSection], *, source_note: str) -> str:
    """The whole page: head (CSP, inline style), a contents list when there are several sections, the sections.

    source_note: one line saying which files the page was rendered from (shown in the footer).
    """
    script = page_script()
    return environment().get_template("page.html.j2").render(
        title=title, sections=list(sections), csp=content_security_policy(script), script=Markup(script),
        version=__version__, source_note=source_note)


def render_fragment(template: str, **context: object) -> Markup:
    """A section body from its template; the result is trusted HTML (its inputs were escaped)."""
    return Markup(environment().get_template(template).render(**context))


__all__ = ["FigureView", "RenderedSection", "content_security_policy", "environment", "format_bits", "format_count",
           "format_ppm", "png_data_uri", "render_fragment", "render_page", "script_hash"]

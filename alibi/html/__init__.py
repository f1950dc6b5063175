"""Self-contained HTML reports: `report.html` for every result folder.

- `conform_html(report)` — the page for a conform report (the dict `alibi conform` and
  `alibi run` write as `report.json`), rendered from exactly the JSON text written beside it;
  `write_conform_html(report, folder)` writes it as `folder/report.html`.
- `render_folder(folder)` — the page for any result folder: every section (`alibi.html.sections`:
  conform/run, flips, depth fits, mutants, variations, matrix) whose JSON file the folder holds, each
  read only once its manifest vouches for it (`alibi.governance.verified`). `alibi report html DIR`
  calls it; `write_report_html(folder)` writes the page of a folder as `folder/report.html` (for a
  command that stages its folder: call it after the JSON is in the stage and before the manifest).
- `default_output(folder, source)` / `check_output(path)` — where a re-rendered page goes without
  breaking a manifest (see `pinning_manifest`).

Where a page goes: a folder covered by a manifest (its own `manifest.json` or one in a folder
above) must keep exactly the files the manifest lists, or `alibi manifest verify` fails. So a page
re-rendered for such a folder is written *beside* the covered folder, as `<folder>.report.html`;
in a folder no manifest covers it goes beside the JSON it renders, as `report.html`. `alibi conform` and `alibi run` write
`report.html` before their manifest, so theirs is covered like every other file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


from alibi.conform.results import Report
from alibi.errors import InputError
from alibi.governance.manifest import MANIFEST_NAME, read_manifest
from alibi.governance.verified import verified_file
from alibi.html.render import RenderedSection, render_page
from alibi.html.sections import section, sections
from alibi.io import atomic

HTML_NAME = "report.html"


@dataclass(frozen=True)
class RenderedPage:
    """A page and the result files it was rendered from (relative to the folder)."""

    html: str
    sources: tuple[Path, ...]


def _page(rendered: list[RenderedSection], note: str) -> str:
    title = rendered[0].title if len(rendered) == 1 else " · ".join(s.title for s in rendered)
    return render_page(title, rendered, source_note=note)


def conform_html(report: Report) -> str:
    """The page for a conform report, rendered from the very text `report.json` holds (same bytes as a re-render)."""
    return _page([section("conform").render(report.to_json(), "report.json")], "report.json")


def write_conform_html(report: Report, folder: str | os.PathLike) -> Path:
    """Render and write `folder/report.html` atomically; returns its path."""
    html = conform_html(report)
    return atomic.write_text(Path(folder) / HTML_NAME, html)


def render_folder(folder: str | os.PathLike) -> RenderedPage:
    """Every section whose result file `folder` holds, in section order, each read only once a manifest of
    the section's kinds vouches for it (`alibi.governance.verified`: a changed, added-to or forged result
    is refused, naming the file); InputError if it holds none."""
    def read(s, path: Path) -> str:
        return verified_file(path, s.kinds, fix=f"re-run the command that wrote {path.name}").text()

    return _render(folder, read)


def _render(folder: str | os.PathLike, read) -> RenderedPage:
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: no such result folder; pass a folder written by alibi conform or alibi run")
    rendered, sources = [], []
    for s in sections():
        path = s.find(root)
        if path is None:
            continue
        rendered.append(s.render(read(s, path), str(path)))
        sources.append(path.relative_to(root))
    if not rendered:
        looked = ", ".join(dict.fromkeys(f for s in sections() for f in s.files))
        raise InputError(f"{root}: holds no result to render (looked for {looked}); pass a folder written by "
                         "alibi conform or alibi run")
    # The footer names the files, not their place: the page must not depend on where the folder lies.
    note = ", ".join(p.name for p in sources)
    return RenderedPage(_page(rendered, note), tuple(sources))


def _read_staged(_section, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot be read ({exc}); check the file and its permissions") from None


def write_report_html(folder: str | os.PathLike) -> Path:
    """Render every section `folder` holds and write `folder/report.html` atomically; returns its path. For a
    command's own staged folder, before its manifest: the JSON is the command's own, just written."""
    return atomic.write_text(Path(folder) / HTML_NAME, _render(folder, _read_staged).html)


def pinning_manifest(path: str | os.PathLike) -> Path | None:
    """The folder whose alibi manifest covers `path` (a file or folder, existing or not), or None.

    A manifest covers every file below its folder (`alibi manifest verify` flags any added file),
    so the nearest folder at or above `path` that holds a readable alibi `manifest.json` pins it.
    A `manifest.json` that is not an alibi manifest pins nothing.
    """
    p = Path(path).resolve()
    for folder in [p, *p.parents]:
        candidate = folder / MANIFEST_NAME
        if candidate.is_file() and candidate != p:
            try:
                read_manifest(candidate)
            except InputError:
                continue
            return folder
    return None


def default_output(folder: str | os.PathLike, source: str | os.PathLike = "report.json") -> Path:
    """Where the page for `folder` goes: beside the JSON it renders (`source`, relative to `folder`), as
    `report.html`; but `<pinned folder>.report.html` beside the folder when a manifest pins `folder`."""
    root = Path(folder)
    pinned = pinning_manifest(root)
    if pinned is None:
        return (root / source).parent / HTML_NAME
    # Keep the caller's spelling (a relative path stays relative) when the pinned folder is `folder` or above it.
    for candidate in [root, *root.parents]:
        if candidate.resolve() == pinned:
            return candidate.parent / f"{candidate.name}.{HTML_NAME}"
    return pinned.parent / f"{pinned.name}.{HTML_NAME}"


# What every page alibi renders carries in its head (templates/page.html.j2), within its first bytes.
_GENERATOR = b'<meta name="generator" content="alibi '


def _is_alibi_page(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return _GENERATOR in fh.read(4096)
    except OSError:
        return False


def check_output(path: str | os.PathLike) -> Path:
    """Refuse an output path inside a manifest-pinned folder (writing there would break its manifest),
    and an existing file there that is not a page alibi rendered (it would be overwritten)."""
    out = Path(path)
    if out.is_dir():
        raise InputError(f"{out}: is a folder; --out names the HTML file to write, e.g. {out / HTML_NAME}")
    if out.is_symlink() or (out.exists() and not _is_alibi_page(out)):
        raise InputError(f"{out}: exists and is not a page alibi rendered; writing would replace it, so move it "
                         "away or name another --out (nothing was changed)")
    pinned = pinning_manifest(out.parent)
    if pinned is not None:
        raise InputError(f"{out}: lies inside {pinned}, whose {MANIFEST_NAME} covers every file there; writing it "
                         f"would make `alibi manifest verify {pinned}` fail; write it beside: "
                         f"--out {pinned.parent / (pinned.name + '.' + HTML_NAME)}")
    atomic.check_writable_dir(out.parent)
    return out


__all__ = ["HTML_NAME", "RenderedPage", "check_output", "conform_html", "default_output", "pinning_manifest",
           "render_folder", "write_conform_html", "write_report_html"]

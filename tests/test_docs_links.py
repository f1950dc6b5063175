"""Every link in README.md and docs/ resolves: each relative target exists in the repository, and each
`#anchor` names a heading of the file it points to. Web addresses are not fetched (CI is offline);
they must at least be https."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# [text](target) and ![alt](target), outside code spans and fenced blocks
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def test_the_readme_and_the_docs_have_links_to_check():
    assert len(PAGES) > 10
    assert sum(len(links(p)) for p in PAGES) > 30


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_the_page_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            if not target.startswith("https://"):
                broken.append(f"{target}: not an https address")
            continue
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: {where.relative_to(REPO) if where.is_relative_to(REPO) else where} "
                          "does not exist")
        elif not where.resolve().is_relative_to(REPO):
            broken.append(f"{target}: points outside the repository")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: {where.name} has no heading #{fragment}")
    assert broken == [], f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(broken)


def test_a_missing_file_and_a_missing_heading_are_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n\n[a](page.md#two-words) [b](nope.md) `[c](in-code.md)`\n")
    assert links(page) == ["page.md#two-words", "nope.md"]
    assert anchors(page) == {"title", "two-words"}

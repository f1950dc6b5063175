"""The project's docs stand alone: they cite no file outside the repository and no issue of its tracker."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
# The planning notes the project was built from live outside the repository; the tracker's issue numbers mean
# nothing to a reader of a release.
OUTSIDE = re.compile(r"\b(?:science|environment|design|style)\.md\b|\bissues? \d+\b", re.IGNORECASE)


def test_the_docs_cite_no_file_outside_the_repository_and_no_issue_number():
    found = [f"{p.relative_to(DOCS)}:{n}: {m.group(0)}" for p in sorted(DOCS.rglob("*.md"))
             for n, line in enumerate(p.read_text("utf-8").splitlines(), 1) for m in OUTSIDE.finditer(line)]
    assert not found, "docs cite what a reader cannot open:\n" + "\n".join(found)

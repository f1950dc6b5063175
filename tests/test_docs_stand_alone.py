"""The project's docs stand alone: they cite no file outside the repository, and no issue of its tracker
except where a record is keyed by one."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
# The planning notes the project was built from live outside the repository.
OUTSIDE_NOTES = re.compile(r"\b(?:science|environment|design|style)\.md\b", re.IGNORECASE)
ISSUE = re.compile(r"\bissues? \d+\b", re.IGNORECASE)
# docs/hardening.md describes the hardening regression record, whose entries and files are keyed by the issue
# that found them (analysis/results/hardening-regressions-issue26.json): there the number names a record.
ISSUE_KEYED = {"hardening.md"}


def _hits(pattern: re.Pattern, skip: set[str] = frozenset()) -> list[str]:
    return [f"{p.relative_to(DOCS)}:{n}: {m.group(0)}" for p in sorted(DOCS.rglob("*.md"))
            if p.name not in skip
            for n, line in enumerate(p.read_text("utf-8").splitlines(), 1) for m in pattern.finditer(line)]


def test_the_docs_cite_no_notes_outside_the_repository():
    found = _hits(OUTSIDE_NOTES)
    assert not found, "docs cite files a reader cannot open:\n" + "\n".join(found)


def test_the_docs_cite_no_issue_number_outside_the_issue_keyed_record():
    found = _hits(ISSUE, ISSUE_KEYED)
    assert not found, "docs cite tracker issues a reader cannot open:\n" + "\n".join(found)

"""The committed record of issue 36's hostile cases (`analysis/hardening_regressions.py`, docs/hardening.md) is
complete and says what a record must: every case the script declares was run, every test it names exists here,
failed on the code before its fix or on a named mutation of it, and passed at the record's commit. The cases'
tests themselves run with the rest of the suite."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "analysis" / "results" / "cpu" / "hardening-issue36" / "hardening-regressions.json"
CAUGHT = {"fails before the fix", "fails on the mutation"}


def _script():
    spec = importlib.util.spec_from_file_location("hardening_regressions", REPO / "analysis" / "hardening_regressions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _issue36_tests() -> dict[str, list[str]]:
    """Test id -> the items of the issue-36 cases that name it, as the script declares them."""
    named = defaultdict(list)
    for fix in _script().FIXES:
        if fix.item.startswith("issue 36"):
            for test in fix.tests:
                named[test].append(fix.item)
    return named


def test_every_test_an_issue_36_case_names_is_a_test_function_of_this_tree():
    missing = []
    for test in _issue36_tests():
        path, name = test.split("::")
        tree = ast.parse((REPO / path).read_text())
        if name not in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}:
            missing.append(test)
    assert missing == []


def test_the_committed_record_ran_every_issue_36_case_and_each_test_was_caught_failing_and_passed_at_its_commit():
    record = json.loads(RECORD.read_text())
    assert record["schema"] == "alibi.hardening-regressions/1"
    entries = defaultdict(list)
    for entry in record["tests"]:
        entries[entry["test"]].append(entry)
    declared = _issue36_tests()
    assert sorted(set(declared) - set(entries)) == []
    for test, items in declared.items():
        ran = entries[test]
        assert all(e["head"] == "passed" for e in ran), test
        # a test that failed only because its module did not import on the old code must also be caught by a
        # mutation: only a failure of the property it claims shows that it guards that property
        assert {e["verdict"] for e in ran} & CAUGHT, (test, [e["verdict"] for e in ran])
        assert {e["item"] for e in ran} >= set(items), test
    assert "cannot fail" not in {e["verdict"] for e in record["tests"]}


def test_every_class_of_issue_36_has_cases_in_the_record():
    classes = {e["item"].split(":")[0].split(" (")[0] for e in json.loads(RECORD.read_text())["tests"]
               if e["item"].startswith("issue 36 #")}
    assert {f"issue 36 #{k}" for k in range(8)} <= classes

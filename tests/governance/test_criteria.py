"""Pre-registered acceptance criteria judged by code: holds, fails, inapplicable, and the layer study."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from alibi.cli import main
from alibi.errors import InputError
from alibi.experiment import load_experiment, run_experiment
from alibi.governance import prereg
from alibi.governance.manifest import build_predicate, write_manifest
from alibi.governance.criteria import (
    Criterion,
    Evaluation,
    conform_report_metrics,
    evaluate,
    load_criteria,
    parse_criteria,
    read_source,
    study_criteria,
)

REPO = Path(__file__).resolve().parents[2]
LAYER_STUDY = REPO / "prereg" / "smollm2-layer-verification"
LAYER_REPORT = REPO / "analysis" / "results" / "h200" / "smollm2-layer-verification" / "report" / "report.json"


def _c(metric: str, op: str, value, source: str = "r", cid: str = "c1") -> Criterion:
    return Criterion(cid, "a prediction", source, metric, op, value)


def test_a_criterion_holds_fails_or_is_inapplicable_and_the_verdict_follows_the_worst():
    doc = {"n_flips": 3, "n_positions": 10, "logits_identical": 10, "auc": None}
    cases = [(_c("n_flips", ">", 0, cid="a"), True), (_c("n_flips", "==", 0, cid="b"), False),
             (_c("auc", ">", 0.5, cid="c"), None), (_c("absent.metric", ">", 0.5, cid="d"), None)]
    ev = evaluate(tuple(c for c, _ in cases), {"r": doc}, {"r": {"path": "x", "sha256": "0" * 64}})
    assert [o.holds for o in ev.outcomes] == [want for _, want in cases]
    assert ev.verdict == "fail"
    assert evaluate((cases[0][0], cases[2][0]), {"r": doc}, {}).verdict == "inconclusive"
    assert evaluate((cases[0][0],), {"r": doc}, {}).verdict == "pass"


def test_a_dollar_value_compares_with_another_metric_of_the_same_source():
    doc = {"logits_identical": 16384, "n_positions": 16384, "counts": {"n": 16383}}
    ok = evaluate((_c("logits_identical", "==", "$n_positions"),), {"r": doc}, {})
    short = evaluate((_c("counts.n", "==", "$n_positions"),), {"r": doc}, {})
    assert ok.verdict == "pass" and short.verdict == "fail"
    assert short.outcomes[0].expected == 16384


def test_a_criterion_naming_a_source_that_was_not_given_is_inapplicable_never_a_pass():
    ev = evaluate((_c("n_flips", "==", 0, source="pow2"),), {"real": {"n_flips": 0}}, {})
    assert ev.verdict == "inconclusive" and ev.outcomes[0].holds is None


def test_a_boolean_or_string_metric_is_compared_only_for_equality():
    assert evaluate((_c("verdict", "==", "pass"),), {"r": {"verdict": "pass"}}, {}).verdict == "pass"
    assert evaluate((_c("verdict", ">", "pass"),), {"r": {"verdict": "pass"}}, {}).outcomes[0].holds is None


@pytest.mark.parametrize("entry, message", [
    ({"id": "x", "prediction": "p", "source": "s", "metric": "m", "op": "~", "value": 1}, "op '~' is not one of"),
    ({"id": "x", "prediction": "p", "source": "s", "metric": "m", "value": 1}, "lacks op"),
    ({"id": "x", "prediction": "p", "source": "s", "metric": "m", "op": "<", "value": 1, "extra": 2},
     "unknown key"),
])
def test_malformed_criteria_are_refused_naming_the_entry(entry, message):
    with pytest.raises(InputError, match=message):
        parse_criteria([entry], "analysis.yaml")


def test_duplicate_criterion_ids_are_refused():
    entry = {"id": "x", "prediction": "p", "source": "s", "metric": "m", "op": "<", "value": 1}
    with pytest.raises(InputError, match="criterion id 'x' appears twice"):
        parse_criteria([entry, entry], "analysis.yaml")


def test_the_evaluation_round_trips_through_its_json_schema():
    ev = evaluate((_c("n", ">=", 1),), {"r": {"n": 2}}, {"r": {"path": "p", "sha256": "a" * 64}}, {"lock_sha256": "b"})
    back = Evaluation.from_json(ev.to_json())
    assert back == Evaluation(ev.verdict, ev.outcomes, ev.sources, ev.protocol)
    assert json.loads(ev.to_json())["schema"] == "alibi-criteria/v1"


def test_the_committed_h200_layer_study_meets_every_translated_criterion_of_its_locked_protocol():
    criteria = study_criteria(LAYER_STUDY)
    doc, src = read_source(LAYER_REPORT)
    ev = evaluate(criteria, {"report": doc}, {"report": src})
    assert ev.verdict == "pass", [o.reason for o in ev.outcomes if not o.holds]
    assert {"P2-count", "P3-ulp", "P3-rare", "P3-some"} <= {o.criterion.id for o in ev.outcomes}


def test_the_layer_study_criteria_fail_when_one_pow2_unit_differs():
    raw = json.loads(LAYER_REPORT.read_text())
    pow2 = next(u for u in raw["tiles"] if u["regime"] == "pow2")
    pow2["n_differing"] = 1
    tampered = {**raw, **conform_report_metrics(raw)}
    ev = evaluate(study_criteria(LAYER_STUDY), {"report": tampered}, {})
    assert [o.criterion.id for o in ev.outcomes if o.holds is False] == ["P2-count"]


def _locked_protocol(tmp_path: Path, criteria: list[dict]) -> Path:
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    (folder / "analysis.yaml").write_text(yaml.safe_dump({"criteria": criteria}, sort_keys=False))
    prereg.lock(folder)
    return folder


def test_alibi_run_under_a_protocol_writes_criteria_json_judged_against_its_report(tmp_path, committed_code):
    folder = _locked_protocol(tmp_path, [
        {"id": "no-pow2-difference", "prediction": "p", "source": "report",
         "metric": "regimes_summary.pow2.n_differing", "op": "==", "value": 0},
        {"id": "real-differs", "prediction": "p", "source": "report",
         "metric": "regimes_summary.real.n_differing", "op": ">", "value": 0}])
    exp = tmp_path / "e.yaml"
    exp.write_text(yaml.safe_dump({"name": "s", "kernels": {"a": "emulator:w_then_a", "b": "emulator:a_then_w"},
                                   "source": {"synthetic": {"preset": "tiny"}}, "scales": ["real", "pow2"],
                                   "seed": 0, "prereg": str(folder), "out": str(tmp_path / "out")}))
    run_experiment(load_experiment(exp))
    judged = Evaluation.from_json((tmp_path / "out" / "criteria.json").read_text())
    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    real_differing = sum(u["n_differing"] for u in report["tiles"] if u["regime"] == "real")
    assert judged.outcomes[0].holds is True
    assert judged.outcomes[1].holds is (real_differing > 0)
    assert judged.protocol["lock_sha256"] == prereg.state(folder).lock_sha256


def test_alibi_run_refuses_a_locked_protocol_without_criteria_before_measuring(tmp_path):
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    (folder / "analysis.yaml").write_text("scales: [real]\n")
    prereg.lock(folder)
    exp = tmp_path / "e.yaml"
    exp.write_text(yaml.safe_dump({"name": "s", "kernels": {"a": "emulator:w_then_a", "b": "emulator:a_then_w"},
                                   "source": {"synthetic": {"preset": "tiny"}}, "prereg": str(folder),
                                   "out": str(tmp_path / "out")}))
    with pytest.raises(InputError, match="states no acceptance criteria"):
        run_experiment(load_experiment(exp))
    assert not (tmp_path / "out").exists()


def _result(folder: Path, name: str, doc: dict, kind: str = "report") -> Path:
    """A result file as an alibi command leaves it: in its folder, under that folder's manifest."""
    folder.mkdir(parents=True)
    (folder / name).write_text(json.dumps(doc, indent=1) + "\n")
    write_manifest(folder, kind, build_predicate())
    return folder / name


def test_prereg_evaluate_exits_1_when_a_criterion_fails_and_writes_the_evaluation(tmp_path, capsys):
    folder = _locked_protocol(tmp_path, [{"id": "no-flips", "prediction": "p", "source": "pow2",
                                          "metric": "n_flips", "op": "==", "value": 0}])
    result = _result(tmp_path / "flips", "flips.json", {"schema": "alibi-test-result/v1", "n_flips": 2})
    out = tmp_path / "criteria.json"
    assert main(["prereg", "evaluate", str(folder), "--result", f"pow2={result}", "--out", str(out)]) == 1
    assert Evaluation.from_json(out.read_text()).outcomes[0].observed == 2
    assert main(["prereg", "evaluate", str(folder), "--result", f"pow2{result}"]) == 2
    assert "expected NAME=FILE" in capsys.readouterr().err


def test_an_analysis_file_with_a_yaml_alias_is_refused_on_one_line(tmp_path):
    """Guards: `criteria.py` read YAML with plain safe_load, which expands aliases (an alias bomb),
    while its docstring promised they were refused like everywhere else."""
    path = tmp_path / "analysis.yaml"
    path.write_text("base: &b {id: x, prediction: p, source: report, metric: verdict, op: '==', value: pass}\n"
                    "criteria:\n  - *b\n")
    with pytest.raises(InputError) as info:
        load_criteria(path)
    assert "YAML aliases are refused" in str(info.value) and "\n" not in str(info.value)

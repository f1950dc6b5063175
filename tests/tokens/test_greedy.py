"""Greedy agreement: first divergence, self-reproduction, the batched generator, and the two-arm CLI."""

from __future__ import annotations

import json

import pytest

from alibi.errors import InputError
from alibi.governance.manifest import verify_files
from alibi.tokens.greedy import (
    GreedyAgreement,
    GreedyRun,
    compare_runs,
    first_divergence,
    graphs_for,
)

from .conftest import needs_model_extra


def test_first_divergence_is_the_index_of_the_first_differing_token_or_none():
    assert first_divergence((1, 2, 3), (1, 2, 3)) is None
    assert first_divergence((1, 2, 3), (1, 5, 3)) == 1
    assert first_divergence((4, 2), (1, 2)) == 0
    assert first_divergence((1, 2), (1, 2, 3)) == 2


def _run(arm, run, sequences, **kw):
    base = {"kernel": f"k-{arm}", "arm": arm, "run": run, "prompt_tokens": 4, "new_tokens": 3, "batch_size": 2,
            "windows": (0, 1, 2), "prompt_sha256": ("x", "y", "z"), "sequences": sequences, "seconds": 0.1}
    return GreedyRun(**{**base, **kw})


SEQ = ((1, 2, 3), (4, 5, 6), (7, 8, 9))


def test_agreement_counts_identical_prompts_and_names_where_the_arms_part():
    b = ((1, 2, 3), (4, 0, 6), (0, 8, 9))
    r = compare_runs([_run("a", 1, SEQ), _run("a", 2, SEQ)], [_run("b", 1, b), _run("b", 2, b)], {})
    assert (r.n_prompts, r.identical_sequences, r.first_divergence) == (3, 1, (None, 1, 0))
    assert r.arm_a_reproduces and r.arm_b_reproduces and r.status == "compared"
    assert GreedyAgreement.from_json(r.to_json()) == r
    assert json.loads(r.to_json())["first_divergence"] == [None, 1, 0]


def test_an_arm_that_differs_from_itself_is_reported_and_its_divergence_located():
    drift = ((1, 2, 3), (4, 5, 0), (7, 8, 9))
    r = compare_runs([_run("a", 1, SEQ), _run("a", 2, drift)], [_run("b", 1, SEQ), _run("b", 2, SEQ)], {})
    assert not r.arm_a_reproduces and r.arm_b_reproduces
    assert r.self_first_divergence_a == (None, 2, None)
    assert "arm a (k-a) does not reproduce itself" in r.status


def test_runs_of_different_requests_are_not_compared():
    with pytest.raises(InputError, match="other prompts or settings"):
        compare_runs([_run("a", 1, SEQ)], [_run("b", 1, SEQ, batch_size=1)], {})


def test_a_truncated_run_file_is_refused():
    text = _run("a", 1, SEQ).to_json()
    doc = json.loads(text)
    doc["sequences"] = doc["sequences"][:2]
    with pytest.raises(InputError, match="truncated"):
        GreedyRun.from_json(json.dumps(doc))
    with pytest.raises(InputError, match="not valid JSON"):
        GreedyRun.from_json(text[: len(text) // 2])


@needs_model_extra
def test_each_prompt_alone_continues_as_its_row_of_the_batch(tiny):
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model

    lm = load_model(tiny / "w8a8", "torch-cpu")
    ids = load_prompt_set(tiny / "set").input_ids
    rows = lm.greedy_batch(ids[:, :16], 10)
    assert rows.shape == (3, 10)
    for w in range(3):
        assert lm.greedy(ids[w, :16], 10).tolist() == rows[w].tolist()


@needs_model_extra
@pytest.mark.slow
def test_two_arms_with_the_same_epilogue_agree_on_every_prompt_across_cold_restarts(tiny, tmp_path, capsys):
    """torch-cpu declares w_then_a+add_before_cast; the emulator of that model computes the same
    fp32 operations on the same exact accumulator, so every logit and every token must agree."""
    from alibi.cli import main

    out = tmp_path / "greedy"
    assert main(["replay", "greedy", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"),
                 "--kernel-a", "torch-cpu", "--kernel-b", "emulator:w_then_a+add_before_cast",
                 "--prompt-tokens", "16", "--new-tokens", "8", "--batch-size", "2", "--quiet", "--out", str(out)]) == 0
    assert "identical sequences across arms: 3/3" in capsys.readouterr().out
    r = GreedyAgreement.from_json((out / "greedy.json").read_text())
    assert (r.n_prompts, r.identical_sequences, r.first_divergence) == (3, 3, (None, None, None))
    assert r.arm_a_reproduces and r.arm_b_reproduces and r.runs_per_arm == 2 and r.batch_size == 2
    assert all(rec["verified"] for rec in r.identity.values())
    assert set(r.identity) == {"a-1 vs b-1", "a-1 vs a-2", "b-1 vs b-2"}
    assert verify_files(out) == [] and sorted(p.name for p in (out / "runs").iterdir()) == ["a-1", "a-2", "b-1", "b-2"]
    runs = [GreedyRun.from_json((out / "runs" / n / "run.json").read_text()) for n in ("a-1", "b-1")]
    assert [r.kernel for r in runs] == ["torch-cpu", "emulator:w_then_a+add_before_cast"]
    assert r.sequences_a[0] == runs[0].sequences and r.sequences_b[0] == runs[1].sequences
    assert all(len(s) == 8 for s in runs[0].sequences)


@needs_model_extra
def test_cuda_graph_decoding_is_refused_with_a_trace_and_on_the_cpu_before_anything_is_written(tiny, tmp_path, capsys):
    from alibi.cli import main

    common = ["replay", "greedy", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"), "--prompt-tokens",
              "16", "--new-tokens", "4", "--quiet", "--decode", "cuda-graphs"]
    assert main([*common, "--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu", "--trace",
                 "--out", str(tmp_path / "both")]) == 2
    assert "--trace and --decode cuda-graphs" in capsys.readouterr().err
    assert main([*common, "--kernel", "torch-cpu", "--out", str(tmp_path / "cpu")]) == 2
    assert "CUDA graphs need a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "both").exists() and not (tmp_path / "cpu").exists()


def test_auto_decoding_asks_for_graphs_only_where_they_can_run_and_never_with_a_trace():
    assert graphs_for("auto", trace=False) is None  # load_model decides: graphs on a CUDA device only
    assert graphs_for("auto", trace=True) is False
    assert (graphs_for("eager", trace=False), graphs_for("cuda-graphs", trace=False)) == (False, True)
    with pytest.raises(InputError, match="--decode graphs: choose one of auto, eager, cuda-graphs"):
        graphs_for("graphs", trace=False)


@needs_model_extra
def test_auto_decoding_on_the_cpu_decodes_eagerly_and_records_no_decoding(tiny, tmp_path):
    from alibi.cli import main

    out = tmp_path / "run"
    assert main(["replay", "greedy", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"), "--prompt-tokens",
                 "16", "--new-tokens", "2", "--quiet", "--kernel", "torch-cpu", "--out", str(out)]) == 0
    execution = json.loads((out / "manifest.json").read_text())["predicate"]["parameters"]["execution"]
    assert "decode" not in execution and "graphs_refused" not in execution


def _run_with_execution(folder, execution):
    from alibi.governance.manifest import build_predicate, write_manifest

    folder.mkdir()
    (folder / "run.json").write_text("{}")
    write_manifest(folder, "replay", build_predicate(parameters={"execution": execution}))
    return folder


def test_arms_that_auto_decoding_split_between_graphs_and_eager_stop_the_study_naming_the_eager_arm(tmp_path):
    from alibi.tokens.greedy import refuse_mixed_decoding

    graphs = _run_with_execution(tmp_path / "a", {"deterministic": True, "decode": "cuda-graphs",
                                                  "graphs_refused": None})
    refused = _run_with_execution(tmp_path / "b", {"deterministic": True, "decode": "eager",
                                                   "graphs_refused": "kernel k cannot be captured in a CUDA graph"})
    with pytest.raises(InputError, match="arm b decoded eagerly \\(kernel k cannot be captured in a CUDA graph\\) "
                                         "and the other arm with CUDA graphs; .* pass --decode eager"):
        refuse_mixed_decoding(graphs, refused)
    eager = _run_with_execution(tmp_path / "c", {"deterministic": True})  # eager on the CPU: no decode recorded
    refuse_mixed_decoding(eager, _run_with_execution(tmp_path / "d", {"deterministic": True}))
    with pytest.raises(InputError, match="arm a decoded eagerly \\(it decoded eagerly\\)"):
        refuse_mixed_decoding(eager, graphs)

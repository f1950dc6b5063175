"""Resource and environment failures are one line (issue 36 #4).

Facts asserted: a full disk during `pow2-rewrite`, `model prepare` or `conform` is one line naming
the output, exit 2, nothing left behind and the inputs unchanged (the disk is filled by a simulated
ENOSPC at the write: a tmpfs mount needs root); absurd counts (`--bootstrap 10¹²`, `--elements
1e30`, `--seeds 10¹²`) are refused before any work; the hidden `--execution-out` of `alibi variations`
pointing at an unwritable place is refused before the model loads; a pickled, malformed or
incomplete trace is one line without torch's advice to load it with `weights_only=False`; of two
concurrent `prereg amend` calls one wins and the other is refused, and no amendment is lost.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from alibi.cli import main
from alibi.errors import InputError

REPO = Path(__file__).resolve().parents[2]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root`, hidden ones included, with a file's bytes (None for a folder)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def _one_line_exit_2(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


# --- a full disk -------------------------------------------------------------------------------------


def _fill_disk_at_write(monkeypatch, module, name: str, after: int = 0) -> list[int]:
    """Make `module.name` (a writer) write a partial file and raise ENOSPC at its call number `after`."""
    real = getattr(module, name)
    calls = []

    def full(tensors, filename, *args, **kwargs):
        calls.append(1)
        if len(calls) <= after:
            return real(tensors, filename, *args, **kwargs)
        Path(filename).write_bytes(b"\0" * 100)  # the part that fitted
        from safetensors import SafetensorError

        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(module, name, full)
    return calls


@pytest.fixture
def w8a8_dir(tmp_path: Path) -> Path:
    from model.builders import tiny_dense_tensors, write_dense, write_llm_compressor_style

    from alibi.model.checkpoint import read_tensors

    dense = write_dense(tmp_path / "inputs" / "bf16", tiny_dense_tensors(seed=7))
    write_llm_compressor_style(tmp_path / "inputs" / "w8a8", read_tensors(dense), shards=2)
    return tmp_path / "inputs" / "w8a8"


@pytest.mark.parametrize("after", [0, 1])
def test_a_full_disk_during_pow2_rewrite_is_one_line_naming_the_output_and_leaves_nothing(tmp_path, w8a8_dir,
                                                                                        monkeypatch, capsys, after):
    from alibi.model import pow2_rewrite

    before = _snapshot(tmp_path)
    _fill_disk_at_write(monkeypatch, pow2_rewrite, "save_file", after)
    out = tmp_path / "out" / "pow2"
    err = _one_line_exit_2(["pow2-rewrite", str(w8a8_dir), str(out), "--mode", "ceil", "--keep-weights"], capsys)
    assert str(out) in err and "ran out of space" in err and "choose another output location" in err, err
    assert _snapshot(tmp_path) == before  # no stage, no partial shard, inputs byte for byte


def test_a_full_disk_during_model_prepare_is_one_line_naming_the_output_and_leaves_nothing(tmp_path, monkeypatch,
                                                                                         capsys):
    pytest.importorskip("gguf")
    from alibi.model import checkpoint

    _fill_disk_at_write(monkeypatch, checkpoint, "save_file")
    out = tmp_path / "models"
    err = _one_line_exit_2(["model", "prepare", "smollm2-135m", "--out", str(out), "--quiet"], capsys)
    assert str(out) in err and "ran out of space" in err, err
    assert list(tmp_path.iterdir()) == []


def _conform_argv(out: Path) -> list[str]:
    return ["conform", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
            "--out", str(out), "--quiet"]


def _fsync_fills_the_disk(monkeypatch, at: int, error: BaseException = ENOSPC) -> list[int]:
    """The `at`-th fsync of an atomic write (0-based) reports ENOSPC, as a full disk does on the flush."""
    from alibi.io import atomic

    real, calls = atomic.os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) - 1 == at:
            raise error
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    return calls


def _conform_writes(tmp_path: Path, monkeypatch) -> int:
    with monkeypatch.context() as m:
        calls = _fsync_fills_the_disk(m, at=-1)
        assert main(_conform_argv(tmp_path / "probe" / "r")) in (0, 1)
    return len(calls)


@pytest.mark.parametrize("where", ["plan", "unit", "report"])
def test_a_full_disk_during_conform_is_one_line_naming_out_and_a_fresh_run_leaves_nothing(tmp_path, monkeypatch,
                                                                                          capsys, where):
    """At the units folder's plan, at a unit, at the last file of the staged report: the one line names --out;
    the units computed so far go too (a fresh run keeps nothing), and the folders made on the way."""
    total = _conform_writes(tmp_path, monkeypatch)
    at = {"plan": 0, "unit": 2, "report": total - 1}[where]
    work = tmp_path / "work"
    work.mkdir()
    _fsync_fills_the_disk(monkeypatch, at)
    out = work / "sub" / "report"
    err = _one_line_exit_2(_conform_argv(out), capsys)
    assert str(out) in err and "ran out of space" in err and "--out" in err, err
    assert list(work.iterdir()) == []


def test_a_full_disk_during_a_resumed_conform_keeps_the_units_and_says_to_resume(tmp_path, monkeypatch, capsys):
    from alibi.cli import conform as conform_cli

    out = tmp_path / "report"
    units = conform_cli.units_dir(out)
    with monkeypatch.context() as m:  # a run stopped by Ctrl-C after its first units: they are kept to resume
        _fsync_fills_the_disk(m, at=3, error=KeyboardInterrupt())
        assert main(_conform_argv(out)) == 130
    kept = _snapshot(units)
    assert any(name.endswith("-layers.0.proj.json") for name in kept)
    _fsync_fills_the_disk(monkeypatch, at=0)
    err = _one_line_exit_2([*_conform_argv(out), "--resume"], capsys)
    assert "--resume" in err and str(units) in err, err
    assert _snapshot(units) == kept and not out.exists()


def test_a_library_error_that_wraps_enospc_outside_a_staged_write_is_one_line_exit_2(monkeypatch, capsys):
    from safetensors import SafetensorError

    from alibi.cli import kernels as kernels_cli

    def full(args):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(kernels_cli, "list_kernels", full)
    err = _one_line_exit_2(["kernels"], capsys)
    assert "ran out of space" in err and "free space" in err, err


# --- absurd sizes --------------------------------------------------------------------------------------


def _no_work(monkeypatch, target: str) -> None:
    def started(*args, **kwargs):
        raise AssertionError(f"{target} started: the request should have been refused before any work")

    monkeypatch.setattr(target, started)


@pytest.mark.parametrize("argv, option, work", [
    (["sweep", "rows", "--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu", "--elements", "1e30"], "--elements",
     "alibi.sweep.rows.run_rows_sweep"),
    (["sweep", "depth", "--kernel-a", "torch-cpu", "--kernel-b", "torch-cpu", "--format", "int8", "--seeds",
      str(10**12)], "--seeds", "alibi.sweep.depth.run_depth_sweep"),
    (["analyze", "flips", "ARM", "ARM", "--bootstrap", str(10**12)], "--bootstrap",
     "alibi.tokens.flips.flip_statistics"),
    (["analyze", "depth", "SWEEP", "--bootstrap", str(10**12)], "--bootstrap", "alibi.sweep.analysis.analyze"),
])
def test_absurd_counts_are_refused_in_one_line_naming_the_option_before_any_work(tmp_path, monkeypatch, capsys,
                                                                               argv, option, work):
    _no_work(monkeypatch, work)
    argv = [str(tmp_path / "missing") if a in ("ARM", "SWEEP") else a for a in argv]
    err = _one_line_exit_2([*argv, "--out", str(tmp_path / "out")], capsys)
    assert option in err and "over the limit" in err, err
    assert list(tmp_path.iterdir()) == []


# --- a hidden output option -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["unwritable", "under a file", "a folder"])
def test_the_hidden_execution_out_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys, where):
    _no_work(monkeypatch, "alibi.tokens.variations.load_model")
    (tmp_path / "file").write_text("x")
    target = {"unwritable": Path("/proc/alibi-no-such/x.pt"), "under a file": tmp_path / "file" / "x.pt",
              "a folder": tmp_path}[where]
    before = _snapshot(tmp_path)
    err = _one_line_exit_2(["variations", "--model", str(tmp_path / "model"), "--prompts",
                            str(REPO / "experiments" / "prompts" / "wikipedia-8x512"), "--execution", "decode@1",
                            "--execution-out", str(target)], capsys)
    assert "--execution-out" in err and str(target) in err, err
    assert _snapshot(tmp_path) == before


def test_an_execution_is_saved_atomically_and_a_full_disk_leaves_no_file(tmp_path, monkeypatch):
    from alibi.model.trace import ModuleTrace
    from alibi.tokens.variations import Execution, save_execution

    _fsync_fills_the_disk(monkeypatch, at=0)
    with pytest.raises(InputError, match="ran out of space"):
        save_execution(Execution("e", {}, ModuleTrace(None)), tmp_path / "execution.pt")
    assert list(tmp_path.iterdir()) == []


# --- a malformed or pickled trace -----------------------------------------------------------------------


class _Payload:
    """An object a pickle may carry: loading it would call os.getpid (harmless here, anything elsewhere)."""

    def __reduce__(self):
        return (os.getpid, ())


def _valid_doc() -> dict:
    return {"name": "e", "logits": [[0, 3, 12345]], "order": ["m"], "kinds": ["linear"],
            "calls": [[0, 0, 4, [0, 1]]], "digests": {"m": [[0, torch.zeros(2, 4, dtype=torch.int64)]]}}


def _bad_traces() -> dict[str, object]:
    docs = {"a pickled object": {**_valid_doc(), "name": _Payload()}}
    for key in ("name", "order", "calls", "digests"):
        doc = _valid_doc()
        del doc[key]
        docs[f"no {key!r} key"] = doc
    doc = _valid_doc()
    doc["digests"]["m"][0][1] = torch.zeros(3, 4, dtype=torch.int64)  # 3 rows for a call of 2 prompts
    docs["a digest of another shape"] = doc
    doc = _valid_doc()
    doc["digests"]["m"][0][0] = 7  # a call the trace does not hold
    docs["a digest of no call"] = doc
    docs["a list, not a table"] = [1, 2, 3]
    return docs


def _refused_in_one_line(tmp_path: Path, case: str) -> None:
    from alibi.tokens.variations import load_execution

    path = tmp_path / "trace.pt"
    if case == "not a torch file":
        path.write_bytes(b"PK\x03\x04 not really a zip")
    elif case == "an empty file":
        path.write_bytes(b"")
    else:
        torch.save(_bad_traces()[case], path)
    with pytest.raises(InputError) as info:
        load_execution(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message and "weights_only" not in message, message
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("case", ["a pickled object", "no 'name' key", "a digest of another shape",
                                  "a digest of no call", "an empty file"])
def test_a_pickled_incomplete_or_misshapen_trace_is_one_input_error_without_weights_only_advice(tmp_path, case):
    _refused_in_one_line(tmp_path, case)


@pytest.mark.parametrize("case", ["no 'order' key", "no 'calls' key", "no 'digests' key", "a list, not a table",
                                  "not a torch file"])
def test_a_trace_missing_a_table_key_or_not_a_torch_file_stays_one_input_error(tmp_path, case):
    _refused_in_one_line(tmp_path, case)


def test_a_pickled_trace_is_never_unpickled(tmp_path, monkeypatch):
    from alibi.tokens.variations import load_execution

    path = tmp_path / "trace.pt"
    torch.save({**_valid_doc(), "name": _Payload()}, path)
    calls = []
    monkeypatch.setattr(os, "getpid", lambda: calls.append(1) or 1)
    with pytest.raises(InputError, match="never loads"):
        load_execution(path)
    assert calls == []


def test_a_trace_the_writer_wrote_reads_back(tmp_path):
    from alibi.tokens.variations import load_execution

    torch.save(_valid_doc(), tmp_path / "trace.pt")
    ex = load_execution(tmp_path / "trace.pt")
    assert ex.name == "e" and ex.logits == {(0, 3): 12345} and ex.trace.order == ["m"]


# --- concurrent amendments --------------------------------------------------------------------------------


@pytest.fixture
def amended(tmp_path: Path) -> Path:
    """A locked protocol with one change waiting for its amendment."""
    from alibi.governance import prereg

    root = tmp_path / "study"
    prereg.init(root, "study")
    prereg.lock(root)
    with open(root / "protocol.md", "a") as fh:
        fh.write("\nDeviation: one more seed.\n")
    return root


def _interleave(monkeypatch, prereg, second: list) -> None:
    """While the first amend has read the protocol's state, a second amend of the same folder runs."""
    real, started = prereg.state, []

    def state(folder):
        st = real(folder)
        if not started:
            started.append(1)
            try:
                second.append(prereg.amend(folder, "the second"))
            except InputError as exc:
                second.append(exc)
        return st

    monkeypatch.setattr(prereg, "state", state)


def test_of_two_concurrent_amends_one_wins_and_the_other_is_refused(amended, monkeypatch):
    from alibi.governance import prereg

    second: list = []
    _interleave(monkeypatch, prereg, second)
    head = prereg.amend(amended, "the first")
    monkeypatch.undo()
    assert isinstance(second[0], InputError) and "another `alibi prereg lock` or `amend`" in str(second[0])
    st = prereg.state(amended)
    assert st.problems == () and st.amendments == 1 and st.head_sha256 == head
    assert '"reason":"the first"' in (amended / prereg.LOG_NAME).read_text()


def test_an_amendment_recorded_meanwhile_by_a_writer_without_the_lock_refuses_the_other(amended, monkeypatch):
    """Where flock is not available: the compare-and-swap on the log refuses the amend that read an older log."""
    from alibi.governance import prereg

    monkeypatch.setattr(prereg, "fcntl", None, raising=False)
    second: list = []
    _interleave(monkeypatch, prereg, second)
    with pytest.raises(InputError, match="another amendment was recorded while this one was prepared"):
        prereg.amend(amended, "the first")
    monkeypatch.undo()
    st = prereg.state(amended)
    assert isinstance(second[0], str) and st.problems == () and st.amendments == 1 and st.head_sha256 == second[0]
    assert '"reason":"the second"' in (amended / prereg.LOG_NAME).read_text()


def test_prereg_amend_while_another_process_holds_the_folder_is_one_line_exit_2_and_writes_nothing(amended):
    import fcntl

    from alibi.governance import prereg

    fd = os.open(amended, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = _snapshot(amended)
        done = subprocess.run([sys.executable, "-m", "alibi", "prereg", "amend", str(amended), "--reason", "why"],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(fd)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "another `alibi prereg lock` or `amend`" in done.stderr and str(amended) in done.stderr
    assert _snapshot(amended) == before and not (amended / prereg.LOG_NAME).exists()

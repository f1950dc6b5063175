"""Sharded conformance (alibi.conform.shard, `conform --devices/--ray`): worker processes and Ray tasks compute the
units, `run_conformance` assembles them, and the report folder is the single-process one byte for byte
(the manifest differing only in its recorded sharding). CPU kernels and CPU worker processes only."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from hostile import main_one_line
from resumed_report import without_units_record

from alibi.cli import main
from alibi.conform.shard import ShardJob, ShardRun, SourceSpec, parse_devices, run_shard, shard_tiles
from alibi.errors import InputError
from alibi.governance.manifest import read_manifest, verify_files

EPOCH = "1700000000"  # SOURCE_DATE_EPOCH: the report's created_at is then the same in every run
SOURCE = ["--synthetic", "smollm2-135m-bias", "--rows", "8"]  # 7 tiles (q k v o gate up down), bias, bf16
PAIR = ["--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w"]
REPORT_FILES = ("report.json", "report.md", "junit.xml", "report.html")

# A kernel registered through the `alibi.kernels` entry-point group, as a third-party package would: correct
# (the exact accumulator under the a_then_w epilogue) except on tiles whose K is $SHARD_TEST_FAIL_K, where it
# fails as $SHARD_TEST_FAIL_KIND says (when set). The only K=1536 tile of the source is layers.0.down_proj, tile 6: the
# last tile of worker 0 with 2 workers (0 2 4 6) and with 3 (0 3 6), so worker 0 writes units before failing.
PLUGIN = textwrap.dedent('''
    import os
    import torch
    from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
    from alibi.errors import InputError, KernelUnavailable
    from alibi.kernels.base import Kernel

    class FailsOnOneK(Kernel):
        name = "shard-test-fails-on-k"
        formats = ("int8",)
        device = "cpu"
        epilogue = EpilogueModel("a_then_w")

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            kind = os.environ.get("SHARD_TEST_FAIL_KIND")
            if kind and str(a_q.shape[1]) == os.environ.get("SHARD_TEST_FAIL_K"):
                if kind == "input":
                    raise InputError("test kernel refuses K=1536")
                if kind == "unavailable":
                    raise KernelUnavailable("test kernel has no K=1536 path here")
                if kind == "die":
                    os._exit(9)
                raise RuntimeError("test kernel crashed\\nwith a second line")
            return apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)
''')
PLUGIN_PAIR = ["--kernel-a", "shard-test-fails-on-k", "--kernel-b", "emulator:a_then_w"]


@pytest.fixture(autouse=True)
def reproducible(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)  # spawned workers inherit it


@pytest.fixture
def failing_kernel(tmp_path, monkeypatch):
    """The plugin installed (a real dist-info folder on sys.path, which spawned workers inherit)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "shard_test_kernels.py").write_text(PLUGIN)
    info = site / "shard_test_kernels-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shard-test-kernels\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[alibi.kernels]\nshard-test-fails-on-k = shard_test_kernels:FailsOnOneK\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SHARD_TEST_FAIL_K", "1536")


def conform(out: Path, *extra: str, pair=PAIR) -> int:
    return main(["conform", *pair, *SOURCE, "--out", str(out), "--quiet", *extra])


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The single-process report folder every sharded run must reproduce."""
    out = tmp_path_factory.mktemp("straight") / "r"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", EPOCH)
        assert conform(out) == 0
    return out


def assert_same_report_folder(expected: Path, got: Path, sharding: dict) -> None:
    """Every report file byte for byte; the manifests equal once the sharded one's sharding record is taken out."""
    for name in REPORT_FILES:
        assert (got / name).read_bytes() == (expected / name).read_bytes(), name
    assert verify_files(got) == []
    want, have = read_manifest(expected).predicate, read_manifest(got).predicate
    assert "sharding" not in want["parameters"]
    assert have["parameters"].pop("sharding") == sharding
    assert have == want
    assert not (got.parent / f".{got.name}.units").exists()  # the units go once the report is in place


def unit_files(out: Path) -> set[str]:
    return {p.name for p in (out.parent / f".{out.name}.units").glob("0*.json")}


# --- the byte-identical report ----------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3])
def test_cpu_worker_processes_write_the_single_process_report_byte_for_byte(straight, tmp_path, n):
    devices = [f"cpu:{i}" for i in range(n)]
    out = tmp_path / "r"
    assert conform(out, "--devices", ",".join(devices)) == 0
    assert_same_report_folder(straight, out, {"engine": "torch.multiprocessing", "devices": devices})


def test_ray_local_tasks_write_the_single_process_report_byte_for_byte(straight, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'integer-alibi[ray]'); --ray cannot run")
    out = tmp_path / "r"
    assert conform(out, "--ray", "local") == 0
    # This machine's Ray has no GPU: one task per CPU (2 in CI), at most one per tile.
    record = read_manifest(out).predicate["parameters"]["sharding"]
    assert record["engine"] == "ray" and record["address"] == "local" and set(record["devices"]) == {"ray:CPU"}
    assert_same_report_folder(straight, out, record)


# --- a failing worker ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "code", "fragment"), [
    ("input", 2, "(InputError): test kernel refuses K=1536"),
    ("unavailable", 3, "(KernelUnavailable): test kernel has no K=1536 path here"),
    ("crash", 4, "(KernelRaised): kernel 'shard-test-fails-on-k' raised on tile 'layers.0.down_proj': RuntimeError: "
                 "test kernel crashed\\nwith a second line"),
    ("die", 4, "(exited): the worker process exited with code 9 before reporting"),
])
def test_a_failing_worker_fails_the_run_on_one_line_with_its_exit_code_and_keeps_the_finished_units(
        failing_kernel, tmp_path, capsys, monkeypatch, kind, code, fragment):
    monkeypatch.setenv("SHARD_TEST_FAIL_KIND", kind)
    out = tmp_path / "r"
    main_one_line(capsys, ["conform", *PLUGIN_PAIR, *SOURCE, "--out", str(out), "--quiet", "--devices",
                           "cpu:0,cpu:1,cpu:2"], "worker 0 on cpu:0 failed " + fragment, "--resume", code=code)
    assert not out.exists()  # no report, not even a partial one
    done = unit_files(out)
    # Worker 0 (tiles 0 3 6) finished q_proj and o_proj before it failed on down_proj; those stay.
    assert {"0000-real-layers.0.q_proj.json", "0000-pow2-layers.0.q_proj.json", "0003-real-layers.0.o_proj.json",
            "0003-pow2-layers.0.o_proj.json"} <= done
    assert not any(name.startswith("0006-") for name in done)
    assert (out.parent / f".{out.name}.units" / "plan.json").is_file()


def test_resume_on_two_workers_after_a_failed_three_worker_run_gives_the_single_process_report(
        failing_kernel, tmp_path, capsys, monkeypatch):
    straight_out = tmp_path / "straight"
    assert conform(straight_out, pair=PLUGIN_PAIR) == 0  # SHARD_TEST_FAIL_KIND unset: the kernel never fails
    monkeypatch.setenv("SHARD_TEST_FAIL_KIND", "crash")
    out = tmp_path / "r"
    assert conform(out, "--devices", "cpu:0,cpu:1,cpu:2", pair=PLUGIN_PAIR) == 4
    done = unit_files(out)
    assert 4 <= len(done) < 14
    monkeypatch.delenv("SHARD_TEST_FAIL_KIND")
    capsys.readouterr()
    assert main(["conform", *PLUGIN_PAIR, *SOURCE, "--out", str(out), "--resume", "--devices", "cpu:0,cpu:1"]) == 0
    computed = re.search(r"alibi conform: (\d+) units computed by 2 shard\(s\)", capsys.readouterr().err)
    assert computed and int(computed.group(1)) == 14 - len(done)  # the kept units were read, not recomputed
    # Issue 26: the report and manifest say how many units came from the failed run; apart from that, the
    # folder is the single process's
    files = {name: (out / name).read_bytes() for name in [*REPORT_FILES, "manifest.json"]}
    manifest = json.loads(files["manifest.json"])
    assert manifest["predicate"]["parameters"].pop("sharding") == {"engine": "torch.multiprocessing",
                                                                   "devices": ["cpu:0", "cpu:1"]}
    files["manifest.json"] = json.dumps(manifest).encode()
    got, from_disk = without_units_record(files)
    want, _ = without_units_record({name: (straight_out / name).read_bytes()
                                    for name in [*REPORT_FILES, "manifest.json"]})
    assert from_disk == len(done)
    assert got == want
    assert not (out.parent / f".{out.name}.units").exists()


# --- the pieces ------------------------------------------------------------------------------------

def test_tile_i_goes_to_shard_i_mod_n_and_shards_without_tiles_are_dropped():
    assert shard_tiles(7, 3) == [(0, 3, 6), (1, 4), (2, 5)]
    assert shard_tiles(2, 4) == [(0,), (1,)]
    assert shard_tiles(5, 1) == [(0, 1, 2, 3, 4)]


def _job(tmp_path, **changes) -> ShardJob:
    from alibi.conform.pipeline import choose_pair, source_from_preset

    spec = SourceSpec(preset="smollm2-135m-bias", seed=0, rows=8)
    pair = choose_pair("torch-cpu", "emulator:a_then_w")
    fields = dict(worker=0, device="cpu:0", tile_indices=(0,), kernel_a="torch-cpu", kernel_b="emulator:a_then_w",
                  arms=(pair.a.name, pair.b.name, pair.selection), source=spec,
                  resource=source_from_preset("smollm2-135m-bias", seed=0, rows=8).resource, regimes=("real",),
                  units_dir=str(tmp_path), ulp_threshold=1, invariance=False, quiet=True)
    return ShardJob(**{**fields, **changes})


def test_a_shard_computes_only_its_tiles_and_skips_units_already_there(tmp_path):
    from alibi.conform.pipeline import choose_pair, source_from_preset, start_units

    units = tmp_path / "units"
    start_units(units, choose_pair("torch-cpu", "emulator:a_then_w"),
                source_from_preset("smollm2-135m-bias", seed=0, rows=8), ["real"], invariance=False)
    assert run_shard(_job(tmp_path, tile_indices=(1, 4), units_dir=str(units))) == 2
    # beside its units, the shard's own ledger of their digests (issue 26)
    assert sorted(p.name for p in units.iterdir()) == ["0001-real-layers.0.k_proj.json",
                                                       "0004-real-layers.0.gate_proj.json", "ledger.shard-0.json",
                                                       "plan.json"]
    assert run_shard(_job(tmp_path, tile_indices=(1, 4), units_dir=str(units))) == 0


def test_a_shard_refuses_tiles_whose_digest_is_not_the_plans(tmp_path):
    other = SourceSpec(preset="smollm2-135m-bias", seed=1, rows=8)  # other tiles, same names
    with pytest.raises(InputError, match="changed since the run started"):
        run_shard(_job(tmp_path, source=other))
    assert list(tmp_path.iterdir()) == []


def test_a_shard_refuses_to_compute_under_another_pair_than_the_parents(tmp_path):
    with pytest.raises(InputError, match="this worker resolves the kernels to torch-cpu vs emulator:a_then_w"):
        run_shard(_job(tmp_path, arms=("torch-cpu", "emulator:w_then_a", "requested")))
    assert list(tmp_path.iterdir()) == []


def test_a_source_spec_names_a_folder_or_a_preset_exactly():
    with pytest.raises(InputError, match="exactly one"):
        SourceSpec()
    with pytest.raises(InputError, match="exactly one"):
        SourceSpec(folder="x", preset="tiny")


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "not an empty list"),
    ("gpu0", "(not 'gpu0')"),
    ("cpu:0,cpu:0", "names a device twice"),
    ("cpu:0,cuda:0", "mixes cpu and cuda"),
])
def test_device_lists_that_cannot_be_honoured_are_refused(text, fragment):
    with pytest.raises(InputError, match=re.escape(fragment)):
        parse_devices(text)


def test_gpu_devices_are_refused_where_no_gpu_is_visible():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: cuda:0 and all are valid")
    with pytest.raises(InputError, match="no GPU is visible here; give cpu:0,cpu:1"):
        parse_devices("all")
    with pytest.raises(InputError, match=re.escape("cuda:0 is not visible here (0 GPU(s): none)")):
        parse_devices("cuda:0")


def test_cpu_devices_give_one_worker_each():
    assert parse_devices("cpu:0, cpu:1,cpu:2") == ("cpu:0", "cpu:1", "cpu:2")


def test_devices_and_ray_are_mutually_exclusive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["conform", "--devices", "cpu:0", "--ray", "local", "--out", str(tmp_path / "r")])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_shard_run_record_round_trips_and_its_manifest_record_carries_no_timing():
    run = ShardRun("ray", ("ray:GPU", "ray:GPU"), "10.0.0.1:6379", (8, 6), wall_s=12.5)
    assert ShardRun.from_json(run.to_json()).to_dict() == run.to_dict()
    assert run.manifest_record() == {"engine": "ray", "devices": ["ray:GPU", "ray:GPU"], "address": "10.0.0.1:6379"}
    with pytest.raises(InputError, match="schema is 'other', expected 'alibi.shard-run/v1'"):
        ShardRun.from_dict({**run.to_dict(), "schema": "other"})

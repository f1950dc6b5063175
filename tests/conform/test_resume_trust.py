"""Issue 26: a resumed `alibi conform` trusts no stored unit it did not compute: each is checked against
the run's plan, the tile bytes, the ledger of digests the run recorded, the unit schema and the invariants
every computed unit satisfies; `--verify-units` recomputes them bit for bit. A refusal is one line naming
the unit file, exit 2, and the report folder is left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import alibi.cli.conform as cli_conform
from alibi.cli import main
from alibi.governance.manifest import read_manifest

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--quiet"]
UNIT = "0001-real-layers.0.wide.json"  # tile 1 of the tiny preset, real scales


def _argv(out: Path, seed: int = 0) -> list[str]:
    return ["conform", *EMU, "--synthetic", "tiny", "--seed", str(seed), "--out", str(out)]


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def interrupt_before_the_report(monkeypatch, out: Path) -> None:
    """Ctrl-C as the report folder is staged: every unit is done, no report written."""
    real = cli_conform.atomic.staged_dir

    def staged_dir(path, *a, **k):
        if Path(path) == out:
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(cli_conform.atomic, "staged_dir", staged_dir)


@pytest.fixture
def killed_run(tmp_path, monkeypatch):
    """A run interrupted once every unit was done, before its report: `.report.units` holds the plan and
    every unit, `out` does not exist yet."""
    out = tmp_path / "out" / "report"
    interrupt_before_the_report(monkeypatch, out)
    assert main(_argv(out)) != 0
    monkeypatch.undo()
    units = out.parent / f".{out.name}.units"
    assert (units / "plan.json").is_file() and (units / UNIT).is_file() and not out.exists()
    return out, units


def _rewrite(path: Path, change) -> None:
    """Edit a unit file and write it back as the toolkit writes them (key order kept, indent 2)."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _record_in_ledger(units: Path, uid_file: str) -> None:
    """Forge the ledger too: add the edited file's digest to a ledger of the run's plan."""
    from alibi.io.digests import sha256_bytes

    ledger = units / "ledger.json"
    doc = json.loads(ledger.read_text())
    doc["units"][uid_file.removesuffix(".json")].append(sha256_bytes((units / uid_file).read_bytes()))
    ledger.write_text(json.dumps(doc))


def _refused(capsys, argv, out: Path, *fragments: str) -> None:
    before = _tree(out)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("alibi: error: "), err
    for fragment in fragments:
        assert fragment in err[0], (fragment, err[0])
    assert _tree(out) == before  # the report folder is untouched


def test_an_edited_unit_with_an_impossible_count_is_refused_on_resume(killed_run, capsys):
    out, units = killed_run
    _rewrite(units / UNIT, lambda d: d["unit"].update(n_differing=1234))
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "delete it and resume")


def test_an_impossible_count_is_refused_even_with_its_digest_in_the_ledger(killed_run, capsys):
    out, units = killed_run
    _rewrite(units / UNIT, lambda d: d["unit"].update(n_differing=1234))
    _record_in_ledger(units, UNIT)
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "impossible unit", "1,234 of 640 elements differ")


def test_a_planted_unit_whose_digest_the_run_never_recorded_is_refused(killed_run, capsys):
    out, units = killed_run
    # A plausible unit (every invariant holds), but not the one this run wrote.
    _rewrite(units / UNIT, lambda d: d["unit"].update(max_abs_acc=d["unit"]["max_abs_acc"] + 1))
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "not in the run's ledger")


def test_a_unit_from_another_run_is_refused(killed_run, tmp_path, capsys, monkeypatch):
    out, units = killed_run
    other = tmp_path / "other" / "report"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # another start time: another plan
    interrupt_before_the_report(monkeypatch, other)
    assert main(_argv(other)) != 0  # the same run, started again: another plan (its own created_at)
    monkeypatch.undo()
    capsys.readouterr()
    other_units = other.parent / f".{other.name}.units"
    assert json.loads((other_units / UNIT).read_text())["unit"] == json.loads((units / UNIT).read_text())["unit"]
    shutil.copy(other_units / UNIT, units / UNIT)
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "computed under another plan")


def test_a_unit_of_other_tile_bytes_is_refused(killed_run, capsys):
    out, units = killed_run
    _rewrite(units / UNIT, lambda d: d.update(tile_sha256="0" * 64))
    _record_in_ledger(units, UNIT)
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "other bytes of tile")


def test_a_unit_outside_the_unit_schema_is_refused(killed_run, capsys):
    out, units = killed_run
    _rewrite(units / UNIT, lambda d: d["unit"].update(extra_field=1))
    _record_in_ledger(units, UNIT)
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "does not follow the unit schema")


def test_untouched_units_resume_and_the_report_and_manifest_say_how_many_came_from_disk(killed_run, capsys):
    out, units = killed_run
    straight_out = out.parent / "straight"
    assert main(_argv(straight_out)) == 0
    straight = json.loads((straight_out / "report.json").read_text())
    assert "units_from_disk" not in straight["source"]  # a run that computed every unit says nothing
    (units / "0000-pow2-layers.0.proj.json").unlink()  # as a kill leaves: 3 of 4 units done
    assert main([*_argv(out), "--resume"]) == 0
    assert "units from disk: 3 of 4" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["source"]["units_from_disk"] == 3 and report["source"]["units_verified"] is False
    assert "units from disk: 3 of 4 read from an earlier run" in (out / "report.md").read_text()
    assert read_manifest(out).predicate["parameters"]["source"]["units_from_disk"] == 3
    # apart from that record (and the start time), the report is the one the uninterrupted run wrote
    del report["source"]["units_from_disk"], report["source"]["units"], report["source"]["units_verified"]
    assert {**report, "created_at": None} == {**straight, "created_at": None}
    assert not units.exists()


def test_verify_units_recomputes_stored_units_and_refuses_one_that_differs(killed_run, capsys):
    out, units = killed_run
    _rewrite(units / UNIT, lambda d: d["unit"].update(max_abs_acc=d["unit"]["max_abs_acc"] + 1))
    _record_in_ledger(units, UNIT)  # passes every check a plain resume makes ...
    _refused(capsys, [*_argv(out), "--resume", "--verify-units"], out, UNIT, "differs from its recomputation")
    (units / UNIT).unlink()
    assert main([*_argv(out), "--resume", "--verify-units"]) == 0  # ... and untouched units are identical
    assert "recomputed here and bit-identical" in (out / "report.md").read_text()


def test_resume_without_a_plan_starts_afresh_and_says_so(tmp_path, capsys):
    out = tmp_path / "report"
    (tmp_path / ".report.units").mkdir()  # a kill before the plan was written (before issue 26)
    assert main([*_argv(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "no unfinished run beside" in err and "starting afresh" in err
    assert (out / "report.json").is_file() and not (tmp_path / ".report.units").exists()


def test_verify_units_without_resume_is_refused(tmp_path, capsys):
    out = tmp_path / "report"
    assert main([*_argv(out), "--verify-units"]) == 2
    assert "give --resume too" in capsys.readouterr().err
    assert not out.exists()


def test_a_kill_during_the_clean_up_leaves_nothing_the_next_run_does_not_remove(killed_run, monkeypatch):
    """The units go in one rename to a stage name of the report (then deleted): a kill during the deletion
    leaves a stage the next run removes, never a half-deleted `.report.units` that --resume cannot read."""
    import alibi.io.atomic as atomic

    out, units = killed_run
    real_rmtree = shutil.rmtree

    def killed_rmtree(path, *a, **k):  # deletes one file, then "dies"
        first = next(Path(path).rglob("*.json"))
        first.unlink()
        raise SystemExit(137)

    monkeypatch.setattr(atomic.shutil, "rmtree", killed_rmtree)
    with pytest.raises(SystemExit):
        atomic.discard_dir(units, out)
    monkeypatch.setattr(atomic.shutil, "rmtree", real_rmtree)
    assert not units.exists()  # the units folder itself is gone in one step
    left = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.alibi.")]
    assert len(left) == 1
    # the stage carries this (live) process's pid; a new process sees it as a dead one's
    import os
    dead = left[0].with_name(left[0].name.replace(f".{os.getpid()}.", ".999999999."))
    left[0].rename(dead)
    assert main(_argv(out)) == 0
    assert [p for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_resume_without_a_plan_and_a_bad_input_prints_only_the_error(tmp_path, capsys):
    """The "starting afresh" notice comes once every input is checked: bad input stays one line."""
    out = tmp_path / "report"
    assert main(["conform", *EMU, "--synthetic", "nope", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown synthetic preset" in err[0], err
    assert list(tmp_path.iterdir()) == []


# --- issue 36 #1: digests chain to the plan the run started ----------------------------------------

def _plant_ledger(units: Path, name: str, uid_file: str) -> None:
    """A ledger under a shard's name, of this run's plan, recording the current bytes of `uid_file`."""
    from alibi.conform.unit_store import LEDGER_SCHEMA
    from alibi.io.digests import sha256_bytes

    plan = sha256_bytes((units / "plan.json").read_bytes())
    doc = {"schema": LEDGER_SCHEMA, "plan": plan,
           "units": {uid_file.removesuffix(".json"): [sha256_bytes((units / uid_file).read_bytes())]}}
    (units / name).write_text(json.dumps(doc, indent=1) + "\n")


def test_a_planted_ledger_of_a_shard_the_run_never_started_does_not_vouch_for_a_unit(killed_run, capsys):
    out, units = killed_run
    _rewrite(units / UNIT, lambda d: d["unit"].update(max_abs_acc=d["unit"]["max_abs_acc"] + 1))
    _plant_ledger(units, "ledger.shard-3.json", UNIT)  # the edited unit's digest, under this run's plan
    _refused(capsys, [*_argv(out), "--resume"], out, UNIT, "not in the run's ledger")


def _sharded_units(tmp_path: Path) -> tuple[Path, object, object, list[str]]:
    """A units folder started as `run_sharded` starts it, tile 0 assigned to shard 0 and tile 1 to shard 1."""
    from alibi.conform.pipeline import choose_pair, source_from_preset, start_units, unit_id
    from alibi.conform.unit_store import UnitStore

    units = tmp_path / "units"
    pair, source = choose_pair("emulator:w_then_a", "emulator:a_then_w"), source_from_preset("tiny", seed=0)
    start_units(units, pair, source, ["real"], invariance=False)
    uids = [unit_id(i, t.name, "real") for i, t in enumerate(source.tiles)]
    UnitStore(units).assign({0: [uids[0]], 1: [uids[1]]})
    return units, pair, source, uids


@pytest.mark.parametrize(("shard", "trusted"), [(1, True), (0, False), (5, False)])
def test_a_shard_ledger_vouches_only_for_the_units_the_run_assigned_to_that_shard(tmp_path, shard, trusted):
    """Tile 1's units computed under shard `shard`'s ledger: trusted when the run assigned tile 1 to that
    shard (1), refused when it assigned it to another (0) or started no such shard (5)."""
    from alibi.conform.pipeline import compute_units, run_conformance
    from alibi.errors import InputError

    units, pair, source, uids = _sharded_units(tmp_path)
    compute_units(pair, source, ["real"], units, [0], invariance=False, shard=0)
    compute_units(pair, source, ["real"], units, [1], invariance=False, shard=shard)

    def resume():
        return run_conformance(pair, source, ["real"], units_dir=units, resume=True, invariance=False,
                               created_at=None, computed_elsewhere=2)

    if trusted:
        assert [u.tile for u in resume().tiles] == [t.name for t in source.tiles]
    else:
        with pytest.raises(InputError, match=f"{uids[1]}.json: its digest is not in the run's ledger"):
            resume()

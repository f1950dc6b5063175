"""Experiments: a YAML file describing one study, and a runner that survives being killed.

An experiment file (`experiments/<name>.yaml`)::

    name: smollm2-layer-verification        # required: a slug
    description: free text                  # optional
    prereg: prereg/smollm2-layer-verification   # optional: a locked protocol folder
    kernels: {a: cutlass, b: triton}        # required: registry names (see `alibi kernels`)
    source:                                 # required: exactly one of synthetic | tiles
      synthetic: {preset: smollm2-135m, rows: 32}
      # tiles: captures/smollm2-m512        # a folder of tiles (a capture)
      # pinned: prereg/<study>/capture.manifest.json   # the tiles must match it file for file
      # sha256: <digest_tree of the folder>            # or: one pinned folder digest
    scales: [real, pow2]                    # default: both
    seed: 0                                 # default 0 (synthetic tiles are drawn from it)
    options: {ulp_threshold: 1, invariance: true}
    replay: results/smollm2-flips/flips.json   # optional: a flip analysis of the same pair (check 7)
    flip_threshold: 0.05                    # optional, needs replay: check 7's bound (default 0.05)
    out: results/smollm2-layer-verification # required unless --out is given

Relative paths are relative to the working directory: run experiments from the repository root.

The runner works in units — one tile under one scale regime — and writes each unit's result to
`OUT/units/` atomically as soon as it is computed. Argument for `--resume`: a unit is a pure
function of (kernels, tile, regime), and every unit result passes through the same JSON
serialization whether it was just computed or read back, so the report folded from a mix of
earlier and new units has the same bytes as one from a single uninterrupted run. What could make
the mix unsound — a different experiment file, protocol, input, kernel build, toolkit commit or
machine — is pinned in `OUT/run.json` when the run starts and compared field by field on resume.
The run's one timestamp, `predicate.run.created_at` in `OUT/manifest.json`, is taken when the
report is folded; the report itself carries none (see `alibi.governance.manifest`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.conform.report import write_reports
from alibi.conform.results import Report
from alibi.conform.unit_store import unit_files
from alibi.errors import InputError, one_line, shown
from alibi.governance.criteria import CRITERIA_FILE, evaluate_study, study_criteria
from alibi.governance.environment import environment_record, toolkit_record, working_tree
from alibi.governance.identity import flatten
from alibi.governance.manifest import (
    build_predicate,
    canonical_json,
    digest_set,
    folder_files,
    read_manifest,
    sha256_bytes,
    sha256_file,
    treatment_of,
    utc_now,
    verify_files,
    write_manifest,
)
from alibi.governance.prereg import ProtocolRecord, ProtocolViolation, require_locked
from alibi.io import atomic, jsonio, yamlio
from alibi.io.limits import check_seed
from alibi.io.progress import Progress

RUN_SCHEMA = "alibi.run/v1"
RUN_RECORD = "run.json"
EXPERIMENT_COPY = "experiment.yaml"
UNITS_DIR = "units"
REPORT_DIR = "report"

_TOP_KEYS = {"name", "description", "prereg", "kernels", "source", "scales", "seed", "options", "out", "replay",
             "flip_threshold"}
_SOURCE_KEYS = {"synthetic", "tiles", "pinned", "sha256"}
_OPTION_KEYS = {"ulp_threshold", "invariance"}
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Source:
    """Where the tiles come from.

    kind: `synthetic` (preset, rows) or `tiles` (path to a folder of tiles). For `tiles`, pinned:
    a manifest whose subjects the folder must match exactly (e.g. the capture manifest locked in
    the prereg folder); sha256: the expected `digest_tree` of the folder. Either pin fails closed.
    """

    kind: str
    preset: str | None = None
    rows: int | None = None
    path: str | None = None
    pinned: str | None = None
    sha256: str | None = None

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "synthetic":
            return {"synthetic": {"preset": self.preset, "rows": self.rows}}
        return {"tiles": self.path, "pinned": self.pinned, "sha256": self.sha256}


@dataclass(frozen=True)
class Experiment:
    """One study, as read from its YAML file.

    file: the YAML path; sha256: digest of its bytes; kernels: (a, b) registry names; scales:
    the regimes to run; seed: the random seed; out: the artifact folder (None: must be given
    on the command line); prereg: the protocol folder results are produced under, if any;
    replay: a flips.json check 7 is judged on (None: check 7 stays inapplicable); flip_threshold:
    check 7's bound (only with replay).
    """

    name: str
    file: Path
    sha256: str
    kernels: tuple[str, str]
    source: Source
    scales: tuple[str, ...] = ("real", "pow2")
    seed: int = 0
    out: str | None = None
    prereg: str | None = None
    description: str = ""
    ulp_threshold: int = 1
    invariance: bool = True
    replay: str | None = None
    flip_threshold: float | None = None

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues (everything but `out`)."""
        ident = {"name": self.name, "sha256": self.sha256, "kernels": {"a": self.kernels[0], "b": self.kernels[1]},
                 "source": self.source.as_dict(), "scales": list(self.scales), "seed": self.seed,
                 "prereg": self.prereg, "options": {"ulp_threshold": self.ulp_threshold, "invariance": self.invariance}}
        if self.replay is not None:  # only then: run records of experiments without a replay keep their bytes
            ident["replay"] = {"path": self.replay, "flip_threshold": self.flip_threshold}
        return ident


def _bad(file: Path, problem: str) -> InputError:
    return InputError(f"{one_line(str(file))}: {problem} (see the experiment format in `alibi run --help`)")


def _unknown(file: Path, where: str, keys: set[str], allowed: set[str]) -> None:
    extra = sorted(keys - allowed)
    if extra:
        raise _bad(file, f"unknown key(s) {', '.join(extra)} in {where}; allowed: {', '.join(sorted(allowed))}")


def _string(file: Path, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(file, f"{where} must be a non-empty string, got {shown(value)}")
    return value


def _source(file: Path, raw: Any) -> Source:
    if not isinstance(raw, dict):
        raise _bad(file, f"source must be a mapping with synthetic or tiles, got {shown(raw)}")
    _unknown(file, "source", set(raw), _SOURCE_KEYS)
    kinds = [k for k in ("synthetic", "tiles") if k in raw]
    if len(kinds) != 1:
        raise _bad(file, "source needs exactly one of synthetic or tiles")
    if kinds[0] == "synthetic":
        if "pinned" in raw or "sha256" in raw:
            raise _bad(file, "source.pinned and source.sha256 pin a tiles folder, not a synthetic preset")
        syn = raw["synthetic"]
        syn = {"preset": syn} if isinstance(syn, str) else syn
        if not isinstance(syn, dict):
            raise _bad(file, "source.synthetic must be a preset name or {preset, rows}")
        _unknown(file, "source.synthetic", set(syn), {"preset", "rows"})
        rows = syn.get("rows")
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
            raise _bad(file, f"source.synthetic.rows must be a positive integer, got {shown(rows)}")
        return Source("synthetic", preset=_string(file, "source.synthetic.preset", syn.get("preset")), rows=rows)
    digest = raw.get("sha256")
    if digest is not None:
        try:
            digest_set(digest)
        except InputError:
            raise _bad(file, f"source.sha256 {shown(digest)} is not 64 lowercase hex characters") from None
    pinned = raw.get("pinned")
    return Source("tiles", path=_string(file, "source.tiles", raw["tiles"]),
                  pinned=None if pinned is None else _string(file, "source.pinned", pinned), sha256=digest)


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; InputError names the file, the key and the fix."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{file}: no such experiment file")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise InputError(f"{one_line(str(file))}: cannot read the experiment file ({exc.strerror})") from None
    raw = yamlio.loads(data, str(file))  # aliases refused, one-line messages
    if not isinstance(raw, dict):
        raise _bad(file, "the top level must be a mapping")
    _unknown(file, "the experiment", set(raw), _TOP_KEYS)
    for key in ("name", "kernels", "source"):
        if key not in raw:
            raise _bad(file, f"missing required key {key!r}")
    name = _string(file, "name", raw["name"])
    if not _SLUG.match(name):
        raise _bad(file, f"name {shown(name)} must be a slug (letters, digits, '.', '_', '-')")
    kernels = raw["kernels"]
    if not isinstance(kernels, dict) or set(kernels) != {"a", "b"}:
        raise _bad(file, f"kernels must be a mapping {{a: NAME, b: NAME}}, got {shown(kernels)}")
    scales = raw.get("scales", ["real", "pow2"])
    if not isinstance(scales, list) or not scales or any(s not in ("real", "pow2") for s in scales) \
            or len(set(scales)) != len(scales):
        raise _bad(file, f"scales must be a list drawn from [real, pow2] without repeats, got {shown(scales)}")
    seed = raw.get("seed", 0)
    try:
        check_seed(seed, "seed")  # the one rule for seeds (alibi.io.limits), as `conform --seed`
    except InputError as exc:
        raise _bad(file, str(exc)) from None
    options = raw.get("options") or {}
    if not isinstance(options, dict):
        raise _bad(file, "options must be a mapping")
    _unknown(file, "options", set(options), _OPTION_KEYS)
    ulp = options.get("ulp_threshold", 1)
    if not isinstance(ulp, int) or isinstance(ulp, bool) or ulp < 0:
        raise _bad(file, f"options.ulp_threshold must be a non-negative integer, got {shown(ulp)}")
    invariance = options.get("invariance", True)
    if not isinstance(invariance, bool):
        raise _bad(file, f"options.invariance must be true or false, got {shown(invariance)}")
    out = raw.get("out")
    prereg = raw.get("prereg")
    replay = raw.get("replay")
    flip_threshold = raw.get("flip_threshold")
    if flip_threshold is not None and replay is None:
        raise _bad(file, "flip_threshold bounds the flip rate of a replay: add `replay: FLIPS.json` too")
    if replay is not None:
        # deferred: keeps torch out of start-up
        from alibi.conform.token_risk import DEFAULT_FLIP_THRESHOLD, check_bound

        try:
            flip_threshold = check_bound(DEFAULT_FLIP_THRESHOLD if flip_threshold is None else flip_threshold,
                                         "flip_threshold")
        except InputError as exc:
            raise _bad(file, str(exc)) from None
    return Experiment(
        name=name, file=file, sha256=sha256_bytes(data),
        kernels=(_string(file, "kernels.a", kernels["a"]), _string(file, "kernels.b", kernels["b"])),
        source=_source(file, raw["source"]), scales=tuple(scales), seed=seed,
        out=None if out is None else _string(file, "out", out),
        prereg=None if prereg is None else _string(file, "prereg", prereg),
        description=str(raw.get("description") or ""), ulp_threshold=ulp, invariance=invariance,
        replay=None if replay is None else _string(file, "replay", replay), flip_threshold=flip_threshold)


def check_pinned(folder: Path, pinned: Path) -> None:
    """Fail closed unless `folder` holds exactly the files `pinned` lists, with the same bytes."""
    manifest = read_manifest(pinned)
    expected = {s.name: s.sha256 for s in manifest.subjects}
    present = set(folder_files(folder))
    for name in sorted(set(expected) | present):
        if name not in present:
            raise InputError(f"{folder / name}: pinned by {pinned} but missing; recreate the capture exactly "
                             "as the protocol describes")
        if name not in expected:
            raise InputError(f"{folder / name}: not pinned by {pinned}; the folder must hold exactly the pinned files")
        if (actual := sha256_file(folder / name)) != expected[name]:
            raise InputError(f"{folder / name}: sha256 {actual} differs from {expected[name]} pinned by {pinned}; "
                             "this is not the capture the protocol was locked on")


def resolve_inputs(exp: Experiment):
    """The run's `TileSource` (alibi.conform.pipeline), after checking every pin the experiment declares."""
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import source_from_dir, source_from_preset

    src = exp.source
    if src.kind == "synthetic":
        return source_from_preset(src.preset, seed=exp.seed, rows=src.rows)
    folder = Path(src.path)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such tiles folder (experiment {exp.file}); create it first, e.g. with the "
                         "capture command the protocol names")
    if (folder / "manifest.json").is_file():
        problems = verify_files(folder)
        if problems:
            raise InputError(f"{folder}: does not match its own manifest: {problems[0]}")
    if src.pinned is not None:
        check_pinned(folder, Path(src.pinned))
    source = source_from_dir(folder, label=f"tiles in {src.path}")
    digest = source.resource["digest"]["sha256"]
    if src.sha256 is not None and digest != src.sha256:
        raise InputError(f"{folder}: folder digest {digest} differs from source.sha256 {src.sha256} in {exp.file}")
    return source


def _first_difference(old: Any, new: Any) -> str:
    a, b = dict(flatten(old)), dict(flatten(new))
    for path in sorted(set(a) | set(b)):
        if a.get(path, "<absent>") != b.get(path, "<absent>"):
            return f"{path}: was {a.get(path, '<absent>')!r}, now {b.get(path, '<absent>')!r}"
    return "formatting"


@dataclass(frozen=True)
class RunResult:
    """What `run_experiment` produced: the report document, its exit code, and where it lies."""

    report: Report
    exit_code: int
    out: Path
    resumed_units: int
    computed_units: int


def run_experiment(exp: Experiment, out: str | Path | None = None, *, resume: bool = False,
                   progress: Callable[[int, int, str], None] | None = None, allow_dirty: bool = False,
                   notice: Callable[[str], None] | None = None) -> RunResult:
    """Run `exp` unit by unit into `out` (default: the experiment's `out`).

    progress: called `(done, total, label)` after each unit (`stderr_progress()`: alibi.io.progress).

    resume: continue a run whose folder already exists; the folder must have been started by the
    same experiment, protocol, inputs, kernels, toolkit and machine. Without it an existing
    non-empty folder is refused. With it, a missing or empty folder (a kill before the run folder
    appeared with its run.json, the plan) holds nothing to continue: the run falls back to a fresh
    start and says so once through `notice`, one line, after every input has been checked (so bad
    input still costs exactly one line).

    allow_dirty: run under a protocol although the toolkit's sources differ from the git HEAD
    commit (refused otherwise, see `require_committed_code`); the run record and the manifest say so.
    Nothing is written before every input is checked: paths (the run folder must not overlap an
    input), the protocol, the kernels and the tiles' formats against both kernels.
    """
    # deferred: keeps torch out of start-up
    from alibi.conform import pipeline

    target = out if out is not None else exp.out
    if target is None:
        raise InputError(f"{exp.file}: no `out` folder; add `out:` to the file or pass --out")
    out = Path(target)
    atomic.refuse_overlap(out, {"the experiment file": exp.file, "source.tiles": exp.source.path,
                                "source.pinned": exp.source.pinned, "prereg": exp.prereg,
                                "replay": getattr(exp, "replay", None)}, what="the run folder")
    atomic.check_writable_dir(out)
    protocol = require_locked(exp.prereg) if exp.prereg else None
    if protocol is not None:  # refuse a study whose acceptance criteria cannot be read, before measuring

        study_criteria(exp.prereg)
    tree = require_committed_code(exp, allow_dirty) if protocol is not None else None
    regimes = pipeline.validate_regimes(exp.scales)
    pair = pipeline.choose_pair(*exp.kernels)
    inputs = pipeline.within_declarations(resolve_inputs(exp), (pair.a, pair.b))  # the units the run's plan lists
    replay = None
    if exp.replay is not None:
        # deferred: keeps torch out of start-up
        from alibi.conform.token_risk import load_replay

        replay = load_replay(exp.replay, exp.flip_threshold)
        replay.require_pair(pair.a.name, pair.b.name)
    check_formats(pair, inputs.tiles)
    tiles_name = exp.source.path if exp.source.kind == "tiles" else inputs.resource["name"]  # as the file says it
    pinned_inputs = {"tiles": {**inputs.resource, "name": tiles_name},
                     **({"replay": replay.resource()} if replay is not None else {})}
    units_plan = [pipeline.unit_id(i, t.name, r) for i, t in enumerate(inputs.tiles) for r in regimes]
    arms = {"a": treatment_of(pair.a, "a"), "b": treatment_of(pair.b, "b")}
    record = {
        "schema": RUN_SCHEMA,
        "experiment": exp.identity(),
        "protocol": None if protocol is None else protocol.as_dict(),
        "inputs": pinned_inputs,
        "arms": {k: t.as_dict() for k, t in arms.items()},
        "toolkit": toolkit_record(),
        "environment": environment_record(),
        "units": units_plan,
    }
    if tree is not None:  # a pre-registered run records whether its code is a commit's
        record["working_tree"] = tree
    record_text = canonical_json(record)
    if resume and notice is not None and not (out.is_dir() and any(out.iterdir())):
        notice(f"alibi run: --resume fallback: no run to continue in {one_line(str(out))} (no {RUN_RECORD}, the "
               "run's plan, was ever written there): starting afresh")
    _start(out, exp, record, record_text, resume)
    done = {p.stem for p in unit_files(out / UNITS_DIR)}
    resumed = sum(u in done for u in units_plan)
    # The report carries no timestamp of its own (created_at=None): the run's one timestamp lives
    # in the manifest, so every other byte of the folder is reproducible.
    report = pipeline.run_conformance(pair, inputs, regimes, units_dir=out / UNITS_DIR, resume=resume,
                                     seed=exp.seed, ulp_threshold=exp.ulp_threshold, invariance=exp.invariance,
                                     replay=replay, created_at=None, progress=progress)
    if protocol is not None:
        _recheck_protocol(exp, protocol)
    # The report carries no timestamp of its own (created_at=None): the run's one timestamp lives
    # in the manifest, so every other byte of the folder is reproducible.
    created_at = utc_now()
    # deferred: keeps jinja2 out of start-up
    from alibi.html import write_conform_html

    # The report folder is staged and renamed into place once (a kill leaves the old one or none). It is the
    # run's own (a resumed run may find it without the run's manifest, written last): replaced unchecked.
    with atomic.staged_dir(out / REPORT_DIR, internal=True) as stage:
        write_conform_html(report, stage)  # before report.json, which write_reports writes last
        write_reports(report, stage)
    if protocol is not None:  # the locked acceptance criteria, judged by code beside the report

        # the report was written just now, its manifest (the run's) comes last: read as written
        judged = evaluate_study(exp.prereg, {"report": out / REPORT_DIR / "report.json"}, verify=False)
        atomic.write_text(out / CRITERIA_FILE, judged.to_json())
    predicate = build_predicate(
        inputs=pinned_inputs, seed=exp.seed, arms=arms,
        parameters={"experiment": exp.identity(), "run_record_sha256": sha256_bytes(record_text.encode("utf-8")),
                    "verdict": report.verdict, "units": len(units_plan),
                    **({"working_tree": tree} if tree is not None else {})},
        protocol=None if protocol is None else protocol.as_dict(), created_at=created_at)
    write_manifest(out, "experiment-run", predicate)
    return RunResult(report, pipeline.exit_code(report), out, resumed, len(units_plan) - resumed)


def _start(out: Path, exp: Experiment, record: Mapping[str, Any], record_text: str, resume: bool) -> None:
    """Create the run folder, or check that an existing one continues this very run."""
    existing = out / RUN_RECORD
    if out.exists() and any(out.iterdir()):
        if not resume:
            raise InputError(f"{out}: already exists and is not empty; pass --resume to continue that run, "
                             "or choose another --out")
        if not existing.is_file():
            raise InputError(f"{out}: holds no {RUN_RECORD}, so it is not a run folder to resume; choose another --out")
        old_bytes = existing.read_bytes()
        if old_bytes != record_text.encode("utf-8"):
            try:
                why = _first_difference(jsonio.loads(old_bytes, str(existing)), record)
            except InputError:
                why = f"{one_line(str(existing))} is damaged"
            raise InputError(f"{out}: cannot resume: the run was started under different conditions ({why}); "
                             "start a fresh run in another folder")
        planned = {f"{u}.json" for u in record["units"]}
        present = {p.name for p in (out / UNITS_DIR).glob("*") if not p.name.startswith(".")} - {"plan.json"} \
            - {p.name for p in (out / UNITS_DIR).glob("ledger*.json")}
        strays = sorted(present - planned)
        if strays:
            raise InputError(f"{out / UNITS_DIR / strays[0]}: not a unit of this run; remove it and resume")
        return
    # The run folder appears with both files or not at all: a kill between two separate writes left
    # a folder holding only experiment.yaml, which neither a fresh run nor --resume would take.
    with atomic.staged_dir(out) as stage:
        atomic.write_bytes(stage / EXPERIMENT_COPY, exp.file.read_bytes())
        atomic.write_text(stage / RUN_RECORD, record_text)


def require_committed_code(exp: Experiment, allow_dirty: bool) -> dict[str, Any]:
    """A pre-registered run's code must be a commit's: ProtocolViolation when the package's sources
    differ from git HEAD's (modified, added or untracked source files), unless `allow_dirty`.

    Why: a result is tied to its code by the source digest in its manifest; if no commit has that
    digest (`alibi manifest provenance` finds none), nobody can recover what ran. Outside a git
    checkout (a copy without history, as on the GPU machine) the check cannot be made here: the run
    proceeds and `alibi manifest provenance` ties its digest to a commit afterwards. Returns the
    record the run and its manifest keep: `clean` (True / False / None), the changed files, the
    HEAD commit, and `allow_dirty`.
    """
    tree = working_tree()
    if tree.clean is False and not allow_dirty:
        files = ", ".join(tree.changed[:3]) + (f" and {len(tree.changed) - 3} more" if len(tree.changed) > 3 else "")
        raise ProtocolViolation(f"{one_line(str(exp.file))}: a pre-registered run needs committed code, but the "
                                f"toolkit's sources differ from commit {(tree.head or '?')[:12]} "
                                f"({one_line(files) or 'see git status'}); commit them first, or pass --allow-dirty "
                                "(recorded in the run)")
    return {**tree.as_dict(), "allow_dirty": allow_dirty}


def check_formats(pair: Any, tiles: list) -> None:
    """InputError before anything is written unless both kernels take every tile's operand format
    (`alibi.conform.pipeline.check_formats`)."""
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import check_formats as check

    check(pair, tiles)


def _recheck_protocol(exp: Experiment, before: ProtocolRecord) -> None:
    now = require_locked(exp.prereg)
    if now.head_sha256 != before.head_sha256:
        raise ProtocolViolation(f"protocol {exp.prereg} was amended while the run was in progress (head "
                                f"{before.head_sha256} -> {now.head_sha256}); start a fresh run under the new head")


def stderr_progress() -> Callable[[int, int, str], None]:
    """Per-unit progress on stderr: a bar on a terminal, plain lines otherwise (alibi.io.progress)."""
    return Progress("run", stream=sys.stderr)


__all__ = ["Experiment", "RunResult", "Source", "check_pinned", "load_experiment", "resolve_inputs",
           "run_experiment"]

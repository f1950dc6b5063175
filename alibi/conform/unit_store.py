"""The units folder of a resumable conformance run: its plan, its ledger, and one file per finished unit.

A killed `alibi conform` / `alibi run` continues from the units it finished (`--resume`). A resumed run
trusts nothing it did not compute itself in this process, so every stored unit is re-derived before it
enters the report:

- the folder is created with its `plan.json` in one atomic step (`atomic.staged_dir`): a kill leaves no
  folder, or one with its plan;
- each unit file carries the digest of the plan it was computed under and the sha256 of its tile's bytes;
  a unit from another run (another plan) or from other tile bytes is refused;
- before a unit file is written, its sha256 is recorded in the writer's ledger (`ledger.json`, or
  `ledger.shard-<i>.json` for shard worker i: one file per writer, rewritten atomically, so shard workers
  never race; sorted, so a resumed run's ledger has the bytes of an uninterrupted run's);
  a unit whose digest no ledger of this plan records — planted, edited, copied — is refused. The
  order (ledger first, then the unit) keeps every kill recoverable: a recorded digest without a file
  only means the unit is computed again;
- the digests chain to the plan the run started: the run's own ledger (`ledger.json`) vouches for any
  unit, a shard's ledger only for the units the run's ledger assigned to that shard before the shard
  started (`assign`). So a ledger planted under a shard's name — of a shard the run never started, or
  listing a unit another shard computes — vouches for nothing;
- each unit is checked against its schema (the exact fields of `UnitResult`, integer counts) and against
  invariants that hold for every computed unit: its tile, regime, format and shape are the current
  tile's; `n_elements = M·N`; `0 ≤ n_differing ≤ n_elements`; `bitwise_equal` iff no element differs;
  the recorded differences hold exactly `min(n_differing, cap)` elements inside the output; every
  other count lies within the element count; a unit judged `explained` differs exactly where predicted;
  every check has a verdict;
- `verify=True` (`--verify-units`) recomputes each stored unit and compares the two files bit for bit.

A refusal is one line naming the unit file and the fix (delete it and resume: it is computed again).
The ledger is no signature: whoever can write the folder can forge both a unit and its digest. What it
rules out is a unit nobody recorded (planted or edited by hand, copied from another run); the
invariants rule out impossible units even then; `--verify-units` rules out everything, at the cost of
computing the run again.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from alibi.conform.results import UnitResult
from alibi.conform.verdict import CHECKS
from alibi.errors import InputError, one_line
from alibi.governance.manifest import canonical_json
from alibi.io import atomic, jsonio
from alibi.io.digests import sha256_bytes
from alibi.io.typed import from_plain, to_plain

UNIT_SCHEMA = "alibi.conform-unit/v2"
LEDGER_SCHEMA = "alibi.conform-ledger/v2"  # v2: the run's ledger assigns units to shards
PLAN_FILE = "plan.json"
RUN_LEDGER = "ledger.json"
_LEDGER = re.compile(r"^ledger(\.shard-(\d+))?\.json$")


def unit_text(doc: dict[str, Any]) -> str:
    """A unit file's text. Key order is kept (not sorted): a report assembled from units read back must
    have the bytes of one built from units just computed."""
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _sha256(data: bytes) -> str:
    return sha256_bytes(data)


def tile_sha256(tile) -> str:
    """The sha256 of a tile's canonical safetensors bytes (`alibi.tiles.tile.tile_bytes`)."""
    # deferred: keeps torch out of start-up
    from alibi.tiles.tile import tile_bytes

    return _sha256(tile_bytes(tile))


class UnitStore:
    """One run's units folder: `plan.json`, the ledgers, and `<unit id>.json` per finished unit.

    plan_sha256: the sha256 of the folder's `plan.json` bytes, the identity every unit file carries.
    shard: the shard worker this store writes for (its own ledger), None for the run's main process."""

    def __init__(self, folder: str | os.PathLike, shard: int | None = None) -> None:
        self.folder = Path(folder)
        plan = self.folder / PLAN_FILE
        try:
            self.plan_bytes = plan.read_bytes()
        except OSError as exc:
            raise InputError(f"{one_line(str(plan))}: cannot read the run's plan ({exc.strerror or exc}); run "
                             "without --resume to start afresh") from None
        self.plan_sha256 = _sha256(self.plan_bytes)
        self._ledger_path = self.folder / (RUN_LEDGER if shard is None else f"ledger.shard-{int(shard)}.json")
        # What this writer recorded (and, the run's own, assigned) before a kill stays (a resumed run extends it).
        self._mine, self._assigned = self._read_ledger(self._ledger_path)
        if shard is not None:
            self._assigned = {}  # only the run's own ledger assigns units to shards

    # --- starting ---------------------------------------------------------------------------------

    @classmethod
    def start(cls, folder: str | os.PathLike, plan: dict[str, Any], created_at: str | None) -> UnitStore:
        """A fresh units folder holding `plan` (with `created_at`), created in one atomic step; an earlier
        folder at that place is replaced (a fresh run never takes units from an earlier one)."""
        folder = Path(folder)
        with atomic.staged_dir(folder, internal=True) as stage:
            atomic.write_text(stage / PLAN_FILE, canonical_json({**plan, "created_at": created_at}))
        return cls(folder)

    @classmethod
    def resume(cls, folder: str | os.PathLike, plan: dict[str, Any]) -> tuple[UnitStore, str | None]:
        """The existing folder, if its plan is `plan` (apart from `created_at`); with the first start's
        created_at. InputError naming what differs otherwise."""
        folder = Path(folder)
        old = jsonio.read(folder / PLAN_FILE)
        if not isinstance(old, dict) or {k: v for k, v in old.items() if k != "created_at"} != plan:
            raise InputError(f"{one_line(str(folder))}: cannot resume: that run was started with other kernels, "
                             "tiles, regimes, parameters, toolkit or machine; run without --resume to start afresh")
        return cls(folder), old.get("created_at")

    # --- units ------------------------------------------------------------------------------------

    def path(self, uid: str) -> Path:
        return self.folder / f"{uid}.json"

    def has(self, uid: str) -> bool:
        return self.path(uid).is_file()

    def unit_document(self, unit, evidence: dict[str, Any], tile_digest: str) -> str:
        """The text of a unit file: schema, the plan and tile digests, the unit and each arm's evidence."""
        return unit_text({"schema": UNIT_SCHEMA, "plan": self.plan_sha256, "tile_sha256": tile_digest,
                          "unit": to_plain(unit), "evidence": evidence})

    def write(self, uid: str, unit, evidence: dict[str, Any], tile_digest: str) -> None:
        """Record the unit's digest in this process's ledger, then write the unit file (both atomically)."""
        text = self.unit_document(unit, evidence, tile_digest)
        self._mine.setdefault(uid, set()).add(_sha256(text.encode("utf-8")))
        self._write_ledger()
        atomic.write_text(self.path(uid), text)

    def assign(self, shards: dict[int, list[str]]) -> None:
        """Record in the run's own ledger, before the shards start, which unit ids each shard worker computes
        (added to what earlier starts assigned: a resumed run may split the tiles otherwise). A shard's ledger
        vouches for these units only (`recorded`)."""
        if self._ledger_path.name != RUN_LEDGER:
            raise ValueError("only the run's own store assigns units to shards")  # a bug of the caller
        for shard, uids in shards.items():
            self._assigned.setdefault(int(shard), set()).update(uids)
        self._write_ledger()

    def _write_ledger(self) -> None:
        ledger = {"schema": LEDGER_SCHEMA, "plan": self.plan_sha256,
                  "units": {u: sorted(d) for u, d in sorted(self._mine.items())}}
        if self._assigned:  # only a sharded run's own ledger: every other keeps its bytes
            ledger["shards"] = {str(i): sorted(u) for i, u in sorted(self._assigned.items())}
        atomic.write_text(self._ledger_path, json.dumps(ledger, indent=1) + "\n")

    def _read_ledger(self, path: Path) -> tuple[dict[str, set[str]], dict[int, set[str]]]:
        """({unit id: digests}, {shard: unit ids}) a ledger of this plan records (a missing ledger, one of
        another plan, or a damaged one, records nothing)."""
        try:
            doc = jsonio.read(path) if path.is_file() else None
        except InputError:
            doc = None
        if not isinstance(doc, dict) or doc.get("schema") != LEDGER_SCHEMA or doc.get("plan") != self.plan_sha256 \
                or not isinstance(doc.get("units"), dict):
            return {}, {}
        units = {uid: {d for d in digests if isinstance(d, str)} for uid, digests in doc["units"].items()
                 if isinstance(digests, list)}
        shards = doc.get("shards") if isinstance(doc.get("shards"), dict) else {}
        assigned = {int(i): {u for u in uids if isinstance(u, str)} for i, uids in shards.items()
                    if isinstance(i, str) and i.isdigit() and isinstance(uids, list)}
        return units, assigned

    def recorded(self) -> dict[str, set[str]]:
        """{unit id: digests} that chain to this run's plan: every digest of the run's own ledger, and of each
        shard's ledger those of the units the run's ledger assigned to that shard (module docstring)."""
        own, assigned = self._read_ledger(self.folder / RUN_LEDGER)
        for shard, uids in self._assigned.items():
            assigned.setdefault(shard, set()).update(uids)
        found: dict[str, set[str]] = {uid: set(d) for uid, d in own.items()}
        for entry in sorted(self.folder.iterdir()):
            match = _LEDGER.match(entry.name)
            if match is None or match.group(2) is None or not entry.is_file():
                continue
            mine = assigned.get(int(match.group(2)), set())
            for uid, digests in self._read_ledger(entry)[0].items():
                if uid in mine:
                    found.setdefault(uid, set()).update(digests)
        for uid, digests in self._mine.items():
            found.setdefault(uid, set()).update(digests)
        return found

    def read(self, uid: str, tile, regime: str, tile_digest: str, recorded: dict[str, set[str]]):
        """The unit `uid` (tile `tile` under `regime`) and its evidence, after every check of the module
        docstring; InputError naming the file otherwise."""
        path = self.path(uid)
        label = one_line(str(path))
        fix = "delete it and resume (it is computed again)"
        try:
            data = path.read_bytes()
            doc = jsonio.read(path)
        except (InputError, OSError):
            raise InputError(f"{label}: damaged unit result; {fix}") from None
        if not isinstance(doc, dict) or doc.get("schema") != UNIT_SCHEMA \
                or set(doc) != {"schema", "plan", "tile_sha256", "unit", "evidence"}:
            raise InputError(f"{label}: not a {UNIT_SCHEMA} unit file; {fix}")
        if doc["plan"] != self.plan_sha256:
            raise InputError(f"{label}: computed under another plan (plan digest {one_line(str(doc['plan']))[:16]}…, "
                             f"this run's {self.plan_sha256[:16]}…): a unit of another run; {fix}")
        if doc["tile_sha256"] != tile_digest:
            raise InputError(f"{label}: computed on other bytes of tile {one_line(tile.name)!r} than this run's; {fix}")
        if _sha256(data) not in recorded.get(uid, ()):
            raise InputError(f"{label}: its digest is not in the run's ledger: the file was not written by this run "
                             f"(planted, edited or copied); {fix}")
        try:
            unit = from_plain(UnitResult, doc["unit"], "unit")
            same = to_plain(unit) == doc["unit"] and unit_text(doc) == data.decode("utf-8")
        except (ValueError, UnicodeError):  # InputError is a ValueError
            same = False
        if not same:
            raise InputError(f"{label}: does not follow the unit schema (fields of alibi.conform.results.UnitResult); {fix}")
        why = unit_impossible(unit, tile, regime)
        if why is None and not (isinstance(doc["evidence"], dict) and set(doc["evidence"]) == {"a", "b"}):
            why = "its evidence is not one record per arm (a, b)"
        if why is not None:
            raise InputError(f"{label}: impossible unit: {why}; {fix}")
        return unit, doc["evidence"]


_OPTIONAL_COUNTS = ("max_ulp", "max_abs_acc", "n_predicted", "n_near_zero", "n_differing_near_zero",
                    "max_ulp_above_floor")


def unit_impossible(unit, tile, regime: str) -> str | None:
    """Why `unit` cannot be the result of `tile` under `regime` (None when every invariant holds). The field
    types are the reader's (`alibi.io.typed.from_plain`): here only what the types cannot say."""
    # deferred: keeps torch out of start-up
    from alibi.exact.numerics import dtype_name

    for name in _OPTIONAL_COUNTS:
        value = getattr(unit, name)
        if value is not None and value < 0:
            return f"{name} is {value!r}, not a count"
    want = {"tile": tile.name, "regime": regime, "fmt": tile.fmt, "M": tile.M, "K": tile.K, "N": tile.N,
            "out_dtype": dtype_name(tile.out_dtype), "bias": tile.bias is not None}
    for name, value in want.items():
        if getattr(unit, name) != value:
            return f"{name} is {getattr(unit, name)!r}, this run's tile has {value!r}"
    n, d = unit.n_elements, unit.n_differing
    if n != unit.M * unit.N:
        return f"n_elements {n:,} is not M·N = {unit.M * unit.N:,}"
    if not 0 <= d <= n:
        return f"{d:,} of {n:,} elements differ"
    if unit.bitwise_equal != (d == 0):
        return f"bitwise_equal is {unit.bitwise_equal} with {d:,} differing elements"
    diffs = unit.differences
    if diffs is None:
        return "it lists no differences (a unit of a v1 report)"
    if diffs.count != d or len(diffs.elements) != min(d, diffs.cap):
        return (f"the differences record {diffs.count:,} elements ({len(diffs.elements)} listed, cap {diffs.cap}) "
                f"for {d:,} differing")
    if any(not (0 <= e.row < unit.M and 0 <= e.column < unit.N) or e.a_bits == e.b_bits for e in diffs.elements):
        return "a listed difference lies outside the output or has equal bits"
    for name in ("n_predicted", "n_near_zero"):
        if getattr(unit, name) is not None and getattr(unit, name) > n:
            return f"{name} {getattr(unit, name):,} exceeds the {n:,} elements"
    if unit.n_differing_near_zero is not None and unit.n_differing_near_zero > min(d, unit.n_near_zero or 0):
        return f"n_differing_near_zero {unit.n_differing_near_zero:,} exceeds the near-zero or differing count"
    if unit.explained and unit.n_predicted != d:
        return f"explained, yet {unit.n_predicted} predicted and {d:,} differing"
    if d == 0 and unit.max_ulp not in (None, 0):
        return f"max_ulp {unit.max_ulp} with no differing element"
    if not 0 <= unit.pow2_scales_changed <= (unit.N if regime == "pow2" else 0):
        return f"pow2_scales_changed {unit.pow2_scales_changed} under the {regime} regime with N = {unit.N}"
    if sorted(v.check for v in unit.verdicts) != sorted(CHECKS):
        return "its verdicts are not one per check"
    return None


def unit_files(folder: str | os.PathLike) -> list[Path]:
    """The unit files in a units folder (not the plan, not the ledgers)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if p.name != PLAN_FILE and not _LEDGER.match(p.name))


def discard(folder: str | os.PathLike, beside: str | os.PathLike) -> None:
    """Remove a finished run's units folder so that a kill at any instant leaves it whole (resumable, and
    removed by a fresh run) or gone: one atomic rename to a staging name of `beside` (the report), which
    the next write of `beside` removes if a kill stops the deletion, then the deletion."""
    atomic.discard_dir(folder, beside)


__all__ = ["LEDGER_SCHEMA", "PLAN_FILE", "UNIT_SCHEMA", "UnitStore", "discard", "tile_sha256", "unit_files",
           "unit_impossible", "unit_text"]

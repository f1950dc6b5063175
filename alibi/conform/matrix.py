"""The conformance matrix: every pair of a kernel set certified at once (`alibi matrix`).

Every pair goes through the one conformance pipeline (`alibi.conform.pipeline.run_conformance`), so a cell
holds what `alibi conform --kernel-a A --kernel-b B` would report for the same tiles and regimes.
Each kernel runs once per tile and regime: its outputs (and its exposed accumulator) are recorded
the first time a pair asks for them, keyed by the operands it is handed (`operand_key`: the tile's
name, unique within the source, and the bytes of its scales and bias), and every later pair that
hands it the same operands gets the recorded output (`RecordedKernel`; the matrix records each
kernel's launches, so this is checked, not assumed).

Two checks are properties of one kernel, not of a pair: M-invariance and run-to-run determinism.
Replaying a recorded output cannot test them, so the pairs run without them (`invariance=False`)
and each kernel is checked once on its own (`self_checks`: a second genuine launch of every
real-scale tile, and the 1-, 4- and 16-row sub-batches), recorded in the kernel's row.

A cell's status, from the pair's units:

* `bitwise` — every unit bitwise equal;
* `explained` — the arms differ, and on every unit exactly where their declared epilogue models
  (applied to the exact accumulator) differ; `causes` names what differs (scale order,
  intermediate rounding, bias mode), and each arm equals its declared model;
* `unexplained` — some unit differs where the models do not predict it, or an arm departs from its
  declared model (`predicted-differences` or `epilogue-model` fired): a finding;
* `not-judged` — the declarations predict no exact set of differences (an arm declares no epilogue model, an fp8
  arm no accumulation schedule, or a nondeterministic reduction at a tile's shape); the counts are reported, the
  verdict is not, and `not_judged_because` says why, naming the arm and the shape.

For fp8 tiles the declarations are each arm's epilogue *and* its accumulation schedule (`alibi.exact.fp8_mma`):
the emulator computes the fp32 accumulator each schedule prescribes, and a cause such as `accumulation schedule
(promotion interval)` names what differs between two schedules.

`Matrix.exit_code` is 1 when any cell is unexplained or any kernel's own check fired, else 0.
The types are frozen dataclasses; `matrix.json` is `Matrix.to_json()`, published as
`docs/schemas/alibi.matrix.v2.schema.json` (v1 documents, written before fp8 pairs were judged, still read), and every consumer (matrix.md, the HTML section) reads
it back through `Matrix.from_json`.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from alibi.conform.results import Regime, ReportVerdict
from alibi.conform.verdict import Verdict
from alibi.errors import InputError
from alibi.governance.environment import toolkit_record
from alibi.io.typed import TypedResult

if TYPE_CHECKING:
    import torch

    from alibi.conform.pipeline import TileSource
    from alibi.kernels.base import Kernel
    from alibi.tiles.tile import Tile

SCHEMA = "alibi.matrix/v2"
SCHEMA_FILE = "docs/schemas/alibi.matrix.v2.schema.json"
V1 = "alibi.matrix/v1"


class PairStatus(StrEnum):
    """A cell's status (module docstring)."""

    BITWISE = "bitwise"
    EXPLAINED = "explained"
    UNEXPLAINED = "unexplained"
    NOT_JUDGED = "not-judged"


STATUSES = tuple(PairStatus)
SELF_CHECKS = ("m-invariance", "run-to-run")
MATRIX_FILES = ("matrix.json", "matrix.md", "report.html")


# --- the result types -----------------------------------------------------------------------------

@dataclass(frozen=True)
class MatrixKernel:
    """One kernel of the matrix: registry name, declared epilogue model, how it ran here, the evidence of its
    first launch, how many launches produced its outputs (`launches`: once per tile and regime, plus one per tile
    when an accumulator was asked for), and its own checks (`m-invariance`, `run-to-run`) over the real-scale
    tiles."""

    name: str
    epilogue_model: str | None
    how: str
    evidence: dict[str, Any]
    launches: int
    self_checks: tuple[Verdict, ...]

    @property
    def fired(self) -> list[str]:
        return [v.check for v in self.self_checks if v.fired]


@dataclass(frozen=True)
class Unavailable:
    """A kernel that was asked for but cannot run here, and why (only with `available_only`)."""

    name: str
    reason: str


@dataclass(frozen=True)
class PairUnit:
    """One tile under one regime of a pair: elements differing (`n_differing`), predicted by the declared models
    (`n_predicted`, None when not judged), `explained` (observed set = predicted set), `cause`, `max_ulp`."""

    tile: str
    regime: Regime
    n_elements: int
    n_differing: int
    n_predicted: int | None
    explained: bool | None
    cause: str | None
    max_ulp: int | None


@dataclass(frozen=True)
class MatrixCell:
    """One pair (a before b in the kernel order): `status` (module docstring), `causes` over its units,
    totals over units, the pair report's `verdict` (`pass`/`fail`/`inconclusive`, without the per-kernel
    checks) and the checks that `fired` on it, every unit, and why a `not-judged` pair is not (else None)."""

    kernel_a: str
    kernel_b: str
    status: PairStatus
    causes: tuple[str, ...]
    n_elements: int
    n_differing: int
    n_predicted: int | None
    max_ulp: int | None
    verdict: ReportVerdict
    fired: tuple[str, ...]
    units: tuple[PairUnit, ...]
    not_judged_because: str | None = None


@dataclass(frozen=True)
class Matrix(TypedResult):
    """The `matrix.json` document: the kernels (in the order given), those asked for but unavailable, one cell
    per unordered pair, the tile source and regimes, the environment, and created_at (the one wall-clock
    field; SOURCE_DATE_EPOCH fixes it)."""

    SCHEMA = SCHEMA
    READS = (V1,)
    JSON_INDENT = 2
    REMEDY = "re-run `alibi matrix`"
    FILE = "matrix.json"

    schema: str = field(default=SCHEMA, kw_only=True)  # first: the document names its schema first
    created_at: str | None
    source: dict[str, Any]
    regimes: tuple[Regime, ...]
    kernels: tuple[MatrixKernel, ...]
    unavailable: tuple[Unavailable, ...]
    cells: tuple[MatrixCell, ...]
    environment: dict[str, Any]

    def cell(self, a: str, b: str) -> MatrixCell:
        for c in self.cells:
            if {c.kernel_a, c.kernel_b} == {a, b}:
                return c
        raise KeyError((a, b))

    @property
    def unexplained(self) -> list[MatrixCell]:
        return [c for c in self.cells if c.status == PairStatus.UNEXPLAINED]

    @property
    def exit_code(self) -> int:
        """1 when a pair differs unexplained or a kernel's own check fired; else 0."""
        return 1 if (self.unexplained or any(k.fired for k in self.kernels)) else 0

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> Matrix:
        """The document as a Matrix, refused (InputError naming `where`) when it contradicts itself
        (`contradiction`): a reader must not draw or judge a cell its own numbers disprove."""
        m = super().from_dict(doc, where)
        why = m.contradiction()
        if why is not None:
            raise InputError(f"{where or cls.FILE}: contradicts itself: {why}; the file was edited or damaged: "
                             f"{cls.REMEDY}")
        return m

    def contradiction(self) -> str | None:
        """What no matrix `run_matrix` writes can hold (None when nothing): every unordered pair of the kernels
        once; a cell's totals the sums over its units, each unit at most its element count; `bitwise` with no
        differing element and nothing fired against the models; `explained` only where every unit differs
        exactly where predicted; no ulp distance without a differing element."""
        names = [k.name for k in self.kernels]
        if len(set(names)) != len(names):
            return "a kernel is listed twice"
        pairs = [frozenset((c.kernel_a, c.kernel_b)) for c in self.cells]
        expected = {frozenset(p) for p in itertools.combinations(names, 2)}
        if len(set(pairs)) != len(pairs) or set(pairs) != expected:
            return f"its cells are not one per pair of its {len(names)} kernels"
        for c in self.cells:
            cell = f"cell {c.kernel_a} vs {c.kernel_b}"
            if any(not 0 <= u.n_differing <= u.n_elements for u in c.units):
                return f"{cell}: a unit has more differing elements than elements, or fewer than none"
            if (c.n_elements, c.n_differing) != (sum(u.n_elements for u in c.units), sum(u.n_differing for u in c.units)):
                return (f"{cell}: {c.n_differing:,} of {c.n_elements:,} elements differ, but its units sum to "
                        f"{sum(u.n_differing for u in c.units):,} of {sum(u.n_elements for u in c.units):,}")
            against_models = {"predicted-differences", "epilogue-model"} & set(c.fired)
            if c.status == PairStatus.BITWISE and (c.n_differing or against_models
                                                   or any(u.explained is False for u in c.units)):
                return f"{cell}: says bitwise with {c.n_differing:,} differing elements" + (
                    f" and {', '.join(sorted(against_models))} fired" if against_models else "")
            if c.status == PairStatus.EXPLAINED and (c.n_differing == 0 or not all(u.explained for u in c.units)):
                return f"{cell}: says explained, yet {'no element differs' if c.n_differing == 0 else 'a unit is not'}"
            if any(u.explained and u.n_predicted != u.n_differing for u in c.units):
                return f"{cell}: a unit says explained with predicted and differing counts that are not equal"
            if any(u.n_differing == 0 and u.max_ulp not in (None, 0) for u in c.units) or (
                    c.n_differing == 0 and c.max_ulp not in (None, 0)):
                return f"{cell}: an ulp distance with no differing element"
        return None

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A v1 document as it was written: its cells without `not_judged_because` (`alibi.io.typed`)."""
        if doc["schema"] == V1:
            for cell in doc["cells"]:
                del cell["not_judged_because"]
        return doc

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        """A v1 document's cells with `not_judged_because` None (v1 gave no reason)."""
        if doc.get("schema") == V1 and isinstance(doc.get("cells"), list):
            doc["cells"] = [{**cell, "not_judged_because": None} if isinstance(cell, dict) else cell
                            for cell in doc["cells"]]
        return doc


# --- each kernel once per tile --------------------------------------------------------------------

def operand_key(tile: Tile) -> str:
    """What identifies a kernel's operands within one matrix: the tile's name (names are unique within a source,
    each tile digested when it was read, and a regime changes only scales), the shapes and dtypes, and the bytes
    of the small operands (scales, bias) and the output dtype. Hashing the int8/fp8 matrices themselves on every
    request would cost more than the kernels on a GPU."""
    # deferred: keeps torch out of start-up
    import torch

    h = hashlib.sha256(f"{tile.name}\0{tile.out_dtype}".encode())
    for name in ("a_q", "w_q", "s_a", "s_w", "bias"):
        t = getattr(tile, name)
        h.update(f"{name}:{None if t is None else (str(t.dtype), tuple(t.shape))};".encode())
        if t is not None and name not in ("a_q", "w_q"):
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


class RecordedKernel:
    """A kernel whose outputs are recorded by operand digest and replayed to every later request for them.

    It stands in for the kernel in `run_conformance`: the same name, formats, device and declared model;
    `run` launches the kernel only for operands it has not seen (or to expose an accumulator not recorded
    yet). `launches` counts the launches that produced outputs."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.name, self.formats, self.device = kernel.name, kernel.formats, kernel.device
        self.epilogue, self.description = kernel.epilogue, kernel.description
        self._outputs: dict[str, Any] = {}
        self.launches = 0
        self.first_evidence: dict[str, Any] | None = None

    def __getattr__(self, attr: str) -> Any:  # anything else (epilogue_at, build, ...) is the kernel's own
        return getattr(self.kernel, attr)

    def available(self) -> tuple[bool, str]:
        return self.kernel.available()

    def require_available(self) -> None:
        self.kernel.require_available()

    def torch_device(self):
        return self.kernel.torch_device()

    def evidence(self) -> dict[str, Any]:
        return self.kernel.evidence()

    def run(self, tile: Tile, *, accumulator: bool = False, on_device: bool = False, evidence: bool = True,
            wait: bool = True):
        """The cached output for these operands, launched (and waited for, whatever `wait` says) at the first ask."""
        # deferred: keeps torch out of start-up
        from alibi.kernels.base import KernelOutput

        key = operand_key(tile)
        hit, acc_asked = self._outputs.get(key, (None, False))
        if hit is None or (accumulator and not acc_asked):
            got = self.kernel.run(tile, accumulator=accumulator, on_device=True, evidence=True)
            self.launches += 1
            if self.first_evidence is None:
                self.first_evidence = got.evidence
            # An accumulator asked for later: the output every pair saw so far stays the one recorded.
            hit = got if hit is None else KernelOutput(hit.out, got.acc, hit.evidence)
            self._outputs[key] = (hit, acc_asked or accumulator)
        out, acc = hit.out, (hit.acc if accumulator else None)
        if not on_device:
            out, acc = out.cpu(), (None if acc is None else acc.cpu())
        return KernelOutput(out, acc, dict(hit.evidence) if evidence else {})


# --- running the matrix ---------------------------------------------------------------------------

def self_checks(kernel: RecordedKernel, tiles: Sequence[Tile]) -> tuple[Verdict, ...]:
    """M-invariance and run-to-run of one kernel over the real-scale tiles: its recorded output of each tile
    against a second genuine launch and against the 1-, 4- and 16-row sub-batches (`alibi.conform.launches.sub_batches`)."""
    # deferred: keeps torch out of start-up
    import torch

    # deferred: keeps torch out of start-up
    from alibi.conform import checks
    from alibi.conform.launches import sub_batches
    from alibi.kernels.base import private_copy

    inner = kernel.kernel
    m_inv, again = [], []
    for tile in tiles:
        full = kernel.run(private_copy(tile), on_device=False).out
        second = inner.run(private_copy(tile), evidence=False).out
        subsets = [(rows, inner.run(tile.rows(torch.tensor(rows)), evidence=False).out) for rows in sub_batches(tile.M)]
        m_inv.append(checks.m_invariance({"kernel": full}, {"kernel": subsets}))
        again.append(checks.run_to_run({"kernel": full}, {"kernel": second}))
    return checks.combine(m_inv), checks.combine(again)


def _cell(a: str, b: str, report) -> MatrixCell:
    units = tuple(PairUnit(u.tile, u.regime, u.n_elements, u.n_differing, u.n_predicted, u.explained, u.cause,
                           u.max_ulp) for u in report.tiles)
    fired = tuple(v.check for v in report.checks if v.fired)
    if "predicted-differences" in fired or "epilogue-model" in fired or any(u.explained is False for u in units):
        status = PairStatus.UNEXPLAINED
    elif all(u.n_differing == 0 for u in units):
        status = PairStatus.BITWISE
    elif all(u.explained for u in units):
        status = PairStatus.EXPLAINED
    else:
        status = PairStatus.NOT_JUDGED
    causes = tuple(dict.fromkeys(part for u in units if u.cause for part in u.cause.split(" and ")))
    predicted = [u.n_predicted for u in units]
    ulps = [u.max_ulp for u in units if u.max_ulp is not None]
    why = None
    if status == PairStatus.NOT_JUDGED:
        reasons = [v.detail for u in report.tiles for v in u.verdicts
                   if v.check == "predicted-differences" and not v.applicable]
        why = "; ".join(dict.fromkeys(reasons)) or "no unit was judged"
    return MatrixCell(a, b, status, causes, sum(u.n_elements for u in units), sum(u.n_differing for u in units),
                      None if None in predicted else sum(predicted), max(ulps) if ulps else None, report.verdict,
                      fired, units, why)


def run_matrix(names: Sequence[str], source: TileSource, regimes: Sequence[str] = ("real", "pow2"), *,
               available_only: bool = False, ulp_threshold: int = 1, created_at: Any = None,
               progress: Callable[[int, int, str], None] | None = None,
               kernels: Sequence[Kernel] | None = None) -> Matrix:
    """Certify every pair of the kernels `names` on `source` × `regimes` (module docstring).

    available_only: leave out kernels that cannot run here, listing each with its reason (`Matrix.unavailable`);
    otherwise one that cannot run raises KernelUnavailable (exit 3). kernels: the kernel objects (default:
    `get_kernel(name)` for each name). created_at: default now (`alibi.conform.pipeline.created_now`).
    """
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import (
        Pair,
        apply_regime,
        created_now,
        environment,
        run_conformance,
        validate_regimes,
        within_declarations,
    )
    from alibi.kernels.registry import get_kernel

    names = list(names)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"--kernels names {dup!r} twice; give each kernel once")
    regimes = validate_regimes(regimes)
    objects = list(kernels) if kernels is not None else [get_kernel(n) for n in names]
    fmt = source.tiles[0].fmt if source.tiles else None
    if fmt is None:
        raise InputError("no tiles to check")
    tile_names = [t.name for t in source.tiles]
    if len(set(tile_names)) != len(tile_names):
        dup = next(n for n in tile_names if tile_names.count(n) > 1)
        raise InputError(f"two tiles are named {dup!r}: a matrix tells tiles apart by name; rename one")
    if len({t.fmt for t in source.tiles}) > 1:
        raise InputError(f"the tiles mix formats ({', '.join(sorted({t.fmt for t in source.tiles}))}): give one format")
    chosen, unavailable = [], []
    for kernel in objects:
        ok, reason = kernel.available()
        if not ok:
            if not available_only:
                kernel.require_available()
            unavailable.append(Unavailable(kernel.name, reason))
            continue
        if fmt not in kernel.formats:
            raise InputError(f"kernel {kernel.name!r} handles {', '.join(kernel.formats)} tiles, but the tiles are "
                             f"{fmt}: give a matrix of kernels of one format")
        chosen.append(RecordedKernel(kernel))
    if len(chosen) < 2:
        raise InputError(f"a matrix needs at least two kernels that run here; {len(chosen)} of {len(objects)} do"
                         + ("".join(f"; {u.name}: {u.reason}" for u in unavailable) if unavailable else ""))
    created = created_now() if created_at is None else created_at
    pairs = list(itertools.combinations(chosen, 2))
    cells = []
    for n, (a, b) in enumerate(pairs, start=1):
        report = run_conformance(Pair(a, b, "matrix"), source, regimes, ulp_threshold=ulp_threshold,
                                 invariance=False, created_at=None)
        cells.append(_cell(a.name, b.name, report))
        if progress:
            c = cells[-1]
            progress(n, len(pairs), f"{a.name} vs {b.name}: {c.status} ({c.n_differing} differing)")
    rows = []
    for k in chosen:
        # each kernel on the tiles its declaration covers (no fp32-bias probe for one taking its bias in the output dtype)
        real_tiles = ([apply_regime(t, "real") for t in within_declarations(source, [k]).tiles]
                      if "real" in regimes else [])
        checks_ = self_checks(k, real_tiles) if real_tiles else tuple(
            Verdict(c, False, False, "checked in the real-scale regime, which this matrix did not run") for c in SELF_CHECKS)
        ok, how = k.available()
        rows.append(MatrixKernel(k.name, k.epilogue.name if k.epilogue else None, how,
                                 _plain(k.first_evidence or k.evidence()), k.launches, tuple(checks_)))

    env = {**environment(), "toolkit": toolkit_record()}
    return Matrix(created, source.record, tuple(regimes), tuple(rows), tuple(unavailable), tuple(cells), env)


def _plain(obj: Any) -> Any:
    """Evidence as plain JSON (a kernel may record non-JSON values; they become strings)."""
    return json.loads(json.dumps(obj, default=str))


# --- presentation ---------------------------------------------------------------------------------

SYMBOL = {"bitwise": "=", "explained": "E", "unexplained": "✗", "not-judged": "?"}


def to_markdown(m: Matrix) -> str:
    """matrix.md: the grid (one symbol per pair), then each cell with its cause and counts, then the kernels."""
    names = [k.name for k in m.kernels]
    lines = [f"# Conformance matrix: {len(names)} kernels, {len(m.cells)} pairs", "",
             f"Tiles: {m.source.get('label')}; regimes: {', '.join(m.regimes)}. "
             f"`=` bitwise equal · `E` differs only where the declared models predict · `✗` unexplained · "
             f"`?` not judged (no exact prediction).", ""]
    lines.append("| | " + " | ".join(f"`{n}`" for n in names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for a in names:
        row = []
        for b in names:
            row.append("·" if a == b else SYMBOL[m.cell(a, b).status])
        lines.append(f"| `{a}` | " + " | ".join(row) + " |")
    lines += ["", "| kernel a | kernel b | status | cause | differing / elements | predicted | max ulp | conform verdict |",
              "|---|---|---|---|---:|---:|---:|---|"]
    for c in m.cells:
        lines.append(f"| `{c.kernel_a}` | `{c.kernel_b}` | {c.status} | {', '.join(c.causes) or '-'} | "
                     f"{c.n_differing:,} / {c.n_elements:,} | {'-' if c.n_predicted is None else f'{c.n_predicted:,}'} | "
                     f"{'-' if c.max_ulp is None else c.max_ulp} | {c.verdict}"
                     + (f" ({', '.join(c.fired)} fired)" if c.fired else "") + " |")
    lines += ["", "| kernel | declared epilogue | launches | m-invariance | run-to-run | how it ran |", "|---|---|---:|---|---|---|"]
    for k in m.kernels:
        status = {v.check: v.status for v in k.self_checks}
        lines.append(f"| `{k.name}` | `{k.epilogue_model or '-'}` | {k.launches} | {status.get('m-invariance')} | "
                     f"{status.get('run-to-run')} | {k.how} |")
    unjudged = [c for c in m.cells if c.not_judged_because]
    if unjudged:
        lines += ["", "Not judged, and why:", ""]
        lines += [f"- `{c.kernel_a}` vs `{c.kernel_b}`: {c.not_judged_because}" for c in unjudged]
    if m.unavailable:
        lines += ["", "Not available here (left out):", ""]
        lines += [f"- `{u.name}`: {u.reason}" for u in m.unavailable]
    env = m.environment
    tk = env.get("toolkit") or {}
    gpus = ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in env.get("gpus") or []) or "none"
    lines += ["", f"Machine: CPU {env.get('cpu')}, GPU {gpus}; Python {env.get('python')}, torch {env.get('torch')}, "
                  f"triton {env.get('triton')}; integer-alibi {tk.get('version')} at commit {tk.get('git_commit')}"
                  + (" (with uncommitted changes)" if tk.get("git_dirty") else "") + "."]
    return "\n".join(lines) + "\n"


def heatmap(m: Matrix) -> bytes:
    """PNG of the grid: one square per pair, coloured by status, labelled with its differing-element count."""
    # deferred: keeps matplotlib out of start-up
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    names = [k.name for k in m.kernels]
    code = {"bitwise": 0, "explained": 1, "unexplained": 2, "not-judged": 3}
    colours = ["#2ca02c", "#9ecae1", "#d62728", "#d9d9d9", "#ffffff"]
    n = len(names)
    data = [[4] * n for _ in range(n)]
    labels = [[""] * n for _ in range(n)]
    for c in m.cells:
        i, j = names.index(c.kernel_a), names.index(c.kernel_b)
        for r, s in ((i, j), (j, i)):
            data[r][s] = code[c.status]
            labels[r][s] = "0" if c.n_differing == 0 else f"{c.n_differing:,}"
    size = 2.5 + 0.65 * n
    fig = Figure(figsize=(size + 2.2, size))
    ax = fig.add_subplot()
    ax.imshow(data, cmap=ListedColormap(colours), vmin=0, vmax=4, interpolation="nearest")
    ax.set_xticks(range(n), names, rotation=50, ha="right", fontsize=8)
    ax.set_yticks(range(n), names, fontsize=8)
    for r in range(n):
        for s in range(n):
            if labels[r][s]:
                ax.text(s, r, labels[r][s], ha="center", va="center", fontsize=6)
    ax.set_xticks([x - 0.5 for x in range(1, n)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, n)], minor=True)
    ax.grid(which="minor", color="#ffffff", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_title("differing output elements per pair, coloured by verdict", fontsize=9)
    ax.legend(handles=[Patch(color=colours[0], label="bitwise"),
                       Patch(color=colours[1], label="explained by the declared models"),
                       Patch(color=colours[2], label="unexplained"), Patch(color=colours[3], label="not judged")],
              loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    return buf.getvalue()


__all__ = ["MATRIX_FILES", "SCHEMA", "SCHEMA_FILE", "STATUSES", "Matrix", "MatrixCell", "MatrixKernel", "PairStatus",
           "PairUnit", "RecordedKernel", "Unavailable", "heatmap", "operand_key", "run_matrix", "self_checks",
           "to_markdown"]

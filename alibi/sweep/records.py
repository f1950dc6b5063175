"""The sweeps' result types (frozen dataclasses with a schema string) and their files.

A depth-sweep folder holds `depth.json` (`DepthSweep`, schema `alibi-depth-sweep/v1`), `depth.csv`
(one row per (seed, K), columns `CSV_COLUMNS`) and `manifest.json`; a rows-sweep folder holds
`rows.json` (`RowsSweep`, `alibi-rows-sweep/v1`), `rows.csv` and `manifest.json`. Every field is
documented in docs/sweeps.md. `read_depth_input` turns a depth-sweep folder, its JSON, or any CSV
with at least `seed,K,frac_differ` into `alibi.sweep.depth_fits.DepthData`, refusing a malformed CSV with
one line naming the row and column.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from alibi.errors import InputError
from alibi.governance.verified import read_verified
from alibi.io.typed import TypedResult
from alibi.sweep.compare import Comparison
from alibi.sweep.depth_fits import DepthData
from alibi.sweep.rates import BinomialRate, Homogeneity, PoissonTrend, RatioBound

DEPTH_SCHEMA = "alibi-depth-sweep/v1"
ROWS_SCHEMA = "alibi-rows-sweep/v1"
DEPTH_JSON, DEPTH_CSV = "depth.json", "depth.csv"
ROWS_JSON, ROWS_CSV = "rows.json", "rows.csv"


@dataclass(frozen=True)
class DepthRecord(Comparison):
    """One (seed, K) of a depth sweep: the `Comparison` fields plus where and how long.

    seed: the seed index; K: the reduction depth; seconds_a / seconds_b: wall time of each kernel's
    call (synchronized); seconds_reference: the fp64 reference GEMM and scaling.
    """

    seed: int
    K: int
    seconds_a: float
    seconds_b: float
    seconds_reference: float


CSV_COLUMNS = ("seed", "K", "n", "n_differing", "frac_differ", "n_nonfinite", "near_zero_floor", "n_near_zero",
               "n_near_zero_differing", "n_differing_far", "n_ge2ulp", "share_ge2ulp", "median_rel_diff",
               "max_rel_diff", "max_ulp", "max_ulp_far", "err_a_max_rel", "err_a_mean_rel", "err_b_max_rel",
               "err_b_mean_rel", "seconds_a", "seconds_b", "seconds_reference")
assert set(CSV_COLUMNS) == {f.name for f in fields(DepthRecord)}


@dataclass(frozen=True)
class SweepTiming:
    """Where the wall time of a sweep went (seconds; every phase synchronized with the device).

    total: from the first operand draw to the last measurement; operands: drawing and quantizing;
    warmup: one call of each kernel before the first record (JIT compilation, library loading);
    kernel_a / kernel_b: the kernels' calls; reference: the fp64 reference; reference_check: the
    one-time CPU cross-check of a CUDA reference; compare: the measurements; other: the rest
    (Python, transfers, bookkeeping). share_outside_kernels: 1 − (kernel_a + kernel_b)/total;
    share_outside_kernels_and_reference: also without the reference.
    """

    total: float
    operands: float
    warmup: float
    kernel_a: float
    kernel_b: float
    reference: float
    reference_check: float
    compare: float
    other: float
    share_outside_kernels: float
    share_outside_kernels_and_reference: float


def timing(total: float, operands: float, warmup: float, kernel_a: float, kernel_b: float, reference: float,
           reference_check: float, compare: float) -> SweepTiming:
    known = operands + warmup + kernel_a + kernel_b + reference + reference_check + compare
    t = max(total, 1e-12)
    return SweepTiming(total, operands, warmup, kernel_a, kernel_b, reference, reference_check, compare,
                       max(0.0, total - known), 1 - (kernel_a + kernel_b) / t, 1 - (kernel_a + kernel_b + reference) / t)


@dataclass(frozen=True)
class DepthSweep(TypedResult):
    """A depth sweep: kernels, design, the reference used, every record and the timing.

    format: `int8` or `fp8_e4m3`; fp8_scales: `tensor`/`row` (None for int8); operands: how they were
    drawn; operand_device / reference: where operands were drawn and which path computed the fp64
    reference; reference_check: the CUDA reference's cross-check; near_zero_rel: the near-zero floor
    relative to rms(Y_ref) of each tile; seeds: the seed indices (generator words, see
    alibi.sweep.operands); nested_prefix: smaller K are prefixes of each seed's largest-K operands.
    """

    SCHEMA = DEPTH_SCHEMA
    REMEDY = "re-run `alibi sweep depth`"
    FILE = DEPTH_JSON

    kernel_a: str
    kernel_b: str
    format: str
    fp8_scales: str | None
    out_dtype: str
    M: int
    N: int
    Ks: tuple[int, ...]
    seeds: tuple[int, ...]
    nested_prefix: bool
    operands: str
    operand_device: str
    reference: str
    reference_check: str
    near_zero_rel: float
    records: tuple[DepthRecord, ...]
    timing: SweepTiming
    schema: str = DEPTH_SCHEMA

    @property
    def label(self) -> str:
        return f"{'INT8' if self.format == 'int8' else 'FP8'} {self.kernel_a} vs {self.kernel_b}"

    def data(self) -> DepthData:
        r = self.records
        return DepthData(tuple(x.seed for x in r), tuple(x.K for x in r), tuple(x.frac_differ for x in r),
                         tuple(x.n for x in r), tuple(x.n_differing for x in r))

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for rec in self.records:
            d = asdict(rec)
            writer.writerow(["" if d[c] is None else repr(d[c]) if isinstance(d[c], float) else d[c]
                             for c in CSV_COLUMNS])
        return buf.getvalue()


@dataclass(frozen=True)
class RowsPoint:
    """One M of the rows sweep.

    tiles: kernel calls of M rows each; blocks: independent operand blocks (fresh weights and
    activations each; the tiles of a block share its weights); elements: tiles·M·N; rate: the
    differing elements with an exact interval; block_events: differing elements per block;
    dispersion: homogeneity of the rate across this M's blocks (a check of the independence the
    binomial interval assumes); n_ge2ulp / max_ulp: sizes of the differences; seconds_a/b: kernel time.
    """

    M: int
    tiles: int
    blocks: int
    elements: int
    rate: BinomialRate
    block_events: tuple[int, ...]
    dispersion: Homogeneity
    n_ge2ulp: int
    n_nonfinite: int
    max_ulp: int | None
    seconds_a: float
    seconds_b: float


@dataclass(frozen=True)
class RowsSweep(TypedResult):
    """The rows sweep: per-M rates and whether they depend on M.

    elements_target: the requested elements per M; rows_per_block: rows drawn per operand block
    (rounded up to a multiple of M); homogeneity: one rate for every M? (χ², G, exact); trend: the
    Poisson trend `rate ∝ M^b` with the factor across the M range compatible at 90%; ratio: the
    largest ratio between two M points' rates compatible at 90% (simultaneous over pairs).
    """

    SCHEMA = ROWS_SCHEMA
    REMEDY = "re-run `alibi sweep rows`"
    FILE = ROWS_JSON

    kernel_a: str
    kernel_b: str
    format: str
    fp8_scales: str | None
    out_dtype: str
    K: int
    N: int
    Ms: tuple[int, ...]
    elements_target: int
    rows_per_block: int
    seed: int
    confidence: float
    operands: str
    operand_device: str
    points: tuple[RowsPoint, ...]
    homogeneity: Homogeneity
    trend: PoissonTrend
    ratio: RatioBound
    timing: SweepTiming
    schema: str = ROWS_SCHEMA

    @property
    def label(self) -> str:
        return f"{'INT8' if self.format == 'int8' else 'FP8'} {self.kernel_a} vs {self.kernel_b}"

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(("M", "tiles", "blocks", "elements", "n_differing", "rate", "ci_low", "ci_high",
                         "n_ge2ulp", "max_ulp"))
        for p in self.points:
            writer.writerow((p.M, p.tiles, p.blocks, p.elements, p.rate.events, repr(p.rate.rate), repr(p.rate.low),
                             repr(p.rate.high), p.n_ge2ulp, "" if p.max_ulp is None else p.max_ulp))
        return buf.getvalue()


# --- reading ----------------------------------------------------------------------------------------

def read_depth_sweep(path: str | Path) -> DepthSweep:
    """A depth-sweep folder (or its depth.json), once its manifest (kind `depth-sweep`) vouches for it
    (`alibi.governance.verified`); InputError naming the file otherwise."""
    return read_verified(path, DepthSweep, ("depth-sweep",), fix="pass the folder 'alibi sweep depth' wrote, "
                         "as it wrote it, or its rows as a CSV")


def read_rows_sweep(path: str | Path) -> RowsSweep:
    """A rows-sweep folder (or its rows.json), once its manifest (kind `rows-sweep`) vouches for it."""
    return read_verified(path, RowsSweep, ("rows-sweep",), fix="pass the folder 'alibi sweep rows' wrote, as it "
                         "wrote it")


@dataclass(frozen=True)
class DepthInput:
    """Rows to fit and what is known about them: `sweep` when read from our own JSON."""

    source: str
    label: str
    data: DepthData
    sweep: DepthSweep | None


def read_depth_input(path: str | Path) -> DepthInput:
    """A depth-sweep folder or JSON, or a CSV with columns seed,K,frac_differ (optionally n, n_differing)."""
    p = Path(path)
    if p.is_dir() or p.suffix.lower() == ".json":
        sweep = read_depth_sweep(p)
        return DepthInput(str(p), sweep.label, sweep.data(), sweep)
    if p.suffix.lower() == ".csv":
        return DepthInput(str(p), p.stem, read_depth_csv(p), None)
    raise InputError(f"{p}: not a depth-sweep folder, .json or .csv; pass what 'alibi sweep depth' wrote or a CSV "
                     "with columns seed,K,frac_differ")


REQUIRED = ("seed", "K", "frac_differ")
COUNT_COLUMNS = ("n", "n_differing")
# A CSV's frac_differ must equal n_differing/n to this relative precision when both are given (a
# writer printing 6 significant digits passes; a fraction from other counts does not).
FRAC_RTOL = 1e-6


def read_depth_csv(path: str | Path) -> DepthData:
    """Parse and validate; InputError naming the file, row and column of the first problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise InputError(f"{p}: cannot read it as UTF-8 text ({exc.__class__.__name__})") from None
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise InputError(f"{p}: empty file; a depth CSV needs a header with {','.join(REQUIRED)} and data rows")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"{p}: header lacks column(s) {', '.join(missing)} (found {','.join(header) or 'nothing'}); "
                         f"a depth CSV needs {','.join(REQUIRED)}")
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise InputError(f"{p}: column(s) {', '.join(dupes)} appear more than once in the header")
    counts = [c for c in COUNT_COLUMNS if c in header]
    if len(counts) == 1:
        raise InputError(f"{p}: column {counts[0]} without {({'n', 'n_differing'} - set(counts)).pop()}; "
                         "give both counts or neither")
    if len(rows) == 1:
        raise InputError(f"{p}: header only, no data rows")
    col = {h: i for i, h in enumerate(header)}
    seeds, Ks, fracs, ns, nds = [], [], [], [], []
    seen: set[tuple[int, int]] = set()
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise InputError(f"{p}: line {line} has {len(row)} fields, the header has {len(header)}")
        cell = {name: row[i].strip() for name, i in col.items()}
        seed = _int(p, line, "seed", cell["seed"], minimum=0)
        K = _int(p, line, "K", cell["K"], minimum=1)
        frac = _float(p, line, "frac_differ", cell["frac_differ"])
        if not 0.0 <= frac <= 1.0:
            raise InputError(f"{p}: line {line}, column frac_differ: {frac!r} is outside [0, 1]")
        if (seed, K) in seen:
            raise InputError(f"{p}: line {line}: seed {seed} and K {K} appear twice; one row per (seed, K)")
        seen.add((seed, K))
        if counts:
            n = _int(p, line, "n", cell["n"], minimum=1)
            nd = _int(p, line, "n_differing", cell["n_differing"], minimum=0)
            if nd > n:
                raise InputError(f"{p}: line {line}: n_differing {nd} exceeds n {n}")
            if not math.isclose(frac, nd / n, rel_tol=FRAC_RTOL, abs_tol=1e-300):
                raise InputError(f"{p}: line {line}: frac_differ {frac!r} is not n_differing/n = {nd}/{n}")
            ns.append(n)
            nds.append(nd)
        seeds.append(seed)
        Ks.append(K)
        fracs.append(frac)
    return DepthData(tuple(seeds), tuple(Ks), tuple(fracs), tuple(ns) if counts else None,
                     tuple(nds) if counts else None)


def _int(p: Path, line: int, name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and f == int(f)):
            raise InputError(f"{p}: line {line}, column {name}: {text!r} is not an integer") from None
        value = int(f)
    if value < minimum:
        raise InputError(f"{p}: line {line}, column {name}: {value} is below {minimum}")
    return value


def _float(p: Path, line: int, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{p}: line {line}, column {name}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{p}: line {line}, column {name}: {text!r} is not finite")
    return value

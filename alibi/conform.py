"""The conformance procedure: two kernels, many tiles, two scale regimes, every check.

Data flow per unit (one tile under one regime): apply the regime (real scales, or weight scales
rounded to powers of two) → exact emulation (accumulator, headroom, prediction) → run arm A and
arm B on private copies of the operands → run each arm's declared epilogue model → checks. In
the real regime each arm also runs on row subsets (M-invariance) and a second time (run-to-run);
those are properties of the kernel, not of the scales, so the pow2 regime does not repeat them.

A unit's result is a plain JSON-able dict, so long runs can persist units one by one and resume
(see `alibi.experiment`); `summarize` folds units into the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from alibi import checks
from alibi.differences import differing_elements
from alibi.emulator import (
    EpilogueModel,
    apply_epilogue,
    exact_accumulator,
    predict_tile,
)
from alibi.errors import InputError
from alibi.kernels import Kernel, get_kernel
from alibi.numerics import (
    bitwise_equal_mask,
    dtype_name,
    is_subnormal,
    max_ulp_distance,
    pow2_round,
)
from alibi.tile import Tile
from alibi.token_risk import ReplayEvidence

SCHEMA = "alibi.conform/v1"
REGIMES = ("real", "pow2")
SUB_BATCH_SIZES = (1, 4, 16)


@dataclass(frozen=True)
class Pair:
    """The two arms under comparison, and why these two were chosen."""

    a: Kernel
    b: Kernel
    selection: str


def choose_pair(kernel_a: str | None, kernel_b: str | None) -> Pair:
    """The requested pair, or the default: `cutlass` vs `triton` with CUDA, else the best CPU pair.

    Without CUDA the default is `triton` (the real Triton kernel under the Triton interpreter)
    against `torch-cpu` (`torch._int_mm`): two different real implementations whose declared
    epilogues use the two scale orders of the vLLM kernels. Requested kernels that cannot run here
    raise KernelUnavailable (exit 3); nothing is replaced silently.
    """
    if (kernel_a is None) != (kernel_b is None):
        raise InputError("give both --kernel-a and --kernel-b, or neither (for the default pair)")
    if kernel_a is not None:
        pair = Pair(get_kernel(kernel_a), get_kernel(kernel_b), "requested")
    elif torch.cuda.is_available():
        pair = Pair(get_kernel("cutlass"), get_kernel("triton"),
                    "default with CUDA: the vLLM-order CUTLASS kernel against the vLLM-order Triton kernel")
    else:
        pair = Pair(get_kernel("torch-cpu"), get_kernel("triton"),
                    "default without CUDA: torch._int_mm on the CPU (w_then_a epilogue) against the real Triton "
                    "kernel under the Triton interpreter (a_then_w epilogue) — two different real "
                    "implementations with the two vLLM scale orders")
    pair.a.require_available()
    pair.b.require_available()
    return pair


def apply_regime(tile: Tile, regime: str) -> Tile:
    """`real`: the tile as is. `pow2`: every weight scale replaced by `2**round(log2 s_w)`."""
    if regime == "real":
        return tile
    if regime == "pow2":
        return tile.replace(s_w=pow2_round(tile.s_w, "nearest"))
    raise InputError(f"unknown scale regime {regime!r}; use real and/or pow2")


def validate_regimes(regimes: Iterable[str]) -> list[str]:
    regimes = list(dict.fromkeys(regimes))
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or not regimes:
        raise InputError(f"--scales: unknown or empty regime list {unknown or regimes}; use real, pow2 or real,pow2")
    return regimes


def sub_batches(M: int) -> list[list[int]]:
    """Row sets for the M-invariance check: 1 row at the start, 4 from the middle, 16 at the end."""
    rows = []
    for i, size in enumerate(SUB_BATCH_SIZES):
        if size >= M:
            continue
        start = (0, (M - size) // 2, M - size)[i]
        rows.append(list(range(start, start + size)))
    return rows


def _operands(tile: Tile) -> dict[str, torch.Tensor | None]:
    return {"a_q": tile.a_q, "s_a": tile.s_a, "w_q": tile.w_q, "s_w": tile.s_w, "bias": tile.bias}


def _private_copy(tile: Tile) -> Tile:
    return tile.replace(**{k: (None if v is None else v.clone()) for k, v in _operands(tile).items()})


def _model_output(kernel: Kernel, acc: torch.Tensor | None, tile: Tile) -> tuple[str | None, torch.Tensor | None]:
    if kernel.epilogue is None:
        return None, None
    if acc is None:
        return kernel.epilogue.name, None
    return kernel.epilogue.name, apply_epilogue(kernel.epilogue, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype)


def evaluate_unit(kernel_a: Kernel, kernel_b: Kernel, tile: Tile, regime: str, *,
                  ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD, invariance: bool = True) -> dict[str, Any]:
    """Run both arms on one tile under one regime and every check; a JSON-able result."""
    t = apply_regime(tile, regime)
    int8 = t.fmt == "int8"
    acc = exact_accumulator(t.a_q, t.w_q) if int8 else None
    pred = predict_tile(t, acc) if int8 else None
    ta, tb = _private_copy(t), _private_copy(t)
    run_a, run_b = kernel_a.run(ta), kernel_b.run(tb)
    out_a, out_b = run_a.out, run_b.out
    for label, out in (("a", out_a), ("b", out_b)):
        if out.shape != (t.M, t.N) or out.dtype != t.out_dtype:
            kernel = kernel_a if label == "a" else kernel_b
            raise InputError(f"kernel {kernel.name!r} returned {dtype_name(out.dtype)}{list(out.shape)} for tile "
                             f"{t.name!r}; expected {dtype_name(t.out_dtype)}[{t.M}, {t.N}]")
    reference_fp32 = (apply_epilogue(EpilogueModel("a_then_w"), acc, t.s_a, t.s_w, None, torch.float32)
                      if acc is not None else None)
    # int8: every arm is held to its model applied to the exact accumulator. fp8: the accumulator
    # itself rounds in an implementation-defined order, so an arm can only be held to its declared
    # epilogue applied to its *own* exposed fp32 accumulator (unjudged when it exposes none).
    model_a = _model_output(kernel_a, acc if int8 else run_a.acc, t)
    model_b = _model_output(kernel_b, acc if int8 else run_b.acc, t)
    verdicts = [
        checks.shared_operands(_operands(ta), _operands(tb)),
        checks.int32_no_overflow(pred, t.K),
        checks.lossless_fp32_entry(pred),
        checks.exact_accumulator(acc, run_a.acc, run_b.acc),
        checks.pow2_identity(out_a, out_b, t.s_w, pred.int32_safe, reference_fp32) if int8 else
        checks.inapplicable("pow2-identity", f"{t.fmt} accumulation rounds in an implementation-defined order"),
        checks.real_scale_tolerance(out_a, out_b, regime == "real", ulp_threshold),
        checks.token_level_risk(),
        checks.epilogue_model({"a": (model_a[0], out_a, model_a[1]), "b": (model_b[0], out_b, model_b[1])}),
    ]
    if regime == "real" and invariance:
        arms = {"a": (kernel_a, out_a), "b": (kernel_b, out_b)}
        subsets = {arm: [(rows, k.run(t.rows(torch.tensor(rows))).out) for rows in sub_batches(t.M)]
                   for arm, (k, _) in arms.items()}
        verdicts.append(checks.m_invariance({arm: out for arm, (_, out) in arms.items()}, subsets))
        verdicts.append(checks.run_to_run({arm: out for arm, (_, out) in arms.items()},
                                          {arm: k.run(_private_copy(t)).out for arm, (k, _) in arms.items()}))
    else:
        why = "checked in the real-scale regime" if invariance else "disabled (--no-invariance)"
        verdicts.append(checks.inapplicable("m-invariance", why))
        verdicts.append(checks.inapplicable("run-to-run", why))
    differs = ~bitwise_equal_mask(out_a, out_b)
    summary = {
        "tile": t.name, "regime": regime, "fmt": t.fmt, "M": t.M, "K": t.K, "N": t.N,
        "out_dtype": dtype_name(t.out_dtype), "bias": t.bias is not None,
        "n_elements": out_a.numel(), "n_differing": int(differs.sum()),
        "max_ulp": max_ulp_distance(out_a, out_b), "bitwise_equal": not bool(differs.any()),
        "differences": differing_elements(out_a, out_b).as_dict(),  # positions and values, capped
        "max_abs_acc": pred.max_abs_acc if pred else None,
        "headroom_bits": _finite_or_none(pred.headroom_bits) if pred else None,
        "prediction": pred.prediction if pred else None,
        "pow2_scales_changed": int((tile.s_w != t.s_w).sum()) if regime == "pow2" else 0,
        "subnormal_scales": int(is_subnormal(t.s_a).sum() + is_subnormal(t.s_w).sum()),
        "verdicts": {v.check: v.to_dict() for v in verdicts},
    }
    return summary


def _finite_or_none(x: float) -> float | None:
    return None if x == float("inf") else x


def _required_checks(units: list[dict[str, Any]]) -> list[str]:
    regimes = {u["regime"] for u in units}
    int8 = any(u["fmt"] == "int8" for u in units)
    req = ["shared-operands", "epilogue-model"]
    if int8:
        req += ["int32-no-overflow", "lossless-fp32-entry"]
        if "pow2" in regimes:
            req.append("pow2-identity")
    if "real" in regimes:
        req.append("real-scale-tolerance")
    return req


def summarize(units: list[dict[str, Any]], pair: Pair, *, source: dict[str, Any], seed: int | None,
              regimes: Iterable[str], environment: dict[str, Any], created_at: str,
              replay: ReplayEvidence | None = None) -> dict[str, Any]:
    """Fold unit results into the report (the `report.json` document).

    replay: a flip analysis of the same pair (`--replay`); check 7 is then judged on it instead of
    being inapplicable on every tile, and the report records which file it used (`replay`).
    """
    combined = []
    for check in checks.CHECKS:
        vs = [checks.Verdict(check, d["fired"], d["applicable"], d["detail"], d["threshold"], d["evidence"])
              for d in (u["verdicts"][check] for u in units)]
        combined.append(replay.verdict() if replay is not None and check == "token-level-risk"
                        else checks.combine(vs))
    by_name = {v.check: v for v in combined}
    required = _required_checks(units) + (["token-level-risk"] if replay is not None else [])
    if any(v.fired for v in combined):
        verdict = "fail"
    elif all(by_name[c].applicable for c in required):
        verdict = "pass"
    else:
        verdict = "inconclusive"
    missing = [c for c in required if not by_name[c].applicable]
    report = {
        "schema": SCHEMA,
        "created_at": created_at,  # the only wall-clock field: everything else is reproducible
        "kernel_a": _kernel_record(pair.a),
        "kernel_b": _kernel_record(pair.b),
        "selection": pair.selection,
        "verdict": verdict,
        "equivalence": "bitwise" if all(u["bitwise_equal"] for u in units) else "not bitwise",
        "inconclusive_because": [f"{c}: {by_name[c].detail}" for c in missing] if verdict == "inconclusive" else [],
        "source": source,
        "seed": seed,
        "regimes": list(regimes),
        "checks": [v.to_dict() for v in combined],
        "tiles": units,
        "environment": environment,
    }
    if replay is not None:
        report["replay"] = replay.as_dict()
    return report


def _kernel_record(kernel: Kernel) -> dict[str, Any]:
    ok, reason = kernel.available()
    return {"name": kernel.name, "epilogue_model": kernel.epilogue.name if kernel.epilogue else None,
            "available": ok, "how": reason, "evidence": kernel.evidence()}


def environment() -> dict[str, Any]:
    """Versions and hardware this run used (recorded in every report)."""
    import platform

    from alibi import __version__

    env: dict[str, Any] = {"alibi": __version__, "python": platform.python_version(),
                           "platform": platform.platform(), "torch": torch.__version__,
                           "cuda_available": torch.cuda.is_available()}
    from alibi.governance.environment import environment as machine

    # CPU results depend on the CPU (model and int8-relevant ISA: alibi.governance.environment).
    env["cpu"], env["cpu_isa"] = machine().cpu, list(machine().cpu_isa)
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def progress_printer(stream=None) -> Callable[[int, int, str], None]:
    """Per-unit progress on `stream` (default: sys.stderr as it is at the call, not at import): a bar on a
    terminal, `[done/total] label (s)` lines otherwise (alibi.progress)."""
    from alibi.progress import Progress

    return Progress("conform", stream=stream)


def conform(pair: Pair, tiles: list[Tile], regimes: Iterable[str] = REGIMES, *, source: dict[str, Any],
            seed: int | None = None, ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD, invariance: bool = True,
            progress: Callable[[int, int, str], None] | None = None,
            replay: ReplayEvidence | None = None) -> dict[str, Any]:
    """The whole procedure over `tiles` × `regimes`; returns the report document.

    replay: the flip analysis check 7 is judged on (`alibi.token_risk`); it must be of this pair.
    """
    regimes = validate_regimes(regimes)
    if not tiles:
        raise InputError("no tiles to check")
    if replay is not None:
        replay.require_pair(pair.a.name, pair.b.name)
    units = []
    total = len(tiles) * len(regimes)
    for tile in tiles:
        for regime in regimes:
            units.append(evaluate_unit(pair.a, pair.b, tile, regime, ulp_threshold=ulp_threshold,
                                       invariance=invariance))
            if progress:
                u = units[-1]
                progress(len(units), total, f"{tile.name} [{regime}] {u['n_differing']} differing, "
                         f"max ulp {u['max_ulp']}")
    return summarize(units, pair, source=source, seed=seed, regimes=regimes, environment=environment(),
                     created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), replay=replay)


def exit_code(report: dict[str, Any], strict: bool = False) -> int:
    """0 when every applicable check passed (1 for inconclusive under `strict`), 1 when a check fired."""
    if report["verdict"] == "fail":
        return 1
    return 1 if (strict and report["verdict"] == "inconclusive") else 0

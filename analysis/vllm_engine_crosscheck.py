"""Cross-checks of the vLLM engine study against the own runner (issue "Inside a real serving engine", item 5).

1. Tiles: the vLLM capture against the own runner's capture of the same prompt (window 0, same tokens):
   weights and weight scales of every fused vLLM layer against the own runner's layers concatenated
   (q,k,v → qkv_proj; gate,up → gate_up_proj); activations (a_q, s_a) per layer, first layers in full.
   A third capture inside vLLM with torch-cpu swapped in separates what vLLM's kernel changes from what the
   rest of the engine changes.
2. Logits: the vLLM arm with torch-cpu swapped in against the own runner with torch-cpu, teacher-forced over the
   same span: log-probabilities equal bit for bit, top-1 agreement, largest difference.

Usage: python3 analysis/vllm_engine_crosscheck.py --model W8A8 --prompts SET --vllm-capture DIR --vllm-arm DIR
       --work TMP --out crosscheck.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",), "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}


def by_layer(folder: Path) -> dict:
    from alibi.tiles.tile import load_tile_dir

    return {t.meta["layer"]: t for t in load_tile_dir(folder)}


def compare_tiles(vllm: dict, own: dict, layers: int) -> dict:
    weights_differ, rows = [], []
    for i in range(layers):
        for fused, parts in FUSED.items():
            v = vllm[f"model.layers.{i}.{fused}"]
            o = [own[f"model.layers.{i}.{p}"] for p in parts]
            same_w = torch.equal(v.w_q, torch.cat([t.w_q for t in o]))
            same_s = torch.equal(v.s_w.view(torch.int32), torch.cat([t.s_w for t in o]).view(torch.int32))
            if not (same_w and same_s):
                weights_differ.append(f"model.layers.{i}.{fused}")
            a = o[0]  # q/k/v (gate/up) share their input, so one own tile holds the activations
            rows.append({"layer": f"model.layers.{i}.{fused}",
                         "a_q_differing": int((v.a_q != a.a_q).sum()), "a_q_elements": v.a_q.numel(),
                         "s_a_rows_differing": int((v.s_a.view(torch.int32) != a.s_a.view(torch.int32)).sum()),
                         "rows": v.M})
    first = next((r["layer"] for r in rows if r["a_q_differing"] or r["s_a_rows_differing"]), None)
    return {"layers_with_differing_weights_or_scales": weights_differ, "first_layer_with_differing_activations": first,
            "activations": rows}


def alibi(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "alibi", *args], check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--model", "--prompts", "--vllm-capture", "--vllm-arm", "--work", "--out"):
        p.add_argument(flag, type=Path, required=True)
    args = p.parse_args()
    from alibi.engine.vllm_runs import capture_with_vllm
    from alibi.governance.manifest import read_manifest
    from alibi.tokens.records import read_records

    tokens = int(read_manifest(args.vllm_capture).predicate["parameters"]["tokens"])
    own_capture = args.work / "own-capture"
    alibi("capture", "--model", str(args.model), "--prompts", str(args.prompts), "--tokens", str(tokens),
          "--kernel", "torch-cpu", "--out", str(own_capture), "--quiet")
    swapped = args.work / "vllm-capture-torch-cpu"
    capture_with_vllm(args.model, args.prompts, swapped, tokens=tokens, kernel="torch-cpu")
    own, native, swap = by_layer(own_capture), by_layer(args.vllm_capture), by_layer(swapped)
    tiles = {"vllm_native_vs_own_torch_cpu": compare_tiles(native, own, 30),
             "vllm_torch_cpu_vs_own_torch_cpu": compare_tiles(swap, own, 30)}

    vllm_arm = read_records(args.vllm_arm)
    span = read_manifest(args.vllm_arm).predicate["parameters"]
    own_arm_dir = args.work / "own-arm"
    alibi("replay", "teacher-forced", "--model", str(args.model), "--prompts", str(args.prompts),
          "--windows", str(len(span["windows"])), "--context", str(span["context"]), "--positions",
          str(span["positions"]), "--kernel", "torch-cpu", "--out", str(own_arm_dir), "--quiet")
    own_arm = read_records(own_arm_dir)
    pairs = list(zip(vllm_arm.records, own_arm.records, strict=True))
    assert all(a.key == b.key and a.forced_id == b.forced_id for a, b in pairs)
    diffs = [abs(a.forced_logprob - b.forced_logprob) for a, b in pairs]
    first = next(((a.window, a.position) for a, b in pairs if a.forced_logprob != b.forced_logprob), None)
    logits = {"positions": len(pairs), "forced_logprob_identical": sum(d == 0 for d in diffs),
              "top1_agree": sum(a.top1_id == b.top1_id for a, b in pairs),
              "max_abs_forced_logprob_difference": max(diffs), "first_differing_position": first,
              "mean_forced_logprob_vllm": sum(r.forced_logprob for r in vllm_arm.records) / len(pairs),
              "mean_forced_logprob_own": sum(r.forced_logprob for r in own_arm.records) / len(pairs),
              "own_runner_execution": read_manifest(own_arm_dir).predicate["parameters"].get("execution")}
    from alibi.governance.environment import environment_record

    doc = {"tiles": tiles, "logits_vllm_torch_cpu_vs_own_torch_cpu": logits, "capture_tokens": tokens,
           "environment": environment_record()}
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    print(json.dumps({k: v for k, v in logits.items() if k != "own_runner_execution"}, indent=1))
    for name, t in tiles.items():
        print(name, "weights differ:", len(t["layers_with_differing_weights_or_scales"]),
              "first differing activations:", t["first_layer_with_differing_activations"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

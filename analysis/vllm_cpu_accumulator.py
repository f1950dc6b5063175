"""How often vLLM's CPU oneDNN accumulator saturates on a capture made inside vLLM (AVX2 without VNNI).

For every tile of a `alibi capture --engine vllm` folder: the kernel's own int32 accumulator
(`vllm-cpu-onednn`'s read-out, alibi/kernels/vllm_cpu.py) against the exact one, counted per layer
kind; the tiles are first verified against the capture's manifest.

Usage: python3 analysis/vllm_cpu_accumulator.py CAPTURE_DIR OUT.json
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> int:
    from alibi.exact.emulator import exact_accumulator
    from alibi.governance.environment import environment_record
    from alibi.governance.manifest import read_manifest, verify_files
    from alibi.kernels.registry import get_kernel
    from alibi.kernels.vllm_cpu import cpu_isa, saturating_accumulator
    from alibi.tiles.tile import load_tile_dir

    folder, out = sys.argv[1], sys.argv[2]
    problems = verify_files(folder)
    if problems:
        raise SystemExit(f"{folder}: does not verify against its manifest: {problems[:3]}")
    kernel = get_kernel("vllm-cpu-onednn")
    differing: dict[str, int] = {}
    elements: dict[str, int] = {}
    worst, model_holds = 0, True
    tiles = load_tile_dir(folder)
    for t in tiles:
        kind = t.meta["layer"].rsplit(".", 1)[-1]
        acc = kernel.accumulator(t.a_q, t.w_q).to(torch.int64)
        exact = exact_accumulator(t.a_q, t.w_q).to(torch.int64)
        differing[kind] = differing.get(kind, 0) + int((acc != exact).sum())
        elements[kind] = elements.get(kind, 0) + acc.numel()
        worst = max(worst, int((acc - exact).abs().max()))
        if t.meta["layer"].startswith("model.layers.0."):  # the int16-pair model, checked on layer 0 (it is slow)
            model_holds &= torch.equal(acc, saturating_accumulator(t.a_q, t.w_q))
    from alibi.io.digests import sha256_file

    doc = {"capture_manifest_sha256": sha256_file(read_manifest(folder).path),
           "tiles": len(tiles), "accumulator_elements_differing": differing, "accumulator_elements": elements,
           "total_differing": sum(differing.values()), "total_elements": sum(elements.values()),
           "max_abs_accumulator_error": worst, "saturating_model_equals_kernel_on_layer_0": model_holds,
           "activations_positive_fraction": sum(int((t.a_q > 0).sum()) for t in tiles) / sum(t.a_q.numel() for t in tiles),
           "cpu_isa": cpu_isa(), "environment": environment_record()}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    print(json.dumps({k: doc[k] for k in ("total_differing", "total_elements", "max_abs_accumulator_error",
                                          "saturating_model_equals_kernel_on_layer_0")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which SDPA path breaks determinism at decode on this GPU, and what the runner's attention costs.

For the decode shape of the token study (a batch of 64 one-token queries, SmolLM2's 9 query and
3 key/value heads of 64, a KV cache of 192 positions, bf16), each SDPA backend (flash, efficient,
cuDNN, math), with torch's deterministic algorithms off and on, is run 50 times on the same inputs
(reproducibility: distinct outputs) and on row 0 alone versus inside the batch (batch invariance:
row 0's bits), and timed; likewise `alibi.model.invariant.attention`. The backend SDPA picks by
default is read from the kernel names the profiler records. Writes one JSON file (argv[1]).
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from alibi.exact.numerics import bits
from alibi.model.invariant import attention, causal_allowed

B, HQ, HKV, D, L = 64, 9, 3, 64, 192
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
kr, vr = k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1)


def sdpa(qq, kk, vv):
    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)


def ours(qq, kk, vv):
    return attention(qq, kk, vv, causal_allowed(1, kk.shape[2], qq.device), D ** -0.5)


def timed(fn, *args, reps=200) -> float:
    for _ in range(10):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3  # µs


def probe(fn, kk, vv) -> dict:
    outs = {bytes(bits(fn(q, kk, vv)).cpu().numpy().tobytes()) for _ in range(50)}
    row0_batch = bits(fn(q, kk, vv)[:1])
    row0_alone = bits(fn(q[:1].contiguous(), kk[:1].contiguous(), vv[:1].contiguous()))
    return {"distinct_outputs_of_50": len(outs), "row0_batch_invariant": bool(torch.equal(row0_batch, row0_alone)),
            "microseconds": round(timed(fn, q, kk, vv), 2)}


def default_kernels() -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        sdpa(q, kr, vr)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


result = {"shape": {"batch": B, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "cache": L, "dtype": "bfloat16"},
          "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "default_kernels": default_kernels(),
          "sdpa": {}}
for det in (False, True):
    torch.use_deterministic_algorithms(det, warn_only=True)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
        key = f"{name}{'+deterministic' if det else ''}"
        try:
            with sdpa_kernel(backend):
                result["sdpa"][key] = probe(sdpa, kr, vr)
        except RuntimeError as exc:
            result["sdpa"][key] = {"error": str(exc).splitlines()[0][:200]}
    result["sdpa"]["default" + ("+deterministic" if det else "")] = probe(sdpa, kr, vr)
torch.use_deterministic_algorithms(False)
result["alibi_invariant"] = probe(ours, k, v)
json.dump(result, open(sys.argv[1], "w"), indent=1)
print(json.dumps(result, indent=1))

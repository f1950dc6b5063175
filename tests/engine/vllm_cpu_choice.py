"""Which int8 GEMM vLLM's CPU engine runs on this machine, predicted from the CPU alone."""

from __future__ import annotations


def vllms_own_kernel() -> str | None:
    """What alibi names vLLM's own int8 GEMM on this CPU. vLLM 0.32 runs SGLang's AMX kernel
    (`int8_scaled_mm_with_quant`) for symmetric int8 layers on a CPU with AMX tiles (`check_cpu_sgl_kernel`),
    which alibi has no kernel for: the arm is then evidenced by vLLM's kernel log alone and names none (None).
    Elsewhere vLLM runs its oneDNN path, `vllm-cpu-onednn`."""
    import torch

    return None if torch.cpu._is_amx_tile_supported() else "vllm-cpu-onednn"

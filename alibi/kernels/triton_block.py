"""FBGEMM's and TorchAO's Triton block-scaled fp8 GEMMs: `fbgemm-fp8-block` and `torchao-fp8-block`.

* `fbgemm-fp8-block` — `matmul_fp8_block` of FBGEMM's `fp8_gemm.py` (fbgemm-gpu-genai 1.6.0, the tree
  `alibi.kernels.fbgemm` loads; `ALIBI_FBGEMM_ROOT`). Its scales are per block on *both* operands:
  `a_scale [cdiv(M, scale_block_m), cdiv(K, scale_block_k)]`, `b_scale [cdiv(N, scale_block_n), cdiv(K,
  scale_block_k)]` (defaults 256), with `A · a_scale = original A` (alibi's convention); each program reads one
  activation scale for its BLOCK_M rows (`scale_m = pid_m * BLOCK_M // scale_block_m`, fp8_gemm.py:1836). A 1 × 128
  activation group is not such a block, so a tile converts exactly only when its activation scales are equal across
  every aligned block of `ACTIVATION_ROWS` = 256 rows (a decode row, M = 1, always is); any other tile is refused
  with one line. The weights take `scale_block_n = scale_block_k = 128`: the checkpoint's [N/128, K/128] tensor as
  it is. The default path (`fp8_fast_accum=True`, `_kernel_matmul_fp8_block_fastacc`, fp8_gemm.py:1719-1912) chains
  `acc = tl.dot(a, b, acc)` over all of K and, at the end of each scale block, multiplies the chain in place by
  `scale / scale_next` (`scale = a_scale * b_scale`; by `scale` after the last block, fp8_gemm.py:1863-1886):
  `block128:rescale`. That end-of-block test (`(pid_k + 1) % k_multiple == 0 or k_remaining < BLOCK_K * SPLIT_K`)
  misses the end of a ragged last block whose K is a multiple of BLOCK_K, which would leave the last block unscaled;
  alibi pads K with zero bytes to a multiple of 128 (exact: alibi.kernels.block_scaled), so the kernel always sees
  whole blocks. Output bf16 only. The kernel can split K with `tl.atomic_add` into the output (nondeterministic
  order), but FBGEMM 1.6.0's `MATMUL_CONFIGS` hold no configuration with SPLIT_K > 1 (the split-K list of
  `get_configs_io_bound` is disabled, fp8_gemm.py:131); alibi offers the autotuner one configuration of that
  list, `CONFIG` (SPLIT_K = 1, and BLOCK_M < 256, BLOCK_N < 128, BLOCK_K < 128 as the kernel's asserts ask), and
  records it in `last_run`, so the configuration, not only the reduction, is fixed at every shape.
* `torchao-fp8-block` — `torchao.kernel.blockwise_quantization.blockwise_fp8_gemm` (torchao 0.18.0; DeepSeek-V3's
  inference kernel, what `torchao.prototype.blockwise_fp8_inference.BlockwiseQuantLinear` calls): `a_s [M, K/128]`
  row-major, `b_s [N/128, K/128]`, and `accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]` per 128 k
  (blockwise_quantization.py:98), the same expression as vLLM's Triton kernel, which Triton's compile contracts into
  one FMA (`enable_fp_fusion`): `block128:fma(p*sa,sw,acc)`, identified by probe on an H200 (the association probe
  and nine shapes; every element of each random tile, `analysis/h200/fp8_block.sh`). Ragged K and N are masked by
  the kernel. Output bf16 only. Its autotuner compiles and times 48 configurations per shape; alibi offers one,
  `TORCHAO_CONFIG` (BLOCK_SIZE_M = 128, BLOCK_SIZE_N = 128, 8 warps: a wgmma tile), recorded in `last_run`.

Both add a bias after the GEMM (`add_after_cast`), as their linear layers do (`y += self.bias` in
BlockwiseQuantLinear.forward).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.fp8_block_mma import parse_block_schedule
from alibi.kernels import torchao
from alibi.kernels.base import availability
from alibi.kernels.block_scaled import BlockScaledKernel, add_bias_after_cast, pad_block_operands
from alibi.kernels.fbgemm import _MODULE, KNOWN_FP8_GEMM, load_fp8_gemm, locate_root

ACTIVATION_ROWS = 256  # FBGEMM's scale_block_m: rows sharing one activation scale per group
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1}
TORCHAO_MODULE = "torchao.kernel.blockwise_quantization"
TORCHAO_CONFIG = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_stages": 3, "num_warps": 8}


def activation_block_scales(s_a: torch.Tensor, rows: int = ACTIVATION_ROWS) -> torch.Tensor:
    """FBGEMM's `a_scale` [cdiv(M, rows), G] from 1 × 128 group scales `s_a` [M, G]: exact only when every aligned
    block of `rows` rows shares its scales (module docstring); InputError naming the first row that does not."""
    M = s_a.shape[0]
    first = s_a[::rows]
    spread = first.repeat_interleave(rows, dim=0)[:M]
    differs = (spread.view(torch.int32) != s_a.view(torch.int32)).any(dim=1).nonzero()
    if len(differs):
        m = int(differs[0, 0])
        raise InputError(f"FBGEMM's matmul_fp8_block takes one activation scale per block of {rows} rows and 128 "
                         f"columns; this tile's 1x128 scales differ between rows {m - m % rows} and {m}: use M = 1 "
                         "(decode) tiles or tiles whose activation scales are shared by each 256-row block")
    return first.contiguous()


@contextmanager
def _offered(autotuner: Any, config: Any) -> Iterator[None]:
    """Offer `autotuner` only `config` for the duration of a call (one compile instead of dozens per shape)."""
    kept = autotuner.configs
    autotuner.configs = [config]
    try:
        yield
    finally:
        autotuner.configs = kept


class FbgemmFp8BlockKernel(BlockScaledKernel):
    """`fbgemm-fp8-block`: FBGEMM's Triton `matmul_fp8_block` (fast accumulation: one chain, rescaled per block)."""

    name = "fbgemm-fp8-block"
    accumulation = parse_block_schedule("block128:rescale")
    declared_from = ("fbgemm-gpu-genai 1.6.0 fbgemm_gpu/experimental/gemm/triton_gemm/fp8_gemm.py:1844-1886 "
                     "(acc = tl.dot(a, b, acc); acc *= scale / scale_next at each scale block's end)")
    activation_rows = ACTIVATION_ROWS
    out_dtypes = (torch.bfloat16,)
    description = ("FBGEMM's pure-Triton matmul_fp8_block (fp8_gemm.py), scale blocks 256 x 128 (activations) and "
                   "128 x 128 (weights): one chain over K rescaled at each block's end, bf16 output")

    def available(self) -> tuple[bool, str]:
        return availability(locate_root, self.cuda_problem,
                            lambda found: f"FBGEMM Triton fp8_gemm.py matmul_fp8_block from {found[1]} ({found[0]}) "
                                          f"on {torch.cuda.get_device_name()}")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self.checked(a_q, s_a, w_q, s_w, out_dtype)
        M, K = a_q.shape
        N = w_q.shape[0]
        a_scale = activation_block_scales(s_a.to(torch.float32))
        p = pad_block_operands(a_q, s_a, w_q, s_w, self.layout, k_multiple=self.layout.block_k)
        module = load_fp8_gemm()
        autotuner = module._kernel_matmul_fp8_block_fastacc
        config = next((c for c in module.MATMUL_CONFIGS if c.kwargs == CONFIG), None)
        if config is None:
            raise KernelUnavailable(f"FBGEMM's MATMUL_CONFIGS holds no {CONFIG}: not the fp8_gemm.py of "
                                    "fbgemm-gpu-genai 1.6.0")
        a_scale = torch.nn.functional.pad(a_scale, (0, p.s_a.shape[1] - a_scale.shape[1]), value=1.0)
        self.last_run = {"op": "matmul_fp8_block", "fp8_fast_accum": True, "shape": [M, N, K], **p.record(),
                         "scale_blocks": {"m": ACTIVATION_ROWS, "n": self.layout.block_n, "k": self.layout.block_k},
                         "triton_config": {**config.kwargs, "num_stages": config.num_stages,
                                           "num_warps": config.num_warps},
                         "bias": None if bias is None else "added after the cast"}
        with _offered(autotuner, config):
            out = module.matmul_fp8_block(p.a_q, p.w_q, a_scale.contiguous(), p.s_w, ACTIVATION_ROWS,
                                          self.layout.block_n, self.layout.block_k, fp8_fast_accum=True)
        return add_bias_after_cast(out, bias)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        digests = _MODULE.get("digests", {})
        ev["fbgemm"] = {"root": str(_MODULE.get("root")), "sha256": digests,
                        "release_matching_sha256": KNOWN_FP8_GEMM.get(digests.get("fp8_gemm.py", ""))}
        return ev


def load_torchao_block() -> Any:
    """TorchAO's blockwise_quantization module (KernelUnavailable when torchao is missing or fails to import)."""
    torchao.installed_version()
    from alibi.kernels import triton_int8  # noqa: F401 - sets TRITON_INTERPRET=1 without CUDA, before triton loads

    os.environ.setdefault(torchao.SKIP_SO_ENV, "1")
    try:
        return importlib.import_module(TORCHAO_MODULE)
    except Exception as exc:  # noqa: BLE001 - foreign code: any import failure is a refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KernelUnavailable(f"importing {TORCHAO_MODULE} failed: {type(exc).__name__}: {first}") from None


def torchao_block_gemm(a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                       block_size: int = 128) -> tuple[torch.Tensor, dict[str, Any]]:
    """TorchAO's `blockwise_fp8_gemm` with `TORCHAO_CONFIG` the only configuration offered to its autotuner; the
    bf16 output and the configuration as run. CUDA only: TorchAO builds the kernel only where torch finds a Triton
    device (`torch.utils._triton.has_triton`), which the CPU interpreter is not."""
    module = load_torchao_block()
    impls = module._get_triton_impls()
    if not impls.available:
        raise KernelUnavailable("torchao's blockwise fp8 GEMM needs triton, which torch does not find here")
    import triton  # deferred: triton loads (and picks its backend) only when a kernel runs

    kernel = _autotuner_of(impls.gemm)
    kw = {k: v for k, v in TORCHAO_CONFIG.items() if k.startswith("BLOCK")}
    config = next((c for c in kernel.configs if c.kwargs == kw and c.num_stages == TORCHAO_CONFIG["num_stages"]
                   and c.num_warps == TORCHAO_CONFIG["num_warps"]), None)
    if config is None:
        config = triton.Config(kw, num_stages=TORCHAO_CONFIG["num_stages"], num_warps=TORCHAO_CONFIG["num_warps"])
    with _offered(kernel, config):
        out = module.blockwise_fp8_gemm(a_q.contiguous(), s_a.to(torch.float32).contiguous(), w_q.contiguous(),
                                        s_w.to(torch.float32).contiguous(), block_size)
    return out, {"op": f"{TORCHAO_MODULE}.blockwise_fp8_gemm", "triton_config": dict(TORCHAO_CONFIG)}


def _autotuner_of(gemm: Any) -> Any:
    """The Triton autotuner behind TorchAO's `_blockwise_fp8_gemm_op` (a closure variable of the op's function)."""
    fn = getattr(gemm, "_init_fn", gemm)  # torch.library.custom_op keeps the decorated function there
    for cell in getattr(fn, "__closure__", None) or ():
        if hasattr(cell.cell_contents, "configs"):
            return cell.cell_contents
    raise KernelUnavailable("cannot find the Triton autotuner of torchao's blockwise_fp8_gemm (not torchao 0.18?)")


class TorchaoFp8BlockKernel(BlockScaledKernel):
    """`torchao-fp8-block`: TorchAO's `blockwise_fp8_gemm` (DeepSeek-V3's Triton kernel, 1 × 128 / 128 × 128)."""

    name = "torchao-fp8-block"
    accumulation = parse_block_schedule("block128:fma(p*sa,sw,acc)")
    declared_from = ("torchao 0.18.0 torchao/kernel/blockwise_quantization.py:98 "
                     "(accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :], the last multiply and add "
                     "contracted to one FMA by Triton; identified on an H200)")
    out_dtypes = (torch.bfloat16,)
    description = ("TorchAO's Triton blockwise_fp8_gemm (DeepSeek-V3's inference kernel): a fresh tl.dot chain per "
                   "128 k promoted as fma(p*sa, sw, acc), bf16 output, bias added after the cast")

    def available(self) -> tuple[bool, str]:
        return availability(torchao.installed_version, self.cuda_problem,
                            lambda version: f"torchao {version} {TORCHAO_MODULE}.blockwise_fp8_gemm on "
                                            f"{torch.cuda.get_device_name()}")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self.checked(a_q, s_a, w_q, s_w, out_dtype)
        out, run = torchao_block_gemm(a_q, s_a, w_q, s_w, self.layout.block_k)
        self.last_run = {**run, "shape": [a_q.shape[0], w_q.shape[0], a_q.shape[1]],
                         "bias": None if bias is None else "added after the cast"}
        return add_bias_after_cast(out, bias)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev["torchao"] = {"version": torchao.torchao_version()}
        return ev


__all__ = ["ACTIVATION_ROWS", "CONFIG", "FbgemmFp8BlockKernel", "TORCHAO_CONFIG", "TorchaoFp8BlockKernel",
           "activation_block_scales", "load_torchao_block", "torchao_block_gemm"]

"""The kernel interface: an implementation of the scaled GEMM under test.

A kernel declares its epilogue model (the exact fp32 program it claims to run); the
epilogue-model conformance check holds it to that claim bit for bit. A kernel that cannot run on
this machine says why through `available()` and is never silently replaced by another.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

import torch

from alibi.emulator import EpilogueModel
from alibi.errors import KernelUnavailable
from alibi.tile import Tile


@dataclass(frozen=True)
class KernelOutput:
    """What one run of a kernel produced, on the CPU.

    out: the output [M,N] in the tile's out_dtype; acc: the kernel's own int32 accumulator when it
    can expose one (else None); evidence: how it ran (device, backend, versions, build digest).
    """

    out: torch.Tensor
    acc: torch.Tensor | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


TORCH_EPILOGUE = EpilogueModel("w_then_a", "add_before_cast")


def torch_epilogue(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """`TORCH_EPILOGUE` in separate torch fp32 ops on `acc`'s device (each op rounds once, no fusion):
    RN32(s_w·float(acc)), then RN32(s_a·t), then RN32(y + bias), then the output cast."""
    M, N = acc.shape
    y = acc.to(torch.float32) * s_w.to(torch.float32).reshape(1, -1).expand(1, N)
    y = y * s_a.to(torch.float32).reshape(-1, 1).expand(M, 1)
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(1, N)
    return y.to(out_dtype)


class Kernel:
    """Base class. Subclasses set the class attributes and implement `scaled_mm`."""

    name: str = "?"
    formats: tuple[str, ...] = ("int8",)
    device: str = "cpu"  # where it runs: "cpu", "cuda" or "cpu+cuda"
    epilogue: EpilogueModel | None = None
    description: str = ""

    def available(self) -> tuple[bool, str]:
        """(True, how it will run) or (False, why not and what to install)."""
        return True, "runs on the CPU"

    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.device == "cuda" else "cpu")

    def require_available(self) -> None:
        ok, reason = self.available()
        if not ok:
            raise KernelUnavailable(f"kernel {self.name!r} is not available here: {reason}")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The raw op: operands already on `torch_device()`, output [M,N] there too."""
        raise NotImplementedError

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        """The kernel's own int32 accumulator for these operands, when it can expose one."""
        return None

    def evidence(self) -> dict[str, Any]:
        """How this kernel runs here: enough to tell two runs apart (versions, device, backend)."""
        ev: dict[str, Any] = {"kernel": self.name, "device": self.device, "torch": torch.__version__,
                              "python": platform.python_version(),
                              "epilogue_model": self.epilogue.name if self.epilogue else None}
        if self.torch_device().type == "cuda" and torch.cuda.is_available():
            ev["gpu"] = torch.cuda.get_device_name()
            ev["cuda"] = torch.version.cuda
        return ev

    def run(self, tile: Tile) -> KernelOutput:
        """Run on one tile: moves the operands to the kernel's device, returns CPU tensors."""
        self.require_available()
        if tile.fmt not in self.formats:
            from alibi.errors import InputError
            raise InputError(f"kernel {self.name!r} handles {', '.join(self.formats)} tiles; "
                             f"tile {tile.name!r} is {tile.fmt}")
        dev = self.torch_device()
        a_q, s_a, w_q, s_w = (t.to(dev) for t in (tile.a_q, tile.s_a, tile.w_q, tile.s_w))
        bias = tile.bias.to(dev) if tile.bias is not None else None
        out = self.scaled_mm(a_q, s_a, w_q, s_w, bias, tile.out_dtype)
        acc = self.accumulator(a_q, w_q)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return KernelOutput(out=out.cpu(), acc=None if acc is None else acc.cpu(), evidence=self.evidence())

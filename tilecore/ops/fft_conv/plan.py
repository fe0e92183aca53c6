"""Which implementation convolves these sequences (every fit check in one place).

* "tl": the Monarch kernel (kernels.py) for N in configs.TL_FACTORS (CUDA tensors, and CPU tensors
  through Triton's interpreter);
* "torch": torch.fft in float32 (rfft of length 2N, product, irfft): every other N, and CPU tensors
  without the interpreter.
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore import dispatch
from tilecore.ops.fft_conv import configs


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str  # "tl" | "torch"
    n1: int = 0
    n2: int = 0
    num_warps: int = 4
    precision: str = "ieee"


def plan(n: int, device: torch.device) -> Plan:
    if dispatch.backend_for(device) == "reference" or n not in configs.TL_FACTORS:
        return Plan("torch")
    n1, n2 = configs.TL_FACTORS[n]
    precision = "ieee" if dispatch.interpreted(device) else configs.TL_PRECISION
    return Plan("tl", n1=n1, n2=n2, num_warps=configs.TL_WARPS[n], precision=precision)

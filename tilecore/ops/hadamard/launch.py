"""One launch of a Hadamard plan (plan.py): out = scale * H_n x over rows, on the plan's path."""
from __future__ import annotations

import functools

import torch

from tilecore import dispatch
from tilecore.ops.hadamard import butterfly, kernels
from tilecore.ops.hadamard.plan import Plan
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference
from tilecore.tiles.launch import CachedLaunch

_launch_hadamard = CachedLaunch(kernels.hadamard_kernel)


def launch(plan: Plan, x: torch.Tensor, out: torch.Tensor, scale: float) -> None:
    """out[r] = scale * H_n x[r] for the 2-D ``x`` and ``out`` (rows, n) that ``plan`` was made for."""
    if plan.path == "reference":
        out.copy_(hadamard_reference(x, scale))
    elif plan.path == "butterfly":
        butterfly.launch(x, out, scale)
    elif plan.path == "gluon":
        from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_kernel

        with dispatch.on_device(x.device):
            hadamard_gluon_kernel[plan.grid](**gluon_args(x, out, scale, **plan.config), num_warps=4)
    else:
        cfg = plan.config
        load, store = cfg["TMA_LOAD"], cfg["TMA_STORE"]
        # CachedLaunch picks the device from the tensor arguments; with two descriptors there are none
        with dispatch.on_device(x.device if load and store else None):
            _launch_hadamard[plan.grid](_descriptor(x, cfg) if load else x, _descriptor(out, cfg) if store else out,
                                        x.shape[0], x.stride(0), out.stride(0), scale, **cfg)


def _descriptor(t, cfg: dict):
    """A rank-3 view (rows, n / N2, N2) of the rows of ``t``, one [B, N1, N2] slice per box (Triton
    splits a box side over 256 elements into several copies)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    N2 = cfg["N2"]
    return TensorDescriptor(t, [t.shape[0], t.shape[1] // N2, N2], [t.stride(0), N2, 1], [cfg["B"], cfg["N1"], N2])


@functools.lru_cache(maxsize=None)
def _h64(device, dtype) -> torch.Tensor:
    """The Gluon kernel's resident operands, as bf16 bits: H_64 in bf16 (the second product's), then
    H_64 and -H_64 in the input's ``dtype`` (the first product's), each 64 x 64."""
    h = hadamard_matrix(64, torch.float64)
    return torch.cat([h.to(torch.bfloat16), h.to(dtype).view(torch.bfloat16),
                      (-h).to(dtype).view(torch.bfloat16)]).to(device)


def gluon_args(x, out, scale: float, stages: int, lookahead: int = 0, dynamic: bool = True) -> dict:
    """hadamard_gluon_kernel's arguments for (rows, n) ``x`` and ``out``: the rows as lines of 64
    elements (TMA descriptors with [64, 64] boxes; the staging buffer's shape: [64 S, 64]), +-H_64 and
    the stream's row counter (``dynamic``: rows are drawn as programs get to them)."""
    from tilecore.tiles.launch import gluon_descriptor, tile_counter

    rows, n = x.shape
    S = n // 8192

    def lines(t, block):
        return gluon_descriptor(t, block, shape=[rows * n // 64, 64], strides=[64, 1])

    return dict(x_desc=lines(x, [64, 64]), out_desc=lines(out, [64, 64]), staging_desc=lines(out, [64 * S, 64]),
                h_desc=gluon_descriptor(_h64(x.device, x.dtype), [64, 64]), rows=rows, scale=scale,
                row_counter=tile_counter(x.device) if dynamic else None, S=S, STAGES=stages, LOOKAHEAD=lookahead)

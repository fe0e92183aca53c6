"""One launch of a Hadamard plan (plan.py): out = scale * H_n x over rows, on the plan's path."""
from __future__ import annotations

import functools

import torch

from tilecore import dispatch
from tilecore.ops.hadamard import butterfly, kernels
from tilecore.ops.hadamard.plan import Plan
from tilecore.ops.hadamard.reference import hadamard_matrix
from tilecore.tiles.launch import CachedLaunch

_launch_hadamard = CachedLaunch(kernels.hadamard_kernel)


def launch(plan: Plan, x: torch.Tensor, out: torch.Tensor, scale: float, key: tuple | None = None) -> None:
    """out[r] = scale * H_n x[r] for the 2-D ``x`` and ``out`` (rows, n) that ``plan`` was made for.
    ``key``: the call's signature, which the plan and the launch are functions of (the tl kernel's
    launch is looked up by it: CachedLaunch.launch_keyed)."""
    if plan.path == "cpu":
        _cpu(x, out, scale, **plan.config)
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
        args = (_descriptor(x, cfg) if load else x, _descriptor(out, cfg) if store else out,
                x.shape[0], x.stride(0), out.stride(0), scale)
        if key is None:
            with dispatch.on_device(x.device if load and store else None):
                _launch_hadamard[plan.grid](*args, **cfg)
        else:
            with dispatch.on_device(x.device):
                _launch_hadamard.launch_keyed(key, plan.grid, args, cfg)


def _descriptor(t, cfg: dict):
    """A rank-3 view (rows, n / N2, N2) of the rows of ``t``, one [B, N1, N2] slice per box (Triton
    splits a box side over 256 elements into several copies)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    N2 = cfg["N2"]
    return TensorDescriptor(t, [t.shape[0], t.shape[1] // N2, N2], [t.stride(0), N2, 1], [cfg["B"], cfg["N1"], N2])


@functools.lru_cache(maxsize=None)
def h64_operand(device, dtype) -> torch.Tensor:
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
                h_desc=gluon_descriptor(h64_operand(x.device, x.dtype), [64, 64]), rows=rows, scale=scale,
                row_counter=tile_counter(x.device) if dynamic else None, S=S, STAGES=stages, LOOKAHEAD=lookahead)


@functools.lru_cache(maxsize=None)
def _cpu_h(n: int) -> torch.Tensor:
    """H_n in float32 on the CPU (entries +-1: exact)."""
    return hadamard_matrix(n, torch.float32)


@functools.lru_cache(maxsize=None)
def _cpu_h_packed(n: int) -> torch.Tensor:
    """diag(H_n, ..., H_n), 16 x 16, for n < 16: 16 // n rows of n transformed as one row of 16."""
    return torch.kron(torch.eye(16 // n), _cpu_h(n))


def _cpu(x, out, scale: float, factors: tuple[int, int], rows: int) -> None:
    """out = scale * H_n x on torch's CPU matmul in float32 (plan.cpu_plan): x @ (scale H_n), or for
    n = a b two products, x @ H_b over each row's a slices of b, then (scale H_a) over the slices
    (H_n = H_a (x) H_b), ``rows`` rows at a time.

    Products with +-1 entries accumulate in float32; a 16-bit input converts exactly and the result
    rounds once to its dtype. A chunk is read whole before its output is written (in place is safe).
    """
    a, b = factors
    if a * b == 1:
        torch.mul(x, scale, out=out)  # computed in float32, rounded once
        return
    if a == 1 and b < 16 and x.is_contiguous() and x.numel() % 16 == 0:
        # n = 2..8: 16 // n rows at a time, times diag(H_n, ..., H_n): 20-24 ms against 26-60 for
        # x @ H_n on 2^24 float32 (a product of width n runs poorly)
        x, out, h, rows = x.view(-1, 16), out.view(-1, 16), _cpu_h_packed(b), max(1, rows * b // 16)
    else:
        h = _cpu_h(a if a > 1 else b)
    scaled = h * scale  # the scale rides on the last product's matrix
    if a == 1 and x.dtype == torch.float32 and out.data_ptr() != x.data_ptr():
        torch.mm(x, scaled, out=out)  # one product, no temporaries: x @ H_n itself
        return
    hb = _cpu_h(b)
    for i in range(0, x.shape[0], rows):
        xi, oi = x[i:i + rows], out[i:i + rows]
        xf = xi.to(torch.float32).contiguous()  # (float32 rows that are: xi itself)
        # a float32 buffer of the chunk that the products may write: the output where it is float32 and
        # not the input itself, else the input's float32 copy (the first product has read it by then)
        spare = oi if oi.dtype == torch.float32 and oi.data_ptr() != xi.data_ptr() else \
            xf if xf.data_ptr() != xi.data_ptr() else None
        if a == 1:
            y = torch.mm(xf, scaled, out=spare if spare is oi else None)
        else:
            y = torch.mm(xf.view(-1, b), hb).view(-1, a, b)
            # bmm of the expanded H_a: torch.matmul(H_a, y) materializes a [rows, a, a] copy of it
            y = torch.bmm(scaled.expand(y.shape[0], a, a), y, out=None if spare is None else spare.view(-1, a, b))
        if y.data_ptr() != oi.data_ptr():
            oi.copy_(y.view(oi.shape))

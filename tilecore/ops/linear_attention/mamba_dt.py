"""mamba2_step's dt in one launch (issue 31's host time): dt_eff = clamp(dt + dt_bias, dt_limit) and the
step's log-decay g = dt_eff * A, both float32 (B, H), where torch's ops take two to three launches (the
add, the clamp, the product), ~10 us of host time each on the H100's host.

The same float32 arithmetic as op._mamba_dt's torch ops, element for element (an add, compares, a
product: each rounded once as torch rounds it), so the step's bits do not change. Not for softplus (its
log1p is libdevice's on the GPU, which the interpreter cannot run: those calls keep torch's ops).
A NaN dt stays NaN (the compares are false for it), as torch.clamp keeps it.

Signed zero: a GPU check differed from torch's ops in exactly the 4 of 24 cases where a
-0.0 dt reaches the clamp at lo = 0 (no bias, dt_limit (0, inf)): the compare-select keeps -0.0 (as torch's CPU
clamp does), while torch's CUDA clamp (an isnan test, then ``val < lo ? lo : val``, which nvcc may emit as
``max.f32`` once NaN is ruled out) evidently gives +0.0, and g = dt_eff A then differs in sign too. The
``MAMBA_DT_CLAMP`` "max" form clamps with tl.maximum / tl.minimum (``max.f32`` / ``min.f32``) after passing NaN
through, as the CUDA clamp compiles; host_time.py checks both forms on the GPU and prints any differing element.

The "max" form ships: on the H100 it equals torch's CUDA ops bit for bit in every case checked, and the step's dt
costs one launch (notes/host's decision log has the run and its figures).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl  # noqa: F401 (triton.jit below)

from tilecore import dispatch
from tilecore.tiles.launch import CachedLaunch, cdiv

# the switch: on since a GPU run found the kernel's dt_eff and g ("max" form) equal to the torch
# ops' bit for bit (experiments/common/host_time.py's "mamba_dt kernel == torch ops" lines); False: torch's ops
MAMBA_DT_KERNEL = True
# how the clamp is computed: "select" (x < lo ? lo : x: keeps -0.0 at lo = 0, as torch's CPU clamp) or "max"
# (max.f32 / min.f32 after a NaN test: +0.0 there, as torch's CUDA clamp evidently gives); the form whose
# bits equal torch's CUDA ops in host_time.py's check is the one to ship
MAMBA_DT_CLAMP = "max"

BLOCK = 256  # (b, h) entries a program


@triton.jit
def mamba_dt_kernel(dt_ptr, bias_ptr, a_ptr, dt_out_ptr, g_out_ptr, total, H, stride_b, stride_h, lo, hi,
                    HAS_BIAS: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, CLAMP_MAX: tl.constexpr,
                    BLOCK: tl.constexpr):
    # dt: (B, H) any strides, any float dtype; bias, A: (H,) contiguous; dt_out, g_out: (B, H) float32
    # contiguous. Flat index over (B, H): offs = b H + h
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    b = offs // H
    h = offs - b * H
    x = tl.load(dt_ptr + b.to(tl.int64) * stride_b + h * stride_h, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x = x + tl.load(bias_ptr + h, mask=mask, other=0.0).to(tl.float32)
    if CLAMP_MAX:  # max.f32 / min.f32 (a NaN would become lo or hi there: passed through first)
        clamped = x
        if HAS_LO:
            clamped = tl.maximum(clamped, lo)
        if HAS_HI:
            clamped = tl.minimum(clamped, hi)
        x = tl.where(x != x, x, clamped)
    else:
        if HAS_LO:  # torch.clamp's min: below lo -> lo (NaN compares false: kept)
            x = tl.where(x < lo, lo, x)
        if HAS_HI:
            x = tl.where(x > hi, hi, x)
    a = tl.load(a_ptr + h, mask=mask, other=0.0).to(tl.float32)
    tl.store(dt_out_ptr + offs, x, mask=mask)
    tl.store(g_out_ptr + offs, x * a, mask=mask)


_MAMBA_DT = CachedLaunch(mamba_dt_kernel)


def fits(dt: torch.Tensor, dt_bias, A: torch.Tensor, dt_softplus: bool) -> bool:
    """Whether the kernel serves this step's dt: no softplus, (B, H) dt, contiguous (H,) A and bias."""
    return (MAMBA_DT_KERNEL and not dt_softplus and dt.dim() == 2 and A.dim() == 1 and A.is_contiguous()
            and (dt_bias is None or (dt_bias.dim() == 1 and dt_bias.is_contiguous())))


def mamba_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, A: torch.Tensor, dt_limit, key=None, clamp=None):
    """(dt_eff, g) float32 (B, H) contiguous: clamp(dt + dt_bias, *dt_limit) and dt_eff * A. ``key``: the
    step's launch key (it fixes every argument's specialization: the outputs are fresh), or None. ``clamp``:
    "select" or "max" (default MAMBA_DT_CLAMP; see there)."""
    clamp = MAMBA_DT_CLAMP if clamp is None else clamp
    if clamp not in ("select", "max"):
        raise ValueError(f"mamba_dt: clamp must be 'select' or 'max'; got {clamp!r}")
    if dispatch.backend_for(dt.device) == "reference":  # CPU tensors without the interpreter: torch's ops
        dt_eff = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
        if dt_limit[0] > float("-inf") or dt_limit[1] < float("inf"):
            dt_eff = dt_eff.clamp(dt_limit[0], dt_limit[1])
        dt_eff = dt_eff.contiguous()
        return dt_eff, dt_eff * A.float()
    B, H = dt.shape
    dt_eff = torch.empty((B, H), dtype=torch.float32, device=dt.device)
    g = torch.empty((B, H), dtype=torch.float32, device=dt.device)
    total = B * H
    if total == 0:
        return dt_eff, g
    grid, tail, options = launch_parts(dt, dt_bias, dt_limit, clamp)
    _MAMBA_DT.run(None if key is None else (key, clamp), grid,  # (the form is a constexpr)
                  (dt, A if dt_bias is None else dt_bias, A, dt_eff, g, *tail), options)
    return dt_eff, g


def launch_parts(dt: torch.Tensor, dt_bias, dt_limit, clamp: str) -> tuple[tuple, tuple, dict]:
    """(grid, the arguments after the five tensors (dt, bias or A, A, dt_eff, g), options) of the kernel's launch
    for a (B, H) dt with B H > 0: a function of dt's shape and strides, whether there is a bias, dt_limit and the
    clamp's form (what a step's launch key holds: op.py keeps them per key)."""
    B, H = dt.shape
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    return ((cdiv(B * H, BLOCK),), (B * H, H, dt.stride(0), dt.stride(1), lo, hi),
            dict(HAS_BIAS=dt_bias is not None, HAS_LO=lo > float("-inf"), HAS_HI=hi < float("inf"),
                 CLAMP_MAX=clamp == "max", BLOCK=BLOCK))

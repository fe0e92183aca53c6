"""Shared pieces of the norm tests: random inputs, one forward + backward through layer_norm, the same
through the float64 reference, and the comparisons (error as a multiple of the rounding floor)."""
from __future__ import annotations

import torch

from tilecore import accuracy, dispatch
from tilecore.ops.norm import dropout_mask, layer_norm, layer_norm_reference

# The interpreter rounds float32 to bfloat16 by truncation (tests/norm/test_norm.py checks it), which
# doubles the error of every bf16 result (and h's, which y is computed from); on a GPU and on the CPU
# path bf16 rounds to nearest, and is held to FLOOR_MULTIPLE there (test_norm_cpu.py, the GPU check).
FLOOR_MULTIPLE = {torch.float16: 1.1, torch.bfloat16: 1.1}
INTERPRETED_BF16 = 2.2  # truncation's error is uniform over an ulp: twice round-to-nearest's RMS


def interpreter_rounding(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``t`` rounded to ``dtype`` as the interpreted kernels round it: bf16 truncated."""
    if dtype == torch.bfloat16 and dispatch.interpreter_enabled():
        return (t.float().view(torch.int32) & -65536).view(torch.float32).double()
    return t.to(dtype).double()
FP32_REL = 2e-6  # float32 results: relative RMS error


def floor_multiple(dtype: torch.dtype) -> float:
    if dtype == torch.bfloat16 and dispatch.interpreter_enabled():
        return INTERPRETED_BF16
    return FLOOR_MULTIPLE[dtype]


def assert_close_to(out: torch.Tensor, ref: torch.Tensor, what: str, multiple: float = 1.0):
    """out against the float64 ``ref``: float32 within FP32_REL relative RMS, 16-bit within
    floor_multiple x ``multiple`` of the rounding floor; every element written (no NaN left)."""
    out = out.detach()
    assert out.dtype in (torch.float16, torch.bfloat16, torch.float32), what
    assert torch.isfinite(out).all(), f"{what}: non-finite elements (unwritten?)"
    if not ref.any():  # (LayerNorm of one element: y = bias, and dx = dweight = 0)
        assert not out.any(), f"{what}: not zero"
        return
    if out.dtype == torch.float32:
        err = accuracy.rel_rms(out, ref)
        assert err <= FP32_REL * multiple, f"{what}: relative RMS {err:.2e}"
    else:
        err = accuracy.error_over_floor(out, ref)
        assert err <= floor_multiple(out.dtype) * multiple, f"{what}: {err:.3f}x the rounding floor"


def assert_stored_exactly(h: torch.Tensor, ref_h: torch.Tensor, terms: torch.Tensor, what: str = "h"):
    """h (stored in its dtype) against the float64 value rounded to that dtype: within one ulp of the
    larger of h and ``terms`` (|x| / (1 - p) + |residual|: the kernels add in float32 before rounding,
    the reference in float64, and where the sum cancels to ~0 float32's error is relative to the terms)."""
    h = h.detach()
    if h.dtype == torch.float32:
        assert accuracy.rel_rms(h, ref_h) <= FP32_REL, what
        return
    eps = torch.finfo(h.dtype).eps
    tol = eps * torch.maximum(ref_h.abs(), terms) + torch.finfo(h.dtype).tiny
    assert ((h.double() - ref_h).abs() <= tol).all(), what


def make_inputs(rows, n, dtype, *, weight=True, bias=True, residual=True, res_dtype=None, param_dtype=None,
                shift=0.0):
    """x (rows, n) + shift, weight, bias, residual: fresh random values, leaves requiring grad."""
    x = (torch.randn(rows, n) + shift).to(dtype).requires_grad_()
    pdt = param_dtype or dtype
    w = (1 + 0.5 * torch.randn(n)).to(pdt).requires_grad_() if weight else None
    b = torch.randn(n).to(pdt).requires_grad_() if bias else None
    r = torch.randn(rows, n).to(res_dtype or dtype).requires_grad_() if residual else None
    return x, w, b, r


def run_and_check(x, w, b, r, *, rms=False, dropout_p=0.0, prenorm=True, eps=1e-5, seed=7, multiple=1.0):
    """layer_norm forward and backward against the float64 reference; returns (y, h, grads, keep)."""
    gen = torch.Generator(device=x.device).manual_seed(seed)
    out = layer_norm(x, w, b, residual=r, dropout_p=dropout_p, eps=eps, rms=rms, prenorm=prenorm, generator=gen)
    y, h = out if prenorm else (out, None)
    keep = None
    if dropout_p > 0:
        keep = dropout_mask(x, dropout_p, torch.Generator(device=x.device).manual_seed(seed))
    leaves = [t for t in (x, w, b, r) if t is not None]
    dy = torch.randn(y.shape).to(y.dtype)
    loss = (y.float() * dy.float()).sum()
    dh = None
    if h is not None:
        dh = torch.randn(h.shape).to(h.dtype)
        loss = loss + (h.float() * dh.float()).sum()
    grads = torch.autograd.grad(loss, leaves)

    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    rx, rw, rb, rr = [next(it) if t is not None else None for t in (x, w, b, r)]
    h_dtype = r.dtype if r is not None else x.dtype
    ref_y, ref_h = layer_norm_reference(rx, rw, rb, residual=rr, keep=keep, dropout_p=dropout_p, eps=eps, rms=rms,
                                        h_dtype=h_dtype, rounding=interpreter_rounding)
    ref_loss = (ref_y * dy.double()).sum()
    if dh is not None:
        ref_loss = ref_loss + (ref_h * dh.double()).sum()
    ref_grads = torch.autograd.grad(ref_loss, ref_leaves)

    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close_to(y, ref_y, "y", multiple)
    if h is not None:
        assert h.dtype == h_dtype and h.shape == x.shape
        terms = rx.detach().abs() / (1 - dropout_p) + (rr.detach().abs() if rr is not None else 0)
        assert_stored_exactly(h, ref_h, terms)
    names = [name for name, t in zip(("dx", "dweight", "dbias", "dresidual"), (x, w, b, r)) if t is not None]
    for name, g, ref_g, leaf in zip(names, grads, ref_grads, leaves):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape, name
        # h is x itself there: autograd adds the two gradients of x in x's dtype, one more rounding
        twice = name == "dx" and h is not None and r is None and dropout_p == 0
        assert_close_to(g, ref_g, name, multiple * (1.5 if twice else 1.0))
    return y, h, grads, keep

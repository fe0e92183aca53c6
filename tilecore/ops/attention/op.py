"""``tilecore.attention``: the public function, its checks, and its custom-op registration
(forward and backward are two ``torch.library`` custom ops; the forward's autograd calls the
backward op, so torch.compile traces both)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.attention import launch
from tilecore.ops.attention.plan import plan_backward, plan_forward

DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check(q, k, v, causal, scale) -> None:
    """Raise TypeError/ValueError naming what is accepted."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: q, k and v must be 4-D, (batch, heads, sequence, head_dim); "
                             f"got {name} of shape {tuple(t.shape)}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"attention: q, k and v must share one dtype among "
                        f"{', '.join(map(_name, DTYPES))}; got {_name(q.dtype)}, {_name(k.dtype)}, {_name(v.dtype)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    dispatch.backend_for(q.device)  # raises for devices tilecore does not run on
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape (batch, kv_heads, kv_sequence, "
                         f"head_dim); got k {tuple(k.shape)} and v {tuple(v.shape)}")
    B, Hq, _, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention: k and v must have q's batch ({B}) and head_dim ({D}); "
                         f"got k of shape {tuple(k.shape)}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"attention: head_dim must be from 1 to {MAX_HEAD_DIM}; got {D}")
    Hkv = k.shape[1]
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"attention: q's heads ({Hq}) must be a multiple of k's and v's heads ({Hkv}) "
                         f"(grouped-query attention)")
    if not isinstance(causal, bool):
        raise TypeError(f"attention: causal must be True or False, got {causal!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"attention: scale must be None or a finite real number, got {scale!r}")


# --------------------------------------------------------------------------------------------
# implementations: a plan (plan.py: kernels or the reference, by device and inputs), launched


def _forward_impl(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, N, D = q.shape
    out = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    launch.forward(plan_forward(q, k, v, causal, scale), q, k, v, out, lse, causal, scale)
    return out, lse


def _backward_impl(dout, q, k, v, out, lse, dlse, causal: bool, scale: float):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if dq.numel() == 0 or dk.numel() == 0:  # no query or no key: nothing flows back
        return dq.zero_(), dk.zero_(), dv.zero_()
    launch.backward(plan_backward(dout, q, k, v, causal, scale), dout, q, k, v, out, lse, dlse, dq, dk, dv, causal,
                    scale)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# custom ops and autograd


@torch.library.custom_op("tilecore::attention_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, causal, scale)


@_forward_op.register_fake
def _(q, k, v, causal, scale):
    B, H, N, D = q.shape
    return q.new_empty((B, H, N, D)), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("tilecore::attention_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, dlse, causal, scale)


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    if dlse is not None:  # the kernels index it as a contiguous float32 (B, Hq, N) array
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv = _backward_op(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, return_lse: bool = False):
    """softmax(scale q k^T) v, FlashAttention-style (never materializes the N x Nk scores).

    q: (B, Hq, N, D); k, v: (B, Hkv, Nk, D) with Hq a multiple of Hkv (q head h uses kv head
    h // (Hq // Hkv): multi-, grouped- and multi-query attention); float16 or bfloat16; any N, Nk;
    D from 1 to 256 (64 and 128 are the fast ones). ``scale`` defaults to D ** -0.5. ``causal``
    masks query i to keys j <= i + Nk - N (aligned to the bottom right, as FlashAttention does); a
    row with no key to attend to gives 0. Returns O (q's shape and dtype) and, with
    ``return_lse=True``, also the row log-sum-exp of the scaled scores (float32, (B, Hq, N), natural
    log, -inf for rows with no key). Differentiable in q, k, v (and through lse).
    """
    check(q, k, v, causal, scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if dispatch.plain_eager(q, k, v):
        out, lse = _forward_impl(q, k, v, causal, scale)
    else:
        out, lse = _forward_op(q, k, v, causal, scale)
    return (out, lse) if return_lse else out

"""``attention(..., rotary=(cos, sin))``: rotary embedding applied to Q and K inside attention, its
checks and its custom ops (attention.op's ``attention`` routes here; plan.rotary_path picks the path).

Positions: key j of Nk sits at position j and query i of N at i + Nk - N (the bottom-right
alignment causal uses: a prefill chunk, or the last N tokens of a KV cache), so cos and sin (flash-
attn's (max_seqlen, rotary_dim / 2), as ``apply_rotary`` takes them) need at least Nk rows and
N <= Nk. Every kv head turns the same (GQA, MQA). Features past rotary_dim pass through.

Custom ops (cos and sin tensor arguments; fake implementations, so torch.compile(fullgraph=True)
traces them), by plan.rotary_path:

* "tl": ``tilecore::attention_rotary_forward`` / ``_backward`` run the tl kernels with Q and K turned
  as they are loaded, dQ and dK turned back before they are stored;
* "gluon" (configs.ROTARY_IN_KERNEL_CASES, calls that record no gradient): the same ops run
  gluon_forward.forward (K by apply_rotary's pass, Q turned inside the Gluon kernel; a case it does not take,
  plan.RotaryNotTaken, runs the turned path's math; should a backward
  come after all, it turns q and k again and runs the turned path's backward);
* "turned" (CUDA tensors the Gluon forward serves, and head dims past 256):
  ``tilecore::attention_rotary_turned_forward`` turns q and k by apply_rotary's kernel into contiguous
  (B, H, N, D) tensors, runs the shipped forward on them and returns them beside O and lse (autograd
  keeps them: the backward turns nothing again), or, in the cases configs.ROTARY_TRAIN_IN_KERNEL_CASES
  names, gets all four from gluon_forward.forward (K by the pass, Q turned in the kernel and stored
  from there: the same bits); ``_turned_backward`` runs the shipped backward and
  turns dQ and dK back, dQ as the conversion of the Gluon kernel's float32 dQ sum to q's dtype where
  the kernel adds dQ (the pass that copy would be anyway);
* "composite" (CPU tensors without the interpreter): attention.op's apply_rotary then attention, in Python
  (torch's CPU kernels; autograd turns the gradients back through apply_rotary's backward).
"""
from __future__ import annotations

from typing import Optional

import torch

from tilecore.ops.attention import launch
from tilecore.ops.attention.plan import plan_backward, plan_forward
from tilecore.ops.attention_rotary.launch import rotary_gradients, rotary_outputs
from tilecore.ops.attention_rotary.plan import RotaryNotTaken, gluon_rotary_forward, rotary_path, rotary_train_in_kernel
from tilecore.ops.rotary.op import turn

TABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_rotary(q, k, rotary, interleaved) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of ``rotary`` for q (B, Hq, N, D) and k (B, Hkv, Nk, D), or TypeError/ValueError
    naming what is accepted (q, k and v already checked by op.check)."""
    accepted = ("rotary must be a pair (cos, sin) of tensors of shape (max_seqlen, rotary_dim / 2), as "
                "tilecore.apply_rotary takes them")
    if not isinstance(rotary, (tuple, list)) or len(rotary) != 2:
        raise TypeError(f"attention: {accepted}; got {type(rotary).__name__}")
    cos, sin = rotary
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {accepted}; got {name} of type {type(t).__name__}")
        if t.dim() != 2 or t.shape[1] < 1:
            raise ValueError(f"attention: {accepted} (rotary_dim >= 2); got {name} of shape {tuple(t.shape)}")
        if t.dtype not in TABLE_DTYPES:
            raise TypeError(f"attention: rotary's {name} must be float16, bfloat16 or float32; got "
                            f"{str(t.dtype).removeprefix('torch.')}")
        if t.device != q.device:
            raise ValueError(f"attention: rotary's {name} is on {t.device} and q on {q.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"attention: rotary's cos and sin must have one shape; got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"attention: rotary_interleaved must be True or False, got {interleaved!r}")
    rows, pairs = cos.shape
    D, N, Nk = q.shape[3], q.shape[2], k.shape[2]
    if 2 * pairs > D:
        raise ValueError(f"attention: rotary_dim = 2 * cos.shape[1] = {2 * pairs} exceeds q's and k's head_dim {D}")
    if N > Nk:
        raise ValueError(f"attention: rotary places query i at position i + Nk - N (bottom-right, as causal); "
                         f"it takes N <= Nk, got N = {N} queries and Nk = {Nk} keys")
    if rows < Nk:
        raise ValueError(f"attention: rotary's cos and sin hold {rows} positions, fewer than the {Nk} keys "
                         f"(key j at position j)")
    return cos, sin


def turned_qk(q, k, cos, sin, interleaved: bool):
    """q and k turned by apply_rotary (differentiable: its backward turns the gradients back), in
    their (B, H, N, D) shapes (views of (B, N, H, D) tensors)."""
    from tilecore.ops.rotary import apply_rotary

    n, nk = q.shape[2], k.shape[2]
    qr = apply_rotary(q.transpose(1, 2), cos[nk - n:], sin[nk - n:], interleaved=interleaved).transpose(1, 2)
    kr = apply_rotary(k.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)
    return qr, kr


def _turn(q, k, cos, sin, interleaved: bool, conjugate: bool = False):
    """turned_qk's rotation without autograd (rotary.op.turn), or its inverse (``conjugate``), into
    contiguous (B, H, N, D) tensors."""
    n, nk = q.shape[2], k.shape[2]
    qr, kr = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    turn(q.transpose(1, 2), cos[nk - n:], sin[nk - n:], interleaved=interleaved, conjugate=conjugate,
         out=qr.transpose(1, 2))
    turn(k.transpose(1, 2), cos, sin, interleaved=interleaved, conjugate=conjugate, out=kr.transpose(1, 2))
    return qr, kr


# --------------------------------------------------------------------------------------------
# implementations


def forward_impl(q, k, v, cos, sin, causal: bool, scale: float, interleaved: bool, window, softcap: float,
                 sm_margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    window = tuple(window)
    if q.numel() == 0 or v.shape[-1] == 0:
        return q.new_empty((*q.shape[:3], v.shape[-1])), q.new_empty(q.shape[:3], dtype=torch.float32)
    path = rotary_path(q, k, v, scale, False, causal)
    if path == "gluon":
        cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
        try:
            return gluon_rotary_forward()(q, k, v, cos, sin, causal=causal, scale=scale, interleaved=interleaved,
                                          window=window, softcap=softcap, sm_margin=sm_margin)
        except RotaryNotTaken:  # a head dim or rotary_dim it does not take: the turned path's math (any other error
            pass  # propagates)
    if path == "tl":
        plan = plan_forward(q, k, v, causal, scale, path="tl", window=window, softcap=softcap, sm_margin=sm_margin)
        return rotary_outputs(plan, q, k, v, cos, sin, interleaved, causal, scale, window, softcap)
    qr, kr = _turn(q, k, cos, sin, interleaved)
    plan = plan_forward(qr, kr, v, causal, scale, window=window, softcap=softcap, sm_margin=sm_margin)
    return launch.outputs(plan, qr, kr, v, causal, scale, window, softcap)


def backward_impl(dout, q, k, v, cos, sin, out, lse, dlse, causal: bool, scale: float, interleaved: bool, window,
                  softcap: float, sm_margin: int):
    window = tuple(window)
    if q.numel() == 0 or k.numel() == 0:
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if rotary_path(q, k, v, scale) == "tl":
        plan = plan_backward(dout, q, k, v, causal, scale, path="tl", window=window, softcap=softcap,
                             sm_margin=sm_margin)
        return rotary_gradients(plan, dout, q, k, v, cos, sin, interleaved, out, lse, dlse, causal, scale,
                                       window, softcap)
    # the turned path's backward on q and k turned again (the in-kernel forward kept no turned copy)
    qr, kr = _turn(q, k, cos, sin, interleaved)
    return turned_backward_impl(dout, qr, kr, v, cos, sin, out, lse, dlse, causal, scale, interleaved, window,
                                softcap, sm_margin)


def turned_forward_impl(q, k, v, cos, sin, causal: bool, scale: float, interleaved: bool, window, softcap: float,
                        sm_margin: int):
    """(O, lse, turned q, turned k): q and k turned (contiguous (B, H, N, D)), then the shipped forward; or, where
    plan.rotary_train_in_kernel says, gluon_forward.forward (K by a pass, Q turned in the kernel and stored from
    there: the same bits), the turned path's math for a case it does not take."""
    window = tuple(window)
    if q.numel() and v.shape[-1] and rotary_train_in_kernel(q, k, v, scale, causal):
        cos_, sin_ = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
        try:
            return gluon_rotary_forward()(q, k, v, cos_, sin_, causal=causal, scale=scale, interleaved=interleaved,
                                          window=window, softcap=softcap, sm_margin=sm_margin, keep_turned=True)
        except RotaryNotTaken:  # as forward_impl's
            pass
    qr, kr = _turn(q, k, cos, sin, interleaved)
    if q.numel() == 0 or v.shape[-1] == 0:
        out, lse = q.new_empty((*q.shape[:3], v.shape[-1])), q.new_empty(q.shape[:3], dtype=torch.float32)
        return out, lse, qr, kr
    plan = plan_forward(qr, kr, v, causal, scale, window=window, softcap=softcap, sm_margin=sm_margin)
    out, lse = launch.outputs(plan, qr, kr, v, causal, scale, window, softcap)
    return out, lse, qr, kr


def turned_backward_impl(dout, qr, kr, v, cos, sin, out, lse, dlse, causal: bool, scale: float, interleaved: bool,
                         window, softcap: float, sm_margin: int):
    """(dq, dk, dv) from the turned q and k: the shipped backward on them, dQ and dK turned back (R(-theta));
    where the Gluon kernel adds dQ into a float32 sum, the turn back is that sum's conversion to q's dtype."""
    window = tuple(window)
    dq, dk = torch.empty(qr.shape, dtype=qr.dtype, device=qr.device), torch.empty(kr.shape, dtype=kr.dtype,
                                                                                    device=kr.device)
    if qr.numel() == 0 or kr.numel() == 0:
        return dq.zero_(), dk.zero_(), torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    plan = plan_backward(dout, qr, kr, v, causal, scale, window=window, softcap=softcap, sm_margin=sm_margin)
    if plan.path == "gluon" and plan.dq is None and plan.operand_dtype is None:
        dkr, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (kr, v))
        dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
        _, dqr, stats = launch.backward_preprocess(out, dout, lse.contiguous(), dlse, dq_sum=True, row_stats=True,
                                                   plan=plan)
        launch.launch_backward_gluon_kernel(plan, dout, qr, kr, v, stats, dqr, dkr, dv, causal, scale, window,
                                            softcap)
    else:
        dqr, dkr, dv = launch.gradients(plan, dout, qr, kr, v, out, lse, dlse, causal, scale, window, softcap)
    n, nk = qr.shape[2], kr.shape[2]
    turn(dqr.transpose(1, 2), cos[nk - n:], sin[nk - n:], interleaved=interleaved, conjugate=True,
         out=dq.transpose(1, 2))
    turn(dkr.transpose(1, 2), cos, sin, interleaved=interleaved, conjugate=True, out=dk.transpose(1, 2))
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# custom ops and autograd


@torch.library.custom_op("tilecore::attention_rotary_forward", mutates_args=())
def forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, causal: bool,
               scale: float, interleaved: bool, window_left: int, window_right: int, softcap: float,
               sm_margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    return forward_impl(q, k, v, cos, sin, causal, scale, interleaved, (window_left, window_right), softcap,
                        sm_margin)


@forward_op.register_fake
def _(q, k, v, cos, sin, causal, scale, interleaved, window_left, window_right, softcap, sm_margin):
    B, H, N, _ = q.shape
    return q.new_empty((B, H, N, v.shape[-1])), q.new_empty((B, H, N), dtype=torch.float32)


def _gradients_op(name: str, impl):
    """The custom op ``tilecore::<name>``: (dq, dk, dv) by ``impl`` (backward_impl, or turned_backward_impl on the
    turned q and k), with its fake implementation."""
    @torch.library.custom_op(f"tilecore::{name}", mutates_args=())
    def gradients(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
                  scale: float, interleaved: bool, window_left: int, window_right: int, softcap: float,
                  sm_margin: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return impl(dout, q, k, v, cos, sin, out, lse, dlse, causal, scale, interleaved, (window_left, window_right),
                    softcap, sm_margin)

    @gradients.register_fake
    def _(dout, q, k, v, cos, sin, out, lse, dlse, causal, scale, interleaved, window_left, window_right, softcap,
          sm_margin):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    return gradients


backward_op = _gradients_op("attention_rotary_backward", backward_impl)


def _setup_context(ctx, inputs, output):
    q, k, v, cos, sin, causal, scale, interleaved, window_left, window_right, softcap, sm_margin = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, cos, sin, out, lse)
    ctx.options = (causal, scale, interleaved, window_left, window_right, softcap, sm_margin)


def _backward(ctx, dout, dlse):
    q, k, v, cos, sin, out, lse = ctx.saved_tensors
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    if dlse is not None:  # the kernels index it as a contiguous float32 (B, Hq, N) array
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv = backward_op(dout, q, k, v, cos, sin, out, lse, dlse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None  # cos and sin: no gradient


forward_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("tilecore::attention_rotary_turned_forward", mutates_args=())
def turned_forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      causal: bool, scale: float, interleaved: bool, window_left: int, window_right: int,
                      softcap: float, sm_margin: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return turned_forward_impl(q, k, v, cos, sin, causal, scale, interleaved, (window_left, window_right), softcap,
                               sm_margin)


@turned_forward_op.register_fake
def _(q, k, v, cos, sin, causal, scale, interleaved, window_left, window_right, softcap, sm_margin):
    B, H, N, _ = q.shape
    return (q.new_empty((B, H, N, v.shape[-1])), q.new_empty((B, H, N), dtype=torch.float32), q.new_empty(q.shape),
            k.new_empty(k.shape))


turned_backward_op = _gradients_op("attention_rotary_turned_backward", turned_backward_impl)


def _turned_setup_context(ctx, inputs, output):
    _, _, v, cos, sin, causal, scale, interleaved, window_left, window_right, softcap, sm_margin = inputs
    out, lse, qr, kr = output
    ctx.mark_non_differentiable(qr, kr)
    ctx.save_for_backward(qr, kr, v, cos, sin, out, lse)
    ctx.options = (causal, scale, interleaved, window_left, window_right, softcap, sm_margin)


def _turned_backward(ctx, dout, dlse, _dqr, _dkr):
    qr, kr, v, cos, sin, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv = turned_backward_op(dout, qr, kr, v, cos, sin, out, lse, dlse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


turned_forward_op.register_autograd(_turned_backward, setup_context=_turned_setup_context)

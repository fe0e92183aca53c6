"""``tilecore.attention``: the public function, its checks, and its custom-op registration
(forward and backward are two ``torch.library`` custom ops; the forward's autograd calls the
backward op, so torch.compile traces both)."""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import replace
from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, launch
from tilecore.ops.attention.plan import plan_backward, plan_forward, sm_margin_value
from tilecore.ops.attention_decode.launch import prepared as decode_prepared
from tilecore.ops.attention_rotary import op as rotary_op
from tilecore.tiles.eager import apply as eager_apply  # Function.apply without torch's Python wrapper
from tilecore.tiles.launch import LRU, SignatureMemo, signature
from tilecore.tiles.switches import generation

DTYPES = (torch.float16, torch.bfloat16)  # everywhere
CPU_DTYPES = DTYPES + (torch.float32,)  # CPU tensors (torch's CPU kernels, or the tl kernels interpreted)
MAX_HEAD_DIM = 576  # MLA decode's q/k (512 latent + 64 rope); 64 and 128 are the fast ones, past 256 untimed
LAYOUT = ("attention takes q as (batch, heads, queries, head_dim) and k, v as (batch, kv_heads, keys, "
          "head_dim) (v's head_dim may differ from q's and k's); flash-attn's (batch, seqlen, heads, head_dim) "
          "tensors go in as .transpose(1, 2)")
NO_WINDOW = (-1, -1)
SUSPECT_HEADS = 256  # more "heads" than this, and more than queries: likely flash-attn's layout

# each keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_FORWARD_KEY = SignatureMemo(globals())
_BACKWARD_KEY = SignatureMemo(globals())
_ADDING_DQ_KEY = SignatureMemo(globals())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _compiled(device: torch.device) -> bool:
    """Whether compiled GPU kernels serve tensors on ``device`` (not the CPU, interpreted or not)."""
    return dispatch.backend_for(device) == "kernel" and not dispatch.interpreted(device)


def scale_value(scale) -> float:
    """``scale`` as a Python float: a real number (Python's, numpy's) or a one-element real tensor
    (0-d or not; read once, on the host), finite; bools refused."""
    if isinstance(scale, torch.Tensor) and scale.numel() == 1 and (scale.dtype.is_floating_point or (
            not scale.dtype.is_complex and scale.dtype != torch.bool)):
        value = float(scale.item())
    elif isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        value = float(scale)
    else:
        raise TypeError(f"attention: scale must be None or a finite real number (a Python or numpy number, "
                        f"or a one-element tensor), got {scale!r}")
    if not math.isfinite(value):
        raise ValueError(f"attention: scale must be None or a finite real number, got {scale!r}")
    return value


def window_value(window_size) -> tuple[int, int]:
    """``window_size`` as (left, right) Python ints, each -1 (unbounded) or >= 0; refuses anything else."""
    accepted = ("window_size must be a pair (left, right) of ints, each -1 (no bound on that side) or >= 0 "
                "(flash-attn's: query i at key position i + Nk - N sees keys from i' - left to i' + right)")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"attention: {accepted}; got {window_size!r}")
    for w in window_size:
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"attention: {accepted}; got {window_size!r}")
        if w < -1:
            raise ValueError(f"attention: {accepted}; got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def softcap_value(softcap) -> float:
    """``softcap`` as a Python float: a finite real number >= 0 (0: off)."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"attention: softcap must be a finite real number >= 0 (0: off), got {softcap!r}")
    value = float(softcap)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"attention: softcap must be a finite real number >= 0 (0: off), got {softcap!r}")
    return value


def check(q, k, v, causal, scale, window_size=NO_WINDOW, softcap=0.0, sm_margin=0) -> None:
    """Raise TypeError/ValueError naming what is accepted (shape errors say the layout, LAYOUT)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: q, k and v must be 4-D; got {name} of shape {tuple(t.shape)} ({LAYOUT})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    dispatch.backend_for(q.device)  # raises for devices tilecore does not run on
    dtypes = DTYPES if _compiled(q.device) else CPU_DTYPES
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        where = " on the GPU (float32 is taken on the CPU)" if _compiled(q.device) else ""
        raise TypeError(f"attention: q, k and v must share one dtype among {', '.join(map(_name, dtypes))}"
                        f"{where}; got {_name(q.dtype)}, {_name(k.dtype)}, {_name(v.dtype)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"attention: k and v must have the same (batch, kv_heads, keys); got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)} ({LAYOUT})")
    B, Hq, _, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention: k must have q's batch ({B}) and head_dim ({D}); "
                         f"got k of shape {tuple(k.shape)} and q of shape {tuple(q.shape)} ({LAYOUT})")
    for name, d in (("q's and k's", D), ("v's", v.shape[3])):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"attention: {name} head_dim (the last dimension) must be from 1 to {MAX_HEAD_DIM}; "
                             f"got {d} ({LAYOUT})")
    Hkv = k.shape[1]
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"attention: q's heads ({Hq}) must be a multiple of k's and v's heads ({Hkv}) "
                         f"(grouped-query attention); got q {tuple(q.shape)}, k {tuple(k.shape)} ({LAYOUT})")
    if not isinstance(causal, bool):
        raise TypeError(f"attention: causal must be True or False, got {causal!r}")
    if scale is not None:
        scale_value(scale)
    window_value(window_size)
    softcap_value(softcap)
    sm_margin_value(sm_margin, q.device)
    if Hq > SUSPECT_HEADS and Hq > q.shape[2]:
        warnings.warn(f"attention: q of shape {tuple(q.shape)} has {Hq} heads of {q.shape[2]} queries each: "
                      f"is it (batch, seqlen, heads, head_dim)? {LAYOUT}", stacklevel=3)


# --------------------------------------------------------------------------------------------
# implementations: a plan (plan.py: kernels or the reference, by device and inputs), launched


def _forward_impl(q, k, v, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0,
                  key: tuple | None = None, sm_margin: int = 0, plan=None,
                  want_lse: bool = True, recording: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``key``: the call's signature (tiles.launch.signature, sm_margin in it), for the plan cache; ``plan``: the
    plan cached for it, where the caller looked it up already (a plan is cached only for inputs with elements).
    Without ``want_lse`` lse may come back None (a keyed decode call's recipe then keeps it in its buffer)."""
    if plan is not None:
        if plan.path == "decode" and plan.operand_dtype is None:  # the key's decode recipe, run from here
            recipe = decode_prepared(plan, q, k, v, causal, window, softcap)
            if recipe:
                return recipe.outputs(q, k, v, scale, softcap, want_lse)
        elif plan.path == "gluon":  # the key's Gluon forward as its first call with a cached plan kept it
            recipe = launch.gluon_prepared(plan, q, k, v, causal, window, softcap)
            if recipe:
                return recipe.outputs(q, k, v, scale, softcap)
        return launch.outputs(plan, q, k, v, causal, scale, window, softcap)
    window = tuple(window)
    if q.numel() == 0 or v.shape[-1] == 0:
        return q.new_empty((*q.shape[:3], v.shape[-1])), q.new_empty(q.shape[:3], dtype=torch.float32)
    plan = _cached(key, lambda: plan_forward(q, k, v, causal, scale, window=window, softcap=softcap,
                                             sm_margin=sm_margin, recording=recording))
    return launch.outputs(plan, q, k, v, causal, scale, window, softcap)


def _backward_impl(dout, q, k, v, out, lse, dlse, causal: bool, scale: float, window=NO_WINDOW,
                   softcap: float = 0.0, cache: bool = False, sm_margin: int = 0):
    """``cache``: plan through the plan cache (eager calls)."""
    window = tuple(window)
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: nothing flows back
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    key = (_BACKWARD_KEY("backward", dout, q, k, v, out, lse, dlse, causal, scale > 0, *window, softcap > 0, sm_margin,
                         generation()) if cache else None)
    plan = _cached(key, lambda: plan_backward(dout, q, k, v, causal, scale, window=window, softcap=softcap,
                                              sm_margin=sm_margin))
    return launch.gradients(plan, dout, q, k, v, out, lse, dlse, causal, scale, window, softcap)


def backward_adding_dq(dout, q, k, v, out, lse, dlse, dq_sum, causal: bool, scale: float,
                       sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) of attention's backward, with dQ added to ``dq_sum`` (float32, q's shape, any
    strides: rows of a larger accumulator) instead of returned (launch.gradients_adding_dq: the
    Gluon kernel's dQ reductions land in it directly). For sums of blocks' gradients, as
    tilecore.distributed's ring makes, inside its own custom op (eager; no autograd, no custom op
    here). No window or softcap."""
    if q.numel() == 0 or k.numel() == 0:
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (k, v))
    key = _ADDING_DQ_KEY("backward", dout, q, k, v, out, lse, dlse, causal, scale > 0, *NO_WINDOW, False, sm_margin,
                         generation())
    plan = _cached(key, lambda: plan_backward(dout, q, k, v, causal, scale, sm_margin=sm_margin))
    return launch.gradients_adding_dq(plan, dout, q, k, v, out, lse, dlse, dq_sum, causal, scale)


# a CUDA call's signature -> its plan, which launches by it (Plan.launch_key): plans depend on the
# inputs' shapes, strides, dtypes, device and alignment, causal, the sign of scale, the window (its
# values: ints the kernels take, which Triton specializes), whether there is a softcap and sm_margin
# (the persistent grids' size), and the switches (configs) under which it was planned: tiles.switches.generation,
# which moves as a probe's patched block enters and leaves
_PLANS = LRU(256)


def _gluon_ok(q) -> bool:
    """dispatch.gluon_ok(q.device), kept per CUDA device index (its answer is the device's capability and the
    installed triton's: fixed in a process; ~1 us of host time a call asked); asked each call for CPU and meta
    tensors (meta: the GPU that dispatch.pretend describes, which may change)."""
    index = q.get_device()
    if index < 0:
        return dispatch.gluon_ok(q.device)
    ok = _GLUON_OK.get(index)
    if ok is None:
        ok = _GLUON_OK[index] = dispatch.gluon_ok(q.device)
    return ok


_GLUON_OK: dict = {}  # a CUDA device's index -> dispatch.gluon_ok of it


def _cached(key: tuple | None, make):
    if key is None:
        return make()
    plan = _PLANS.get(key)
    if plan is None:
        plan = make()
        plan = replace(plan, launch_key=key, dq=None if plan.dq is None else replace(plan.dq, launch_key=key))
        _PLANS.put(key, plan)
    return plan


# --------------------------------------------------------------------------------------------
# custom ops and autograd


@torch.library.custom_op("tilecore::attention_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, causal, scale, (window_left, window_right), softcap, sm_margin=sm_margin)


@_forward_op.register_fake
def _(q, k, v, causal, scale, window_left=-1, window_right=-1, softcap=0.0, sm_margin=0):
    B, H, N, _ = q.shape
    return q.new_empty((B, H, N, v.shape[-1])), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("tilecore::attention_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool, scale: float,
                 window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                 sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, dlse, causal, scale, (window_left, window_right), softcap,
                          sm_margin=sm_margin)


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, causal, scale, window_left=-1, window_right=-1, softcap=0.0, sm_margin=0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, window_left, window_right, softcap, sm_margin = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.window, ctx.softcap = causal, scale, (window_left, window_right), softcap
    ctx.sm_margin = sm_margin


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    if dlse is not None:  # the kernels index it as a contiguous float32 (B, Hq, N) array
        dlse = dlse.to(torch.float32).contiguous()
    dq, dk, dv = _backward_op(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale, *ctx.window, ctx.softcap,
                              ctx.sm_margin)
    return dq, dk, dv, None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


class _AttentionFunction(torch.autograd.Function):
    """Eager calls that record a gradient (dispatch.eager_mode's "autograd"): the custom ops'
    autograd without their host time (and without the first custom-op call's torch._dynamo import)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, window, softcap, key, sm_margin, plan=None):
        out, lse = _forward_impl(q, k, v, causal, scale, window, softcap, key, sm_margin, plan, recording=True)
        ctx.set_materialize_grads(False)  # an unused output's gradient None, not zeros (no dlse pass)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, scale, window, softcap, sm_margin)  # (one attribute: issue 31's host time)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, window, softcap, sm_margin = ctx.options
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is not None:
            dlse = dlse.to(torch.float32).contiguous()
        if torch.is_grad_enabled():  # create_graph: the custom op, as the op path records it
            dq, dk, dv = _backward_op(dout, q, k, v, out, lse, dlse, causal, scale, *window, softcap, sm_margin)
        else:
            dq, dk, dv = _backward_impl(dout, q, k, v, out, lse, dlse, causal, scale, window, softcap, cache=True,
                                        sm_margin=sm_margin)
        return dq, dk, dv, None, None, None, None, None, None, None


class _AttentionOutFunction(torch.autograd.Function):
    """_AttentionFunction for a call that returns O alone (issue 31's host time): lse is saved for the
    backward but not an output, so autograd wraps one output instead of two; the same backward (no lse gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, window, softcap, key, sm_margin, plan=None):
        out, lse = _forward_impl(q, k, v, causal, scale, window, softcap, key, sm_margin, plan, recording=True)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, scale, window, softcap, sm_margin)
        return out

    @staticmethod
    def backward(ctx, dout):
        return _AttentionFunction.backward(ctx, dout, None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, return_lse: bool = False, window_size: tuple[int, int] = NO_WINDOW,
              softcap: float = 0.0, precision: str | None = None, rotate: bool = True, sm_margin: int = 0,
              rotary: tuple[torch.Tensor, torch.Tensor] | None = None, rotary_interleaved: bool = False):
    """softmax(scale q k^T) v, FlashAttention-style (never materializes the N x Nk scores).

    Layout (B, H, N, D), as SDPA's: q (batch, heads, queries, head_dim); k (batch, kv_heads, keys,
    head_dim) and v (batch, kv_heads, keys, head_dim_v) with Hq a multiple of Hkv (q head h uses kv
    head h // (Hq // Hkv): multi-, grouped- and multi-query attention). flash-attn's (batch,
    seqlen, heads, head_dim) tensors go in as ``x.transpose(1, 2)`` (a view; any strides are taken).
    float16 or bfloat16, and float32 on the CPU; any N, Nk; D and Dv from 1 to 576, each its own
    (MLA: 192 / 128 prefill, 576 / 512 decode; 64 and 128 with D = Dv are the fast ones).
    ``scale`` defaults to D ** -0.5. ``causal`` masks query i to keys j <= i + Nk - N (aligned to
    the bottom right, as FlashAttention does; SDPA's is_causal aligns to the top left when N != Nk);
    a row with no key to attend to gives 0. ``window_size = (left, right)`` (flash-attn's sliding
    window): query i, at key position i' = i + Nk - N, attends keys i' - left <= j <= i' + right;
    -1 leaves that side unbounded; causal=True is the window (left, 0). ``softcap`` > 0 replaces
    each scaled score s by softcap * tanh(s / softcap) before the softmax (Gemma 2; 0: off; the
    gradient goes through tanh). Returns O ((B, Hq, N, Dv), q's dtype) and, with
    ``return_lse=True``, also the row log-sum-exp of the scaled (capped) scores (float32, (B, Hq,
    N), natural log, -inf for rows with no key). Differentiable in q, k, v (and through lse).

    NaN and inf propagate as in SDPA's math: a row with a NaN or +inf score (a NaN or inf in its
    query, or a score past float32's range) gives NaN outputs and lse NaN, the other rows are
    untouched; a row whose every score is -inf is a row with no key.

    CUDA tensors run the Triton/Gluon kernels; CPU tensors run torch's own CPU attention kernel
    (SDPA's; float32 math where a score may not be finite), or the Triton kernels through Triton's
    interpreter under TRITON_INTERPRET=1 (bfloat16 on its exact float32 upcast there).

    ``precision="fp8"`` (forward only, inference): q and k rotated by one random-sign Hadamard
    transform (the same for both, so q k^T is unchanged; ``rotate=False``: not rotated), q, k, v
    quantized to e4m3, then FP8 attention (``tilecore.attention_fp8_rotated``; FlashAttention-3's
    FP8 path with incoherent processing); O in q's dtype. ``None`` (default) computes in q's dtype.

    ``sm_margin`` (FlashAttention-3's; default 0): SMs the persistent kernels (the Hopper forward,
    backward and dQ kernels) leave free, forward and backward, for work on other streams beside them
    (tilecore.distributed's ring: NCCL's transfer kernels); from 0 to the GPU's SMs - 1. The math is
    the same; kernels launched a program per tile and CPU tensors ignore it. Not with precision="fp8".

    ``rotary=(cos, sin)`` (issue 37): rotary position embedding applied to q and k first, as
    ``tilecore.apply_rotary(x, cos, sin, interleaved=rotary_interleaved)`` would (cos, sin:
    (max_seqlen, rotary_dim / 2), float16, bfloat16 or float32, q's device; rotary_dim <= D, the features past it
    pass through; pairs (i, i + rotary_dim / 2), or (2i, 2i + 1) with ``rotary_interleaved``), key j
    at position j and query i at i + Nk - N (the alignment causal uses), so cos and sin need Nk rows
    and N <= Nk. Every kv head turns the same. Gradients for q, k, v (cos and sin get none, as
    apply_rotary's). With every option above; with precision="fp8" q and k are turned first, then
    the FP8 path. Where it runs (attention_rotary.plan.rotary_path): inside the tl kernels (Q and K turned as they are
    loaded, dQ and dK turned back before they are stored: the interpreter, GPUs other than Hopper); on
    Hopper q and k turned by apply_rotary's kernel, then the Gluon kernels, dQ and dK turned back;
    CPU tensors without the interpreter: apply_rotary, then the CPU path (attention_rotary.op's docstring).
    """
    if rotary is not None:
        return _rotary(q, k, v, rotary, rotary_interleaved, causal, scale, return_lse, window_size, softcap,
                       precision, rotate, sm_margin)
    if precision is not None:
        if sm_margin != 0:
            raise ValueError(f"attention: precision='fp8' takes no sm_margin (its kernel takes every SM); got "
                             f"sm_margin={sm_margin!r}")
        return _fp8(q, k, v, causal, scale, return_lse, window_size, softcap, precision, rotate)
    mode = dispatch.eager_mode(q, k, v)
    # (the defaults and plain floats without the general checks' isinstance calls: issue 31's host time)
    window = NO_WINDOW if window_size is NO_WINDOW else window_value(window_size)
    if type(softcap) is not float or not 0.0 <= softcap < math.inf:
        softcap = softcap_value(softcap)
    if scale is None:
        positive = True
    else:
        scale = scale if type(scale) is float and math.isfinite(scale) else scale_value(scale)
        positive = scale > 0
    # a CUDA call whose signature passed the checks before is planned already (the plan cache)
    # (with configs.ONE_LAUNCH_WHEN_RECORDING a call recording a gradient is planned apart where the Gluon forward
    # runs: another plan may serve it; elsewhere it shares the plain call's plan and kept launches)
    tag = ("forward_recorded" if mode == "autograd" and configs.ONE_LAUNCH_WHEN_RECORDING and _gluon_ok(q)
           else "forward")
    key = None if mode == "op" else _FORWARD_KEY(tag, q, k, v, causal, positive, *window, softcap > 0, sm_margin,
                                                 generation())
    plan = None if key is None else _PLANS.get(key)
    if plan is None:
        check(q, k, v, causal, scale, window, softcap, sm_margin)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    sm_margin = int(sm_margin)
    if mode == "direct":
        out, lse = _forward_impl(q, k, v, causal, scale, window, softcap, key, sm_margin, plan, return_lse)
    elif mode == "autograd":
        if not return_lse:  # (lse saved for the backward, not returned: one output for autograd to wrap)
            return eager_apply(_AttentionOutFunction, q, k, v, causal, scale, window, softcap, key, sm_margin, plan)
        out, lse = eager_apply(_AttentionFunction, q, k, v, causal, scale, window, softcap, key, sm_margin, plan)
    else:
        out, lse = _forward_op(q, k, v, causal, scale, *window, softcap, sm_margin)
    return (out, lse) if return_lse else out


def _rotary(q, k, v, rotary, interleaved, causal, scale, return_lse, window_size, softcap, precision, rotate,
            sm_margin):
    """attention(..., rotary=(cos, sin)): the checks, then the path attention_rotary.plan.rotary_path names: "composite"
    (and precision="fp8": apply_rotary on q and k, then attention itself: autograd turns dQ and dK back
    through apply_rotary), "turned" (attention_rotary.op's turned ops: q and k turned and kept for the backward),
    else attention_rotary.op's ops whose kernels turn Q and K themselves ("tl", "gluon")."""
    check(q, k, v, causal, scale, window_size, softcap, sm_margin)
    cos, sin = rotary_op.check_rotary(q, k, rotary, interleaved)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    path = rotary_op.rotary_path(q, k, v, 1.0 if scale is None else scale_value(scale), grad, causal)
    if precision is not None or path == "composite":
        qr, kr = rotary_op.turned_qk(q, k, cos, sin, interleaved)
        return attention(qr, kr, v, causal=causal, scale=scale, return_lse=return_lse, window_size=window_size,
                         softcap=softcap, precision=precision, rotate=rotate, sm_margin=sm_margin)
    scale = q.shape[-1] ** -0.5 if scale is None else scale_value(scale)
    options = (causal, scale, interleaved, *window_value(window_size), softcap_value(softcap), int(sm_margin))
    if path == "turned":
        out, lse, _, _ = rotary_op.turned_forward_op(q, k, v, cos, sin, *options)
    else:
        out, lse = rotary_op.forward_op(q, k, v, cos, sin, *options)
    return (out, lse) if return_lse else out


def _fp8(q, k, v, causal, scale, return_lse, window_size, softcap, precision, rotate):
    """attention(..., precision="fp8"): the FP8 convenience path, with its own errors."""
    if precision != "fp8":
        raise ValueError(f"attention: precision must be None (q's dtype) or 'fp8' (e4m3, forward only); "
                         f"got {precision!r}")
    if not isinstance(rotate, bool):
        raise TypeError(f"attention: rotate must be True or False, got {rotate!r}")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        raise RuntimeError("attention: precision='fp8' is forward-only (inference): no gradient flows through "
                           "FP8 attention; call it under torch.no_grad() or with tensors that do not require grad, "
                           "or use precision=None to train")
    if window_value(window_size) != NO_WINDOW or softcap_value(softcap) != 0.0:
        raise ValueError("attention: precision='fp8' takes neither window_size nor softcap (the FP8 kernel has "
                         "no masks but causal); use precision=None for them")
    from tilecore.ops.attention_fp8 import attention_fp8_rotated  # (imports the Hadamard ops only when used)

    return attention_fp8_rotated(q, k, v, causal=causal, scale=None if scale is None else scale_value(scale),
                                 rotate=rotate, return_lse=return_lse)

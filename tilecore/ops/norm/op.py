"""``tilecore.layer_norm``: the public function, its checks, custom ops and autograd.

The custom ops see (rows, N) matrices with unit stride along N; the public function folds x's leading
dimensions into rows and draws the dropout seed from the generator, so the ops themselves are pure
functions of their inputs (torch.compile traces them, autograd replays the same mask).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.norm import launch
from tilecore.ops.norm.plan import plan
from tilecore.tiles import eager, launch as tiles_launch
from tilecore.tiles.launch import LRU, SignatureMemo, signature
from tilecore.tiles.switches import generation

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SEED_HIGH = 2**62  # seeds are drawn from [0, 2^62)

# each keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_CALL_KEY = SignatureMemo(globals())


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _real(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or not low <= float(value) <= high:
        raise ValueError(f"layer_norm: {name} must be a real number in [{low}, {high}]; got {value!r}")
    return float(value)


def check(x, weight, bias, residual, dropout_p, eps, generator) -> tuple[float, float]:
    """Raise TypeError/ValueError naming what is accepted; return (dropout_p, eps) as floats."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"layer_norm expects x to be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"layer_norm accepts float16, bfloat16 and float32 tensors, got x of {_name(x.dtype)}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"layer_norm normalizes the last dimension of x, which must hold at least one element; "
                         f"got x of shape {tuple(x.shape)}")
    dispatch.backend_for(x.device)  # raises for devices tilecore does not run on
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.shape != (n,):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"layer_norm: {name} must be a vector of N = {n} elements (x's last dimension) or None; "
                             f"got {got}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x.shape):
        got = tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__
        raise ValueError(f"layer_norm: residual must have x's shape {tuple(x.shape)} or be None; got {got}")
    for name, t in (("weight", weight), ("bias", bias), ("residual", residual)):
        if t is None:
            continue
        if t.dtype not in DTYPES:
            raise TypeError(f"layer_norm: {name} must be float16, bfloat16 or float32; got {_name(t.dtype)}")
        if t.device != x.device:
            raise ValueError(f"layer_norm: {name} is on {t.device} and x on {x.device}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"layer_norm: generator must be a torch.Generator or None; got {type(generator).__name__}")
    return _real("dropout_p", dropout_p, 0.0, 1.0), _real("eps", eps, 0.0, math.inf)


def _rows(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """t as a (rows, n) matrix with unit stride along n (a view where its strides allow)."""
    if t is None:
        return None
    if t.dim() != 2:  # (a 2-D t is its own matrix: no view made, ~2 us of host time a call)
        t = t.reshape(-1, n)
    return t if t.stride(-1) == 1 or t.shape[0] == 0 else t.contiguous()


def draw_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """The dropout seed: a one-element int64 tensor on ``device``, drawn from ``generator`` (else the
    default generator of ``device``) without a host sync."""
    where = generator.device if generator is not None else device
    seed = torch.randint(0, SEED_HIGH, (1,), generator=generator, device=where, dtype=torch.int64)
    return seed.to(device)


# --------------------------------------------------------------------------------------------
# implementations, custom ops, autograd


def _forward_impl(x, weight, bias, residual, seed, dropout_p, eps, rms, store_h, key=None, lean=False):
    # a recorded gradient: the key's kept launches (tiles_launch.OP_RECIPES; the figure: notes/norm's decision log)
    if key is not None and not lean and tiles_launch.OP_RECIPES:
        prepared = _FORWARDS.get(key)
        if prepared:
            return prepared.outputs(x, weight, bias, residual, seed)
    h_dtype = residual.dtype if residual is not None else x.dtype
    return launch.forward(_plan(key, x.shape[0], x.shape[1], x.device), x, residual, weight, bias, seed,
                          dropout_p, eps, rms, store_h, h_dtype, key=key, lean=lean)


_PLANS = LRU(256)  # a CUDA call's launch key (its signature and the switches' generation) -> its plan


def _plan(key, rows: int, n: int, device, fused: bool = False):
    """plan(...), kept per launch key (a function of the key's shapes and device alone)."""
    return _PLANS.memo(key, lambda: plan(rows, n, device, fused=fused))


@torch.library.custom_op("tilecore::layer_norm_forward", mutates_args=())
def _forward_op(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                residual: Optional[torch.Tensor], seed: Optional[torch.Tensor], dropout_p: float, eps: float,
                rms: bool, store_h: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward_impl(x, weight, bias, residual, seed, dropout_p, eps, rms, store_h)


@_forward_op.register_fake
def _(x, weight, bias, residual, seed, dropout_p, eps, rms, store_h):
    rows = x.shape[0]
    h_dtype = residual.dtype if residual is not None else x.dtype
    return (x.new_empty(x.shape), x.new_empty(x.shape if store_h else (0,), dtype=h_dtype),
            x.new_empty((0 if rms else rows,), dtype=torch.float32), x.new_empty((rows,), dtype=torch.float32))


def _backward_impl(dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, dropout_p, rms, x_dtype, h_dtype,
                   store_dres, key=None):
    # a residual stream (h stored or recomputed) takes the fused backward's own settings (configs.FUSED_BACKWARD)
    fused = h is not None or residual is not None
    return launch.backward(_plan(key, dy.shape[0], dy.shape[1], dy.device, fused), dy, x, residual, h, weight, bias,
                           mean, rstd, seed, dh_out, dropout_p, rms, x_dtype, h_dtype, store_dres, key=key)


@torch.library.custom_op("tilecore::layer_norm_backward", mutates_args=())
def _backward_op(dy: torch.Tensor, x: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                 h: Optional[torch.Tensor], weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 mean: Optional[torch.Tensor], rstd: torch.Tensor, seed: Optional[torch.Tensor],
                 dh_out: Optional[torch.Tensor],
                 dropout_p: float, rms: bool, x_dtype: torch.dtype, h_dtype: torch.dtype,
                 store_dres: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, dropout_p, rms, x_dtype,
                          h_dtype, store_dres)


@_backward_op.register_fake
def _(dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, dropout_p, rms, x_dtype, h_dtype, store_dres):
    n = dy.shape[1]
    return (dy.new_empty(dy.shape, dtype=x_dtype), dy.new_empty(dy.shape if store_dres else (0,), dtype=h_dtype),
            dy.new_empty((n,) if weight is not None else (0,), dtype=weight.dtype if weight is not None else dy.dtype),
            dy.new_empty((n,) if bias is not None else (0,), dtype=bias.dtype if bias is not None else dy.dtype))


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, seed, dropout_p, eps, rms, store_h = inputs
    _, h, mean, rstd = output
    # h stored (prenorm): the backward reads it, and needs neither x nor the residual
    ctx.save_for_backward(None if store_h else x, weight, bias, None if store_h else residual, seed,
                          h if store_h else None, mean, rstd)
    ctx.dropout_p, ctx.rms, ctx.x_dtype, ctx.shape = dropout_p, rms, x.dtype, tuple(x.shape)
    ctx.has_residual = residual is not None
    ctx.h_dtype = residual.dtype if residual is not None else x.dtype


def _backward(ctx, dy, dh_out, _dmean, _drstd):
    x, weight, bias, residual, seed, h, mean, rstd = ctx.saved_tensors
    if dy is None:  # only the residual stream was used
        dy = torch.zeros(ctx.shape, dtype=ctx.x_dtype, device=rstd.device)
    dy = _rows(dy, ctx.shape[1])
    dh_out = None if dh_out is None or h is None else _rows(dh_out, ctx.shape[1])
    store_dres = ctx.has_residual and (seed is not None or ctx.h_dtype != ctx.x_dtype)
    args = (dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, ctx.dropout_p, ctx.rms, ctx.x_dtype,
            ctx.h_dtype, store_dres)
    dx, dres, dw, db = eager.backward_call(_backward_op, _backward_impl, *args, key=eager.backward_key(ctx, dy, dh_out))
    # without dropout and in one dtype, dresidual is dx itself (as flash-attn's layer_norm_fn returns it)
    dresidual = (dres if store_dres else dx) if ctx.has_residual else None
    return (dx, dw if weight is not None else None, db if bias is not None else None, dresidual,
            None, None, None, None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)
# eager calls that record a gradient: the same autograd without the custom op's host time
_LayerNormFunction = eager.eager_autograd("_LayerNormFunction", _forward_impl, _setup_context, _backward)


class _Recorded:
    """A key's eager call recording a gradient, after the key's first call (issue 31's host time): what the general
    path's Function (_LayerNormFunction over _forward_impl, _setup_context and _backward) reads from its arguments and
    ctx, fixed by the key and kept: the key's NormForward (its launches), the flags, x's shape and its (rows, n) form,
    and the backward's launch key for the gradient layout the backward saw last. _RecordedFunction takes x, weight,
    bias, residual and the seed as the caller gave them (no (rows, n) views: a recipe exists only where op._rows gave
    views of the same memory) and returns y (and h where it is stored) in x's shape: the same launches, so the same
    bits, as the general path."""

    __slots__ = ("forward", "key", "shape", "matrix", "dropout_p", "rms", "store_h", "has_residual", "x_dtype",
                 "h_dtype", "store_dres", "dy_layout", "backward")

    def __init__(self, forward: launch.NormForward, key, dropout_p: float, rms: bool, has_residual: bool):
        self.forward, self.key, self.dropout_p, self.rms = forward, key, dropout_p, rms
        self.store_h, self.has_residual, self.x_dtype, self.h_dtype = forward.store_h, has_residual, forward.dtype, \
            forward.h_dtype
        self.shape, self.matrix = forward.shape, (forward.rows, forward.shape[-1])
        # (as _backward: dresidual written apart where dropout or the residual's own dtype makes it differ from dx)
        self.store_dres = has_residual and (dropout_p > 0 or forward.h_dtype != forward.dtype)
        self.dy_layout = None  # (dy's (rows, n) strides, its backward launch key): the last aligned one
        self.backward = None  # (a backward launch key, its launch.NormBackward or False), made at its first backward

    def backward_key(self, dy, dh_out):
        """eager.backward_key(ctx, dy, dh_out) of the general path's ctx (launch key: this key): kept for dy's last
        strides where no dh_out comes (autograd hands dy in y's shape, dtype and device: the strides and the base's
        alignment are what the backward's signature can still vary in)."""
        if dh_out is None and type(dy) is torch.Tensor and not dy.data_ptr() & 15:
            kept = self.dy_layout
            strides = dy.stride()
            if kept is not None and kept[0] == strides:
                return kept[1]
            key = eager.backward_key(self, dy, None)
            if key is not None:
                self.dy_layout = (strides, key)
            return key
        return eager.backward_key(self, dy, dh_out)

    @property
    def launch_key(self):  # (eager.backward_key reads it from a ctx)
        return self.key


class _RecordedFunction(torch.autograd.Function):
    """_LayerNormFunction for a key with a _Recorded recipe: 6 arguments where the general Function takes 10 (and
    one more, the key), y (and a stored h) its only outputs where the general one wraps four, the statistics saved
    as what they are."""

    @staticmethod
    def forward(ctx, recorded: _Recorded, x, weight, bias, residual, seed):
        ctx.set_materialize_grads(False)
        y, h, mean, rstd = recorded.forward.outputs(x, weight, bias, residual, seed)
        store_h = recorded.store_h
        # (as _setup_context: h stored (prenorm), the backward reads it and needs neither x nor the residual)
        ctx.save_for_backward(None if store_h else x, weight, bias, None if store_h else residual, seed, h, mean, rstd)
        ctx.recorded = recorded
        return (y, h) if store_h else y

    @staticmethod
    def backward(ctx, dy, dh_out=None):
        recorded = ctx.recorded
        x, weight, bias, residual, seed, h, mean, rstd = ctx.saved_tensors
        rows, n = recorded.matrix
        if dy is None:  # only the residual stream was used
            dy = torch.zeros(recorded.matrix, dtype=recorded.x_dtype, device=rstd.device)
        dy = _rows(dy, n)
        dh_out = None if dh_out is None else _rows(dh_out, n)
        # (the general path's (rows, n) views of the saved tensors: the same memory)
        x, residual, h = _rows(x, n), _rows(residual, n), _rows(h, n)
        store_dres = recorded.store_dres
        key = recorded.backward_key(dy, dh_out)
        kept = recorded.backward
        if key is not None and dh_out is None and BACKWARD_RECIPES and tiles_launch.OP_RECIPES \
                and dispatch.eager_mode(dy, x, residual, h, weight, bias, mean, rstd, seed) == "direct":
            if kept is not None and kept[0] is key and kept[1]:  # the key's kept launches
                dx, dres, dw, db = kept[1](dy, x, residual, h, weight, bias, mean, rstd, seed)
            else:  # the general path, which makes the key's NormBackward and keeps it
                dx, dres, dw, db = _backward_impl(dy, x, residual, h, weight, bias, mean, rstd, seed, None,
                                                  recorded.dropout_p, recorded.rms, recorded.x_dtype, recorded.h_dtype,
                                                  store_dres, key=key)
                if kept is None or kept[0] is not key:  # (the launches that backward made and kept for the key)
                    recorded.backward = (key, launch.backward_recipe(key) or False)
        else:
            dx, dres, dw, db = eager.backward_call(
                _backward_op, _backward_impl, dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out,
                recorded.dropout_p, recorded.rms, recorded.x_dtype, recorded.h_dtype, store_dres, key=key)
        shape = recorded.shape
        if len(shape) != 2:
            dx = dx.view(shape)
            dres = dres.view(shape) if store_dres else dres
        dresidual = (dres if store_dres else dx) if recorded.has_residual else None
        return None, dx, dw if weight is not None else None, db if bias is not None else None, dresidual, None


def _recorded(prepared: launch.NormForward, key, dropout_p: float, rms: bool, has_residual: bool) -> _Recorded:
    recorded = prepared.recorded
    if recorded is None:
        recorded = prepared.recorded = _Recorded(prepared, key, dropout_p, rms, has_residual)
    return recorded

# an eager call recording a gradient whose key keeps a NormForward goes through _RecordedFunction (issue 31's host
# time: the general path's checks, (rows, n) views, 10-argument Function and 4 wrapped outputs each call otherwise);
# the same launches and bits. Read each call (under OP_RECIPES); False: _LayerNormFunction. On since the H100's A/B
# (notes/norm's decision log)
RECORDED_RECIPES = True

# the recorded recipe's backward, where dy's layout repeats (its backward launch key) and no dh_out comes, launches by
# the key's launch.NormBackward (issue 31's host time: the general backward's plan and options lookups, the key hashed
# per launch and the argument tuples rebuilt each call); the same launches and bits. Read each call (under
# OP_RECIPES); False: the general backward (eager.backward_call). On: the same bits on the H100, faster in every round
# of its A/B (notes/host's decision log)
BACKWARD_RECIPES = True


# --------------------------------------------------------------------------------------------
# public functions


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None, *,
               residual: torch.Tensor | None = None, dropout_p: float = 0.0, eps: float = 1e-5, rms: bool = False,
               prenorm: bool = False, generator: torch.Generator | None = None):
    """Fused residual + dropout + LayerNorm (or RMSNorm) over the last dimension, in one pass:

        h = dropout(x, dropout_p) + residual          (the new residual stream)
        y = (h - mean(h)) / sqrt(var(h) + eps) * weight + bias      (rms=True: mean taken as 0)

    x: (..., N), N >= 1 (any width; rows of up to 8192 are read once, wider ones twice);
    float16, bfloat16 or float32, statistics in float32. weight, bias: (N,) or None. residual: x's
    shape or None. Each may be float16, bfloat16 or float32. y has x's dtype; h the residual's (x's
    without one), and y is the norm of h as stored in that dtype. Returns y, or (y, h) with
    ``prenorm`` (without residual and dropout, h is x itself).

    Dropout is applied whenever dropout_p > 0 (pass 0.0 in evaluation): an element is kept with
    probability 1 - dropout_p and scaled by 1 / (1 - dropout_p); a dropped one is x * 0 (a NaN stays
    NaN, as in torch's dropout). The mask comes from a seed drawn from ``generator`` (else the
    default generator of x's device) and is recomputed in the backward, never stored: the same
    generator state gives the same mask (``dropout_mask`` returns it). Kernels draw it with Triton's
    Philox, 16 bits an element (kept where they are >= round(dropout_p * 2^16): the keep rate is
    1 - dropout_p to within 2^-17); CPU tensors without Triton's interpreter with torch's CPU
    generator seeded alike, so the two masks differ (each is reproducible).

    Differentiable in x, weight, bias and residual (dresidual is dx's tensor itself when there is
    no dropout and residual has x's dtype). CPU tensors run torch's own CPU kernels.
    """
    # a CUDA call whose signature was checked before skips the checks; its key also finds the plan and
    # the kernels (keyed launches): the host time of an eager call (issue 31). The key holds the switches' generation
    # (tiles.switches.generation: plans read configs), so a probe's patched block gets its own plans and recipes
    key = _CALL_KEY(x, weight, bias, residual, dropout_p, eps, bool(rms), bool(prenorm), generation()) \
        if generator is None else None
    mode = None
    if key is not None and tiles_launch.OP_RECIPES:  # the key's kept launches (its second call on): no checks, plan
        prepared = _FORWARDS.get(key)
        if prepared:
            mode = dispatch.eager_mode(x, weight, bias, residual)
            if mode == "direct":
                y, h = prepared(x, weight, bias, residual, draw_seed(None, x.device) if dropout_p > 0 else None)
                return (y, h if h is not None else x) if prenorm else y
            if mode == "autograd" and RECORDED_RECIPES:
                recorded = prepared.recorded or _recorded(prepared, key, float(dropout_p), bool(rms),
                                                          residual is not None)
                out = eager.apply(_RecordedFunction, recorded, x, weight, bias, residual,
                                  draw_seed(None, x.device) if dropout_p > 0 else None)
                if not prenorm:
                    return out
                return out if recorded.store_h else (out, x)
    dropout_p, eps = _CHECKED.memo(key, lambda: check(x, weight, bias, residual, dropout_p, eps, generator))
    n = x.shape[-1]
    x2, res2 = _rows(x, n), _rows(residual, n)
    seed = draw_seed(generator, x.device) if dropout_p > 0 else None
    store_h = bool(prenorm) and (residual is not None or seed is not None)
    args = (x2, weight, bias, res2, seed, dropout_p, eps, bool(rms), store_h)
    if mode is None:  # (x2 and res2 are x's and the residual's views or copies: the same mode as theirs)
        mode = dispatch.eager_mode(x2, weight, bias, res2)
    if mode == "direct":  # nothing kept for a backward: the empty h and mean not made (lean)
        y, h, _, _ = _forward_impl(*args, key=key, lean=True)
    elif mode == "autograd":
        y, h, _, _ = eager.apply(_LayerNormFunction, key, *args)
    else:  # torch.compile, fake tensors, modes, subclasses
        y, h, _, _ = _forward_op(*args)
    if mode != "op" and key is not None and tiles_launch.OP_RECIPES and key not in _FORWARDS:  # (after its launches)
        _FORWARDS.put(key, launch.NormForward.of(_PLANS.get(key), x, x2, residual, res2, weight, bias, seed, dropout_p,
                                                 eps, bool(rms), store_h, key))
    if x.dim() != 2:  # (y is already (rows, N) for a 2-D x)
        y = y.view(x.shape)
        h = h.view(x.shape) if store_h else h
    if not prenorm:
        return y
    return y, (h if store_h else x)


_CHECKED = LRU(256)  # signatures of CUDA calls whose checks passed -> (dropout_p, eps) (the checks read nothing else)
_FORWARDS = LRU(256)  # a plain eager call's key -> its launch.NormForward (False: the general path), after its first call


def dropout_mask(x: torch.Tensor, dropout_p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The bool mask (x's shape, True: kept) that ``layer_norm(x, ..., dropout_p=dropout_p,
    generator=generator)`` draws with ``generator`` in its present state (which this advances as that
    call would)."""
    dropout_p, _ = check(x, None, None, None, dropout_p, 1.0, generator)
    n = x.shape[-1]
    rows = x.numel() // n
    seed = draw_seed(generator, x.device)
    return launch.dropout_mask(seed, rows, n, dropout_p, plan(rows, n, x.device)).view(x.shape)

"""``tilecore.gemm`` and ``tilecore.gemm_fp8``: public functions, checks, custom ops, autograd.

A takes leading batch dimensions ([..., M, K], as torch.matmul and F.linear take it): the public
functions fold them into M before the custom ops, which see matrices only.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.gemm import launch, plan
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.eager import apply as eager_apply  # Function.apply without torch's Python wrapper
from tilecore.tiles.launch import LRU, SignatureMemo, signature
from tilecore.tiles.switches import generation

_IN = (torch.bfloat16, torch.float16)
_IN_CPU = (torch.bfloat16, torch.float16, torch.float32)  # float32: CPU tensors (torch's CPU GEMM, or the interpreter)
_OUT = (torch.bfloat16, torch.float16, torch.float32)
_FP8 = (torch.float8_e4m3fn,)

# each keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_GEMM_KEY = SignatureMemo(globals())
_FP8_KEY = SignatureMemo(globals())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_pair(op: str, a, b, dtypes) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{op}: a and b must be tensors")
    if a.dim() < 2 or b.dim() != 2:
        raise ValueError(f"{op}: a must be a matrix [M, K] or a batch of them [..., M, K] and b a 2-D matrix "
                         f"[K, N]; got a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"{op}: a is on {a.device} and b on {b.device}")
    dispatch.backend_for(a.device)  # raises for devices tilecore does not run on
    if dtypes is _IN and a.device.type == "cpu":
        dtypes = _IN_CPU
    if a.dtype not in dtypes or b.dtype != a.dtype:
        cpu_only = " (float32 on CPU tensors only)" if dtypes is _IN and a.dtype == b.dtype == torch.float32 else ""
        raise TypeError(f"{op}: a and b must share one dtype among {', '.join(map(_name, dtypes))}{cpu_only}; "
                        f"got a {_name(a.dtype)} and b {_name(b.dtype)}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"{op}: inner dimensions differ: a is {'x'.join(map(str, a.shape))} (K = {a.shape[-1]}) "
                         f"and b is {b.shape[0]}x{b.shape[1]} (K = {b.shape[0]})")


def _rows(a: torch.Tensor) -> torch.Tensor:
    """A [..., M, K] as the matrix [prod(...) * M, K] (a view where its strides allow)."""
    return a if a.dim() == 2 else a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _check_out(op: str, out_dtype) -> None:
    if out_dtype not in _OUT:
        raise TypeError(f"{op}: out_dtype must be one of {', '.join(map(_name, _OUT))}; got {out_dtype}")


# --------------------------------------------------------------------------------------------
# gemm


def gemm(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """C = A B (+ bias), A: [M, K] or [..., M, K], B: [K, N], accumulated in fp32; C: [..., M, N].

    Operands are bf16 or fp16 (on CPU tensors also fp32). ``bias`` is a vector of N (the operands'
    dtype or fp32); ``out_dtype`` defaults to the operands' dtype (bf16, fp16 or fp32). Any M, N, K.
    Differentiable in a, b and bias. CPU tensors run torch's CPU matmul (see plan.py).
    """
    # a CUDA call whose signature was planned before skips the checks and the plan (they depend on
    # nothing else): the host time of an eager call (issue 31). The key holds the switches' generation
    # (tiles.switches.generation: plans read configs), so a probe's patched block gets its own plans and recipes
    mode = dispatch.eager_mode(a, b, bias)
    key = None if mode == "op" else _GEMM_KEY(a, b, bias, out_dtype, generation())
    if key is not None and tiles_launch.OP_RECIPES:  # the key's kept launch (its second call on): no plan read
        prepared = _GEMMS.get(key)
        if prepared:
            return prepared(a, b, bias) if mode == "direct" else eager_apply(_GemmFunction, a, b, bias, prepared, key)
    p = None if key is None else _PLANS.get(key)
    if p is None:
        _check(a, b, bias, out_dtype)
    lead = a.shape[:-1]
    if len(lead) != 1:
        a = _rows(a)
    if mode == "op":  # torch.compile, fake tensors, modes, transforms
        c = torch.ops.tilecore.gemm(a, b, bias, a.dtype if out_dtype is None else out_dtype)
    else:
        if p is None:
            p = plan.plan(a, b, out_dtype=a.dtype if out_dtype is None else out_dtype, bias=bias)
            if key is not None:
                _PLANS.put(key, p)
        if mode == "direct":
            c = launch.launch(p, a, b, bias, key=key)
        else:
            c = eager_apply(_GemmFunction, a, b, bias, p, key)
        if key is not None and tiles_launch.OP_RECIPES and key not in _GEMMS:  # (after the key's first launch)
            _GEMMS.put(key, len(lead) == 1 and launch.recipe(p, a, b, bias, key=key))
    return c if len(lead) == 1 else c.reshape(*lead, c.shape[1])


_PLANS = LRU(256)  # gemm's signature (with the switches' generation) -> its plan (CUDA calls)
_GEMMS = LRU(256)  # gemm's signature -> its launch.GluonGemm (False: the general path), made at the key's first call


def _check(a, b, bias, out_dtype) -> None:
    _check_pair("gemm", a, b, _IN)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    _check_out("gemm", out_dtype)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            raise ValueError(f"gemm: bias must be a vector of N = {b.shape[1]} elements; got "
                             f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
        if bias.dtype not in (a.dtype, torch.float32):
            raise TypeError(f"gemm: bias must be {_name(a.dtype)} or float32; got {_name(bias.dtype)}")
        if bias.device != a.device:
            raise ValueError(f"gemm: bias is on {bias.device} and a on {a.device}")


def _gemm_impl(a, b, bias, out_dtype):
    return launch.launch(plan.plan(a, b, out_dtype=out_dtype, bias=bias), a, b, bias)


@torch.library.custom_op("tilecore::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    return _gemm_impl(a, b, bias, out_dtype)


@_gemm_op.register_fake
def _(a, b, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _gradients(saved, needs, bias_dtype, grad, mm):
    """dA = dC B^T, dB = A^T dC, dbias = the column sums of dC, with ``mm(x, y, out_dtype)`` a GEMM
    (the custom op, or the public function: each records what the backward's own graph needs)."""
    a, b = saved
    g = grad.to(a.dtype)
    grad_a = mm(g, b.t(), a.dtype) if needs[0] else None
    grad_b = mm(a.t(), g, b.dtype) if needs[1] else None
    grad_bias = grad.float().sum(0).to(bias_dtype) if bias_dtype is not None and needs[2] else None
    return grad_a, grad_b, grad_bias


def _setup_context(ctx, inputs, output):
    a, b, bias, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad):
    grads = _gradients(ctx.saved_tensors, ctx.needs_input_grad, ctx.bias_dtype, grad,
                       lambda x, y, dtype: torch.ops.tilecore.gemm(x, y, None, dtype))
    return *grads, None


_gemm_op.register_autograd(_backward, setup_context=_setup_context)


class _GemmFunction(torch.autograd.Function):
    """Eager calls that record a gradient (dispatch.eager_mode's "autograd"): the custom op's
    autograd without the custom op's host time."""

    @staticmethod
    def forward(ctx, a, b, bias, p, key):
        ctx.save_for_backward(a, b)
        ctx.bias_dtype = None if bias is None else bias.dtype
        if type(p) is launch.GluonGemm:  # the key's kept launch
            return p(a, b, bias)
        return launch.launch(p, a, b, bias, key=key)

    @staticmethod
    def backward(ctx, grad):
        grads = _gradients(ctx.saved_tensors, ctx.needs_input_grad, ctx.bias_dtype, grad,
                           lambda x, y, dtype: gemm(x, y, out_dtype=dtype))
        return *grads, None, None


# --------------------------------------------------------------------------------------------
# gemm_fp8


def gemm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C = (A B) * scale_a * scale_b for e4m3 A [M, K] (or [..., M, K]) and B [K, N], accumulated in fp32.

    Scales are fp32: per tensor (one element each) or per row of A (M elements, as [M, 1] or [M];
    for a batch [..., M, 1], one per row of every matrix) and per column of B (N elements, or
    [1, N]), as in ``torch._scaled_mm``. B is best column-major (``b = bt.t()`` for a row-major
    ``bt`` of [N, K]); another layout is copied once on Hopper. Not differentiable (fp8 here is for
    inference: train through ``gemm`` in bf16).
    """
    mode = dispatch.eager_mode(a, b, scale_a, scale_b)
    key = None if mode == "op" else _FP8_KEY(a, b, scale_a, scale_b, out_dtype, generation())  # (as gemm's)
    if key is not None and mode == "direct" and tiles_launch.OP_RECIPES:  # the key's kept launch
        prepared = _FP8_GEMMS.get(key)
        if prepared:
            return prepared(a, b, None, (scale_a, scale_b))
    p = None if key is None else _FP8_PLANS.get(key)
    if p is None:
        _check_fp8(a, b, scale_a, scale_b, out_dtype)
    lead, N = a.shape[:-1], b.shape[1]
    a = _rows(a)
    if mode != "direct":  # "autograd" too: the op's backward says why fp8 has none
        c = torch.ops.tilecore.gemm_fp8(a, b, scale_a, scale_b, out_dtype)
    else:
        scales = (scale_a, scale_b)
        if p is None:
            p = plan.plan(a, b, out_dtype=out_dtype, scales=scales)
            if key is not None:
                _FP8_PLANS.put(key, p)
        c = launch.launch(p, a, b, scales=scales, key=key)
        if key is not None and tiles_launch.OP_RECIPES and key not in _FP8_GEMMS:
            _FP8_GEMMS.put(key, len(lead) == 1 and launch.recipe(p, a, b, None, scales, key=key))
    return c if len(lead) == 1 else c.reshape(*lead, N)


_FP8_PLANS = LRU(256)  # gemm_fp8's signature -> its plan (CUDA calls)
_FP8_GEMMS = LRU(256)  # gemm_fp8's signature -> its launch.GluonGemm (False: the general path)


def _check_fp8(a, b, scale_a, scale_b, out_dtype) -> None:
    _check_pair("gemm_fp8", a, b, _FP8)
    _check_out("gemm_fp8", out_dtype)
    lead = a.shape[:-1]
    M, N = math.prod(lead), b.shape[1]
    for name, s, n, shape in (("scale_a", scale_a, M, lead), ("scale_b", scale_b, N, (N,))):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            raise TypeError(f"gemm_fp8: {name} must be a float32 tensor")
        if not _scale_fits(s, n, shape):
            raise ValueError(f"gemm_fp8: {name} must hold 1 (per tensor) or {n} (per "
                             f"{'row of a' if name == 'scale_a' else 'column of b'}) elements; got shape {tuple(s.shape)}")
        if s.device != a.device:
            raise ValueError(f"gemm_fp8: {name} is on {s.device} and a on {a.device}")
    if (scale_a.numel() == 1) != (scale_b.numel() == 1) and M != 1 and N != 1:
        raise ValueError("gemm_fp8: scales are both per-tensor or both per-row/column (as torch._scaled_mm)")


def _scale_fits(s: torch.Tensor, count: int, shape: tuple) -> bool:
    """One element, or ``count`` laid out as ``shape`` or as a vector (size-1 dimensions aside)."""
    if s.numel() == 1:
        return True
    dims = [d for d in s.shape if d != 1]
    return s.numel() == count and (dims == [d for d in shape if d != 1] or dims == [count])


def _gemm_fp8_impl(a, b, scale_a, scale_b, out_dtype):
    scales = (scale_a, scale_b)
    return launch.launch(plan.plan(a, b, out_dtype=out_dtype, scales=scales), a, b, scales=scales)


@torch.library.custom_op("tilecore::gemm_fp8", mutates_args=())
def _gemm_fp8_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
    return _gemm_fp8_impl(a, b, scale_a, scale_b, out_dtype)


@_gemm_fp8_op.register_fake
def _(a, b, scale_a, scale_b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _fp8_backward(ctx, grad):
    raise NotImplementedError(
        "tilecore.gemm_fp8 has no backward: its fp8 operands are for inference. Train through "
        "tilecore.gemm in bfloat16 (quantizing the weights for inference afterwards), or detach the "
        "inputs of gemm_fp8 (and its scales) from the graph.")


_gemm_fp8_op.register_autograd(_fp8_backward)

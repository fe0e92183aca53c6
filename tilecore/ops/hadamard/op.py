"""``tilecore.hadamard_transform``: the public function, its checks, and its custom-op registration."""
from __future__ import annotations

import math
import numbers

import torch

from tilecore import dispatch
from tilecore.ops.hadamard import configs, launch, plan

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check(x: torch.Tensor, scale) -> float:
    """Raise TypeError/ValueError naming what is accepted; return ``scale`` as a float."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"hadamard_transform expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"hadamard_transform accepts float16, bfloat16 and float32 tensors, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("hadamard_transform transforms the last dimension; got a 0-d tensor")
    n = x.shape[-1]
    if n not in configs.SPLITS:
        raise ValueError(f"hadamard_transform needs the last dimension to be a power of two from 1 to "
                         f"{configs.MAX_N}, got {n}")
    return real_scale(scale)


def real_scale(scale) -> float:
    """``scale`` as a float: a finite real number (int, float, numpy's scalars; not bool) or a 0-d real
    tensor that records no gradient (its value is read once)."""
    what = "scale must be a finite real number (int, float, a numpy scalar or a 0-d tensor)"
    if isinstance(scale, torch.Tensor):
        if scale.dim() != 0 or scale.dtype.is_complex or scale.dtype == torch.bool:
            raise TypeError(f"{what}; got a {str(scale.dtype).removeprefix('torch.')} tensor of shape "
                            f"{tuple(scale.shape)}")
        if scale.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{what}; got a tensor that requires grad, and hadamard_transform is not "
                             "differentiable in scale: pass scale.detach() or a float")
        value = scale.item()
    elif isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        value = scale
    else:
        raise TypeError(f"{what}; got {scale!r} ({type(scale).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what}; got {value}")
    return value


def _transform_into(x: torch.Tensor, out: torch.Tensor, scale: float) -> None:
    """out = scale * H x over the last dimension; ``out`` is contiguous, ``x`` any layout."""
    n = x.shape[-1]
    if x.numel() == 0:
        return
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()  # (n = 1 may keep its stride: one element a row, it is moot there)
    out2 = out.view(-1, n)
    launch.launch(plan.plan(x2, out2), x2, out2, float(scale))


def _hadamard_impl(x: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _transform_into(x, out, scale)
    return out


@torch.library.custom_op("tilecore::hadamard_transform", mutates_args=())
def _hadamard_op(x: torch.Tensor, scale: float) -> torch.Tensor:
    return _hadamard_impl(x, scale)


@_hadamard_op.register_fake
def _(x, scale):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _setup_context(ctx, inputs, output):
    ctx.scale = inputs[1]


def _backward(ctx, grad):
    # H is symmetric, so the gradient of scale * H x is scale * H grad.
    return _hadamard_op(grad, ctx.scale), None


_hadamard_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("tilecore::hadamard_transform_", mutates_args=("x",))
def _hadamard_inplace_op(x: torch.Tensor, scale: float) -> None:
    if x.is_contiguous():
        _transform_into(x, x, scale)  # safe: each tile is read whole before any of it is written
    else:
        x.copy_(_hadamard_op(x, scale))


@_hadamard_inplace_op.register_fake
def _(x, scale):
    return None


def hadamard_transform(x: torch.Tensor, scale: float = 1.0, *, inplace: bool = False) -> torch.Tensor:
    """scale * H_n x along the last dimension, H_n the n x n Sylvester Hadamard matrix (entries +-1).

    A drop-in for ``fast_hadamard_transform.hadamard_transform(x, scale)``: any leading dimensions;
    float16, bfloat16 or float32; n a power of two from 1 to 32768; the output has x's dtype and
    shape. ``scale`` is a real number (a numpy scalar or 0-d tensor too); ``scale=n ** -0.5`` makes
    it orthonormal. Differentiable (the gradient is the same
    transform times scale). With ``inplace=True`` the result overwrites x and x is returned.
    """
    scale = check(x, scale)
    if inplace:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("hadamard_transform(inplace=True) cannot record a gradient; use inplace=False")
        if dispatch.plain_eager(x) and x.is_contiguous():
            _transform_into(x, x, scale)
        else:
            _hadamard_inplace_op(x, scale)
        return x
    if dispatch.plain_eager(x):
        return _hadamard_impl(x, scale)
    return _hadamard_op(x, scale)

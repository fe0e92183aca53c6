"""``tilecore.hadamard_transform``: the public function, its checks, and its custom-op registration."""
from __future__ import annotations

import math
import numbers

import torch

from tilecore import dispatch
from tilecore.ops.hadamard import configs, kron, launch, orders, plan
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.eager import apply as eager_apply  # Function.apply without torch's Python wrapper
from tilecore.tiles.launch import LRU, KeyedLaunch, signature

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
    parts = orders.split(n)
    if parts is None or parts[1] > configs.MAX_N:
        raise ValueError(f"hadamard_transform has no Hadamard matrix of order {n} (the last dimension): it takes "
                         f"{orders.supported_text()}, with 2^k <= {configs.MAX_N}")
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


def _transform_into(x: torch.Tensor, out: torch.Tensor, scale: float, key: tuple | None = None,
                    transpose: bool = False) -> None:
    """out = scale * H x over the last dimension (H^T x with ``transpose``); ``out`` is contiguous, ``x``
    any layout. ``key``: the call's signature (tiles.launch.signature of x and whether out is x), for the
    plan cache."""
    n = x.shape[-1]
    if x.numel() == 0:
        return
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()  # (n = 1 may keep its stride: one element a row, it is moot there)
    out2 = out.view(-1, n)
    m, p = orders.split(n)
    if m > 1:  # n = m x 2^k, m not a power of two (kron.py): H_m (x) H_p, H_m^T with ``transpose``
        kron.launch(kron.kron_plan(x2, m, p), x2, out2, float(scale), transpose and not orders.is_symmetric(m))
        return
    p = None if key is None else _PLANS.get(key)
    if p is None:
        p = plan.plan(x2, out2)
        if key is not None:
            _PLANS.put(key, p)
    launch.launch(p, x2, out2, float(scale), key=key)


_PLANS = LRU(256)  # a CUDA call's signature -> its plan
_RECIPES = LRU(256)  # a keyed call's signature -> its _TlTransform (False: the general path), after its first call


class _TlTransform:
    """The keyed call of one signature on the tl kernel through pointers (issue 31's host time): the kernel's
    KeyedLaunch and the sizes and row strides the key fixes, made from the key's plan after its first call. A call
    allocates the output and launches what launch.launch launches for x's (rows, n) view, handing x and the output
    themselves (the views' memory: made only where that view is x's own memory, not a copy): no checks, reshapes,
    plan or launch-key lookup. Only for n a power of two (no Kronecker factor, so ``transpose`` changes nothing) and
    the plan's "tl" path without TMA descriptors; ``of`` gives False for any other."""

    __slots__ = ("launch", "rows", "x_stride", "out_stride")

    @classmethod
    def of(cls, p, x: torch.Tensor, key):
        cfg = p.config
        n = x.shape[-1]
        if p.path != "tl" or cfg.get("TMA_LOAD") or cfg.get("TMA_STORE") or x.numel() == 0 \
                or orders.split(n)[0] != 1:
            return False
        x2 = x.reshape(-1, n)  # (as _transform_into: a view of x, or a copy each call, which keeps the general path)
        if x2.data_ptr() != x.data_ptr() or x2.stride(-1) != 1:
            return False
        self = cls()
        self.rows, self.x_stride, self.out_stride = x2.shape[0], x2.stride(0), n  # (the output: contiguous)
        self.launch = KeyedLaunch(launch._launch_hadamard, key, p.grid, cfg)
        return self

    def __call__(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        out = x.new_empty(x.shape)
        self.launch((x, out, self.rows, self.x_stride, self.out_stride, scale))
        return out


def _hadamard_impl(x: torch.Tensor, scale: float, key: tuple | None = None, transpose: bool = False) -> torch.Tensor:
    if key is not None and tiles_launch.OP_RECIPES:
        recipe = _RECIPES.get(key)
        if recipe:
            return recipe(x, scale)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _transform_into(x, out, scale, key, transpose)
    if key is not None and tiles_launch.OP_RECIPES and key not in _RECIPES:  # (after its launch)
        p = _PLANS.get(key)
        _RECIPES.put(key, p is not None and _TlTransform.of(p, x, key))
    return out


@torch.library.custom_op("tilecore::hadamard_transform", mutates_args=())
def _hadamard_op(x: torch.Tensor, scale: float, transpose: bool = False) -> torch.Tensor:
    return _hadamard_impl(x, scale, None, transpose)


@_hadamard_op.register_fake
def _(x, scale, transpose=False):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _setup_context(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.transpose = inputs[2] if len(inputs) > 2 else False


def _backward(ctx, grad):
    # The gradient of scale * H x is scale * H^T grad (H^T = H but for m = 156 and 172: orders.py).
    return _hadamard_op(grad, ctx.scale, not ctx.transpose), None, None


_hadamard_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("tilecore::hadamard_transform_", mutates_args=("x",))
def _hadamard_inplace_op(x: torch.Tensor, scale: float, transpose: bool = False) -> None:
    if x.is_contiguous():
        _transform_into(x, x, scale, None, transpose)  # safe: each row is read whole before it is written
    else:
        x.copy_(_hadamard_op(x, scale, transpose))


@_hadamard_inplace_op.register_fake
def _(x, scale, transpose=False):
    return None


def hadamard_transform(x: torch.Tensor, scale: float = 1.0, *, inplace: bool = False,
                       transpose: bool = False) -> torch.Tensor:
    """scale * H_n x along the last dimension, H_n an n x n Hadamard matrix (entries +-1).

    n a power of two from 1 to 32768: H_n is Sylvester's, a drop-in for
    ``fast_hadamard_transform.hadamard_transform(x, scale)``. n = m x 2^k for m in 12, 20, 28, 36, 40,
    44, 52, 60, 108, 140, 148, 156, 172 (2^k <= 32768): H_n = H_m (x) H_2^k, the Kronecker order of Dao's
    ``hadamard_transform_{12,20,28,40}N`` (the power-of-two transform along contiguous elements, H_m
    across the m blocks of 2^k), with H_m tilecore's own (orders.py: Paley, Williamson; not Dao's
    tables, so the two differ by signed permutations of the m blocks: rotate weights and activations
    with the same library); ``hadamard_matrix(n)`` gives H_n. H_n is symmetric but for m = 156 and 172;
    ``transpose=True`` multiplies by H_n^T (n times the inverse of the orthonormal rotation).

    Any leading dimensions; float16, bfloat16 or float32; the output has x's dtype and shape.
    ``scale`` is a real number (a numpy scalar or 0-d tensor too); ``scale=n ** -0.5`` makes it
    orthonormal. Differentiable (the gradient is the transposed transform times scale). With
    ``inplace=True`` the result overwrites x and x is returned.
    """
    transpose = bool(transpose)
    mode = dispatch.eager_mode(x)
    # a CUDA call whose signature passed the checks before is planned already (the plan cache)
    key = None if mode == "op" else signature(x, inplace)
    if mode == "direct" and not inplace and tiles_launch.OP_RECIPES:  # the key's kept launch: no checks or plan
        recipe = _RECIPES.get(key)
        if recipe and type(scale) is float and math.isfinite(scale):
            return recipe(x, scale)
    if key is None or key not in _PLANS:
        scale = check(x, scale)
    elif type(scale) is not float or not math.isfinite(scale):
        scale = real_scale(scale)
    if inplace:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("hadamard_transform(inplace=True) cannot record a gradient; use inplace=False")
        if mode == "direct" and x.is_contiguous():
            _transform_into(x, x, scale, key, transpose)
        else:
            _hadamard_inplace_op(x, scale, transpose)
        return x
    if mode == "direct":
        return _hadamard_impl(x, scale, key, transpose)
    if mode == "autograd":
        return eager_apply(_HadamardFunction, x, scale, key, transpose)
    return _hadamard_op(x, scale, transpose)


class _HadamardFunction(torch.autograd.Function):
    """Eager calls that record a gradient (dispatch.eager_mode's "autograd"): the custom op's
    autograd without the custom op's host time."""

    @staticmethod
    def forward(ctx, x, scale, key, transpose=False):
        ctx.scale, ctx.transpose = scale, transpose
        return _hadamard_impl(x, scale, key, transpose)

    @staticmethod
    def backward(ctx, grad):
        return hadamard_transform(grad, ctx.scale, transpose=not ctx.transpose), None, None, None

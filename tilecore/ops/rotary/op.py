"""``tilecore.apply_rotary``: the public function, its checks, custom ops and autograd."""
from __future__ import annotations

from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.rotary import launch
from tilecore.ops.rotary.plan import plan
from tilecore.tiles import eager
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import LRU, KeyedLaunch, SignatureMemo, signature
from tilecore.tiles.switches import generation

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
POSITION_DTYPES = (torch.int32, torch.int64)

# each keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_CALL_KEY = SignatureMemo(globals())


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check(x, cos, sin, position_ids) -> torch.Tensor | None:
    """Raise TypeError/ValueError naming what is accepted; return position_ids expanded to (B, N)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"apply_rotary expects x of shape (batch, seqlen, heads, head_dim); got {got}")
    if x.dtype not in DTYPES:
        raise TypeError(f"apply_rotary accepts float16, bfloat16 and float32 x; got {_name(x.dtype)}")
    dispatch.backend_for(x.device)  # raises for devices tilecore does not run on
    B, N, H, D = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] < 1:
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"apply_rotary: {name} must be (max_seqlen, rotary_dim / 2), rotary_dim >= 2; got {got}")
        if t.dtype not in DTYPES:
            raise TypeError(f"apply_rotary: {name} must be float16, bfloat16 or float32; got {_name(t.dtype)}")
        if t.device != x.device:
            raise ValueError(f"apply_rotary: {name} is on {t.device} and x on {x.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"apply_rotary: cos and sin must have one shape; got {tuple(cos.shape)} and {tuple(sin.shape)}")
    n_max, pairs = cos.shape
    if 2 * pairs > D:
        raise ValueError(f"apply_rotary: rotary_dim = 2 * cos.shape[1] = {2 * pairs} exceeds head_dim = {D} "
                         f"(x of shape {tuple(x.shape)})")
    if position_ids is None:
        if N > n_max:
            raise ValueError(f"apply_rotary: cos and sin hold {n_max} positions, fewer than x's seqlen {N}: "
                             "pass longer tables or position_ids")
        return None
    if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in POSITION_DTYPES:
        got = _name(position_ids.dtype) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise TypeError(f"apply_rotary: position_ids must be an int32 or int64 tensor; got {got}")
    if position_ids.device != x.device:
        raise ValueError(f"apply_rotary: position_ids is on {position_ids.device} and x on {x.device}")
    try:
        pos = position_ids.expand(B, N)
    except RuntimeError:
        raise ValueError(f"apply_rotary: position_ids must be (batch, seqlen) = ({B}, {N}) or broadcast to it; "
                         f"got shape {tuple(position_ids.shape)}") from None
    # on a GPU the check would cost a sync, and under torch.compile a graph break: NaN tokens instead
    if pos.device.type == "cpu" and pos.numel() and not torch.compiler.is_compiling():
        low, high = pos.min().item(), pos.max().item()
        if low < 0 or high >= n_max:
            raise ValueError(f"apply_rotary: position_ids must lie in [0, {n_max}) (cos and sin's rows); "
                             f"got values from {low} to {high}")
    return pos


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


_CHECKED = LRU(256)  # signatures of CUDA calls whose checks passed (the checks read nothing else)
_PLANS = LRU(256)  # a CUDA call's launch key -> its plan
_RECIPES = LRU(256)  # a plain eager call's signature -> its _RotaryLaunch (False: the general path), after its first call


class _RotaryLaunch:
    """apply_rotary's plain eager call of one signature (issue 31's host time): the kernel's KeyedLaunch and every
    launch argument the key fixes (sizes and strides: x's, the fresh output's, cos', sin', position_ids' expanded to
    (B, N)), made from the key's plan after its first call. A call allocates the output and launches what
    launch.launch launches, handing x, cos, sin and position_ids themselves (the expanded view's memory is
    position_ids'): no checks, expand, stride reads, plan or launch-key lookup. Only where the general path passes
    x, cos and sin as they are (unit stride along their last dimension: else it copies them each call) and launches
    the kernel (a CUDA plan, a nonempty x); ``of`` gives False for the others. ``generation``: the switches'
    generation its plan was made under (a patched block plans anew: the general path then serves)."""

    __slots__ = ("launch", "tail", "generation")

    @classmethod
    def of(cls, key, x, cos, sin, position_ids, interleaved: bool):
        gen = generation()
        p = _PLANS.get((key, gen))
        if p is None or p.path == "cpu" or x.numel() == 0 or x.stride(-1) != 1 or cos.stride(-1) != 1 \
                or sin.stride(-1) != 1:
            return False
        B, N, H, D = x.shape
        R = cos.shape[1]
        pos = None if position_ids is None else position_ids.expand(B, N)
        self = cls()
        self.generation = gen
        # (as launch.launch's, for a fresh contiguous output: out-of-place, so PASS copies the features past 2R)
        self.tail = (N, H, cos.shape[0], x.stride(0), x.stride(1), x.stride(2), N * H * D, H * D, D,
                     cos.stride(0), sin.stride(0), 0 if pos is None else pos.stride(0), 0 if pos is None else pos.stride(1))
        options = dict(R=R, BLOCK_R=p.block_r, BLOCK_H=p.block_h, PASS=D - 2 * R, BLOCK_PASS=p.block_pass,
                       INTERLEAVED=interleaved, CONJUGATE=False, HAS_POS=pos is not None, num_warps=p.num_warps)
        if p.block_t > 1:
            options["BLOCK_T"] = p.block_t
        self.launch = KeyedLaunch(launch._rotary, (key, gen), p.grid, options)
        return self

    def __call__(self, x, cos, sin, position_ids):
        out = x.new_empty(x.shape)
        self.launch((x, cos, sin, position_ids, out, *self.tail))
        return out


def head_major(t: torch.Tensor) -> bool:
    """Whether a (B, N, H, D) tensor holds each head's tokens side by side (a (B, H, N, D) tensor's transposed view)."""
    return t.shape[2] > 1 and t.shape[1] > 1 and t.stride(2) > t.stride(1)


def _rotate_into(x, cos, sin, pos, out, interleaved: bool, conjugate: bool, key=None) -> None:
    B, N, H, D = x.shape
    cos, sin = _unit_stride(cos), _unit_stride(sin)
    if key is not None:  # the plan reads configs (HEAD_MAJOR_TILES, TILE_ELEMS): a patched block plans (and launches) anew
        key = (key, generation())
    # (a key names x's strides, and out is x or a fresh contiguous tensor: it fixes head_major too)
    p = _PLANS.memo(key, lambda: plan(B, N, H, D, cos.shape[1], x.device, head_major(x) and head_major(out)))
    launch.launch(p, x, cos, sin, pos, out, interleaved, conjugate, key=key)


def _rotary_impl(x, cos, sin, pos, interleaved, conjugate, key=None):
    out = launch.output(x.shape, x.dtype, x.device)
    _rotate_into(_unit_stride(x), cos, sin, pos, out, interleaved, conjugate, key=key)
    return out


@torch.library.custom_op("tilecore::apply_rotary", mutates_args=())
def _rotary_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor],
               interleaved: bool, conjugate: bool) -> torch.Tensor:
    return _rotary_impl(x, cos, sin, position_ids, interleaved, conjugate)


@_rotary_op.register_fake
def _(x, cos, sin, position_ids, interleaved, conjugate):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    _, cos, sin, pos, interleaved, conjugate = inputs
    ctx.save_for_backward(cos, sin, pos)
    ctx.interleaved, ctx.conjugate = interleaved, conjugate


def _backward(ctx, grad):
    # a rotation's transpose is the rotation by the opposite angle
    cos, sin, pos = ctx.saved_tensors
    if grad is None:  # the output unused (the eager Function passes None)
        return None, None, None, None, None, None
    dx = eager.backward_call(_rotary_op, _rotary_impl, grad, cos, sin, pos, ctx.interleaved, not ctx.conjugate,
                             key=eager.backward_key(ctx, grad))
    return dx, None, None, None, None, None


_rotary_op.register_autograd(_backward, setup_context=_setup_context)
# eager calls that record a gradient: the same autograd without the custom op's host time
_RotaryFunction = eager.eager_autograd("_RotaryFunction", _rotary_impl, _setup_context, _backward)


@torch.library.custom_op("tilecore::apply_rotary_", mutates_args=("x",))
def _rotary_inplace_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor],
                       interleaved: bool, conjugate: bool) -> None:
    if x.stride(-1) == 1:
        _rotate_into(x, cos, sin, position_ids, x, interleaved, conjugate)  # a program reads its pairs, then writes them
    else:
        x.copy_(_rotary_impl(x, cos, sin, position_ids, interleaved, conjugate))


@_rotary_inplace_op.register_fake
def _(x, cos, sin, position_ids, interleaved, conjugate):
    return None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False,
                 inplace: bool = False, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding, flash-attn's ``apply_rotary_emb`` convention.

    x: (batch, seqlen, heads, head_dim) (any strides; q or k before attention, as flash-attn lays them
    out: a (B, H, N, D) tensor goes in as ``t.transpose(1, 2)``). cos, sin: (max_seqlen, rotary_dim / 2),
    rotary_dim <= head_dim: features past rotary_dim pass through unchanged. The pairs turned by angle
    i are features (i, i + rotary_dim / 2) (half-split: GPT-NeoX, Llama) or (2i, 2i + 1)
    (``interleaved``: GPT-J). Token n takes row n of cos and sin, or row position_ids[b, n]
    (``position_ids``: int32/int64 (batch, seqlen), or anything that broadcasts to it, e.g. (seqlen,)).
    Positions outside [0, max_seqlen) raise on CPU tensors (in eager mode) and give NaN for that
    token on a GPU (checking them there would cost a sync).

    float16, bfloat16 or float32 (cos and sin too, any of them), computed in float32, rounded once.
    Differentiable in x (the gradient is the rotation by the opposite angle); cos and sin are taken
    as constants (no gradient), as flash-attn does. ``inplace=True`` overwrites x and returns it (no
    gradient recorded). CPU tensors run torch operations.
    """
    # a CUDA call whose signature was checked before skips the checks; its key also finds the plan and
    # the kernel (a keyed launch): the host time of an eager call (issue 31)
    interleaved, inplace = bool(interleaved), bool(inplace)
    key = _CALL_KEY(x, cos, sin, position_ids, interleaved, inplace)
    recipe = None
    if key is not None and not inplace and tiles_launch.OP_RECIPES:  # the key's kept launch: no checks or plan
        recipe = _RECIPES.get(key)
        if recipe and recipe.generation == generation() and dispatch.eager_mode(x, cos, sin, position_ids) == "direct":
            return recipe(x, cos, sin, position_ids)
    if key is None or _CHECKED.get(key) is None:
        pos = check(x, cos, sin, position_ids)
        if key is not None:
            _CHECKED.put(key, True)
    else:
        pos = None if position_ids is None else position_ids.expand(x.shape[0], x.shape[1])
    if inplace:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("apply_rotary(inplace=True) cannot record a gradient; use inplace=False")
        if dispatch.plain_eager(x, cos, sin, pos) and x.stride(-1) == 1:
            _rotate_into(x, cos, sin, pos, x, interleaved, False, key=key)
        else:
            _rotary_inplace_op(x, cos, sin, pos, interleaved, False)
        return x
    mode = dispatch.eager_mode(x, cos, sin, pos)
    out = eager.run(_rotary_op, _rotary_impl, _RotaryFunction, x, cos, sin, pos, interleaved, False, key=key, mode=mode)
    # (after its launch; again where its plan's switches changed since: tiles.switches.patched)
    if key is not None and mode == "direct" and tiles_launch.OP_RECIPES \
            and (recipe is None or (recipe and recipe.generation != generation())):
        _RECIPES.put(key, _RotaryLaunch.of(key, x, cos, sin, position_ids, interleaved))
    return out


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False,
         conjugate: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """apply_rotary's rotation of x (batch, seqlen, heads, head_dim), token n by row n of cos and sin
    (``conjugate``: by the opposite angle, the inverse), into ``out`` (x's shape, unit stride along the
    head dim, any other strides; not x) or a new (B, N, H, D) contiguous tensor: no checks, no autograd,
    no custom op (for ops that call it inside their own implementations, on inputs they checked:
    attention's rotary backward)."""
    if out is None:
        return _rotary_impl(x, cos, sin, None, bool(interleaved), bool(conjugate))
    _rotate_into(_unit_stride(x), cos, sin, None, out, bool(interleaved), bool(conjugate))
    return out

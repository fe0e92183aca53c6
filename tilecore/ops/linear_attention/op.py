"""``tilecore.linear_attention``, ``tilecore.mamba2_chunk_scan`` and their decode steps: the public
functions, their checks, and the custom ops (forward, backward, step) with autograd.

All four run on one core: causal linear attention with an optional log decay (scalar or per key
channel), a per-token factor on each token's contribution (beta: Mamba-2's dt), grouped q/k heads,
Based's feature map in the kernels, and Mamba-2's epilogue (o + D v) * silu(z). Mamba-2 maps onto it
as q = C, k = B, v = x, beta = dt, log decay = dt A (scale 1).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
import torch.nn.functional as F

from tilecore import dispatch
from tilecore.ops.linear_attention import configs, kernels_backward_gla, kernels_forward, launch, mamba_dt
from tilecore.ops.linear_attention.plan import BASED, IDENTITY, plan
from tilecore.tiles import eager
from tilecore.tiles import launch as tiles_launch
# (signature: read by name from this module's namespace by SignatureMemo)
from tilecore.tiles.launch import LRU, CachedLaunch, KeyedLaunch, SameKey, SignatureMemo, next_power_of_2, signature  # noqa: F401
from tilecore.tiles.launch import release, scratch
from tilecore.tiles.switches import generation

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FEATURE_MAPS = (None, "based", "hedgehog")
LAYOUT = ("linear_attention takes (batch, tokens, heads, head_dim) tensors, as flash-linear-attention does: "
          "q, k (B, N, Hqk, Dk), v (B, N, H, Dv) with H a multiple of Hqk; (B, H, N, D) tensors go in as "
          ".transpose(1, 2) (a view)")

# each keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_FORWARD_KEY = SignatureMemo(globals())
_CALL_KEY, _RECORDED_KEY = SameKey(), SameKey()  # the forward's nested keys, one object while their parts repeat
_STEP_KEY = SignatureMemo(globals())
_MAMBA_STEP_KEY = SignatureMemo(globals())

# Issue 31's host time for Hedgehog's eager calls: KEYED_HEDGEHOG keys a Hedgehog call on its tensors with its
# weights (checks once a key, the two maps' launches by key, the core on the key: plan cache, keyed launches);
# KEYED_BACKWARD plans the core's backward once per (forward key, gradients' layouts) and launches its kernels by
# that key. Read each call; the same kernels and arguments either way (tests/host/test_hedgehog_host.py). On: the
# same bits on the H100 and 0.67x the host time of a Hedgehog fwd+bwd (notes/host's decision log)
KEYED_HEDGEHOG = True
KEYED_BACKWARD = True
_MAP = CachedLaunch(kernels_forward.hedgehog_map_kernel)
_MAP_BWD = CachedLaunch(kernels_forward.hedgehog_map_bwd_kernel)
_MAP_BWD_BLOCKS = LRU(256)  # a map's key -> (rows, warps, programs) of its backward


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _real(op: str, name: str, value) -> float:
    """A finite real (Python or numpy number, or a one-element real tensor, read once)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex \
            and value.dtype != torch.bool:
        value = value.item()
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(float(value)):
        raise TypeError(f"{op}: {name} must be a finite real number; got {value!r}")
    return float(value)


def _tensor(op: str, name: str, t, device, dims: tuple, float_only: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor; got {type(t).__name__}")
    if tuple(t.shape) != tuple(dims):
        raise ValueError(f"{op}: {name} must have shape {tuple(dims)}; got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} and the inputs on {device}")
    if float_only and not t.dtype.is_floating_point:
        raise TypeError(f"{op}: {name} must be a floating-point tensor; got {_name(t.dtype)}")


def _check_qkv(op: str, q, k, v, what: str = LAYOUT) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-D; got shape {tuple(t.shape)} ({what})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{op}: inputs must be on one device; got {q.device}, {k.device}, {v.device}")
    dispatch.backend_for(q.device)  # raises for devices tilecore does not run on
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{op}: inputs must share one dtype among {', '.join(map(_name, DTYPES))}; got "
                        f"{_name(q.dtype)}, {_name(k.dtype)}, {_name(v.dtype)}")
    if q.shape != k.shape:
        raise ValueError(f"{op}: q and k must have one shape; got {tuple(q.shape)} and {tuple(k.shape)} ({what})")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"{op}: v must have q's batch and tokens {tuple(q.shape[:2])}; got v of shape "
                         f"{tuple(v.shape)} ({what})")
    if q.shape[2] == 0 or v.shape[2] % q.shape[2] != 0:
        raise ValueError(f"{op}: v's heads ({v.shape[2]}) must be a multiple of q's and k's ({q.shape[2]}) ({what})")
    for name, d in (("q and k", q.shape[3]), ("v", v.shape[3])):
        if not 1 <= d <= configs.MAX_HEAD_DIM:
            raise ValueError(f"{op}: {name}'s head_dim (last dimension) must be from 1 to {configs.MAX_HEAD_DIM}; "
                             f"got {d} ({what})")


def _check_chunk(op: str, chunk) -> None:
    if chunk is not None and chunk not in configs.CHUNKS:
        raise ValueError(f"{op}: chunk_size must be None or one of {configs.CHUNKS}; got {chunk!r}")


def _hedgehog_weights(op: str, weights, heads: int, dk: int, device):
    """(W_q, W_k), each (Hqk, Dk, F), from one tensor or a pair."""
    pair = tuple(weights) if isinstance(weights, (tuple, list)) else (weights, weights)
    if len(pair) != 2 or not all(isinstance(w, torch.Tensor) for w in pair):
        raise TypeError(f"{op}: feature_map='hedgehog' needs feature_weights: one (heads, head_dim, features) "
                        f"tensor for q and k, or a pair (W_q, W_k); got {weights!r}")
    for w in pair:
        if w.dim() != 3 or tuple(w.shape[:2]) != (heads, dk) or w.shape[2] != pair[0].shape[2] or w.shape[2] < 1:
            raise ValueError(f"{op}: hedgehog feature_weights must be ({heads}, {dk}, features) (q/k heads, head_dim, "
                             f"features), one shape for both; got {_shape(pair[0])} and {_shape(pair[1])}")
        if 2 * w.shape[2] > configs.MAX_HEAD_DIM:
            raise ValueError(f"{op}: hedgehog's features (2 x {w.shape[2]}) must be at most {configs.MAX_HEAD_DIM}")
        if w.device != device or not w.dtype.is_floating_point:
            raise TypeError(f"{op}: feature_weights must be floating-point tensors on {device}")
    return pair


def _map_tile(dk: int, features: int) -> int:
    """The map kernels' Dk x F tile in elements (each side a power of two, at least 16)."""
    return max(16, next_power_of_2(dk)) * max(16, next_power_of_2(features))


def _fused_map_fits(dk: int, features: int) -> bool:
    """Where the one-pass map kernels compile for sm_90a in registers (Dk x F up to 128 x 64, powers of two up; at
    256 x 128 the backward asks for more shared memory than an SM has): torch's map beyond."""
    return _map_tile(dk, features) <= 128 * 64


def _map_bwd_block(dk: int, features: int) -> tuple[int, int]:
    """(rows, warps) of the map's backward at Dk x F: configs.HEDGEHOG_MAP_BWD_BLOCKS' first entry that holds it."""
    size = _map_tile(dk, features)
    return next(((r, w) for top, r, w in configs.HEDGEHOG_MAP_BWD_BLOCKS if size <= top),
                configs.HEDGEHOG_MAP_BWD_BLOCKS[-1][1:])


def _map_precision(device) -> str:
    """The map kernels' projection dot: configs.HEDGEHOG_MAP_PRECISION, but "ieee" on ROCm, whose Triton takes ieee,
    bf16x3 and bf16x6, not tf32x3 (a compile error on gfx90a: issue 31)."""
    return "ieee" if dispatch.is_rocm(device) else configs.HEDGEHOG_MAP_PRECISION


def _keyed(launcher: CachedLaunch, key):
    """A kernels_forward ``launch`` hook: ``launcher``'s run by ``key`` (None: the plain kernel[grid] launch)."""
    return None if key is None else (lambda grid, args, options: launcher.run(key, grid, args, options))


def _fused_map(x, weight, key=None):
    """The one-pass map's forward in x's dtype (float32 inside the interpreter: decision 7, its bf16 sums).
    ``key``: the map's launch key (it fixes x's and weight's signatures and the map's precision), or None; with
    one (and OP_RECIPES) the key's _MapLaunch from its second call on."""
    wide = torch.float32 if dispatch.interpreted(x.device) else None
    w = _as(weight, torch.float32)
    if key is not None and tiles_launch.OP_RECIPES:
        recipe = _MAP_RECIPES.get(key)
        if recipe:
            return _as(recipe.forward(x, w, wide or x.dtype), x.dtype)
        if recipe is None:
            out, recipe = _MapLaunch.capture(_MAP, key, lambda hook: kernels_forward.hedgehog_map_fused(
                x, w, out_dtype=wide, precision=_map_precision(x.device), launch=hook))
            _MAP_RECIPES.put(key, recipe)
            return _as(out, x.dtype)
    return _as(kernels_forward.hedgehog_map_fused(x, w, out_dtype=wide, precision=_map_precision(x.device),
                                                  launch=_keyed(_MAP, key)), x.dtype)


class _MapLaunch:
    """One map kernel's launch (hedgehog_map_fused's or hedgehog_map_backward's) for one launch key (issue 31's host
    time): its KeyedLaunch and the arguments the key fixes (the rows R and every stride: x's, dout's and the fresh
    outputs' row views, W's), from the key's first launch; a call makes the row views and the outputs as
    kernels_forward's wrappers do and launches (no sizes, blocks, argument tuple, options or key lookup a call)."""

    __slots__ = ("launch", "tail", "width", "parts")

    @classmethod
    def capture(cls, launcher: CachedLaunch, key, run):
        """(``run(hook)``'s result, the key's _MapLaunch or False): ``run`` launches through ``hook`` (by ``key``)."""
        seen = []

        def hook(grid, args, options):
            seen.append((grid, args, options))
            launcher.run(key, grid, args, options)
        out = run(hook)
        if len(seen) != 1:  # (no rows: nothing launched)
            return out, False
        grid, args, options = seen[0]
        self = cls()
        tensors = 3 if launcher is _MAP else 5  # (the wrappers' tensor arguments first)
        self.launch, self.tail = KeyedLaunch(launcher, key, grid, options), args[tensors:]
        self.width = args[2].shape[-1]  # (the map's 2F: the output's last dimension, dout's in the backward)
        self.parts = None if launcher is _MAP else tuple(args[4].shape)  # (dW's partial sums)
        return out, self

    def forward(self, x, weight, out_dtype):
        heads, dk = x.shape[-2], x.shape[-1]
        out = torch.empty(*x.shape[:-1], self.width, dtype=out_dtype, device=x.device)
        self.launch((x.reshape(-1, heads, dk), weight, out.view(-1, heads, self.width), *self.tail))
        return out

    def backward(self, x, weight, dout, dx_dtype):
        heads, dk, f = x.shape[-2], x.shape[-1], weight.shape[-1]
        dx = torch.empty(*x.shape, dtype=dx_dtype, device=x.device)
        dwp = torch.empty(self.parts, dtype=torch.float32, device=x.device)
        self.launch((x.reshape(-1, heads, dk), weight, dout.reshape(-1, heads, self.width), dx.view(-1, heads, dk),
                     dwp, *self.tail))
        return dx, dwp.sum(0)[:, :dk, :f]


_MAP_RECIPES = LRU(256)  # a map launch's key -> its _MapLaunch (False: the keyed general path each call)


def _as(t: torch.Tensor, dtype) -> torch.Tensor:
    """``t.to(dtype)``, the tensor itself where it has that dtype already (what .to returns there, without its
    dispatch: ~1-2 us of host time a call)."""
    return t if t.dtype == dtype else t.to(dtype)


class _HedgehogMap(torch.autograd.Function):
    """Hedgehog's map by the one-pass kernels: hedgehog_map_fused forward (x and W saved, not the features),
    hedgehog_map_backward's recomputation backward (dx in x's dtype, dW summed in float32, in W's dtype)."""

    @staticmethod
    def forward(ctx, x, weight, key):
        ctx.save_for_backward(x, weight)
        ctx.map_key = key
        return _fused_map(x, weight, key)

    @staticmethod
    def backward(ctx, dout):
        x, weight = ctx.saved_tensors
        wide = torch.float32 if dispatch.interpreted(x.device) else None
        key = ctx.map_key
        rows, warps, programs = _MAP_BWD_BLOCKS.memo(key, lambda: _map_bwd_launch(x, weight))
        w = _as(weight, torch.float32)
        if key is not None:  # (dout: the core's fresh dq or dk, its layout in the key all the same)
            key = (key, dout.dtype, dout.stride(), dout.data_ptr() & 15 == 0)
        recipe = _MAP_RECIPES.get(key) if key is not None and tiles_launch.OP_RECIPES else None
        if recipe:
            dx, dw = recipe.backward(x, w, dout, wide or x.dtype)
        else:
            def run(hook):
                return kernels_forward.hedgehog_map_backward(x, w, dout, programs=programs, dx_dtype=wide, rows=rows,
                                                             warps=warps, precision=_map_precision(x.device),
                                                             launch=hook)
            if recipe is None and key is not None and tiles_launch.OP_RECIPES:
                (dx, dw), recipe = _MapLaunch.capture(_MAP_BWD, key, run)
                _MAP_RECIPES.put(key, recipe)
            else:
                dx, dw = run(_keyed(_MAP_BWD, key))
        return (_as(dx, x.dtype) if ctx.needs_input_grad[0] else None,
                _as(dw, weight.dtype) if ctx.needs_input_grad[1] else None, None)


def _map_bwd_launch(x, weight) -> tuple[int, int, int]:
    """(rows, warps, programs) of the map's backward for x and weight."""
    rows, warps = _map_bwd_block(x.shape[-1], weight.shape[-1])
    heads, blocks = x.shape[-2], -(-x.numel() // (x.shape[-2] * x.shape[-1] * rows))  # (blocks of rows a head)
    programs = max(1, min(blocks, -(-configs.HEDGEHOG_MAP_BWD_PROGRAMS // heads)))  # (row ranges a head)
    return rows, warps, programs


def hedgehog_map(x: torch.Tensor, weight: torch.Tensor, fused: bool | None = None, key=None) -> torch.Tensor:
    """Hedgehog's feature map [softmax(x W_h), softmax(-x W_h)] (x (..., Hqk, Dk), W (Hqk, Dk, F)),
    computed in float32 and returned in x's dtype (values in [0, 1]).

    ``fused`` (None: configs.HEDGEHOG_FUSED_MAP where nothing is recorded, configs.HEDGEHOG_FUSED_MAP_GRAD where a
    gradient is): the one-pass kernels (kernels_forward.hedgehog_map_fused, and under autograd _HedgehogMap with
    hedgehog_map_backward) in eager mode where kernels serve x's device; else (and under torch.compile, functorch
    transforms, modes) torch's passes. ``key``: the map's launch key on the eager paths (linear_attention's call key
    with which map and its precision: it fixes every launch argument's specialization), or None."""
    mode = dispatch.eager_mode(x, weight)
    if mode != "op" and dispatch.backend_for(x.device) == "kernel" and _fused_map_fits(x.shape[-1], weight.shape[-1]):
        on = fused if fused is not None else \
            configs.HEDGEHOG_FUSED_MAP if mode == "direct" else configs.HEDGEHOG_FUSED_MAP_GRAD
        if key is not None:
            key = (key, _map_precision(x.device))
        if on and mode == "direct":
            return _fused_map(x, weight, key)
        if on:
            return _HedgehogMap.apply(x, weight, None) if key is None else eager.apply(_HedgehogMap, x, weight, key)
    proj = torch.einsum("...hd,hdf->...hf", x.float(), weight.float())
    return torch.cat([proj.softmax(-1), (-proj).softmax(-1)], dim=-1).to(x.dtype)


# --------------------------------------------------------------------------------------------
# the core's custom ops


def _forward_impl(q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk, final_state, keep_linear, key=None):
    p = _PLANS.memo(key, lambda: plan(q, v, g, feature, chunk or None))
    return launch.forward(p, q, k, v, g, beta, d_skip, z, h0, scale, feature, final_state=final_state,
                          keep_linear=keep_linear, key=key)


# The eager host path (issue 31): a CUDA call's launch key (its signature: tiles.launch.signature of its
# tensors with the arguments the checks and plans read) finds the checks' result in _CHECKED, the plan
# in _PLANS and each kernel by key (CachedLaunch.run); plans read configs at a key's first call, and every key holds
# tiles.switches.generation, so a plan made under other switches (switches.patched) is never served
_CHECKED = LRU(256)  # a call's key -> what its checks returned
_PLANS = LRU(256)  # a launch key -> its plan


def _none_to_empty(t, like):
    return t if t is not None else like.new_empty(0, dtype=torch.float32)


def _forward_outputs(q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk, final_state, keep_linear, key=None):
    """The forward op's outputs (o, final state or an empty tensor, o before D and z or an empty tensor)."""
    o, ht, o_lin = _forward_impl(q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk, final_state, keep_linear,
                                 key=key)
    return o, _none_to_empty(ht, v), _none_to_empty(o_lin, v)


@torch.library.custom_op("tilecore::linear_attention_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                beta: Optional[torch.Tensor], d_skip: Optional[torch.Tensor], z: Optional[torch.Tensor],
                h0: Optional[torch.Tensor], scale: float, feature: int, chunk: int, final_state: bool,
                keep_linear: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward_outputs(q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk, final_state, keep_linear)


@_forward_op.register_fake
def _(q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk, final_state, keep_linear):
    B, N, H, Dv = v.shape
    rows = launch.feature_rows(feature, q.shape[-1])
    ht = (launch.gluon_forward.empty_state(B, H, rows, Dv, v.device, beta is not None) if final_state
          else v.new_empty(0, dtype=torch.float32))
    o_lin = v.new_empty((B, N, H, Dv), dtype=torch.float32) if keep_linear else v.new_empty(0, dtype=torch.float32)
    return v.new_empty((B, N, H, Dv)), ht, o_lin


@torch.library.custom_op("tilecore::linear_attention_backward", mutates_args=())
def _backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                 beta: Optional[torch.Tensor], h0: Optional[torch.Tensor], o_lin: torch.Tensor,
                 ht: Optional[torch.Tensor], dht: Optional[torch.Tensor], scale: float, feature: int,
                 chunk: int, native: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta, dh0), float32, but dq, dk, dv in q's, k's, v's dtypes where ``native`` (the
    kernels store them so: no cast after); do in any float dtype (read as it is)."""
    return _backward_impl(do, q, k, v, g, beta, h0, o_lin, ht, dht, scale, feature, chunk, native)


def _backward_impl(do, q, k, v, g, beta, h0, o_lin, ht, dht, scale, feature, chunk, native, key=None):
    """``key``: the backward's launch key (eager.backward_key: the forward's key and the gradients' layouts), which
    with ``native`` fixes every launch argument's specialization: the plans kept per key, the kernels launched by
    it (KEYED_BACKWARD); None: planned and launched plainly."""
    if key is not None:  # (a backward under other switches than its forward's is planned under its own)
        key = (key, native, generation())
    p, gla = _BACKWARD_PLANS.memo(key, lambda: _backward_plans(q, v, g, beta, feature, chunk))
    if gla:  # per-channel decay: configs_gla_bwd.GLA_BWD_PATH
        grads = kernels_backward_gla.run(p, do, q, k, v, g, h0, ht, dht, scale, native, chunk or None)
    else:
        grads = launch.backward(p, do, q, k, v, g, beta, h0, o_lin, ht, dht, scale, feature, native=native, key=key)
    if key is not None:  # (an eager backward: its caller takes None for an absent gradient, no empty tensor made)
        return grads
    return tuple(_none_to_empty(t, v) for t in grads)


_BACKWARD_PLANS = LRU(256)  # a backward's launch key -> (its plan, whether the GLA backward takes it)


def _backward_plans(q, v, g, beta, feature, chunk):
    p = plan(q, v, g, feature, chunk or None)
    if kernels_backward_gla.takes(p, q, v, g, beta, feature):
        return p, True
    return launch.backward_plan(p, q, v, g, feature, chunk or None), False


@_backward_op.register_fake
def _(do, q, k, v, g, beta, h0, o_lin, ht, dht, scale, feature, chunk, native):
    def like(t, own=False):
        if t is None:
            return v.new_empty(0, dtype=torch.float32)
        return t.new_empty(t.shape, dtype=t.dtype if own else torch.float32)
    return like(q, native), like(k, native), like(v, native), like(g), like(beta), like(h0)


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk, final_state, keep_linear = inputs
    o, ht, o_lin = output
    ctx.save_for_backward(q, k, v, g, beta, d_skip, z, h0, o, ht if final_state else None,
                          o_lin if keep_linear else None)
    ctx.options = (scale, feature, chunk)


def _backward(ctx, do, dht, _do_lin):
    q, k, v, g, beta, d_skip, z, h0, o, ht, o_lin = ctx.saved_tensors
    scale, feature, chunk = ctx.options
    # do goes to the kernels in its own dtype (they read it as it is); the gate's and D's terms take float32
    if do is None:
        du = torch.zeros(o.shape, dtype=o.dtype, device=o.device)
    else:
        du = do.float() if z is not None else do
    # o before D and z, in float32: for the gate's gradient and Based's decay gradient (do . o) only;
    # elsewhere the backward never reads it, so it is not made (a pass over o saved)
    based_decay = feature == BASED and g is not None
    lin = (o_lin if o_lin is not None else o).float() if z is not None or based_decay else None
    dz = dd = None
    if z is not None:
        u = lin + d_skip.float() * v.float() if d_skip is not None else lin
        zf = z.float()
        sz = torch.sigmoid(zf)
        dz = (du * u * sz * (1 + zf * (1 - sz))).to(z.dtype)
        du = du * zf * sz
    if d_skip is not None:
        dd = (du.float() * v.float()).sum((0, 1)).to(d_skip.dtype)
    if ht is None or dht is None or dht.numel() == 0:
        dht, ht = None, None
    lin_in = lin if based_decay else o.new_empty(0, dtype=torch.float32)
    # dq, dk, dv straight in the inputs' dtypes from the kernels (no float32 buffers cast here), but where D's
    # term is added to dv after them
    native = configs.BWD_NATIVE_GRADS and d_skip is None
    # eager with nothing to record: the implementation (no custom op's host time); traced or create_graph: the op
    key = eager.backward_key(ctx, du, dht) if KEYED_BACKWARD else None
    dq, dk, dv, dg, dbeta, dh0 = eager.backward_call(_backward_op, _backward_impl, du, q, k, v, g, beta, h0, lin_in,
                                                     ht, dht, scale, feature, chunk, native, key=key)
    if d_skip is not None:
        dv = dv + du.float() * d_skip.float()

    def cast(grad, t):
        return None if t is None else _as(grad, t.dtype)
    return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dg, g), cast(dbeta, beta), dd, dz, cast(dh0, h0),
            None, None, None, None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)

# eager calls that record a gradient: the custom op's autograd without its host time (~100 us a call). Over
# _forward_impl, whose absent outputs are None (the op's schema needs tensors: two empty allocations a call
# there); _setup_context saves them only where final_state / keep_linear say they exist, and their gradients
# arrive as None
_LinearAttentionFunction = eager.eager_autograd("_LinearAttentionFunction", _forward_impl, _setup_context,
                                                _backward)


def _run(q, k, v, g, beta, d_skip, z, h0, scale: float, feature: int, chunk, final_state: bool, key=None):
    """(o, final state or None) of the core: its implementation (eager, nothing to record), its autograd
    Function (eager, a gradient to record) or its custom op (torch.compile, modes, subclasses); ``key``:
    the call's launch key (None: none)."""
    tensors = (q, k, v, g, beta, d_skip, z, h0)
    mode = dispatch.eager_mode(*tensors)  # (one look at the modes and tensors a call)
    if mode == "direct":
        o, ht, _ = _forward_impl(q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk or 0, final_state, False,
                                 key=key)
        return o, ht
    grad = mode == "autograd" or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))
    # o before D and z in float32: the gate's gradient needs it, and Based's decay gradient (do . o: o
    # rounded to bf16 there gave 2.4e-3 relative error in dg)
    keep = grad and (d_skip is not None or z is not None or (feature == BASED and g is not None))
    # eager: the autograd Function over the implementation; torch.compile, fake tensors, modes: the op
    # (keep_linear changes the forward kernel's outputs: part of the launch key)
    args = (q, k, v, g, beta, d_skip, z, h0, scale, feature, chunk or 0, final_state, keep)
    if mode == "autograd":
        o, ht, _ = eager.apply(_LinearAttentionFunction, None if key is None else _RECORDED_KEY(key, "recorded", keep),
                               *args)
    else:
        o, ht, _ = _forward_op(*args)
    return o, (ht if final_state else None)


# --------------------------------------------------------------------------------------------
# linear_attention


def _weights_items(weights) -> tuple | None:
    """Hedgehog's feature_weights as items of a call's key: (W,) or (W_q, W_k); None (not keyed) for anything
    else (the checks say what is wrong)."""
    if type(weights) is torch.Tensor:
        return (weights,)
    if type(weights) in (tuple, list) and len(weights) == 2 and all(type(w) is torch.Tensor for w in weights):
        return tuple(weights)
    return None


def _prepare(op, q, k, v, feature_map, feature_weights, decay, scale, initial_state, step: bool = False,
             apply_map: bool = True):
    """Checks; returns (q, k, feature, scale) with Hedgehog's features applied (``apply_map``; else q and k as
    given: a keyed call maps them itself)."""
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"{op}: feature_map must be None, 'based' or 'hedgehog'; got {feature_map!r}")
    B, N, Hqk, Dk = q.shape
    H, Dv = v.shape[2], v.shape[3]
    if feature_map == "based" and Dk > configs.MAX_BASED_DIM:
        raise ValueError(f"{op}: feature_map='based' takes q/k head_dim up to {configs.MAX_BASED_DIM} (its features "
                         f"are 1 + D + D^2); got {Dk}")
    if feature_map != "hedgehog" and feature_weights is not None:
        raise ValueError(f"{op}: feature_weights are Hedgehog's (feature_map='hedgehog'); got "
                         f"feature_map={feature_map!r}")
    features = Dk
    if feature_map == "hedgehog":
        wq, wk = _hedgehog_weights(op, feature_weights, Hqk, Dk, q.device)
        features = 2 * wq.shape[2]
    if decay is not None:
        if not isinstance(decay, torch.Tensor) or decay.device != q.device or not decay.dtype.is_floating_point:
            raise TypeError(f"{op}: decay must be a floating-point tensor of log decays on {q.device}; "
                            f"got {_shape(decay)}")
        scalar, channel = (B, N, H), (B, N, H, features)
        if feature_map == "based" and decay.dim() == 4:
            raise ValueError(f"{op}: feature_map='based' takes a scalar decay {scalar} (per-channel decay would "
                             f"be per expanded feature); got {tuple(decay.shape)}")
        if tuple(decay.shape) not in (scalar, channel):
            raise ValueError(f"{op}: decay (log decay) must be {scalar} (one per batch, token, head) or {channel} "
                             f"(per key feature); got {tuple(decay.shape)}"
                             + (" (step: the token axis of 1 may be left out)" if step else ""))
    rows = 1 + features + features * features if feature_map == "based" else features
    if initial_state is not None:
        _tensor(op, "initial_state" if not step else "state", initial_state, q.device, (B, H, rows, Dv))
    if scale is None:
        scale = 1.0 if feature_map == "hedgehog" else Dk ** -0.5
    else:
        scale = _real(op, "scale", scale)
    if feature_map == "hedgehog" and apply_map:
        q, k = hedgehog_map(q, wq), hedgehog_map(k, wk)
    return q, k, (BASED if feature_map == "based" else IDENTITY), scale


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, feature_map: str | None = None,
                     feature_weights=None, decay: torch.Tensor | None = None, scale: float | None = None,
                     initial_state: torch.Tensor | None = None, return_final_state: bool = False,
                     chunk_size: int | None = None):
    """Causal linear attention, in the chunked form: o_t = scale phi(q_t)^T S_t with the state
    S_t = diag(exp(g_t)) S_{t-1} + phi(k_t) v_t^T (S_0 = initial_state, else zeros).

    Layout (batch, tokens, heads, head_dim), as flash-linear-attention's: q, k (B, N, Hqk, Dk) and
    v (B, N, H, Dv), H a multiple of Hqk (head h reads q/k head h // (H // Hqk)); (B, H, N, D)
    tensors go in as ``x.transpose(1, 2)`` (a view: any strides are taken). float16, bfloat16 or
    float32; any N; Dk and Dv from 1 to 256. Returns o (B, N, H, Dv) in v's dtype, and with
    ``return_final_state=True`` also the final state (B, H, F, Dv), float32.

    * ``feature_map``: None (phi(x) = x, F = Dk); "based": Based's Taylor map, so that
      scale phi(q).phi(k) = 1 + s + s^2 / 2 with s = scale q.k, for Dk <= 16 (F = 1 + Dk + Dk^2,
      in the kernels, never written to memory; the state's rows are [1, Dk, Dk x Dk]); "hedgehog":
      [softmax(x W), softmax(-x W)] with ``feature_weights`` W (Hqk, Dk, F/2), one tensor for q and
      k or a pair (W_q, W_k) (the map by one-pass kernels, with and without autograd, where Dk x F/2 <= 128 x 64,
      else and under torch.compile by torch's ops; then the same kernels; differentiable in W).
    * ``decay``: log decays g (natural log, normally <= 0; exp(g) multiplies the state), (B, N, H)
      (one per head and token: Mamba-2's SSD, simple GLA, RetNet) or (B, N, H, F) (per key feature:
      GLA). Values below -100 count as -100 (exp(-100) ~ 4e-44: -inf resets the state).
    * ``scale``: defaults to Dk^-0.5 (flash-linear-attention's), and 1 for Hedgehog.
    * ``chunk_size``: the kernels' chunk, 16, 32 or 64 (None: 64, per-channel decay 16); results
      agree across chunks up to rounding.

    No normalization (flash-linear-attention's ``normalize``/``use_norm``): append a column of
    ones to v and divide by it. Differentiable in q, k, v, decay, initial_state (and Hedgehog's W).
    CUDA tensors run the Triton kernels; CPU tensors the same kernels under TRITON_INTERPRET=1, else
    the chunked form on torch's CPU ops in float32.
    """
    op = "linear_attention"
    # a CUDA call seen before skips the checks (a tensor scale is read each call: never keyed). Hedgehog's weights
    # join the key where KEYED_HEDGEHOG says (their maps then run each call, by key), else it is never keyed
    weights = () if feature_weights is None else _weights_items(feature_weights) if KEYED_HEDGEHOG else None
    key = _FORWARD_KEY(q, k, v, decay, initial_state, feature_map, scale, return_final_state is True,
                    return_final_state is False, chunk_size, *weights) \
        if weights is not None and not isinstance(scale, torch.Tensor) else None
    if key is not None:  # (and the switches it is planned under: tiles.switches.generation)
        key = _CALL_KEY("linear_attention", generation(), key)
        if tiles_launch.OP_RECIPES and tiles_launch.FORWARD_RECIPES and not weights:  # the key's kept Gluon
            # launch (its second call on): no checks, plan or flags
            prepared = launch.GLUON_FORWARDS.get(key)
            if prepared and dispatch.eager_mode(q, k, v, decay, initial_state) == "direct":
                o, ht = prepared(q, k, v, initial_state)
                return (o, ht) if return_final_state else o

    def check():
        _check_qkv(op, q, k, v)
        _check_chunk(op, chunk_size)
        if not isinstance(return_final_state, bool):
            raise TypeError(f"{op}: return_final_state must be True or False; got {return_final_state!r}")
        return _prepare(op, q, k, v, feature_map, feature_weights, decay, scale, initial_state,
                        apply_map=key is None)

    if key is None:
        q, k, feature, scale = check()
    else:
        feature, scale = _CHECKED.memo(key, lambda: check()[2:])
        if weights:  # (the checks passed: one weight or a pair of them, Hedgehog's)
            wq, wk = weights if len(weights) == 2 else weights * 2
            q, k = hedgehog_map(q, wq, key=(key, "q")), hedgehog_map(k, wk, key=(key, "k"))
    o, ht = _run(q, k, v, decay, None, None, None, initial_state, scale, feature, chunk_size, return_final_state,
                 key=key)
    return (o, ht) if return_final_state else o


# --------------------------------------------------------------------------------------------
# mamba2_chunk_scan


def _check_mamba(op, x, dt, A, B, C, D, z, dt_bias, state, state_name: str, step: bool):
    lead = "(batch, heads, headdim)" if step else "(batch, seqlen, nheads, headdim)"
    if not isinstance(x, torch.Tensor) or x.dim() != (3 if step else 4):
        raise ValueError(f"{op}: x must be {lead}; got {_shape(x)}")
    dispatch.backend_for(x.device)
    if x.dtype not in DTYPES:
        raise TypeError(f"{op}: x must be one of {', '.join(map(_name, DTYPES))}; got {_name(x.dtype)}")
    lead_shape = tuple(x.shape[:-2])
    h, p = x.shape[-2], x.shape[-1]
    if not isinstance(B, torch.Tensor) or B.dim() != x.dim() or tuple(B.shape[:-2]) != lead_shape:
        raise ValueError(f"{op}: B must be {'(batch, ngroups, dstate)' if step else '(batch, seqlen, ngroups, dstate)'}"
                         f" with x's {lead_shape}; got {_shape(B)}")
    g, s = B.shape[-2], B.shape[-1]
    if not isinstance(C, torch.Tensor) or C.shape != B.shape:
        raise ValueError(f"{op}: C must have B's shape {tuple(B.shape)}; got {_shape(C)}")
    if g == 0 or h % g != 0:
        raise ValueError(f"{op}: nheads ({h}) must be a multiple of ngroups ({g})")
    if B.dtype != x.dtype or C.dtype != x.dtype:
        raise TypeError(f"{op}: B and C must have x's dtype ({_name(x.dtype)}); got {_name(B.dtype)}, {_name(C.dtype)}")
    for name, d in (("headdim", p), ("dstate", s)):
        if not 1 <= d <= configs.MAX_HEAD_DIM:
            raise ValueError(f"{op}: {name} must be from 1 to {configs.MAX_HEAD_DIM}; got {d}")
    _tensor(op, "dt", dt, x.device, lead_shape + (h,))
    _tensor(op, "A", A, x.device, (h,))
    if D is not None:
        if not isinstance(D, torch.Tensor) or tuple(D.shape) not in ((h,), (h, p)):
            raise ValueError(f"{op}: D must be ({h},) or ({h}, {p}); got {_shape(D)}")
        _tensor(op, "D", D, x.device, tuple(D.shape))
    if z is not None:
        _tensor(op, "z", z, x.device, tuple(x.shape))
        if z.dtype != x.dtype:
            raise TypeError(f"{op}: z must have x's dtype ({_name(x.dtype)}); got {_name(z.dtype)}")
    if dt_bias is not None:
        _tensor(op, "dt_bias", dt_bias, x.device, (h,))
    if state is not None:
        _tensor(op, state_name, state, x.device, (x.shape[0], h, p, s))


class _MambaStep:
    """mamba2_step for one launch key by its two kernels (issue 31's host time): the dt kernel's and the
    step kernel's KeyedLaunch and every launch argument the key fixes (strides, sizes, dt_limit), made from its
    keyed call's own launches; a call then allocates dt_eff, g and y and launches. Made only where that call took
    the kernels (mamba_dt.fits, no upcast, a kernel plan); ``serves()``: the dt kernel's switches as they were
    (a switch turned mid-process sends the key back to the general path)."""

    __slots__ = ("dt_launch", "dt_tail", "step", "step_tail", "d_kind", "shapes", "clamp")

    @classmethod
    def of(cls, key, p, state, x, dt, A, B, C, D, d_skip, z, dt_bias, dt_limit, g, dt_eff, y):
        if p.path == "cpu" or p.config["upcast"] or y.dtype != x.dtype or x.shape[0] * x.shape[1] == 0:
            return False
        self = cls()
        self.clamp = mamba_dt.MAMBA_DT_CLAMP
        grid, self.dt_tail, options = mamba_dt.launch_parts(dt, dt_bias, dt_limit, self.clamp)
        self.dt_launch = KeyedLaunch(mamba_dt._MAMBA_DT, (key, self.clamp), grid, options)
        s0, s1, s2, s3 = state.stride()
        _, grid, args, kw = launch.step_call(p, C, B, x, g, dt_eff, d_skip, z, state, y, 1.0, IDENTITY,
                                             (s0, s1, s3, s2))
        self.step = KeyedLaunch(launch._STEP, key, grid, kw)
        self.step_tail = args[9:]  # (the nine tensors first: step_call's order)
        # D's float32 view as the general path makes it: none, (H,) expanded to (H, P), or (H, P)
        self.d_kind = 0 if D is None else (1 if D.dim() == 1 else 2)
        self.shapes = ((dt.numel(), -(-dt.numel() // 4) * 4), tuple(x.shape))  # ((B H, g's offset), y's shape)
        return self

    def serves(self) -> bool:
        return mamba_dt.MAMBA_DT_KERNEL and mamba_dt.MAMBA_DT_CLAMP == self.clamp

    def __call__(self, state, x, dt, A, B, C, D, z, dt_bias):
        # dt_eff and g (float32 (B, H), contiguous) in one allocation (the kernels take pointers and the key's
        # strides), g at a 16-byte aligned offset: a raw block of the caching allocator by address where both launches
        # go the kept way (tiles.launch.scratch: RAW_SCRATCH with MAMBA_STEP_SCRATCH; given back once both are queued),
        # else a tensor (g by address where both are kept, else a view)
        size, offset = self.shapes[0]
        block = scratch(4 * (offset + size), (self.dt_launch, self.step)) if MAMBA_STEP_SCRATCH else None
        try:
            if block is not None:
                dt_eff, g = block, block + 4 * offset
            else:
                dt_eff = x.new_empty(offset + size, dtype=torch.float32)  # (x's device: the key's)
                g = dt_eff.data_ptr() + 4 * offset if KeyedLaunch.all_kept(self.dt_launch, self.step) \
                    else dt_eff[offset:]
            self.dt_launch((dt, A if dt_bias is None else dt_bias, A, dt_eff, g, *self.dt_tail))
            y = x.new_empty(self.shapes[1])  # (x's dtype and device: of() takes no other)
            d_skip = x if self.d_kind == 0 else (D.float()[:, None].expand(self.shapes[1][1:]) if self.d_kind == 1
                                                 else D.float())
            self.step((C, B, x, g, dt_eff, d_skip, x if z is None else z, state, y, *self.step_tail))
        finally:
            release(block)
        return y


_MAMBA_STEPS = LRU(256)  # a step's launch key -> its _MambaStep (False: the general path)

# _MambaStep's dt_eff and g (internal to its two launches) as one raw block of the caching allocator where both go the
# kept way (under tiles.launch.RAW_SCRATCH); the same launches and bits. Read each call; False: a tensor. On: float64
# checks (y, the state) and the same bits on the H100, 0.90x the host time of off, 6 of 7 rounds
# (notes/host/runs/hg_ab42e_run6_session42_h100.txt)
MAMBA_STEP_SCRATCH = True


def _mamba_dt(dt, dt_bias, dt_softplus: bool, dt_limit) -> torch.Tensor:
    """mamba's dt in float32: + dt_bias, softplus (linear past 20, as F.softplus), clamped to dt_limit."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    lo, hi = dt_limit
    if lo > float("-inf") or hi < float("inf"):
        dt = dt.clamp(lo, hi)
    return dt


def _check_limit(op, dt_limit):
    if not (isinstance(dt_limit, (tuple, list)) and len(dt_limit) == 2
            and all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in dt_limit)
            and dt_limit[0] <= dt_limit[1]):
        raise ValueError(f"{op}: dt_limit must be a pair (min, max) of real numbers; got {dt_limit!r}")


def mamba2_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *,
                      chunk_size: int = 256, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                      dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                      initial_states: torch.Tensor | None = None, return_final_states: bool = False,
                      dt_limit=(0.0, float("inf"))):
    """Mamba-2's SSD scan with the semantics of mamba_ssm's ``mamba_chunk_scan_combined``.

    x (batch, seqlen, nheads, headdim); dt (batch, seqlen, nheads); A (nheads,); B, C (batch,
    seqlen, ngroups, dstate) with nheads a multiple of ngroups (grouped B/C); D (nheads,) or
    (nheads, headdim): the skip D x; z (batch, seqlen, nheads, headdim): the gate y * silu(z);
    dt_bias (nheads,); dt_softplus; dt_limit (mamba's clamp of dt, (0, inf) by default);
    initial_states (batch, nheads, headdim, dstate). Per token dt = clamp(softplus?(dt + dt_bias)),
    h_t = exp(dt A) h_{t-1} + dt x_t B_t^T, y_t = (C_t h_t + D x_t) * silu(z_t). Returns y (x's
    shape and dtype) and with ``return_final_states=True`` the final states (batch, nheads,
    headdim, dstate), float32. x, B, C, z share a dtype (float16, bfloat16, float32); dt, A, D,
    dt_bias any float dtype (used in float32). headdim and dstate up to 256.

    ``chunk_size`` only changes rounding (as in mamba_ssm): the kernels take chunks of
    min(64, the largest power of two <= chunk_size), at least 16. Differentiable in every tensor.
    """
    op = "mamba2_chunk_scan"
    _check_mamba(op, x, dt, A, B, C, D, z, dt_bias, initial_states, "initial_states", step=False)
    _check_limit(op, dt_limit)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be a positive int; got {chunk_size!r}")
    chunk = max(min(configs.CHUNKS), min(max(configs.CHUNKS), 1 << (chunk_size.bit_length() - 1)))
    dt_eff = _mamba_dt(dt, dt_bias, dt_softplus, dt_limit)
    g = dt_eff * A.float()
    h, p = x.shape[2], x.shape[3]
    d_skip = None if D is None else (D.float()[:, None].expand(h, p) if D.dim() == 1 else D.float())
    h0 = None if initial_states is None else initial_states.transpose(-1, -2)  # (b, h, dstate, headdim): a view
    y, ht = _run(C, B, x, g, dt_eff, d_skip, z, h0, 1.0, IDENTITY, chunk, bool(return_final_states))
    if return_final_states:
        return y, ht.transpose(-1, -2).contiguous()  # (with beta ht is laid out (b, h, p, s): no copy)
    return y


# --------------------------------------------------------------------------------------------
# decode steps


@torch.library.custom_op("tilecore::linear_attention_step", mutates_args=("state",))
def _step_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
             beta: Optional[torch.Tensor], d_skip: Optional[torch.Tensor], z: Optional[torch.Tensor],
             state: torch.Tensor, scale: float, feature: int, state_transposed: bool) -> torch.Tensor:
    return _step_impl(q, k, v, g, beta, d_skip, z, state, scale, feature, state_transposed)


@_step_op.register_fake
def _(q, k, v, g, beta, d_skip, z, state, scale, feature, state_transposed):
    return v.new_empty(v.shape)


def _step_impl(q, k, v, g, beta, d_skip, z, state, scale, feature, state_transposed, key=None):
    p = _PLANS.memo(key, lambda: plan(q[:, None], v[:, None], None, feature))
    if state_transposed and p.path != "cpu":  # the kernel reads the (B, H, F, Dv) view by strides: no view op
        s0, s1, s2, s3 = state.stride()
        return launch.step(p, q, k, v, g, beta, d_skip, z, state, scale, feature, key=key,
                           state_strides=(s0, s1, s3, s2))
    s = state.transpose(-1, -2) if state_transposed else state
    return launch.step(p, q, k, v, g, beta, d_skip, z, s, scale, feature, key=key)


def _run_step(q, k, v, g, beta, d_skip, z, state, scale, feature, state_transposed, key=None):
    tensors = (q, k, v, g, beta, d_skip, z, state)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError("the decode steps update their state in place and record no gradient: call them under "
                           "torch.no_grad() (or with inputs that do not require grad); train with the chunked op")
    if dispatch.plain_eager(*tensors):
        return _step_impl(q, k, v, g, beta, d_skip, z, state, scale, feature, state_transposed, key=key)
    return _step_op(q, k, v, g, beta, d_skip, z, state, scale, feature, state_transposed)


def linear_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, *,
                          feature_map: str | None = None, feature_weights=None, decay: torch.Tensor | None = None,
                          scale: float | None = None) -> torch.Tensor:
    """One decoding step of ``linear_attention``: the state (B, H, F, Dv) is updated in place,
    S <- diag(exp(g)) S + phi(k) v^T, and o = scale phi(q)^T S is returned.

    q, k (B, Hqk, Dk) and v (B, H, Dv), or with a token axis of 1 ((B, 1, Hqk, Dk) ...: o then has it
    too); decay (B, H) or (B, H, F) (or with the token axis); the state any float dtype and strides
    (float32 math). Feature maps, scale and the state's layout as in ``linear_attention`` (whose final
    state is this step's state). Inference only (no gradient).
    """
    op = "linear_attention_step"
    key = _STEP_KEY(q, k, v, state, decay, feature_map, scale) \
        if feature_weights is None and not isinstance(scale, torch.Tensor) else None
    if key is not None:  # a CUDA call seen before: its checks passed (the reshapes below read shapes alone)
        key = ("linear_attention_step", generation(), key)
        if tiles_launch.OP_RECIPES:  # the key's kept launch (its second call on): no checks, views or plan
            prepared = _LA_STEPS.get(key)
            if prepared and dispatch.eager_mode(q, k, v, decay, state) == "direct":
                return prepared(q, k, v, decay, state)
        checked = _CHECKED.get(key)
        if checked is not None:
            g = None if decay is None else (decay if checked[2] else decay[:, 0])
            o = _run_step(q[:, 0] if checked[0] else q, k[:, 0] if checked[0] else k, v[:, 0] if checked[0] else v,
                          g, None, None, None, state, checked[1][1], checked[1][0], False, key=key)
            return o[:, None] if checked[0] else o
    token_axis = isinstance(q, torch.Tensor) and q.dim() == 4
    if token_axis:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.shape[1] != 1:
                raise ValueError(f"{op}: with a token axis, q, k and v must be (B, 1, heads, head_dim); got {name} "
                                 f"of shape {_shape(t)}")
        q4, k4, v4 = q, k, v
    else:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                raise ValueError(f"{op}: q, k and v must be (B, heads, head_dim) (or (B, 1, heads, head_dim)); got "
                                 f"{name} of shape {_shape(t)}")
        q4, k4, v4 = q[:, None], k[:, None], v[:, None]
    _check_qkv(op, q4, k4, v4, "q, k (B, Hqk, Dk), v (B, H, Dv), H a multiple of Hqk")
    decay4 = decay
    decay_axis_added = isinstance(decay, torch.Tensor) and (decay.dim() == 2 or (
        decay.dim() == 3 and tuple(decay.shape) != (v4.shape[0], 1, v4.shape[2])))
    if decay_axis_added:
        decay4 = decay[:, None]  # no token axis: (B, H) or (B, H, F)
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"{op}: state must be a torch.Tensor; got {type(state).__name__}")
    q4, k4, feature, scale = _prepare(op, q4, k4, v4, feature_map, feature_weights, decay4, scale, state, step=True)
    if key is not None:  # the checks passed: (token axis, (feature, scale), decay's axis added)
        _CHECKED.put(key, (token_axis, (feature, scale), decay_axis_added))
    g = None if decay4 is None else decay4[:, 0]
    o = _run_step(q4[:, 0], k4[:, 0], v4[:, 0], g, None, None, None, state, scale, feature, False, key=key)
    if key is not None and tiles_launch.OP_RECIPES and key not in _LA_STEPS and _PLANS.get(key) is not None:
        _LA_STEPS.put(key, _LaStep.of(key, _PLANS.get(key), (q, k, v, decay), (q4[:, 0], k4[:, 0], v4[:, 0], g),
                                      state, scale, feature, o[:, None] if token_axis else o))
    return o[:, None] if token_axis else o


class _LaStep:
    """linear_attention_step for one launch key by its kernel (issue 31's host time): the step kernel's
    KeyedLaunch and every argument the key fixes (strides, sizes, scale), made from the key's first call. A call
    allocates o in the shape the op returns and launches with the caller's own q, k, v and decay: each is the same
    memory as the (B, H, D) slice the general path hands the kernel (a token axis of 1 or a decay's added axis is
    index 0: no offset), so no view is made. Made where the plan launches the kernel on the inputs as they are (no
    CPU path, no upcast) and every slice starts where its tensor does."""

    __slots__ = ("launch", "tail", "shape", "dtype", "device", "has_decay")

    @classmethod
    def of(cls, key, p, given, sliced, state, scale, feature, o):
        if p.path == "cpu" or p.config["upcast"] or o.numel() == 0 \
                or any(t is not None and t.data_ptr() != u.data_ptr() for t, u in zip(given, sliced)):
            return False
        self = cls()
        q, k, v, g = sliced
        _, grid, args, kw = launch.step_call(p, q, k, v, g, None, None, None, state, o.view(v.shape), scale, feature)
        self.launch = KeyedLaunch(launch._STEP, key, grid, kw)
        self.tail = args[9:]  # (the nine tensors first: step_call's order)
        self.shape, self.dtype, self.device, self.has_decay = tuple(o.shape), o.dtype, o.device, g is not None
        return self

    def __call__(self, q, k, v, decay, state):
        o = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self.launch((q, k, v, decay if self.has_decay else v, v, v, v, state, o, *self.tail))
        return o


_LA_STEPS = LRU(256)  # a linear_attention_step key -> its _LaStep (False: the general path), after its first call


def mamba2_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, *, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """One decoding step of ``mamba2_chunk_scan`` (mamba_ssm's ``selective_state_update`` for Mamba-2's
    scalar A): state (batch, nheads, headdim, dstate) updated in place (any float dtype; float32 math),
    x (batch, nheads, headdim), dt (batch, nheads), A (nheads,), B, C (batch, ngroups, dstate), D
    (nheads,) or (nheads, headdim), z like x, dt_bias (nheads,). Returns y like x. Inference only.
    (mamba's Mamba2.step passes dt, A, D, dt_bias expanded to headdim; pass them per head here.)"""
    op = "mamba2_step"
    # a CUDA call seen before skips the checks (they read the signature alone); the launch key covers the
    # tensors made below from dt, A and D (their layouts follow from the inputs')
    key = _MAMBA_STEP_KEY(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, *dt_limit) \
        if isinstance(dt_limit, (tuple, list)) else None
    if key is not None:
        key = ("mamba2_step", generation(), key)
        prepared = _MAMBA_STEPS.get(key)  # the key's two launches as its second call prepared them
        if prepared and tiles_launch.BIND_KEYED_LAUNCHES and prepared.serves() and dispatch.eager_mode(state, x, dt, A, B, C, D, z, dt_bias) == "direct":
            return prepared(state, x, dt, A, B, C, D, z, dt_bias)

    def check():
        _check_mamba(op, x, dt, A, B, C, D, z, dt_bias, state, "state", step=True)
        if state is None:
            raise TypeError(f"{op}: state must be a tensor (batch, nheads, headdim, dstate)")
        _check_limit(op, dt_limit)
        return True

    _CHECKED.memo(key, check)
    h, p = x.shape[1], x.shape[2]
    d_skip = None if D is None else (D.float()[:, None].expand(h, p) if D.dim() == 1 else D.float())
    if key is not None and mamba_dt.fits(dt, dt_bias, A, dt_softplus):  # dt_eff and g in one launch
        step_key = (key, "mamba_dt")  # (its dt_eff is contiguous where torch's keeps dt's strides: another key)
        dt_eff, g = mamba_dt.mamba_dt(dt, dt_bias, A, dt_limit, key=step_key)
        y = _run_step(C, B, x, g, dt_eff, d_skip, z, state, 1.0, IDENTITY, True, key=step_key)
        if key not in _MAMBA_STEPS and tiles_launch.BIND_KEYED_LAUNCHES and _PLANS.get(step_key) is not None:
            _MAMBA_STEPS.put(key, _MambaStep.of(step_key, _PLANS.get(step_key), state, x, dt, A, B, C, D, d_skip, z,
                                                dt_bias, dt_limit, g, dt_eff, y))
        return y
    dt_eff = _mamba_dt(dt, dt_bias, dt_softplus, dt_limit)
    return _run_step(C, B, x, dt_eff * A.float(), dt_eff, d_skip, z, state, 1.0, IDENTITY, True, key=key)

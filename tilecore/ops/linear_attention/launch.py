"""Linear attention's passes, run as their plan says (plan.py): the tl kernels (kernels_tl.py) or the
PyTorch chunked form on the CPU (chunked.py). One way in a pass: ``forward``, ``backward``, ``step``.

Tensors as the custom ops take them (op.py): q, k (B, N, Hqk, Dk); v (B, N, H, Dv); g (B, N, H) or
(B, N, H, Dk) log decay, float32; beta (B, N, H) float32; d_skip (H, Dv); z (B, N, H, Dv); states
(B, H, F, Dv). Any strides.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from tilecore import dispatch
from tilecore.ops.linear_attention import (chunked, configs, gluon_based, gluon_forward, gluon_gla_forward,
                                           gluon_scalar_bwd, kernels_backward, kernels_tl)
from tilecore.ops.linear_attention.plan import BASED, CHANNEL_DECAY, SCALAR_DECAY, Plan, block, decay_kind, shared_fit
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import LRU, CachedLaunch, KeyedLaunch, SameKey, TmaOperand

# the forward and step kernels launched by CachedLaunch: with an eager call's launch key (op.py: its
# signature) by key, else the cached plain launch (issue 31's host time)
_FORWARD = CachedLaunch(kernels_tl.la_fwd_kernel)
_STEP = CachedLaunch(kernels_tl.la_step_kernel)
_GLUON_FORWARD = CachedLaunch(gluon_forward.la_fwd_gluon_kernel)
_GLUON_BASED = CachedLaunch(gluon_based.based_fwd_gluon_kernel)
_GLUON_BWD = CachedLaunch(gluon_scalar_bwd.la_bwd_gluon_kernel)
_GLUON_BWD_DKV = CachedLaunch(gluon_scalar_bwd.la_bwd_dkv_gluon_kernel)
_GLUON_FITS = LRU(256)  # (a call's launch key, keep_linear) -> (the Gluon forward fits, Based's, the GLA forward's)
_FITS_KEY = SameKey()  # (its key object kept while the call's key repeats: tiles.launch.SameKey)
_TL_FORWARDS = LRU(256)  # a call's launch key -> its TlForward (False: forward_call each call), after its first launch

LOG_DECAY_FLOOR = chunked.LOG_DECAY_FLOOR


def feature_rows(feature: int, dk: int) -> int:
    """F, the rows of a head's state."""
    return 1 + dk + dk * dk if feature == BASED else dk


def _strides(t: torch.Tensor | None, n: int) -> tuple:
    """t's strides, or n zeros for an absent tensor."""
    return tuple(t.stride()) if t is not None else (0,) * n


def _gate(o_lin: torch.Tensor, v, d_skip, z) -> torch.Tensor:
    """(o + D v) * silu(z) in float32."""
    y = o_lin
    if d_skip is not None:
        y = y + d_skip.float() * v.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y


# --------------------------------------------------------------------------------------------
# forward


def forward(plan: Plan, q, k, v, g, beta, d_skip, z, h0, scale: float, feature: int, *, final_state: bool,
            keep_linear: bool, key=None):
    """(o, final state or None, o before D and z or None): o has v's dtype, the others are float32.
    ``key``: the call's launch key (op.py; None: plain launches)."""
    B, N, H, Dv = v.shape
    Fdim = feature_rows(feature, q.shape[-1])
    if plan.path == "cpu":
        o_lin, ht = chunked.chunked_forward(q, k, v, g, beta, h0, scale, feature, plan.chunk)
        if final_state and beta is not None:  # (the op's layout of a final state with beta: empty_state's)
            ht = gluon_forward.empty_state(B, H, Fdim, Dv, v.device, True).copy_(ht)
        o = _gate(o_lin, v, d_skip, z).to(v.dtype)
        if keep_linear and o.data_ptr() == o_lin.data_ptr():  # float32 without D and z: o is o_lin
            o_lin = o_lin.clone()
        return o, (ht if final_state else None), (o_lin if keep_linear else None)
    gluon, based, gla = _GLUON_FITS.memo(key and _FITS_KEY(key, keep_linear), lambda: (
        bool(plan.config.get("fwd_gluon")) and not keep_linear and gluon_forward.fits(q, k, v, g, feature, beta, z, d_skip) is None,
        bool(plan.config.get("fwd_gluon_based")) and not keep_linear
        and gluon_based.fits(q, k, v, g, beta, d_skip, z) is None,
        bool(plan.config.get("fwd_gluon_gla")) and not keep_linear
        and gluon_gla_forward.fits(q, k, v, g, feature, beta, z, d_skip) is None))
    if gla:
        with dispatch.on_device(v.device):  # Hopper: the GLA forward's Gluon kernel, the tl kernel on flagged heads
            o, ht, _ = gluon_gla_forward.forward(
                q, k, v, g, h0, scale, final_state, plan.config["gluon_gla_stages"],
                redo_tl=lambda o, ht, redo: gla_redo(plan, q, k, v, g, h0, o, ht, redo, scale))
        return o, ht, None
    if gluon:
        with dispatch.on_device(v.device):  # Hopper: the Gluon forward (o before D and z not kept)
            if key is not None:
                o, ht = gluon_forward_keyed(key, q, k, v, g, beta, d_skip, z, h0, scale, final_state,
                                            plan.config["gluon_stages"])
            else:
                o, ht = gluon_forward.forward(q, k, v, g, beta, d_skip, z, h0, scale, final_state,
                                              plan.config["gluon_stages"])
        return o, ht, None
    if based:
        with dispatch.on_device(v.device):  # Hopper: Based's Gluon forward
            if key is not None:
                o, ht = gluon_based_keyed(key, q, k, v, h0, scale, final_state, plan.config["gluon_based_stages"])
            else:
                o, ht = gluon_based.forward(q, k, v, h0, scale, final_state, plan.config["gluon_based_stages"])
        return o, ht, None
    out_dtype = v.dtype
    if plan.config["upcast"]:
        q, k, v, z = (None if t is None else t.float() for t in (q, k, v, z))
    # (new_empty: v's dtype and device, ~1 us under torch.empty's with device= on the H100's host: issue 31)
    o = v.new_empty((B, N, H, Dv))
    o_lin = v.new_empty((B, N, H, Dv), dtype=torch.float32) if keep_linear else None
    ht = gluon_forward.empty_state(B, H, Fdim, Dv, v.device, beta is not None) if final_state else None
    if B * H > 0:
        recipe = _TL_FORWARDS.get(key) if key is not None and tiles_launch.OP_RECIPES else None
        if recipe:  # the key's kept launch (its second call on): no argument tuple or options rebuilt
            recipe(q, k, v, g, beta, d_skip, z, h0, o, ht, o_lin, scale)
        else:
            _, grid, args, kw = forward_call(plan, q, k, v, g, beta, d_skip, z, h0, o, ht, o_lin, scale, feature)
            _FORWARD.run(key, grid, args, kw)
            if recipe is None and key is not None and tiles_launch.OP_RECIPES:
                _TL_FORWARDS.put(key, TlForward.of(plan, grid, args, kw, key))
    # (o is v's dtype unless the interpreter's upcast made it float32: .to only then, ~1-3 us of host time a call
    # where it would return o itself)
    return (o if o.dtype == out_dtype else o.to(out_dtype)), ht, o_lin


class TlForward:
    """The tl forward kernel's launch for one launch key (issue 31's host time): its KeyedLaunch, and the arguments
    the key fixes (every stride, the sizes, the value blocks: functions of the inputs' signature; o, ht and o_lin are
    fresh contiguous tensors of the key's shapes), made from forward_call's first launch of the key. A call passes
    the tensors and scale as forward_call would (v in place of an absent input, o in place of an absent output).
    ``of``: False for per-channel decay (its GL tensor is a keyword argument) and the interpreter's float32 upcast
    (the inputs converted each call)."""

    __slots__ = ("launch", "tail", "blocks")

    TENSORS = 11  # forward_call's tensor arguments, before the strides and sizes

    @classmethod
    def of(cls, plan: Plan, grid, args: tuple, kw: dict, key):
        if "GL" in kw or plan.config["upcast"]:
            return False
        self = cls()
        self.launch = KeyedLaunch(_FORWARD, key, grid, kw)
        self.tail, self.blocks = args[cls.TENSORS:-2], args[-1]  # (then scale, the value blocks)
        return self

    def __call__(self, q, k, v, g, beta, d_skip, z, h0, o, ht, o_lin, scale: float) -> None:
        self.launch((q, k, v, v if g is None else g, v if beta is None else beta, v if d_skip is None else d_skip,
                     v if z is None else z, v if h0 is None else h0, o, o if o_lin is None else o_lin,
                     o if ht is None else ht, *self.tail, scale, self.blocks))


def gluon_forward_keyed(key, q, k, v, g, beta, d_skip, z, h0, scale: float, final_state: bool, stages: int):
    """gluon_forward.forward (its configs' kernel variant) launched by ``key``: the descriptors as TmaOperands
    (built and checked at the key's first launch only). Every argument's specialization follows from the key
    (the inputs' signature): the ints are their sizes and strides, the other tensors fresh or the inputs' own.
    Without decay, beta, D and z (plain linear attention) the launch is kept as the key's GluonForward
    (OP_RECIPES: op.linear_attention's next plain eager calls launch through it)."""
    launched = []

    def launch(grid, args, warps):
        launched.append((grid, args, warps))
        return _GLUON_FORWARD.run(key, grid, (), dict(args, num_warps=warps))

    o, ht = gluon_forward.forward(q, k, v, g, beta, d_skip, z, h0, scale, final_state, stages, operand=TmaOperand,
                                  launch=launch)
    if tiles_launch.OP_RECIPES and tiles_launch.FORWARD_RECIPES and len(launched) == 1 and key not in GLUON_FORWARDS:
        GLUON_FORWARDS.put(key, g is None and beta is None and d_skip is None and z is None
                           and GluonForward.of(key, *launched[0], q, k, v, h0, o, ht))
    return o, ht


class GluonForward:
    """linear_attention's Gluon forward without decay, beta, D or z for one launch key (issue 31's host
    time): the kernel's KeyedLaunch with its 25 arguments in the kernel's order, made from the key's first launch as
    gluon_forward.forward gave them: q's, k's, v's and o's descriptors (views fixed by the key: each made from the
    tensor at its position, encoded once per base address), sizes, strides and scale as they were, h0 and the final
    state where given. A call allocates o (and the final state) and launches: no flags, descriptors, argument dict
    or dummy made a call. ``of`` gives False (the general path each call) where an argument is not one of those: a
    descriptor of another tensor, or a tensor other than the inputs, outputs and the kernel's unread placeholder
    (a one-element tensor at an absent input's position, whose HAS_ flag is off)."""

    __slots__ = ("launch", "template", "slots", "o_shape", "ht_shape", "dtype", "device")

    _SOURCES = ("q", "k", "v", "o", "ht", "h0")  # what a call's arguments are made of, in __call__'s order
    # the placeholder positions and the flag saying the kernel reads nothing there
    _UNREAD = {"DSKIP": "HAS_D", "H0": "HAS_H0", "HT": "STORE_HT"}

    @classmethod
    def of(cls, key, grid, args: dict, warps, q, k, v, h0, o, ht):
        flags, named = _GLUON_FORWARD._signature or _GLUON_FORWARD._load_signature()
        count = flags.index(True) if True in flags else len(flags)
        if not all(flags[count:]):  # (the launch's positional arguments: every one before the constexprs)
            return False
        names = [name for name, _ in named]
        sources = dict(zip(cls._SOURCES, (q, k, v, o, ht, h0)))
        template, slots, makers = [], [], {}
        for i, name in enumerate(names[:count]):
            a = args.get(name)
            if type(a) is TmaOperand:
                source = next((s for s, t in sources.items() if t is not None and a.base is t), None)
                if source not in ("q", "k", "v", "o") or a.layout is not None:
                    return False
                block, shape, strides = list(a.block_shape), list(a.shape), list(a.strides)
                makers[i] = lambda t, block=block, shape=shape, strides=strides: TmaOperand(t, block, shape, strides)
                slots.append((i, cls._SOURCES.index(source)))
                template.append(None)
            elif isinstance(a, torch.Tensor):
                source = next((s for s, t in sources.items() if t is not None and a is t), None)
                if source is not None:
                    slots.append((i, cls._SOURCES.index(source)))
                    template.append(None)
                elif name in cls._UNREAD and not args.get(cls._UNREAD[name]) and a.numel() == 1:
                    template.append(a)  # (never read: its flag is off)
                else:
                    return False
            elif type(a) in (int, float, bool):
                template.append(a)
            else:
                return False
        kwargs = {name: args[name] for name in names[count:] if name in args}
        kwargs["num_warps"] = warps
        self = cls()
        self.launch = KeyedLaunch(_GLUON_FORWARD, key, grid, kwargs, operands=makers)
        self.template, self.slots = template, tuple(slots)
        self.o_shape, self.dtype, self.device = tuple(o.shape), o.dtype, o.device
        self.ht_shape = None if ht is None else tuple(ht.shape)
        return self

    def __call__(self, q, k, v, h0):
        """(o, the final state or None)."""
        o = q.new_empty(self.o_shape, dtype=self.dtype)  # (q's device, the key's: no device= parsed)
        ht = None if self.ht_shape is None else q.new_empty(self.ht_shape, dtype=torch.float32)
        sources = (q, k, v, o, ht, h0)
        args = list(self.template)
        for i, source in self.slots:
            args[i] = sources[source]
        self.launch(tuple(args))
        return o, ht


GLUON_FORWARDS = LRU(256)  # a plain eager call's launch key -> its GluonForward (False: the general path)


def gluon_based_keyed(key, q, k, v, h0, scale: float, final_state: bool, stages: int):
    """gluon_based.forward launched by ``key`` as gluon_forward_keyed launches its kernel: the kernel (0.14 ms at
    B16 H16 N4096) is shorter than the unkeyed host path's descriptors and binding."""
    return gluon_based.forward(q, k, v, h0, scale, final_state, stages, operand=TmaOperand,
                               launch=lambda grid, args, warps: _GLUON_BASED.run(key, grid, (),
                                                                                 dict(args, num_warps=warps)))


def forward_call(plan: Plan, q, k, v, g, beta, d_skip, z, h0, o, ht, o_lin, scale: float, feature: int):
    """(kernel, grid, arguments, options) of the forward kernel writing o, ht and o_lin (None: not
    written)."""
    B, N, H, Dv = v.shape
    cfg = plan.config
    kind = decay_kind(g)
    g_strides = _strides(g, 4) if kind == CHANNEL_DECAY else (*_strides(g, 3), 0)
    dummy = v
    args = (q, k, v, dummy if g is None else g, dummy if beta is None else beta,
            dummy if d_skip is None else d_skip, dummy if z is None else z, dummy if h0 is None else h0,
            o, o if o_lin is None else o_lin, o if ht is None else ht,
            *q.stride(), *k.stride(), *v.stride(), *g_strides, *_strides(beta, 3), *_strides(z, 4), *o.stride(),
            *_strides(h0, 4), *_strides(ht, 4), *_strides(d_skip, 2),
            N, H, H // q.shape[2], q.shape[-1], Dv, scale, cfg["value_blocks"])
    kw = dict(BT=cfg["BT"], BK=cfg["BK"], BV=cfg["BV"], KB=cfg["KB"], DECAY=kind, FEATURE=feature,
              HAS_BETA=beta is not None, HAS_D=d_skip is not None, HAS_Z=z is not None, HAS_H0=h0 is not None,
              STORE_HT=ht is not None, STORE_OLIN=o_lin is not None, MMA=cfg["MMA"], IEEE=cfg["IEEE"],
              num_warps=cfg["fwd_warps"], num_stages=cfg["fwd_stages"])
    if kind == CHANNEL_DECAY:
        # GL (the sub-chunk-local cumulative decay, 1.1 ms at B16 H16 N4096 d128) is read by the gathered diagonal only
        kw.update(GL=sub_cumulative(g) if cfg["diag"] == 2 else g, DIAG=cfg["diag"])
    return kernels_tl.la_fwd_kernel, (B * H * cfg["value_blocks"],), args, kw


def gla_redo(plan: Plan, q, k, v, g, h0, o, ht, redo, scale: float) -> None:
    """The tl forward on the heads gluon_gla_forward's kernel flagged in ``redo`` (a chunk too wide for its factored
    operands): their o and final states rewritten in full; the other programs return at once."""
    kernel, grid, args, kw = forward_call(plan, q, k, v, g, None, None, None, h0, o, ht, None, scale, 0)
    kernel[grid](*args, **kw, REDO=redo)


def sub_cumulative(g: torch.Tensor) -> torch.Tensor:
    """Per-channel log decays g (B, N, H, Dk), clamped at the floor (NaN kept) and summed within each
    sub-chunk of kernels_tl.SUB tokens from the sequence's start (sub-chunks never straddle a chunk):
    contiguous (B, N, H, Dk) float32, read by the kernels' diagonal sub-chunks (their G_i - G_j)."""
    B, N, H, Dk = g.shape
    sub = configs.CHANNEL_SUB
    gf = g.float()
    gf = torch.where(gf < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, gf)
    pad = -N % sub
    if pad:
        gf = F.pad(gf, (0, 0, 0, 0, 0, pad))
    return gf.reshape(B, (N + pad) // sub, sub, H, Dk).cumsum(2).reshape(B, N + pad, H, Dk)[:, :N].contiguous()


# --------------------------------------------------------------------------------------------
# backward


SPLIT_KEYS = ("split", "split_BT", "split_BKB", "split_BV", "split_warps", "split_stages", "dq_BKQ", "dq_warps",
              "dq_stages", "split_epilogue", "bwd_gluon", "bwd_gluon_stages", "bwd_gluon_dkv")


def backward_plan(plan: Plan, q, v, g, feature: int, chunk: int | None = None, **overrides) -> Plan:
    """The plan with the backward's split dK/dV settings (configs.BWD_SPLIT*, the split_* and dq_* keys;
    ``split`` says whether it runs): the default where configs.BWD_SPLIT_KINDS has this decay kind (phi(x)
    = x, head dims <= configs.BWD_SPLIT_MAX_DIM), else off. ``chunk``: the caller's chunk_size (None: the
    split path's own chunk). ``overrides``: any of SPLIT_KEYS (experiments/linear_attention sweeps them)."""
    unknown = set(overrides) - set(SPLIT_KEYS)
    if unknown:
        raise ValueError(f"backward_plan: unknown overrides {sorted(unknown)}; known: {SPLIT_KEYS}")
    if plan.path != "tl":
        return plan
    kind = decay_kind(g)
    fits = feature != BASED and max(q.shape[-1], v.shape[-1]) <= configs.BWD_SPLIT_MAX_DIM
    cfg = dict(plan.config)
    dkv, dq = configs.BWD_SPLIT[min(kind, 1)], configs.BWD_SPLIT_DQ[min(kind, 1)]
    dq_stages = min(dq["stages"], shared_fit(q.device).get("dq_stages", dq["stages"]))  # configs.SHARED_FITS
    cfg.update(split=fits and kind in configs.BWD_SPLIT_KINDS, split_BT=chunk or dkv["BT"], split_BKB=dkv["BKB"],
               split_BV=dkv["BV"], split_warps=dkv["warps"], split_stages=dkv["stages"], dq_BKQ=dq["BKQ"],
               dq_warps=dq["warps"], dq_stages=dq_stages, split_epilogue=configs.BWD_SPLIT_EPILOGUE)
    # the Gluon kernels (gluon_scalar_bwd) on Hopper at their chunk of 64; backward() asks their fits for the tensors
    cfg.update(bwd_gluon=configs.BWD_GLUON and kind != CHANNEL_DECAY and feature != BASED and chunk in (None, 64)
               and (q.shape[-1], v.shape[-1]) in configs.BWD_GLUON_DIMS
               and not dispatch.interpreted(q.device) and dispatch.gluon_ok(q.device),
               bwd_gluon_stages=configs.BWD_GLUON_STAGES, bwd_gluon_dkv=configs.BWD_GLUON_DKV)
    cfg.update(overrides)
    return dataclasses.replace(plan, config=cfg)


def part_counts(plan: Plan) -> tuple[int, int]:
    """(dk parts, dv parts): the dK/dV kernel's partial sums (one each on the split path)."""
    cfg = plan.config
    return (1, 1) if cfg.get("split") else (cfg["dkv_value_blocks"], cfg["dkv_key_blocks"])


def backward(plan: Plan, do, q, k, v, g, beta, h0, o_lin, ht, dht, scale: float, feature: int, *,
             native: bool = False, key=None):
    """(dq, dk, dv, dg, dbeta, dh0) (None for an input that is None) of o (before D and z) and the final
    state against their gradients do (any float dtype, read as it is) and dht (or None). float32, but
    with ``native`` dq, dk, dv in q's, k's, v's dtypes: the kernels then store them so where nothing is
    combined after them (no torch pass casts them). ``key``: the backward's launch key (op._backward_impl: it
    fixes every launch argument's specialization), its kernels then launched by it (_launch_bwd); None: plainly."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    if plan.path == "cpu":
        grads = chunked.chunked_backward(do, q, k, v, g, beta, h0, dht, scale, feature, plan.chunk)
        return _cast_grads(grads, dtypes) if native else grads
    do = kernel_do(plan, do, v, g)
    if plan.config["upcast"]:  # the interpreter: bf16 on its float32 upcast, rounded once at the end
        q, k, v, do = q.float(), k.float(), v.float(), do.float()
    out = dict(zip(("dq", "dk", "dv"), dtypes)) if native and not plan.config["upcast"] else None
    if plan.config.get("bwd_gluon") and gluon_scalar_bwd.fits(q, k, v, g, beta, feature) is None:
        grads = backward_gluon(do, q, k, v, g, beta, h0, ht, dht, scale, out, plan.config["bwd_gluon_stages"],
                               plan.config["bwd_gluon_dkv"], key=key)
        return _cast_grads(grads, dtypes) if native else grads
    torch_combine = plan.config.get("combine", "kernel") != "kernel" or (feature == BASED and g is not None)
    if split_epilogue(plan, g, feature) and not torch_combine:
        grads = backward_epilogue(plan, do, q, k, v, g, beta, h0, ht, dht, scale, feature, out, key=key)
        return _cast_grads(grads, dtypes) if native else grads
    buffers = backward_kernels(plan, do, q, k, v, g, beta, h0, dht, scale, feature,
                               out_dtypes=None if torch_combine else out, key=key)
    if not torch_combine:
        grads = backward_combine_kernel(buffers, q, k, v, g, beta, ht, dht, out_dtypes=out, key=key)
    else:
        grads = backward_combine(buffers, do, q, k, v, g, beta, o_lin, ht, dht)
    return _cast_grads(grads, dtypes) if native else grads


def backward_gluon(do, q, k, v, g, beta, h0, ht, dht, scale: float, out_dtypes, stages: int = 2, dkv: bool = False,
                   key=None):
    """backward() by gluon_scalar_bwd's kernels (no decay or a scalar one, phi(x) = x, on Hopper): dq, dk, dv in
    ``out_dtypes`` (None: float32; dq, dk in float32 where a q/k head group is summed after), the decay's gradient from
    the kernels' per-token parts as backward_epilogue takes it, d beta the sum of its parts. ``dkv``: dk and dv by one
    walk where gluon_scalar_bwd.fused_dkv says. The kernels launch by CachedLaunch with TmaOperand descriptors, by ``key``
    (the backward's launch key, as backward_epilogue's) where given: through the JIT's own launch the public op's eager
    backward at d 64 ran 1.50 ms against 0.69 of GPU time (host-bound)."""

    def launch(role, grid, args, warps):
        cached = _GLUON_BWD_DKV if role == "dkv" else _GLUON_BWD
        cached.run(None if key is None else (key, "gluon", role), grid, (), dict(args, num_warps=warps))

    B, N, H, Dv = v.shape
    Hqk, Dk = q.shape[2], q.shape[3]
    group = H // Hqk
    f32 = torch.float32
    own = out_dtypes or dict(dq=f32, dk=f32, dv=f32)
    dtypes = dict(dq=own["dq"] if group == 1 else f32, dk=own["dk"] if group == 1 else f32, dv=own["dv"])
    with dispatch.on_device(v.device):
        dq, dk, dv, dg_q, dg_k, dbeta_parts, dh0 = gluon_scalar_bwd.grads(q, k, v, do, g, beta, h0, dht, scale, dtypes,
                                                                          stages, dkv=dkv, launch=launch,
                                                                          operand=TmaOperand)
    dg = None
    if g is not None:
        has_dht = dht is not None and ht is not None
        dg = decay_grad(g, ht if has_dht else None, dht if has_dht else None, dg_q.sum(0) - dg_k.sum(0))
    dbeta = dbeta_parts.sum(0) if beta is not None else None
    if group > 1:
        dq = dq.view(B, N, Hqk, group, Dk).sum(3)
        dk = dk.view(B, N, Hqk, group, Dk).sum(3)
    return dq, dk, dv, dg, dbeta, dh0


def split_epilogue(plan: Plan, g, feature: int) -> bool:
    """Whether the split path's kernels do the combine's work themselves (kernels_tl EPILOGUE: a scalar
    decay with phi(x) = x): no combine kernel, only sums over (B, N, H) parts in torch."""
    cfg = plan.config
    return bool(cfg.get("split")) and bool(cfg.get("split_epilogue")) and decay_kind(g) == SCALAR_DECAY \
        and feature != BASED


def backward_epilogue(plan: Plan, do, q, k, v, g, beta, h0, ht, dht, scale: float, feature: int, out_dtypes,
                      key=None):
    """backward() on the split path with the kernels' EPILOGUE: dq, dk, dv written whole (the diagonal added
    back, beta applied; the inputs' dtypes where ``out_dtypes`` says so and no q/k head group is summed),
    and the decay's and beta's gradients from the kernels' per-token parts: dG_t = sum of q_t . dq_t parts
    - sum of k_t . dk_t parts (both without the diagonal), its reverse sum (decay_grad), d beta_t the sum
    of v_t . dv_hat_t parts."""
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    group = H // q.shape[2]
    cfg, f32, dev = plan.config, torch.float32, v.device
    own = out_dtypes if out_dtypes and group == 1 else dict(dq=f32, dk=f32)
    dq = torch.empty(B, N, H, Dk, dtype=own["dq"], device=dev)
    dk = torch.empty(1, B, N, H, Dk, dtype=own["dk"], device=dev)
    dv = torch.empty(1, B, N, H, Dv, dtype=out_dtypes["dv"] if out_dtypes else f32, device=dev)
    dg_q = torch.empty(-(-Dk // cfg["dq_BKQ"]), B, N, H, dtype=f32, device=dev)
    dg_k = torch.empty(-(-Dk // cfg["split_BKB"]), B, N, H, dtype=f32, device=dev)
    dbeta_parts = torch.empty(-(-Dv // cfg["split_BV"]), B, N, H, dtype=f32, device=dev) if beta is not None else None
    dh0 = torch.empty(B, H, feature_rows(feature, Dk), Dv, dtype=f32, device=dev) if h0 is not None else None
    if B * H > 0:
        with dispatch.on_device(dev):
            for i, (kernel, grid, args, kw) in enumerate(backward_calls(
                    plan, do, q, k, v, g, beta, h0, dht, dq, dk, dv, dh0, scale, feature, dq,
                    epilogue=(dg_q, dg_k, dbeta_parts))):
                _launch_bwd(kernel, key, i, grid, args, kw)
    has_dht = dht is not None and ht is not None
    dG = dg_q.sum(0) - dg_k.sum(0) if B * H * N > 0 else torch.zeros(g.shape, dtype=f32, device=dev)
    dg = decay_grad(g, ht if has_dht else None, dht if has_dht else None, dG)
    dbeta = dbeta_parts.sum(0) if beta is not None else None
    dk, dv = dk[0], dv[0]
    if group > 1:
        Hqk = q.shape[2]
        dq = dq.view(B, N, Hqk, group, Dk).sum(3)
        dk = dk.view(B, N, Hqk, group, Dk).sum(3)
    return dq, dk, dv, dg, dbeta, dh0


def kernel_do(plan: Plan, do, v, g):
    """do in the dtype the backward kernels read it in, as the H100 checked them (notes/linear_attention, decision
    30): the split path in v's dtype (bf16 do checked, beta and grouped heads included); the unsplit path with a
    decay in float32 (its dQ kernel reading bf16 do directly was wrong on the H100 for Mamba-2 with D and no gate,
    which the interpreter, running bf16 on a float32 upcast, cannot see); without a decay bf16 as it comes."""
    if plan.config.get("split"):
        return do.to(v.dtype) if do.dtype != v.dtype and v.dtype != torch.float32 else do
    if g is not None:
        return do.float()
    return do


def _cast_grads(grads, dtypes):
    """dq, dk, dv in the inputs' dtypes (a no-op where the kernels stored them so)."""
    dq, dk, dv, *rest = grads
    return tuple(t if t.dtype == d else t.to(d) for t, d in zip((dq, dk, dv), dtypes)) + tuple(rest)


def _buffer_dtypes(plan: Plan, q, v, g, beta, feature: int, out_dtypes) -> tuple:
    """The dtypes of the kernels' dq, dk and dv buffers: float32, but an output's own dtype where nothing
    after the kernels reads the buffer (no diagonal to add back, no beta, one part, a q/k head per v head
    for dq and dk)."""
    f32 = torch.float32
    if not out_dtypes:
        return f32, f32, f32
    nv, nk = part_counts(plan)
    group = v.shape[2] // q.shape[2]
    plain = not strict_diagonal(feature, g) and beta is None and nv == 1 and nk == 1
    own = group == 1 and plain
    return (out_dtypes["dq"] if group == 1 and not strict_diagonal(feature, g) else f32,
            out_dtypes["dk"] if own else f32, out_dtypes["dv"] if plain else f32)


def backward_kernels(plan: Plan, do, q, k, v, g, beta, h0, dht, scale: float, feature: int, out_dtypes=None,
                     key=None):
    """The dQ and dK/dV kernels' outputs: (dq per v head, dk parts, dv parts, dh0 or None, r or None),
    float32 but where ``out_dtypes`` ({"dq", "dk", "dv"}: dtypes) lets a buffer be the output itself
    (_buffer_dtypes; backward_calls says what each holds)."""
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    f32 = torch.float32
    dev = v.device
    dq_dtype, dk_dtype, dv_dtype = _buffer_dtypes(plan, q, v, g, beta, feature, out_dtypes)
    dq_heads = torch.empty(B, N, H, Dk, dtype=dq_dtype, device=dev)
    nv, nk = part_counts(plan)
    dk_parts = torch.empty(nv, B, N, H, Dk, dtype=dk_dtype, device=dev)
    dv_parts = torch.empty(nk, B, N, H, Dv, dtype=dv_dtype, device=dev)
    dh0 = torch.empty(B, H, feature_rows(feature, Dk), Dv, dtype=f32, device=dev) if h0 is not None else None
    # phi(x) = x with a decay: dq and dk without the diagonal, whose factor comes apart (r)
    r = torch.empty(B, N, H, dtype=f32, device=dev) if strict_diagonal(feature, g) else None
    if B * H > 0:
        with dispatch.on_device(dev):
            for i, (kernel, grid, args, kw) in enumerate(backward_calls(
                    plan, do, q, k, v, g, beta, h0, dht, dq_heads, dk_parts, dv_parts, dh0, scale, feature, r)):
                _launch_bwd(kernel, key, i, grid, args, kw)
    return dq_heads, dk_parts, dv_parts, dh0, r


def backward_combine(buffers, do, q, k, v, g, beta, o_lin, ht, dht):
    """(dq, dk, dv, dg, dbeta, dh0) from backward_kernels' buffers: the partial sums, beta's and the log
    decay's gradients, the diagonal added back, the q/k head groups summed (torch passes)."""
    dq_heads, dk_parts, dv_parts, dh0, r = buffers
    B, N, H, Dv = v.shape
    Hqk, Dk = q.shape[2], q.shape[3]
    group = H // Hqk
    nv, nk = dk_parts.shape[0], dv_parts.shape[0]
    dk_hat = dk_parts.sum(0) if nv > 1 else dk_parts[0]
    dv_hat = dv_parts.sum(0) if nk > 1 else dv_parts[0]
    # v in float32 only where read: beta's gradient and Based's decay gradient (without them nothing reads it)
    vf = v.float() if beta is not None or (r is None and g is not None) else None
    bf = beta.float()[..., None] if beta is not None else None
    dbeta = (vf * dv_hat).sum(-1) if beta is not None else None  # the token's contribution is linear in beta
    dv = dv_hat * bf if beta is not None else dv_hat
    dg = None
    if r is not None:
        qh = q.float().repeat_interleave(group, dim=2) if group > 1 else q.float()
        kh = k.float().repeat_interleave(group, dim=2) if group > 1 else k.float()
        dk_off = dk_hat * bf if beta is not None else dk_hat
        dg = decay_grad(g, ht, dht, qh * dq_heads - kh * dk_off)
        rf = r[..., None]
        dq_heads = dq_heads + (rf * bf if beta is not None else rf) * kh  # the diagonal: beta_t r_t k_t
        dk_hat = dk_hat + rf * qh  # and r_t q_t
    elif g is not None:  # Based: do . o - v . dv (its features are not linear in q)
        dg = decay_grad(g, ht, dht, (do * o_lin).sum(-1) - (vf * dv).sum(-1))
    dk_heads = dk_hat * bf if beta is not None else dk_hat
    dq = dq_heads if group == 1 else dq_heads.view(B, N, Hqk, group, Dk).sum(3)
    dk = dk_heads if group == 1 else dk_heads.view(B, N, Hqk, group, Dk).sum(3)
    return dq, dk, dv, dg, dbeta, dh0


def backward_combine_kernel(buffers, q, k, v, g, beta, ht, dht, out_dtypes=None, key=None):
    """backward_combine in one kernel (kernels_backward.la_bwd_combine_kernel: each buffer read once, the
    log decay's reverse sum along the sequence in it) for phi(x) = x (any decay) and Based without a
    decay (Based's decay gradient, do . o - v . dv, stays backward_combine's)."""
    dq_heads, dk_parts, dv_parts, dh0, r = buffers
    B, N, H, Dv = v.shape
    Hqk, Dk = q.shape[2], q.shape[3]
    group = H // Hqk
    strict = r is not None
    if not strict and beta is None and dk_parts.shape[0] == 1 and dv_parts.shape[0] == 1:  # nothing to combine
        return backward_combine(buffers, None, q, k, v, g, beta, None, ht, dht)
    f32, dev = torch.float32, v.device
    # out_dtypes: dq, dk, dv stored in the outputs' dtypes where no q/k head group is summed after
    own = out_dtypes if out_dtypes and group == 1 else dict(dq=f32, dk=f32)
    dv_dtype = out_dtypes["dv"] if out_dtypes else f32
    dq = torch.empty(dq_heads.shape, dtype=own["dq"], device=dev) if strict else dq_heads
    dk = torch.empty(B, N, H, Dk, dtype=own["dk"], device=dev)
    dv = torch.empty(B, N, H, Dv, dtype=dv_dtype, device=dev)
    dg = torch.empty(g.shape, dtype=f32, device=dev) if strict else None
    dbeta = torch.empty(B, N, H, dtype=f32, device=dev) if beta is not None else None
    has_dht = dht is not None and ht is not None
    if B * H > 0 and N > 0:
        kind = decay_kind(g)
        g_strides = _strides(g, 4) if kind == CHANNEL_DECAY else (*_strides(g, 3), 0)
        dummy = dk
        BK, BV = block(Dk), block(Dv)
        args = (q, k, v, dummy if g is None else g, dummy if beta is None else beta,
                ht if has_dht else dummy, dht if has_dht else dummy, dq_heads, dk_parts, dv_parts,
                dummy if r is None else r, dq, dk, dv, dummy if dg is None else dg, dummy if dbeta is None else dbeta,
                *q.stride(), *k.stride(), *v.stride(), *g_strides, *_strides(beta, 3),
                *_strides(ht if has_dht else None, 4), *_strides(dht if has_dht else None, 4),
                dk_parts.stride(0), dv_parts.stride(0), N, H, group, Dk, Dv, dk_parts.shape[0], dv_parts.shape[0])
        with dispatch.on_device(dev):
            _launch_bwd(kernels_backward.la_bwd_combine_kernel, key, "combine", (B * H * 2,), args, dict(
                BT=configs.COMBINE_TOKENS, BK=BK, BV=BV, DECAY=kind, STRICT=strict, HAS_BETA=beta is not None,
                HAS_DHT=has_dht, num_warps=4 if max(BK, BV) <= 128 else 8))
    elif strict:
        dg.zero_()
    if group > 1:
        dq = dq.view(B, N, Hqk, group, Dk).sum(3)
        dk = dk.view(B, N, Hqk, group, Dk).sum(3)
    return dq, dk, dv, dg, dbeta, dh0


_BACKWARD_LAUNCHES: dict = {}  # a backward kernel -> its CachedLaunch (keyed backward launches)


def _launch_bwd(kernel, key, part, grid, args, kw) -> None:
    """``kernel[grid](*args, **kw)``, or with a backward's launch ``key`` the keyed launch of the kernel's
    CachedLaunch under (key, ``part``: which of the backward's launches)."""
    if key is None:
        kernel[grid](*args, **kw)
        return
    cached = _BACKWARD_LAUNCHES.get(kernel)
    if cached is None:
        cached = _BACKWARD_LAUNCHES.setdefault(kernel, CachedLaunch(kernel))
    cached.run((key, part), grid, args, kw)


def strict_diagonal(feature: int, g) -> bool:
    """Whether the backward kernels leave the diagonal out (launch.decay_grad's reason)."""
    return feature != BASED and g is not None


def backward_calls(plan: Plan, do, q, k, v, g, beta, h0, dht, dq_heads, dk_parts, dv_parts, dh0, scale: float,
                   feature: int, r=None, epilogue=None):
    """[(kernel, grid, arguments, options)] of the dQ and dK/dV kernels (the split path: dQ, dK, dV);
    ``r`` (B, N, H) float32 where strict_diagonal: the diagonal's factor, dq and dk_hat then without
    it. dk_parts and dv_parts hold part_counts(plan) parts. ``epilogue`` (backward_epilogue, split path):
    the (dG query side, dG key side, d beta or None) part buffers, the kernels then writing dq, dk, dv
    whole (``r`` only says the diagonal is left out: R is not written)."""
    strict = r is not None
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    group = H // q.shape[2]
    cfg = plan.config
    kind = decay_kind(g)
    g_strides = _strides(g, 4) if kind == CHANNEL_DECAY else (*_strides(g, 3), 0)
    dummy = v
    gl = sub_cumulative(g) if kind == CHANNEL_DECAY and cfg["diag"] == 2 else dummy
    split = bool(cfg.get("split"))  # backward_plan's split dK/dV (and its own dQ blocks)
    bt = cfg["split_BT"] if split else cfg["BT_BWD"]
    bkq = cfg["dq_BKQ"] if split else cfg["BKQ"]
    key_blocks = -(-Dk // bkq)
    dq_args = (q, k, v, dummy if g is None else g, gl, dummy if beta is None else beta, dummy if h0 is None else h0,
               do, dq_heads, dq_heads if r is None else r,
               *q.stride(), *k.stride(), *v.stride(), *g_strides, *_strides(beta, 3), *do.stride(),
               *dq_heads.stride(), *_strides(h0, 4),
               N, H, group, Dk, Dv, scale, key_blocks)
    dq_kw = dict(BT=bt, BKQ=bkq, BVF=cfg["BVF"], DECAY=kind, FEATURE=feature,
                 HAS_BETA=beta is not None, HAS_H0=h0 is not None, STRICT=strict, MMA=cfg["MMA"], IEEE=cfg["IEEE"],
                 DIAG=cfg["diag"], num_warps=cfg["dq_warps"] if split else cfg["num_warps"],
                 num_stages=cfg["dq_stages"] if split else cfg["num_stages"])
    # (always named: the compile reports pass every argument)
    # Based's symmetric quadratic state (configs.BASED_BWD_SYM): S2 from zeros (no h0) and dS2 from zeros (no dht)
    sym = feature == BASED and bool(cfg.get("based_sym"))
    dq_kw.update(EPILOGUE=False, DG_PART=dummy, s_gp=0, SYM=sym and h0 is None)
    if epilogue is not None:
        dq_kw.update(EPILOGUE=True, DG_PART=epilogue[0], s_gp=epilogue[0].stride(0))
    dq_call = (kernels_tl.la_bwd_dq_kernel, (B * H * key_blocks,), dq_args, dq_kw)

    def dkv_call(part: int, bkb: int, bv: int, warps: int, stages: int, store_dh0: bool, parts=None):
        vblocks, kblocks = -(-Dv // bv), -(-Dk // bkb)
        args = (q, k, v, dummy if g is None else g, gl, dummy if beta is None else beta, do,
                dummy if dht is None else dht, dk_parts, dv_parts, dh0 if store_dh0 else dk_parts,
                *q.stride(), *k.stride(), *v.stride(), *g_strides, *_strides(beta, 3), *do.stride(),
                *_strides(dht, 4), *_strides(dh0 if store_dh0 else None, 4), dk_parts.stride(0), dv_parts.stride(0),
                N, H, group, Dk, Dv, scale, vblocks, kblocks)
        kw = dict(BT=bt, BK=cfg["BK"], BKB=bkb, BV=bv, KB=cfg["KB"], DECAY=kind, FEATURE=feature,
                  HAS_BETA=beta is not None, HAS_DHT=dht is not None, STORE_DH0=store_dh0, STRICT=strict,
                  MMA=cfg["MMA"], IEEE=cfg["IEEE"], DIAG=cfg["diag"], PART=part, num_warps=warps, num_stages=stages)
        kw.update(EPILOGUE=False, DG_PART=dummy, s_gp=0, SYM=sym and dht is None)
        if parts is not None:
            kw.update(EPILOGUE=True, DG_PART=parts, s_gp=parts.stride(0))
        return kernels_tl.la_bwd_dkv_kernel, (B * H * vblocks * kblocks,), args, kw

    if not split:
        return [dq_call, dkv_call(0, cfg["BKB"], cfg["BVB"], cfg["num_warps"], cfg["num_stages"], dh0 is not None)]
    # the split dK/dV: dk from programs of split_BKB key channels by every value column (it stores dh0's rows),
    # dv from programs of split_BV value columns by every key channel; each output whole, from one program
    sw, ss = cfg["split_warps"], cfg["split_stages"]
    dg_k, dbeta_parts = (None, None) if epilogue is None else epilogue[1:]
    return [dq_call, dkv_call(1, cfg["split_BKB"], cfg["BVF"], sw, ss, dh0 is not None, dg_k),
            dkv_call(2, cfg["BK"], cfg["split_BV"], sw, ss, False, dbeta_parts)]


def decay_grad(g, ht, dht, dG):
    """The log decay's gradient from dG, each token's (query side) - (key side). Each factor
    exp(G_i - G_j) of the outputs and the final state (G the cumulative log decay over the sequence)
    counts +1 towards dG_i and -1 towards dG_j, so dG_t = q_t . dq_t - k_t . dk_t per channel (for
    phi(x) = x), or do_t . o_t - v_t . dv_t summed (any features); <dS_N, S_N> is added at the last
    token, and dg_t = sum_{s >= t} dG_s, zero where the floor clamped g.

    The diagonal (token t against itself, factor exp(0)) is on both sides and cancels; for phi(x) = x
    dq and dk come without it (strict_diagonal), so its rounding in 16-bit dots, the largest term where
    decays are strong, does not stay behind either (fp16 Mamba-2: dt_bias's gradient 2.1e-2 relative
    error with it, notes/linear_attention/README.md)."""
    channel = g.dim() == 4
    if not channel and dG.dim() == 4:
        dG = dG.sum(-1)
    if dht is not None and dG.shape[1] > 0:
        last = (dht.float() * ht).sum(-1)  # (B, H, F)
        dG[:, -1] += last if channel else last.sum(-1)
    if channel:
        dg = dG.flip(1).cumsum(1).flip(1)
    else:  # on a (B, H, N) copy: torch scans a middle dim by a thread a (batch, head) walking every token (~0.6 ms of
        # the scalar-decay backward at B16 H16 N4096 on an H200), a last dim by blocks
        dg = dG.transpose(1, 2).contiguous().flip(-1).cumsum(-1).flip(-1).transpose(1, 2)
    return torch.where(g < LOG_DECAY_FLOOR, 0.0, dg)


# --------------------------------------------------------------------------------------------
# decode step


def step(plan: Plan, q, k, v, g, beta, d_skip, z, state, scale: float, feature: int, key=None,
         state_strides=None) -> torch.Tensor:
    """One token: state <- decayed state + beta phi(k) v^T in place; returns o (v's dtype). q, k (B, Hqk,
    Dk); v, z (B, H, Dv); g (B, H) or (B, H, Dk); beta (B, H); state (B, H, F, Dv). ``key``: the call's
    launch key (op.py; None: a plain launch). ``state_strides``: the kernel path reads state's memory
    with these (B, H, F, Dv) strides instead of its own (a transposed state without a view op)."""
    B, H, Dv = v.shape
    if plan.path == "cpu":
        return _step_torch(q, k, v, g, beta, d_skip, z, state, scale, feature)
    out_dtype = v.dtype
    if plan.config["upcast"]:
        q, k, v, z = (None if t is None else t.float() for t in (q, k, v, z))
    o = torch.empty(B, H, Dv, dtype=v.dtype, device=v.device)
    if B * H > 0:
        _, grid, args, kw = step_call(plan, q, k, v, g, beta, d_skip, z, state, o, scale, feature, state_strides)
        _STEP.run(key, grid, args, kw)
    return o.to(out_dtype)


def step_call(plan: Plan, q, k, v, g, beta, d_skip, z, state, o, scale: float, feature: int, state_strides=None):
    """(kernel, grid, arguments, options) of the decode step kernel (``state_strides``: step's)."""
    B, H, Dv = v.shape
    cfg = plan.config
    kind = 0 if g is None else (1 if g.dim() == 2 else 2)  # no token axis here: (B, H) or (B, H, Dk)
    g_strides = _strides(g, 3) if kind == CHANNEL_DECAY else (*_strides(g, 2), 0)
    dummy = v
    bv = min(cfg["BVF"], cfg.get("step_bv", configs.STEP_BV))
    args = (q, k, v, dummy if g is None else g, dummy if beta is None else beta, dummy if d_skip is None else d_skip,
            dummy if z is None else z, state, o,
            *q.stride(), *k.stride(), *v.stride(), *g_strides, *_strides(beta, 2), *_strides(z, 3), *o.stride(),
            *(state.stride() if state_strides is None else state_strides), *_strides(d_skip, 2),
            H, H // q.shape[1], q.shape[-1], Dv, scale, -(-Dv // bv))
    kw = dict(BK=cfg["BK"], BV=bv, DECAY=kind, FEATURE=feature, HAS_BETA=beta is not None, HAS_D=d_skip is not None,
              HAS_Z=z is not None, num_warps=cfg["step_warps"])
    return kernels_tl.la_step_kernel, (B * H * -(-Dv // bv),), args, kw


def _step_torch(q, k, v, g, beta, d_skip, z, state, scale: float, feature: int) -> torch.Tensor:
    """step() on torch's CPU ops, float32."""
    H = v.shape[1]
    # chunked.features takes (B, N, Hqk, Dk): a token axis of 1
    phi_q, phi_k, out_scale = chunked.features(q[:, None], k[:, None], H, scale, feature)
    phi_q, phi_k = phi_q[:, :, 0], phi_k[:, :, 0]  # (B, H, F)
    vin = v.float() if beta is None else v.float() * beta.float()[..., None]
    s = state.float()
    if g is not None:
        factor = g.float().exp()
        s = s * (factor[..., None, None] if g.dim() == 2 else factor[..., None])
    s = s + phi_k[..., None] * vin[..., None, :]
    state.copy_(s)
    o = out_scale * torch.einsum("bhf,bhfv->bhv", phi_q, s)
    return _gate(o, v, d_skip, z).to(v.dtype)

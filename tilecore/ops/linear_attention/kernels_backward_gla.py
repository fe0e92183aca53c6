"""GLA's backward (per-channel log decay, phi(x) = x, no beta, q/k heads = v heads) as three kernels and nothing
after them (issue 33): the split dK/dV path of the scalar decay (launch.backward_calls) with the
GLA epilogue (kernels_tl la_bwd_dq_kernel / la_bwd_dkv_kernel, EPILOGUE with DECAY 2).

    dQ  (forward sweep, programs of BKQ key channels x every value column): dq stored whole in q's dtype (the
        diagonal r_t k_t added back), and q_t * dq_t without the diagonal, (B, N, H, Dk) float32, for dg
    dK  (reverse sweep, BKB key channels x every value column): dk whole in k's dtype, dh0, and dg whole: dG_t =
        q_t * dq_t - k_t * dk_t per channel, its reverse cumulative sum carried along the walk from the final
        state's term sum_v dS_N * S_N, zero where the floor clamped g
    dV  (reverse sweep, BV value columns x every key channel): dv whole in v's dtype

The intra-chunk terms take the plan's DIAG: 5 (6: operands split hi + lo) one reference a chunk per key block
(kernels_tl._channel_dq_factored / _channel_dk_factored, the dV kernel's scores by _channel_chunk), the sub-chunk
form where a block's span of G is too wide; 0 the sub-chunk form throughout. Against the shipped path (launch's
unsplit kernels at key blocks of 16, then the combine kernel): do v^T made by 2 dQ and 2 dK programs a chunk at
Dk 128 (not 8 + 8), no dk / dv partial sums, no float32 gradient buffers, no combine pass.

``takes`` says where per-channel decay's backward leaves launch.backward (configs_gla_bwd.GLA_BWD_PATH: off by
default until a GPU run checks the path; FLA's issue 640 is a Hopper miscompile of exactly such kernels); ``run``
runs the configured path ("split": launch's split kernels with the factored terms, then its combine kernel;
"split_combine": ``backward_split``, the same kernels with dv stored in v's dtype and the combine by key blocks;
"epilogue": ``backward`` here; "chunked": kernels_backward_gla_chunked.backward)."""
from __future__ import annotations

import torch

from tilecore import dispatch
from tilecore.ops.linear_attention import configs_gla_bwd, kernels_backward, kernels_backward_gla_chunked, launch
from tilecore.ops.linear_attention.plan import CHANNEL_DECAY, IDENTITY, Plan, decay_kind


def takes(plan: Plan, q, v, g, beta, feature: int) -> bool:
    """Whether ``run`` takes this backward: a path switched on (configs_gla_bwd.GLA_BWD_PATH), the tl path (a plan
    not yet split), per-channel decay, phi(x) = x, no beta, q/k heads = v heads, head dims <=
    configs_gla_bwd.MAX_DIM (a program holds every value column)."""
    return (configs_gla_bwd.GLA_BWD_PATH is not None and plan.path == "tl" and not plan.config.get("split")
            and decay_kind(g) == CHANNEL_DECAY and feature == IDENTITY and beta is None and q.shape[2] == v.shape[2]
            and max(q.shape[-1], v.shape[-1]) <= configs_gla_bwd.MAX_DIM)


def run(plan: Plan, do, q, k, v, g, h0, ht, dht, scale: float, native: bool = True, chunk: int | None = None):
    """launch.backward's (dq, dk, dv, dg, dbeta = None, dh0) by configs_gla_bwd.GLA_BWD_PATH (where ``takes``):
    dq, dk, dv in the inputs' dtypes where ``native``, else float32. ``chunk``: the caller's chunk_size (None: the
    path's own)."""
    path = configs_gla_bwd.GLA_BWD_PATH
    if path == "split":
        grads = launch.backward(split_plan(plan, q, v, g, chunk), do, q, k, v, g, None, h0, None, ht, dht, scale,
                                IDENTITY, native=native)
        return grads
    if path == "split_combine":
        grads = backward_split(split_plan(plan, q, v, g, chunk), do, q, k, v, g, h0, ht, dht, scale)
    elif path == "epilogue":
        grads = backward(split_plan(plan, q, v, g, chunk), do, q, k, v, g, h0, ht, dht, scale)
    elif path == "chunked":
        grads = kernels_backward_gla_chunked.backward(plan, do, q, k, v, g, h0, ht, dht, scale,
                                                      **(dict(BT=chunk) if chunk else {}))
    else:
        raise ValueError(f"configs_gla_bwd.GLA_BWD_PATH: {path!r}; accepted: None, 'split', 'split_combine', "
                         "'epilogue', 'chunked'")
    if not native:
        grads = (grads[0].float(), grads[1].float(), grads[2].float(), *grads[3:])
    return grads


def split_plan(plan: Plan, q, v, g, chunk: int | None = None, **overrides) -> Plan:
    """The plan with the split settings this path runs (configs_gla_bwd.BLOCKS and DIAG; ``overrides``: any of
    launch.SPLIT_KEYS, and diag)."""
    blocks = dict(configs_gla_bwd.BLOCKS)
    if chunk:
        blocks["split_BT"] = chunk
    diag = overrides.pop("diag", configs_gla_bwd.DIAG)
    blocks.update(overrides)
    p = launch.backward_plan(plan, q, v, g, IDENTITY, chunk, split=True, **blocks)
    p.config["diag"] = diag  # backward_plan's config is a copy
    return p


def backward(plan: Plan, do, q, k, v, g, h0, ht, dht, scale: float, out: dict | None = None):
    """(dq, dk, dv, dg, None, dh0) of o and the final state against do (any float dtype) and dht (or None), as
    launch.backward(native=True): dq, dk, dv in q's, k's, v's dtypes, dg and dh0 float32. ``plan``: a tl plan
    (its split settings as set, else split_plan's); ``ht`` the forward's final state (its term in dg where dht
    is given). ``out``: buffers to write (dq, dk, dv, dg, dh0: the shapes and dtypes returned), else new ones."""
    if not plan.config.get("split"):
        plan = split_plan(plan, q, v, g)
    cfg = plan.config
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    dev, f32 = v.device, torch.float32
    dtypes = (q.dtype, k.dtype, v.dtype)
    do = launch.kernel_do(plan, do, v, g)
    upcast = cfg["upcast"]  # the interpreter: bf16 on its float32 upcast, rounded once at the end
    if upcast:
        q, k, v, do = q.float(), k.float(), v.float(), do.float()
    direct = out is not None and not upcast  # the kernels wrote the caller's buffers
    dq, dk, dv, dg, dh0 = kernels_backward_gla_chunked.gradient_buffers(out, upcast, q, k, v, h0, "gla backward")
    if B * H > 0 and N > 0:
        dgq = torch.empty(B, N, H, Dk, dtype=f32, device=dev)  # the dQ kernel's q_t * dq_t
        has_ht = dht is not None and ht is not None
        calls = launch.backward_calls(plan, do, q, k, v, g, None, h0, dht, dq, dk[None], dv[None], dh0, scale,
                                      IDENTITY, r=dgq, epilogue=(dgq, dg, None))
        # the dK kernel (PART 1): the dQ kernel's parts, the forward's final state
        kernel, grid, args, kw = calls[1]
        kw = dict(kw, DGQ=dgq, HT=ht if has_ht else dgq, HAS_HT=has_ht)
        if has_ht:
            kw.update(zip(("s_ub", "s_uh", "s_uf", "s_uv"), ht.stride()))
        calls[1] = (kernel, grid, args, kw)
        with dispatch.on_device(dev):
            for kernel, grid, args, kw in calls:  # dQ first: the dK kernel reads its parts
                kernel[grid](*args, **kw)
    elif N == 0:
        dg.zero_()
        if dh0 is not None:
            dh0.copy_(dht if dht is not None else torch.zeros_like(dh0))
    if not direct:
        dq, dk, dv = dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
        if out is not None:
            for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
                out[name].copy_(t)
            dq, dk, dv = out["dq"], out["dk"], out["dv"]
    return dq, dk, dv, dg, None, dh0


def backward_split(plan: Plan, do, q, k, v, g, h0, ht, dht, scale: float, out: dict | None = None):
    """(dq, dk, dv, dg, None, dh0) as ``backward`` (the same contract), by launch's split kernels with the factored
    terms (their non-epilogue form: dq and dk float32 without the diagonal, its factor r apart), dv stored whole in
    v's dtype by the dV kernel (no beta: nothing to combine), then the combine kernel (kernels_backward) by key blocks
    of configs_gla_bwd.COMBINE_KEY_BLOCK: dq, dk whole in the inputs' dtypes and dg (per channel: no sum over
    channels, so a head's key blocks walk apart; launch's combine runs one program a head's dk and dg)."""
    if not plan.config.get("split"):
        plan = split_plan(plan, q, v, g)
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    dev, f32 = v.device, torch.float32
    dtypes = (q.dtype, k.dtype, v.dtype)
    do = launch.kernel_do(plan, do, v, g)
    upcast = plan.config["upcast"]
    if upcast:
        q, k, v, do = q.float(), k.float(), v.float(), do.float()
    direct = out is not None and not upcast  # the kernels wrote the caller's buffers
    dq, dk, dv, dg, dh0 = kernels_backward_gla_chunked.gradient_buffers(out, upcast, q, k, v, h0, "gla backward")
    if B * H > 0 and N > 0:
        dq_strict = torch.empty(B, N, H, Dk, dtype=f32, device=dev)
        dk_strict = torch.empty(1, B, N, H, Dk, dtype=f32, device=dev)
        r = torch.empty(B, N, H, dtype=f32, device=dev)
        has_dht = dht is not None and ht is not None
        BK = max(16, min(configs_gla_bwd.COMBINE_KEY_BLOCK, 1 << (Dk - 1).bit_length()))
        kblocks = -(-Dk // BK)
        with dispatch.on_device(dev):
            for kernel, grid, args, kw in launch.backward_calls(plan, do, q, k, v, g, None, h0, dht, dq_strict,
                                                                dk_strict, dv[None], dh0, scale, IDENTITY, r):
                kernel[grid](*args, **kw)
            sk = (0, 0, 0, 0)
            kernels_backward.la_bwd_combine_kernel[(B * H * kblocks,)](
                q, k, v, g, dg, ht if has_dht else dg, dht if has_dht else dg, dq_strict, dk_strict, dk_strict, r,
                dq, dk, dk, dg, dg, *q.stride(), *k.stride(), *v.stride(), *g.stride(), 0, 0, 0,
                *(ht.stride() if has_dht else sk), *(dht.stride() if has_dht else sk), dk_strict.stride(0), 0,
                N, H, 1, Dk, Dv, 1, 1, BT=configs_gla_bwd.COMBINE_TOKENS, BK=BK,
                BV=max(16, min(64, 1 << (Dv - 1).bit_length())), DECAY=CHANNEL_DECAY, STRICT=True, HAS_BETA=False,
                HAS_DHT=has_dht, KBLOCKS=kblocks, VBLOCKS=0, num_warps=4)
    elif N == 0:
        dg.zero_()
        if dh0 is not None:
            dh0.copy_(dht if dht is not None else torch.zeros_like(dh0))
    if not direct:
        dq, dk, dv = dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
        if out is not None:
            for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
                out[name].copy_(t)
            dq, dk, dv = out["dq"], out["dk"], out["dv"]
    return dq, dk, dv, dg, None, dh0

"""Eager host time a call, each op against the torch op it replaces (issue 31's target: <= 40 us), and a
check that the cached path (plans per signature, launches by key) gives the bits the first call gave.

Host time: back-to-back calls on small inputs whose GPU work is shorter than the host's, timed on the
host and divided by the calls (the GPU queue never empties then: what a user's eager loop sees).

    python experiments/common/host_time.py [--calls 3000] [--json out.json] [--ops all|first|later]

--json defaults to $OUT/host_time_<ops>.json ($OUT: /tmp/out unset). Later ops: calls 1..10 give the
first call's bits (the keyed path, session 28) as well.

--ab-lean ROUNDS (session 32): the same A/B for session 32's host cuts (tiles.launch.MEMO_SIGNATURES and
OP_RECIPES), e.g. ``--ops all --ab-lean 3 --calls 300``.

--ab-forward ROUNDS (session 33): FORWARD_RECIPES alone on vs off (the memo and OP_RECIPES on in both columns), with
--memo-column a third column with MEMO_SIGNATURES off; rows in PRIORITY order, each timed right after its first calls,
--deadline S bounding the call (the JSON written after each phase), e.g.
``--ops all --ab-forward 5 --memo-column --calls 300 --deadline 90``.

--ab-tma ROUNDS (session 30): every op timed with the kept TMA encodings on and off in one process, interleaved
rounds, medians; the same bits both ways and on calls 1..10; the mamba_dt kernel's two clamp forms against torch's
ops; with --profile CALLS, the cProfile of the over-budget ops (PROFILED) after.

--ops first: the session-24 set (gemm, hadamard, attention); later: every op added since (norm, rotary,
fft_conv, linear attention and its decode steps, hadamard_quantize, FP8 attention, varlen, the KV
cache), each against the torch code a user would otherwise write for it.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_script import host_us  # noqa: E402 (experiments/common/gpu_script.py)


def cases():
    import tilecore
    bf = dict(device=DEV[0], dtype=torch.bfloat16)
    a, b = torch.randn(256, 128, **bf), torch.randn(128, 256, **bf)
    a8 = torch.randn(256, 128, device=DEV[0]).to(torch.float8_e4m3fn)
    b8 = torch.randn(256, 128, device=DEV[0]).to(torch.float8_e4m3fn).t()
    s = torch.ones((), device=DEV[0])
    x = torch.randn(64, 4096, **bf)
    h = torch.randn(4096, 4096, **bf) / 64
    q = torch.randn(1, 32, 1, 128, **bf)
    k = torch.randn(1, 8, 4096, 128, **bf)
    qs, ks, vs = (torch.randn(1, 8, 256, 64, **bf) for _ in range(3))
    # (N 256 at 8 heads takes the split-key decode path; this one the Gluon forward: session 32's GluonForward recipe)
    qn, kn, vn = (torch.randn(1, 4, 1024, 64, **bf) for _ in range(3))
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    qg, kg, vg = (t.clone().requires_grad_() for t in (qs, ks, vs))
    xg = x.clone().requires_grad_()
    return {
        # name: (tilecore call, torch peer)
        "gemm": (lambda: tilecore.gemm(a, b), lambda: a @ b),
        "gemm_fp8": (lambda: tilecore.gemm_fp8(a8, b8, s, s), lambda: torch._scaled_mm(a8, b8, s, s, out_dtype=torch.bfloat16)),
        "hadamard": (lambda: tilecore.hadamard_transform(x), lambda: x @ h[:4096, :4096]),
        "decode": (lambda: tilecore.attention(q, k, k),
                   lambda: F.scaled_dot_product_attention(q, k, k, enable_gqa=True)),
        "attention N256": (lambda: tilecore.attention(qs, ks, vs), lambda: F.scaled_dot_product_attention(qs, ks, vs)),
        "attention N1024 (Gluon forward)": (lambda: tilecore.attention(qn, kn, vn),
                                            lambda: F.scaled_dot_product_attention(qn, kn, vn)),
        "gemm (grad recorded)": (lambda: tilecore.gemm(ag, bg), lambda: ag @ bg),
        "hadamard (grad recorded)": (lambda: tilecore.hadamard_transform(xg), lambda: xg @ h),
        "attention N256 (grad recorded)": (lambda: tilecore.attention(qg, kg, vg),
                                           lambda: F.scaled_dot_product_attention(qg, kg, vg)),
    }


def later_cases():
    """The ops added after session 24, each with the torch code it stands for (the same small shapes)."""
    import tilecore
    bf = dict(device=DEV[0], dtype=torch.bfloat16)
    x = torch.randn(64, 4096, **bf)
    w, bias = torch.randn(4096, **bf), torch.randn(4096, **bf)
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    xr = torch.randn(1, 64, 8, 128, **bf)  # rotary (B, N, H, D)
    cos, sin = torch.randn(64, 64, **bf), torch.randn(64, 64, **bf)

    def rotary_torch():
        c, s_ = cos[:, None], sin[:, None]
        a, b = xr[..., :64], xr[..., 64:]
        return torch.cat((a * c - b * s_, b * c + a * s_), -1)

    u = torch.randn(2, 64, 1024, **bf)
    kf = torch.randn(64, 1024, device=DEV[0])
    ug, kfg = u.clone().requires_grad_(), kf.clone().requires_grad_()

    def fft_torch_grad():
        n = 2 * ug.shape[-1]
        return torch.fft.irfft(torch.fft.rfft(ug.float(), n) * torch.fft.rfft(kfg, n), n)[..., :ug.shape[-1]].to(ug.dtype)

    def fft_torch():
        n = 2 * u.shape[-1]
        return torch.fft.irfft(torch.fft.rfft(u.float(), n) * torch.fft.rfft(kf, n), n)[..., :u.shape[-1]].to(u.dtype)

    ql, kl, vl = (torch.randn(1, 256, 4, 64, **bf) for _ in range(3))
    qlg, klg, vlg = (t.clone().requires_grad_() for t in (ql, kl, vl))
    # Dv 128 (two value blocks a tile): the Gluon forward (session 32's GluonForward recipe); Dv 64 above runs tl
    qlw, klw, vlw = (torch.randn(1, 256, 4, 128, **bf) for _ in range(3))
    ql2, kl2, vl2 = (torch.randn(4, 8, 64, **bf) for _ in range(3))
    state = torch.randn(4, 8, 64, 64, device=DEV[0])
    xm = torch.randn(4, 32, 64, **bf)
    dt, A = torch.rand(4, 32, device=DEV[0]), -torch.rand(32, device=DEV[0])
    Bm, Cm = torch.randn(4, 1, 128, **bf), torch.randn(4, 1, 128, **bf)
    mstate = torch.randn(4, 32, 64, 128, device=DEV[0])
    state0, mstate0 = state.clone(), mstate.clone()
    RESETS["linear_attention_step"] = lambda: state.copy_(state0)
    RESETS["mamba2_step"] = lambda: mstate.copy_(mstate0)

    def mamba_torch():  # what mamba_ssm's reference selective_state_update does, in torch
        da = torch.exp(dt * A)[..., None, None]
        mstate.mul_(da).add_((dt[..., None] * xm.float())[..., None] * Bm.float()[:, :, None, :])
        return torch.einsum("bhps,bgs->bhp", mstate, Cm.float()).to(xm.dtype)

    from tilecore.ops.linear_attention import mamba_dt

    # mamba2_step's dt in one launch (mamba_dt.py, off by default: MAMBA_DT_KERNEL) against the torch ops the
    # step runs on it now (clamp to dt_limit's default (0, inf), times A)
    def dt_kernel():
        return mamba_dt.mamba_dt(dt, None, A, (0.0, float("inf")), key=("host_time mamba_dt",))

    xq = torch.randn(64, 4096, **bf)
    h = torch.randn(4096, 4096, **bf) / 64
    q8 = torch.randn(1, 8, 256, 128, **bf)
    f8 = torch.float8_e4m3fn
    q8f, k8f = q8.to(f8), q8.to(f8)
    from tilecore.ops.attention_fp8 import quantize_fp8
    v8f, v8s = quantize_fp8(q8, layout="keys_permuted")
    one = torch.ones(1, 8, device=DEV[0])
    lens = torch.tensor([0, 100, 300, 512], dtype=torch.int32, device=DEV[0])
    qv = torch.randn(512, 8, 64, **bf)
    qpad = torch.randn(3, 8, 212, 64, **bf)
    B, pages, psize = 4, 64, 64
    kc, vc = torch.randn(pages, psize, 8, 128, **bf), torch.randn(pages, psize, 8, 128, **bf)
    table = torch.arange(pages, dtype=torch.int32, device=DEV[0]).view(B, pages // B)
    seqlens = torch.full((B,), 1000, dtype=torch.int32, device=DEV[0])
    qd = torch.randn(B, 1, 32, 128, **bf)
    kd = torch.randn(B, 8, 1000, 128, **bf)
    return {
        "layer_norm": (lambda: tilecore.layer_norm(x, w, bias), lambda: F.layer_norm(x, (4096,), w, bias)),
        "rms_norm": (lambda: tilecore.layer_norm(x, w, rms=True), lambda: F.rms_norm(x, (4096,), w)),
        "rms_norm (grad recorded)": (lambda: tilecore.layer_norm(xg, wg, rms=True),
                                     lambda: F.rms_norm(xg, (4096,), wg)),
        "apply_rotary": (lambda: tilecore.apply_rotary(xr, cos, sin), rotary_torch),
        "fft_conv": (lambda: tilecore.fft_conv(u, kf), fft_torch),
        "fft_conv (grad recorded)": (lambda: tilecore.fft_conv(ug, kfg), fft_torch_grad),
        "linear_attention": (lambda: tilecore.linear_attention(ql, kl, vl),
                             lambda: torch.tril(ql.transpose(1, 2) @ kl.transpose(1, 2).transpose(-1, -2)) @ vl.transpose(1, 2)),
        "linear_attention (grad recorded)": (lambda: tilecore.linear_attention(qlg, klg, vlg),
                                             lambda: torch.tril(qlg.transpose(1, 2) @ klg.transpose(1, 2).transpose(-1, -2))
                                             @ vlg.transpose(1, 2)),
        "linear_attention Dv128 (Gluon forward)": (lambda: tilecore.linear_attention(qlw, klw, vlw),
                                                   lambda: torch.tril(qlw.transpose(1, 2) @ klw.transpose(1, 2)
                                                                      .transpose(-1, -2)) @ vlw.transpose(1, 2)),
        "linear_attention_step": (lambda: tilecore.linear_attention_step(ql2, kl2, vl2, state),
                                  lambda: (state.add_(kl2.float()[..., None] * vl2.float()[..., None, :]),
                                           torch.einsum("bhf,bhfv->bhv", ql2.float(), state))),
        "mamba2_step": (lambda: tilecore.mamba2_step(mstate, xm, dt, A, Bm, Cm), mamba_torch),
        "mamba2_step's dt: one launch (torch: its two ops)": (dt_kernel, lambda: (dt.clamp(0.0, float("inf")),
                                                                                    dt.clamp(0.0, float("inf")) * A)),
        "hadamard_quantize fp8": (lambda: tilecore.hadamard_quantize(xq, format="fp8_e4m3"),
                                  lambda: (xq @ h).to(torch.float8_e4m3fn)),
        "attention_fp8 N256": (lambda: tilecore.attention_fp8(q8f, k8f, v8f, q_scale=one, k_scale=one, v_scale=v8s,
                                                              v_layout="keys_permuted", check_scales=False),
                               lambda: F.scaled_dot_product_attention(q8, q8, q8)),
        "attention_varlen 3 seqs": (lambda: tilecore.attention_varlen(qv, qv, qv, lens, lens, 212, 212, causal=True),
                                    lambda: F.scaled_dot_product_attention(qpad, qpad, qpad, is_causal=True)),
        "paged decode": (lambda: tilecore.attention_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, block_table=table),
                         lambda: F.scaled_dot_product_attention(qd.transpose(1, 2), kd, kd, enable_gqa=True)),
    }


DEV = ["cuda"]  # --smoke: ["cpu"] (the script's plumbing on CPU tensors: torch's CPU paths, no timing worth reading)


def sync():
    if DEV[0] == "cuda":
        torch.cuda.synchronize()


RESETS = {}  # later_cases' ops with a state: name -> put the state back as later_cases made it


def per_call_us(fn, calls):
    return host_us(fn, calls)


def same_bits_each_call():
    """First call (planned, launched the checked way), second (keyed first launch), tenth (cached):
    identical outputs and gradients."""
    import tilecore
    torch.manual_seed(0)
    bf = dict(device=DEV[0], dtype=torch.bfloat16)
    results = {}
    inputs = {
        "gemm": [torch.randn(300, 72, **bf, requires_grad=True), torch.randn(72, 264, **bf, requires_grad=True)],
        "hadamard": [torch.randn(33, 1024, **bf, requires_grad=True)],
        "attention causal gqa": [torch.randn(2, 8, 300, 128, **bf, requires_grad=True),
                                 torch.randn(2, 2, 300, 128, **bf, requires_grad=True),
                                 torch.randn(2, 2, 300, 128, **bf, requires_grad=True)],
        "attention d64": [torch.randn(1, 4, 1000, 64, **bf, requires_grad=True) for _ in range(3)],
        "decode": [torch.randn(2, 32, 1, 128, **bf), torch.randn(2, 8, 3000, 128, **bf),
                   torch.randn(2, 8, 3000, 128, **bf)],
    }
    fns = {"gemm": tilecore.gemm, "hadamard": tilecore.hadamard_transform,
           "attention causal gqa": lambda q, k, v: tilecore.attention(q, k, v, causal=True),
           "attention d64": tilecore.attention, "decode": tilecore.attention}
    for name, ins in inputs.items():
        outs, g = [], None
        for i in range(10):
            for t in ins:
                t.grad = None
            y = fns[name](*ins)
            g = torch.randn_like(y) if g is None else g  # the same gradient each call
            if y.requires_grad:
                y.backward(g)
            outs.append([y.detach().clone()] + [t.grad.clone() for t in ins if t.grad is not None])
        same = all(all(torch.equal(a, b) for a, b in zip(outs[0], o)) for o in outs[1:])
        results[name] = True if same else _which_differ(outs, ["out"] + [f"grad {i}" for i in range(len(ins))])
    return results


def _which_differ(outs, names):
    """Which of a call's tensors differ from the first call's, on which calls, by how much (max |diff| over
    max |first|): for telling a launch that went wrong from a reduction whose order varies (attention's dQ by
    TMA reduce-adds: D64's "warpgroup" and D128 causal's "fused" dQ modes)."""
    parts = []
    for j, name in enumerate(names[:len(outs[0])]):
        calls = [i + 1 for i, o in enumerate(outs) if not torch.equal(o[j], outs[0][j])]
        if calls:
            worst = max(float((o[j].float() - outs[0][j].float()).abs().max()) for o in outs)
            scale = float(outs[0][j].float().abs().max()) or 1.0
            parts.append(f"{name} on calls {calls} (max |diff| / max |first| {worst / scale:.1e})")
    return "differ: " + "; ".join(parts)


def varlen_ranked_cases():
    """varlen's work table in one launch (varlen_work.py, off by default: VARLEN_RANKED_TABLE) against the
    two-step table: the Gluon forward keyed with and without it (host us a call, and the same output)."""
    from tilecore.ops.attention_varlen import configs, op as varlen
    bf = dict(device=DEV[0], dtype=torch.bfloat16)
    lens = torch.tensor([0, 100, 300, 512], dtype=torch.int32, device=DEV[0])
    qv = torch.randn(512, 8, 64, **bf)
    config = configs.VARLEN_GLUON_FORWARD_CONFIG[64]

    def forward(ranked):
        return varlen.forward_gluon(qv, qv, qv, lens, lens, True, 0.125, 0.0, config={**config, "ranked_table": ranked},
                                    key=("host_time varlen", ranked))[0]
    return {"varlen Gluon forward, ranked table": (lambda: forward(True), lambda: forward(False))}


def varlen_ranked_table_check():
    """The one-launch table (ranked) equals the sorted two-step table and work_table_torch on the GPU:
    random batches of 1..64 sequences with ties and zero lengths. Returns {case: True/False/error}."""
    from tilecore.ops.attention_varlen import op as varlen
    results = {}
    gen = torch.Generator().manual_seed(0)
    for batch, tile_m, heads in ((1, 128, 8), (3, 128, 8), (17, 128, 4), (64, 128, 2), (64, 64, 3)):
        try:
            lens_q = torch.randint(0, 700, (batch,), generator=gen)
            lens_q[::3] = lens_q[0]
            lens_k = torch.where(torch.arange(batch) % 2 == 0, lens_q, torch.randint(0, 700, (batch,), generator=gen))
            cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), lens_q.cumsum(0)]).to(torch.int32).cuda()
            cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lens_k.cumsum(0)]).to(torch.int32).cuda()
            total = int(cu_q[-1])
            ranked = varlen.work_table(cu_q, cu_k, total, heads, tile_m, ranked=True)
            two_step = varlen.work_table(cu_q, cu_k, total, heads, tile_m, ranked=False)
            torch_ops = varlen.work_table_torch(cu_q, cu_k, total, heads, tile_m)
            results[f"B{batch} tile{tile_m} H{heads}"] = bool(torch.equal(ranked, two_step)
                                                              and torch.equal(ranked, torch_ops))
        except Exception as err:  # noqa: BLE001
            results[f"B{batch} tile{tile_m} H{heads}"] = f"{type(err).__name__}: {err}"
    return results


def _same_bits_or_both_nan(a, b):
    """Equal bits where b is a number, NaN where b is NaN (a NaN's payload is the arithmetic's)."""
    a, b = a.contiguous(), b.contiguous()
    nan = b.isnan()
    return a.shape == b.shape and bool(torch.equal(a.isnan(), nan)) and bool(
        torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32)))


def _first_difference(x, inp, got, want):
    """The first element where ``got`` and ``want`` differ in bits (NaN payloads aside), as hex: for the check's
    report."""
    got, want, x = got.contiguous().flatten(), want.contiguous().flatten(), inp.contiguous().flatten().float()
    differs = (got.view(torch.int32) != want.view(torch.int32)) & ~(got.isnan() & want.isnan())
    if not bool(differs.any()):
        return None
    i = int(differs.nonzero()[0])
    hexes = [f"{float(v):.9g} ({int(torch.tensor([float(v)]).view(torch.int32)) & 0xffffffff:08x})"
             for v in (x[i], got[i], want[i])]
    return f"{int(differs.sum())} differ; first at {i}: dt {hexes[0]} kernel {hexes[1]} torch {hexes[2]}"


def mamba_dt_check(clamp="select"):
    """mamba_dt's kernel (dt_eff and g in one launch, OFF until this passes) in the ``clamp`` form against
    op._mamba_dt's torch ops on the GPU, bit for bit: strided / contiguous dt, with and without a bias, each
    dt_limit form, NaN and -0.0 entries. Returns {case: True / the first differing element / error}."""
    from tilecore.ops.linear_attention import mamba_dt

    def torch_ops(dt, bias, limit):  # what mamba2_step runs on dt without the kernel (op._mamba_dt, no softplus)
        d = dt.float() if bias is None else dt.float() + bias.float()
        return d.clamp(*limit) if limit[0] > float("-inf") or limit[1] < float("inf") else d

    results = {}
    gen = torch.Generator(device="cpu").manual_seed(3)
    for B, H in ((1, 8), (4, 32), (64, 80), (300, 128)):
        for with_bias in (False, True):
            for limit in ((0.0, float("inf")), (0.01, 0.3), (float("-inf"), float("inf"))):
                name = f"B{B} H{H} bias{int(with_bias)} limit{limit}"
                try:
                    dt = torch.randn(H, B, generator=gen).to(DEV[0]).t() if B % 2 else torch.randn(B, H, generator=gen).to(DEV[0])
                    dt[0, 0] = float("nan")
                    dt[-1, -1] = -0.0
                    bias = torch.randn(H, generator=gen).to(DEV[0], torch.bfloat16) if with_bias else None
                    A = (-torch.rand(H, generator=gen) * 4).to(DEV[0])
                    d_ref = torch_ops(dt, bias, limit)
                    g_ref = d_ref * A
                    d, g = mamba_dt.mamba_dt(dt, bias, A, limit, clamp=clamp)
                    ok = all(_same_bits_or_both_nan(a, b) for a, b in ((d, d_ref), (g, g_ref)))
                    results[name] = True if ok else (f"dt_eff: {_first_difference(dt, dt, d, d_ref)}; "
                                                     f"g: {_first_difference(dt, dt, g, g_ref)}")
                except Exception as err:  # noqa: BLE001
                    results[name] = f"{type(err).__name__}: {err}"
    return results


def same_bits_later(table, calls=10):
    """The later ops: calls 1 (checked, planned), 2 (keyed first launch) and 3..``calls`` (keyed, cached)
    give the first call's bits (ops with a state are given a fresh copy each call)."""
    results = {}
    for name, (ours, _) in table.items():
        if "grad" in name:
            continue
        try:
            torch.manual_seed(0)
            outs = []
            for _ in range(calls):
                RESETS.get(name, lambda: None)()
                y = ours()
                ys = y if isinstance(y, (tuple, list)) else (y,)
                outs.append([t.detach().clone() for t in ys if isinstance(t, torch.Tensor)])
            results[name] = all(len(o) == len(outs[0]) and all(a.shape == b.shape and torch.equal(a, b)
                                                                for a, b in zip(outs[0], o)) for o in outs[1:])
        except Exception as err:  # noqa: BLE001
            results[name] = f"{type(err).__name__}: {err}"
    return results


PROFILED = ("attention N256", "attention N1024 (Gluon forward)", "linear_attention Dv128 (Gluon forward)", "attention N256 (grad recorded)", "decode", "gemm_fp8", "fft_conv", "attention_varlen 3 seqs", "paged decode", "attention_fp8 N256", "mamba2_step", "layer_norm",
            "rms_norm (grad recorded)", "linear_attention (grad recorded)")


def profile_rows(table, names, calls, top=12):
    """Where each named op's host time goes: cProfile over ``calls`` back-to-back calls (after a warm-up),
    the ``top`` functions by their own time, in us a call (cProfile's own overhead inflates each a little:
    read them as shares). Returns {op: [(us a call own, us a call cumulative, calls a call, function)]}."""
    import cProfile
    import pstats

    out = {}
    for name in names:
        if name not in table:
            continue
        ours = table[name][0]
        try:
            for _ in range(min(50, calls)):
                ours()
            sync()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                ours()
            prof.disable()
            sync()
            stats = pstats.Stats(prof).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
            rows = sorted(((tt / calls * 1e6, ct / calls * 1e6, nc / calls,
                            f"{os.path.basename(f)}:{line}:{func}") for (f, line, func), (cc, nc, tt, ct, _)
                           in stats.items()), reverse=True)[:top]
            out[name] = [(round(a, 2), round(b, 2), round(c, 2), d) for a, b, c, d in rows]
        except Exception as err:  # noqa: BLE001
            out[name] = f"{type(err).__name__}: {err}"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json")
    ap.add_argument("--ops", choices=("all", "first", "later"), default="all")
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="also cProfile the over-budget ops (PROFILED) over CALLS calls each (0: no profile)")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors, 3 calls: the script's imports and shapes")
    ap.add_argument("--no-tma-cache", action="store_true",
                    help="leave tiles.launch's kept TMA encodings off (default: on for this run, checked by the bits)")
    ap.add_argument("--ab-tma", type=int, default=0, metavar="ROUNDS",
                    help="time every op with and without the kept TMA encodings in this process, ROUNDS interleaved "
                         "rounds (on/off, then off/on), and check both give the same bits; medians reported")
    ap.add_argument("--ab-bind", type=int, default=0, metavar="ROUNDS",
                    help="(session 31) the same A/B for tiles.launch.BIND_KEYED_LAUNCHES: the kept keyed launches and "
                         "the per-key launch recipes (attention decode, KV cache, mamba2_step, ...) on vs off")
    ap.add_argument("--ab-lean", type=int, default=0, metavar="ROUNDS",
                    help="(session 32) the same A/B for session 32's host cuts: tiles.launch.MEMO_SIGNATURES (each call "
                         "site's signature checked against its last one in one C call) and OP_RECIPES (gemm's, the "
                         "norms' and linear attention's kept per-key launches) on vs off")
    ap.add_argument("--ab-forward", type=int, default=0, metavar="ROUNDS",
                    help="(session 33) the same A/B for tiles.launch.FORWARD_RECIPES alone (attention's and LA's Gluon "
                         "forward recipes), MEMO_SIGNATURES and OP_RECIPES on in both columns")
    ap.add_argument("--memo-column", action="store_true",
                    help="with --ab-forward: a third column with MEMO_SIGNATURES off (FORWARD_RECIPES on)")
    ap.add_argument("--deadline", type=float, default=0.0, metavar="S",
                    help="A/B modes: after S seconds no more rows' first calls, checks, rounds or profile (0: none)")
    ap.add_argument("--skip-mamba-dt", action="store_true", help="leave out the mamba_dt kernel's bit check")
    a = ap.parse_args()
    if not a.no_tma_cache:  # before any launch: every key's direct launch keeps its encodings
        from tilecore.tiles import launch as tiles_launch
        tiles_launch.cache_tma_descriptors(True)
    if a.smoke:
        DEV[0] = "cpu"
        a.calls, a.profile = 3, (3 if a.profile else 0)
    if a.ab_tma:
        return main_ab(a)
    if a.ab_bind:
        return main_ab(a, "bind")
    if a.ab_lean:
        return main_ab(a, "lean")
    if a.ab_forward:
        return main_ab(a, "forward")
    if a.json is None:  # $OUT (the GPU runs' folder), else /tmp/out
        out_dir = os.environ.get("OUT", "/tmp/out")
        os.makedirs(out_dir, exist_ok=True)
        a.json = os.path.join(out_dir, f"host_time_{a.ops}.json")
    rows = []
    table = {}
    for make in ((cases,) if a.ops == "first" else (later_cases,) if a.ops == "later" else (cases, later_cases)):
        try:
            table.update(make())
        except Exception as err:  # noqa: BLE001
            rows.append({"op": make.__name__, "error": f"{type(err).__name__}: {err}"})
    for name, (ours, peer) in table.items():
        try:
            rows.append({"op": name, "tilecore_us": per_call_us(ours, a.calls), "torch_us": per_call_us(peer, a.calls)})
        except Exception as err:  # noqa: BLE001
            rows.append({"op": name, "error": f"{type(err).__name__}: {err}"})
    bits = same_bits_each_call() if a.ops != "later" else {}
    ranked_check = {}
    if a.ops != "first":
        try:
            bits.update(same_bits_later(later_cases()))
        except Exception as err:  # noqa: BLE001
            bits["later"] = f"{type(err).__name__}: {err}"
    if a.ops != "first" and not a.smoke:  # (varlen's table kernels: CUDA only)
        try:
            ranked = varlen_ranked_cases()
            for name, (with_ranked, two_step) in ranked.items():
                same = all(torch.equal(with_ranked(), two_step()) for _ in range(3))
                rows.append({"op": name + " (torch column: the two-step table)", "same_output": same,
                             "tilecore_us": per_call_us(with_ranked, a.calls), "torch_us": per_call_us(two_step, a.calls)})
        except Exception as err:  # noqa: BLE001
            rows.append({"op": "varlen ranked table", "error": f"{type(err).__name__}: {err}"})
        ranked_check = varlen_ranked_table_check()
    mamba_check = run_mamba_dt_checks() if a.ops != "first" and not a.skip_mamba_dt else {}
    profiles = profile_rows(table, PROFILED, a.profile) if a.profile else {}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if DEV[0] == "cuda" else "cpu", "torch": torch.__version__,
                       "tma_cache": not a.no_tma_cache,
                       "host_us": rows, "same_bits_each_call": bits, "varlen_ranked_table_equal": ranked_check,
                       "profile_us_a_call": profiles, "mamba_dt_equal_torch_ops": mamba_check}, f, indent=1)
    for name, prof in profiles.items():
        print(f"== profile {name} (us a call: own, cumulative, calls a call, function)")
        for line in (prof if isinstance(prof, list) else [prof]):
            print("  ", *line) if isinstance(line, tuple) else print("  ", line)
    print_mamba_dt_checks(mamba_check)
    print("same bits on calls 1..10 (outputs and gradients):", bits)
    if ranked_check:
        print("varlen ranked work table == two-step table == torch ops table (GPU):", ranked_check)
    print(f"{'op':34s} {'tilecore us':>12s} {'torch us':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['op']:34s} {r['error']}")
        else:
            same = "" if "same_output" not in r else f"  same output: {r['same_output']}"
            print(f"{r['op']:34s} {r['tilecore_us']:12.1f} {r['torch_us']:9.1f}{same}")


def run_mamba_dt_checks():
    """mamba_dt_check for each clamp form: {form: {case: result}}."""
    out = {}
    for form in ("select", "max"):
        try:
            out[form] = mamba_dt_check(form)
        except Exception as err:  # noqa: BLE001
            out[form] = {"error": f"{type(err).__name__}: {err}"}
    return out


def print_mamba_dt_checks(checks):
    for form, check in checks.items():
        bad = {k: v for k, v in check.items() if v is not True}
        print(f"mamba_dt kernel ({form!r} clamp) == torch ops bit for bit: {len(check) - len(bad)}/{len(check)}",
              "ALL PASS" if not bad else "FAIL")
        for k, v in bad.items():
            print(f"   {k}: {v}")


def main_ab(a, what="tma"):
    """--ab-tma: each op timed with the kept TMA encodings on and off in one process (interleaved rounds, the
    order rotated each round; torch's op once a round), medians; both ways the same bits, and the same bits on
    calls 1..10 with them on. --ab-bind (what="bind"): the same for the kept keyed launches and per-key recipes
    (tiles.launch.BIND_KEYED_LAUNCHES), with the TMA encodings on throughout. --ab-lean: session 32's three
    switches together. --ab-forward (session 33): FORWARD_RECIPES alone (MEMO_SIGNATURES and OP_RECIPES on in both
    columns), with --memo-column a third column with MEMO_SIGNATURES off (FORWARD_RECIPES on): the memo's share per
    row (session 33's fft_conv and hadamard_quantize sites among them).

    Order (session 33, for a bounded device call): each row's first calls (compiles, the same bits in every column)
    are followed at once by its first timed round, rows in PRIORITY order; then the same bits on calls 1..10; then
    rounds 2.. while --deadline allows; then the profile if time is left. The JSON is written after each phase, so
    a call cut short keeps what it measured."""
    import statistics

    from tilecore.tiles import launch as tiles_launch

    start = time.monotonic()
    deadline = start + a.deadline if a.deadline else float("inf")

    def lean(on):  # session 32's cuts, each switch where this snapshot has it
        for name in ("memo_signatures", "keep_op_recipes", "keep_forward_recipes"):
            if hasattr(tiles_launch, name):
                getattr(tiles_launch, name)(on)

    def forward(on):  # FORWARD_RECIPES alone; the session-32 switches on (their shipped defaults)
        tiles_launch.memo_signatures(True)
        tiles_launch.keep_op_recipes(True)
        tiles_launch.keep_forward_recipes(on)

    def memo_off():  # FORWARD_RECIPES on, MEMO_SIGNATURES off: each call site builds its signature
        forward(True)
        tiles_launch.memo_signatures(False)

    set_switch = {"tma": tiles_launch.cache_tma_descriptors, "bind": tiles_launch.bind_keyed_launches,
                  "lean": lean, "forward": forward}[what]
    columns = {"on": lambda: set_switch(True), "off": lambda: set_switch(False)}
    if what == "forward" and a.memo_column:
        columns["memo_off"] = memo_off
    rounds = {"tma": a.ab_tma, "bind": a.ab_bind, "lean": a.ab_lean, "forward": a.ab_forward}[what]
    label = {"tma": "kept TMA encodings", "bind": "kept keyed launches + per-key recipes (BIND_KEYED_LAUNCHES)",
             "lean": "session 32's signature memo + gemm/norm/LA recipes (MEMO_SIGNATURES, OP_RECIPES)",
             "forward": "attention's and LA's Gluon forward recipes (FORWARD_RECIPES; memo and OP_RECIPES on)"}[what]
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    path = a.json or os.path.join(out_dir, f"host_time_ab_{what}_{a.ops}.json")
    table, errors = {}, {}
    for make in ((cases,) if a.ops == "first" else (later_cases,) if a.ops == "later" else (cases, later_cases)):
        try:
            table.update(make())
        except Exception as err:  # noqa: BLE001
            errors[make.__name__] = f"{type(err).__name__}: {err}"
    order = [n for n in PRIORITY if n in table] + [n for n in table if n not in PRIORITY]
    times = {name: {**{c: [] for c in columns}, "torch": []} for name in table}
    same_on_off, bits, profiles, mamba_check, cut = {}, {}, {}, {}, []
    names = list(columns)

    def time_round(name, r):
        ours, peer = table[name]
        try:
            for c in names[r % len(names):] + names[:r % len(names)]:  # the columns' order rotated each round
                columns[c]()
                times[name][c].append(per_call_us(ours, a.calls))
            times[name]["torch"].append(per_call_us(peer, a.calls))
        except Exception as err:  # noqa: BLE001
            errors[name] = f"{type(err).__name__}: {err}"

    def write(phase):
        rows = []
        for name in order:
            t = times[name]
            if name in errors or not t["on"]:
                rows.append({"op": name, "error": errors.get(name, "cut by --deadline" if name in cut else "not timed")})
                continue
            med = {k: statistics.median(v) for k, v in t.items() if v}
            rows.append({"op": name, **{f"{k}_us": v for k, v in med.items()}, "rounds": t})
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if DEV[0] == "cuda" else "cpu", "torch": torch.__version__,
                       "calls": a.calls, "rounds": rounds, "phase": phase, "wall_s": round(time.monotonic() - start, 1),
                       "host_us": rows, "switch": what, "columns": names, "same_bits_on_vs_off": same_on_off,
                       "same_bits_each_call_tma_on": bits, "mamba_dt_equal_torch_ops": mamba_check,
                       "profile_us_a_call": profiles, "errors": errors}, f, indent=1)
        return rows

    for name in order:  # each row: the first calls in every column (compiles; the same bits), then round 1
        if time.monotonic() > deadline:
            cut.append(name)
            continue
        ours = table[name][0]
        print(f"{name}: first calls ({time.monotonic() - start:.0f} s)", flush=True)
        try:
            outs = []
            for c in names + names[:1]:
                columns[c]()
                RESETS.get(name, lambda: None)()
                y = ours()
                ys = y if isinstance(y, (tuple, list)) else (y,)
                outs.append([t.detach().clone() for t in ys if isinstance(t, torch.Tensor)])
            same_on_off[name] = all(torch.equal(x, y) for o in outs[1:] for x, y in zip(outs[0], o))
        except Exception as err:  # noqa: BLE001
            same_on_off[name] = f"{type(err).__name__}: {err}"
        time_round(name, 0)
    columns["on"]()
    write("first round")
    try:
        if a.ops != "later" and time.monotonic() < deadline:  # first off, then on: a difference in both is not theirs
            columns["off"]()
            bits.update({f"{k} (switch off)": v for k, v in same_bits_each_call().items() if v is not True})
            columns["on"]()
            bits.update(same_bits_each_call())
        if a.ops != "first" and time.monotonic() < deadline:
            bits.update(same_bits_later(later_cases()))
    except Exception as err:  # noqa: BLE001
        bits["error"] = f"{type(err).__name__}: {err}"
    columns["on"]()
    if a.ops != "first" and not a.skip_mamba_dt and time.monotonic() < deadline:
        mamba_check = run_mamba_dt_checks()
    write("bits")
    timed = [n for n in order if n not in cut and n not in errors]
    for r in range(1, rounds):
        t0 = time.monotonic()
        print(f"round {r + 1}/{rounds} ({t0 - start:.0f} s)", flush=True)
        for name in timed:
            if name not in errors:
                time_round(name, r)
        if time.monotonic() + (time.monotonic() - t0) > deadline:
            print(f"--deadline: rounds stop after {r + 1}", flush=True)
            break
    columns["on"]()
    if a.profile and time.monotonic() < deadline:
        profiles.update(profile_rows(table, PROFILED, a.profile))
    rows = write("done")
    for name, prof in profiles.items():
        print(f"== profile {name} (us a call: own, cumulative, calls a call, function)")
        for line in (prof if isinstance(prof, list) else [prof]):
            print("  ", *line) if isinstance(line, tuple) else print("  ", line)
    print_mamba_dt_checks(mamba_check)
    print(f"same bits, {label}, every column ({', '.join(names)}):", same_on_off)
    print("same bits on calls 1..10 with it on (outputs and gradients):", bits)
    n_rounds = max((len(t["on"]) for t in times.values()), default=0)
    print(f"{label} A/B, up to {n_rounds} interleaved rounds of {a.calls} calls, medians (us a call); "
          f"{time.monotonic() - start:.0f} s")
    extra = "memo_off" in names
    print(f"{'op':40s} {'on':>7s} {'off':>7s} {'on/off':>7s}" + (f" {'memo off':>8s} {'on/mo':>6s}" if extra else "")
          + f" {'torch':>7s}")
    for r in rows:
        if "error" in r:
            print(f"{r['op'][:40]:40s} {r['error']}")
        else:
            line = f"{r['op'][:40]:40s} {r['on_us']:7.1f} {r['off_us']:7.1f} {r['on_us'] / r['off_us']:7.3f}"
            if extra:
                line += f" {r['memo_off_us']:8.1f} {r['on_us'] / r['memo_off_us']:6.3f}"
            print(line + f" {r['torch_us']:7.1f}")


# --ab-forward's row order: the rows its switch (and the memo column's new sites) touch come first, so that a call
# cut by --deadline has measured them
PRIORITY = ("attention N1024 (Gluon forward)", "linear_attention Dv128 (Gluon forward)", "fft_conv",
            "hadamard_quantize fp8", "fft_conv (grad recorded)", "gemm", "attention N256", "layer_norm")


if __name__ == "__main__":
    main()

"""gluon_scalar_bwd: the backward by three walks of the forward's shape (dq, dk, dv in their roles). The Gluon kernel
cannot run here: its role table (the module's docstring: which tensors are A, B, X, E, the masks, the per-token
factors, the walk's direction, the epilogue's diagonal and parts) is emulated chunk by chunk in float64 torch below,
exactly as la_bwd_gluon_kernel's ``compute`` orders it, and checked against float64 autograd of the reference
(beta, grouped q/k heads, a reset, N not a multiple of the chunk, h0 and the final state's gradient); the kernel
compiles for sm_90a with TMA, wgmma and bounded spills (a subprocess: the session runs under the interpreter), and
launch.backward_plan routes to it only where configs.BWD_GLUON says, never in the interpreter."""
import pytest
import torch
from compiled_run import compiled_json

from tilecore.ops.linear_attention import configs, gluon_scalar_bwd, launch, linear_attention_reference
from tilecore.ops.linear_attention.plan import IDENTITY, plan
from tilecore.tiles.switches import patched

F64 = torch.float64
LOG2E = 1.4426950408889634


def role_tensors(role, q, k, v, do):
    """(A, B, X, E) of a role, per v head (q/k heads repeated), as launch_args picks them."""
    return {"dq": (do, v, k, q), "dk": (v, do, q, k), "dv": (k, q, do, v)}[role]


def emulate(role, q, k, v, do, g, beta, state0, scale, BT):
    """The kernel's walk for one role in float64: (out, part) with out the role's output (B, N, H, D) and part the
    per-token part (B, N, H) (None where the role writes none); for dv also the walk's last state (dh0)."""
    B, N, H, _ = v.shape
    A, Bm, X, E = role_tensors(role, q, k, v, do)
    decay, has_beta = g is not None, beta is not None
    din, dout = A.shape[-1], X.shape[-1]
    nc = -(-N // BT)
    pad = nc * BT - N
    padt = lambda t: torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) if t.dim() == 4 else \
        torch.nn.functional.pad(t, (0, 0, 0, pad))  # noqa: E731
    A, Bm, X, E = (padt(t) for t in (A, Bm, X, E))
    gp = padt(g.clamp_min(-100.0)) if decay else torch.zeros(B, N + pad, H, dtype=F64)
    bp = padt(beta) if has_beta else torch.ones(B, N + pad, H, dtype=F64)
    # G: the cumulative log2 decay from each chunk's start (the pad's g is 0)
    G = (gp * LOG2E).view(B, nc, BT, H).cumsum(2).view(B, N + pad, H)
    out = torch.zeros(B, N + pad, H, dout, dtype=F64)
    part = torch.zeros(B, N + pad, H, dtype=F64)
    if state0 is None:
        S = torch.zeros(B, H, din, dout, dtype=F64)
    else:
        S = state0.clone() if role == "dv" else state0.transpose(-1, -2).clone()  # (rows Din, columns the output's)
    r_idx = torch.arange(BT)
    for step in range(nc):
        c = step if role == "dq" else nc - 1 - step
        sl = slice(c * BT, (c + 1) * BT)
        a, b, x, e = (t[:, sl].permute(0, 2, 1, 3) for t in (A, Bm, X, E))  # (B, H, BT, D)
        Gc = G[:, sl].permute(0, 2, 1)  # (B, H, BT)
        be = bp[:, sl].permute(0, 2, 1)
        ok = ((c * BT + r_idx) < N).to(F64)
        G_last = Gc[..., -1:]
        rr, cc = r_idx[:, None], r_idx[None, :]
        if role == "dq":
            keep = rr > cc if decay else rr >= cc
            diff = Gc[..., :, None] - Gc[..., None, :]
            rowf = scale * torch.exp2(Gc)
            w = torch.exp2(G_last - Gc) * ok * be
        else:
            keep = cc > rr if (role == "dk" and decay) else cc >= rr
            diff = Gc[..., None, :] - Gc[..., :, None]
            rowf = torch.exp2(G_last - Gc)
            w = scale * torch.exp2(Gc) * ok
        s = a @ b.transpose(-1, -2)
        p = s * scale * torch.exp2(torch.where(keep, diff, torch.tensor(float("-inf"), dtype=F64)))
        if role == "dq":
            p = p * be[..., None, :]
        p = torch.where(keep, p, 0.0)
        o = rowf[..., None] * (a @ S) + p @ x
        S = torch.exp2(G_last)[..., None] * S + b.transpose(-1, -2) @ (w[..., None] * x)
        wrote = False
        if role in ("dq", "dk") and decay:
            r = scale * torch.diagonal(s, dim1=-2, dim2=-1)
            if role == "dq":
                pt = (e * o).sum(-1)
                o = o + (be * r)[..., None] * x
            else:
                o = o * be[..., None]
                pt = (e * o).sum(-1)
                o = o + (be * r)[..., None] * x
            wrote = True
        elif role == "dv" and has_beta:
            pt = (e * o).sum(-1)
            o = o * be[..., None]
            wrote = True
        out[:, sl] = o.permute(0, 2, 1, 3)
        if wrote:
            part[:, sl] = pt.permute(0, 2, 1)
    wrote_parts = (role != "dv" and decay) or (role == "dv" and has_beta)
    return out[:, :N], part[:, :N] if wrote_parts else None, S


def grads_by_emulation(q, k, v, do, g, beta, h0, dht, ht, scale, BT):
    """(dq, dk, dv, dg, dbeta, dh0) as launch.backward_gluon assembles them from the three walks."""
    H, Hqk = v.shape[2], q.shape[2]
    group = H // Hqk
    qh, kh = q.repeat_interleave(group, 2), k.repeat_interleave(group, 2)
    dq, dg_q, _ = emulate("dq", qh, kh, v, do, g, beta, h0, scale, BT)
    dk, dg_k, _ = emulate("dk", qh, kh, v, do, g, beta, dht, scale, BT)
    dv, dbeta, dh0 = emulate("dv", qh, kh, v, do, g, beta, dht, scale, BT)
    dg = None
    if g is not None:
        dg = launch.decay_grad(g, ht if dht is not None else None, dht, dg_q - dg_k)
    B, N = v.shape[:2]
    dq = dq.view(B, N, Hqk, group, -1).sum(3)
    dk = dk.view(B, N, Hqk, group, -1).sum(3)
    return dq, dk, dv, dg, dbeta, (dh0 if h0 is not None else None)


CASES = {  # (B, N, Hqk, H, Dk, Dv, decay, beta, states)
    "linear": (1, 37, 2, 2, 16, 8, False, False, True),
    "decay": (2, 37, 2, 2, 16, 8, True, False, True),
    "mamba": (1, 45, 1, 3, 16, 8, True, True, True),
    "decay_no_states": (1, 32, 2, 4, 8, 16, True, True, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_role_table_matches_float64_autograd(case):
    B, N, Hqk, H, Dk, Dv, decay, has_beta, states = CASES[case]
    torch.manual_seed(0)
    q, k = torch.randn(B, N, Hqk, Dk, dtype=F64), torch.randn(B, N, Hqk, Dk, dtype=F64)
    v, do = torch.randn(B, N, H, Dv, dtype=F64), torch.randn(B, N, H, Dv, dtype=F64)
    g = -torch.rand(B, N, H, dtype=F64) * 2.0 if decay else None
    if g is not None:
        g[:, 5] = float("-inf")  # a reset
    beta = torch.rand(B, N, H, dtype=F64) + 0.5 if has_beta else None
    h0 = torch.randn(B, H, Dk, Dv, dtype=F64) if states else None
    dht = torch.randn(B, H, Dk, Dv, dtype=F64) if states else None
    scale = Dk ** -0.5
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (q, k, v, g, beta, h0)]
    o, ht = linear_attention_reference(*leaves[:3], decay=leaves[3], beta=leaves[4], initial_state=leaves[5],
                                       scale=scale)
    loss = (o * do).sum() + ((ht * dht).sum() if dht is not None else 0.0)
    want = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    got = grads_by_emulation(q, k, v, do, g, beta, h0, dht, ht.detach(), scale, BT=16)
    got = [t for t in got if t is not None]
    names = [n for n, t in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), leaves) if t is not None]
    assert len(got) == len(want), (names, len(got))
    for name, x, y in zip(names, got, want):
        tol = 1e-9
        if name == "dg":  # (decay_grad takes the last token's <dS_N, S_N> in float32)
            y, tol = torch.where(torch.isfinite(g) & (g >= -100), y, torch.zeros_like(y)), 1e-5
        torch.testing.assert_close(x, y, rtol=tol, atol=tol, msg=name)


def test_fits_names_what_it_refuses():
    q = torch.empty(1, 64, 1, 128, dtype=torch.bfloat16)
    assert "feature map" in gluon_scalar_bwd.fits(q, q, q, None, None, 1)
    assert "per-channel" in gluon_scalar_bwd.fits(q, q, q, torch.empty(1, 64, 1, 128), None, IDENTITY)
    assert "beta without" in gluon_scalar_bwd.fits(q, q, q, None, torch.empty(1, 64, 1), IDENTITY)
    assert "Dk 96" in gluon_scalar_bwd.fits(torch.empty(1, 64, 1, 96, dtype=torch.bfloat16), q, q, None, None,
                                            IDENTITY)
    assert "CUDA" in gluon_scalar_bwd.fits(q, q, q, None, None, IDENTITY)


def test_plan_routes_only_where_configs_say_and_never_interpreted():
    q = torch.empty(1, 64, 1, 128, dtype=torch.bfloat16)
    g = torch.empty(1, 64, 1)
    with patched(configs, BWD_GLUON=False):
        assert not launch.backward_plan(plan(q, q, g, IDENTITY), q, q, g, IDENTITY).config.get("bwd_gluon")
    with patched(configs, BWD_GLUON=True):
        # the interpreter (this session) or the CPU never takes the Gluon kernels
        p = launch.backward_plan(plan(q, q, g, IDENTITY), q, q, g, IDENTITY)
        assert p.path == "cpu" or p.config.get("bwd_gluon") is False


# bytes ptxas spills (sm_90a, triton 3.6.0): none without a decay or at d 64; with a decay and both states at d 128
# 256 / 252 / 48 (the states' pointers, outside the chunk loop but for 2 loads in one consumer's dq loop); Mamba-2's
# shape with states 32 / 0 / 0
# dk and dv by one walk (dkv, d 128 only): 288 B with states (the states' pointers), 24 without a decay
SPILLS_ALLOWED = {"decay": dict(dq=256, dk=256, dv=64, dkv=320), "linear": dict(dq=0, dk=0, dv=0, dkv=64),
                  "mamba2": dict(dq=64, dk=64, dv=64), "decay64": dict(dq=32, dk=32, dv=32)}
CODE = ("import json, sys; from tilecore.ops.linear_attention.gluon_scalar_bwd import compile_report; "
        "print(json.dumps([compile_report(role, sys.argv[1]) for role in sys.argv[2:]]))")


@pytest.mark.parametrize("case", ["decay", "linear", "mamba2", "decay64"])
def test_gluon_backward_compiles_to_tma_and_wgmma(case):
    for r in compiled_json(CODE, case, *SPILLS_ALLOWED[case], timeout=900):
        assert r["tma"] and r["wgmma"] and r["mbarrier"], r
        assert not r["wgmma_serialized"], r
        assert r["shared"] <= 227 * 1024, r
        assert r["threads"] == 384, r  # two consumer warpgroups and the producer's
        assert r["shared"] <= 216 * 1024 or r["role"] != "dkv", r  # (the fused walk's 214.7 KB: little room left)
        assert r["spill_bytes"] <= SPILLS_ALLOWED[case][r["role"]], r

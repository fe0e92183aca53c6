"""The GLA forward's Gluon kernel (gluon_gla_forward.gla_fwd_gluon_kernel): it compiles for sm_90a as forward launches
it (TMA, wgmma not serialized, within 227 KiB, spills bounded); its step's algebra (the factored operands about
m = G_last / 2, the transposed state) replayed in torch against the float64 recurrence; the tl kernel's REDO pass
(what runs the heads the Gluon kernel flags) under the interpreter; fits' refusals. The kernel itself runs on the
GPU only (experiments/linear_attention/gpu_forward_gla.py checks it against float64 there)."""
import math

import pytest
import torch

from tilecore.ops.linear_attention import gluon_gla_forward, launch
from tilecore.ops.linear_attention.plan import tl_plan
from tilecore.ops.linear_attention.reference import linear_attention_reference
from compiled_run import compiled_json

# ptxas's spills at Dk 128 (bf16, initial and final states; triton 3.6.0): none
SPILLS_ALLOWED = 64
CODE = ("import json, torch; from tilecore.ops.linear_attention.gluon_gla_forward import compile_report; "
        "print(json.dumps([compile_report(128, torch.bfloat16, True), compile_report(64, torch.float16, False)]))")


def test_gla_gluon_forward_compiles():
    for r in compiled_json(CODE, timeout=900):
        assert r["tma"] and r["wgmma"] and r["mbarrier"], r
        assert not r["wgmma_serialized"], r
        assert r["shared"] <= 227 * 1024 and r["threads"] == 384, r
        assert r["spill_bytes"] <= SPILLS_ALLOWED, r


def _twin(q, k, v, g, h0, scale, BT=64):
    """The kernel's step in float64 torch with its operands rounded to q's dtype where the kernel rounds them:
    Qx = q 2^(G - m), Kx = k 2^(m - G), Sx^T = S^T diag(2^m) (m = G_last / 2, log2 units), P^T = mask(Kx Qx^T),
    o^T = scale Sx^T Qx^T + V^T P^T, S^T <- (Sx^T + V^T Kx) diag(2^m)."""
    B, N, H, Dk = q.shape
    Dv = v.shape[-1]
    dt = q.dtype
    r = lambda x: x.to(dt).double()  # noqa: E731
    S = h0.double().transpose(-1, -2).clone()  # S^T (B, H, Dv, Dk)
    o = torch.zeros(B, N, H, Dv, dtype=torch.float64)
    for t0 in range(0, N, BT):
        sl = slice(t0, min(t0 + BT, N))
        qc, kc, vc = (x[:, sl].double().transpose(1, 2) for x in (q, k, v))  # (B, H, T, D)
        G = g[:, sl].double().clamp_min(-100).transpose(1, 2).cumsum(2) / math.log(2)
        m = G[:, :, -1:] / 2
        Qx, Kx = r(qc * torch.exp2(G - m)), r(kc * torch.exp2(m - G))
        Sx = S * torch.exp2(m)
        T = qc.shape[2]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        P = r((Qx @ Kx.transpose(-1, -2) * scale).masked_fill(~mask, 0))  # P (query, key), as P^T's transpose
        o[:, sl] = (scale * Qx @ r(Sx).transpose(-1, -2) + P @ r(vc)).transpose(1, 2)
        S = (Sx + (r(vc).transpose(-1, -2) @ Kx)) * torch.exp2(m)
    return o, S.transpose(-1, -2)


@pytest.mark.parametrize("dtype,decay", [(torch.bfloat16, 0.3), (torch.float16, 0.05)])
def test_gla_gluon_step_algebra(dtype, decay):
    torch.manual_seed(0)
    B, N, H, Dk, Dv = 1, 150, 2, 32, 16
    q, k, v = (torch.randn(B, N, H, d).to(dtype) for d in (Dk, Dk, Dv))
    g = -torch.rand(B, N, H, Dk) * decay
    h0 = torch.randn(B, H, Dk, Dv)
    scale = Dk ** -0.5
    o, S = _twin(q, k, v, g, h0, scale)
    ro, rS = linear_attention_reference(q, k, v, decay=g, scale=scale, initial_state=h0)
    floor = torch.finfo(dtype).eps / 2
    assert (o - ro).norm() / ro.norm() < 4 * floor
    assert (S - rS).norm() / rS.norm() < 4 * floor


def test_tl_redo_runs_only_flagged_heads():
    """launch.gla_redo: the tl forward on the flagged heads alone (the interpreter); the others left as they were."""
    torch.manual_seed(1)
    B, N, H, Dk, Dv = 1, 40, 2, 16, 16
    q, k, v = (torch.randn(B, N, H, d) for d in (Dk, Dk, Dv))
    g = -torch.rand(B, N, H, Dk) * 0.5
    h0 = torch.randn(B, H, Dk, Dv)
    plan = tl_plan(q, v, g, 0)
    o = torch.full((B, N, H, Dv), float("nan"))
    ht = torch.full((B, H, Dk, Dv), float("nan"))
    launch.gla_redo(plan, q, k, v, g, h0, o, ht, torch.tensor([0, 1], dtype=torch.int32), Dk ** -0.5)
    ro, rS = linear_attention_reference(q, k, v, decay=g, scale=Dk ** -0.5, initial_state=h0)
    assert torch.isnan(o[:, :, 0]).all() and torch.isnan(ht[:, 0]).all()
    assert torch.allclose(o[:, :, 1].double(), ro[:, :, 1], rtol=1e-3, atol=1e-3)
    assert torch.allclose(ht[:, 1].double(), rS[:, 1], rtol=1e-3, atol=1e-3)


def test_fits_says_why_not():
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    v = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    g = -torch.rand(1, 64, 2, 128)
    assert "per-channel" in gluon_gla_forward.fits(q, q, v, g[..., 0], 0)
    assert "feature map" in gluon_gla_forward.fits(q, q, v, g, 1)
    assert "Dv" in gluon_gla_forward.fits(q, q, v[..., :64], g, 0)
    assert "bf16/fp16" in gluon_gla_forward.fits(q.float(), q.float(), v.float(), g, 0)
    assert "CUDA" in gluon_gla_forward.fits(q, q, v, g, 0)

"""The Gluon forward's Mamba-2 step (with beta: one causal select on P, the exps taking the unmasked difference, +inf
above the diagonal selected away, the scale on beta V's rows, beta V in a shared-memory allocation of its own; "LEAN",
decision 65) and its step without beta (the masked exps, the scale on P).

On the CPU: a float32 twin of one chunk-step in either order agrees with the float64 recurrences (strong decays, where
the unmasked exps overflow to +inf; a scale with beta; D and z); the kernel compiled for sm_90a shows LEAN in its SASS
(few selects) within the spill bound. The kernel runs on the GPU only: experiments/linear_attention/gpu_mamba_s37.py
checks it against float64 there."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_forward, linear_attention_reference, mamba2_reference

BF = torch.bfloat16


# --------------------------------------------------------------------------------------------
# the chunk-step's algebra in LEAN's order and the masked one (float32, as the kernel's registers), against float64


def twin(q, k, v, g, beta, d_skip, z, h0, scale, lean, BT=64):
    """o and the final state by the kernel's chunk-step in float32: G head-major in log2 units
    (chunk_cumulative_heads), LEAN's unmasked 2^(G_i - G_j) and one select (the scale on beta V's rows with
    beta), else the masked exps and the scale on P; D v added after P V."""
    B, N, Hqk, Dk = q.shape
    H, Dv = v.shape[2], v.shape[3]
    G = gluon_forward.chunk_cumulative_heads(g, BT)
    o = torch.empty(B, N, H, Dv)
    S_out = torch.empty(B, H, Dk, Dv)
    for b in range(B):
        for h in range(H):
            S = h0[b, h].float().clone() if h0 is not None else torch.zeros(Dk, Dv)
            for c0 in range(0, N, BT):
                n = min(BT, N - c0)
                qq, kk = q[b, c0:c0 + n, h // (H // Hqk)].float(), k[b, c0:c0 + n, h // (H // Hqk)].float()
                vv = v[b, c0:c0 + n, h].float()
                Gr, G_last = G[b, h, c0:c0 + n], G[b, h, c0 + BT - 1]
                bt = beta[b, c0:c0 + n, h].float() if beta is not None else torch.ones(n)
                causal = torch.ones(n, n, dtype=torch.bool).tril()
                s = qq @ kk.T
                if lean:
                    f = torch.exp2(Gr[:, None] - Gr[None, :])  # +inf above the diagonal where decays are strong
                    p = torch.where(causal, s * f if beta is not None else s * f * scale, 0.0)
                    bv = vv * (bt * scale if beta is not None else bt)[:, None]
                else:
                    f = torch.exp2(torch.where(causal, Gr[:, None] - Gr[None, :], -float("inf")))
                    p = torch.where(causal, s * f * scale, 0.0)
                    bv = vv * bt[:, None]
                oc = (qq @ S) * (scale * torch.exp2(Gr))[:, None]
                dv = d_skip[h].float()[None, :] * vv if d_skip is not None else 0.0
                oc = oc + p @ bv + dv
                if z is not None:
                    zz = z[b, c0:c0 + n, h].float()
                    oc = oc * zz * torch.sigmoid(zz)
                o[b, c0:c0 + n, h] = oc
                w = torch.exp2(G_last - Gr) * bt
                S = torch.exp2(G_last) * S + kk.T @ (vv * w[:, None])
            S_out[b, h] = S
    return o, S_out


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("a_range", [(-8.5, -0.5), (-80.0, -20.0)])
def test_the_mamba2_step_in_leans_order_is_the_recurrence(lean, a_range):
    torch.manual_seed(3)
    B, N, H, P, S = 1, 150, 2, 16, 32
    x = torch.randn(B, N, H, P)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H) - 2)
    lo, hi = a_range
    A = torch.rand(H) * (hi - lo) + lo
    Bm, Cm = torch.randn(B, N, 1, S) * S ** -0.5, torch.randn(B, N, 1, S) * S ** -0.5
    D, z, h0 = torch.randn(H), torch.randn(B, N, H, P), torch.randn(B, H, S, P)
    dt[0, 7, 0] = 0.0  # a token that adds nothing
    o, ht = twin(Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, 1.0, lean)
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.transpose(-1, -2).double())
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel(o, ref) < 1e-5 and rel(ht, ref_state.transpose(-1, -2)) < 1e-5


@pytest.mark.parametrize("lean", [False, True])
def test_the_scale_on_beta_v_is_the_scale_on_p(lean):
    torch.manual_seed(4)
    B, N, H, Dk, Dv = 1, 130, 2, 16, 8
    q, k, v = torch.randn(B, N, H, Dk), torch.randn(B, N, H, Dk), torch.randn(B, N, H, Dv)
    g = -torch.rand(B, N, H) * 0.3
    g[:, 70] = -float("inf")  # a reset
    beta, h0 = torch.rand(B, N, H) + 0.1, torch.randn(B, H, Dk, Dv)
    o, ht = twin(q, k, v, g, beta, None, None, h0, 0.5, lean)
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), decay=g.double(),
                                                beta=beta.double(), scale=0.5, initial_state=h0.double())
    assert rel(o, ref) < 1e-5 and rel(ht, ref_state) < 1e-5


# --------------------------------------------------------------------------------------------
# sm_90a: LEAN in the SASS (a fresh process: TRITON_INTERPRET unset)

CODE = """
import json, os, re, subprocess, sys, tempfile
from tilecore.ops.linear_attention.gluon_forward import compile_report
from triton.backends.nvidia.compiler import get_ptxas
out = []
r = compile_report(sys.argv[1], stages=2, compiled_out=out)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    open(path, "wb").write(out[0].asm["cubin"])
    sass = subprocess.run([os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump"), "-sass", path],
                          capture_output=True, text=True, check=True).stdout
r["fsel"] = len(re.findall(r"\\bFSEL\\b", sass))
print(json.dumps(r))
"""


def test_lean_shows_in_the_sass():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", CODE, "mamba2"], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    # one select on P's 32 entries a thread is FSEL-free (a predicated move); the masked form had 60 (session 32)
    assert r["fsel"] <= 8, r
    assert r["tma"] and r["wgmma"] and not r["wgmma_serialized"], r
    assert r["shared"] <= 227 * 1024 and r["threads"] == 384, r
    assert r["spill_bytes"] <= 64, r

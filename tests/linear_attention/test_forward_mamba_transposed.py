"""The Gluon forward's TRANSPOSED Mamba-2 step (gluon_forward.LinearAttentionForward.compute_transposed; configs.
GLUON_MAMBA_TRANSPOSED, off until a GPU run times it): S^T in registers, P^T through shared memory.

On the CPU: a float32 twin of its chunk-step with the kernel's roundings (S^T, wV^T and P^T in bf16, the operands the
tensor cores take) against the float64 recurrence (D, z, an initial state, strong decays whose unmasked exps overflow,
a partial last chunk), as a multiple of the rounding floor beside the shipped step's twin (test_forward_lean); the
kernel compiled for sm_90a (not serialized, the update one 64 x 128 wgmma chain, no state through shared memory,
spills bounded); the launches pass TRANSPOSED only where asked and beta is given. The kernel runs on the GPU only:
experiments/linear_attention/gpu_mamba_s37.py checks it against float64 there (its tl twin with the state
transposed, kernels_forward.la_fwd_transposed_kernel, is tested in the interpreter: test_forward_transposed.py)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import gluon_forward, mamba2_reference

BF = torch.bfloat16


def bf(x):
    return x.to(BF).float()


def twin_transposed(x, dt, A, Bm, Cm, D, z, h0, BT=64):
    """Mamba-2's y and final states (b, h, p, s) by compute_transposed's step in float32 with its bf16 roundings."""
    B, N, H, P = x.shape
    S_dim = Bm.shape[-1]
    G = gluon_forward.chunk_cumulative_heads(dt * A, BT)
    y = torch.empty(B, N, H, P)
    states = torch.empty(B, H, P, S_dim)
    for b in range(B):
        for h in range(H):
            ST = h0[b, h].float().clone() if h0 is not None else torch.zeros(P, S_dim)  # S^T [P, S]
            for c0 in range(0, N, BT):
                n = min(BT, N - c0)
                q, k = Cm[b, c0:c0 + n, 0].float(), Bm[b, c0:c0 + n, 0].float()
                v = x[b, c0:c0 + n, h].float()
                G_tok, G_last = G[b, h, c0:c0 + n], G[b, h, c0 + BT - 1]
                beta = dt[b, c0:c0 + n, h].float()
                w = torch.exp2(G_last - G_tok) * beta
                wvT = bf(v.T * w[None, :])  # [P, n]
                qs = bf(ST) @ q.T  # [P, n]
                sT = k @ q.T  # [j, i]
                f = torch.exp2(G_tok[None, :] - G_tok[:, None])  # unmasked: +inf above where decays are strong
                causal = torch.ones(n, n, dtype=torch.bool).triu()  # j <= i
                pT = bf(torch.where(causal, sT * f * beta[:, None], 0.0))
                oT = qs * torch.exp2(G_tok)[None, :] + v.T @ pT + D[h] * v.T
                zz = z[b, c0:c0 + n, h].float().T
                y[b, c0:c0 + n, h] = (oT * zz * torch.sigmoid(zz)).T
                ST = torch.exp2(G_last) * ST + wvT @ k
            states[b, h] = ST
    return y, states


@pytest.mark.parametrize("a_range,N", [((-8.5, -0.5), 150), ((-80.0, -20.0), 100)])
def test_the_transposed_step_is_the_recurrence(a_range, N):
    torch.manual_seed(11)
    B, H, P, S = 1, 2, 16, 32
    x = torch.randn(B, N, H, P).to(BF)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H) - 2)
    dt[0, 7, 0] = 0.0  # a token that adds nothing
    lo, hi = a_range
    A = torch.rand(H) * (hi - lo) + lo
    Bm = (torch.randn(B, N, 1, S) * S ** -0.5).to(BF)
    Cm = (torch.randn(B, N, 1, S) * S ** -0.5).to(BF)
    D, z, h0 = torch.randn(H), torch.randn(B, N, H, P).to(BF), torch.randn(B, H, P, S)
    y, st = twin_transposed(x, dt, A, Bm, Cm, D, z, h0)
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.double())
    assert torch.isfinite(y).all() and torch.isfinite(st).all()
    # y rounded to bf16 as the kernel stores it: within a few rounding floors (the shipped step's operands round
    # the same number of times); the float32 states' error is the bf16 operands' (S^T, wV^T)
    assert accuracy.error_over_floor(y.to(BF), ref) < 3.0
    assert accuracy.rel_rms(st, ref_state) < 2e-2


def test_the_launches_pass_it_only_where_asked():
    B, N, H, Dk, Dv = 1, 128, 4, 128, 64
    q = torch.empty(B, N, 1, Dk, dtype=BF)
    v = torch.empty(B, N, H, Dv, dtype=BF)
    G = torch.zeros(B, H, N)

    def args(beta, **kw):
        return gluon_forward.launch_args(q, q, v, G, beta, None, None, None, torch.empty_like(v), None, 1.0, 2,
                                         **kw)[1]

    assert "TRANSPOSED" not in args(G) and args(G, transposed=1)["TRANSPOSED"] == 1
    assert args(G, transposed=2)["TRANSPOSED"] == 2
    assert "TRANSPOSED" not in args(None, transposed=1)  # (the scalar decay's step has no transposed form)


CODE = """
import json, os, re, subprocess, sys, tempfile
from tilecore.ops.linear_attention.gluon_forward import compile_report
from triton.backends.nvidia.compiler import get_ptxas
out = []
r = compile_report(sys.argv[1], stages=2, compiled_out=out, transposed=int(sys.argv[2]))
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    open(path, "wb").write(out[0].asm["cubin"])
    sass = subprocess.run([os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump"), "-sass", path],
                          capture_output=True, text=True, check=True).stdout
r["hgmma_64x128"] = len(re.findall(r"HGMMA\\.64x128x16", sass))
r["hgmma"] = len(re.findall(r"HGMMA\\.", sass))
print(json.dumps(r))
"""


@pytest.mark.parametrize("case,form", [("mamba2", 1), ("mamba2", 2), ("mamba2_states", 2)])
def test_transposed_compiles(case, form):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", CODE, case, str(form)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["transposed"] and r["tma"] and r["wgmma"] and not r["wgmma_serialized"], r
    assert r["threads"] == 384 and r["shared"] <= 170 * 1024, r  # no state, wV or beta V buffers: P^T's only
    # a step of each consumer's code (two partitions): K Q^T 8, S^T Q^T 8, P V 4 (64 x 64 x 16) and the update as
    # one chain of 4 (64 x 128 x 16)
    assert r["hgmma_64x128"] == 2 * 4 and r["hgmma"] == 2 * 24, r
    # (with initial and final states ~2.1 KB, all in the tile's start and finish, where the state's 64 pointers a
    # thread are live beside it: none in the chunk loop, as the SASS shows; without states 60 B, form 2 64 B, none
    # in the loop)
    assert r["spill_bytes"] <= (128 if case == "mamba2" else 4096), r
    assert r["transposed"] == form, r

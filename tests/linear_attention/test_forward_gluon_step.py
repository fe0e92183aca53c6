"""The Gluon forward's chunk-steps (gluon_forward.LinearAttentionForward) where the CPU can test them: float32 twins of
each step with the kernel's order and bf16 roundings against the float64 recurrences, and the Mamba-2 kernel's sm_90a
facts. The kernel runs on the GPU only: experiments/linear_attention/gpu_mamba.py checks it against float64 there
(its tl twins, kernels_tl.la_fwd_kernel and kernels_forward.la_fwd_transposed_kernel with the state transposed, run
in the interpreter: test_linear_attention.py, test_forward_transposed.py).

* ``compute`` (no beta: linear attention, a scalar decay): the exps of the masked difference, the scale on P.
* ``compute_transposed`` (Mamba-2: beta, D, z): S^T in registers, P^T (beta_j scale on its rows) through shared
  memory, the unmasked exps (+inf above the diagonal where decays are strong) and one select; strong decays, D, z,
  an initial state, a dt of 0, a partial last chunk; the chunk's K Q^T from kernels_forward.chunk_scores, in the
  input dtype.
"""
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
    """Mamba-2's y and final states (b, h, p, s) by compute_transposed's step in float32 with its bf16 roundings
    (K Q^T too, as chunk_scores stores it)."""
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
                sT = bf(k @ q.T)  # [j, i]
                f = torch.exp2(G_tok[None, :] - G_tok[:, None])  # unmasked: +inf above where decays are strong
                causal = torch.ones(n, n, dtype=torch.bool).triu()  # j <= i
                pT = bf(torch.where(causal, sT * f * beta[:, None], 0.0))
                oT = qs * torch.exp2(G_tok)[None, :] + v.T @ pT + D[h] * v.T
                zz = z[b, c0:c0 + n, h].float().T
                y[b, c0:c0 + n, h] = (oT * zz * torch.sigmoid(zz)).T
                ST = torch.exp2(G_last) * ST + wvT @ k
            states[b, h] = ST
    return y, states


def twin_plain(q, k, v, g, h0, scale, BT=64):
    """o and the final state by ``compute``'s step in float32 with its roundings (P, S, the weighted values in bf16):
    G head-major in log2 units, the exps of the masked difference, the scale on P."""
    B, N, H, Dk = q.shape
    Dv = v.shape[3]
    G = gluon_forward.chunk_cumulative_heads(g, BT)
    o = torch.empty(B, N, H, Dv)
    S_out = torch.empty(B, H, Dk, Dv)
    for b in range(B):
        for h in range(H):
            S = h0[b, h].float().clone()
            for c0 in range(0, N, BT):
                n = min(BT, N - c0)
                qq, kk, vv = q[b, c0:c0 + n, h].float(), k[b, c0:c0 + n, h].float(), v[b, c0:c0 + n, h].float()
                Gr, G_last = G[b, h, c0:c0 + n], G[b, h, c0 + BT - 1]
                causal = torch.ones(n, n, dtype=torch.bool).tril()
                f = torch.exp2(torch.where(causal, Gr[:, None] - Gr[None, :], -float("inf")))
                p = bf(torch.where(causal, (qq @ kk.T) * f * scale, 0.0))
                o[b, c0:c0 + n, h] = (qq @ bf(S)) * (scale * torch.exp2(Gr))[:, None] + p @ vv
                S = torch.exp2(G_last) * S + kk.T @ bf(vv * torch.exp2(G_last - Gr)[:, None])
            S_out[b, h] = S
    return o, S_out


def test_the_plain_step_is_the_recurrence():
    from tilecore.ops.linear_attention import linear_attention_reference

    torch.manual_seed(4)
    B, N, H, Dk, Dv = 1, 130, 2, 16, 8
    q, k, v = (torch.randn(B, N, H, d).to(BF) for d in (Dk, Dk, Dv))
    g = -torch.rand(B, N, H) * 0.3
    g[:, 70] = -float("inf")  # a reset
    h0 = torch.randn(B, H, Dk, Dv)
    o, ht = twin_plain(q, k, v, g, h0, 0.5)
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), decay=g.double(), scale=0.5,
                                                initial_state=h0.double())
    assert accuracy.error_over_floor(o.to(BF), ref) < 3.0
    assert accuracy.rel_rms(ht, ref_state) < 2e-2


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


def test_chunk_scores_are_each_chunks_k_q():
    """kernels_forward.chunk_scores (the Mamba-2 step's scores; interpreted in fp16: the interpreter's bf16 dot is
    wrong): each chunk's K Q^T of each q/k head at its rows, zeros past N, against float64; float32 and the input's
    dtype."""
    from tilecore.ops.linear_attention.kernels_forward import chunk_scores

    torch.manual_seed(3)
    B, N, G, Dk, BT = 2, 100, 2, 64, 64
    q, k = (torch.randn(B, N, G, Dk).half() for _ in range(2))
    cb = chunk_scores(q, k, BT)
    pad = lambda t: torch.nn.functional.pad(t.double(), (0, 0, 0, 0, 0, 2 * BT - N)).view(B, 2, BT, G, Dk)  # noqa: E731
    ref = torch.einsum("bcjgd,bcigd->bgcji", pad(k), pad(q)).reshape(B, G, 2 * BT, BT)
    assert cb.shape == (B, G, 2 * BT, BT) and cb.dtype == torch.float32
    assert (cb.double() - ref).abs().max() < 1e-4 * ref.abs().max()
    assert (cb[:, :, N:] == 0).all() and (cb[:, :, BT:, N - BT:] == 0).all()
    cb16 = chunk_scores(q, k, BT, q.dtype)
    assert cb16.dtype == q.dtype and torch.equal(cb16, cb.to(q.dtype))


CODE = r"""
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
r["hgmma_64x128"] = len(re.findall(r"HGMMA\.64x128x16", sass))
r["hgmma"] = len(re.findall(r"HGMMA\.", sass))
# the chunk loops: the innermost backward branches around wgmmas; the spill instructions inside them
code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
loops = []
for addr, text in code:
    m = re.search(r"BRA (0x[0-9a-f]+)", text)
    if m and int(m.group(1), 16) < addr:
        lo = int(m.group(1), 16)
        if any("HGMMA" in t for a, t in code if lo <= a <= addr):
            loops.append((lo, addr))
inner = [(lo, hi) for lo, hi in loops if not any(lo < a and b < hi for a, b in loops if (a, b) != (lo, hi)
                                                  and any("HGMMA" in t for x, t in code if a <= x <= b))]
r["chunk_loops"] = len(inner)
# each consumer's chunk loop: of the inner loops around the same wgmmas, the shortest (a wait's out-of-line branch back
# makes another, from after the wait on into the tile's tail); per step: instructions, spill loads and stores, global
# loads, register moves (MOV, IMAD.MOV: the state moved from the update's accumulator to its registers)
by_mma = {}
for lo, hi in inner:
    key = tuple(a for a, t in code if lo <= a <= hi and "HGMMA" in t)
    if key not in by_mma or hi - lo < by_mma[key][1] - by_mma[key][0]:
        by_mma[key] = (lo, hi)
steps = sorted(by_mma.values())
loop = lambda pat: [sum(1 for a, t in code if lo <= a <= hi and re.search(pat, t)) for lo, hi in steps]
r["loop_ins"] = loop(r".")
r["loop_ldl"] = loop(r"\bLDL\b")
r["loop_stl"] = loop(r"\bSTL\b")
r["loop_ldg"] = loop(r"\bLDG\b")
r["loop_moves"] = loop(r"^\s*(MOV|IMAD\.MOV)\b")
r["loop_bar"] = loop(r"\bBAR\.SYNC")
print(json.dumps(r))
"""


@pytest.fixture(scope="module")
def mamba_reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    procs = {case: subprocess.Popen([sys.executable, "-c", CODE, case], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env) for case in ("mamba2", "mamba2_states")}
    out = {}
    for case, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        out[case] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("case", ["mamba2", "mamba2_states"])
def test_mamba2_kernel_compiles_to_the_transposed_step(mamba_reports, case):
    """The step takes K Q^T from the stage (chunk_scores's, bf16 here) and v^T once (P V's register operand)."""
    r = mamba_reports[case]
    assert r["tma"] and r["wgmma"] and not r["wgmma_serialized"], r
    # P^T's buffer and a stage's 8 KB of scores: no state, wV or beta V buffers
    assert r["threads"] == 384 and r["shared"] <= 190 * 1024, r
    # a step of each consumer's code (two partitions): S^T Q^T 8, P V 4 (64 x 64 x 16) and the update as one chain of 4
    # (64 x 128 x 16); no K Q^T
    assert r["hgmma_64x128"] == 2 * 4 and r["hgmma"] == 2 * 16, r
    # loop-invariant scalars spilled in the program's start and reloaded in a tile's (60 B without states, 72 with
    # h0 and ht in Mamba-2's (b, h, p, s) layout, empty_state's: the feature stride 1, its offsets immediates)
    assert r["spill_bytes"] <= (128 if case == "mamba2" else 256), r
    # each consumer's chunk loop: no spill store, at most two reloads a step (loop-invariant scalars), D's two loads
    assert len(r["loop_ins"]) == 2 and r["loop_stl"] == [0, 0] and max(r["loop_ldl"]) <= 2, r
    assert r["loop_ldg"] == [2, 2] and max(r["loop_ins"]) < 1100, r
    # 5 bar.syncs a consumer's step: the ring's wait (membar's), P^T's (which also hands over the per-token factors:
    # theirs is gone, notes decision 260), tma.store_wait's, o^T's before its TMA store and the stage's release
    assert r["loop_bar"] == [5, 5], r

"""Session 32's switches of the Gluon forward (issue 33, Mamba-2): D_EARLY (D v from the chunk's first v load, added
with Q S's row scale), LEAN (one causal select on P: the exps take the unmasked difference, +inf above the diagonal
selected away; with beta the scale on beta V's rows), UPDATE_LATE (P V and the state update async, the update's wait
after o's store) and Q_REG (q as the register operand of Q K^T and Q S).

On the CPU: the shipped launches pass none of them (their compiled kernels and keys stay); configs.GLUON_S32 turns
them on by whether beta is given; a float32 twin of one chunk-step in LEAN's and D_EARLY's order agrees with the
float64 recurrences (strong decays, where LEAN's unmasked exps overflow to +inf; a scale with beta; D and z); and
the kernel compiled for sm_90a shows each switch in its SASS (fewer selects, fewer v loads, a wgmma group left in
flight under the epilogue, register-A wgmmas) within the spill bound. The kernel runs on the GPU only:
experiments/linear_attention/gpu_mamba_s32.py checks every variant against float64 there."""
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_forward, linear_attention_reference, mamba2_reference

BF = torch.bfloat16
S32 = ("D_EARLY", "LEAN", "UPDATE_LATE", "Q_REG", "BETA_LOG")


def mamba_args(**kw):
    B, N, H, Dk, Dv = 1, 128, 4, 128, 64
    q = torch.empty(B, N, 1, Dk, dtype=BF)
    v = torch.empty(B, N, H, Dv, dtype=BF)
    f32 = torch.float32
    return gluon_forward.launch_args(q, q, v, torch.zeros(B, H, N, dtype=f32), torch.zeros(B, H, N, dtype=f32),
                                     torch.zeros(H, Dv, dtype=f32), torch.empty_like(v), None, torch.empty_like(v),
                                     None, 1.0, 2, z_stage=True, g_stage=True, early_wv=True, **kw)[1]


def test_the_launches_pass_only_what_configs_turn_on():
    assert not set(S32) & set(mamba_args())
    # configs.GLUON_S32: LEAN on for Mamba-2 since run 2 of gpu_mamba_s32.py (session 32), the rest off; nothing
    # without beta
    assert set(S32) & set(mamba_args(**gluon_forward.s32_flags(True))) == {"LEAN"}
    assert not any(gluon_forward.s32_flags(False).values())


def test_each_switch_reaches_the_launch_alone():
    for name in S32:
        args = mamba_args(**{name.lower(): True})
        assert args[name] is True and not (set(S32) - {name}) & set(args)


def test_the_kernel_defaults_them_off():
    params = inspect.signature(gluon_forward.la_fwd_gluon_kernel.fn).parameters
    assert all(params[name].default is False for name in S32)


def test_configs_turn_them_on_by_whether_beta_is_given(monkeypatch):
    monkeypatch.setattr(configs, "GLUON_S32", {True: ("lean", "update_late")})
    assert gluon_forward.s32_flags(True) == dict(d_early=False, lean=True, update_late=True, q_reg=False,
                                                 beta_log=False)
    assert not any(gluon_forward.s32_flags(False).values())


# --------------------------------------------------------------------------------------------
# the chunk-step's algebra in the variants' order (float32, as the kernel's registers), against float64


def twin(q, k, v, g, beta, d_skip, z, h0, scale, lean, d_early, blog=False, BT=64):
    """o and the final state by the kernel's chunk-step in float32: G head-major in log2 units
    (chunk_cumulative_heads), LEAN's unmasked 2^(G_i - G_j) and one select (the scale on beta V's rows with
    beta), else the masked exps and the scale on P; D v added with Q S's row scale (D_EARLY) or after P V.
    blog (BETA_LOG, with beta): beta and the scale in the exponents, Gb = G - log2(beta scale) (gluon_forward.beta_log
    on the head-major, padded beta: +inf past N), P V on v itself, the update's weights 2^(G_last - Gb) / scale."""
    B, N, Hqk, Dk = q.shape
    H, Dv = v.shape[2], v.shape[3]
    G = gluon_forward.chunk_cumulative_heads(g, BT)
    if blog:
        Gb = gluon_forward.beta_log(G, gluon_forward.chunk_heads(beta, BT), scale)
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
                if blog:
                    Gbr = Gb[b, h, c0:c0 + n]
                    p = torch.where(causal, s * torch.exp2(Gr[:, None] - Gbr[None, :]), 0.0)
                    bv = vv
                elif lean:
                    f = torch.exp2(Gr[:, None] - Gr[None, :])  # +inf above the diagonal where decays are strong
                    p = torch.where(causal, s * f if beta is not None else s * f * scale, 0.0)
                    bv = vv * (bt * scale if beta is not None else bt)[:, None]
                else:
                    f = torch.exp2(torch.where(causal, Gr[:, None] - Gr[None, :], -float("inf")))
                    p = torch.where(causal, s * f * scale, 0.0)
                    bv = vv * bt[:, None]
                oc = (qq @ S) * (scale * torch.exp2(Gr))[:, None]
                dv = d_skip[h].float()[None, :] * vv if d_skip is not None else 0.0
                oc = oc + dv + p @ bv if d_early else oc + p @ bv + dv
                if z is not None:
                    zz = z[b, c0:c0 + n, h].float()
                    oc = oc * zz * torch.sigmoid(zz)
                o[b, c0:c0 + n, h] = oc
                w = torch.exp2(G_last - Gbr) / scale if blog else torch.exp2(G_last - Gr) * bt
                S = torch.exp2(G_last) * S + kk.T @ (vv * w[:, None])
            S_out[b, h] = S
    return o, S_out


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("lean,d_early,blog", [(False, False, False), (True, False, False), (False, True, False),
                                               (True, True, False), (True, False, True)])
@pytest.mark.parametrize("a_range", [(-8.5, -0.5), (-80.0, -20.0)])
def test_the_mamba2_step_in_the_variants_order_is_the_recurrence(lean, d_early, blog, a_range):
    torch.manual_seed(3)
    B, N, H, P, S = 1, 150, 2, 16, 32
    x = torch.randn(B, N, H, P)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H) - 2)
    lo, hi = a_range
    A = torch.rand(H) * (hi - lo) + lo
    Bm, Cm = torch.randn(B, N, 1, S) * S ** -0.5, torch.randn(B, N, 1, S) * S ** -0.5
    D, z, h0 = torch.randn(H), torch.randn(B, N, H, P), torch.randn(B, H, S, P)
    dt[0, 7, 0] = 0.0  # a token that adds nothing (BETA_LOG: Gb = +inf there)
    o, ht = twin(Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, 1.0, lean, d_early, blog)
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.transpose(-1, -2).double())
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel(o, ref) < 1e-5 and rel(ht, ref_state.transpose(-1, -2)) < 1e-5


@pytest.mark.parametrize("lean,blog", [(False, False), (True, False), (True, True)])
def test_the_scale_on_beta_v_is_the_scale_on_p(lean, blog):
    torch.manual_seed(4)
    B, N, H, Dk, Dv = 1, 130, 2, 16, 8
    q, k, v = torch.randn(B, N, H, Dk), torch.randn(B, N, H, Dk), torch.randn(B, N, H, Dv)
    g = -torch.rand(B, N, H) * 0.3
    g[:, 70] = -float("inf")  # a reset
    beta, h0 = torch.rand(B, N, H) + 0.1, torch.randn(B, H, Dk, Dv)
    o, ht = twin(q, k, v, g, beta, None, None, h0, 0.5, lean, False, blog)
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), decay=g.double(),
                                                beta=beta.double(), scale=0.5, initial_state=h0.double())
    assert rel(o, ref) < 1e-5 and rel(ht, ref_state) < 1e-5


# --------------------------------------------------------------------------------------------
# sm_90a: each switch in the SASS (a fresh process: TRITON_INTERPRET unset)

CODE = """
import json, os, re, subprocess, sys, tempfile
from tilecore.ops.linear_attention.gluon_forward import compile_report
from triton.backends.nvidia.compiler import get_ptxas
kw = json.loads(sys.argv[1])
case = sys.argv[2]
out = []
mamba = dict(z_stage=True, early_wv=True, silu_tanh=True) if case == "mamba2" else {}
r = compile_report(case, stages=2, g_stage=case != "linear", compiled_out=out, **mamba, **kw)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    open(path, "wb").write(out[0].asm["cubin"])
    sass = subprocess.run([os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump"), "-sass", path],
                          capture_output=True, text=True, check=True).stdout
r["fsel"] = len(re.findall(r"\\bFSEL\\b", sass))
r["ldsm"] = len(re.findall(r"\\bLDSM\\b", sass))
r["late_wait"] = len(re.findall(r"WARPGROUP\\.DEPBAR\\.LE gsb0, 0x1", sass))
r["bar"] = len(re.findall(r"\\bBAR\\.SYNC\\b", sass))
r["reg_a"] = len(re.findall(r"HGMMA\\.\\S+ R\\d+, R\\d+, gdesc", sass))
r["stsm"] = len(re.findall(r"\\bSTSM\\b", sass))
print(json.dumps(r))
"""
ALL = dict(lean=True, d_early=True, update_late=True, q_reg=True)
VARIANTS = {"shipped": {}, "lean": dict(lean=True), "d_early": dict(d_early=True),
            "update_late": dict(update_late=True), "q_reg": dict(q_reg=True), "all": ALL,
            "beta_log": dict(lean=True, beta_log=True),
            # the kernels without beta (no decay; a scalar decay with EARLY_WV): every switch compiles there too
            "linear": ("linear", {}), "linear all": ("linear", ALL), "decay all": ("decay", dict(early_wv=True, **ALL))}


@pytest.fixture(scope="module")
def sass():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = {}
    for name, kw in VARIANTS.items():
        case, kw = kw if isinstance(kw, tuple) else ("mamba2", kw)
        procs[name] = subprocess.Popen([sys.executable, "-c", CODE, json.dumps(kw), case], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env)
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_each_switch_shows_in_the_sass(sass):
    base = sass["shipped"]
    assert sass["lean"]["fsel"] < base["fsel"] // 4  # (shipped 60: two selects on P's 32 entries a consumer)
    assert sass["lean"]["bar"] == base["bar"] - 2  # beta V's own allocation: no bar.sync after wv's stores
    assert sass["d_early"]["ldsm"] < base["ldsm"]  # no second v load in the epilogue
    assert base["late_wait"] == 0 and sass["update_late"]["late_wait"] == 2  # one a consumer
    assert base["reg_a"] == 8 and sass["q_reg"]["reg_a"] == 8 + 2 * 16  # P V's; + Q K^T's and Q S's, a consumer
    assert sass["beta_log"]["stsm"] == base["stsm"] - 2 * 4  # no beta V stored (4 stmatrix x4 a consumer)
    assert sass["beta_log"]["shared"] == base["shared"] - 2 * 64 * 64 * 2  # nor its buffers
    for name, r in sass.items():
        assert r["tma"] and r["wgmma"] and not r["wgmma_serialized"], (name, r)
        assert r["shared"] <= 227 * 1024 and r["threads"] == 384, (name, r)
        assert r["spill_bytes"] <= 256, (name, r)
    assert sass["linear"]["spill_bytes"] == sass["linear all"]["spill_bytes"] == 0

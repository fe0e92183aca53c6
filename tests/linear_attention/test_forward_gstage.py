"""The Gluon forward's G_STAGE / EARLY_WV (gluon_forward.py; configs.GLUON_G_STAGE, GLUON_EARLY_WV) where the CPU can
test them: the one-pass host prep kernel (kernels_forward.chunk_heads_kernel, interpreted) against its torch
references, the flags from configs, and the kernel compiled for sm_90a with both (TMA, wgmma, spills bounded). The
kernel itself runs only on the GPU: experiments/linear_attention/gpu_forward.py checks it there against the float64
recurrence."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import gluon_forward as gf


@pytest.mark.parametrize("N,H", [(1, 3), (64, 16), (77, 5), (130, 80)])
def test_prep_kernel_matches_torch(N, H):
    torch.manual_seed(N)
    g = -torch.rand(2, N, H) * 0.5
    g[0, N // 2, 1 % H] = float("-inf")  # a reset: the floor
    g[1, 0, 2 % H] = float("nan")  # NaN stays (its chunk's later sums too)
    g[1, -1, 0] = -1e30
    beta = torch.rand(2, N, H)
    G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON)
    want = gf.chunk_cumulative_heads(g, gf.BT_GLUON)
    n_pad = -(-N // gf.BT_GLUON) * gf.BT_GLUON
    assert G.shape == (2, H, n_pad) and G.is_contiguous() and G.dtype == torch.float32
    torch.testing.assert_close(G, want, equal_nan=True, rtol=1e-6, atol=1e-4)
    assert torch.equal(beta_h, gf.chunk_heads(beta, gf.BT_GLUON)) and (beta_h[:, :, N:] == 0).all()
    # the log2 sums of chunk_cumulative, head-major; past N each chunk's last real token's (its last row)
    torch.testing.assert_close(want[:, :, :N], gf.chunk_cumulative(g, gf.BT_GLUON).transpose(1, 2) * gf.LOG2E,
                               equal_nan=True, rtol=1e-5, atol=1e-3)
    last = want.view(2, H, -1, gf.BT_GLUON)[:, :, -1, -1]
    torch.testing.assert_close(last, want[:, :, N - 1], equal_nan=True)
    # any strides (a transposed tensor's view), beta left out
    G2, none = gf.chunk_heads_prep(g.transpose(1, 2).contiguous().transpose(1, 2), None, gf.BT_GLUON)
    assert none is None and torch.equal(G2.isnan(), G.isnan())
    torch.testing.assert_close(G2, G, equal_nan=True)


def test_g_stage_takes_only_the_head_major_g():
    bf = torch.bfloat16
    q = torch.empty(1, 100, 2, 128, dtype=bf)
    v = torch.empty(1, 100, 2, 128, dtype=bf)
    o = torch.empty_like(v)
    with pytest.raises(ValueError, match="chunk_cumulative_heads"):
        gf.launch_args(q, q, v, torch.empty(1, 100, 2), None, None, None, None, o, None, 1.0, g_stage=True)
    G = torch.empty(1, 2, 128)
    with pytest.raises(ValueError, match="chunk_heads"):
        gf.launch_args(q, q, v, G, torch.empty(1, 100, 2), None, None, None, o, None, 1.0, g_stage=True)
    _, args, _ = gf.launch_args(q, q, v, G, torch.empty(1, 2, 128), None, None, None, o, None, 1.0, g_stage=True,
                                early_wv=True)
    assert args["G_STAGE"] and args["EARLY_WV"] and args["sgn"] == 0 and args["sbn"] == 0


# bytes ptxas spills (sm_90a, triton 3.6.0) with G_STAGE and EARLY_WV: scalar decay with states 96 (252 without
# G_STAGE; none in the chunk loop), Mamba-2 (beta, D, z) 28 (408)
SPILLS_ALLOWED = {"decay": 128, "mamba2": 64}
CODE = ("import json, sys; from tilecore.ops.linear_attention.gluon_forward import compile_report; "
        "print(json.dumps(compile_report(sys.argv[1], z_stage=sys.argv[1] == 'mamba2', g_stage=True, "
        "early_wv=True)))")


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    procs = {case: subprocess.Popen([sys.executable, "-c", CODE, case], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env) for case in SPILLS_ALLOWED}
    out = {}
    for case, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        out[case] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("case", list(SPILLS_ALLOWED))
def test_g_stage_early_wv_compile(reports, case):
    r = reports[case]
    assert r["tma"] and r["wgmma"] and r["mbarrier"] and not r["wgmma_serialized"], r
    assert r["g_stage"] and r["early_wv"], r
    assert r["shared"] <= 227 * 1024 and r["threads"] == 384, r
    assert r["spill_bytes"] <= SPILLS_ALLOWED[case], r


def test_variant_flags_follow_configs_and_need_a_decay(monkeypatch):
    from tilecore.ops.linear_attention import configs

    g, beta, z = torch.empty(1, 8, 2), torch.empty(1, 8, 2), torch.empty(1, 8, 2, 64)
    off = dict(g_stage=False, early_wv=False, lean=False)
    names = ("GLUON_G_STAGE", "GLUON_EARLY_WV", "GLUON_LEAN")
    for name in names:
        monkeypatch.setattr(configs, name, ())
    assert gf.variant(g, None, None) == off and gf.variant(g, beta, z) == off
    for name in names:
        monkeypatch.setattr(configs, name, (False,))  # the scalar decay's only
    assert gf.variant(g, None, None) == dict(g_stage=True, early_wv=True, lean=True)
    assert gf.variant(g, beta, z) == off and gf.variant(None, None, None) == off
    assert gf.variant(g, beta, z, g_stage=True, early_wv=True) == dict(off, g_stage=True, early_wv=True)
    G, b = gf.prepare_decay(g.uniform_(-1, 0), None, False)
    assert b is None and torch.equal(G, gf.chunk_cumulative(g, gf.BT_GLUON))

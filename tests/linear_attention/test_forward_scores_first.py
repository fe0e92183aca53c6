"""The Gluon forward's SCORES_FIRST (configs.GLUON_SCORES_FIRST, off until its H100 run): Q K^T issued as an async
wgmma at the chunk's start, under the state's and the weighted values' conversions, waited after their stores'
barrier pair. The math is the shipped kernel's, operation for operation (the same wgmma, the same products, in
another issue order: test_forward_lean's float32 twin of the step stands for both); on the CPU: the launches pass it
only where asked or configs turn it on, and the kernel compiled for sm_90a issues the chunk's first Q K^T HGMMA
before its first shared-memory store (the shipped kernel after them), not serialized, within the spill bound. The
kernel runs on the GPU only: experiments/linear_attention/gpu_mamba_s36.py checks it against float64 and times it."""
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_forward

BF = torch.bfloat16


def mamba_args(**kw):
    B, N, H, Dk, Dv = 1, 128, 4, 128, 64
    q = torch.empty(B, N, 1, Dk, dtype=BF)
    v = torch.empty(B, N, H, Dv, dtype=BF)
    f32 = torch.float32
    return gluon_forward.launch_args(q, q, v, torch.zeros(B, H, N, dtype=f32), torch.zeros(B, H, N, dtype=f32),
                                     torch.zeros(H, Dv, dtype=f32), torch.empty_like(v), None, torch.empty_like(v),
                                     None, 1.0, 2, z_stage=True, g_stage=True, early_wv=True, lean=True, **kw)[1]


def test_only_where_asked_or_configs_turn_it_on(monkeypatch):
    assert "SCORES_FIRST" not in mamba_args() and mamba_args(scores_first=True)["SCORES_FIRST"] is True
    assert inspect.signature(gluon_forward.la_fwd_gluon_kernel.fn).parameters["SCORES_FIRST"].default is False
    g, beta, z = torch.empty(1, 8, 2), torch.empty(1, 8, 2), torch.empty(1, 8, 2, 64)
    assert gluon_forward.variant(g, beta, z)["scores_first"] is (True in configs.GLUON_SCORES_FIRST)
    monkeypatch.setattr(configs, "GLUON_SCORES_FIRST", (True,))  # Mamba-2's (beta given) only
    assert gluon_forward.variant(g, beta, z)["scores_first"] is True
    assert gluon_forward.variant(g, None, None)["scores_first"] is False
    assert gluon_forward.variant(g, beta, z, scores_first=False)["scores_first"] is False


CODE = r"""
import json, os, re, subprocess, sys, tempfile
from tilecore.ops.linear_attention.gluon_forward import compile_report
from triton.backends.nvidia.compiler import get_ptxas
on = sys.argv[1] == "1"
out = []
r = compile_report("mamba2", stages=2, z_stage=True, g_stage=True, early_wv=True, silu_tanh=True, lean=True,
                   scores_first=on, compiled_out=out)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    open(path, "wb").write(out[0].asm["cubin"])
    sass = subprocess.run([os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump"), "-sass", path],
                          capture_output=True, text=True, check=True).stdout
ins = [m.group(1) for l in sass.splitlines() if (m := re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", l))]
# consumer 0's chunk loop: from its first stage wait (the first SYNCS.PHASECHK after a BAR.SYNC 0x2: the named barrier
# of a consumer warpgroup) on
start = next(i for i, x in enumerate(ins) if x.startswith("BAR.SYNC") and "0x2" in x)
start = next(i for i in range(start, len(ins)) if ins[i].startswith("SYNCS.PHASECHK"))
qk = next(i for i in range(start, len(ins)) if ins[i].startswith("HGMMA") and "tnsp" not in ins[i])
st = next(i for i in range(start, len(ins)) if ins[i].startswith("STSM"))
r.update(qk_before_store=qk < st, hgmma=sum(x.startswith("HGMMA") for x in ins))
print(json.dumps(r))
"""


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = {on: subprocess.Popen([sys.executable, "-c", CODE, on], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for on in ("0", "1")}
    out = {}
    for on, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        out[on] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_qk_issued_before_the_chunks_stores(reports):
    shipped, first = reports["0"], reports["1"]
    assert not shipped["qk_before_store"] and first["qk_before_store"]
    assert first["hgmma"] == shipped["hgmma"]  # the same wgmmas
    for r in (shipped, first):
        assert r["tma"] and r["wgmma"] and not r["wgmma_serialized"], r
        assert r["shared"] == shipped["shared"] and r["threads"] == 384, r
        assert r["spill_bytes"] <= 64, r  # (shipped 28 B, SCORES_FIRST 44 B)

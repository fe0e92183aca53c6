"""The Gluon forward (gluon_forward.la_fwd_gluon_kernel) compiles for sm_90a on this GPU-less machine:
TMA loads, wgmma, not serialized, within Hopper's 227 KiB of shared memory, spills bounded. It cannot
run in Triton's interpreter; its tl twins (kernels_tl.la_fwd_kernel, kernels_forward) are tested there,
and experiments/linear_attention/gpu_forward.py checks it on the GPU against the float64 recurrence."""
import json
import os
import subprocess
import sys

import pytest

# bytes ptxas spills (sm_90a, triton 3.6.0): none without a decay; Mamba-2's beta, D and z with G and beta loaded
# by pointers (no flag: the kernel's plain form) push the consumers past their registers (~400 B); with the
# shipped flags (configs: Z_STAGE, G_STAGE, EARLY_WV, SILU_TANH, LEAN) 28 B
SPILLS_ALLOWED = {"linear": 0, "mamba2": 512, "mamba2 shipped": 64}
CODE = ("import json, sys; from tilecore.ops.linear_attention.gluon_forward import compile_report; "
        "on = sys.argv[2] == 'shipped'; print(json.dumps(compile_report(sys.argv[1], z_stage=on, g_stage=on, "
        "early_wv=on, silu_tanh=on, lean=on)))")


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    procs = {case: subprocess.Popen([sys.executable, "-c", CODE, *(case.split() + ["-"])[:2]], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
             for case in SPILLS_ALLOWED}
    out = {}
    for case, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        out[case] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("case", list(SPILLS_ALLOWED))
def test_gluon_forward_compiles_to_tma_and_wgmma(reports, case):
    r = reports[case]
    assert r["tma"] and r["wgmma"] and r["mbarrier"], r
    assert not r["wgmma_serialized"], r
    assert r["shared"] <= 227 * 1024, r
    assert r["threads"] == 384, r  # two consumer warpgroups and the producer's
    assert r["spill_bytes"] <= SPILLS_ALLOWED[case], r

"""The Gluon forward (gluon_forward.la_fwd_gluon_kernel) compiles for sm_90a on this GPU-less machine as the shipped
launches build it: TMA loads, wgmma, not serialized, within Hopper's 227 KiB of shared memory, spills bounded; G and
beta through the stage, and Mamba-2's gate by tanh.approx. It cannot run in Triton's interpreter; its tl twins
(kernels_tl.la_fwd_kernel, kernels_forward) are tested there, test_forward_gluon_step.py checks its chunk-steps' algebra
against float64, and experiments/linear_attention/gpu_forward.py / gpu_mamba.py check it on the GPU."""
import json
import os
import subprocess
import sys

import pytest

# bytes ptxas spills (sm_90a, triton 3.6.0): none without a decay; a scalar decay with initial and final states 96
# (none in the chunk loop); Mamba-2 (beta, D, z: the transposed step) 64, none in the chunk loop
SPILLS_ALLOWED = {"linear": 0, "decay": 128, "mamba2": 128}
CODE = ("import json, sys; from tilecore.ops.linear_attention.gluon_forward import compile_report; out = []; "
        "r = compile_report(sys.argv[1], compiled_out=out); ptx = out[0].asm['ptx']; "
        "r['tanh'] = 'tanh.approx.f32' in ptx; r['g_tma'] = ptx.count('cp.async.bulk.tensor.3d'); "
        "print(json.dumps(r))")


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    procs = {case: subprocess.Popen([sys.executable, "-c", CODE, case], stdout=subprocess.PIPE,
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
    # G (and with beta, beta) by 3-D TMA boxes beside q, k, v (4-D); the gate's sigmoid by tanh.approx with z only
    assert (r["g_tma"] > 0) == (case != "linear"), r
    assert r["tanh"] == (case == "mamba2"), r

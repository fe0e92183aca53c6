"""Based's Gluon forward (gluon_based.based_fwd_gluon_kernel) compiles for sm_90a on this GPU-less machine:
TMA loads, wgmma (not serialized), within Hopper's 227 KiB of shared memory at the shipped 3 stages, two consumer
warpgroups and a producer, no spill in the walk. The kernel cannot run in Triton's interpreter
(test_gluon_based_host.py tests its tables and maps; experiments/linear_attention/gpu_forward.py checks it on the
GPU)."""
import json
import os
import subprocess
import sys

import pytest

# bytes ptxas spills (sm_90a, triton 3.6.0; the whole kernel compiles at 168 registers a thread, 384 threads): none
# without states; the initial and final states' [64, 128] pointer tiles in start/finish (once a tile, outside the
# walk) ~2.1 KB. Two compiles (~25 s each on 2 cores)
SPILLS_ALLOWED = {"states": 3072, "no states": 0}
CODE = ("import json, sys; from tilecore.ops.linear_attention.gluon_based import compile_report; "
        "print(json.dumps(compile_report(states=sys.argv[1] == 'states', stages=3)))")


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    procs = {case: subprocess.Popen([sys.executable, "-c", CODE, case], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env) for case in SPILLS_ALLOWED}
    out = {}
    for case, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        out[case] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("case", list(SPILLS_ALLOWED))
def test_gluon_based_compiles_to_tma_and_wgmma(reports, case):
    r = reports[case]
    assert r["tma"] and r["wgmma"] and r["mbarrier"], r
    assert not r["wgmma_serialized"], r
    assert r["shared"] <= 227 * 1024, r
    assert r["threads"] == 384, r
    assert r["spill_bytes"] <= SPILLS_ALLOWED[case], r

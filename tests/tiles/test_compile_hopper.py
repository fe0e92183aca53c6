"""Every GEMM kernel compiles for sm_90a on this (GPU-less) machine; the Gluon kernels' PTX holds
wgmma and TMA (cp.async.bulk.tensor), and nothing spills. Gluon cannot run in the interpreter, so
this is its CI; the same command prints the resource report for people."""
import os
import subprocess
import sys

import pytest
from compiled_run import command_json


@pytest.fixture(scope="module")
def report():
    return command_json(["-m", "tilecore.ops.gemm.report", "--json"], timeout=600)


def test_gluon_kernels_hold_wgmma_and_tma(report):
    gluon = [r for r in report if r["gluon"]]
    assert len(gluon) >= 4
    for r in gluon:
        assert r["wgmma"] and r["tma"] and r["mbarrier"], r["kernel"]
        assert not r["wgmma_serialized"], r["kernel"]  # ptxas's C7513
        assert r["shared"] <= 227 * 1024, r["kernel"]
        assert r["threads"] == 384, r["kernel"]  # 8 consumer warps + a producer padded to a warpgroup


def test_no_kernel_spills(report):
    for r in report:
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, r
        assert 0 < r["registers"] <= 255, r


def test_tl_twin_compiles_for_hopper(report):
    assert any(not r["gluon"] for r in report)


def test_report_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "tilecore.ops.gemm.report"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "TRITON_INTERPRET" in r.stderr

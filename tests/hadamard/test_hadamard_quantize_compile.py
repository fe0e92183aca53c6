"""hadamard_quantize's GPU-only code compiles for sm_90a on this (GPU-less) machine: the shipped FAST plans of
fp8, mxfp4 and nvfp4 at n = 4096 (experiments/hadamard/sass_quantize.py --check, a fresh process without the
interpreter), with no spills, wgmma and TMA in the PTX, fp8 codes and nvfp4 block scales by cvt.rn.satfinite,
no division a value (FAST), and the loop's SASS instruction counts at or below session 26's."""
import os

import pytest
from compiled_run import command_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def report():
    script = os.path.join(ROOT, "experiments", "hadamard", "sass_quantize.py")
    rows = command_json([script, "--check"], timeout=900, cwd=ROOT, env={"PYTHONPATH": ROOT})
    return {row["format"]: row for row in rows}


# session 26's loop of one 4096-element tile (sm_90a SASS): fp8 479-481, mxfp4 799, nvfp4 1046; a margin of ~5%
LOOP_BOUNDS = {"fp8_e4m3": 505, "mxfp4": 840, "nvfp4": 1100}


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "mxfp4", "nvfp4"])
def test_fast_plans_compile_lean(report, fmt):
    row = report[fmt]
    assert "error" not in row, row.get("error")
    assert row["path"] == "pow2" and row["fast"]
    assert row["spills"] == 0 and row["ptx_wgmma"] and row["ptx_tma"]
    assert row["loop"] <= LOOP_BOUNDS[fmt], row
    if fmt in ("fp8_e4m3", "nvfp4"):  # fp8 codes; nvfp4's e4m3 block scales
        assert row["ptx_e4m3_satfinite"]
    if fmt == "mxfp4":  # its scales are powers of two: reciprocal from bits, no division at all
        assert not row["ptx_div_rn"] and row["mufu"] == 0

"""hadamard_quantize's Gluon kernels (the kron kernel at 28 x 512 / 28 x 1024, the wide kernel at 172 x 64 / 148 x 128)
for a call of one row (one token: RotatedLinear at decode): Triton passes an integer argument equal to 1 as a constant,
and the tiles template counts tiles in a tensor; the kernels take ``rows`` as a tensor (gl.to_tensor). Compiled for
sm_90a in a fresh process at the plan a one-row call gets."""
import os
from compiled_run import compiled_json_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from experiments.hadamard import sass_s33
from tilecore.ops.hadamard import quantize
sass_s33.ROWS = 1
for fmt, n in (("fp8_e4m3", 14336), ("fp8_e4m3", 11008)):
    plan = quantize.kernel_plan(1, n, torch.bfloat16, fmt, None, None, True, False, False, 132, _gluon_ok=True)
    r = sass_s33._compile(plan, fmt, n)
    print(json.dumps(dict(fmt=fmt, n=n, path=plan.path, grid=plan.grid[0], spills=r["spills"], wgmma=r["wgmma"])))
"""


def test_gluon_quantize_kernels_compile_for_one_row():
    rows = compiled_json_lines(_COMPILE, timeout=900, cwd=ROOT)
    assert [(x["n"], x["path"], x["grid"]) for x in rows] == [(14336, "gluon_kron", 1), (11008, "gluon_wide", 1)]
    assert all(x["wgmma"] > 0 and x["spills"] == 0 for x in rows), rows

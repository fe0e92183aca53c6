"""The norm's kernels compile for sm_90a on this (GPU-less) machine without spilling registers: the
whole-row forward and backward at 65536 x 4096 and the wide path's statistics and row sums at
64 x 65536 (LayerNorm with a residual, dropout and the residual stream stored: the most live values).
python -m tilecore.ops.norm.report compiles every shape and variant."""
import json
import os
import subprocess
import sys

CODE = """
import json
from tilecore.ops.norm.report import norm_variants
from tilecore.tiles.report import rows
keep = ("forward layer, residual, dropout 65536x4096", "backward layer, residual, dropout 65536x4096",
        "stats layer, residual, dropout 64x65536", "row sums layer, residual, dropout 64x65536")
print(json.dumps(rows([v for v in norm_variants(((65536, 4096), (64, 65536))) if v[0] in keep])))
"""


def test_compiles_for_hopper_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert len(report) == 4
    for row in report:
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0 and row["stack"] == 0, row

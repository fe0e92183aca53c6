"""The Monarch kernel compiles for sm_90a on this (GPU-less) machine at its largest N (the most registers)
with at most a few bytes of register spill (python -m tilecore.ops.fft_conv.report compiles every N)."""
import json
import os
import subprocess
import sys

from tilecore.ops.fft_conv import configs

CODE = """
import json
from tilecore.ops.fft_conv.report import fft_conv_variants
from tilecore.tiles.report import rows
print(json.dumps(rows(fft_conv_variants()[-1:])))
"""


def test_compiles_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout)
    assert row["kernel"].startswith(f"fft_conv N{max(configs.TL_FACTORS)}"), row
    assert row["spill_stores"] <= 16 and row["shared"] <= 64 * 1024, row

"""Dynamic tiles (a program draws its next tile from a global counter; the launch's last draw resets
it): the tl twin's protocol in the interpreter, and the Gluon template's in the PTX it compiles to."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from tilecore.tiles.pipeline import Layout, run, struct

ROOT = Path(__file__).resolve().parents[2]
ROWS, COLS = 8, 32  # a tile: ROWS rows; a step: COLS columns of them


@struct
class WeightedRowSums:
    """out[r] += sum over steps k of (k + 1) * sum(x[r, k COLS : (k + 1) COLS]): weighted by the step, so
    every step must run once; added to what out holds, so a tile run twice would show."""
    x: object
    out: object
    cols: object

    @triton.jit
    def setup(self, tile_id):
        return tile_id, self.cols // COLS

    @triton.jit
    def load(self, tile, step):
        rows = tile * ROWS + tl.arange(0, ROWS)
        return tl.load(self.x + rows[:, None] * self.cols + step * COLS + tl.arange(0, COLS)[None, :])

    @triton.jit
    def start(self, ctx, tile, prev):
        return tl.zeros([ROWS], tl.float32)

    @triton.jit
    def compute(self, ctx, acc, x, tile, step):
        return acc + tl.sum(x, axis=1) * (step + 1)

    @triton.jit
    def wait(self, ctx, acc):
        return acc

    @triton.jit
    def finish(self, ctx, acc, tile):
        rows = tile * ROWS + tl.arange(0, ROWS)
        tl.store(self.out + rows, acc + tl.load(self.out + rows))


@triton.jit
def weighted_row_sums(x, out, cols, num_tiles, counter, DYNAMIC: tl.constexpr):
    if DYNAMIC:
        run(WeightedRowSums(x, out, cols), Layout(1, tile_counter=counter), num_tiles)
    else:
        run(WeightedRowSums(x, out, cols), Layout(1), num_tiles)


@pytest.mark.parametrize("programs", [1, 3, 10, 16])
def test_drawn_tiles_each_run_once_and_leave_the_counter_at_zero(programs):
    tiles, cols = 10, 3 * COLS
    x = torch.randn(tiles * ROWS, cols)
    weights = torch.arange(1, 4, dtype=torch.float32).repeat_interleave(COLS)
    want = (x * weights).sum(1)
    counter = torch.zeros(1, dtype=torch.int32)
    for _ in range(2):  # the second launch finds the counter as the first left it
        out = torch.zeros(tiles * ROWS)
        weighted_row_sums[(programs,)](x, out, cols, tiles, counter, DYNAMIC=True)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        assert counter.item() == 0
    static = torch.zeros(tiles * ROWS)
    weighted_row_sums[(programs,)](x, static, cols, tiles, counter, DYNAMIC=False)
    torch.testing.assert_close(static, want, rtol=1e-5, atol=1e-5)


PTX_SCRIPT = """
import re, sys, torch
from tilecore.ops.hadamard import launch
from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_kernel
from tilecore.tiles.compile import compile_kernel
x = torch.empty(64, 32768, dtype=torch.float16)
for dynamic in (True, False):
    ptx = compile_kernel(hadamard_gluon_kernel, launch.gluon_args(x, x, 1.0, 8, 4, dynamic), num_warps=4).asm["ptx"]
    print(dynamic, len(re.findall(r"atom\\.global\\.gpu\\.relaxed\\.add", ptx)),
          len(re.findall(r"atom\\.global\\.gpu\\.relaxed\\.exch", ptx)))
"""


def test_gluon_producer_draws_rows_and_resets_the_counter():
    """Compiled for sm_90a (no GPU here): the dynamic Hadamard kernel's PTX has the draws (relaxed
    atomic adds: the first and the early next one) and the reset (an exchange); the static one neither."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", PTX_SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = {line.split()[0]: tuple(int(v) for v in line.split()[1:]) for line in r.stdout.splitlines()}
    assert counts["True"][0] >= 2 and counts["True"][1] >= 1, counts
    assert counts["False"] == (0, 0), counts

"""The template's contract on a toy op, in the ``tl`` twin (tilecore.tiles.pipeline) under the interpreter.

The toy op: row statistics of x * w over a ragged band of columns. A tile is ROWS rows; tile t's steps
are its first ``t % 4`` column blocks of COLS (tile 0 has none, the last block is partial), each
stage holding two named buffers (an x block and a w block). The state is a struct of two running
results (the row sums and row maxima of x * w) and the step it expects next. Every callback counts
its calls per tile in ``calls``, so the test sees that the template called setup, start, wait and
finish once a tile, load and compute once a step, in order, with ctx.index 0 and no previous state,
and which program finished each tile, for round-robin tiles, a schedule table and drawn tiles.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from tilecore.tiles import ops
from tilecore.tiles.pipeline import Layout, run, struct
from tilecore.tiles.schedule import dealt_schedule

ROOT = Path(__file__).resolve().parents[2]
ROWS = tl.constexpr(4)
COLS = tl.constexpr(8)
# the columns of ``calls``: a callback's calls for the tile; computes given the step they expected;
# the program that finished the tile
SETUP, LOAD, START, COMPUTE, IN_ORDER, WAIT, FINISH, OWNER = (tl.constexpr(i) for i in range(8))
CALLS = tl.constexpr(8)


@struct
class Stage:
    x: object  # [ROWS, COLS]
    w: object  # [COLS]


@struct
class Band:
    tile: object
    rows: object  # [ROWS] row indices
    valid: object  # [ROWS] rows below R


@struct
class Running:
    total: object  # [ROWS] row sums of x * w so far
    peak: object  # [ROWS] row maxima of x * w so far
    next: object  # the step compute should get next
    waited: object  # wait's calls on this state


@struct
class RowStats:
    x: object
    w: object
    sums: object
    maxes: object
    calls: object
    R: object
    C: object

    @triton.jit
    def count(self, tile, what, value=1):
        tl.atomic_add(self.calls + tile * CALLS + what, value)

    @triton.jit
    def setup(self, tile_id):
        self.count(tile_id, SETUP)
        rows = tile_id * ROWS + tl.arange(0, ROWS)
        return Band(tile_id, rows, rows < self.R), tl.minimum(tl.cdiv(self.C, COLS), tile_id % 4)

    @triton.jit
    def load(self, band, step):
        self.count(band.tile, LOAD)
        cols = step * COLS + tl.arange(0, COLS)
        x = tl.load(self.x + band.rows[:, None] * self.C + cols[None, :],
                    mask=band.valid[:, None] & (cols < self.C)[None, :], other=0.0)
        return Stage(x, tl.load(self.w + cols, mask=cols < self.C, other=0.0))

    @triton.jit
    def start(self, ctx, band, prev):
        if prev is None and ctx.index == 0:
            self.count(band.tile, START)
        else:
            self.count(band.tile, START, 100)
        zero = band.tile * 0
        return Running(tl.zeros([ROWS], tl.float32), tl.full([ROWS], float("-inf"), tl.float32), zero, zero)

    @triton.jit
    def compute(self, ctx, st, stage, band, step):
        self.count(band.tile, COMPUTE)
        self.count(band.tile, IN_ORDER, (step == st.next).to(tl.int32))
        xw = stage.x * stage.w[None, :]
        cols = step * COLS + tl.arange(0, COLS)
        peak = tl.maximum(st.peak, ops.row_max(tl.where((cols < self.C)[None, :], xw, float("-inf"))))
        return Running(st.total + ops.row_sum(xw), peak, st.next + 1, st.waited)

    @triton.jit
    def wait(self, ctx, st):
        return Running(st.total, st.peak, st.next, st.waited + 1)  # counted by finish: wait sees no tile

    @triton.jit
    def finish(self, ctx, st, band):
        self.count(band.tile, WAIT, st.waited)
        self.count(band.tile, FINISH)
        self.count(band.tile, OWNER, tl.program_id(0))
        tl.store(self.sums + band.rows, st.total, mask=band.valid)
        tl.store(self.maxes + band.rows, st.peak, mask=band.valid)


@triton.jit
def row_stats_kernel(x, w, sums, maxes, calls, R, C, num_tiles, schedule, counter, STAGES: tl.constexpr):
    op = RowStats(x, w, sums, maxes, calls, R, C)
    run(op, Layout(STAGES, schedule=schedule, tile_counter=counter), num_tiles)


def row_stats(x, w, programs, *, schedule=None, counter=None, stages=1):
    """(row sums, row maxima, calls) from the toy op, its outputs poisoned with NaN first."""
    R, C = x.shape
    tiles = triton.cdiv(R, ROWS.value)
    sums = torch.full((R,), float("nan"))
    maxes = torch.full((R,), float("nan"))
    calls = torch.zeros(tiles, CALLS.value, dtype=torch.int32)
    row_stats_kernel[(programs,)](x, w, sums, maxes, calls, R, C, tiles, schedule, counter, STAGES=stages)
    return sums, maxes, calls


def reference(x, w):
    """The toy op in torch: tile t's rows over their first t % 4 column blocks (float64)."""
    R, C = x.shape
    xw = x.double() * w.double()
    limit = torch.clamp((torch.arange(R) // ROWS.value % 4) * COLS.value, max=C)  # each row's columns
    inside = torch.arange(C)[None, :] < limit[:, None]
    return (torch.where(inside, xw, 0.0).sum(1), torch.where(inside, xw, float("-inf")).amax(1))


def expected_calls(R, C):
    tiles = triton.cdiv(R, ROWS.value)
    steps = torch.clamp(torch.arange(tiles) % 4, max=triton.cdiv(C, COLS.value))
    ones = torch.ones(tiles, dtype=torch.int32)
    return torch.stack([ones, steps, ones, steps, steps, ones, ones], 1).to(torch.int32)


def check(x, w, sums, maxes, calls):
    want_sums, want_maxes = reference(x, w)
    torch.testing.assert_close(sums.double(), want_sums, rtol=1e-5, atol=1e-5)  # NaN: a row never written
    torch.testing.assert_close(maxes.double(), want_maxes, rtol=1e-5, atol=1e-5)
    assert torch.equal(calls[:, :OWNER.value], expected_calls(*x.shape)), calls


@pytest.mark.parametrize("R,C", [(4, 8), (37, 29), (64, 70)])
@pytest.mark.parametrize("programs", [1, 3, 7])
def test_round_robin_tiles(R, C, programs):
    x, w = torch.randn(R, C), torch.randn(C)
    sums, maxes, calls = row_stats(x, w, programs, stages=2)
    check(x, w, sums, maxes, calls)
    tiles = triton.cdiv(R, ROWS.value)
    assert torch.equal(calls[:, OWNER.value], torch.arange(tiles, dtype=torch.int32) % programs)  # tile t: program t mod P


@pytest.mark.parametrize("programs", [2, 5])
def test_schedule_table(programs):
    """A schedule table (here dealt in reverse, so that it differs from round-robin): every program
    runs exactly the tiles the table gives it."""
    x, w = torch.randn(45, 30), torch.randn(30)
    tiles = triton.cdiv(45, ROWS.value)
    table = dealt_schedule([[t] for t in reversed(range(tiles))], programs)
    sums, maxes, calls = row_stats(x, w, programs, schedule=table)
    check(x, w, sums, maxes, calls)
    owner = torch.empty(tiles, dtype=torch.int32)
    for p in range(programs):
        owner[table[table[p]:table[p + 1]].long()] = p
    assert torch.equal(calls[:, OWNER.value], owner)


@pytest.mark.parametrize("programs", [1, 4])
def test_drawn_tiles(programs):
    """Drawn tiles: each tile once, the counter left at zero (the interpreter runs program 0 first, so
    it draws them all)."""
    x, w = torch.randn(50, 17), torch.randn(17)
    counter = torch.zeros(1, dtype=torch.int32)
    for _ in range(2):  # the second launch finds the counter as the first left it
        sums, maxes, calls = row_stats(x, w, programs, counter=counter)
        check(x, w, sums, maxes, calls)
        assert counter.item() == 0


COMPILE = """
import importlib.util, sys, torch
from tilecore.tiles.compile import compile_kernel, resources
spec = importlib.util.spec_from_file_location("contract", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
x = torch.empty(64, 64)
i32 = torch.empty(64, dtype=torch.int32)
for schedule, counter in ((None, None), (i32, None), (None, i32)):
    k = compile_kernel(m.row_stats_kernel, dict(x=x, w=x, sums=x, maxes=x, calls=i32, R=64, C=64, num_tiles=16,
                                                 schedule=schedule, counter=counter, STAGES=2))
    r = resources(k)
    print(schedule is not None, counter is not None, r.spill_stores, "atom.global" in k.asm["ptx"])
"""


def test_toy_op_compiles_for_hopper():
    """The same op compiles (sm_90a, no GPU needed) in the three tile orders: structs and their
    methods work compiled too."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", COMPILE, __file__], capture_output=True, text=True, env=env,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line.split() for line in r.stdout.splitlines()]
    assert [line[:2] for line in lines] == [["False", "False"], ["True", "False"], ["False", "True"]], lines
    assert all(line[2] == "0" and line[3] == "True" for line in lines), lines

"""The norm's tables (plan.py reads them). One line a reason here; the runs behind each value and their history:
notes/norm/README.md (decision log). experiments/norm_rotary/gpu_check.py and gpu_s36.py check and time them.
"""
from __future__ import annotations

# Rows of up to this many elements are held whole in one program's registers (one read of x, one
# pass); wider rows run the two-kernel path, WIDE_BLOCK columns at a time. 8192 float32 values over
# 16 warps are 16 a thread for each live tile (dy, h, xhat in the backward), well within registers.
WHOLE_ROW_MAX = 8192
WIDE_BLOCK = 4096

# Narrow rows are stacked ROWS = TILE_ELEMS // BLOCK_N to a tile, so that a program moves enough bytes
# per step (a row of 256 bf16 elements is 512 bytes: too little to keep the loads in flight).
TILE_ELEMS = 4096

# warps: a tile's elements over 32-thread warps at this many values a thread (from MIN_WARPS to
# MAX_WARPS warps). The backward's loop is latency-bound, so what counts is how many of its programs
# are resident (registers: python -m tilecore.ops.norm.report).
FORWARD_VALUES_PER_THREAD = 16
BACKWARD_VALUES_PER_THREAD = 16
MIN_WARPS = 4
MAX_WARPS = 16

# The backward's tiles (rows = BACKWARD_TILE_ELEMS // BLOCK_N, at least 1) and row groups per SM (each a
# persistent program writing one partial row of dweight and dbias: groups x N float32 each): small programs,
# several resident an SM, hide the loop's latency as the forward's grid does.
BACKWARD_TILE_ELEMS = 2048
BACKWARD_GROUPS_PER_SM = 8

# The backward of the fused variant (it reads or recomputes the residual stream and writes dresidual:
# 5 row passes against LayerNorm's 3) by BLOCK_N: (tile elements, warps, row groups an SM), in place of
# the values above: at 4096 columns 8 warps held 167 registers, one program an SM; 4 warps, 8 groups is faster.
# At 1024 one row a program over 2 warps (147 registers x 64 threads: 6 resident an SM, a row's sums over two warps).
FUSED_BACKWARD = {1024: (1024, 2, 6), 4096: (4096, 4, 8)}
# The same for the backward without a residual stream (LayerNorm / RMSNorm alone: 3 row passes), by BLOCK_N: as many
# groups an SM as programs are resident (1024: 128 registers x 128 threads, 4 an SM; 4096: 8 warps, 2 an SM), one
# wave, and fewer partial rows to sum.
PLAIN_BACKWARD = {1024: (2048, 4, 4), 4096: (4096, 8, 2)}

# How the backward's dweight / dbias partials become dweight / dbias: "kernel" (backward.norm_partials_kernel: both
# sums and casts in one launch) or "torch" (a torch sum over the groups and a cast, each of dweight and dbias: up to
# four small launches after the kernel, 8-9% of the backward at 1024 columns).
BACKWARD_FINISH = "kernel"
# the finishing kernel's tile: FINISH_TILE_ELEMS partial values a step over columns of about FINISH_PROGRAMS programs
# (8 to 64 columns each): many programs, few dependent steps each
FINISH_TILE_ELEMS = 2048
FINISH_PROGRAMS = 512

# SMs the interpreter pretends to have: a few groups, each running several row tiles
INTERPRETER_SMS = 4


def num_warps(tile_elems: int, values_per_thread: int) -> int:
    warps = max(1, tile_elems // (32 * values_per_thread))
    return min(MAX_WARPS, max(MIN_WARPS, 1 << (warps.bit_length() - 1)))  # a power of two

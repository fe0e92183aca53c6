"""The norm's tables (plan.py reads them). Why each value: notes/norm/README.md.

Not yet timed on the H100 (issue 37's first session wrote the kernels without a GPU): the values are the
usual ones for a memory-bound row kernel, to be replaced by experiments/norm/gpu_check.py's figures.
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

# warps: a tile's elements over 32-thread warps at this many values a thread (from 1 to 16 warps). The
# backward keeps dy, h, xhat and g live: at 16 values a thread its 65536 x 1024 dropout case hit
# ptxas's 128-register cap and spilled; at 8, 100 registers and no spill (report.py).
FORWARD_VALUES_PER_THREAD = 16
BACKWARD_VALUES_PER_THREAD = 8
MAX_WARPS = 16

# The backward's row groups (each writes a partial row of dweight and dbias: groups x N float32 each)
# per SM: enough programs to fill the GPU, few enough that the partials are small beside the data.
BACKWARD_GROUPS_PER_SM = 2

# SMs the interpreter pretends to have: a few groups, each running several row tiles
INTERPRETER_SMS = 4


def num_warps(tile_elems: int, values_per_thread: int) -> int:
    warps = max(1, tile_elems // (32 * values_per_thread))
    return min(MAX_WARPS, 1 << (warps.bit_length() - 1))  # a power of two

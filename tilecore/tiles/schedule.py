"""The persistent scheduler: one program per SM, looping over output tiles in a grouped order.

All of the tile-index math lives here, in one ``triton.jit`` function that both the ``tl`` kernels
and the Gluon kernels call (Gluon can call plain Triton functions that do scalar arithmetic).

Order. Tiles are numbered ``0 .. num_pid_m * num_pid_n - 1``. With ``GROUP_M = 1`` the order is
row-major: a wave of 132 programs sweeps one or two rows of tiles of C and so reads the whole of B
per wave. With ``GROUP_M = g`` the programs walk down ``g`` rows of tiles before moving right, so a
wave touches about ``sqrt(132)`` tiles of A-rows and of B-columns, which stay in L2 (ThunderKittens'
"L2-aware" block order; the paper reports 805 vs 392 TFLOP/s at 16384^3).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecore import dispatch


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile ``tile_id`` in the grouped order (``GROUP_M = 1``: row-major)."""
    width = GROUP_M * num_pid_n
    group = tile_id // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    local = tile_id % width
    pid_m = first_m + local % size_m
    pid_n = local // size_m
    return pid_m, pid_n


@triton.jit
def tile_origin(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Element offsets (off_m, off_n) of the C tile numbered ``tile_id``."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


def num_tiles(M: int, N: int, block_m: int, block_n: int) -> int:
    return triton.cdiv(M, block_m) * triton.cdiv(N, block_n)


def persistent_programs(tiles: int, device: torch.device, *, cpu_programs: int = 3) -> int:
    """Programs to launch: one per SM (never more than there are tiles).

    On the CPU (the interpreter) a few programs, so the loop over tiles is still exercised.
    """
    if device.type == "cuda":
        sms = dispatch.num_sms(device)
    else:
        sms = cpu_programs
    return max(1, min(tiles, sms))

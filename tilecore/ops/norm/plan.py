"""Which kernels normalize these rows, with which tiles and grids: every fit check in one place.

``plan(rows, n, device)`` returns a ``Plan``; launch.forward / launch.backward run it. Paths:

* "cpu": CPU tensors without Triton's interpreter: torch's own CPU kernels (native_layer_norm and its
  backward; RMSNorm in float32 torch operations);
* "tl": the Triton kernels of forward.py and backward.py (any CUDA GPU; the CPU through the
  interpreter): rows of up to configs.WHOLE_ROW_MAX elements whole in a tile (``whole_row``), wider
  ones configs.WIDE_BLOCK columns at a time, after a kernel that takes each row's statistics.
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore import dispatch
from tilecore.ops.norm import configs
from tilecore.tiles.launch import cdiv, next_power_of_2


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str  # "cpu" | "tl"
    whole_row: bool = True
    rows_per_tile: int = 1  # ROWS of the forward kernels
    backward_rows: int = 1  # ROWS of the backward kernels
    block_n: int = 1  # BLOCK_N: columns per tile
    num_warps: int = 4  # the forward kernels' (and the dropout mask's)
    backward_warps: int = 4
    column_blocks: int = 1
    row_tiles: int = 1
    groups: int = 1  # the backward's row groups (rows of the dweight / dbias partials)
    finish: str = "torch"  # the partials' sums: "torch" or "kernel" (configs.BACKWARD_FINISH)
    finish_rows: int = 1  # the finishing kernel's BLOCK_G (partial rows a step) and BLOCK_C (columns a program)
    finish_cols: int = 8


def plan(rows: int, n: int, device: torch.device, *, whole_row_max: int | None = None, fused: bool = False) -> Plan:
    """The plan for (rows, n) rows on ``device``; ``whole_row_max`` overrides configs.WHOLE_ROW_MAX;
    ``fused``: a backward that reads or recomputes the residual stream and writes dresidual (its
    backward tile, warps and groups from configs.FUSED_BACKWARD)."""
    if dispatch.backend_for(device) == "reference":
        return Plan("cpu")
    sms = configs.INTERPRETER_SMS if dispatch.interpreted(device) else dispatch.num_sms(device)
    return tl_plan(rows, n, sms, whole_row_max=whole_row_max, fused=fused)


def tl_plan(rows: int, n: int, sms: int, *, whole_row_max: int | None = None, tile_elems: int | None = None,
            wide_block: int | None = None, groups_per_sm: int | None = None, num_warps: int | None = None,
            backward_tile_elems: int | None = None, backward_warps: int | None = None, fused: bool = False,
            finish: str | None = None) -> Plan:
    """The "tl" plan for (rows, n) rows on a GPU of ``sms`` SMs (no device asked: report.py and the GPU
    check use it). The keywords override configs' WHOLE_ROW_MAX, TILE_ELEMS, WIDE_BLOCK,
    BACKWARD_GROUPS_PER_SM, BACKWARD_TILE_ELEMS, BACKWARD_FINISH and the warps (for sweeps);
    The backward's tile, warps and groups an SM come from configs.FUSED_BACKWARD (``fused``) or PLAIN_BACKWARD
    where the table has the row's BLOCK_N (the keywords still win)."""
    whole_row_max = whole_row_max or configs.WHOLE_ROW_MAX
    whole_row = n <= whole_row_max
    table = configs.FUSED_BACKWARD if fused else configs.PLAIN_BACKWARD
    if whole_row and next_power_of_2(n) in table:
        tile, warps, groups = table[next_power_of_2(n)]
        backward_tile_elems = backward_tile_elems or tile
        backward_warps = backward_warps or warps
        groups_per_sm = groups_per_sm or groups
    if whole_row:
        block_n = max(8, next_power_of_2(n))  # dropout draws its bits 8 columns at a time
        rows_per_tile = max(1, (tile_elems or configs.TILE_ELEMS) // block_n)
        rows_per_tile = min(rows_per_tile, next_power_of_2(rows))  # a few rows: no tile of empty ones
        backward_rows = max(1, (backward_tile_elems or configs.BACKWARD_TILE_ELEMS) // block_n)
        backward_rows = min(backward_rows, next_power_of_2(rows))
    else:
        block_n = min(wide_block or configs.WIDE_BLOCK, next_power_of_2(whole_row_max))
        rows_per_tile = backward_rows = 1
    column_blocks = 1 if whole_row else cdiv(n, block_n)
    row_tiles = max(1, cdiv(rows, rows_per_tile))
    backward_tiles = max(1, cdiv(rows, backward_rows))
    groups_per_sm = groups_per_sm or configs.BACKWARD_GROUPS_PER_SM
    groups = min(backward_tiles, max(1, sms * groups_per_sm // column_blocks))
    finish_rows, finish_cols = finish_tile(n, groups)
    return Plan("tl", whole_row=whole_row, rows_per_tile=rows_per_tile, backward_rows=backward_rows,
                block_n=block_n,
                num_warps=num_warps or configs.num_warps(rows_per_tile * block_n, configs.FORWARD_VALUES_PER_THREAD),
                backward_warps=backward_warps or configs.num_warps(backward_rows * block_n,
                                                                   configs.BACKWARD_VALUES_PER_THREAD),
                column_blocks=column_blocks,
                row_tiles=row_tiles, groups=groups,
                finish=finish or configs.BACKWARD_FINISH, finish_rows=finish_rows, finish_cols=finish_cols)


def finish_tile(n: int, groups: int) -> tuple[int, int]:
    """(BLOCK_G, BLOCK_C) of the finishing kernel (backward.norm_partials_kernel): the columns split over about
    configs.FINISH_PROGRAMS programs (8 to 64 a program: 32-byte float32 runs at least), configs.FINISH_TILE_ELEMS
    partial values a step."""
    block_c = min(64, max(8, next_power_of_2(n) // configs.FINISH_PROGRAMS))
    block_g = min(max(1, configs.FINISH_TILE_ELEMS // block_c), next_power_of_2(groups))
    return block_g, block_c

"""How a rotary call runs: the path and the kernel's tile (every fit check in one place).

* "cpu": CPU tensors without Triton's interpreter: torch operations in float32 (launch._cpu);
* "tl": kernels.rotary_kernel (any CUDA GPU; the CPU through the interpreter).
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore import dispatch
from tilecore.ops.rotary import configs
from tilecore.tiles.launch import cdiv, next_power_of_2


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str  # "cpu" | "tl"
    block_r: int = 1
    block_h: int = 1
    block_pass: int = 1
    num_warps: int = 4
    grid: tuple = ()
    block_t: int = 1  # tokens a tile (of one head), or 1: a tile of heads of one token


def plan(batch: int, seqlen: int, heads: int, head_dim: int, pairs: int, device: torch.device,
         head_major: bool = False) -> Plan:
    """The plan for x of (batch, seqlen, heads, head_dim) with ``pairs`` rotated pairs (rotary_dim / 2);
    ``head_major``: x and the output hold each head's tokens side by side (configs.HEAD_MAJOR_TILES)."""
    if dispatch.backend_for(device) == "reference":
        return Plan("cpu")
    return tl_plan(batch, seqlen, heads, head_dim, pairs, head_major=head_major and configs.HEAD_MAJOR_TILES)


def tl_plan(batch: int, seqlen: int, heads: int, head_dim: int, pairs: int, *, tile_elems: int | None = None,
            num_warps: int | None = None, head_major: bool = False) -> Plan:
    """The kernel's plan (no device asked: report.py and the GPU check use it); the keywords override
    configs.TILE_ELEMS and the warps (for sweeps). A tile holds up to TILE_ELEMS features: heads of a token,
    or (``head_major``) tokens of a head."""
    block_r = next_power_of_2(pairs)
    block_pass = next_power_of_2(max(1, head_dim - 2 * pairs))
    rows = max(1, (tile_elems or configs.TILE_ELEMS) // (2 * block_r))
    if head_major:
        block_t = min(next_power_of_2(seqlen), rows)
        return Plan("tl", block_r=block_r, block_h=1, block_pass=block_pass, block_t=block_t,
                    num_warps=num_warps or configs.num_warps(block_t * 2 * block_r),
                    grid=(batch * cdiv(seqlen, block_t), heads))
    block_h = min(next_power_of_2(heads), rows)
    return Plan("tl", block_r=block_r, block_h=block_h, block_pass=block_pass,
                num_warps=num_warps or configs.num_warps(block_h * 2 * block_r),
                grid=(batch * seqlen, cdiv(heads, block_h)))

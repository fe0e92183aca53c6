"""Rotary's tables (plan.py reads them). Not yet timed on the H100: experiments/rotary/gpu_check.py
measures them (notes/rotary/README.md)."""
from __future__ import annotations

# A program's tile holds at most this many features (heads x 2R): a token of Llama's 32 heads x 128
# is 4096, one tile; more heads split across programs.
TILE_ELEMS = 4096

# warps per tile size (elements): 8-16 values a thread
WARPS = ((1024, 2), (2048, 4), (1 << 62, 8))


# x and out both head-major in memory (each head's tokens side by side: attention's (B, H, N, D) q and k, as
# (B, N, H, D) views): True tiles them BLOCK_T tokens of one head (kernels.py), False as token-major x. True:
# 95.8% of a copy against 94.7% (B16 H16 N4096 D128 bf16, H100; TILE_ELEMS 2048 the same, 8192 94.2%)
HEAD_MAJOR_TILES = True


def num_warps(tile_elems: int) -> int:
    return next(w for limit, w in WARPS if tile_elems <= limit)

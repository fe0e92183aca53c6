"""Rotary's tables (plan.py reads them). Not yet timed on the H100: experiments/rotary/gpu_check.py
measures them (notes/rotary/README.md)."""
from __future__ import annotations

# A program's tile holds at most this many features (heads x 2R): a token of Llama's 32 heads x 128
# is 4096, one tile; more heads split across programs.
TILE_ELEMS = 4096

# warps per tile size (elements): 8-16 values a thread
WARPS = ((1024, 2), (2048, 4), (1 << 62, 8))


def num_warps(tile_elems: int) -> int:
    return next(w for limit, w in WARPS if tile_elems <= limit)

"""The split-key (decode) path's measured configuration: which inputs it serves, its tiles and splits,
which kernel (tl, or Hopper's Gluon kernel gluon_decode.py), one line of why each (the runs:
notes/attention and issue 35). attention's plan reads them through plan.py; nothing here asks about
the device."""
from __future__ import annotations


# Which inputs it serves (plan.decode_fits), against the query-block forward (notes/attention's decode rows):
DECODE_MAX_QUERIES = 16  # up to 16 queries whatever the group: 1.01-10.6x
DECODE_MAX_PACKED_QUERIES = 64  # up to 64 queries where a kv head's packed rows (queries x group) are
DECODE_MAX_PACKED_ROWS = 128  # at most 128: 1.01-6.3x; beyond, it lost at B >= 4 (0.34-0.96x)
DECODE_FEW_TILES_MAX_QUERIES = 512  # up to 512 queries where the query-block forward would have at most
DECODE_FEW_QUERY_TILES = 32  # 32 tiles of 128 rows (a quarter of the SMs): 1.25-5.0x
DECODE_MAX_ROWS = 64  # a tile packs at most this many (query, q head) rows
DECODE_PROGRAMS_PER_SM = 1  # one wave: further splits cost more in the merge than they gain
DECODE_MAX_SPLITS = 64  # the merge loads a row's parts at once
DECODE_MIN_SPLIT_KEYS = 128  # below it a split's fixed cost dominates (1024 keys: 8 splits 5.7 us, 4: 8.1)


def decode_config(d: int, interpret: bool) -> dict:
    """Keys a step (BLOCK_N) and launch options of the split-key kernel for head dim ``d`` (one query
    against 1024-16384 keys, notes/attention)."""
    if interpret:
        return dict(BLOCK_N=16)
    if d <= 64:  # 4 stages: B 64 x 4096 keys 0.98x copy against 3 stages' 0.90x
        return dict(BLOCK_N=128, num_warps=4, num_stages=4)
    if d <= 128:  # 128 keys a step: B 64 x 4096 keys 1.01x copy against 64's 0.93x
        return dict(BLOCK_N=128, num_warps=4, num_stages=3)
    if d <= DECODE_WHOLE_HEAD_DIM:
        return dict(BLOCK_N=64, num_warps=4, num_stages=3)  # 0.89-1.00x copy, against 32 x 2's 0.64-0.92x
    # MLA decode (576 / 512): Q K^T by 64-column chunks, 32 rows x 512 float32 accumulator over 8 warps
    # (64 registers a thread); untimed (issue 35: experiments/attention/gpu_features.py times it)
    return dict(BLOCK_N=32, num_warps=8, num_stages=2)


DECODE_WHOLE_HEAD_DIM = 256  # head dims up to this are held whole; past it (MLA's 576) Q K^T by chunks
DECODE_HEAD_DIM_CHUNK = 64  # the chunk: 576 = 9 x 64
DECODE_MAX_ROWS_LARGE_DV = 32  # rows a tile when v's head dim is past 256 (the accumulator's registers)


# Hopper's Gluon split-key kernel (gluon_decode.py): the head dims it takes (D = Dv, bf16 / fp16), its
# tiles and, per head dim, the rule of which inputs the table gives it.
DECODE_GLUON_HEAD_DIMS = (64, 128)
# a tile's packed rows: 16 by mma.sync where a kv head packs at most 16 (a step's MMA is on the latency chain of
# a small decode: wgmma's 64 rows cost 4x its work there), else 64, one warpgroup's wgmma (config ROWS forces one)
DECODE_GLUON_SMALL_ROWS = 16
DECODE_GLUON_ROWS = 64
DECODE_GLUON = {
    # head dim -> (BLOCK_N, STAGES): within 227 KiB with the float32 epilogue buffer (parts of 64 x D)
    64: dict(BLOCK_N=128, STAGES=4),
    128: dict(BLOCK_N=128, STAGES=3),
}
# The table's rule (decode_gluon_default), D 128, from the bench's shapes on an H200 (notes/attention's decode rows;
# a tie on the H100): where a program takes several tiles (more than one wave), the persistent ring
# streams on across them: short tiles (<= 1024 keys) 1.058 / 1.063 / 1.057x the tl kernel (B64 Nk1K; eager 67 vs
# 71 us a call), long ones 0.984-0.999x (B64 Nk4K / 16K): tl. One wave (B1, B16): 0.997-1.019x, ties, and the
# eager call host-bound at B1 (52 vs 37 us a call): tl. D64: B64 Nk1K 1.017x, B1 Nk4K 0.933x (one run): tl.
DECODE_GLUON_DEFAULT = (128,)  # head dims whose table plan may take the Gluon kernel
DECODE_GLUON_LONG_TILE_KEYS = 1024
DECODE_GLUON_ONE_WAVE = False


def decode_gluon_config(d: int) -> dict:
    """The Gluon split-key kernel's config for head dim ``d`` (DECODE_GLUON_HEAD_DIMS)."""
    return dict(kernel="gluon", **DECODE_GLUON[d])


def decode_gluon_default(d: int, tiles: int, programs: int, tile_keys: int) -> bool:
    """Whether the table plan of head dim ``d`` takes the Gluon kernel (where it fits: plan.gluon_fits) for ``tiles``
    tiles of at most ``tile_keys`` keys on a grid of ``programs`` (one a tile: one wave)."""
    if d not in DECODE_GLUON_DEFAULT:
        return False
    if tiles > programs:
        return tile_keys <= DECODE_GLUON_LONG_TILE_KEYS
    return DECODE_GLUON_ONE_WAVE

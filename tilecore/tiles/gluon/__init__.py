"""Hopper kernels in Gluon: the template (:mod:`.pipeline`), its tile ops (:mod:`.ops`) and stream-K
(:mod:`.stream_k`). docs/tiles.md builds an op on them."""
from tilecore.tiles.gluon.ops import (LOG2E, add_cols, as_column, exp2_scaled, join_n, mask_scores, needs_mask, online_softmax_result,
                                      online_softmax_start, online_softmax_update, opaque_int, row_max, row_sum, scale_cols, scale_rows, split_n,
                                      store_block, store_rows, store_tile, tma_reduce_add, wgmma_layout, wgmma_lhs_layout)
from tilecore.tiles.gluon.pipeline import Consumer, Helper, Layout, TileOperand, field, ring, run, stage_bytes, stage_struct, struct
from tilecore.tiles.gluon.stream_k import add_partials, fix_up, publish_partial

__all__ = ["LOG2E", "Consumer", "Helper", "Layout", "TileOperand", "add_cols", "add_partials", "as_column", "fix_up", "exp2_scaled", "join_n",
           "mask_scores", "needs_mask", "online_softmax_result", "online_softmax_start",
           "online_softmax_update", "field", "opaque_int", "publish_partial", "ring",
           "row_max", "row_sum", "run", "scale_cols", "scale_rows", "split_n", "stage_bytes", "stage_struct", "store_block", "store_rows",
           "store_tile", "struct", "tma_reduce_add", "wgmma_layout", "wgmma_lhs_layout"]


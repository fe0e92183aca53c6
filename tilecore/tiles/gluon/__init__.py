"""Hopper kernels in Gluon: the template (:mod:`.pipeline`), its tile ops (:mod:`.ops`) and stream-K
(:mod:`.stream_k`). docs/tiles.md builds an op on them."""
from tilecore.tiles.gluon.ops import (add_cols, exp2_scaled, join_n, mask_scores, needs_mask, online_softmax_update, opaque_int,
                                      row_max, row_sum, scale_cols, scale_rows, split_n, store_tile, tma_reduce_add, wgmma_layout)
from tilecore.tiles.gluon.pipeline import Consumer, Helper, Layout, TileOperand, field, ring, run, stage_bytes, struct
from tilecore.tiles.gluon.stream_k import add_partials, fix_up, publish_partial

__all__ = ["Consumer", "Helper", "Layout", "TileOperand", "add_cols", "add_partials", "fix_up", "exp2_scaled", "join_n", "mask_scores", "needs_mask",
           "online_softmax_update", "field", "opaque_int", "publish_partial", "ring", "row_max", "row_sum", "run", "scale_cols", "scale_rows", "split_n",
           "stage_bytes", "store_tile", "struct", "tma_reduce_add", "wgmma_layout"]


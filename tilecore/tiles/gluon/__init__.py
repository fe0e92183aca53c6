"""Hopper kernels in Gluon: the template (:mod:`.pipeline`), its tile ops (:mod:`.ops`) and stream-K
(:mod:`.stream_k`). docs/tiles.md builds an op on them."""
from tilecore.tiles.gluon.ops import (exp2_scaled, join_n, mask_scores, needs_mask, online_softmax_update, opaque_int,
                                      row_max, row_sum, split_n, store_tile, tma_reduce_add, wgmma_layout)
from tilecore.tiles.gluon.pipeline import Consumer, Helper, Layout, TileOperand, field, ring, run, stage_bytes, struct
from tilecore.tiles.gluon.stream_k import add_partials, publish_partial

__all__ = ["Consumer", "Helper", "Layout", "TileOperand", "add_partials", "exp2_scaled", "join_n", "mask_scores", "needs_mask",
           "online_softmax_update", "field", "opaque_int", "publish_partial", "ring", "row_max", "row_sum", "run", "split_n",
           "stage_bytes", "store_tile", "struct", "tma_reduce_add", "wgmma_layout"]


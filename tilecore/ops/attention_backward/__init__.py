"""Hopper's Gluon kernels of ``tilecore.attention``'s backward, on the tiles template (no public function of
their own: attention's plan_backward routes to them, its launch.py launches them):

* ``gluon_backward``: dK and dV for a tile of keys (and dQ added by TMA reductions where the plan's dQ mode
  says so: fused, lagged, or a helper warpgroup at D64), AttentionBackward;
* ``gluon_dq``: dQ by a kernel of its own, the forward's tiles with the backward's math, AttentionDQ.

MLA's 192 / 128 pieces of both are in tilecore.ops.attention_mla; the portable tl backward and the
preprocess are attention's kernels_tl.py.
"""

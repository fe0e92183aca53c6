"""Attention (the FlashAttention algorithm): forward, backward, grouped-query heads, causal, decode.

* ``op``: the public function ``attention``, checks, custom ops, autograd;
* ``plan``: which path serves which inputs (plan_forward, plan_backward -> Plan), grids and
  schedules; ``configs``: the measured tables; ``launch``: one launch of a plan for each pass;
* ``kernels_tl``: the portable ``tl`` kernels (query-block forward, the backward's preprocess, dK/dV
  and dQ) and their options;
* ``gluon_kernels``: Hopper's forward on the tiles' Gluon pipeline (TMA, mbarriers, wgmma, warp
  specialization);
* ``reference``: PyTorch references;
* ``tour``: the cases ``tilecore tour`` shows.

Parts in packages of their own, which the plan routes to (issue 30): tilecore.ops.attention_backward
(Hopper's Gluon backward and dQ kernels), attention_mla (MLA 192 / 128's backward by pieces),
attention_decode (the split-key path), attention_cpu (CPU tensors without the interpreter),
attention_rotary (``rotary=(cos, sin)``: Q and K turned inside the kernels); the compile-only report
of every kernel: tilecore.bench.reports.attention.
"""
from tilecore.ops.attention.op import attention
from tilecore.ops.attention.reference import attention_reference

__all__ = ["attention", "attention_reference"]

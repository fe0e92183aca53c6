"""Attention (the FlashAttention algorithm): forward, backward, grouped-query heads, causal, decode.

* ``op``: the public function ``attention``, checks, custom ops, autograd;
* ``plan``: which path serves which inputs (plan_forward, plan_backward -> Plan), grids and
  schedules; ``configs``: the measured tables; ``launch``: one launch of a plan for each pass;
* ``kernels_tl``: the portable ``tl`` kernels (query-block forward, split-key decode and its merge,
  the backward's preprocess, dK/dV and dQ);
* ``gluon_kernels``, ``gluon_backward``, ``gluon_dq``: Hopper's forward, backward and dQ kernels on
  the tiles' Gluon pipeline (TMA, mbarriers, wgmma, warp specialization);
* ``reference``: PyTorch references (and the CPU path when Triton's interpreter is off);
* compile-only resources of every kernel (registers, spills, shared memory, PTX): tilecore.bench.reports.attention;
* ``tour``: the cases ``tilecore tour`` shows.
"""
from tilecore.ops.attention.op import attention
from tilecore.ops.attention.reference import attention_reference

__all__ = ["attention", "attention_reference"]

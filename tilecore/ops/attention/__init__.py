"""Attention (the FlashAttention algorithm): forward, backward, grouped-query heads, causal, decode.

* ``op``: the public function ``attention``, checks, custom ops, autograd;
* ``kernels``: the ``tl`` forward and backward kernels, and every launcher: which path serves which
  inputs (``forward_into``, ``backward_into``), configs and schedules;
* ``steps``: the forward's tile steps, shared by the ``tl`` kernels;
* ``decode``: a few queries a sequence: keys split across programs, merged by lse;
* ``gluon_kernels``, ``gluon_backward``, ``gluon_dq``: Hopper's forward, backward and dQ kernels on
  the tiles' Gluon pipeline (TMA, mbarriers, wgmma, warp specialization);
* ``reference``: PyTorch references (and the CPU path when Triton's interpreter is off);
* ``report``: compile-only resources of every kernel (registers, spills, shared memory, PTX).
"""
from tilecore.ops.attention.op import attention
from tilecore.ops.attention.reference import attention_reference

__all__ = ["attention", "attention_reference", "tour_cases"]


def tour_cases(device):
    from tilecore.ops.attention.tour import tour_cases as cases

    return cases(device)

"""Attention (FlashAttention-2 algorithm in Triton ``tl``): forward, backward, GQA, causal.

* ``op``: the public function ``attention``, checks, custom ops, autograd;
* ``kernels``: the forward, the backward's three kernels, their launch;
* ``reference``: PyTorch references (and the CPU path when Triton's interpreter is off).
"""
from tilecore.ops.attention.op import attention
from tilecore.ops.attention.reference import attention_reference

__all__ = ["attention", "attention_reference", "tour_cases"]


def tour_cases(device):
    from tilecore.ops.attention.tour import tour_cases as cases

    return cases(device)

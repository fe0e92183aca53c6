"""Eager calls of custom ops without the custom op's host time.

A ``torch.library`` custom op with autograd costs ~100 us of host time a call (forward and backward
each), more than a norm or rotary kernel runs; torch.compile needs the op, an eager call does not.
:func:`eager_autograd` builds, from the pieces an op registers with ``register_autograd`` (its
implementation, ``setup_context`` and ``backward``), the ``torch.autograd.Function`` that eager calls
recording a gradient go through (``dispatch.eager_mode`` says "autograd"); :func:`run` picks the
implementation, the Function or the op by that mode. A backward calls :func:`backward_call` for its
own backward op: the implementation where nothing is being traced or recorded, else the op.
"""
from __future__ import annotations

from typing import Callable

import torch

from tilecore import dispatch


def eager_autograd(name: str, impl: Callable, setup_context: Callable, backward: Callable) -> type:
    """The ``torch.autograd.Function`` of a custom op registered as
    ``op.register_autograd(backward, setup_context=setup_context)`` whose implementation is ``impl``.
    Gradients of unused outputs reach ``backward`` as None (no zero tensors made), as its checks expect."""

    def forward(ctx, *args):
        out = impl(*args)
        ctx.set_materialize_grads(False)
        setup_context(ctx, args, out)
        return out

    def backward_(ctx, *grads):
        return backward(ctx, *grads)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward_)})


def run(op, impl: Callable, function: type, *args, tensors=None):
    """``op(*args)``, the same through ``impl`` (nothing to record) or ``function`` (a gradient to
    record) where the call is plain eager; ``tensors``: the arguments that decide (default: every
    tensor among ``args``)."""
    mode = dispatch.eager_mode(*(tensors if tensors is not None else
                                 [a for a in args if isinstance(a, torch.Tensor)]))
    if mode == "direct":
        return impl(*args)
    if mode == "autograd":
        return function.apply(*args)
    return op(*args)


def backward_call(op, impl: Callable, *args):
    """A backward op's call from an autograd backward: ``impl`` where the backward runs eagerly with
    nothing to record (no create_graph), else ``op`` (torch.compile's trace, double backward)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if dispatch.eager_mode(*tensors) == "direct":
        return impl(*args)
    return op(*args)

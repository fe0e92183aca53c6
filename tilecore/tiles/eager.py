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
from tilecore.tiles.launch import signature


def eager_autograd(name: str, impl: Callable, setup_context: Callable, backward: Callable) -> type:
    """The ``torch.autograd.Function`` of a custom op registered as
    ``op.register_autograd(backward, setup_context=setup_context)`` whose implementation is ``impl``.
    Gradients of unused outputs reach ``backward`` as None (no zero tensors made), as its checks expect.
    ``apply(key, *args)``: ``key`` is :func:`run`'s launch key (None: none), handed to ``impl`` as
    ``key=`` and kept as ``ctx.launch_key`` for the backward (a custom op's ctx has none). ``backward``
    sees ``ctx.needs_input_grad`` over the op's inputs, as the custom op's backward does (the key's
    entry left out)."""

    def forward(ctx, key, *args):
        out = impl(*args) if key is None else impl(*args, key=key)
        ctx.set_materialize_grads(False)
        ctx.launch_key = key
        setup_context(ctx, args, out)
        return out

    def backward_(ctx, *grads):
        return (None, *backward(_OpContext(ctx), *grads))

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward_)})


class _OpContext:
    """An eager_autograd Function's ctx as the custom op's backward sees it: every attribute the ctx's,
    but ``needs_input_grad`` without the launch key's entry."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx):
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def __setattr__(self, name, value):
        setattr(self._ctx, name, value)

    @property
    def needs_input_grad(self):
        return self._ctx.needs_input_grad[1:]


def apply(function: type, *args):
    """``function.apply(*args)`` for a call :func:`dispatch.eager_mode` found "autograd" (no functorch transform
    active), without ``torch.autograd.Function.apply``'s Python wrapper: it binds default arguments only for a
    Function with a ``setup_context`` (none here: forward takes ctx) and unwraps dead functorch wrappers, one
    Python call per argument (~5 us of the H100 host's cProfile for linear_attention's 14 arguments); a dead
    wrapper is not a tensor the direct path would unwrap either. Same graph, same backward."""
    return super(torch.autograd.Function, function).apply(*args)


def run(op, impl: Callable, function: type, *args, tensors=None, key=None, mode=None):
    """``op(*args)``, the same through ``impl`` (nothing to record) or ``function`` (a gradient to
    record) where the call is plain eager; ``tensors``: the arguments that decide (default: every
    tensor among ``args``). ``key``: the call's launch key (its signature, tiles.launch.signature, with
    what else its plan reads), handed to ``impl`` as ``key=`` on the eager paths: the implementation's
    plan cache and keyed launches (CachedLaunch.launch_keyed) use it; None: the plain calls."""
    if mode is None:  # (``mode``: the caller's dispatch.eager_mode of the same tensors, where it has it)
        mode = dispatch.eager_mode(*(tensors if tensors is not None else
                                     [a for a in args if isinstance(a, torch.Tensor)]))
    if mode == "direct":
        return impl(*args) if key is None else impl(*args, key=key)
    if mode == "autograd":
        return apply(function, key, *args)
    return op(*args)


def backward_key(ctx, *grads):
    """The launch key of an eager forward's backward (``ctx.launch_key``, :func:`eager_autograd`) with
    what the backward adds, the gradients' layouts (autograd's choice); None without one."""
    key = getattr(ctx, "launch_key", None)
    grads_signature = None if key is None else signature(*grads)
    return None if grads_signature is None else ("backward", key, grads_signature)


def backward_call(op, impl: Callable, *args, key=None):
    """A backward op's call from an autograd backward: ``impl`` where the backward runs eagerly with
    nothing to record (no create_graph), with ``key=`` where a key is given (see :func:`run`), else
    ``op`` (torch.compile's trace, double backward)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if dispatch.eager_mode(*tensors) == "direct":
        return impl(*args) if key is None else impl(*args, key=key)
    return op(*args)

"""Running a variant: an op's module-level switches (its ``configs``) set for a ``with`` block, then restored.

Experiments and probes time a config that does not ship beside the one that does. They do it through
:func:`patched`, never by assigning an op's ``configs`` attributes: the names are checked (a misspelt switch
is an error, not a silent no-op), the old values come back on exit (also on an exception), and a reader sees
the variant's extent. Plans read their switches at call time. A plan memo that keys on :func:`generation`
(or is made by :func:`memo`) never serves a plan made under other switches, so a variant may be timed on the
inputs the shipped config ran on; a memo that does not key on it keeps what a signature was first planned with,
so time a variant on inputs it has not seen there.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
from types import ModuleType

_MISSING = object()
# the current generation, a one-item list (read without a call by the hottest memos); each value is used once
_GENERATION = [0]
_NEXT = itertools.count(1)


def generation() -> int:
    """A number that changes whenever :func:`patched` enters or leaves a block (also on an exception), to a value
    it never had before: a plan memo keys on it beside the call's signature, so a plan made while other switches
    held is never served. Leaving a block moves it too (a plan made before the block is planned again once after
    it): a count that went back would let two blocks share a value."""
    return _GENERATION[0]


def _moved() -> None:
    _GENERATION[0] = next(_NEXT)


@contextlib.contextmanager
def patched(module: ModuleType, **values):
    """Within the block, ``module.NAME = value`` for each keyword (every NAME must exist in ``module``);
    :func:`generation` moves on entering and on leaving it."""
    unknown = sorted(name for name in values if getattr(module, name, _MISSING) is _MISSING)
    if unknown:
        raise AttributeError(f"{module.__name__} has no switch {', '.join(unknown)}")
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        _moved()
        yield module
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        _moved()


def memo(maxsize: int | None):
    """``functools.lru_cache(maxsize)`` for a plan function of its (hashable) arguments and of switches that
    :func:`patched` sets: keyed on the arguments and :func:`generation`, so a call inside or after a patched
    block is planned under the switches that hold then. ``cache_clear`` and ``cache_info`` as lru_cache's."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize)(lambda _generation, *args, **kwargs: fn(*args, **kwargs))

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return cached(_GENERATION[0], *args, **kwargs)

        call.cache_clear, call.cache_info = cached.cache_clear, cached.cache_info
        return call
    return wrap

"""Running a variant: an op's module-level switches (its ``configs``) set for a ``with`` block, then restored.

Experiments and probes time a config that does not ship beside the one that does. They do it through
:func:`patched`, never by assigning an op's ``configs`` attributes: the names are checked (a misspelt switch
is an error, not a silent no-op), the old values come back on exit (also on an exception), and a reader sees
the variant's extent. Plans read their switches at call time; a plan already cached for a signature (a kept
launch, a memoized recipe) keeps what it was planned with, so time a variant on inputs it has not seen.
"""
from __future__ import annotations

import contextlib
from types import ModuleType

_MISSING = object()


@contextlib.contextmanager
def patched(module: ModuleType, **values):
    """Within the block, ``module.NAME = value`` for each keyword (every NAME must exist in ``module``)."""
    unknown = sorted(name for name in values if getattr(module, name, _MISSING) is _MISSING)
    if unknown:
        raise AttributeError(f"{module.__name__} has no switch {', '.join(unknown)}")
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield module
    finally:
        for name, value in saved.items():
            setattr(module, name, value)

"""What a plan times its candidate configs with (issue 36 part 4: configs from the napkin's top-k, timed).

An op's plan module ranks candidate configs (pure Python, the same list everywhere) and, where a real
GPU can time them, runs each and keeps the fastest, once a shape bucket. Running a candidate needs
the op's launch module, which imports the plan: the plan cannot import it back (no import loops,
tests/tiles/test_layers.py). So the launch module registers its runner here by name when it is
imported (``register``) and the plan asks for it (``runner``); until one is registered the plan
plans its measured table's row, exactly as with the switch off. Every public entry point imports
its op's launch module before it plans (``op.py`` imports ``launch.py``; ``import tilecore``
registers every op: OP_MODULES), so only a caller that imports a plan module alone sees the table.

Nothing here imports tilecore.ops (tiles are what ops are written with).
"""
from __future__ import annotations

import sys
from typing import Callable

# kept on the tiles package, not in this module's globals: where this module is the first tilecore import
# of a process that has not imported torch, tilecore/__init__ registers the ops (which import this module)
# inside that import, and the import then runs this module a second time; the registrations must survive it
_RUNNERS: dict[str, Callable] = vars(sys.modules["tilecore.tiles"]).setdefault("_timed_runners", {})


def register(name: str, runner: Callable) -> None:
    """Register ``runner`` as what the plan named ``name`` ("gemm", "attention.forward") times its
    candidates with (its signature is the plan's to define)."""
    _RUNNERS[name] = runner


def runner(name: str) -> Callable | None:
    """The runner registered for ``name``, or None (the plan then keeps its table's row)."""
    return _RUNNERS.get(name)


def fastest(times: list[float]) -> int | None:
    """The position of the smallest finite time, the first of equals; None where none is finite (every
    candidate failed: the plan keeps its table's row)."""
    finite = [(t, i) for i, t in enumerate(times) if t < float("inf")]
    return min(finite)[1] if finite else None

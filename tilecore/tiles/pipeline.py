"""The tiles template, ``tl`` twin: the Gluon template's contract (:mod:`tilecore.tiles.gluon.pipeline`)
in plain Triton, so that the interpreter runs an op and any GPU compiles it.

An op is an aggregate of its globals (pointers, sizes, compile-time options) whose ``@triton.jit``
methods are the callbacks, with the Gluon template's names, arguments and order where the two can
agree:

  ==================================  =====================================================================
  ``setup(tile_id) -> (tile, steps)``  a tile's coordinates (any value, an aggregate of the op's) and steps
  ``load(tile, step) -> stage``        step ``step``'s inputs in registers (masked loads), as the op's
                                       stage aggregate (Gluon: ``load(stage, bar, tile, step)`` fills a
                                       ring slot by TMA)
  ``start(ctx, tile, prev) -> state``  a tile's state (``prev`` is None: nothing is carried here)
  ``compute(ctx, state, stage, tile, step) -> state``  one step
  ``wait(ctx, state) -> state``        the tile's steps are done (here nothing is asynchronous: most ops
                                       return the state as it is)
  ``finish(ctx, state, tile)``         the epilogue: the op stores its results
  ==================================  =====================================================================

``ctx`` is a ``Consumer`` whose ``index`` is 0: one consumer takes the whole tile. ``Layout`` keeps
what changes which tiles run and in what order: ``STAGES`` (software pipelining of the step loop,
``tl.range(num_stages=)``, where the Gluon template has a ring of shared-memory stages), ``schedule``
(a ``schedule.balanced_schedule`` table: program p runs its share) and ``tile_counter`` (drawn tiles:
programs draw from a global counter until one draws past the last, and the launch's last draw resets
it, as the Gluon producer does; the interpreter runs programs one after another, so program 0 draws
every tile there). The Gluon layout's other parts say where and when data moves, not what is
computed, and have no counterpart: several consumers (``CONSUMERS``), a per-tile operand loaded by
the producer (``tile_operand``, ``load_tile``: an op here loads it in ``start``), ``LATE_RELEASE``,
``LOOKAHEAD`` and ``CARRY`` (with it ``initial``), and the epilogue buffer (``Layout.out``,
``ctx.out``: ``finish`` stores from registers).

Aggregates in the interpreter (triton 3.6, probed): ``triton.language.core._aggregate`` builds the
class and checks its fields, but attaches only the methods that are ``JITCallable``; under
TRITON_INTERPRET=1 ``@triton.jit`` makes ``InterpretedFunction`` objects instead, which it drops
(``op.setup`` is an AttributeError), and which are no descriptors (read from an instance they would
not bind to it). ``aggregate`` below is ``_aggregate`` that also attaches those, bound to the
instance; compiled, it is ``_aggregate`` unchanged. ``struct`` writes an aggregate's constructor
from its annotations. ``field`` keeps a value as it is in the interpreter,
where there are no constants to wrap and where a ``constexpr(None)`` would fail ``x is None``
(plain Python there), so an op tests its optional members with ``is None`` in both languages.
"""
import functools

import triton
import triton.language as tl
from triton.language.core import _aggregate, base_value
from triton.runtime.interpreter import InterpretedFunction

from tilecore import dispatch
from tilecore.tiles.schedule import next_tile, program_tiles, scheduled_tile


class _Method:
    """An interpreted ``@triton.jit`` function as a method of an aggregate."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, cls=None):
        return self.fn if obj is None else functools.partial(self.fn, obj)


def aggregate(cls):
    """``triton.language.core._aggregate``, whose ``@triton.jit`` methods the interpreter finds too."""
    value = _aggregate(cls)
    for name, member in vars(cls).items():
        if isinstance(member, InterpretedFunction):
            setattr(value, name, _Method(member))
    return value


def _constant_or_value(x):
    return x if isinstance(x, base_value) else tl.constexpr(x)


def _as_is(x):
    return x


# An aggregate field (annotated ``object``) that may be a run-time value or a constant (an int the JIT
# specialized, a literal, None for an absent part). Chosen here: a constexpr function may call no
# other Python function, and the interpreter needs no constants (nor a constexpr(None), which
# ``is None`` would not see).
field = triton.constexpr_function(_as_is if dispatch.interpreter_enabled() else _constant_or_value)


def struct(cls):
    """A named struct: ``aggregate`` with the constructor written from the annotations (positional, in
    order). Fields annotated ``tl.constexpr`` are compile-time values; fields annotated ``object``
    take run-time values or constants (``field``). Methods are ``@triton.jit`` functions. Annotations
    must be real types: a module that defines structs must not use ``from __future__ import
    annotations``."""
    names = list(cls.__annotations__)
    constant = {name: kind is tl.constexpr for name, kind in cls.__annotations__.items()}

    def __init__(self, *values):
        if len(values) != len(names):
            raise TypeError(f"{cls.__name__} takes {len(names)} fields ({', '.join(names)}), got {len(values)}")
        for name, value in zip(names, values):
            setattr(self, name, tl.constexpr(value) if constant[name] else field(value))

    __init__.__qualname__ = f"{cls.__name__}.__init__"
    cls.__init__ = triton.constexpr_function(__init__)
    return aggregate(cls)


@aggregate
class Layout:
    """How the template runs an op: ``STAGES`` of software pipelining; ``schedule``: an int32
    ``schedule.balanced_schedule`` table for exactly this grid, or None (program p takes tiles p,
    p + P, ...); ``tile_counter``: an int32 in global memory, zero at launch and left so, from which
    programs draw their tiles, or None."""
    STAGES: tl.constexpr
    schedule: object
    tile_counter: object

    @triton.constexpr_function
    def __init__(self, STAGES=1, schedule=None, tile_counter=None):
        self.STAGES = tl.constexpr(STAGES)
        self.schedule = field(schedule)
        self.tile_counter = field(tile_counter)


@aggregate
class Consumer:
    """The consumer's view: its ``index`` (0, the only one)."""
    index: tl.constexpr

    @triton.constexpr_function
    def __init__(self, index):
        self.index = tl.constexpr(index)


@triton.jit
def run(op, layout, num_tiles):
    """Run ``op`` on the template over ``num_tiles`` tiles: this program's tiles (round-robin, the
    schedule table's share, or drawn), each set up, loaded and computed step by step, finished."""
    ctx = Consumer(0)
    if layout.tile_counter is not None:
        counter = layout.tile_counter
        tile_id = tl.atomic_add(counter, 1, sem="relaxed")
        while tile_id < num_tiles:
            next_id = tl.atomic_add(counter, 1, sem="relaxed")  # drawn early: its latency hides
            _one_tile(op, layout, ctx, tile_id)
            tile_id = next_id
        # one draw a program lands past the tiles; the last of them (num_tiles + P - 1) ends the launch
        if tile_id == num_tiles + tl.num_programs(0) - 1:
            tl.atomic_xchg(counter, 0, sem="relaxed")
    else:
        SCHEDULED: tl.constexpr = layout.schedule is not None
        first, end, step = program_tiles(num_tiles, layout.schedule, SCHEDULED)
        next_id = scheduled_tile(first, layout.schedule, SCHEDULED)
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, layout.schedule, SCHEDULED)
            _one_tile(op, layout, ctx, tile_id)


@triton.jit
def _one_tile(op, layout, ctx, tile_id):
    tile, steps = op.setup(tile_id)
    state = op.start(ctx, tile, None)
    for step in tl.range(0, steps, num_stages=layout.STAGES):
        state = op.compute(ctx, state, op.load(tile, step), tile, step)
    state = op.wait(ctx, state)
    op.finish(ctx, state, tile)

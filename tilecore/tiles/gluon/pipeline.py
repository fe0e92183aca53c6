"""The tiles template for Hopper, in Gluon: an op is a layout and a few callbacks.

ThunderKittens' load-compute-store-finish contract (its LCSF template) in Python. The template owns
what every kernel of this shape repeats: a ring of shared-memory stages filled by TMA and completed on
mbarriers, a 1-warp producer and consumer warpgroups (warp specialization), the ring's phases,
per-tile operands and their buffers, a persistent grid walking tiles in the order of
:mod:`tilecore.tiles.schedule` (or drawn from a counter), and the epilogue buffers. An op supplies:

* ``Layout`` (below): ring depth, consumers and their registers, and the optional parts as optional
  members: a per-tile operand (``tile_operand``), a schedule table, a tile counter.
* A stage: an aggregate of its own with one named shared-memory ring per buffer (any number, any
  shapes, TMA-loaded) and ``index(s) -> stage s``; ``ring(desc, STAGES)`` allocates one buffer's ring.
* The op itself: an aggregate of its globals (descriptors, sizes, compile-time options) whose methods
  are the callbacks, each taking the same arguments in the same order:

  ==================================  =====================================================================
  ``setup(tile_id) -> (tile, steps)``  producer and consumers: a tile's coordinates and its ring steps
  ``load(stage, bar, tile, step)``     producer: issue step ``step``'s TMA copies into ``stage`` on ``bar``
                                       (the template has set the barrier's byte count)
  ``load_tile(bufs, bar, tile, c)``    producer, with a tile operand: consumer c's buffer (shared: all)
  ``start(ctx, tile, prev) -> state``  consumer: a tile's state (``prev``: the previous tile's, carried,
                                       else None)
  ``compute(ctx, state, stage, tile, step) -> state``  consumer: one step
  ``wait(ctx, state) -> state``        consumer: the tile's asynchronous work is done
  ``finish(ctx, state, tile)``         consumer: the epilogue (not with ``CARRY``)
  ``initial(ctx) -> state``            consumer, with ``CARRY``: the state before a program's first tile
  ``help(ctx, tile, step)``            the helper partition, with ``Layout.helper``: one step's work
  ``side_steps(item) -> steps``        with ``Layout.SIDE_ITEMS``: a side item's ring steps (producer and
                                       consumers)
  ``side_load(stage, bar, item, step)``  producer: a side item's step (as ``load``)
  ``side(ctx, stage, item, step)``     consumer: a side item's step, done with the stage when it returns
  ``side_done(ctx, item)``             consumer: after a side item's last step
  ==================================  =====================================================================

  ``ctx`` is the partition's ``Consumer``: its index (a constexpr), its epilogue buffer, this tile's
  operand buffer, and in ``compute``/``help`` the ring step. Results are stored by the op (``ops.store_tile`` and friends): before writing
  ``ctx.out`` wait for the previous tile's TMA store (``tma.store_wait``), so that store overlaps
  this tile's main loop.

Stages are released as consumers finish with them: after ``compute`` (``LATE_RELEASE=0``) or one
step later, when ``compute`` returns with its wgmma group still reading the stage (``LATE_RELEASE=1``).
With ``CARRY`` a consumer's pipeline runs on across tiles: a tile's first step may finish the previous
tile's work (the attention forward issues the next tile's first S with the last P V and stores the
finished tile under it), ``finish`` is not called, and after a program's last tile one more step,
``step = steps`` of that tile, is loaded and computed; ``load`` then also receives the previous tile
(a program's first tile is its own previous).

Side items (``Layout.SIDE_ITEMS``): a schedule table may also hold ids from ``num_tiles`` up, work of
another kind that uses the ring without a tile operand or a tile's state (the rotary forward's K
turned into a buffer its tiles then read). Program by program, in the table's order, the producer
loads an item's steps (``side_load``) and the consumers run them (``side``, ``side_done``); the tile
operand's buffers and phases count tiles alone. Ordering between items is the op's (a table whose
every item depends only on items earlier in one global order, each program's run in that order,
never deadlocks while every program is resident).
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import aggregate, base_value, builtin, gl, mbarrier, tma
from tilecore.tiles.schedule import next_tile, program_tiles, scheduled_tile

TILE_ID_SLOTS = gl.constexpr(4)  # drawn tiles: ids the producer may hand out ahead of the consumers


@gluon.constexpr_function
def field(x):
    """An aggregate field (annotated ``object``) that may be a run-time value or a constant: an int the
    JIT specialized (an argument equal to 1 arrives as a constexpr, which a constexpr function sees as
    a plain int), or None for an absent part (``x is None`` is then decided at compile time)."""
    return x if isinstance(x, base_value) else gl.constexpr(x)


def struct(cls):
    """A named struct for Gluon kernels: ``triton.language.core._aggregate`` with the constructor
    written from the annotations (positional, in order). Fields annotated ``gl.constexpr`` are
    compile-time values; fields annotated ``object`` take run-time values or constants (``field``).
    ``x.replace(name=value, ...)`` is a copy with those fields replaced (Gluon has no attribute
    assignment; the copy emits nothing). Methods decorated ``@gluon.jit`` are the struct's;
    annotations must be real types, so a module that defines structs must not use
    ``from __future__ import annotations``."""
    names = list(cls.__annotations__)
    constant = {name: kind is gl.constexpr for name, kind in cls.__annotations__.items()}

    def __init__(self, *values):
        if len(values) != len(names):
            raise TypeError(f"{cls.__name__} takes {len(names)} fields ({', '.join(names)}), got {len(values)}")
        for name, value in zip(names, values):
            setattr(self, name, gl.constexpr(value) if constant[name] else field(value))

    @builtin
    def replace(self, _semantic=None, **changes):
        unknown = set(changes) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))} (fields: {', '.join(names)})")
        return type(self)(*[changes.get(name, getattr(self, name)) for name in names], _semantic=_semantic)

    __init__.__qualname__ = f"{cls.__name__}.__init__"
    cls.__init__ = gluon.constexpr_function(__init__)
    cls.replace = replace
    return aggregate(cls)


def stage_struct(cls):
    """A stage of the ring: a ``struct`` whose fields are the stage's named buffers, each a ring of
    shared-memory buffers (``ring``), with ``index(s)``: the stage of ring slot s (every field's
    buffer s) written for it."""
    names = list(cls.__annotations__)

    @builtin
    def index(self, s, _semantic=None):
        return type(self)(*[getattr(self, name).index(s, _semantic=_semantic) for name in names], _semantic=_semantic)

    cls.index = index
    return struct(cls)


@aggregate
class TileOperand:
    """A per-tile operand: loaded by the producer at the start of a tile (``load_tile``), held by the
    consumers through every step of it (the attention forward's Q block, the backward's K and V).

    ``desc``: its block's descriptor (shape, dtype, swizzle). ``COUNT`` buffers of that block per
    load. ``BUFFERS`` per consumer, used in turn (2: the next tile's operand loads while this tile
    runs); ``LAST_BUFFERS`` (0: BUFFERS) the last consumer's, where only it can have more (FP8
    attention's causal tiles: the last consumer's rows have the most keys, and shared memory holds one
    spare buffer); the producer then loads its buffer first. ``SHARED``: one set of ``COUNT`` buffers read by every consumer. ``RESIDENT``
    (shared): a constant of the kernel (the Hadamard transform's H_64), loaded once per program and
    kept."""
    desc: object
    COUNT: gl.constexpr
    BUFFERS: gl.constexpr
    LAST_BUFFERS: gl.constexpr
    SHARED: gl.constexpr
    RESIDENT: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, desc, COUNT=1, BUFFERS=1, SHARED=False, RESIDENT=False, LAST_BUFFERS=0):
        self.desc = desc
        self.COUNT = gl.constexpr(COUNT)
        self.BUFFERS = gl.constexpr(BUFFERS)
        self.LAST_BUFFERS = gl.constexpr(LAST_BUFFERS or BUFFERS)
        self.SHARED = gl.constexpr(SHARED or RESIDENT)
        self.RESIDENT = gl.constexpr(RESIDENT)


@aggregate
class Layout:
    """How the template runs an op. ``out``: the descriptor of a consumer's epilogue buffer (its block:
    one consumer's share of a tile, or a slice of it: ``ops.store_tile``). ``tile_operand``: a
    ``TileOperand`` or None. ``schedule``: an int32 table of ``schedule.balanced_schedule`` for exactly
    this grid (which then gives each program its tiles), or None: program p takes tiles p, p + P, ...
    ``tile_counter``: an int32 in global memory, zero at launch: programs draw their tiles from it as
    they get to them (and leave it zero), or None. ``LOOKAHEAD`` (below ``STAGES``; 0: the ring's
    depth): after its first lap the producer loads a step only once the step ``LOOKAHEAD`` before it is
    released, so a deep ring fills at a program's start and runs ``LOOKAHEAD`` deep after.
    ``helper``: a ``Helper`` partition, or None. ``SIDE_ITEMS``: the schedule table also holds side items
    (ids from the tile count up; the module docstring)."""
    out: object
    STAGES: gl.constexpr
    CONSUMERS: gl.constexpr
    CONSUMER_REGS: gl.constexpr
    PRODUCER_REGS: gl.constexpr
    LATE_RELEASE: gl.constexpr
    CARRY: gl.constexpr
    LOOKAHEAD: gl.constexpr
    tile_operand: object
    schedule: object
    tile_counter: object
    helper: object
    SIDE_ITEMS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, out, STAGES, CONSUMERS=1, CONSUMER_REGS=232, PRODUCER_REGS=40, LATE_RELEASE=1,
                 CARRY=False, LOOKAHEAD=0, tile_operand=None, schedule=None, tile_counter=None, helper=None,
                 SIDE_ITEMS=False):
        self.out = out
        self.STAGES = gl.constexpr(STAGES)
        self.CONSUMERS = gl.constexpr(CONSUMERS)
        self.CONSUMER_REGS = gl.constexpr(CONSUMER_REGS)
        self.PRODUCER_REGS = gl.constexpr(PRODUCER_REGS)
        self.LATE_RELEASE = gl.constexpr(LATE_RELEASE if STAGES > 1 else 0)
        self.CARRY = gl.constexpr(CARRY)
        self.LOOKAHEAD = gl.constexpr(LOOKAHEAD)
        self.tile_operand = field(tile_operand)
        self.schedule = field(schedule)
        self.tile_counter = field(tile_counter)
        self.helper = field(helper)
        self.SIDE_ITEMS = gl.constexpr(SIDE_ITEMS)


@aggregate
class Consumer:
    """A partition's view: ``index`` (consumers 0 .. CONSUMERS - 1; the helper CONSUMERS), ``out``
    (a consumer's epilogue buffer; the helper has none), ``operand`` (this tile's operand buffer;
    with a shared operand all of its buffers; else None) and, in ``compute`` and ``help``,
    ``ring_step``: the step's index in the program's ring (every step of every tile so far), for an
    op that keeps barriers of its own in step with the ring."""
    index: gl.constexpr
    out: object
    operand: object
    ring_step: object

    @gluon.constexpr_function
    def __init__(self, index, out, operand, ring_step=0):
        self.index = gl.constexpr(index)
        self.out = field(out)
        self.operand = field(operand)
        self.ring_step = field(ring_step)

    @gluon.jit
    def at(self, ring_step):
        return Consumer(self.index, self.out, self.operand, ring_step)

    @gluon.jit
    def own(self, first, second):
        """This consumer's of a pair of buffers that two consumers split (a stage's two units): ``first`` for
        consumer 0, ``second`` for the others (a constant choice: no code)."""
        if self.index == 0:
            x = first
        else:
            x = second
        return x


@aggregate
class Helper:
    """A partition beside the consumers (a warpgroup of ``WARPS`` warps, ``REGS`` registers a thread)
    that works through every step of the program's tiles, taking its work from the consumers through
    barriers of the op's own (the attention backward's dQ = dS K from the dS the consumers write):
    the op's ``help(ctx, tile, step)``. It holds a shared tile operand like a consumer does."""
    WARPS: gl.constexpr
    REGS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, WARPS=4, REGS=88):
        self.WARPS = gl.constexpr(WARPS)
        self.REGS = gl.constexpr(REGS)


@gluon.jit
def ring(desc, STAGES: gl.constexpr):
    """A ring of ``STAGES`` buffers of a TMA descriptor's block (one named buffer of a stage)."""
    return gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)


@gluon.constexpr_function
def stage_bytes(stage):
    """The bytes of one stage of a stage ring (every field: a ring of buffers)."""
    total = 0
    for value in vars(stage).values():
        if isinstance(value, gl.shared_memory_descriptor):
            n = 1
            for d in value.type.shape[1:]:
                n *= d
            total += n * value.dtype.primitive_bitwidth // 8
    return total


@aggregate
class _Pipeline:
    """What every partition shares at run time: the ring and its barriers, the tile operand's
    buffers and barriers, the drawn tiles' slots, the tile count."""
    stages: object
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    tile_bufs: object
    tile_ready: gl.shared_memory_descriptor
    tile_empty: gl.shared_memory_descriptor
    ids: object
    id_ready: object
    id_free: object
    num_tiles: gl.tensor

    @gluon.constexpr_function
    def __init__(self, stages, ready, empty, tile_bufs, tile_ready, tile_empty, ids, id_ready, id_free, num_tiles):
        self.stages = stages
        self.ready = ready
        self.empty = empty
        self.tile_bufs = field(tile_bufs)
        self.tile_ready = tile_ready
        self.tile_empty = tile_empty
        self.ids = field(ids)
        self.id_ready = field(id_ready)
        self.id_free = field(id_free)
        self.num_tiles = num_tiles


@gluon.constexpr_function
def _buffers(operand, consumer, consumers):
    """A per-consumer tile operand's buffers for ``consumer`` (BUFFERS; the last consumer's LAST_BUFFERS)."""
    return operand.LAST_BUFFERS if consumer == consumers - 1 else operand.BUFFERS


@gluon.constexpr_function
def _first_slot(operand, consumer, consumers):
    """The first of ``consumer``'s buffers: the consumers' buffers one after another (_buffers each)."""
    return sum(_buffers(operand, c, consumers) for c in range(consumer))


@gluon.constexpr_function
def _load_order(operand, i, consumers):
    """The producer's i-th tile operand load: with LAST_BUFFERS above BUFFERS the last consumer's first (its next
    buffer is free while this tile runs), then the others in order; else in order."""
    return (i + consumers - 1) % consumers if operand.LAST_BUFFERS > operand.BUFFERS else i


@gluon.jit
def _tile_slot(layout, consumer: gl.constexpr, t):
    """The tile operand's buffer (and barrier pair) for a program's t-th tile: consumer c's buffers are
    _first_slot(c) .. + its buffers - 1 (_buffers), used in turn; a shared operand has one set."""
    if layout.tile_operand.SHARED:
        return 0
    else:
        return _first_slot(layout.tile_operand, consumer, layout.CONSUMERS) + t % _buffers(
            layout.tile_operand, consumer, layout.CONSUMERS)


@gluon.jit
def _publish_tile(p, t, tile_id):
    """Drawn tiles: the producer hands the program's t-th tile id to the consumers (a ring of slots
    in shared memory, each with a barrier pair: written; read by every consumer)."""
    slot = t % TILE_ID_SLOTS
    mbarrier.wait(p.id_free.index(slot), ((t // TILE_ID_SLOTS) & 1) ^ 1)
    ids_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    p.ids.index(slot).store(gl.full([1], tile_id, gl.int32, ids_layout))
    mbarrier.arrive(p.id_ready.index(slot))  # releases the store above (the arriving thread made it too)


@gluon.jit
def _receive_tile(p, t):
    """Drawn tiles: a consumer's t-th tile id (num_tiles or more: no tile left)."""
    slot = t % TILE_ID_SLOTS
    mbarrier.wait(p.id_ready.index(slot), (t // TILE_ID_SLOTS) & 1)
    ids_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    tile_id = gl.max(p.ids.index(slot).load(ids_layout), axis=0)
    gl.thread_barrier()  # every warp of the partition has read the slot before it is released
    mbarrier.arrive(p.id_free.index(slot))
    return tile_id


@gluon.jit
def _producer(op, layout, p, STAGE_BYTES: gl.constexpr):
    """The TMA producer's loop over the program's tiles."""
    i = 0
    t = 0
    if layout.tile_counter is not None:
        tile_id = gl.atomic_add(layout.tile_counter, 1, sem="relaxed", scope="gpu")
        while tile_id < p.num_tiles:
            # the next draw is issued now; its latency runs under this tile's loads
            next_id = gl.atomic_add(layout.tile_counter, 1, sem="relaxed", scope="gpu")
            _publish_tile(p, t, tile_id)
            i, tile, steps = _produce_tile(op, layout, p, STAGE_BYTES, tile_id, i, t, 0)
            t += 1
            tile_id = next_id
        _publish_tile(p, t, p.num_tiles)  # the consumers' signal to stop
        # every program draws exactly one ticket past the tiles, so the draw of num_tiles + P - 1 is
        # the launch's last: its program leaves the counter at zero for the next launch
        if tile_id == p.num_tiles + gl.num_programs(0) - 1:
            gl.atomic_xchg(layout.tile_counter, 0, sem="relaxed", scope="gpu")
    else:
        SCHEDULED: gl.constexpr = layout.schedule is not None
        first, end, step = program_tiles(p.num_tiles, layout.schedule, SCHEDULED)
        next_id = scheduled_tile(first, layout.schedule, SCHEDULED)
        if layout.CARRY:  # the tile before a program's first is itself (what load takes from it goes unused)
            prev, last_steps = op.setup(next_id)
        else:
            prev = 0
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, layout.schedule, SCHEDULED)
            if layout.SIDE_ITEMS:
                if tile_id >= p.num_tiles:
                    i = _produce_side(op, layout, p, STAGE_BYTES, tile_id - p.num_tiles, i)
                else:
                    i = _produce_tile(op, layout, p, STAGE_BYTES, tile_id, i, t, prev)[0]
                    t += 1
            else:
                i, tile, steps = _produce_tile(op, layout, p, STAGE_BYTES, tile_id, i, t, prev)
                if layout.CARRY:
                    prev = tile
                    last_steps = steps
                t += 1
        if layout.CARRY:  # the tail step: step `steps` of the program's last tile
            if t > 0:
                s = i % layout.STAGES
                mbarrier.wait(p.empty.index(s), ((i // layout.STAGES) & 1) ^ 1)
                mbarrier.expect(p.ready.index(s), STAGE_BYTES)
                op.load(p.stages.index(s), p.ready.index(s), prev, last_steps, prev)


@gluon.jit
def _produce_tile(op, layout, p, STAGE_BYTES: gl.constexpr, tile_id, i, t, prev):
    """The producer's loads of one tile (the program's t-th; its first ring step is i): the tile
    operand, then every step's stage. Returns (the next ring step, the tile, its steps)."""
    tile, steps = op.setup(tile_id)
    operand = layout.tile_operand
    if operand is not None:
        OPERAND_BYTES: gl.constexpr = operand.COUNT * operand.desc.block_type.nbytes
        if operand.RESIDENT:  # a constant: loaded with the first tile, kept for all
            if t == 0:
                mbarrier.expect(p.tile_ready.index(0), OPERAND_BYTES)
                op.load_tile(p.tile_bufs, p.tile_ready.index(0), tile, 0)
        elif operand.SHARED:  # once every consumer has let go of the last tile's
            mbarrier.wait(p.tile_empty.index(0), (t & 1) ^ 1)
            mbarrier.expect(p.tile_ready.index(0), OPERAND_BYTES)
            op.load_tile(p.tile_bufs, p.tile_ready.index(0), tile, 0)
        else:  # each consumer's own, once its buffer is free again
            for order in gl.static_range(layout.CONSUMERS):
                slot = _tile_slot(layout, _load_order(operand, order, layout.CONSUMERS), t)
                mbarrier.wait(p.tile_empty.index(slot), ((t // _buffers(operand, _load_order(
                    operand, order, layout.CONSUMERS), layout.CONSUMERS)) & 1) ^ 1)
                mbarrier.expect(p.tile_ready.index(slot), OPERAND_BYTES)
                op.load_tile(p.tile_bufs.index(slot), p.tile_ready.index(slot), tile,
                             _load_order(operand, order, layout.CONSUMERS))
    for kk in range(steps):
        s = i % layout.STAGES
        if layout.LOOKAHEAD > 0 and i >= layout.STAGES:
            # step i - LOOKAHEAD released (consumers release in order, so step i - STAGES, this
            # stage's last use, was released before it)
            j = i - layout.LOOKAHEAD
            mbarrier.wait(p.empty.index(j % layout.STAGES), (j // layout.STAGES) & 1)
        else:
            # a fresh barrier counts as having completed the phase before phase 0: the first lap
            # through the ring waits on parity 1 and passes at once
            mbarrier.wait(p.empty.index(s), ((i // layout.STAGES) & 1) ^ 1)
        mbarrier.expect(p.ready.index(s), STAGE_BYTES)
        if layout.CARRY:
            op.load(p.stages.index(s), p.ready.index(s), tile, kk, prev)
        else:
            op.load(p.stages.index(s), p.ready.index(s), tile, kk)
        i += 1
    return i, tile, steps


@gluon.jit
def _produce_side(op, layout, p, STAGE_BYTES: gl.constexpr, item, i):
    """The producer's loads of side item ``item`` (its first ring step is i). Returns the next ring step."""
    for kk in range(op.side_steps(item)):
        s = i % layout.STAGES
        mbarrier.wait(p.empty.index(s), ((i // layout.STAGES) & 1) ^ 1)
        mbarrier.expect(p.ready.index(s), STAGE_BYTES)
        op.side_load(p.stages.index(s), p.ready.index(s), item, kk)
        i += 1
    return i


@gluon.jit
def _side_item(op, layout, p, CID: gl.constexpr, out, item, i):
    """Consumer CID's work on side item ``item`` (its first ring step is i): each step, the stage released
    once ``side`` returns; then ``side_done``. Returns the next ring step."""
    ctx = Consumer(CID, out, None)
    for kk in range(op.side_steps(item)):
        s = i % layout.STAGES
        mbarrier.wait(p.ready.index(s), (i // layout.STAGES) & 1)
        op.side(ctx.at(i), p.stages.index(s), item, kk)
        mbarrier.arrive(p.empty.index(s))
        i += 1
    op.side_done(ctx, item)
    return i


@gluon.jit
def _consumer(op, layout, p, CID: gl.constexpr, out):
    """Consumer CID's loop over the program's tiles."""
    i = 0
    t = 0
    if layout.tile_counter is not None:
        tile_id = _receive_tile(p, t)
        while tile_id < p.num_tiles:
            _, i, _ = _consume_tile(op, layout, p, CID, out, tile_id, i, t, None, 0)
            t += 1
            tile_id = _receive_tile(p, t)
    else:
        SCHEDULED: gl.constexpr = layout.schedule is not None
        if layout.CARRY:
            state = op.initial(_context(layout, p, CID, out, 0))
            last_steps = gl.program_id(0) * 0
        first, end, step = program_tiles(p.num_tiles, layout.schedule, SCHEDULED)
        next_id = scheduled_tile(first, layout.schedule, SCHEDULED)
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, layout.schedule, SCHEDULED)
            if layout.SIDE_ITEMS:
                if tile_id >= p.num_tiles:
                    i = _side_item(op, layout, p, CID, out, tile_id - p.num_tiles, i)
                else:
                    i = _consume_tile(op, layout, p, CID, out, tile_id, i, t, None, 0)[1]
                    t += 1
            elif layout.CARRY:
                state, i, last_steps = _consume_tile(op, layout, p, CID, out, tile_id, i, t, state, last_steps)
                t += 1
            else:
                _, i, _ = _consume_tile(op, layout, p, CID, out, tile_id, i, t, None, 0)
                t += 1
        if layout.CARRY:  # the tail step: step `steps` of the program's last tile, which finishes it
            if t > 0:
                s = i % layout.STAGES
                mbarrier.wait(p.ready.index(s), (i // layout.STAGES) & 1)
                ctx = _context(layout, p, CID, out, 0)
                state = op.compute(ctx.at(i), state, p.stages.index(s), 0, last_steps)
                state = op.wait(ctx, state)
    tma.store_wait(0)  # this consumer's last TMA stores have read its epilogue buffer


@gluon.jit
def _context(layout, p, CID: gl.constexpr, out, slot):
    """Consumer CID's ctx for a tile: its operand is its buffer, every shared one, or None."""
    if layout.tile_operand is None:
        ctx = Consumer(CID, out, None)
    elif layout.tile_operand.SHARED:
        ctx = Consumer(CID, out, p.tile_bufs)
    else:
        ctx = Consumer(CID, out, p.tile_bufs.index(slot))
    return ctx


@gluon.jit
def _consume_tile(op, layout, p, CID: gl.constexpr, out, tile_id, i, t, prev, last_steps):
    """Consumer CID's work on one tile (the program's t-th; its first ring step is i): start, every
    step's compute, wait, finish. Returns (state, the next ring step, the tile's steps); with CARRY
    the state goes on to the next tile (``prev`` is the previous tile's)."""
    tile, steps = op.setup(tile_id)
    operand = layout.tile_operand
    slot = _tile_slot(layout, CID, t) if operand is not None else 0
    if operand is not None:
        mbarrier.wait(p.tile_ready.index(slot),
                      0 if operand.RESIDENT else (t // _buffers(operand, CID, layout.CONSUMERS)) & 1)
    ctx = _context(layout, p, CID, out, slot)
    state = op.start(ctx, tile, prev)
    for kk in range(steps):
        s = i % layout.STAGES
        mbarrier.wait(p.ready.index(s), (i // layout.STAGES) & 1)
        state = op.compute(ctx.at(i), state, p.stages.index(s), tile, kk)
        if layout.LATE_RELEASE == 0:
            state = op.wait(ctx, state)  # its wgmma must finish before the stage is refilled
            mbarrier.arrive(p.empty.index(s))
        else:
            # the wgmma of step kk - 1 has finished: its stage can be refilled
            mbarrier.arrive(p.empty.index((i + layout.STAGES - 1) % layout.STAGES), pred=kk > 0)
        i += 1
    state = op.wait(ctx, state)
    if layout.LATE_RELEASE > 0:
        mbarrier.arrive(p.empty.index((i + layout.STAGES - 1) % layout.STAGES), pred=steps > 0)
    if operand is not None:
        if not operand.RESIDENT:
            mbarrier.arrive(p.tile_empty.index(slot))  # the producer may load a later tile's operand here
    if layout.CARRY:
        last_steps = steps
    else:
        op.finish(ctx, state, tile)
    return state, i, last_steps


@gluon.jit
def _helper(op, layout, p):
    """The helper partition's loop: ``help`` for every step of the program's tiles, in the consumers'
    order (drawn tiles: it receives each id as they do)."""
    i = 0
    t = 0
    if layout.tile_counter is not None:
        tile_id = _receive_tile(p, t)
        while tile_id < p.num_tiles:
            i = _help_tile(op, layout, p, tile_id, i, t)
            t += 1
            tile_id = _receive_tile(p, t)
    else:
        SCHEDULED: gl.constexpr = layout.schedule is not None
        first, end, step = program_tiles(p.num_tiles, layout.schedule, SCHEDULED)
        next_id = scheduled_tile(first, layout.schedule, SCHEDULED)
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, layout.schedule, SCHEDULED)
            i = _help_tile(op, layout, p, tile_id, i, t)
            t += 1
    tma.store_wait(0)


@gluon.jit
def _help_tile(op, layout, p, tile_id, i, t):
    """The helper's work on one tile (the program's t-th; its first ring step is i): once the tile's
    (shared) operand has arrived, ``help`` for each step. Returns the next ring step."""
    tile, steps = op.setup(tile_id)
    mbarrier.wait(p.tile_ready.index(0), t & 1)
    ctx = Consumer(layout.CONSUMERS, None, p.tile_bufs)
    for kk in range(steps):
        op.help(ctx.at(i), tile, kk)
        i += 1
    mbarrier.arrive(p.tile_empty.index(0))  # the producer may load the next tile's operand
    return i


@gluon.jit
def run(op, layout, stages, num_tiles):
    """Run ``op`` on the template: ``stages`` is the op's stage ring (see the module docstring),
    ``num_tiles`` the tiles of the launch. Allocates the barriers, the tile operand's buffers and the
    epilogue buffers, then forks the producer warp and ``layout.CONSUMERS`` consumer partitions (of
    the kernel's ``num_warps`` each). Call once from the kernel."""
    C: gl.constexpr = layout.CONSUMERS
    STAGES: gl.constexpr = layout.STAGES
    operand = layout.tile_operand
    gl.static_assert(layout.LOOKAHEAD < STAGES and (layout.LOOKAHEAD == 0 or not layout.CARRY),
                     "LOOKAHEAD is below STAGES, and not with CARRY")
    gl.static_assert(layout.tile_counter is None or (layout.schedule is None and not layout.CARRY),
                     "drawn tiles go without a schedule table or CARRY")
    gl.static_assert(not layout.CARRY or (operand is not None and not operand.SHARED and layout.LATE_RELEASE == 0),
                     "CARRY takes a per-consumer tile operand and LATE_RELEASE=0")
    gl.static_assert(not layout.SIDE_ITEMS or (layout.schedule is not None and layout.tile_counter is None
                                               and not layout.CARRY and layout.LOOKAHEAD == 0
                                               and layout.helper is None),
                     "side items come from a schedule table, without drawn tiles, CARRY, LOOKAHEAD or a helper")
    HELPER: gl.constexpr = layout.helper is not None
    gl.static_assert(not HELPER or (C == 2 and operand is not None and operand.SHARED and not operand.RESIDENT
                                    and not layout.CARRY),
                     "a helper partition comes with two consumers and a shared tile operand")
    READERS: gl.constexpr = C + 1 if HELPER else C  # the partitions that read a tile's operand and ids
    out_desc = layout.out
    outs = gl.allocate_shared_memory(out_desc.dtype, [C] + out_desc.block_type.shape, out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=C)
    if operand is None:
        OPERAND_SLOTS: gl.constexpr = 1
        tile_bufs = outs  # unused
    elif operand.SHARED:
        OPERAND_SLOTS: gl.constexpr = 1
        tile_bufs = gl.allocate_shared_memory(operand.desc.dtype, [operand.COUNT] + operand.desc.block_type.shape,
                                              operand.desc.layout)
    else:
        gl.static_assert(operand.COUNT == 1, "a per-consumer tile operand is one buffer a load")
        OPERAND_SLOTS: gl.constexpr = _first_slot(operand, C, C)
        tile_bufs = gl.allocate_shared_memory(operand.desc.dtype, [OPERAND_SLOTS] + operand.desc.block_type.shape,
                                              operand.desc.layout)
    tile_ready = gl.allocate_shared_memory(gl.int64, [OPERAND_SLOTS, 1], mbarrier.MBarrierLayout())
    tile_empty = gl.allocate_shared_memory(gl.int64, [OPERAND_SLOTS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(OPERAND_SLOTS):
        mbarrier.init(tile_ready.index(c), count=1)
        mbarrier.init(tile_empty.index(c), count=READERS if operand is not None and operand.SHARED else 1)
    if layout.tile_counter is not None:  # the tile ids the producer draws, handed to the consumers
        ids = gl.allocate_shared_memory(gl.int32, [TILE_ID_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        id_ready = gl.allocate_shared_memory(gl.int64, [TILE_ID_SLOTS, 1], mbarrier.MBarrierLayout())
        id_free = gl.allocate_shared_memory(gl.int64, [TILE_ID_SLOTS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(TILE_ID_SLOTS):
            mbarrier.init(id_ready.index(c), count=1)
            mbarrier.init(id_free.index(c), count=READERS)
    else:
        ids = None
        id_ready = None
        id_free = None
    p = _Pipeline(stages, ready, empty, tile_bufs, tile_ready, tile_empty, ids, id_ready, id_free, num_tiles)
    STAGE_BYTES: gl.constexpr = stage_bytes(stages)
    if C == 1:
        gl.warp_specialize([(_consumer, (op, layout, p, 0, outs.index(0))),
                            (_producer, (op, layout, p, STAGE_BYTES))],
                           [1], [layout.PRODUCER_REGS])
    elif C == 2 and HELPER:  # the helper before the producer: a warpgroup of its own
        gl.warp_specialize([(_consumer, (op, layout, p, 0, outs.index(0))),
                            (_consumer, (op, layout, p, 1, outs.index(1))),
                            (_helper, (op, layout, p)),
                            (_producer, (op, layout, p, STAGE_BYTES))],
                           [gl.num_warps(), layout.helper.WARPS, 1],
                           [layout.CONSUMER_REGS, layout.helper.REGS, layout.PRODUCER_REGS])
    elif C == 2:
        gl.warp_specialize([(_consumer, (op, layout, p, 0, outs.index(0))),
                            (_consumer, (op, layout, p, 1, outs.index(1))),
                            (_producer, (op, layout, p, STAGE_BYTES))],
                           [gl.num_warps(), 1], [layout.CONSUMER_REGS, layout.PRODUCER_REGS])
    else:
        gl.static_assert(C == 3, "CONSUMERS is 1, 2 or 3")
        gl.warp_specialize([(_consumer, (op, layout, p, 0, outs.index(0))),
                            (_consumer, (op, layout, p, 1, outs.index(1))),
                            (_consumer, (op, layout, p, 2, outs.index(2))),
                            (_producer, (op, layout, p, STAGE_BYTES))],
                           [gl.num_warps(), gl.num_warps(), 1],
                           [layout.CONSUMER_REGS, layout.CONSUMER_REGS, layout.PRODUCER_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    for c in gl.static_range(OPERAND_SLOTS):
        mbarrier.invalidate(tile_ready.index(c))
        mbarrier.invalidate(tile_empty.index(c))
    if layout.tile_counter is not None:
        for c in gl.static_range(TILE_ID_SLOTS):
            mbarrier.invalidate(id_ready.index(c))
            mbarrier.invalidate(id_free.index(c))

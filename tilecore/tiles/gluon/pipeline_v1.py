"""The first pipeline template (v1; :mod:`.pipeline` is its successor, and the attention backward and
dq kernels are the last on this one): TMA loads into a ring of shared-memory stages that
complete on mbarriers, a producer warp and consumer warpgroups (warp specialization), asynchronous
wgmma, and an epilogue through shared memory and a TMA store. Persistent: each program loops over
tiles in the order of :mod:`tilecore.tiles.schedule`.

The contract mirrors the ``tl`` twin (:mod:`tilecore.tiles.pipeline`) and ThunderKittens'
load-compute-finish template. A kernel supplies ``gluon.jit`` functions, a tuple ``g`` of its
globals (TMA descriptors, pointers, sizes) and a constexpr tuple ``cfg`` of its compile-time
switches (a tuple built in a kernel turns constexprs into tensors, hence two tuples); every function
receives both:

* ``setup(g, cfg, tile_id) -> (tile, k_iters)``, called by producer and consumer alike;
* ``load(g, cfg, x_smem, y_smem, bar, tile, kk)``: issue the TMA copies of step ``kk`` into one stage's
  two buffers, completing on ``bar`` (the template has already set the barrier's byte count);
* ``init(g, cfg, tile) -> state``; ``compute(g, cfg, state, x_smem, y_smem, kk) -> state``: issue the step's
  wgmma; it may return with one wgmma group still running (the template then frees each stage one
  step late; with a single stage it drains after every step);
* ``drain(g, cfg, state) -> state``: wait for the last wgmma of the tile;
* ``finish(g, cfg, state, tile, out_smem)``: the epilogue. Wait for the previous tile's TMA store
  (``tma.store_wait``) before writing ``out_smem``, so that store overlaps this tile's main loop.

A per-tile operand (attention's Q block: read by every step of a tile): give ``tile_desc`` (its
block shape, dtype, swizzle) and ``load_tile(g, cfg, buf, bar, tile, consumer)``, which issues its TMA
copy (the consumer index says which share of the tile). The producer loads it at the start of every
tile, into one buffer per consumer, as soon as that consumer's previous tile no longer reads it;
``init(g, cfg, tile, buf)`` and ``compute(g, cfg, state, x_smem, y_smem, kk, buf)`` then receive the
buffer, already loaded. So the next tile's operand arrives during this tile's epilogue. With
``TILE_BUFFERS=2`` each consumer has two buffers used in turn: the producer loads the next tile's
operand (and its first stages) while this tile still runs, so no tile starts by waiting for a load.

With ``carry0`` (a per-consumer tile operand, ``IN_FLIGHT=0``) a consumer's pipeline does not drain
between tiles: a tile's first step may finish the previous tile's work (attention's forward issues
the next tile's first S with the last P V, and stores the finished tile's O under it). Then
``carry0(g, cfg)`` gives the state before a program's first tile; ``init(g, cfg, tile, buf, state)``
receives the previous tile's state; ``load(g, cfg, x, y, bar, tile, kk, prev)`` also receives the
previous tile (a program's first tile is its own previous); ``compute(g, cfg, state, x, y, kk, buf,
out_smem)`` stores results itself (``finish`` is not called); and after a program's last tile the
template runs one more step, ``kk = k_iters`` of that tile, loaded and computed like the others.

With ``TILE_SHARED`` the per-tile operand is one set of ``TILE_OPERANDS`` buffers (each of
``tile_desc``'s block) for the whole tile, read by every consumer (attention's backward: a key
block's K and V): ``load_tile(g, cfg, bufs, bar, tile)`` fills them once both consumers let go of the
previous tile's; ``init`` and ``compute`` receive all of them ([TILE_OPERANDS, *block]).

With ``TILE_RESIDENT`` (and ``TILE_SHARED``) the per-tile operand is a constant of the kernel (the
Hadamard transform's H_64, a DFT matrix): the producer loads it once per program and the consumers
keep it, never releasing it.

With ``z_desc`` every stage also holds a side buffer of that descriptor's block, loaded with the stage
(attention's backward: the step's rows' lse and delta): ``load`` and ``compute`` then receive the
pair (first buffer, side buffer) where they received the first buffer.

With ``helper`` (two consumers, a shared per-tile operand) a third kind of partition, a warpgroup
(``HELPER_WARPS`` warps with ``HELPER_REGS`` registers a thread), works through every step of the
program's tiles beside the consumers, taking its work from them through barriers of the kernel's
own (attention's backward: dQ = dS K from the dS that the consumers write). ``helper`` is a pair of
functions, ``issue(g, cfg, tile, kk, i, tile_bufs) -> token`` (wait for the step's inputs and start
its asynchronous work; ``i`` is the ring step) and ``finish(g, cfg, tile, kk, i, tile_bufs, token)``.
The helper holds the tile's operand too: the next tile's is loaded once it has let go of it. The
four warpgroups (two consumers, the helper, the producer's) share 512 registers a thread: attention
at D = 64 gives the consumers 200 and the helper 88. (Session 17 also tried the helper as the
producer, three warpgroups in 504, for D = 128's consumers at 224: the helper's 56 registers made
it too slow, notes/attention/README.md.)

With ``tile_counter`` (an int32 in global memory, zero at launch) the tiles are dynamic: each
program's producer draws its next tile from the counter when it gets to it (an atomic add) and hands
the id to the consumers (and the helper) through a small ring in shared memory, so programs that run faster take
more tiles and all end within about a tile of each other. A static share of equal tiles can end
far apart: the Hadamard kernel's 64 rows a program ended over 21 us of a 373 us call, since a
row's time varies by tens of percent from one to the next (notes/hadamard/README.md, session 18). Every
program draws once past the last tile; the draw of ``num_tiles + programs - 1``, the launch's last,
sets the counter back to zero, so the next launch on the stream finds it so.

With ``STEP_INDEX`` ``compute`` also receives the ring step ``i`` (counting every step of every tile
of the program) after the buffer, so a kernel can keep barriers of its own in step with the ring.

With ``CONSUMERS=2`` (or 3) two (three) consumer partitions (each of the kernel's ``num_warps``)
share every stage: each has its own epilogue buffer (out_desc's block: its share of the tile) and
sees ``cfg`` extended by its index, ``cfg[-1]``. Being separate partitions, they never wait for
each other, so one's softmax (say) runs while another's wgmma does; a stage is refilled once all
released it. Three consumers of 4 warps leave a thread 160 registers (``CONSUMER_REGS``).

With ``PINGPONG`` (two consumers and a per-tile operand) ``compute`` gets a last argument, a turn:
calling ``wait_turn(turn)`` before issuing its wgmma and ``pass_turn(turn)`` after makes the two
consumers issue their tensor-core work alternately, each step, so that one's softmax (say) runs
while the other's matmuls do (FlashAttention-3's ping-pong). Every step must call both, once.

The template owns the ring, its ``ready``/``empty`` barriers and their phases.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from tilecore.tiles.schedule import next_tile, program_tiles, scheduled_tile


TILE_ID_SLOTS: gl.constexpr = gl.constexpr(4)  # dynamic tiles: ids the producer may hand out ahead of the consumers


@gluon.jit
def _producer(g, cfg: gl.constexpr, pipeline, parts: gl.constexpr, load: gl.constexpr, load_tile: gl.constexpr,
              STAGE_BYTES: gl.constexpr, TILE_BYTES: gl.constexpr, CONSUMERS: gl.constexpr,
              LOOKAHEAD: gl.constexpr = 0):
    """The TMA producer's loop (``pipeline`` and ``parts`` as the consumers receive them)."""
    x_ring, y_ring, z_ring, ready, empty, tile_bufs, tile_ready, tile_empty, num_tiles, turns, schedule, dyn = pipeline
    (setup, _, _, _, _, STAGES, _, _, _, TILE_SHARED, TILE_RESIDENT, TILE_BUFFERS, CARRY, _, SCHEDULED, SIDE,
     DYNAMIC) = parts
    i = 0
    t = 0
    if DYNAMIC:  # tiles drawn from a counter, each handed to the consumers through shared memory
        counter, ids, id_ready, id_free = dyn
        tile_id = gl.atomic_add(counter, 1, sem="relaxed", scope="gpu")
        while tile_id < num_tiles:
            # the next draw is issued now; its latency runs under this tile's loads
            next_id = gl.atomic_add(counter, 1, sem="relaxed", scope="gpu")
            _publish_tile(ids, id_ready, id_free, t, tile_id)
            i, tile, k_iters = _produce_tile(g, cfg, pipeline, parts, load, load_tile, STAGE_BYTES, TILE_BYTES,
                                             CONSUMERS, LOOKAHEAD, tile_id, i, t, 0)
            t += 1
            tile_id = next_id
        _publish_tile(ids, id_ready, id_free, t, num_tiles)  # the consumers' signal to stop
        # every program draws exactly one ticket past the tiles, so the draw of num_tiles + P - 1 is
        # the launch's last: its program leaves the counter at zero for the next launch
        if tile_id == num_tiles + gl.num_programs(0) - 1:
            gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    else:
        first, end, step = program_tiles(num_tiles, schedule, SCHEDULED)
        next_id = scheduled_tile(first, schedule, SCHEDULED)
        if CARRY:  # the tile before a program's first is itself (what load takes from it goes unused)
            prev, last_iters = setup(g, cfg, next_id)
        else:
            prev = 0
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, schedule, SCHEDULED)
            i, tile, k_iters = _produce_tile(g, cfg, pipeline, parts, load, load_tile, STAGE_BYTES, TILE_BYTES,
                                             CONSUMERS, LOOKAHEAD, tile_id, i, t, prev)
            if CARRY:
                prev = tile
                last_iters = k_iters
            t += 1
        if CARRY:  # the tail step: step k_iters of the program's last tile
            if t > 0:
                s = i % STAGES
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), STAGE_BYTES)
                load(g, cfg, _stage_x(x_ring, z_ring, s, SIDE), y_ring.index(s), ready.index(s), prev, last_iters,
                     prev)


@gluon.jit
def _produce_tile(g, cfg: gl.constexpr, pipeline, parts: gl.constexpr, load: gl.constexpr, load_tile: gl.constexpr,
                  STAGE_BYTES: gl.constexpr, TILE_BYTES: gl.constexpr, CONSUMERS: gl.constexpr,
                  LOOKAHEAD: gl.constexpr, tile_id, i, t, prev):
    """The producer's loads of one tile (the program's t-th; its first ring step is i): the per-tile
    operand, then every step's stage. Returns (the next ring step, the tile, its steps)."""
    x_ring, y_ring, z_ring, ready, empty, tile_bufs, tile_ready, tile_empty, num_tiles, turns, schedule, dyn = pipeline
    setup, _, _, _, _, STAGES, _, _, _, TILE_SHARED, TILE_RESIDENT, TILE_BUFFERS, CARRY, _, _, SIDE, _ = parts
    tile, k_iters = setup(g, cfg, tile_id)
    if TILE_RESIDENT:  # a constant operand: loaded with the first tile, kept for all
        if t == 0:
            mbarrier.expect(tile_ready.index(0), TILE_BYTES)
            load_tile(g, cfg, tile_bufs, tile_ready.index(0), tile)
    elif TILE_SHARED:  # the tile's operands, once every consumer has let go of the last ones
        mbarrier.wait(tile_empty.index(0), (t & 1) ^ 1)
        mbarrier.expect(tile_ready.index(0), TILE_BYTES)
        load_tile(g, cfg, tile_bufs, tile_ready.index(0), tile)
    elif TILE_BYTES > 0:  # each consumer's per-tile operand, once its buffer is free again
        for c in gl.static_range(CONSUMERS):
            slot = _tile_slot(c, t, TILE_BUFFERS, False)
            mbarrier.wait(tile_empty.index(slot), ((t // TILE_BUFFERS) & 1) ^ 1)
            mbarrier.expect(tile_ready.index(slot), TILE_BYTES)
            load_tile(g, cfg, tile_bufs.index(slot), tile_ready.index(slot), tile, c)
    for kk in range(k_iters):
        s = i % STAGES
        if LOOKAHEAD > 0 and i >= STAGES:
            # step i - LOOKAHEAD released (phase j // STAGES of its barrier; consumers release in
            # order, so step i - STAGES, this stage's last use, was released before it)
            j = i - LOOKAHEAD
            mbarrier.wait(empty.index(j % STAGES), (j // STAGES) & 1)
        else:
            # a fresh barrier counts as having completed the phase before phase 0: the first lap
            # through the ring waits on parity 1 and passes at once
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), STAGE_BYTES)
        if CARRY:
            load(g, cfg, _stage_x(x_ring, z_ring, s, SIDE), y_ring.index(s), ready.index(s), tile, kk, prev)
        else:
            load(g, cfg, _stage_x(x_ring, z_ring, s, SIDE), y_ring.index(s), ready.index(s), tile, kk)
        i += 1
    return i, tile, k_iters


@gluon.jit
def _publish_tile(ids, id_ready, id_free, t, tile_id):
    """Dynamic tiles: the producer hands the program's t-th tile id to the consumers (a ring of slots
    in shared memory, each with a barrier pair: written; read by every consumer)."""
    SLOTS: gl.constexpr = ids.shape[0]
    slot = t % SLOTS
    mbarrier.wait(id_free.index(slot), ((t // SLOTS) & 1) ^ 1)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    ids.index(slot).store(gl.full([1], tile_id, gl.int32, layout))
    mbarrier.arrive(id_ready.index(slot))  # releases the store above (the arriving thread made it too)


@gluon.jit
def _receive_tile(ids, id_ready, id_free, t):
    """Dynamic tiles: a consumer's t-th tile id (num_tiles or more: no tile left)."""
    SLOTS: gl.constexpr = ids.shape[0]
    slot = t % SLOTS
    mbarrier.wait(id_ready.index(slot), (t // SLOTS) & 1)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    tile_id = gl.max(ids.index(slot).load(layout), axis=0)
    gl.thread_barrier()  # every warp of the partition has read the slot before it is released
    mbarrier.arrive(id_free.index(slot))
    return tile_id


@gluon.jit
def _stage_x(x_ring, z_ring, s, SIDE: gl.constexpr):
    """Stage s's first buffer, with its side buffer (``z_desc``) where the ring has one."""
    if SIDE:
        return x_ring.index(s), z_ring.index(s)
    else:
        return x_ring.index(s)


@gluon.constexpr_function
def _with_index(cfg, index):
    return tuple(cfg) + (index,)


@gluon.jit
def _consumer(g, cfg: gl.constexpr, out_smem, CID: gl.constexpr, PINGPONG: gl.constexpr, pipeline,
              parts: gl.constexpr):
    """Consumer CID's loop. What every consumer partition shares (see persistent_pipeline): the
    runtime ``pipeline`` (ring, barriers, tile count) and the compile-time ``parts`` (the kernel's
    functions and the template's options)."""
    x_ring, y_ring, z_ring, ready, empty, tile_bufs, tile_ready, tile_empty, num_tiles, turns, schedule, dyn = pipeline
    (setup, init, compute, drain, finish, STAGES, IN_FLIGHT, TILE_OPERAND, STEP_INDEX, TILE_SHARED, TILE_RESIDENT,
     TILE_BUFFERS, CARRY, carry0, SCHEDULED, SIDE, DYNAMIC) = parts
    i = 0
    t = 0
    if DYNAMIC:
        counter, ids, id_ready, id_free = dyn
        tile_id = _receive_tile(ids, id_ready, id_free, t)
        while tile_id < num_tiles:
            _, i, _ = _consume_tile(g, cfg, out_smem, CID, PINGPONG, pipeline, parts, tile_id, i, t, 0, 0)
            t += 1
            tile_id = _receive_tile(ids, id_ready, id_free, t)
    else:
        if CARRY:
            state = carry0(g, cfg)
            last_iters = gl.program_id(0) * 0
        first, end, step = program_tiles(num_tiles, schedule, SCHEDULED)
        next_id = scheduled_tile(first, schedule, SCHEDULED)
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, schedule, SCHEDULED)
            if CARRY:
                state, i, last_iters = _consume_tile(g, cfg, out_smem, CID, PINGPONG, pipeline, parts, tile_id, i, t,
                                                     state, last_iters)
            else:
                _, i, _ = _consume_tile(g, cfg, out_smem, CID, PINGPONG, pipeline, parts, tile_id, i, t, 0, 0)
            t += 1
        if CARRY:  # the tail step: step k_iters of the program's last tile, which finishes it
            if t > 0:
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                xs = _stage_x(x_ring, z_ring, s, SIDE)
                state = compute(g, cfg, state, xs, y_ring.index(s), last_iters, tile_bufs.index(0),
                                out_smem)
                state = drain(g, cfg, state)
    tma.store_wait(0)


@gluon.jit
def _consume_tile(g, cfg: gl.constexpr, out_smem, CID: gl.constexpr, PINGPONG: gl.constexpr, pipeline,
                  parts: gl.constexpr, tile_id, i, t, state, last_iters):
    """Consumer CID's work on one tile (the program's t-th; its first ring step is i): init, every
    step's compute, drain, finish. Returns (state, the next ring step, the tile's steps): with carry0
    the state goes on to the next tile (``state`` is the previous tile's) and the steps are needed by
    the tail step; otherwise both are unused (pass 0)."""
    x_ring, y_ring, z_ring, ready, empty, tile_bufs, tile_ready, tile_empty, num_tiles, turns, schedule, dyn = pipeline
    (setup, init, compute, drain, finish, STAGES, IN_FLIGHT, TILE_OPERAND, STEP_INDEX, TILE_SHARED, TILE_RESIDENT,
     TILE_BUFFERS, CARRY, carry0, SCHEDULED, SIDE, DYNAMIC) = parts
    tile, k_iters = setup(g, cfg, tile_id)
    slot = _tile_slot(CID, t, TILE_BUFFERS, TILE_SHARED)
    if TILE_OPERAND:
        mbarrier.wait(tile_ready.index(slot), 0 if TILE_RESIDENT else (t // TILE_BUFFERS) & 1)
        tile_buf = _tile_buf(tile_bufs, slot, TILE_SHARED)
        if CARRY:
            state = init(g, cfg, tile, tile_buf, state)
        else:
            state = init(g, cfg, tile, tile_buf)
    else:
        state = init(g, cfg, tile)
    for kk in range(k_iters):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        xs = _stage_x(x_ring, z_ring, s, SIDE)
        if PINGPONG:
            # this consumer's turn at step i: consumer 0 goes first (a fresh barrier passes parity 1)
            turn = (turns.index(CID), turns.index(1 - CID), (i & 1) ^ (1 - CID))
            state = compute(g, cfg, state, xs, y_ring.index(s), kk, tile_buf, turn)
        elif STEP_INDEX:
            state = compute(g, cfg, state, xs, y_ring.index(s), kk, tile_buf, i)
        elif CARRY:
            state = compute(g, cfg, state, xs, y_ring.index(s), kk, tile_buf, out_smem)
        elif TILE_OPERAND:
            state = compute(g, cfg, state, xs, y_ring.index(s), kk, tile_buf)
        else:
            state = compute(g, cfg, state, xs, y_ring.index(s), kk)
        if IN_FLIGHT == 0:
            state = drain(g, cfg, state)  # its wgmma must finish before the stage is refilled
            mbarrier.arrive(empty.index(s))
        else:
            # the wgmma of step kk-1 has finished: its stage can be refilled
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=kk > 0)
        i += 1
    state = drain(g, cfg, state)
    if IN_FLIGHT > 0:
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=k_iters > 0)
    if TILE_OPERAND and not TILE_RESIDENT:
        mbarrier.arrive(tile_empty.index(slot))  # the producer may load a later tile's operand here
    if CARRY:
        last_iters = k_iters
    else:
        finish(g, cfg, state, tile, out_smem)
    return state, i, last_iters


@gluon.jit
def _helper(g, cfg: gl.constexpr, pipeline, parts: gl.constexpr, helper: gl.constexpr):
    """The helper partition's loop (see the module docstring): issue and finish for every step of
    the program's tiles, in the consumers' order (drawn tiles: it receives each id as they do)."""
    x_ring, y_ring, z_ring, ready, empty, tile_bufs, tile_ready, tile_empty, num_tiles, turns, schedule, dyn = pipeline
    SCHEDULED: gl.constexpr = parts[14]
    DYNAMIC: gl.constexpr = parts[16]
    i = 0
    t = 0
    if DYNAMIC:
        counter, ids, id_ready, id_free = dyn
        tile_id = _receive_tile(ids, id_ready, id_free, t)
        while tile_id < num_tiles:
            i = _help_tile(g, cfg, pipeline, parts, helper, tile_id, i, t)
            t += 1
            tile_id = _receive_tile(ids, id_ready, id_free, t)
    else:
        first, end, step = program_tiles(num_tiles, schedule, SCHEDULED)
        next_id = scheduled_tile(first, schedule, SCHEDULED)
        for n in range(first, end, step):
            tile_id, next_id = next_tile(n, step, next_id, schedule, SCHEDULED)
            i = _help_tile(g, cfg, pipeline, parts, helper, tile_id, i, t)
            t += 1
    tma.store_wait(0)


@gluon.jit
def _help_tile(g, cfg: gl.constexpr, pipeline, parts: gl.constexpr, helper: gl.constexpr, tile_id, i, t):
    """The helper's work on one tile (the program's t-th; its first ring step is i). Returns the
    next ring step."""
    tile_bufs = pipeline[5]
    tile_ready = pipeline[6]
    tile_empty = pipeline[7]
    setup: gl.constexpr = parts[0]
    issue: gl.constexpr = helper[0]
    finish: gl.constexpr = helper[1]
    tile, k_iters = setup(g, cfg, tile_id)
    # the tile's operands have arrived (and are visible to this partition's reads)
    mbarrier.wait(tile_ready.index(0), t & 1)
    for kk in range(k_iters):
        token = issue(g, cfg, tile, kk, i, tile_bufs)
        finish(g, cfg, tile, kk, i, tile_bufs, token)
        i += 1
    mbarrier.arrive(tile_empty.index(0))  # the producer may load the next tile's operands
    return i


@gluon.jit
def _tile_slot(consumer: gl.constexpr, t, buffers: gl.constexpr, shared: gl.constexpr):
    """The per-tile operand's buffer (and barrier pair) for a program's t-th tile: consumer c's
    buffers are c * buffers .. (c + 1) * buffers - 1, used in turn; shared operands have one."""
    if shared:
        return 0
    else:
        return consumer * buffers + t % buffers


@gluon.jit
def _tile_buf(tile_bufs, slot, shared: gl.constexpr):
    """What a consumer's init/compute receive as the per-tile operand: its buffer, or every shared one."""
    if shared:
        return tile_bufs
    else:
        return tile_bufs.index(slot)


@gluon.jit
def persistent_pipeline(g, cfg: gl.constexpr, x_desc, y_desc, out_desc, num_tiles, setup: gl.constexpr,
                        load: gl.constexpr, init: gl.constexpr, compute: gl.constexpr,
                        drain: gl.constexpr, finish: gl.constexpr, STAGES: gl.constexpr,
                        PRODUCER_REGS: gl.constexpr = 40, CONSUMERS: gl.constexpr = 1,
                        CONSUMER_REGS: gl.constexpr = 232, IN_FLIGHT: gl.constexpr = -1,
                        tile_desc=None, load_tile: gl.constexpr = None, PINGPONG: gl.constexpr = False,
                        TILE_OPERANDS: gl.constexpr = 1, TILE_SHARED: gl.constexpr = False,
                        STEP_INDEX: gl.constexpr = False, TILE_RESIDENT: gl.constexpr = False,
                        TILE_BUFFERS: gl.constexpr = 1, carry0: gl.constexpr = None, schedule=None, z_desc=None,
                        helper: gl.constexpr = None, HELPER_WARPS: gl.constexpr = 4, HELPER_REGS: gl.constexpr = 88,
                        LOOKAHEAD: gl.constexpr = 0, tile_counter=None):
    """Allocate the ring and barriers, then fork a 1-warp TMA producer and the consumer warps.

    ``x_desc``/``y_desc`` give the block shape, dtype and swizzle of each stage's two buffers;
    ``out_desc`` those of the epilogue buffer (which may be a slice of the output tile: see
    ``store_tile``; a half-width buffer frees 32 KiB for a fourth stage). Call once from the kernel.
    ``CONSUMERS``: 1, 2 or 3 consumer partitions (see the module docstring; ``CONSUMER_REGS`` is the
    registers of each one after the first). ``IN_FLIGHT``: 1 if ``compute`` returns with a wgmma group still
    reading its stage (the stage is then released one step late), 0 if it returns with the stage's
    reads done; by default 1 when there are two or more stages. ``tile_desc`` and ``load_tile``: a
    per-tile operand (see the module docstring). ``PINGPONG`` (two consumers and a per-tile operand):
    ``compute`` also receives a turn for ``wait_turn``/``pass_turn`` (see the module docstring).
    ``TILE_OPERANDS``, ``TILE_SHARED``: several per-tile operands shared by the consumers;
    ``STEP_INDEX``: ``compute`` also receives the ring step; ``TILE_RESIDENT``: the shared per-tile
    operand is a constant, loaded once (see the module docstring). ``TILE_BUFFERS``: 2 double-buffers
    each consumer's per-tile operand; ``carry0``: the consumers' state carries across tiles (see the
    module docstring). ``schedule``: an int32 table of ``schedule.balanced_schedule`` for exactly this
    grid, which then gives each program its tiles (by default tile ids pid, pid + P, ... below
    ``num_tiles``). ``z_desc``: a small side buffer in every stage, loaded with the other two (see the
    module docstring). ``helper``: (issue, finish), a warpgroup that works through the program's
    steps beside the consumers (see the module docstring). ``LOOKAHEAD`` (below ``STAGES``; 0: the
    ring's depth): after its first lap through the ring the producer loads a step only once the step
    ``LOOKAHEAD`` before it is released, so a deep ring fills at a program's start (when nothing is
    written yet and the memory has room for more reads) and runs ``LOOKAHEAD`` deep after.
    ``tile_counter``: an int32 in global memory, zero before the first launch: tiles are then drawn
    from it as programs get to them (dynamic tiles, see the module docstring). The
    registers of the consumer, helper and producer warpgroups add up to at most 504 (168 a thread at
    launch) with three warpgroups, 512 with four (a helper: the first consumer gets what the others
    leave).
    """
    SCHEDULED: gl.constexpr = schedule is not None
    TILE_OPERAND: gl.constexpr = load_tile is not None
    CARRY: gl.constexpr = carry0 is not None
    SIDE: gl.constexpr = z_desc is not None
    HELPER: gl.constexpr = helper is not None
    DYNAMIC: gl.constexpr = tile_counter is not None
    gl.static_assert(not DYNAMIC or not (SCHEDULED or CARRY),
                     "dynamic tiles go without a schedule table or carry0")
    gl.static_assert(LOOKAHEAD < STAGES and (LOOKAHEAD == 0 or not CARRY),
                     "LOOKAHEAD is below STAGES, and not with carry0")
    gl.static_assert(not HELPER or (CONSUMERS == 2 and TILE_SHARED and not TILE_RESIDENT and not CARRY),
                     "a helper partition comes with two consumers and a shared per-tile operand")
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    if SIDE:
        z_ring = gl.allocate_shared_memory(z_desc.dtype, [STAGES] + z_desc.block_type.shape, z_desc.layout)
        Z_BYTES: gl.constexpr = z_desc.block_type.nbytes
    else:
        z_ring = x_ring  # unused
        Z_BYTES: gl.constexpr = 0
    y_ring = gl.allocate_shared_memory(y_desc.dtype, [STAGES] + y_desc.block_type.shape, y_desc.layout)
    out_smem = gl.allocate_shared_memory(out_desc.dtype, [CONSUMERS] + out_desc.block_type.shape, out_desc.layout)
    gl.static_assert(TILE_SHARED or TILE_OPERANDS == 1, "several tile operands are shared by the consumers")
    gl.static_assert(not STEP_INDEX or (TILE_OPERAND and not PINGPONG), "STEP_INDEX takes a tile operand")
    gl.static_assert(not TILE_RESIDENT or TILE_SHARED, "a resident tile operand is shared by the consumers")
    gl.static_assert(TILE_BUFFERS == 1 or (TILE_OPERAND and not TILE_SHARED),
                     "TILE_BUFFERS double-buffers each consumer's own per-tile operand")
    gl.static_assert(not CARRY or (TILE_OPERAND and not TILE_SHARED and not PINGPONG and not STEP_INDEX
                                   and IN_FLIGHT == 0), "carry0 takes a per-consumer tile operand and IN_FLIGHT=0")
    if TILE_SHARED:
        tile_bufs = gl.allocate_shared_memory(tile_desc.dtype, [TILE_OPERANDS] + tile_desc.block_type.shape,
                                              tile_desc.layout)
        TILE_BYTES: gl.constexpr = TILE_OPERANDS * tile_desc.block_type.nbytes
    elif TILE_OPERAND:
        tile_bufs = gl.allocate_shared_memory(tile_desc.dtype, [CONSUMERS * TILE_BUFFERS] + tile_desc.block_type.shape,
                                              tile_desc.layout)
        TILE_BYTES: gl.constexpr = tile_desc.block_type.nbytes
    else:
        tile_bufs = out_smem  # unused
        TILE_BYTES: gl.constexpr = 0
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    tile_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS * TILE_BUFFERS, 1], mbarrier.MBarrierLayout())
    tile_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS * TILE_BUFFERS, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if DYNAMIC:  # the tile ids the producer draws, handed to the consumers
        ids = gl.allocate_shared_memory(gl.int32, [TILE_ID_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        id_ready = gl.allocate_shared_memory(gl.int64, [TILE_ID_SLOTS, 1], mbarrier.MBarrierLayout())
        id_free = gl.allocate_shared_memory(gl.int64, [TILE_ID_SLOTS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(TILE_ID_SLOTS):
            mbarrier.init(id_ready.index(c), count=1)
            mbarrier.init(id_free.index(c), count=CONSUMERS + (1 if HELPER else 0))  # every reader
        dyn = (tile_counter, ids, id_ready, id_free)
    else:
        dyn = num_tiles  # unused
    gl.static_assert(not PINGPONG or (CONSUMERS == 2 and TILE_OPERAND), "PINGPONG takes two consumers and a tile operand")
    for c in gl.static_range(2):
        mbarrier.init(turns.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)
    for c in gl.static_range(CONSUMERS * TILE_BUFFERS):
        mbarrier.init(tile_ready.index(c), count=1)
        mbarrier.init(tile_empty.index(c), count=(CONSUMERS + (1 if HELPER else 0)) if TILE_SHARED else 1)
    STAGE_BYTES: gl.constexpr = x_desc.block_type.nbytes + y_desc.block_type.nbytes + Z_BYTES
    LATE_RELEASE: gl.constexpr = (1 if STAGES > 1 else 0) if IN_FLIGHT < 0 else IN_FLIGHT
    # what every partition shares (each consumer also takes its index, in cfg and as CID, and its
    # epilogue buffer); the functions ride in a constexpr tuple: Gluon cannot hold them in a runtime one
    pipeline = (x_ring, y_ring, z_ring, ready, empty, tile_bufs, tile_ready, tile_empty, num_tiles, turns, schedule,
                dyn)
    parts: gl.constexpr = gl.constexpr((setup, init, compute, drain, finish, STAGES, LATE_RELEASE, TILE_OPERAND,
                                        STEP_INDEX, TILE_SHARED, TILE_RESIDENT, TILE_BUFFERS, CARRY, carry0,
                                        SCHEDULED, SIDE, DYNAMIC))
    if CONSUMERS == 1:
        gl.warp_specialize([(_consumer, (g, cfg, out_smem.index(0), 0, False, pipeline, parts)),
                            (_producer, (g, cfg, pipeline, parts, load, load_tile, STAGE_BYTES, TILE_BYTES, CONSUMERS,
                                         LOOKAHEAD))],
                           [1], [PRODUCER_REGS])
    elif CONSUMERS == 2 and HELPER:  # the helper before the producer: a warpgroup of its own
        gl.warp_specialize([(_consumer, (g, _with_index(cfg, 0), out_smem.index(0), 0, PINGPONG, pipeline, parts)),
                            (_consumer, (g, _with_index(cfg, 1), out_smem.index(1), 1, PINGPONG, pipeline, parts)),
                            (_helper, (g, cfg, pipeline, parts, helper)),
                            (_producer, (g, cfg, pipeline, parts, load, load_tile, STAGE_BYTES, TILE_BYTES, CONSUMERS,
                                         LOOKAHEAD))],
                           [gl.num_warps(), HELPER_WARPS, 1], [CONSUMER_REGS, HELPER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([(_consumer, (g, _with_index(cfg, 0), out_smem.index(0), 0, PINGPONG, pipeline, parts)),
                            (_consumer, (g, _with_index(cfg, 1), out_smem.index(1), 1, PINGPONG, pipeline, parts)),
                            (_producer, (g, cfg, pipeline, parts, load, load_tile, STAGE_BYTES, TILE_BYTES, CONSUMERS,
                                         LOOKAHEAD))],
                           [gl.num_warps(), 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.static_assert(CONSUMERS == 3, "CONSUMERS is 1, 2 or 3")
        gl.warp_specialize([(_consumer, (g, _with_index(cfg, 0), out_smem.index(0), 0, False, pipeline, parts)),
                            (_consumer, (g, _with_index(cfg, 1), out_smem.index(1), 1, False, pipeline, parts)),
                            (_consumer, (g, _with_index(cfg, 2), out_smem.index(2), 2, False, pipeline, parts)),
                            (_producer, (g, cfg, pipeline, parts, load, load_tile, STAGE_BYTES, TILE_BYTES, CONSUMERS,
                                         LOOKAHEAD))],
                           [gl.num_warps(), gl.num_warps(), 1],
                           [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    for c in gl.static_range(CONSUMERS * TILE_BUFFERS):
        mbarrier.invalidate(tile_ready.index(c))
        mbarrier.invalidate(tile_empty.index(c))
    for c in gl.static_range(2):
        mbarrier.invalidate(turns.index(c))
    if DYNAMIC:
        for c in gl.static_range(TILE_ID_SLOTS):
            mbarrier.invalidate(id_ready.index(c))
            mbarrier.invalidate(id_free.index(c))


@gluon.jit
def wait_turn(turn):
    """PINGPONG: wait until the other consumer has issued its step's wgmma (FlashAttention-3's
    warpgroup ping-pong: one consumer's tensor-core work runs while the other does its softmax)."""
    mbarrier.wait(turn[0], turn[2])


@gluon.jit
def pass_turn(turn):
    """PINGPONG: this consumer has issued its step's wgmma; the other may issue its own."""
    mbarrier.arrive(turn[1])

"""The pipeline template, ``tl`` twin: the same load-compute-finish contract as the Gluon template
(:mod:`tilecore.tiles.gluon`), written in plain Triton so that the interpreter runs it and any GPU
compiles it.

A kernel supplies small ``triton.jit`` functions, a tuple ``g`` of its globals (pointers,
sizes, strides) and a constexpr tuple ``cfg`` of compile-time switches; the template owns the persistent loop over tiles and the loop over K:

* ``setup(g, cfg, tile_id) -> (tile, k_iters)``: where the output tile is and how many K steps it takes;
* ``init(g, cfg, tile) -> state``: the consumer's state (an accumulator, softmax statistics, ...);
* ``load(g, cfg, tile, kk) -> (x, y)``: the two input tiles of step ``kk`` (masked loads);
* ``compute(g, cfg, state, x, y, kk) -> state``;
* ``finish(g, cfg, state, tile)``: the epilogue (bias, scales, cast, store).

Here the pipeline depth is Triton's software pipelining of the K loop (``tl.range(num_stages=)``);
in the Gluon template it is an explicit ring of shared-memory stages filled by TMA. The Gluon
template's scheduling options (two consumer partitions, a per-tile operand loaded by the producer)
change where and when data moves, not what is computed, so they have no counterpart here. Dynamic
tiles (``tile_counter``) do, since their protocol decides which tiles run: each program draws tiles
from a global counter until it draws one past the last, and the launch's last draw resets the
counter, as the Gluon template's producer does (the interpreter checks the arithmetic; it runs the
programs one after another, so program 0 draws every tile there).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def persistent_pipeline(g, cfg: tl.constexpr, num_tiles, setup: tl.constexpr, init: tl.constexpr, load: tl.constexpr,
                        compute: tl.constexpr, finish: tl.constexpr, STAGES: tl.constexpr, tile_counter=None):
    """Run the load-compute-finish loop over tiles ``program_id, program_id + num_programs, ...``, or
    with ``tile_counter`` (an int32 in global memory, zero at launch and left so) over the tiles the
    program draws from it."""
    if tile_counter is not None:
        tile_id = tl.atomic_add(tile_counter, 1, sem="relaxed")
        while tile_id < num_tiles:
            next_id = tl.atomic_add(tile_counter, 1, sem="relaxed")  # drawn early: its latency hides
            _one_tile(g, cfg, tile_id, setup, init, load, compute, finish, STAGES)
            tile_id = next_id
        # one draw a program lands past the tiles; the last of them (num_tiles + P - 1) ends the launch
        if tile_id == num_tiles + tl.num_programs(0) - 1:
            tl.atomic_xchg(tile_counter, 0, sem="relaxed")
    else:
        for tile_id in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            _one_tile(g, cfg, tile_id, setup, init, load, compute, finish, STAGES)


@triton.jit
def _one_tile(g, cfg: tl.constexpr, tile_id, setup: tl.constexpr, init: tl.constexpr, load: tl.constexpr,
              compute: tl.constexpr, finish: tl.constexpr, STAGES: tl.constexpr):
    tile, k_iters = setup(g, cfg, tile_id)
    state = init(g, cfg, tile)
    for kk in tl.range(0, k_iters, num_stages=STAGES):
        x, y = load(g, cfg, tile, kk)
        state = compute(g, cfg, state, x, y, kk)
    finish(g, cfg, state, tile)

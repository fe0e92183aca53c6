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
change where and when data moves, not what is computed, so they have no counterpart here.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def persistent_pipeline(g, cfg: tl.constexpr, num_tiles, setup: tl.constexpr, init: tl.constexpr, load: tl.constexpr,
                        compute: tl.constexpr, finish: tl.constexpr, STAGES: tl.constexpr):
    """Run the load-compute-finish loop over tiles ``program_id, program_id + num_programs, ...``."""
    start = tl.program_id(0)
    step = tl.num_programs(0)
    for tile_id in range(start, num_tiles, step):
        tile, k_iters = setup(g, cfg, tile_id)
        state = init(g, cfg, tile)
        for kk in tl.range(0, k_iters, num_stages=STAGES):
            x, y = load(g, cfg, tile, kk)
            state = compute(g, cfg, state, x, y, kk)
        finish(g, cfg, state, tile)

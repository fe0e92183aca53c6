"""Tiles: the building blocks kernels are written with, after ThunderKittens.

* :mod:`tilecore.tiles.ops` — tile operations as ``triton.jit`` functions: ``mma`` (A B),
  ``mma_abt`` (A B^T), ``row_max``/``row_sum``/``col_max``/``col_sum``, ``exp2_scaled``,
  ``causal_mask``/``bounds_mask``/``masked``, ``online_softmax_update``, ``cast``,
  ``quantize``/``dequantize``.
* :mod:`tilecore.tiles.schedule` — the persistent scheduler: ``grouped_tile`` / ``tile_origin``
  (the one place the L2-aware tile order is computed, called by tl and Gluon kernels alike) and
  ``persistent_programs`` (one program per SM).
* :mod:`tilecore.tiles.gluon` — the Hopper template in Gluon (``pipeline.run``): TMA into a ring of
  shared-memory stages on mbarriers, a 1-warp producer, consumer warpgroups and an optional helper
  warpgroup, async wgmma, epilogues through shared memory and TMA stores. An op is a struct of its
  globals whose methods are the callbacks (setup / load / load_tile / start / compute / wait /
  finish), a stage struct and a ``Layout``; ``gluon.ops`` is the tile vocabulary (``store_tile``,
  ``wgmma_layout``, the online softmax, masks), ``gluon.stream_k`` the stream-K fix-up.
* :mod:`tilecore.tiles.pipeline` — the same contract in plain Triton (the ``tl`` twin), which the
  interpreter runs and any GPU compiles.
* :mod:`tilecore.tiles.compile` and :mod:`tilecore.tiles.report` — compile for sm_90a without a
  GPU; registers, spills, shared memory, and whether the PTX holds wgmma and TMA, for the kernels an
  op hands it (``python -m tilecore.ops.gemm.report``).

docs/tiles.md builds a new op (a GEMM with a fused SiLU-gate epilogue) on the template.
"""
from tilecore.tiles import ops, pipeline, schedule  # noqa: F401

__all__ = ["ops", "pipeline", "schedule"]

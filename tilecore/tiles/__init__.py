"""Tiles: the building blocks kernels are written with, after ThunderKittens.

* :mod:`tilecore.tiles.ops` — tile operations as ``triton.jit`` functions: ``mma`` (A B),
  ``mma_abt`` (A B^T), ``row_max``/``row_sum``/``col_max``/``col_sum``, ``exp2_scaled``,
  ``causal_mask``/``bounds_mask``/``masked``, ``online_softmax_update``, ``cast``,
  ``quantize``/``dequantize``.
* :mod:`tilecore.tiles.schedule` — the persistent scheduler: ``grouped_tile`` / ``tile_origin``
  (the one place the L2-aware tile order is computed, called by tl and Gluon kernels alike) and
  ``persistent_programs`` (one program per SM).
* :mod:`tilecore.tiles.gluon` — the Hopper pipeline template in Gluon: TMA into a ring of
  shared-memory stages on mbarriers, a 1-warp producer and consumer warpgroups, async wgmma, an
  epilogue through shared memory and TMA stores (``persistent_pipeline``, ``store_tile``,
  ``wgmma_layout``). Kernels supply setup / load / init / compute / drain / finish.
* :mod:`tilecore.tiles.pipeline` — the same contract in plain Triton (the ``tl`` twin), which the
  interpreter runs and any GPU compiles.
* :mod:`tilecore.tiles.compile` and :mod:`tilecore.tiles.report` — compile for sm_90a without a
  GPU; registers, spills, shared memory, and whether the PTX holds wgmma and TMA, for the kernels an
  op hands it (``python -m tilecore.ops.gemm.report``).

docs/gemm_tutorial.md builds tilecore's GEMM from these pieces.
"""
from tilecore.tiles import ops, pipeline, schedule  # noqa: F401

__all__ = ["ops", "pipeline", "schedule"]

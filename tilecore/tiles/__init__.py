"""Tiles: the building blocks kernels are written with (tile operations, pipeline, scheduler)."""

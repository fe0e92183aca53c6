"""Benchmarks: ``tilecore bench <suite>``. See :mod:`tilecore.bench.harness`."""
from tilecore.bench.harness import Case, Suite, median_ms, rotating, run_suite, save, table

__all__ = ["Case", "Suite", "median_ms", "rotating", "run_suite", "save", "table"]

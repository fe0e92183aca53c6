"""Benchmarks: ``tilecore bench <suite>``. The suites (:mod:`tilecore.bench.suites`) declare their cases
(:mod:`tilecore.bench.case`); the harness (:mod:`tilecore.bench.harness`) runs them and imports none."""
from tilecore.bench.case import Case, Suite
from tilecore.bench.harness import median_ms, rotating, run_suite, save, table

__all__ = ["Case", "Suite", "median_ms", "rotating", "run_suite", "save", "table"]

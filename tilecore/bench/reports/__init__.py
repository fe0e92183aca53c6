"""Compile-only reports of an op's kernels (registers, spills, shared memory, PTX facts) for sm_90a,
run without a GPU: ``python -m tilecore.bench.reports.<op> [--json]``. They import the ops they
report on (an op's package imports nothing of them)."""

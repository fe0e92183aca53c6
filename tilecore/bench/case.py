"""What a benchmark suite declares: its cases (parameters, the work, the implementations to time) and
how it is measured. The suites (tilecore.bench.suites) build these; the harness
(tilecore.bench.harness) runs them. This module imports neither."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

Metric = Literal["GB/s", "TFLOP/s"]


@dataclass
class Case:
    """One point of a sweep: parameters, the work it does, and the implementations to time.

    ``series`` maps a name ("tilecore", a peer's name) to a builder that allocates its inputs and
    returns the zero-argument function to time. A builder that raises ImportError is a peer that is
    not installed here, and is skipped.
    """
    params: dict
    series: dict[str, Callable[[], Callable[[], object]]]
    bytes: int = 0
    flops: int = 0


@dataclass
class Suite:
    name: str
    ceiling: str  # a key of tilecore.bench.harness.CEILINGS
    metric: Metric
    x: str  # the parameter on the plot's x axis (log2 scale)
    cases: Callable[[bool], list[Case]]  # cases(quick)
    describe: str = ""
    # "eager": each call as a program makes it (host time shows where it exceeds the GPU's);
    # "graph": GPU time alone, calls replayed from a CUDA graph (as servers run decode steps)
    timing: Literal["eager", "graph"] = "eager"

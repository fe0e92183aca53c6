"""``TourCase``: one op call that ``tilecore tour`` shows. Each op's ``tour.py`` makes its cases from
it, and ``tilecore.tour`` runs them; this module imports neither, so neither imports the other back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch


@dataclass
class TourCase:
    """One op call to show: ``run`` calls the op on inputs made ahead, ``reference`` gives float64."""
    op: str
    shape: str
    dtype: torch.dtype
    run: Callable[[], torch.Tensor]
    reference: Callable[[], torch.Tensor]
    bytes: int = 0
    flops: int = 0
    bound: Literal["memory", "compute", "compute-fp8"] = "memory"

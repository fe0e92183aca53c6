"""Operations: one folder each (public function, custom-op registration, kernels, reference)."""
from __future__ import annotations

import torch


def tour_cases(device: torch.device) -> list:
    """The tour's cases from every op, in the order the ops landed."""
    cases = []
    cases += __import__("tilecore.ops.hadamard.tour", fromlist=["tour_cases"]).tour_cases(device)
    cases += __import__("tilecore.ops.gemm", fromlist=["tour_cases"]).tour_cases(device)
    cases += __import__("tilecore.ops.attention", fromlist=["tour_cases"]).tour_cases(device)
    return cases

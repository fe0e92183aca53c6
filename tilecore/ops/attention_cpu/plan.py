"""Which torch path serves attention on CPU tensors without Triton's interpreter (attention's plan asks
torch_path where dispatch.backend_for says "reference"): "sdpa", torch's CPU flash-attention kernel,
where every score is sure to be finite, else "reference", the float32 math a block of query rows at a
time (NaN- and inf-faithful)."""
from __future__ import annotations

import math

import torch

SDPA_MAX_SCORE = 2.0**120  # scores bounded below this (Cauchy-Schwarz) take torch's flash kernel
REFERENCE_MAX_SCORES = 1 << 22  # the float32 math's scores held at once (16 MiB a block of query rows)


def torch_path(q, k, scale: float, v=None, used: set[str] = frozenset()) -> str:
    """"sdpa" (torch's CPU flash-attention kernel) where every score of q and k is sure to be
    finite and the call uses no feature the kernel lacks (a softcap; v's head size != q's; head
    dims past 256: a sliding window it takes as a float mask), else "reference" (float32 math a
    block of rows at a time, NaN- and inf-faithful)."""
    if used - {"window"}:
        return "reference"
    return "sdpa" if scores_finite(q, k, scale) else "reference"


def scores_finite(q, k, scale: float) -> bool:
    """Whether every score scale * q_i . k_j, and every partial sum of q_i . k_j, is sure to be
    finite in float32: q and k finite, and D max|q| max|k| max(|scale|, 1) (>= |scale| ||q_i||
    ||k_j||, Cauchy-Schwarz) well below float32's largest value (2^128). torch's CPU flash kernel
    drops a NaN score (it gives the row as if the key were not there) and loses a +inf one; where
    this holds there is neither, so its results are SDPA's math's. One pass over q and k, with no
    copy of them (aminmax; NaN gives NaN)."""
    if q.numel() == 0 or k.numel() == 0:
        return True
    largest = [max(-float(lo), float(hi)) for lo, hi in (torch.aminmax(t.detach()) for t in (q, k))]
    bound = q.shape[-1] * largest[0] * largest[1] * max(abs(scale), 1.0)  # a Python float: no overflow
    return math.isfinite(bound) and bound < SDPA_MAX_SCORE

"""Error measured the way tilecore reports it: relative RMS against a float64 reference, and as a
multiple of the rounding floor (the error of rounding the exact answer to the output dtype)."""
from __future__ import annotations

import torch


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if either holds a NaN)."""
    out, ref = out.double(), ref.double()
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def rounding_floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The error of the best possible ``dtype`` answer: ``ref`` (float64) rounded to ``dtype``."""
    return rel_rms(ref.to(dtype), ref)


def error_over_floor(out: torch.Tensor, ref: torch.Tensor) -> float:
    """rel_rms(out, ref) as a multiple of the rounding floor of out's dtype (1.0 is the best)."""
    floor = rounding_floor(ref, out.dtype)
    err = rel_rms(out, ref)
    return err / floor if floor > 0 else (0.0 if err == 0 else float("inf"))

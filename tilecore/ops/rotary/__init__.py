"""Rotary position embedding (half-split and interleaved), forward and backward, on a Triton kernel."""
from tilecore.ops.rotary.op import apply_rotary
from tilecore.ops.rotary.reference import rotary_reference

__all__ = ["apply_rotary", "rotary_reference"]

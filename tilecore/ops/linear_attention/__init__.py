"""Linear attention and Mamba-2 in the chunked form: Based, Hedgehog, scalar and per-channel decay
(simple GLA / Mamba-2's SSD, GLA), their decode steps, and float64 references."""
from tilecore.ops.linear_attention.op import linear_attention, linear_attention_step, mamba2_chunk_scan, mamba2_step
from tilecore.ops.linear_attention.reference import linear_attention_reference, mamba2_reference

__all__ = ["linear_attention", "linear_attention_step", "mamba2_chunk_scan", "mamba2_step",
           "linear_attention_reference", "mamba2_reference"]

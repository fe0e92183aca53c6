"""Fused residual + dropout + LayerNorm / RMSNorm, forward and backward, on Triton kernels."""
from tilecore.ops.norm.op import dropout_mask, layer_norm
from tilecore.ops.norm.reference import layer_norm_reference

__all__ = ["layer_norm", "dropout_mask", "layer_norm_reference"]

"""The fast Walsh-Hadamard transform on tensor cores (HadaCore-style), at the rounding floor, for n a power
of two or m x 2^k; and hadamard_quantize, the rotation fused with FP8/INT8/MXFP4/NVFP4/INT4 quantization."""
from tilecore.ops.hadamard.op import hadamard_transform
from tilecore.ops.hadamard.quantize import dequantize, hadamard_quantize
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference

__all__ = ["hadamard_transform", "hadamard_quantize", "dequantize", "hadamard_reference", "hadamard_matrix"]

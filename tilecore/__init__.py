"""tilecore: tensor-core GPU kernels for AI as PyTorch ops, the tiles they are written with, and the
napkin, a diagram-based IO performance model."""
from tilecore import nn
from tilecore.ops.hadamard import hadamard_transform
from tilecore.ops.gemm import gemm, gemm_fp8

__version__ = "0.1.0"
__all__ = ["hadamard_transform", "gemm", "gemm_fp8", "nn"]

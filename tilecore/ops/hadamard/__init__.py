"""The fast Walsh-Hadamard transform on tensor cores (HadaCore-style), at the rounding floor."""
from tilecore.ops.hadamard.op import hadamard_transform
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference

__all__ = ["hadamard_transform", "hadamard_reference", "hadamard_matrix"]

"""tilecore: tensor-core GPU kernels for AI as PyTorch ops, the tiles they are written with, and the
napkin, a diagram-based IO performance model."""
__version__ = "0.1.0"

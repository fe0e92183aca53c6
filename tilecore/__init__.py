"""tilecore: tensor-core GPU kernels for AI as PyTorch ops, the tiles they are written with, and the
napkin, a diagram-based IO performance model.

The ops are imported on first use, so that ``tilecore.napkin`` (pure Python) loads no torch or triton.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "hadamard_transform": "tilecore.ops.hadamard",
    "gemm": "tilecore.ops.gemm",
    "gemm_fp8": "tilecore.ops.gemm",
    "attention": "tilecore.ops.attention",
    "nn": "tilecore.nn",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tilecore' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name == "nn" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)

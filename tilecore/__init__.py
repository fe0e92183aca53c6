"""tilecore: tensor-core GPU kernels for AI as PyTorch ops, the tiles they are written with, and the
napkin, a diagram-based IO performance model.

Importing tilecore registers every ``torch.ops.tilecore`` op (for torch.compile, torch.export and
code that calls the ops by name): at once where torch is already imported, else as soon as torch
is, so that ``tilecore.napkin`` (pure Python) still loads no torch or triton. The Python functions
(``tilecore.gemm`` ...) are imported on first use.
"""
import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

_EXPORTS = {
    "hadamard_transform": "tilecore.ops.hadamard",
    "hadamard_quantize": "tilecore.ops.hadamard",
    "dequantize": "tilecore.ops.hadamard",
    "gemm": "tilecore.ops.gemm",
    "gemm_fp8": "tilecore.ops.gemm",
    "attention": "tilecore.ops.attention",
    "attention_varlen": "tilecore.ops.attention_varlen",
    "attention_with_kvcache": "tilecore.ops.attention_kvcache",
    "attention_fp8": "tilecore.ops.attention_fp8",
    "attention_fp8_rotated": "tilecore.ops.attention_fp8",
    "layer_norm": "tilecore.ops.norm",
    "apply_rotary": "tilecore.ops.rotary",
    "fft_conv": "tilecore.ops.fft_conv",
    "filter_spectrum": "tilecore.ops.fft_conv",
    "linear_attention": "tilecore.ops.linear_attention",
    "linear_attention_step": "tilecore.ops.linear_attention",
    "mamba2_chunk_scan": "tilecore.ops.linear_attention",
    "mamba2_step": "tilecore.ops.linear_attention",
    "nn": "tilecore.nn",
    "distributed": "tilecore.distributed",
    "compat": "tilecore.compat",
    "compile_diagram": "tilecore.ops.napkin_compiled",
}
_MODULES = ("nn", "distributed", "compat")  # exported as modules
__all__ = list(_EXPORTS)

# the modules whose import registers the torch.ops.tilecore ops (torch.library.custom_op)
OP_MODULES = ("tilecore.ops.gemm.op", "tilecore.ops.hadamard.op", "tilecore.ops.hadamard.quantize",
              "tilecore.ops.attention.op", "tilecore.ops.attention_rotary.op", "tilecore.ops.attention_varlen.op",
              "tilecore.ops.attention_kvcache.op",
              "tilecore.ops.attention_fp8.op", "tilecore.ops.norm.op", "tilecore.ops.rotary.op",
              "tilecore.ops.linear_attention.op", "tilecore.ops.fft_conv.op", "tilecore.distributed.op")


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tilecore' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)


def _register_ops() -> None:
    for name in OP_MODULES:
        importlib.import_module(name)


def _tilecore_importing() -> bool:
    """Whether a tilecore module is still being imported (its ops' modules would import it, half made)."""
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False)
               for n, m in list(sys.modules.items()) if n == "tilecore" or n.startswith("tilecore."))


class _RegisterWhenIdle(importlib.abc.MetaPathFinder):
    """Registers the ops at the first import after tilecore's own imports have finished, when torch was
    first imported by a tilecore module (registering then would import that module half made)."""

    def find_spec(self, name, path=None, target=None):
        if not _tilecore_importing():
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                _register_ops()
        return None


class _RegisterAfterTorch(importlib.abc.MetaPathFinder):
    """Finds torch as the other finders do, and has its loader register tilecore's ops right after
    torch's own module has run (the first ``import torch`` after ``import tilecore``)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: and find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run_torch = loader.exec_module

        def exec_module(module):
            run_torch(module)
            del loader.exec_module  # the loader's own method again
            if _tilecore_importing():  # torch imported by a tilecore module: register once it is done
                sys.meta_path.insert(0, _RegisterWhenIdle())
            else:
                _register_ops()

        loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:
    _register_ops()
else:
    sys.meta_path.insert(0, _RegisterAfterTorch())

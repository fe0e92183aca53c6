"""Shared stand-ins for the host-path tests (tests/host)."""
import torch

from tilecore.tiles import launch


def cpu_signature(*items, scalars=launch._KEY_SCALARS):
    """A CPU stand-in for an op's launch-key ``signature`` (which keys CUDA tensors only): tensors by shape, strides,
    dtype, device and 16-byte alignment, ``scalars`` as themselves, None for anything else (no key)."""
    out = []
    for t in items:
        if isinstance(t, torch.Tensor):
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or isinstance(t, scalars):
            out.append(t)
        else:
            return None
    return tuple(out)

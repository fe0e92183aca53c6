"""Device dispatch: the one place that decides which implementation a tensor gets.

* CUDA tensors run the compiled Triton/Gluon kernels.
* CPU tensors run the same Triton kernels through Triton's interpreter when ``TRITON_INTERPRET=1``
  (that is how CI tests the kernels on machines without a GPU), and otherwise a correct reference
  written with PyTorch operations.

Ops never test ``x.is_cuda`` themselves; they call :func:`select`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from typing import Callable, Literal

import torch

Backend = Literal["kernel", "reference"]


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the interpreter (set before tilecore is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no")


def backend_for(device: torch.device) -> Backend:
    """Which implementation serves tensors on ``device``."""
    if device.type == "cuda":
        return "kernel"
    if device.type == "cpu":
        return "kernel" if interpreter_enabled() else "reference"
    raise TypeError(f"tilecore runs on CUDA and CPU tensors; got a tensor on '{device.type}'")


def interpreted(device: torch.device) -> bool:
    """True when kernels for tensors on ``device`` run in Triton's interpreter: CPU tensors under
    ``TRITON_INTERPRET=1`` (CUDA tensors always run compiled kernels)."""
    return device.type == "cpu" and interpreter_enabled()


def select(device: torch.device, *, kernel: Callable, reference: Callable) -> Callable:
    """Return ``kernel`` or ``reference`` for ``device`` (see the module docstring)."""
    return kernel if backend_for(device) == "kernel" else reference


def plain_eager(*tensors: torch.Tensor | None) -> bool:
    """True when an op may call its implementation directly instead of through its custom op:
    eager mode, no gradient to record, plain CUDA or CPU tensors (meta tensors take the op's fake
    implementation), no dispatch mode or functorch transform.

    A ``torch.library`` custom op's Python dispatch costs ~100 us of host time per call (measured on
    the lent H100's host, notes/gemm/README.md), more than many kernels take; torch.compile, autograd,
    fake tensors and modes still go through the op.
    """
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled():
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor or t.device.type not in ("cuda", "cpu") or (grad and t.requires_grad):
            return False
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            return False
    return True


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds per call)."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def properties(device: torch.device):
    """torch's properties of a CUDA device (name, capability, SMs, L2 and memory sizes), cached: the
    query costs microseconds a call."""
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, None for the CPU (and the interpreter)."""
    if device.type != "cuda":
        return None
    p = properties(device)  # cached: torch's query costs ~10 us of host time a call
    return p.major, p.minor


def is_hopper(device: torch.device) -> bool:
    """True on sm_90 devices, where the Gluon (TMA, wgmma) kernels run."""
    return capability(device) == (9, 0)


def gluon_ok(device: torch.device) -> bool:
    """True where the Gluon (TMA, wgmma) kernels run: a Hopper device (:func:`is_hopper`) under a
    triton they were compile-checked under (:func:`gluon_triton_problem`). On Hopper under another
    triton it warns once, naming the version and those tested, and is False: the plans run the portable
    Triton kernels."""
    return is_hopper(device) and _gluon_triton_ok()


@functools.lru_cache(maxsize=None)
def gluon_triton_problem() -> str | None:
    """None when the installed triton is one the Gluon kernels were compile-checked under
    (``tilecore.tiles.gluon.compat.TESTED``); else why not, in a sentence. The first call imports the
    Gluon modules."""
    try:
        from tilecore.tiles.gluon import compat
    except Exception as err:  # noqa: BLE001 (a triton under which the Gluon modules do not even import)
        import triton
        return f"the Gluon kernels do not import under triton {triton.__version__} ({type(err).__name__}: {err})"
    return compat.problem()


@functools.lru_cache(maxsize=None)
def _gluon_triton_ok() -> bool:
    problem = gluon_triton_problem()
    if problem is not None:
        warnings.warn(f"tilecore: {problem}: Hopper runs the portable Triton kernels instead, which are slower",
                      RuntimeWarning, stacklevel=3)
    return problem is None


def capturing(device: torch.device) -> bool:
    """True while a CUDA graph is being captured on ``device``'s current stream."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def on_device(device: torch.device | None):
    """A context in which kernels launch on ``device`` (Triton launches on the current device).

    The guard costs ~15 us of host time, so it is entered only when ``device`` is a CUDA device
    other than the current one.
    """
    if device is not None and device.type == "cuda" and device.index is not None \
            and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def notice_once(message: str) -> None:
    """Print a notice to stderr the first time it is given (e.g. a slower fallback path)."""
    print(f"tilecore: {message}", file=sys.stderr)

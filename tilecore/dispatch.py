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


# The values Triton reads as on (its env_bool, case-insensitive, unstripped): any other value, "2"
# included, leaves @triton.jit making compiled kernels, so tilecore must read it as Triton does.
_TRITON_ON = ("1", "true", "on", "yes", "y")
_TRITON_OFF = ("", "0", "false", "off", "no", "n")
# triton.jit reads TRITON_INTERPRET once per kernel, when its module is imported: the value when
# tilecore's kernels were made (this module is imported before them)
_INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "").lower() in _TRITON_ON


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the interpreter: TRITON_INTERPRET is one of the values Triton
    reads as on (1, true, on, yes, y), set before tilecore is imported.

    Another value (e.g. 2) is off for Triton, so here too (with a one-time notice). Turning it on
    after import is refused: Triton already made tilecore's kernels for a GPU, and CPU tensors sent
    to them fail with Triton's "0 active drivers". Turning it off later is honoured (CPU tensors
    then take the PyTorch path)."""
    value = os.environ.get("TRITON_INTERPRET", "")
    on = value.lower() in _TRITON_ON
    if on and not _INTERPRET_AT_IMPORT:
        raise RuntimeError(f"TRITON_INTERPRET={value} was set after tilecore was imported, when Triton had already "
                           "made tilecore's kernels for a GPU: set it before importing tilecore (or unset it)")
    if not on and value.strip().lower() not in _TRITON_OFF:
        notice_once(f"TRITON_INTERPRET={value!r} is not a value Triton reads as on ({', '.join(_TRITON_ON)}): "
                    "kernels are compiled for a GPU, and CPU tensors take the PyTorch path")
    return on


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


def eager_mode(*tensors: torch.Tensor | None) -> str:
    """How an op's call runs, for ops with an eager fast path (:func:`plain_eager` is its "direct"):

    * "direct": the implementation itself: eager, nothing to record (no gradient, or grad mode off),
      plain CUDA or CPU tensors, no mode or transform active;
    * "autograd": the same, with a gradient to record: the op's ``torch.autograd.Function``, whose
      forward and backward call the implementations (~10 us of host time, where a custom op with
      autograd costs ~100 us, and whose first call imports torch._dynamo: ~3.5 s);
    * "op": through the ``torch.library`` custom op: under torch.compile, dispatch or torch-function
      modes (fake and meta tensors), functorch transforms, tensor subclasses.
    """
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled() \
            or torch._C._len_torch_dispatch_stack() or torch._C._functorch.peek_interpreter_stack() is not None:
        return "op"
    grad = False
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor or not (t.is_cuda or t.is_cpu):
            return "op"
        grad = grad or t.requires_grad
    return "autograd" if grad and torch.is_grad_enabled() else "direct"


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


def cpu_native_matmul(dtype: torch.dtype) -> bool:
    """Whether torch's CPU matmul runs 16-bit ``dtype`` on native instructions (AMX, AVX512-BF16).
    Where it does not (e.g. AVX2), torch.mm in bf16 ran 6x (512^3) and 48x (1024^3) slower than
    upcasting to float32 (AMD EPYC, AVX2, 2 cores), so CPU GEMMs upcast there."""
    return _cpu_native_matmul(dtype)


@functools.lru_cache(maxsize=None)
def _cpu_native_matmul(dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return True
    probes = {torch.bfloat16: ("_is_amx_tile_supported", "_is_avx512_bf16_supported"),
              torch.float16: ("_is_amx_fp16_supported",)}.get(dtype, ())
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


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

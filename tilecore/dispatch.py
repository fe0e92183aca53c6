"""Device dispatch: the one place that decides which implementation a tensor gets.

* CUDA tensors run the compiled Triton/Gluon kernels.
* CPU tensors run the same Triton kernels through Triton's interpreter when ``TRITON_INTERPRET=1``
  (that is how CI tests the kernels on machines without a GPU), and otherwise a correct reference
  written with PyTorch operations.

Ops never test ``x.is_cuda`` themselves; they call :func:`select`.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import sys
import threading
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
    """Which implementation serves tensors on ``device``. A GPU the kernels cannot serve (an NVIDIA GPU
    older than compute capability 8.0) raises a RuntimeError saying so (:func:`gpu_problem`)."""
    if device.type == "cuda":
        index = device.index
        if index is None and torch.cuda.is_available():  # (a CPU-only torch still names "cuda": kernels)
            index = torch.cuda.current_device()
        if index is not None:
            problem = _gpu_problem(index)
            if problem is not None:
                raise RuntimeError(problem)
        return "kernel"
    if device.type == "cpu":
        return "kernel" if interpreter_enabled() else "reference"
    if device.type == "meta" and _PRETENDED.get() is not None:
        return "kernel"  # a described GPU (pretend)
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
    implementation, but inside :func:`pretend`), no dispatch mode or functorch transform: :func:`eager_mode`'s "direct".

    A ``torch.library`` custom op's Python dispatch costs ~100 us of host time per call (measured on
    the lent H100's host, notes/gemm/README.md), more than many kernels take; torch.compile, autograd,
    fake tensors and modes still go through the op. (The same C-level checks as eager_mode,
    where this imported and walked the dispatch-mode stack in Python each call: 6-8 us of the H100 host's
    cProfile for attention_fp8, fft_conv, mamba2_step.)
    """
    return eager_mode(*tensors) == "direct"


def eager_mode(*tensors: torch.Tensor | None) -> str:
    """How an op's call runs, for ops with an eager fast path (:func:`plain_eager` is its "direct"):

    * "direct": the implementation itself: eager, nothing to record (no gradient, or grad mode off),
      plain CUDA or CPU tensors, no mode or transform active;
    * "autograd": the same, with a gradient to record: the op's ``torch.autograd.Function``, whose
      forward and backward call the implementations (~10 us of host time, where a custom op with
      autograd costs ~100 us, and whose first call imports torch._dynamo: ~3.5 s);
    * "op": through the ``torch.library`` custom op: under torch.compile, dispatch or torch-function
      modes (fake and meta tensors), functorch transforms, tensor subclasses.

    Inside :func:`pretend`, plain meta tensors stand for the described GPU's tensors and count as a device's:
    a public call runs the implementation, so tilecore.portability records the kernels the op's own host path
    launches there (outside pretend a meta tensor still takes the custom op's fake).
    """
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled() \
            or torch._C._len_torch_dispatch_stack() or torch._C._functorch.peek_interpreter_stack() is not None:
        return "op"
    grad = False
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor or not (t.is_cuda or t.is_cpu or (t.is_meta and _PRETENDED.get() is not None)):
            return "op"
        grad = grad or t.requires_grad
    return "autograd" if grad and torch.is_grad_enabled() else "direct"


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds per call), or
    of the GPU a meta device stands for (:func:`pretend`)."""
    if device.type == "meta":
        return _described_or_raise(device).sms
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
    """Compute capability of a CUDA device as torch reports it (on ROCm the gfx architecture's: (9, 0)
    for an MI200's gfx90a, so ask :func:`is_rocm` before reading it as NVIDIA's), that of the GPU a
    meta device stands for (:func:`pretend`), None for the CPU (and the interpreter)."""
    if device.type != "cuda":
        target = described(device)
        return None if target is None else target.capability
    p = properties(device)  # cached: torch's query costs ~10 us of host time a call
    return p.major, p.minor


def is_rocm(device: torch.device) -> bool:
    """True for a GPU under ROCm (torch.version.hip: torch's "cuda" devices are AMD GPUs there), which
    runs the portable Triton kernels only: never the NVIDIA-only Gluon, TMA or wgmma code."""
    if device.type == "cuda":
        return torch.version.hip is not None
    target = described(device)
    return target is not None and target.rocm


def is_hopper(device: torch.device) -> bool:
    """True on NVIDIA sm_90 devices, where the Gluon (TMA, wgmma) kernels run (not on ROCm, whose
    MI200 torch reports as capability (9, 0))."""
    return capability(device) == (9, 0) and not is_rocm(device)


def tensor_memory(device: torch.device) -> bool:
    """Whether ``device`` is an NVIDIA GPU with tensor memory (sm_100, sm_103: B200, B300), where Triton lowers
    ``tl.dot`` to tcgen05 through TMEM and its shared-memory use and compile paths differ from Hopper's for the
    same kernel (tilecore.portability compiles both; sm_120's consumer Blackwell has no TMEM: mma.sync there)."""
    cap = capability(device)
    return cap is not None and cap[0] == 10 and not is_rocm(device)


def tma_ok(device: torch.device) -> bool:
    """Whether the tl kernels' TMA descriptors are copied by TMA units on ``device``: NVIDIA from sm_90,
    and Triton's interpreter (which runs them as loads). Elsewhere Triton lowers descriptors to plain
    loads, which it does not pipeline: plans keep the pointer path there."""
    if interpreted(device) or is_hopper(device):
        return True
    cap = capability(device)
    return cap is not None and cap >= (9, 0) and not is_rocm(device)


def fp8_ok(device: torch.device) -> bool:
    """Whether ``device`` multiplies e4m3 (Triton's fp8e4nv) on its tensor cores: NVIDIA from sm_89.
    Elsewhere (sm_80, sm_86, ROCm) Triton refuses the type ("fp8e4nv not supported"), even to store it, so
    there gemm_fp8 converts its operands to float16 exactly, hadamard_quantize's e4m3 formats and
    rotate_quantize quantize with torch's ops, and attention_fp8 refuses. (ROCm: Triton compiles fp8e4nv for
    gfx90a, but no AMD GPU has run it here.)"""
    if is_hopper(device):
        return True
    cap = capability(device)
    return cap is not None and cap >= (8, 9) and not is_rocm(device)


def shared_memory_per_block(device: torch.device) -> int | None:
    """Bytes of shared memory (ROCm: LDS) one block may use on ``device``: what Triton checks a
    kernel's against when it loads it (the opt-in maximum, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    or where that cannot be asked, SHARED_MEMORY_PER_BLOCK's figure for its capability. That of the
    GPU a meta device stands for (:func:`pretend`); None for the CPU and the interpreter (no limit)."""
    if device.type != "cuda":
        target = described(device)
        return None if target is None else target.shared_memory
    real = _shared_memory(device.index if device.index is not None else torch.cuda.current_device())
    cap = _SHARED_MEMORY_CAP.get()
    return real if cap is None else min(real, cap)


_SHARED_MEMORY_CAP: contextvars.ContextVar[int | None] = contextvars.ContextVar("tilecore_shared_memory_cap",
                                                                                 default=None)


@contextlib.contextmanager
def limit_shared_memory(limit: int):
    """Within this context (this thread's, or task's), a CUDA device's blocks get at most ``limit`` bytes of shared
    memory as the plans see it (:func:`shared_memory_per_block`, so :func:`shared_memory_fit`): the
    configurations a smaller GPU gets, run on this one (experiments/portability/gpu_kvcache_fits.py checks
    them against float64 on the H100). Plans kept per call signature outside the context are not re-made: use
    inputs the process has not planned yet."""
    token = _SHARED_MEMORY_CAP.set(int(limit))
    try:
        yield limit
    finally:
        _SHARED_MEMORY_CAP.reset(token)


@functools.lru_cache(maxsize=None)
def _shared_memory(index: int) -> int:
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # noqa: BLE001 (a driver that cannot be asked: the documented figure)
        p = _properties(index)
        return shared_memory_for(p.major, p.minor, rocm=torch.version.hip is not None)


def shared_memory_fit(device: torch.device, rows, what: str):
    """The value of the first of ``rows`` ((bytes, value) pairs, bytes decreasing) whose bytes the
    shared memory a block gets on ``device`` reaches: an op's configurations for GPUs with less of it
    (configs.SHARED_FITS, checked by tilecore.portability on the GPUs each row serves). The first
    row's where there is no limit (the CPU, the interpreter). A GPU below every row gets a RuntimeError
    naming ``what`` and both sizes."""
    limit = shared_memory_per_block(device)
    if limit is None:
        return rows[0][1]
    for least, value in rows:
        if limit >= least:
            return value
    raise RuntimeError(f"{what} needs a GPU whose blocks get at least {rows[-1][0] // KIB} KiB of shared memory; "
                       f"this one gives {limit // KIB} KiB")


def shared_memory_for(major: int, minor: int, *, rocm: bool = False) -> int:
    """SHARED_MEMORY_PER_BLOCK's figure for a capability; an unknown NVIDIA one gets the least that
    its generation's parts give (a plan that fits it fits them all), ROCm 64 KiB."""
    if rocm:
        return ROCM_SHARED_MEMORY_PER_BLOCK
    known = SHARED_MEMORY_PER_BLOCK.get((major, minor))
    if known is not None:
        return known
    same_major = [v for (ma, _), v in SHARED_MEMORY_PER_BLOCK.items() if ma == major]
    return min(same_major or SHARED_MEMORY_PER_BLOCK.values())


def gpu_problem(device: torch.device) -> str | None:
    """Why tilecore's kernels cannot serve the CUDA ``device``, or None: NVIDIA GPUs from compute
    capability 8.0 (the tl kernels multiply bfloat16 on tensor cores and copy with cp.async, which
    sm_75 and older lack) and ROCm GPUs. :func:`backend_for` raises it."""
    if device.type != "cuda":
        return None
    return _gpu_problem(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _gpu_problem(index: int) -> str | None:
    if torch.version.hip is not None:
        return None
    p = _properties(index)
    if (p.major, p.minor) < MIN_CAPABILITY:
        return (f"tilecore's GPU kernels need an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"or newer (bfloat16 tensor cores); {p.name} is {p.major}.{p.minor}: move the tensors to the CPU, "
                "where tilecore runs torch's own kernels")
    return None


MIN_CAPABILITY = (8, 0)
KIB = 1024
# Bytes of shared memory one block may use, by NVIDIA compute capability: the CUDA C++ Programming
# Guide's per-capability table and the Ampere/Ada/Hopper/Blackwell tuning guides (each SM's shared
# memory, less the 1 KiB CUDA reserves per block). For a device whose driver cannot be asked.
SHARED_MEMORY_PER_BLOCK = {(7, 0): 96 * KIB, (7, 2): 96 * KIB, (7, 5): 64 * KIB,
                           (8, 0): 163 * KIB, (8, 6): 99 * KIB, (8, 7): 163 * KIB, (8, 9): 99 * KIB,
                           (9, 0): 227 * KIB, (10, 0): 227 * KIB, (10, 3): 227 * KIB,
                           (12, 0): 99 * KIB, (12, 1): 99 * KIB}
ROCM_SHARED_MEMORY_PER_BLOCK = 64 * KIB  # LDS per workgroup on CDNA2/CDNA3 (MI200, MI300)


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU as the plans see it and as Triton compiles for it, for compile-only sweeps and tests
    (:func:`pretend`): ``name`` Triton's architecture (sm_86, sm_90a, gfx90a), the compute capability
    torch reports for it (ROCm: the gfx architecture's), its SMs (compute units), the bytes of shared
    memory (LDS) one block may use, ROCm or not, and a GPU of the kind."""
    name: str
    capability: tuple[int, int]
    sms: int
    shared_memory: int
    rocm: bool = False
    example: str = ""

    def gpu_target(self):
        """Triton's GPUTarget for it (what tilecore.tiles.compile.compile_kernel takes)."""
        from triton.backends.compiler import GPUTarget

        if self.rocm:
            return GPUTarget("hip", self.name, 64)
        return GPUTarget("cuda", self.capability[0] * 10 + self.capability[1], 32)


# The GPUs tilecore's plans are checked for (tilecore.portability compiles every kernel a plan picks for
# each and checks its shared memory against the block's limit): SM counts of the example parts
TARGETS = {t.name: t for t in (
    Target("sm_80", (8, 0), 108, SHARED_MEMORY_PER_BLOCK[8, 0], example="A100"),
    Target("sm_86", (8, 6), 84, SHARED_MEMORY_PER_BLOCK[8, 6], example="A40, A10, RTX 3090"),
    Target("sm_89", (8, 9), 142, SHARED_MEMORY_PER_BLOCK[8, 9], example="L40S, L4, RTX 4090"),
    Target("sm_90a", (9, 0), 132, SHARED_MEMORY_PER_BLOCK[9, 0], example="H100"),
    Target("sm_100a", (10, 0), 148, SHARED_MEMORY_PER_BLOCK[10, 0], example="B200"),
    Target("sm_120a", (12, 0), 170, SHARED_MEMORY_PER_BLOCK[12, 0], example="RTX 5090"),
    Target("gfx90a", (9, 0), 110, ROCM_SHARED_MEMORY_PER_BLOCK, rocm=True, example="MI250X (one die), MI210"),
    Target("gfx942", (9, 4), 304, ROCM_SHARED_MEMORY_PER_BLOCK, rocm=True, example="MI300X"),
)}

# the GPU that meta devices stand for, inside pretend()
_PRETENDED: contextvars.ContextVar[Target | None] = contextvars.ContextVar("tilecore_pretended_gpu", default=None)


@contextlib.contextmanager
def pretend(target: Target):
    """Within this context (this thread's, or task's), meta tensors stand for tensors on a GPU described
    by ``target``: :func:`backend_for` gives them the kernels, and :func:`capability`, :func:`num_sms`,
    :func:`shared_memory_per_block`, :func:`is_rocm` (and so :func:`is_hopper`, :func:`gluon_ok`,
    :func:`tma_ok`, :func:`fp8_ok`) answer for ``target``. An op's own plan then picks, with no GPU
    here, what it would pick on that GPU (tilecore.portability compiles it); CUDA and CPU tensors are
    untouched."""
    token = _PRETENDED.set(target)
    try:
        yield target
    finally:
        _PRETENDED.reset(token)


def described(device: torch.device) -> Target | None:
    """The GPU a meta ``device`` stands for inside :func:`pretend`, else None."""
    return _PRETENDED.get() if device.type == "meta" else None


def _described_or_raise(device: torch.device) -> Target:
    target = described(device)
    if target is None:
        raise TypeError(f"tilecore runs on CUDA and CPU tensors; got a tensor on '{device.type}' "
                        "(meta tensors stand for a GPU only inside dispatch.pretend)")
    return target


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


# TRITON_PTXAS_PATH as the user set it (None: Triton's own ptxas). Not torch's bundled ptxas, which
# Inductor sets in the process when it compiles a kernel (torch/_inductor/runtime/compile_tasks.py):
# that is Inductor's choice, not the user's (tiles.launch.pin_ptxas)
_USER_PTXAS = os.environ.get("TRITON_PTXAS_PATH")
_PTXAS_LOCK = threading.Lock()


def inductor_ptxas(path: str | None) -> bool:
    """Whether ``path`` is torch's bundled ptxas (what torch.compile sets TRITON_PTXAS_PATH to)."""
    return path is not None and os.path.normpath(path) == os.path.normpath(
        os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas"))


if inductor_ptxas(_USER_PTXAS):
    _USER_PTXAS = None


def ptxas_is_users() -> bool:
    """Whether TRITON_PTXAS_PATH is now what the user set before importing tilecore."""
    return os.environ.get("TRITON_PTXAS_PATH") == _USER_PTXAS


@contextlib.contextmanager
def users_ptxas():
    """Within: TRITON_PTXAS_PATH as the user set it (unset: Triton's own ptxas), under a lock, and
    put back as it was after."""
    with _PTXAS_LOCK:
        current = os.environ.get("TRITON_PTXAS_PATH")
        if _USER_PTXAS is None:
            os.environ.pop("TRITON_PTXAS_PATH", None)
        else:
            os.environ["TRITON_PTXAS_PATH"] = _USER_PTXAS
        try:
            yield
        finally:
            if current is None:
                os.environ.pop("TRITON_PTXAS_PATH", None)
            else:
                os.environ["TRITON_PTXAS_PATH"] = current


@functools.lru_cache(maxsize=None)
def notice_once(message: str) -> None:
    """Print a notice to stderr the first time it is given (e.g. a slower fallback path)."""
    print(f"tilecore: {message}", file=sys.stderr)

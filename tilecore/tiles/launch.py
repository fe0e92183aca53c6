"""Launching a ``triton.jit`` kernel with less host time.

Triton 3.6 binds and specializes every argument in Python on each launch: about 40 us per call on the
lent H100's host (notes/hadamard.md), several times a small kernel's run time. ``CachedLaunch`` keys
the compiled kernel on exactly what Triton specializes (each argument's type and 16-byte alignment or
divisibility, the constexprs and the launch options) and calls it directly the next time.
"""
from __future__ import annotations

import functools

import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

from tilecore import dispatch


# Host arithmetic for launch sizes: triton.cdiv and triton.next_power_of_2 are constexpr_functions,
# ~2 us a host call (notes/attention.md, session 21)
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def specialization(arg) -> tuple:
    """What Triton compiles a kernel argument as: its type and alignment/divisibility class."""
    return native_specialize_impl(BaseBackend, arg, False, True, True)


class CachedLaunch:
    """``CachedLaunch(kernel)[grid](*args, **constexprs_and_options)``: same call as ``kernel[grid]``,
    on the device of the first CUDA tensor argument.

    Under Triton's interpreter, or if a Triton version's compiled-kernel runner differs, it launches
    through the JIT as usual.
    """

    OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict = {}
        self.fast = True
        self.constexpr_flags = None  # made at the first fast launch (an interpreted kernel has no params)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(tuple(grid), args, kwargs)

    def key(self, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        """(cache key, every argument in signature order): constexprs by value, the rest by
        Triton's specialization of them, plus the launch options."""
        ordered = list(args) + [kwargs[name] for name in self.kernel.arg_names[len(args):]]
        if self.constexpr_flags is None:
            self.constexpr_flags = [p.is_constexpr for p in self.kernel.params]
        # a list comprehension over precomputed flags: half the host time of a generator over params
        spec = tuple([repr(a) if constexpr else native_specialize_impl(BaseBackend, a, False, True, True)
                      for constexpr, a in zip(self.constexpr_flags, ordered)])
        options = tuple((k, kwargs[k]) for k in self.OPTIONS if k in kwargs)
        return (options, spec), ordered

    def _launch(self, grid, args, kwargs):
        # Triton launches on the current device: make it the device of the first CUDA tensor argument
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        with dispatch.on_device(device):
            return self._launch_here(grid, args, kwargs)

    def _launch_here(self, grid, args, kwargs):
        if dispatch.interpreter_enabled() or not self.fast:
            return self.kernel[grid](*args, **kwargs)
        key, ordered = self.key(args, kwargs)
        key = (torch.cuda.current_device(), key)
        compiled = self.compiled.get(key)
        if compiled is None:
            self.compiled[key] = self.kernel[grid](*args, **kwargs)
            return self.compiled[key]
        try:
            compiled[grid + (1,) * (3 - len(grid))](*ordered)
        except Exception as err:  # noqa: BLE001 - a triton whose runner differs: use the JIT from now on
            self.fast = False
            dispatch.notice_once(f"fast kernel launch off ({type(err).__name__}: {err})")
            return self.kernel[grid](*args, **kwargs)
        return compiled


def tma_describable(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe ``t`` as it is: unit stride along the last dimension, the
    base address and every other stride 16-byte aligned, rows of at least 16 bytes."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and t.shape[-1] * size >= 16
            and all((st * size) % 16 == 0 for st in t.stride()[:-1]))


@functools.lru_cache(maxsize=None)
def _nvmma_layout(block: tuple, dtype: torch.dtype):
    from triton.experimental.gluon import language as gl

    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
                torch.float8_e4m3fn: gl.float8e4nv}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype)


def gluon_descriptor(t: torch.Tensor, block: list[int], shape=None, strides=None):
    """A Gluon TMA descriptor of ``t`` (its shape and strides, or the view ``shape``/``strides`` of its
    memory) with boxes of ``block``, in the shared memory layout with the widest swizzle that block
    allows (what wgmma and TMA read fastest)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(shape or t.shape), list(strides or t.stride()), list(block),
                            _nvmma_layout(tuple(block), t.dtype))


_TILE_COUNTERS: dict = {}


def tile_counter(device: torch.device) -> torch.Tensor:
    """The int32 counter of a dynamic-tile launch (``tiles.gluon.persistent_pipeline``'s
    ``tile_counter``) on ``device``'s current stream: zero before its first launch, and every launch
    leaves it zero, so one counter a stream serves all its launches, one after another (a launch on
    another stream at the same time gets its own). Off CUDA (compile-only callers): a fresh zero."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.zeros(1, dtype=torch.int32, device=device)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    if key not in _TILE_COUNTERS:
        _TILE_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _TILE_COUNTERS[key]

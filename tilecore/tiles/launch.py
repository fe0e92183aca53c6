"""Launching ``triton.jit`` and ``gluon.jit`` kernels with less host time.

Triton 3.6 binds and specializes every argument in Python on each launch: about 40 us per call on the
lent H100's host (notes/hadamard/README.md), several times a small kernel's run time. ``CachedLaunch`` keys
the compiled kernel on exactly what Triton specializes (each argument's type and 16-byte alignment or
divisibility, the constexprs and the launch options) and calls it directly the next time. A Gluon
kernel's TMA operands go in as :class:`TmaOperand`: the launch that compiles gets the checked
TensorDescriptor, later ones hand Triton's launcher only what it reads (base, shape, strides).
"""
from __future__ import annotations

import functools

import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

from tilecore import dispatch


# Host arithmetic for launch sizes: triton.cdiv and triton.next_power_of_2 are constexpr_functions,
# ~2 us a host call (notes/attention/README.md, session 21)
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def specialization(arg) -> tuple:
    """What Triton compiles a kernel argument as: its type and alignment/divisibility class."""
    return native_specialize_impl(BaseBackend, arg, False, True, True)


class TmaOperand:
    """A Gluon kernel's TMA-described operand, for :class:`CachedLaunch`: ``t`` (or the view
    ``shape``/``strides`` of its memory) in boxes of ``block``, in ``layout`` (default: the widest
    swizzle the box allows, as gluon_descriptor). The launch that compiles the kernel gets the checked
    TensorDescriptor (:meth:`descriptor`); later launches hand this object to Triton's launcher, which
    reads only its base, shape, strides and padding (the box and the swizzle are compiled in), so a
    launch skips TensorDescriptor's checks and layout work."""

    __slots__ = ("base", "shape", "strides", "block_shape", "layout", "padding", "key")

    def __init__(self, t: torch.Tensor, block: list[int], shape=None, strides=None, layout=None):
        self.base = t
        self.shape = list(t.shape) if shape is None else list(shape)
        self.strides = list(t.stride()) if strides is None else list(strides)
        self.block_shape = list(block)
        self.layout = layout
        self.padding = "zero"
        # what Triton specializes a descriptor on: dtype, box and layout (and TMA needs 16-byte bases)
        self.key = ("tma", t.dtype, tuple(block), layout, t.data_ptr() % 16 == 0)

    def descriptor(self):
        """The checked TensorDescriptor (gluon_descriptor's, or in ``layout``)."""
        if self.layout is None:
            return gluon_descriptor(self.base, self.block_shape, self.shape, self.strides)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor(self.base, self.shape, self.strides, self.block_shape, self.layout)


def jit_arg(a):
    """A launch argument as Triton's JIT takes it (TmaOperand: its TensorDescriptor)."""
    return a.descriptor() if type(a) is TmaOperand else a


class CachedLaunch:
    """``CachedLaunch(kernel)[grid](*args, **constexprs_and_options)``: same call as ``kernel[grid]``,
    on the device of the first CUDA tensor argument. ``kernel`` may be a function returning the kernel
    (imported at the first launch: the Gluon modules load only where a launch needs them). Arguments
    may be :class:`TmaOperand` where the kernel takes a TMA descriptor.

    Under Triton's interpreter, or if a Triton version's compiled-kernel runner differs, it launches
    through the JIT as usual.
    """

    OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

    def __init__(self, kernel):
        self._kernel = kernel
        self.compiled: dict = {}
        self.fast = True
        self.constexpr_flags = None  # made at the first fast launch (an interpreted kernel has no params)
        self.named = None  # (name, default) of each parameter

    @property
    def kernel(self):
        if not hasattr(self._kernel, "arg_names"):  # a loader: import the kernel now
            self._kernel = self._kernel()
        return self._kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(tuple(grid), args, kwargs)

    def key(self, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        """(cache key, every argument in signature order, defaults filled in): constexprs by value,
        TMA operands by dtype, box and layout, the rest by Triton's specialization of them, plus the
        launch options."""
        if self.constexpr_flags is None:
            params = self.kernel.params
            self.constexpr_flags = [p.is_constexpr for p in params]
            self.named = [(p.name, p.default) for p in params]
        ordered = list(args)
        ordered += [kwargs.get(name, default) for name, default in self.named[len(args):]]
        # a list comprehension over precomputed flags: half the host time of a generator over params
        spec = tuple([repr(a) if constexpr else a.key if type(a) is TmaOperand
                      else native_specialize_impl(BaseBackend, a, False, True, True)
                      for constexpr, a in zip(self.constexpr_flags, ordered)])
        options = tuple((k, kwargs[k]) for k in self.OPTIONS if k in kwargs)
        return (options, spec), ordered

    def _launch(self, grid, args, kwargs):
        # Triton launches on the current device: make it the device of the first CUDA tensor argument
        device = next((t.device for t in (a.base if type(a) is TmaOperand else a for a in args)
                       if isinstance(t, torch.Tensor) and t.is_cuda), None)
        with dispatch.on_device(device):
            return self._launch_here(grid, args, kwargs)

    def _jit_launch(self, grid, args, kwargs):
        return self.kernel[grid](*map(jit_arg, args), **{k: jit_arg(a) for k, a in kwargs.items()})

    def _launch_here(self, grid, args, kwargs):
        if dispatch.interpreter_enabled() or not self.fast:
            return self._jit_launch(grid, args, kwargs)
        key, ordered = self.key(args, kwargs)
        key = (torch.cuda.current_device(), key)
        compiled = self.compiled.get(key)
        if compiled is None:
            self.compiled[key] = self._jit_launch(grid, args, kwargs)
            return self.compiled[key]
        try:
            compiled[grid + (1,) * (3 - len(grid))](*ordered)
        except Exception as err:  # noqa: BLE001 - a triton whose runner differs: use the JIT from now on
            self.fast = False
            dispatch.notice_once(f"fast kernel launch off ({type(err).__name__}: {err})")
            return self._jit_launch(grid, args, kwargs)
        return compiled


def tma_describable(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe ``t`` as it is: unit stride along the last dimension, the
    base address and every other stride 16-byte aligned, rows of at least 16 bytes."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and t.shape[-1] * size >= 16
            and all((st * size) % 16 == 0 for st in t.stride()[:-1]))


# The tl kernels address rows in 64 bits and a block's columns (at most this many) in 32 bits
# (tiles.ops.block_ptrs)
LARGEST_TL_BLOCK = 256


def tl_addressable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it where a tl kernel's column offsets within a block
    (LARGEST_TL_BLOCK columns times the last dimension's stride) would pass 2^31 elements. No usual
    layout comes near: the last dimension is contiguous, or transposed from a short one."""
    if t.stride(-1) * LARGEST_TL_BLOCK >= 2**31:
        return t.contiguous()
    return t


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
    """The int32 counter of a dynamic-tile launch (``tiles.gluon.pipeline.Layout.tile_counter``'s
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

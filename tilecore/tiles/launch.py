"""Launching ``triton.jit`` and ``gluon.jit`` kernels with less host time.

Triton 3.6 binds and specializes every argument in Python on each launch: about 40 us per call on the
lent H100's host (notes/hadamard/README.md), several times a small kernel's run time. ``CachedLaunch`` keys
the compiled kernel on exactly what Triton specializes (each argument's type and 16-byte alignment or
divisibility, the constexprs and the launch options) and calls it directly the next time. A Gluon
kernel's TMA operands go in as :class:`TmaOperand`: the launch that compiles gets the checked
TensorDescriptor, later ones hand Triton's launcher only what it reads (base, shape, strides).

Threads. The caches here fill under a lock and are read without one (:class:`LRU`), and every cache
is bounded. Triton's interpreter keeps a launch's state in module globals, so interpreted launches
run one at a time (:func:`serialize_interpreter`, installed on import).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import operator
import sys
import threading

import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

from tilecore import dispatch


# Host arithmetic for launch sizes: triton.cdiv and triton.next_power_of_2 are constexpr_functions,
# ~2 us a host call (found by cProfile; notes/attention/README.md)
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def specialization(arg) -> tuple:
    """What Triton compiles a kernel argument as: its type and alignment/divisibility class."""
    return native_specialize_impl(BaseBackend, arg, False, True, True)


# LRU's last lookup by key object and SameKey's kept key objects (issue 31's host time); False: every lookup hashes
# its key, every SameKey call makes a fresh tuple (read at each call: host_rows.py times both ways in one process)
SAME_KEYS = True


class LRU:
    """A dict of at most ``maxsize`` entries: a fill past that drops the least recently used entry, as
    the CLOCK (second-chance) algorithm tells it (an entry looked up since it last reached the front
    goes to the back instead, once). A lookup is one dict lookup and a flag set, with no lock and no
    reordering: a second lookup to move the entry would hash and compare the key again, which is ~1 us
    of CachedLaunch's freshly built key. A fill takes ``lock``, so that a first fill that must happen
    once can check and fill under it.

    The last lookup's answer (its entry, or none) is kept with the key object asked: a lookup by that same object (a
    call site's key kept by :class:`SameKey`, or a SignatureMemo hit's signature) takes it without hashing the key,
    which for a nested signature is most of a lookup. A fill or a clear forgets it (fills are what add and drop
    entries)."""

    __slots__ = ("_data", "maxsize", "lock", "_last")

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self._data: collections.OrderedDict = collections.OrderedDict()  # key: [value, used]
        self.maxsize = maxsize
        self.lock = threading.RLock()
        self._last = (None, None)  # (the key object of the last lookup, its entry or None)

    def get(self, key, default=None):
        last = self._last
        if last[0] is key and key is not None and SAME_KEYS:
            entry = last[1]
        else:
            entry = self._data.get(key)
            self._last = (key, entry)
        if entry is None:
            return default
        entry[1] = True
        return entry[0]

    def put(self, key, value) -> None:
        with self.lock:
            self._last = (None, None)
            data = self._data
            if key not in data:
                while len(data) >= self.maxsize:  # each turn drops an entry or clears a flag
                    old, entry = data.popitem(last=False)
                    if entry[1]:
                        entry[1] = False
                        data[old] = entry
            data[key] = [value, False]
            data.move_to_end(key)

    def memo(self, key, make):
        """The value kept for ``key``, made by ``make()`` and kept at the key's first lookup; ``make()``
        each call where ``key`` is None (an uncached call). A ``make`` that raises keeps nothing."""
        if key is None:
            return make()
        value = self.get(key)
        if value is None:
            value = make()
            self.put(key, value)
        return value

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key) -> bool:
        last = self._last
        if last[0] is key and key is not None and SAME_KEYS:
            return last[1] is not None
        return key in self._data

    def clear(self) -> None:
        with self.lock:
            self._last = (None, None)
            self._data.clear()




class SameKey:
    """One call site's composite launch key (a tuple of parts: an op's name, ``switches.generation()``, a SignatureMemo
    hit's signature, a flag) as the same tuple object while every part is the same object as at the site's last call,
    so that the LRUs looked up by it find their entry by identity (:class:`LRU`'s last entry) without hashing the
    nested signature (linear_attention's recorded call looked its nested key up five times). Parts compared by
    identity only: an equal key built from other objects is a new tuple, looked up the usual way."""

    __slots__ = ("_key",)

    def __init__(self):
        self._key = ()

    def __call__(self, *parts):
        key = self._key
        if SAME_KEYS and len(key) == len(parts):
            for kept, part in zip(key, parts):
                if kept is not part:
                    break
            else:
                return key
        self._key = parts
        return parts


class TmaOperand:
    """A Gluon kernel's TMA-described operand, for :class:`CachedLaunch`: ``t`` (or the view
    ``shape``/``strides`` of its memory) in boxes of ``block``, in ``layout`` (default: the widest
    swizzle the box allows, as gluon_descriptor). The launch that compiles the kernel gets the checked
    TensorDescriptor (:meth:`descriptor`); later launches hand this object to Triton's launcher, which
    reads only its base, shape, strides and padding (the box and the swizzle are compiled in), so a
    launch skips TensorDescriptor's checks and layout work. ``round_f32_to_tf32``: the field triton 3.7 added to
    Gluon's TensorDescriptor, which its launcher reads (False: TensorDescriptor's default, the one tilecore's
    descriptors take); without it tma_operand_problem turned every kept launch of a TMA kernel off under 3.7-3.9."""

    __slots__ = ("base", "shape", "strides", "block_shape", "layout", "padding", "round_f32_to_tf32")

    def __init__(self, t: torch.Tensor, block: list[int], shape=None, strides=None, layout=None):
        self.base = t
        self.shape = list(t.shape) if shape is None else list(shape)
        self.strides = list(t.stride()) if strides is None else list(strides)
        self.block_shape = list(block)
        self.layout = layout
        self.padding = "zero"
        self.round_f32_to_tf32 = False

    @property
    def key(self) -> tuple:
        """What Triton specializes a descriptor on: dtype, box and layout (and TMA needs 16-byte bases). Made
        where a launch is looked up by it (CachedLaunch.key), not by a keyed hit (host time)."""
        return ("tma", self.base.dtype, tuple(self.block_shape), self.layout, self.base.data_ptr() % 16 == 0)

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

    The first launch of a key goes through Triton's JIT (compiling if need be) and keeps the compiled
    kernel; later launches call it directly. Before a compiled kernel is kept, :func:`fast_path_problem`
    checks that it can be called so (the runner this Triton's compiled kernel gives, every argument in
    its signature, TmaOperand carrying every field Triton's TensorDescriptor has); where it cannot,
    this kernel launches through the JIT from then on. Nothing else turns the fast path off: an error
    of a launch propagates, and no launch is ever made twice. Under Triton's interpreter it launches
    through the JIT.

    Thread-safe: the first-time setup and the cache fills take a lock (a key's first launch, the only
    one that compiles, is made under it); a cached launch takes none. At most ``maxsize`` compiled
    kernels are kept (least recently used out first; one dropped is found again in Triton's own cache).
    """

    OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

    def __init__(self, kernel, maxsize: int = 256):
        self._kernel = kernel
        self._loaded = hasattr(kernel, "arg_names")
        self.compiled = LRU(maxsize)
        self.keyed = LRU(maxsize)  # launch_keyed: the caller's key -> a compiled kernel of self.compiled
        self.fast = True
        self._lock = threading.RLock()
        # (is_constexpr of each parameter, (name, default) of each): made at the first fast launch (an
        # interpreted kernel has no params); one tuple, so a thread sees both or neither
        self._signature = None

    @property
    def kernel(self):
        if not self._loaded:  # a loader: import the kernel now, once
            with self._lock:
                if not self._loaded:
                    self._kernel = self._kernel()
                    self._loaded = True
        return self._kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(tuple(grid), args, kwargs)

    def _load_signature(self):
        with self._lock:
            if self._signature is None:
                params = self.kernel.params
                self._signature = ([p.is_constexpr for p in params], [(p.name, p.default) for p in params])
            return self._signature

    def key(self, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        """(cache key, every argument in signature order, defaults filled in): constexprs by value,
        TMA operands by dtype, box and layout, the rest by Triton's specialization of them, plus the
        launch options."""
        constexpr_flags, named = self._signature or self._load_signature()
        ordered = list(args)
        ordered += [kwargs.get(name, default) for name, default in named[len(args):]]
        # a list comprehension over precomputed flags: half the host time of a generator over params
        spec = tuple([repr(a) if constexpr else a.key if type(a) is TmaOperand
                      else native_specialize_impl(BaseBackend, a, False, True, True)
                      for constexpr, a in zip(constexpr_flags, ordered)])
        options = tuple((k, kwargs[k]) for k in self.OPTIONS if k in kwargs)
        return (options, spec), ordered

    def run(self, key, grid, args: tuple, kwargs: dict):
        """``self[grid](*args, **kwargs)``, or with a launch ``key`` (an op's call signature with what its
        plan reads: :meth:`launch_keyed`'s contract) the keyed launch, on the device of the first CUDA
        tensor argument. One call site for ops that launch keyed on their eager path and plainly else."""
        if key is None:
            return self._launch(tuple(grid), args, kwargs)
        entry = self.keyed.get(key)
        if entry is not None and entry[2] == _current_cuda_device():  # a hit on its device: no device guard
            return self._keyed_hit(entry, tuple(grid), args, kwargs)
        with dispatch.on_device(_device_of(args)):
            return self.launch_keyed(key, tuple(grid), args, kwargs)

    def launch_keyed(self, key, grid, args, kwargs):
        """``self[grid](*args, **kwargs)`` for a CUDA launch on the current device, looked up by the
        caller's ``key`` instead of by what Triton specializes: ~10 us less host time a call.

        The caller's contract: ``key`` names the device and determines every argument's specialization
        (the constexprs and options, and of each tensor its dtype and 16-byte alignment, of each int
        whether it is 1 or divisible by 16). An op's signature (:func:`signature` of its inputs, with
        its plan) does, where the launch's ints are sizes and strides of those inputs and its other
        tensors are fresh allocations. A key's first launch goes the checked way (:meth:`_launch`)."""
        entry = self.keyed.get(key)
        if entry is None:
            compiled = self._launch(grid, args, kwargs)
            if self.fast and not dispatch.interpreter_enabled():
                # (the key names the device: the current one here, which run() compares before skipping
                # the device guard)
                self.keyed.put(key, (compiled, direct_launch(compiled), _current_cuda_device(),
                                     self._constexpr_tail(args, kwargs)))
            return compiled
        return self._keyed_hit(entry, grid, args, kwargs)

    def _constexpr_tail(self, args, kwargs):
        """(len(args), the parameters after them as this launch gives them) where every one of those is a
        constexpr (a key fixes their values: launch_keyed's contract), so a keyed hit with as many positional
        arguments appends them as they are; None otherwise (a hit then reads them from its kwargs)."""
        constexpr_flags, named = self._signature or self._load_signature()
        if not all(constexpr_flags[len(args):]):
            return None
        return len(args), [kwargs.get(name, default) for name, default in named[len(args):]]

    def _keyed_hit(self, entry, grid, args, kwargs):
        """A keyed launch found (launch_keyed's cached path), on the current device."""
        compiled, direct, _, tail = entry
        if tail is not None and tail[0] == len(args):  # the key's constexprs: no lookup of each in kwargs
            ordered = [*args, *tail[1]]
        else:
            named = self._signature[1]
            ordered = list(args)
            if len(ordered) < len(named):
                ordered += [kwargs.get(name, default) for name, default in named[len(args):]]
        if len(grid) != 3:
            grid = grid + (1,) * (3 - len(grid))
        if direct is None or _launch_hooks():
            compiled[grid](*ordered)
        else:
            direct(grid, ordered)
        return compiled

    def _launch(self, grid, args, kwargs):
        # Triton launches on the current device: make it the device of the first CUDA tensor argument
        with dispatch.on_device(_device_of(args)):
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
            return self._first_launch(key, grid, args, kwargs, ordered)
        compiled[grid + (1,) * (3 - len(grid))](*ordered)  # an error propagates; nothing is relaunched
        return compiled

    def _first_launch(self, key, grid, args, kwargs, ordered):
        """A key's first launch, through the JIT (the one that compiles), under the lock: two threads
        launching a new key at once launch once each, and compile once."""
        with self._lock:
            compiled = self.compiled.get(key)
            if compiled is None or not self.fast:
                compiled = self._jit_launch(grid, args, kwargs)
                problem = fast_path_problem(compiled, ordered)
                if problem is None:
                    self.compiled.put(key, compiled)
                else:  # found before any fast launch of this kernel: the JIT from now on
                    self.fast = False
                    dispatch.notice_once(f"fast kernel launch off for {getattr(self.kernel, '__name__', '?')}"
                                         f" ({problem})")
                return compiled
        compiled[grid + (1,) * (3 - len(grid))](*ordered)  # another thread filled it meanwhile
        return compiled


class KeyedLaunch:
    """One kernel's launches under one launch key, grid and set of keyword arguments (an op's plan holds one per
    kernel it launches): ``bound(args)`` is ``kernel.run(key, grid, args, kwargs)`` (launch_keyed's contract: the
    key determines every argument's specialization, ``args`` has as many entries each call, and ``kwargs`` holds
    constexprs and launch options only: what varies from call to call goes in ``args``). Once the key's
    compiled kernel is found it is kept here with the grid and the constexpr tail in launch order, so a later
    launch looks up nothing (no hash of the key, no dict of keyword arguments read): issue 31's host time.

    ``operands``: {position in args: a function making that TMA descriptor's TmaOperand of the tensor there}, for a
    Gluon kernel whose descriptors' views the key fixes (their shapes, strides and boxes: functions of the key's
    inputs). Those positions then take the tensor itself; a kept launch encodes each descriptor once per base
    address (no TmaOperand made, nothing but the address looked up: direct_launch's ``operands``). ``derived``:
    {name of a descriptor parameter after args: (position in args of its tensor, the function making its
    TmaOperand)}, for descriptors a kernel takes by keyword (fft_conv's u_desc of its U).

    A launch on another device than the kept one, under a launch hook (a profiler's), or of a kernel the fast path
    cannot call goes through ``kernel.run`` as before. :data:`BIND_KEYED_LAUNCHES` False: every launch through
    ``kernel.run`` (host_time.py times both ways in one process)."""

    __slots__ = ("kernel", "key", "grid", "kwargs", "operands", "derived", "_hit")

    def __init__(self, kernel: CachedLaunch, key, grid, kwargs: dict, operands: dict | None = None,
                 derived: dict | None = None):
        if key is None:
            raise ValueError("KeyedLaunch needs a launch key")
        self.kernel, self.key, self.kwargs = kernel, key, kwargs
        self.operands, self.derived = operands or None, derived or None
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        # (device, number of args, compiled, direct launch or None, constexpr tail, (position in the launch's
        # arguments, position in args) of each derived descriptor, {position: TmaOperand maker} over the launch's
        # arguments); None: not found yet; False: never (a keyword argument that is not a constexpr)
        self._hit = None

    def __call__(self, args: tuple):
        hit = self._hit
        if hit and BIND_KEYED_LAUNCHES and len(args) == hit[1] and hit[0] == (device := _current_cuda_device()):
            ordered = [*args, *hit[4]]
            for position, source in hit[5]:
                ordered[position] = args[source]
            if hit[3] is None or _launch_hooks():
                makers = hit[6]
                hit[2][self.grid](*(makers[i](a) if i in makers else a for i, a in enumerate(ordered)))
            else:
                hit[3](self.grid, ordered, device)  # (the device read once: its stream's lookup takes it)
            return hit[2]
        kwargs = self.kwargs
        if self.derived is not None:
            kwargs = dict(kwargs, **{name: make(args[source]) for name, (source, make) in self.derived.items()})
        operands = self.operands or {}
        compiled = self.kernel.run(self.key, self.grid,
                                   tuple(operands[i](a) if i in operands else a for i, a in enumerate(args)), kwargs)
        if hit is None:
            self._bind(args)
        return compiled

    @staticmethod
    def all_kept(*launches) -> bool:
        """Whether the next launch of each goes the kept way (:meth:`kept`), the current device read once."""
        if not BIND_KEYED_LAUNCHES:
            return False
        device = _current_cuda_device()
        return all(hit and hit[0] == device for hit in (launch._hit for launch in launches))

    def kept(self) -> bool:
        """Whether the next launch with as many arguments goes the kept way (on this device, the switch on): its
        pointer arguments may then be plain ints (addresses; Triton's launcher reads an int as the pointer), as
        no specialization reads them. Other launches need tensors."""
        hit = self._hit
        return bool(hit) and BIND_KEYED_LAUNCHES and hit[0] == _current_cuda_device()

    def _bind(self, args) -> None:
        entry = self.kernel.keyed.get(self.key)  # (compiled, direct, device, tail): kept by launch_keyed
        if entry is None:  # (the interpreter, or a kernel the fast path cannot call: kernel.run each launch)
            return
        compiled, direct, device, _ = entry
        constexpr_flags, named = self.kernel._signature or self.kernel._load_signature()
        names = [name for name, _ in named[len(args):]]
        derived = self.derived or {}
        if any(name not in names for name in derived):
            self._hit = False
            return
        tail = [None if name in derived else self.kwargs.get(name, default) for name, default in named[len(args):]]
        # a parameter after args that is not a constexpr may only be absent (None) or derived: a value there would
        # be per call
        if any(not constexpr and value is not None for constexpr, value in zip(constexpr_flags[len(args):], tail)):
            self._hit = False
            return
        placed = tuple((len(args) + names.index(name), source) for name, (source, _) in derived.items())
        makers = dict(self.operands or {})
        makers.update({position: derived[names[position - len(args)]][1] for position, _ in placed})
        if makers and direct is not None:  # descriptors encoded per base address
            direct = direct_launch(compiled, makers)  # (None: not the launcher it knows: the runner, TmaOperands)
        self._hit = (device, len(args), compiled, direct, tail, placed, makers)


def split_key_buffers(like, lse_offset: int, lse_size: int, launches, merged_rows: int | None = None):
    """A split-key pass's partial O and lse in one float32 allocation (the split and merge kernels take pointers
    alone): O's part first, lse's part at ``lse_offset`` (16-byte aligned), and given ``merged_rows`` room for the
    merged lse after them (16-byte aligned: a call returning O alone keeps it there). (parts, lse_part, merged lse
    or None): the last two by address where every one of ``launches`` goes the kept way (KeyedLaunch.all_kept, which
    takes ints for pointers), else views of ``parts``. ``like``: a tensor on the device (allocated by its new_empty:
    no device= parsed, ~1 us less host time on the H100's) or the device. Where :func:`scratch` gives a raw block
    (RAW_SCRATCH on, every launch kept) ``parts`` is its address, which the caller hands to :func:`release` once the
    launches are queued."""
    lse_at = cdiv(lse_offset + lse_size, 4) * 4
    merged = merged_rows is not None
    size = (lse_at + merged_rows if merged else lse_offset + lse_size,)
    address = scratch(4 * size[0], launches)  # (a raw block where RAW_SCRATCH: the caller releases it)
    if address is not None:
        return address, address + 4 * lse_offset, (address + 4 * lse_at if merged else None)
    parts = like.new_empty(size, dtype=torch.float32) if isinstance(like, torch.Tensor) \
        else torch.empty(size, dtype=torch.float32, device=like)
    if KeyedLaunch.all_kept(*launches):
        address = parts.data_ptr()
        return parts, address + 4 * lse_offset, (address + 4 * lse_at if merged else None)
    return parts, parts[lse_offset:], (parts[lse_at:] if merged else None)


def scratch(nbytes: int, launches) -> int | None:
    """An internal buffer of ``nbytes`` for launches that all go the kept way (their pointer arguments may be ints) as
    a raw block of torch's caching allocator on the current device's current stream (its address), where
    :data:`RAW_SCRATCH` is on; None otherwise (the caller allocates a tensor). The caller hands it to :func:`release`
    once the launches that use it are queued (try / finally): the block goes back to the allocator stream-ordered,
    as a tensor freed then does (its next user on the stream runs after those launches; under a CUDA graph capture it
    comes from and returns to the graph's pool, as a tensor's memory does). The same memory a tensor would be given,
    without the tensor: no Python object made and freed, no sizes or dtype parsed."""
    if not RAW_SCRATCH or _RAW_ALLOC is None or _RAW_STREAM is None or not BIND_KEYED_LAUNCHES:
        return None
    device = _current_cuda_device()
    if device is None:
        return None
    for launch in launches:
        hit = launch._hit
        if not hit or hit[0] != device:
            return None
    return _RAW_ALLOC(nbytes, _RAW_STREAM(device))


def release(buffer) -> None:
    """Give :func:`scratch`'s block back to the caching allocator (anything else, a tensor or None: nothing)."""
    if type(buffer) is int:
        _RAW_DELETE(buffer)


# internal buffers of kept launches as raw blocks of the caching allocator (scratch); False: tensors. Read each call.
# On: the same bits and float64 checks on the H100, 0.81-0.92x the host time of the rows it serves (paged decode,
# varlen, attention's split-key decode) in two A/Bs (notes/host's decision log)
RAW_SCRATCH = True
# torch's caching allocator's raw blocks (what tensors' memory comes from), None in a torch without CUDA
_RAW_ALLOC = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
_RAW_DELETE = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)


# KeyedLaunch's kept launches; False: each through CachedLaunch.run, looked up by key
BIND_KEYED_LAUNCHES = True


# the per-key recipes of gemm / gemm_fp8, layer_norm / rms_norm and linear attention (their eager calls through
# KeyedLaunch); False: those ops' general keyed paths (read each call; host_time.py --ab-lean times both)
OP_RECIPES = True


def keep_op_recipes(on: bool) -> None:
    """Turn OP_RECIPES on or off from the next call on."""
    global OP_RECIPES
    OP_RECIPES = bool(on)


# ... and attention's and linear attention's Gluon forward recipes: on (the same bits; attention N1024 at 4 heads
# 23.7 against 55.5 us a call on the H100; notes/host/runs/host_fwd33_run2_session33_h100.txt and notes/host's
# decision log). Read each call, with OP_RECIPES
FORWARD_RECIPES = True


def keep_forward_recipes(on: bool) -> None:
    """Turn FORWARD_RECIPES on or off from the next call on."""
    global FORWARD_RECIPES
    FORWARD_RECIPES = bool(on)


def bind_keyed_launches(on: bool) -> None:
    """Turn KeyedLaunch's kept launches on or off from the next launch on (read at each launch)."""
    global BIND_KEYED_LAUNCHES
    BIND_KEYED_LAUNCHES = bool(on)


# torch.cuda.current_device's C call, without its lazy-init check (~1 us of host time on the H100's host): asked
# only once a launch has been made (CUDA is initialized then). None in a torch without CUDA
_CUDA_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)


def _current_cuda_device() -> int | None:
    """torch's current CUDA device index (None where torch has no CUDA: tests that fake a launch)."""
    try:
        return torch.cuda.current_device() if _CUDA_GET_DEVICE is None else _CUDA_GET_DEVICE()
    except (AssertionError, RuntimeError):
        return None


def _device_of(args) -> torch.device | None:
    """The device of the first CUDA tensor among launch arguments (a TmaOperand's base counts)."""
    return next((t.device for t in (a.base if type(a) is TmaOperand else a for a in args)
                 if isinstance(t, torch.Tensor) and t.is_cuda), None)


# Triton 3.6's launcher convention, as its NVIDIA driver module states it: _BASE_ARGS_FORMAT_LEN base arguments
# (13), then the kernel's (3.7 on: the hooks first and the kernel's arguments as one tuple)
LAUNCHER_BASE_ARGS = 13


def launcher_convention_36(driver_module) -> bool:
    """Whether a triton NVIDIA driver module (its CudaLauncher's) launches with 3.6's argument layout, the one
    direct_launch and descriptor_expander call the launcher with."""
    return getattr(driver_module, "_BASE_ARGS_FORMAT_LEN", None) == LAUNCHER_BASE_ARGS


def direct_launch(compiled, operands: dict | None = None):
    """``go(grid3, ordered)``, launching ``compiled`` as its runner does (``compiled[grid3](*ordered)``)
    without the runner's Python: Triton 3.6's runner makes a closure and a launch-metadata dict and its
    launcher allocates scratch through two more closures, ~5 us of host time a launch together. Made
    only for a CudaLauncher that needs no scratch memory, whose parts are all where 3.6 has them;
    None otherwise (the runner then). CachedLaunch uses it only while no launch hook is installed
    (a profiler's: :func:`_launch_hooks`). 3.6's convention is checked by its driver module's
    ``_BASE_ARGS_FORMAT_LEN`` (13 base arguments, then the kernel's): triton 3.7 on passes the hooks first and the
    kernel's arguments as one tuple after their annotations, which this call would hand the wrong values (found
    under the compat matrix's 3.7-3.9, whose kernels were compile-checked but whose launches never ran)."""
    run = getattr(compiled, "run", None)
    function = getattr(compiled, "function", None)
    packed = getattr(compiled, "packed_metadata", None)
    if type(run).__name__ != "CudaLauncher" or function is None or packed is None:
        return None
    if not launcher_convention_36(sys.modules.get(type(run).__module__)):
        return None
    launch = getattr(run, "launch", None)
    if launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1) \
            or not hasattr(run, "launch_cooperative_grid") or not hasattr(run, "launch_pdl"):
        return None
    try:
        from triton.runtime.driver import driver
        stream_of, current_device = driver.active.get_current_stream, driver.active.get_current_device
    except Exception:  # noqa: BLE001 (a driver without these: the runner)
        return None
    if current_device is torch.cuda.current_device and _CUDA_GET_DEVICE is not None:
        current_device = _CUDA_GET_DEVICE  # the same index, without the lazy-init check (CUDA runs by now)
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
    parts = descriptor_expander(launch, operands)
    if parts is not None:  # Gluon TMA descriptors: the raw launcher, descriptors encoded once per layout
        raw, expand = parts

        def go_expanded(grid, ordered, device=None):
            stream = stream_of(current_device() if device is None else device)
            # the switch read each launch (a module global: ~20 ns), so a process can time both ways
            if CACHE_TMA_DESCRIPTORS:
                raw(grid[0], grid[1], grid[2], stream, function, cooperative, pdl, None, None, packed, None, None, None,
                    *expand(ordered))
            else:
                if operands is not None:  # (tensors at the descriptors' positions: their TmaOperands)
                    ordered = [operands[i](a) if i in operands else a for i, a in enumerate(ordered)]
                launch(grid[0], grid[1], grid[2], stream, function, cooperative, pdl, None, None, packed, None, None,
                       None, *ordered)

        return go_expanded
    if operands is not None:  # descriptors named where the launcher has none it knows: the runner
        return None

    def go(grid, ordered, device=None):
        """``device``: the current device's index where the caller read it already (KeyedLaunch)."""
        launch(grid[0], grid[1], grid[2], stream_of(current_device() if device is None else device), function,
               cooperative, pdl, None, None, packed, None, None, None, *ordered)

    return go


# Direct launches of kernels with TMA descriptors keep each descriptor's encoding (descriptor_expander);
# False: Triton's launcher encodes every descriptor on every launch. On: the same bits, gemm 42.6 us a call
# against 49.8 on the H100 (notes/host/runs/host_time_*_ab_run3_session30_h100.txt, notes/host's decision log)
CACHE_TMA_DESCRIPTORS = True


def cache_tma_descriptors(on: bool) -> None:
    """Turn descriptor_expander's kept encodings on or off, from the next launch on (every direct launch of a
    kernel with TMA descriptors reads the switch each launch: host_time.py times both in one process)."""
    global CACHE_TMA_DESCRIPTORS
    CACHE_TMA_DESCRIPTORS = bool(on)
TMA_ENCODINGS_KEPT = 64  # a descriptor argument's encodings kept (per compiled kernel and argument)


def descriptor_expander(launch, operands: dict | None = None):
    """(raw, expand) for a Triton 3.6 launcher ``launch`` that wraps the compiled launcher to encode TMA
    descriptors (driver.wrap_handle_tensordesc's ``inner``): ``raw`` the compiled launcher, and
    ``expand(ordered)`` the kernel arguments as ``inner`` hands them to it, each descriptor argument
    (TmaOperand or TensorDescriptor) replaced by Triton's own encoding of it (make_tensordesc_arg: the
    CUtensorMap and its shape and strides), kept per (base address, shape, strides, padding): an encoding
    reads nothing else of the tensor (the box, swizzle and element type are the compiled kernel's
    metadata), so a kept one is the one Triton would make again. None where ``launch`` is not that
    wrapper as 3.6 writes it, or a descriptor has no metadata (Triton's encoding then holds the tensor
    itself: not kept)."""
    code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or cells is None or getattr(launch, "__name__", "") != "inner":
        return None
    free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    raw, indices, metas = free.get("launcher"), free.get("tensordesc_indices"), free.get("tensordesc_meta")
    encode = getattr(launch, "__globals__", {}).get("make_tensordesc_arg")
    base = getattr(launch, "__globals__", {}).get("_BASE_ARGS_FORMAT_LEN")
    if raw is None or not isinstance(indices, (set, frozenset)) or metas is None or encode is None \
            or base != LAUNCHER_BASE_ARGS \
            or len(metas) != len(indices) or any(m is None for m in metas):
        return None
    slots = [(position, meta, LRU(TMA_ENCODINGS_KEPT)) for position, meta in zip(sorted(indices), metas)]
    if operands is not None:
        if set(operands) != set(indices):
            return None
        return raw, _fixed_expander(slots, operands, encode)

    def expand(ordered):
        out, start = [], 0
        for position, meta, kept in slots:
            out += ordered[start:position]
            d = ordered[position]
            key = (d.base.data_ptr(), tuple(d.shape), tuple(d.strides), d.padding)
            encoded = kept.get(key)
            if encoded is None:
                encoded = encode(d, meta)
                kept.put(key, encoded)
            out += encoded
            start = position + 1
        out += ordered[start:]
        return out

    return raw, expand


def _fixed_expander(slots, operands: dict, encode):
    """descriptor_expander's ``expand`` for descriptors whose views a launch key fixes (KeyedLaunch's ``operands``):
    the tensor itself at each descriptor's position, its encoding kept per base address (the shape, strides, box
    and padding are the key's: ``operands[position](tensor)`` makes the TmaOperand Triton would encode). Each slot's
    last (address, encoding) is looked at first: an eager loop hands the same inputs, and the caching allocator gives
    a fresh output the address it freed last, so most launches hash no address (issue 31's host time)."""
    slots = [(position, meta, kept, [None]) for position, meta, kept in slots]  # (the last: one tuple, replaced whole)

    def expand(ordered):
        out, start = [], 0
        for position, meta, kept, last in slots:
            out += ordered[start:position]
            t = ordered[position]
            address = t.data_ptr()
            seen = last[0]
            if seen is not None and seen[0] == address:
                encoded = seen[1]
            else:
                encoded = kept.get(address)
                if encoded is None:
                    encoded = encode(operands[position](t), meta)
                    kept.put(address, encoded)
                last[0] = (address, encoded)
            out += encoded
            start = position + 1
        out += ordered[start:]
        return out

    return expand


def _launch_hooks() -> bool:
    """Whether a Triton launch hook is installed (then every launch goes through the runner, which
    calls them)."""
    runtime = _RUNTIME[0]
    if runtime is None:
        try:
            from triton import knobs
            runtime = _RUNTIME[0] = knobs.runtime
        except Exception:  # noqa: BLE001
            return True
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True)) or (leave is not None and getattr(leave, "calls", True)))


_RUNTIME = [None]  # triton.knobs.runtime, once imported


def signature(*items) -> tuple | None:
    """A call's signature for the host-side caches (plans, :meth:`CachedLaunch.launch_keyed`): of each
    tensor what plans and Triton's specialization read (shape, strides, dtype, device, a 16-byte
    aligned base); other items as they are. None where a tensor is not a plain CUDA tensor: CPU,
    interpreted and subclassed tensors take the uncached path (their plans may change with the
    environment, and their host time is not the point there)."""
    out = []
    for t in items:
        kind = type(t)  # (exact types first: two isinstance calls fewer an item on the common path)
        if kind is torch.Tensor:
            if not t.is_cuda:
                return None
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or kind in _KEY_SCALAR_TYPES:
            out.append(t)
        elif isinstance(t, torch.Tensor):  # a subclass: uncached
            return None
        elif isinstance(t, _KEY_SCALARS):
            out.append(t)
        else:  # not what a cache key holds (an argument the checks will refuse, say): uncached
            return None
    return tuple(out)


_KEY_SCALARS = (bool, int, float, str, torch.dtype)
_KEY_SCALAR_TYPES = frozenset(_KEY_SCALARS)


try:  # one C call checks a list of tensors' metadata against the metadata they had (torch.compile's guards)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # a torch without it: SignatureMemo is signature()
    _TensorGuards = None

# SignatureMemo's check against a call site's last signature (issue 31's host time); False: every
# call builds its signature (read at each call: host_time.py times both ways in one process)
MEMO_SIGNATURES = _TensorGuards is not None


def memo_signatures(on: bool) -> None:
    """Turn SignatureMemo's check of the last call's signature on or off, from the next call on."""
    global MEMO_SIGNATURES
    MEMO_SIGNATURES = bool(on) and _TensorGuards is not None


def _picker(positions: list[int]):
    """items -> the tuple of items at ``positions`` (operator.itemgetter, always a tuple)."""
    if len(positions) == 1:
        i = positions[0]
        return lambda items: (items[i],)
    return operator.itemgetter(*positions)


class SignatureMemo:
    """:func:`signature` for one call site (an op keeps one per call it keys), 0.5-0.9x its host time for 2-7 tensors
    where the site's call repeats the signature of the one before (an eager loop, a model's layers; this machine's
    CPU: kvcache's 7 tensors 0.52x, attention's 3 0.66x, the norm's 3 0.70x, gemm's 2 0.88x; one tensor
    1.29x, so hadamard keeps signature()): the last repeated signature is
    kept with torch's C-level check of its tensors (``TensorGuards``, torch.compile's own tensor guard), and a call
    whose items pass the check gets that signature object back without reading each tensor in Python.

    Why a hit is the signature :func:`signature` would build (a wrong hit is impossible): the kept entry was built
    from a call whose signature was not None (every tensor a plain CUDA tensor, every other item a key scalar or
    None). A hit needs (1) the same type at every position (``tuple(map(type, items))``, exact types: a tensor or
    an array where a scalar was, or a subclass where a tensor was, misses); (2) the non-tensor items equal to the
    kept ones (``==`` among those exact types: what the plan LRUs' dict lookup of a fresh signature compares);
    (3) ``TensorGuards.check`` of the tensors: each one's exact Python type, dispatch key set (the backend: CUDA),
    dtype, device index, requires_grad, number of dimensions, and every size and stride equal to the kept call's
    (all dimensions static: dynamic_dims None); (4) every tensor's base 16-byte aligned, as the kept call's all
    were (an entry is kept only where they all were). (1)-(4) cover each part of the signature: shape, strides,
    dtype, device (type by the dispatch keys, index), alignment, and the scalars; the check reads the tensors'
    current metadata, so an in-place resize, ``set_`` or ``as_strided_`` since the last call misses. The check
    keeps no reference to the tensors.

    A site whose calls alternate between signatures would rebuild its entry every call: an entry is built only
    where a call's signature equals the site's previous miss's (a signature seen twice in a row), so such a site
    pays one failed check (~0.3 us) over :func:`signature`. Thread-safe: the entry is one tuple, replaced whole
    (a race loses an entry, never mixes two). :data:`MEMO_SIGNATURES` False: :func:`signature` each call.

    ``namespace``: the calling module's globals, whose ``signature`` builds a miss's signature (looked up each call,
    and an entry hits only while it is the function that built it: a test that replaces the module's
    ``signature`` gets its own answers); None: :func:`signature`."""

    __slots__ = ("_last", "_missed", "_refused", "_namespace")

    def __init__(self, namespace: dict | None = None):
        # (types, tensors picker, scalars picker, the scalars, TensorGuards of the tensors, the signature, the
        # function that built it, the aliased positions) or None
        self._last = None
        self._missed = None  # the last signature built on a miss
        self._refused = None  # the last signature no entry could be made for (not tried again while it repeats)
        self._namespace = namespace

    def __call__(self, *items):
        build = signature if self._namespace is None else self._namespace["signature"]
        last = self._last
        if last is not None and MEMO_SIGNATURES and last[6] is build:
            types, tensors_at, scalars_at, scalars, guards, key, _, aliases = last
            if tuple(map(type, items)) == types and scalars_at(items) == scalars:
                tensors = tensors_at(items)
                if guards.check(*tensors):
                    for i, j in aliases:
                        if items[i] is not items[j]:
                            break
                    else:
                        for t in tensors:
                            if t.data_ptr() & 15:
                                break
                        else:
                            return key
        key = build(*items)
        if key is not None and MEMO_SIGNATURES:
            if key == self._missed:
                self._last = self._entry(items, key, build)
                if self._last is None:  # (not tried again while this signature repeats)
                    self._refused, self._missed = key, None
            elif key != self._refused:
                self._missed = key
        return key

    @staticmethod
    def _entry(items, key, build):
        """The kept entry of a call whose signature is ``key`` (None: nothing to keep). A tensor given at several
        positions (attention's k as v) is checked once: TensorGuards refuses a tensor twice, so the entry's check
        takes each distinct tensor once and the later positions must hold the same tensor object again."""
        tensor_at = [i for i, t in enumerate(items) if type(t) is torch.Tensor]
        if not tensor_at or any(type(t) is not torch.Tensor and isinstance(t, torch.Tensor) for t in items):
            return None  # (no tensor: nothing for the check to save; a subclass: not a signature() key)
        first, unique_at, aliases = {}, [], []
        for i in tensor_at:
            j = first.setdefault(id(items[i]), i)
            if j == i:
                unique_at.append(i)
            else:
                aliases.append((i, j))
        scalar_at = [i for i in range(len(items)) if i not in tensor_at]
        tensors_at = _picker(unique_at)
        tensors = tensors_at(items)
        if any(t.data_ptr() & 15 for t in tensors):
            return None
        scalars_at = _picker(scalar_at) if scalar_at else (lambda items: ())
        try:
            guards = _TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        except Exception as err:  # noqa: BLE001 (a torch whose TensorGuards takes other arguments: signature() from
            # now on, rather than a failed construction at every repeated call)
            memo_signatures(False)
            dispatch.notice_once(f"tiles.launch: torch's TensorGuards refused ({type(err).__name__}: {err}); call "
                                 "signatures are built each call")
            return None
        if not guards.check(*tensors):  # (a check that its own tensors fail would never hit)
            return None
        return (tuple(map(type, items)), tensors_at, scalars_at, scalars_at(items), guards, key, build,
                tuple(aliases))


def fast_path_problem(compiled, ordered: list) -> str | None:
    """Why ``compiled`` (what Triton's JIT launch returned) cannot be called as CachedLaunch's fast path
    does, ``compiled[grid3](*ordered)``, with these arguments, or None. Checked once per compiled kernel,
    before it is kept: Triton 3.6's CompiledKernel gives ``runner(*args, stream=None)`` and takes every
    parameter, constexprs included, in signature order."""
    if not callable(getattr(type(compiled), "__getitem__", None)):
        return f"the JIT launch returned {type(compiled).__name__}, not a compiled kernel"
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if signature is not None and len(signature) != len(ordered):
        return f"the compiled kernel takes {len(signature)} arguments, not {len(ordered)}"
    try:
        parameters = inspect.signature(compiled[(1, 1, 1)]).parameters.values()
    except (TypeError, ValueError) as err:  # no Python signature to read: not the runner this expects
        return f"its runner has no signature ({err})"
    if not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return "its runner does not take the arguments positionally"
    if any(type(a) is TmaOperand for a in ordered):
        return tma_operand_problem()
    return None


@functools.lru_cache(maxsize=1)
def tma_operand_problem() -> str | None:
    """Why Triton's launcher might not read a TmaOperand as the TensorDescriptor it stands for (a field
    of Gluon's TensorDescriptor that TmaOperand lacks), or None."""
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    except ImportError as err:
        return f"no Gluon TensorDescriptor ({err})"
    fields = dataclasses.fields(TensorDescriptor)
    missing = [f.name for f in fields if f.name not in TmaOperand.__slots__]
    if missing:
        return f"TensorDescriptor has fields TmaOperand lacks: {missing}"
    # the fields TmaOperand holds as constants: TensorDescriptor's defaults, which tilecore's descriptors take
    constants = {"padding": "zero", "round_f32_to_tf32": False}
    changed = [f.name for f in fields if f.name in constants and f.default != constants[f.name]]
    return f"TensorDescriptor's defaults changed for {changed}" if changed else None


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


@functools.lru_cache(maxsize=256)
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


def stream_key(device: torch.device):
    """What per-stream buffers are keyed by: (device, the current stream) on a GPU, where a stream runs
    its launches one after another; (device, this thread) in the interpreter and on the CPU, where a
    launch runs in the calling thread (and launches from several threads one at a time,
    serialize_interpreter)."""
    if device.type == "cuda" and not dispatch.interpreter_enabled():
        if _RAW_STREAM is not None and device.index is not None:  # the same int, without a Stream object made
            return device, _RAW_STREAM(device.index)
        return device, torch.cuda.current_stream(device).cuda_stream
    return device, threading.get_ident()


# torch's current raw CUDA stream of a device index (what Triton's driver launches on: Stream.cuda_stream's value,
# ~2 us less host time than torch.cuda.current_stream), None in a torch without it
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# per (device, stream): a server that makes streams (or threads) as it goes keeps the last few
_TILE_COUNTERS = LRU(64)


def tile_counter(device: torch.device) -> torch.Tensor:
    """The int32 counter of a dynamic-tile launch (``tiles.gluon.pipeline.Layout.tile_counter``'s
    ``tile_counter``) on ``device``'s current stream: zero before its first launch, and every launch
    leaves it zero, so one counter a stream serves all its launches, one after another (a launch on
    another stream at the same time gets its own). Off CUDA (compile-only callers): a fresh zero."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.zeros(1, dtype=torch.int32, device=device)
    key = stream_key(device)
    counter = _TILE_COUNTERS.get(key)
    if counter is None:
        with _TILE_COUNTERS.lock:
            counter = _TILE_COUNTERS.get(key)
            if counter is None:
                counter = torch.zeros(1, dtype=torch.int32, device=device)
                _TILE_COUNTERS.put(key, counter)
    return counter


def kept_tile_counter(device: torch.device) -> torch.Tensor:
    """:func:`tile_counter` for a kept Gluon launch's caller (a recipe: a CUDA device, off the interpreter, where
    Gluon kernels run): the current stream's counter by one raw stream read and one lookup, without tile_counter's
    torch.device, TRITON_INTERPRET read and stream_key call (issue 31's host time); tile_counter where there is none
    yet."""
    if _RAW_STREAM is not None and device.type == "cuda" and device.index is not None:
        counter = _TILE_COUNTERS.get((device, _RAW_STREAM(device.index)))
        if counter is not None:
            return counter
    return tile_counter(device)


_INTERPRETER_LOCK = threading.RLock()


def serialize_interpreter() -> None:
    """Make Triton's interpreted launches run one at a time, process-wide (installed on import).

    Triton 3.6's interpreter keeps a launch's state in module globals: the program id in one
    InterpreterBuilder, and triton.language patched for the launch and restored after. Two launches at
    once from two threads read each other's program ids and unpatch each other's language (an error,
    "Did you forget to add @triton.jit ?", or a wrong result), and a stream-K launch waits forever on
    a flag the other launch lowered. The interpreter runs every program of a launch in the calling
    thread, so holding a lock across InterpretedFunction.run costs nothing but the parallelism the
    GIL already took; on a GPU nothing goes through it."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # a Triton without the interpreter
        return
    run = InterpretedFunction.run
    if getattr(run, "_tilecore_serialized", False):
        return

    @functools.wraps(run)
    def serialized_run(self, *args, **kwargs):
        with _INTERPRETER_LOCK:
            return run(self, *args, **kwargs)

    serialized_run._tilecore_serialized = True
    InterpretedFunction.run = serialized_run


serialize_interpreter()


def pin_ptxas() -> None:
    """Compile tilecore's kernels with the ptxas their configurations were measured with: Triton's
    own, or the one the user named in TRITON_PTXAS_PATH before importing tilecore (installed on import).

    torch.compile sets TRITON_PTXAS_PATH to torch's bundled ptxas in the process when it compiles a
    Triton kernel, and every kernel compiled after it is then built by that ptxas. With CUDA 13.0's
    ptxas (torch 2.11 cu130) the Hadamard transform at n = 2048 ran at 0.77x copy against 1.00x with
    Triton 3.6's ptxas 12.8, and the GEMM at 0.99x cuBLAS against 1.03x (H100, fresh caches, same
    process each; experiments/common/ptxas_check.py): issue 31's "intermittent slowdown" (processes
    that compiled the kernel after torch.compile). A tilecore kernel's launch through Triton's JIT (the
    one that may compile) runs with TRITON_PTXAS_PATH set back to the user's value, under a lock;
    other kernels, Inductor's included, are left alone."""
    from triton.runtime.jit import JITFunction

    if not getattr(JITFunction.run, "_tilecore_ptxas", False):
        JITFunction.run = with_pinned_ptxas(JITFunction.run)


def with_pinned_ptxas(run):
    """``run`` (JITFunction.run) that, for a kernel of a tilecore module, runs with TRITON_PTXAS_PATH
    set back to the user's value (pin_ptxas; dispatch.users_ptxas)."""

    @functools.wraps(run)
    def run_with_pinned_ptxas(self, *args, **kwargs):
        if dispatch.ptxas_is_users() or not getattr(self, "__module__", "").startswith("tilecore."):
            return run(self, *args, **kwargs)
        with dispatch.users_ptxas():
            return run(self, *args, **kwargs)

    run_with_pinned_ptxas._tilecore_ptxas = True
    return run_with_pinned_ptxas


pin_ptxas()

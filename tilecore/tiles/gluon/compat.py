"""What differs in Gluon between triton releases: the one place that knows.

The Gluon kernels take the names that moved or changed from here, resolved once at import by feature
detection (no version strings): ``gl`` (``triton.experimental.gluon.language``), ``tma`` and the
Hopper names (``triton.experimental.gluon.language.nvidia.hopper``), ``aggregate``, ``base_value``,
``builtin`` and ``ir`` (triton internals the template and tile ops build on), and ``thread_barrier``.
On a triton that needs no help, ``gl`` and ``tma`` are triton's own modules, so the kernels compile to
the same PTX as without this module.

What changed, and what this module does about it (``SHIMS`` lists the ones applied to this triton):

- 3.7: ``gl.thread_barrier()`` became ``gl.barrier()``. ``gl`` here has ``thread_barrier`` again.
- 3.9: ``tma.async_copy_global_to_shared`` / ``tma.async_copy_shared_to_global`` became
  ``tma.async_load`` / ``tma.async_store`` (the old names raise "has been removed"). ``tma`` here has
  the old names, bound to the new functions (same arguments).
- 3.9: ``shared_memory_descriptor._reinterpret`` became ``reinterpret``. The class gets its old name
  back (the one attribute this module sets on a triton object: a method cannot be proxied).

``gl`` and ``tma`` are never triton's modules patched: where a name is missing they are new module
objects with the module's own ``__name__`` (so triton's JIT treats them as that module), the missing
names, and every other attribute read through to triton's module.

``TESTED`` lists the triton releases the Gluon kernels were compile-checked under for sm_90a
(``scripts/compile_matrix.sh``, ``tests/tiles/test_triton_matrix.py``); ``RAN_ON_GPU`` those whose
kernels also ran on an H100. ``problem()`` says why the installed triton is not one of them (None
when it is): :func:`tilecore.dispatch.gluon_ok` sends Hopper to the portable Triton kernels then.
"""
import inspect
import types

import triton
import triton.language.core as _core
from triton._C.libtriton import gluon_ir, ir
from triton.experimental import gluon
from triton.experimental.gluon import language as _gl
from triton.experimental.gluon.language import _core as _gl_core
from triton.experimental.gluon.language.nvidia import hopper as _hopper
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

TESTED = ("3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0")  # compile-checked for sm_90a (compile_matrix.sh)
RAN_ON_GPU = ("3.6.0",)  # of those, the releases the kernels ran under on the lent H100

SHIMS: list[str] = []  # the differences this module papered over for the installed triton


def _module(real: types.ModuleType, names: dict) -> types.ModuleType:
    """``real`` itself when ``names`` is empty; else a module object named like ``real`` that holds
    ``names`` and reads every other attribute through to ``real``."""
    if not names:
        return real
    module = types.ModuleType(real.__name__, real.__doc__)
    module.__dict__.update(names)
    module.__getattr__ = lambda name: getattr(real, name)  # PEP 562: the names not set above
    SHIMS.extend(f"{real.__name__.rsplit('.', 1)[-1]}.{name}" for name in names)
    return module


def _takes(fn, parameter: str) -> bool:
    """Whether ``fn`` has a parameter of that name. 3.9 keeps its removed names as stubs taking
    (*args, **kwargs) that raise "has been removed" when called."""
    try:
        return parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# gl.thread_barrier(): 3.6; gl.barrier() (keyword-only cluster=False, same PTX): 3.7 on
thread_barrier = _gl.thread_barrier if hasattr(_gl, "thread_barrier") else _gl.barrier
gl = _module(_gl, {} if hasattr(_gl, "thread_barrier") else {"thread_barrier": thread_barrier})

# tma's copies: async_copy_global_to_shared / async_copy_shared_to_global up to 3.8; async_load /
# async_store (same parameters) from 3.8 on, the old names stubs from 3.9 on
_tma = _hopper.tma
tma = _module(_tma, {old: getattr(_tma, new) for old, new in (("async_copy_global_to_shared", "async_load"),
                                                              ("async_copy_shared_to_global", "async_store"))
                     if not _takes(getattr(_tma, old, None), "tensor_desc") and hasattr(_tma, new)})

# shared_memory_descriptor._reinterpret: up to 3.8; reinterpret: 3.9 on
_smem = _gl.shared_memory_descriptor
if not hasattr(_smem, "_reinterpret") and hasattr(_smem, "reinterpret"):
    _smem._reinterpret = _smem.reinterpret
    SHIMS.append("shared_memory_descriptor._reinterpret")

aggregate = _core._aggregate  # the structs' base (tiles.gluon.pipeline.struct): 3.6-3.9
base_value = _core.base_value
builtin = _gl_core.builtin  # tiles.gluon.ops.tma_reduce_add: a builtin on GluonOpBuilder.create_async_tma_reduce

# What the kernels use, checked by name: a release that lacks one cannot compile them.
REQUIRED = {
    "gl": (gl, ("thread_barrier", "warp_specialize", "allocate_shared_memory", "NVMMADistributedLayout",
                "NVMMASharedLayout", "SwizzledSharedLayout", "BlockedLayout", "SliceLayout", "DotOperandLayout",
                "inline_asm_elementwise", "static_range", "num_warps", "atomic_add", "atomic_xchg")),
    "tma": (tma, ("async_copy_global_to_shared", "async_copy_shared_to_global", "store_wait")),
    "mbarrier": (mbarrier, ("MBarrierLayout", "init", "invalidate", "expect", "wait", "arrive")),
    "gluon": (gluon, ("jit", "constexpr_function")),
    "shared_memory_descriptor": (_smem, ("_reinterpret", "index", "permute", "reshape", "slice", "load",
                                          "store")),
    "GluonOpBuilder": (gluon_ir.GluonOpBuilder, ("create_async_tma_reduce",)),
    "ir": (ir, ("DESCRIPTOR_REDUCE_KIND",)),
}


def missing() -> list[str]:
    """The names in ``REQUIRED`` that this triton lacks."""
    out = []
    for where, (obj, names) in REQUIRED.items():
        out += [f"{where}.{name}" for name in names if getattr(obj, name, None) is None
                or (where == "tma" and name.startswith("async_") and not _takes(getattr(obj, name), "tensor_desc"))]
    return out


def release(version: str | None = None) -> str:
    """The release of a triton version string: '3.6.0+git1234abc' -> '3.6.0'."""
    return (version or triton.__version__).split("+")[0]


def problem() -> str | None:
    """None where the installed triton is one the Gluon kernels were compile-checked under (TESTED);
    otherwise what is wrong with it, in a sentence."""
    lacking = missing()
    if release() in TESTED and not lacking:
        return None
    why = f"triton {triton.__version__} is not one the Gluon kernels were compile-checked under " \
          f"({', '.join(TESTED)}; ran on a GPU: {', '.join(RAN_ON_GPU)})"
    return why + (f", and lacks {', '.join(lacking)}" if lacking else "")

"""Compile kernels without a GPU, and read their resources.

``compile_kernel`` builds the signature from example arguments (tensors, TMA descriptors, ints),
compiles for sm_90a (or any target Triton has a backend for) and returns triton's CompiledKernel
(``.asm["ptx"]``, ``.asm["cubin"]``; ``.metadata.shared``: the bytes of shared memory it asks for).
``resources`` runs ptxas on the PTX for registers, spills, stack and shared memory.

Run with TRITON_INTERPRET unset: under the interpreter ``triton.jit`` makes interpreted functions,
which cannot be compiled (``python -m tilecore.ops.gemm.report`` is a fresh process for that reason).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

HOPPER = GPUTarget("cuda", 90, 32)


def compile_kernel(kernel, args: dict, *, num_warps: int = 4, target: GPUTarget = HOPPER, **options):
    """Compile ``kernel`` (a triton.jit or gluon.jit function) for ``args`` given by name (arguments with
    a default may be left out), as the JIT would: the same specialization (ints equal to 1 become constants; 16-divisible ints and 16-byte
    aligned pointers get divisibility hints, without which loads are not vectorized or pipelined and
    the report misleads). ``options``: other compile options, e.g. num_stages. ``target``: any GPU
    Triton compiles for (GPUTarget("cuda", 86, 32), GPUTarget("hip", "gfx90a", 64), ...)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import mangle_type

    from tilecore.tiles.launch import specialization

    backend = make_backend(target)
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        if param.name not in args and not param.has_default:
            name = getattr(kernel, "__name__", "the kernel")
            raise KeyError(f"compile_kernel: no value for {name}'s argument {param.name!r}")
        value = args[param.name] if param.name in args else param.default  # a default, as the JIT takes it
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(i,)] = value
            continue
        try:
            ty, attr = specialization(value)
        except TypeError:  # e.g. TMA descriptors: typed, not specialized
            ty, attr = mangle_type(value), None
        signature[param.name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = value
        elif isinstance(attr, str) and not param.do_not_specialize:
            attrs[(i,)] = backend.parse_attr(attr)
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    return triton.compile(Source(kernel, signature, constexprs=constexprs, attrs=attrs), target=target,
                          options={"num_warps": num_warps, **options})


@dataclass
class Resources:
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    shared: int  # bytes of shared memory the kernel asks for (static + dynamic)
    threads: int
    wgmma_serialized: bool = False  # ptxas's C7513: it serialized the kernel's wgmma (a large slowdown)


def _ptxas() -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(90).path


def resources(compiled) -> Resources:
    """Registers, spills and stack from ``ptxas -v`` on the kernel's PTX; shared memory and threads
    from triton's metadata."""
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        out = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    num = lambda pattern: int(m.group(1)) if (m := re.search(pattern, out)) else 0
    return Resources(
        registers=num(r"Used (\d+) registers"),
        spill_stores=num(r"(\d+) bytes spill stores"),
        spill_loads=num(r"(\d+) bytes spill loads"),
        stack=num(r"(\d+) bytes stack frame"),
        shared=int(compiled.metadata.shared),
        threads=32 * int(compiled.metadata.num_warps),
        wgmma_serialized="C7513" in out or "wgmma.mma_async instructions are serialized" in out,
    )


def has_hopper_instructions(ptx: str) -> dict[str, bool]:
    """Which Hopper instructions the PTX holds: wgmma, TMA (cp.async.bulk.tensor), mbarrier."""
    return {"wgmma": "wgmma.mma_async" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
            "mbarrier": "mbarrier" in ptx}

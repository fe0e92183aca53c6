"""The bandwidth ceiling itself: device-to-device copy across sizes.

Two series: torch's ``copy_`` (the ceiling every memory-bound op is judged against) and a plain
Triton copy with 16-byte accesses, which shows what a Triton kernel can reach on the same bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecore.bench.case import Case, Suite
from tilecore.bench.harness import rotating


@triton.jit
def _triton_copy(src, dst, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def torch_copy(numel: int, dtype: torch.dtype = torch.float16):
    """A series timing torch's copy_ of ``numel`` elements (inputs rotated past L2)."""
    def build():
        nxt = rotating(lambda: (torch.empty(numel, dtype=dtype, device="cuda").normal_(),
                                torch.empty(numel, dtype=dtype, device="cuda")), 2 * numel * dtype.itemsize)
        def run():
            src, dst = nxt()
            dst.copy_(src)
        return run
    return build


def _triton_copy_series(numel: int):
    def build():
        nxt = rotating(lambda: (torch.empty(numel, dtype=torch.float16, device="cuda").normal_(),
                                torch.empty(numel, dtype=torch.float16, device="cuda")), 4 * numel)
        block = 4096
        grid = (triton.cdiv(numel, block),)
        def run():
            src, dst = nxt()
            _triton_copy[grid](src, dst, numel, BLOCK=block, num_warps=4)
        return run
    return build


def cases(quick: bool) -> list[Case]:
    sizes = [2**k for k in (range(20, 31, 2) if quick else range(16, 32))]  # bytes of one buffer
    out = []
    for nbytes in sizes:
        numel = nbytes // 2
        out.append(Case({"bytes": nbytes}, {"torch copy_": torch_copy(numel), "triton copy": _triton_copy_series(numel)},
                        bytes=2 * nbytes))
    return out


SUITE = Suite("copy", ceiling="copy", metric="GB/s", x="bytes", cases=cases,
              describe="device-to-device copy bandwidth (bytes read + written) by buffer size")

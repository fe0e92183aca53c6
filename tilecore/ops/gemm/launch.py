"""Launching the GEMM kernels: the Gluon (TMA + wgmma) kernel on Hopper, the ``tl`` kernel elsewhere
(older GPUs, operands TMA cannot describe, and the CPU through the interpreter)."""
from __future__ import annotations

import importlib

import torch
import triton

from tilecore import dispatch
from tilecore.tiles.launch import CachedLaunch, TmaOperand, tma_describable
from tilecore.tiles.schedule import num_tiles, stream_k_launch

# Hopper configuration (block M, N, K), ring depth, group size, consumer warps (in ``consumers``
# partitions that split each tile's rows), and the largest epilogue buffer (the output tile is
# stored in column slices that fit it)
# (v2's 4 stages through a 32 KiB sliced epilogue measured no better than 3 stages with a whole-tile
# 64 KiB buffer: notes/gemm/README.md; fp32 output is stored in two 128-column slices)
GLUON_BF16 = dict(block=(128, 256, 64), stages=3, group_m=8, num_warps=8, epilogue_bytes=65536, consumers=2)
# small K (a few K steps per tile, the epilogue's share grows): 128 x 128 tiles, twice as many, and a
# deeper ring (4096 x 4096 x 256: 1.07x cuBLAS against 1.02x for GLUON_BF16; equal at K = 64;
# 0.94x at K = 1024, where GLUON_BF16 gives 1.01x; notes/gemm/README.md)
GLUON_BF16_SMALL_K = dict(GLUON_BF16, block=(128, 128, 64), stages=4)
SMALL_K = 256
GLUON_FP8 = dict(block=(128, 256, 128), stages=3, group_m=8, num_warps=8, epilogue_bytes=65536)
# the tl kernel's stream-K tail runs in the interpreter wherever the last wave is partial (so the
# tests exercise it; the Gluon kernel takes it where it pays, "auto"); on GPUs older than Hopper it
# is untimed, so off there
TL_GPU = dict(block=(128, 128, 64), stages=3, group_m=8, num_warps=8, stream_k="off")
TL_CPU = dict(block=(32, 32, 32), stages=2, group_m=2, num_warps=4, stream_k="always")


# the Gluon kernel through tiles.launch's fast path: compiled kernels cached by everything Triton
# specializes them on, so that later launches skip its argument binding and cache lookup (which cost
# more than a 4096^3 GEMM's run time on a slow host, notes/gemm/README.md)
_GLUON_GEMM = CachedLaunch(lambda: importlib.import_module("tilecore.ops.gemm.gluon_kernels").gemm_kernel)


def gluon_plan(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, fp8: bool = False):
    """How the Gluon kernel takes these operands: (a, b or b^T, B_T), or None where it can't.

    B_T means B goes in as its transpose [N, K] (K-major), which fp8 wgmma requires. Operands in
    another layout are copied once into one TMA can read; sizes whose rows are not a multiple of
    16 bytes leave it to the tl kernel.
    """
    if not (a.is_cuda and dispatch.is_hopper(a.device)):
        return None
    M, K = a.shape
    N = b.shape[1]
    if (N * torch.empty((), dtype=out_dtype).element_size()) % 16 or (K * a.element_size()) % 16:
        return None
    if not tma_describable(a):
        a = a.contiguous()
    bt = b.t()
    if fp8:
        return a, (bt if tma_describable(bt) else bt.contiguous()), True
    if tma_describable(b):
        return a, b, False
    if tma_describable(bt):
        return a, bt, True
    if (N * b.element_size()) % 16 == 0:
        return a, b.contiguous(), False
    return None


def launch_gluon(a, b, c, bias=None, scale_a=None, scale_b=None, *, plan, block, stages, group_m,
                 num_warps, epilogue_bytes=None, scales: int = 0, consumers: int = 1, stream_k: str = "auto"):
    """``num_warps`` consumer warps in all: with ``consumers=2`` two partitions of half as many, each
    taking half of every tile's rows. ``stream_k``: "auto", "always" or "off": split the last wave's
    tiles along K over every SM (tiles.schedule.stream_k_work, stream_k_units)."""
    a, bb, b_t = plan
    M, K = a.shape
    N = c.shape[1]
    BM, BN, BK = block
    rows = BM // consumers  # each consumer's share of a tile, and of the epilogue buffer
    slice_n = BN if epilogue_bytes is None else min(BN, max(16, epilogue_bytes // (BM * c.element_size())))
    tiles = num_tiles(M, N, BM, BN)
    programs, units, workspace, flags = stream_k_launch(tiles, triton.cdiv(K, BK), a.device, rows * BN,
                                                        consumers, mode=stream_k)
    grid = (programs,)
    bias_t = bias if bias is not None else c
    sa_t = scale_a if scale_a is not None else c
    sb_t = scale_b if scale_b is not None else c
    b_block = [BN, BK] if b_t else [BK, BN]
    _GLUON_GEMM[grid](TmaOperand(a, [BM, BK]), TmaOperand(bb, b_block), TmaOperand(c, [rows, slice_n]), M, N, K,
                      bias_t, sa_t, sb_t, workspace, flags, units or tiles, num_warps=num_warps // consumers,
                      B_T=b_t, GROUP_M=group_m, HAS_BIAS=bias is not None, SCALES=scales, STAGES=stages,
                      CONSUMERS=consumers, STREAM_K=units > 0)
    return c


def launch_tl(a, b, c, bias=None, scale_a=None, scale_b=None, *, block, stages, group_m, num_warps,
              scales: int = 0, stream_k: str = "off"):
    from tilecore.ops.gemm.kernels import gemm_kernel

    M, K = a.shape
    N = c.shape[1]
    BM, BN, BK = block
    tiles = num_tiles(M, N, BM, BN)
    programs, units, workspace, flags = stream_k_launch(tiles, triton.cdiv(K, BK), a.device, BM * BN,
                                                        mode=stream_k)
    dummy = c
    gemm_kernel[(programs,)](a, b, c, bias if bias is not None else dummy, scale_a if scale_a is not None else dummy,
                             scale_b if scale_b is not None else dummy, M, N, K, a.stride(0), a.stride(1),
                             b.stride(0), b.stride(1), c.stride(0), c.stride(1), workspace, flags,
                             units or tiles, BM=BM, BN=BN, BK=BK, GROUP_M=group_m, HAS_BIAS=bias is not None,
                             SCALES=scales, STAGES=stages, STREAM_K=units > 0, num_warps=num_warps)
    return c


def _scales_code(scale_a, scale_b) -> int:
    if scale_a is None:
        return 0
    return 1 + int(scale_a.numel() > 1) + 2 * int(scale_b.numel() > 1)


def run(a, b, bias, out_dtype, scale_a=None, scale_b=None):
    """C = A B (+ bias) [* scales], on whatever kernel serves a's device."""
    M, K = a.shape
    N = b.shape[1]
    fp8 = scale_a is not None
    scales = _scales_code(scale_a, scale_b)
    if scale_a is not None:
        scale_a, scale_b = scale_a.float().reshape(-1).contiguous(), scale_b.float().reshape(-1).contiguous()
    if bias is not None:
        bias = bias.contiguous()
    if M == 0 or N == 0 or K == 0:  # nothing to multiply: zeros (+ bias), scaled like the kernel would
        c = torch.zeros(M, N, dtype=torch.float32, device=a.device)
        if bias is not None:
            c = c + bias.float()
        return c.to(out_dtype)

    if a.is_cuda:
        plan = gluon_plan(a, b, out_dtype, fp8=fp8)
        c = torch.empty(M, N, dtype=out_dtype, device=a.device)
        if plan is not None:
            cfg = GLUON_FP8 if fp8 else GLUON_BF16_SMALL_K if K <= SMALL_K else GLUON_BF16
            return launch_gluon(a, b, c, bias, scale_a, scale_b, plan=plan, scales=scales, **cfg)
        if dispatch.is_hopper(a.device):
            dispatch.notice_once("gemm: operands that TMA cannot describe (strides or sizes not multiples "
                                 "of 16 bytes) run the tl kernel, which is slower")
        else:
            dispatch.notice_once("gemm: this GPU is older than Hopper (no TMA or wgmma): running the "
                                 "portable tl GEMM kernel, which is slower")
        return launch_tl(a, b, c, bias, scale_a, scale_b, scales=scales, **TL_GPU)

    # the interpreter: its bf16 dot and fp8 types are not faithful, so compute from exact upcasts
    # (bf16 -> fp32 and e4m3 -> fp16 are exact) and round once at the end
    if a.dtype == torch.bfloat16:
        a, b = a.float(), b.float()
    elif fp8:
        a, b = a.to(torch.float16), b.to(torch.float16)
    if a.dtype == torch.float16 and out_dtype == torch.float16:
        c = torch.empty(M, N, dtype=torch.float16)
        return launch_tl(a, b, c, bias, scale_a, scale_b, scales=scales, **TL_CPU)
    c = torch.empty(M, N, dtype=torch.float32)
    launch_tl(a, b, c, bias.float() if bias is not None else None, scale_a, scale_b, scales=scales, **TL_CPU)
    return c.to(out_dtype)

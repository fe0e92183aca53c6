"""The 192 x 256 GEMM tile, measured (issue 36 part 4's tile claims; the audit's gap 2).

Triton 3.6 takes no 192-row tile: tl.arange and Gluon's tensor shapes must be powers of two, and so must a TMA
descriptor's block (triton._utils.validate_block_shape raises at TensorDescriptor). This probe writes the tile as
three 64-row pieces: a program owns C[192 rows, BN], loads three [64, BK] blocks of A and one [BK, BN] block of B a
K step and issues three tl.dot into three [64, BN] fp32 accumulators (8 warps: each dot's two warpgroups split N).
The same kernel with two pieces is the 128-row tile, so the two differ only in the rows a program owns; the plain
tl kernel of gpu_constants.py (one [128, BN] dot) and cuBLAS run beside them. M = 8064 (42 tiles of 192, 63 of
128), N = K = 8192, bf16, fp32 accumulation, grouped tile order; every output checked against a float64
reference on a 512^3 problem (NaN-poisoned). The napkin's figure for each tile (lab constants) is in the JSON: the
192 x 256 tile fits its shared memory at 2 stages with C staged whole; the probe stores C from registers, so 3
stages fit (168 KiB).

    python experiments/napkin/gpu_tile192.py [--smoke] [--deadline 100]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from experiments.common.gpu_script import Run, check, time_rounds  # noqa: E402
from experiments.napkin.gpu_constants import matmul  # noqa: E402  (the plain tl kernel of the tile claims)

PIECE = 64  # rows of A a tl.dot takes


@triton.jit
def pieces_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                  PIECES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # C = A B (row-major, contiguous K / N), a program's tile PIECES x 64 rows by BLOCK_N; M, N, K multiples of
    # the tile (the host checks)
    BM: tl.constexpr = PIECES * 64
    pid = tl.program_id(0)
    n_m = M // BM
    n_n = N // BLOCK_N
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    offs_r = tl.arange(0, 64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a0 = a_ptr + (pid_m * BM + offs_r)[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    a1 = a0 + 64 * stride_am
    a2 = a0 + 128 * stride_am
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :]
    acc0 = tl.zeros((64, BLOCK_N), tl.float32)
    acc1 = tl.zeros((64, BLOCK_N), tl.float32)
    acc2 = tl.zeros((64, BLOCK_N), tl.float32)
    for _ in range(0, K // BLOCK_K):
        b = tl.load(b_ptrs)
        acc0 = tl.dot(tl.load(a0), b, acc0)
        acc1 = tl.dot(tl.load(a1), b, acc1)
        if PIECES == 3:
            acc2 = tl.dot(tl.load(a2), b, acc2)
        a0 += BLOCK_K
        a1 += BLOCK_K
        a2 += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c0 = c_ptr + (pid_m * BM + offs_r)[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c0, acc0.to(c_ptr.dtype.element_ty))
    tl.store(c0 + 64 * stride_cm, acc1.to(c_ptr.dtype.element_ty))
    if PIECES == 3:
        tl.store(c0 + 128 * stride_cm, acc2.to(c_ptr.dtype.element_ty))


def pieces_matmul(a, b, pieces, block_n, block_k, stages, out=None, num_warps=8):
    M, K = a.shape
    N = b.shape[1]
    bm = pieces * PIECE
    if M % bm or N % block_n or K % block_k or not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError(f"pieces_matmul: M % {bm}, N % {block_n}, K % {block_k} must be 0, A and B contiguous")
    c = torch.full((M, N), float("nan"), dtype=a.dtype, device=a.device) if out is None else out
    grid = ((M // bm) * (N // block_n),)
    pieces_kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), PIECES=pieces, BLOCK_N=block_n,
                        BLOCK_K=block_k, GROUP_M=8, num_warps=num_warps, num_stages=stages)
    return c


def napkin_tflops(m, n, k, bm, bn, bk, stages, warpgroups):
    from tilecore.napkin import models, validate
    from tilecore.napkin.engine import group, relabel, stream

    try:
        r = relabel(models.matmul(m, n, k), validate.lab_gpu(), {"m": group(bm), "n": group(bn), "k": stream(bk)},
                    warpgroups=warpgroups, stages=stages, split_axis="m")
        return round(r.tflops, 1), r.bound
    except Exception as e:  # the napkin's capacity verdict
        return None, f"{type(e).__name__}: {e}"[:120]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1: the checks at small tiles")
    ap.add_argument("--deadline", type=float, default=100.0)
    args = ap.parse_args(argv)
    run = Run("napkin_tile192", deadline=args.deadline)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if args.smoke else torch.bfloat16  # the interpreter's bf16 dot is wrong
    # (name, kind, pieces or block, block_n, block_k, stages)
    variants = [("192x256x64 s3 (3 pieces)", "pieces", 3, 256, 64, 3),
                ("192x256x64 s2 (3 pieces)", "pieces", 3, 256, 64, 2),
                ("128x256x64 s3 (2 pieces)", "pieces", 2, 256, 64, 3),
                ("128x256x64 s4 (2 pieces)", "pieces", 2, 256, 64, 4),
                ("128x256x64 s3 (plain)", "plain", 128, 256, 64, 3),
                ("128x256x64 s4 (plain)", "plain", 128, 256, 64, 4),
                ("192x128x64 s4 (3 pieces)", "pieces", 3, 128, 64, 4)]
    if args.smoke:
        variants = [(n, kind, p, 64, 32, 2) for n, kind, p, *_ in variants[:1] + variants[2:3]]
    m, n, k = (192 * 2, 128, 64) if args.smoke else (8064, 8192, 8192)
    cm, cn, ck = (192 * 2, 128, 64) if args.smoke else (192 * 4, 512, 512)  # the checked problem (x 128 rows too)
    g = torch.Generator(device=dev).manual_seed(0)
    ca, cb = (torch.randn(s, device=dev, generator=g).to(dtype) for s in ((cm, ck), (ck, cn)))
    ref = ca.double() @ cb.double()
    a, b = (torch.randn(s, device=dev, generator=g).to(dtype) for s in ((m, k), (k, n)))
    fns = {}
    for name, kind, p, bn, bk, stages in variants:
        if kind == "pieces":
            fn = (lambda x, y, out=None, p=p, bn=bn, bk=bk, st=stages: pieces_matmul(x, y, p, bn, bk, st, out))
            bm, wgs = p * PIECE, p
        else:
            fn = (lambda x, y, out=None, bn=bn, bk=bk, st=stages: matmul(x, y, (128, bn, bk), st))
            bm, wgs = 128, 2
        res = run.attempt(name, fn, ca, cb)
        if res is None:
            continue
        ok = check(res, ref, tol=1.5)
        pred, bound = napkin_tflops(8064, 8192, 8192, bm, bn, bk, stages, wgs)
        run.row(f"check {name}", napkin_tflops=pred, napkin_bound=bound, **ok)
        if ok["pass"]:
            c = torch.empty(m, n, dtype=dtype, device=dev)
            fns[name] = (lambda fn=fn, c=c: fn(a, b, c)) if kind == "pieces" else (lambda fn=fn: fn(a, b))
    if not args.smoke:
        fns["cuBLAS"] = lambda: torch.matmul(a, b)
        t = time_rounds(fns, rounds=3, warmup=25, rep=100, deadline=run)
        flops = 2 * m * n * k
        for name in fns:
            ms = t[f"{name}_ms"]
            run.row(f"time {name}", ms=ms, tflops=round(flops / (ms * 1e-3) / 1e12, 1),
                    of_cublas=round(t["cuBLAS_ms"] / ms, 4), rounds=t[f"{name}_rounds"])
    run.finish(["name", "pass", "err_over_floor", "napkin_tflops", "napkin_bound", "ms", "tflops", "of_cublas"])
    return 0 if not run.errors and all(r.get("pass", True) for r in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())

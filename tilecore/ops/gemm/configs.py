"""The GEMM's measured configurations, one table row each (``plan.plan`` picks the row).

Gluon rows (Hopper): ``block`` (M, N, K), ring ``stages``, ``group_m`` (the L2-aware tile order),
``num_warps`` consumer warps in all, split over ``consumers`` partitions that each take a share of
every tile's rows, ``epilogue_bytes`` (the largest output buffer: the tile is stored in column
slices that fit it) and ``stream_k`` ("auto", "always", "off": tiles.schedule.stream_k_units).
tl rows: the same, less the epilogue and consumers. Runs behind every figure: notes/gemm/README.md.
"""
from __future__ import annotations

# 128 x 256 x 64, 3 stages, two consumer partitions: at cuBLAS parity on the H100; 4 stages through a
# sliced epilogue measured no better (notes/gemm/README.md, v2 and v4)
GLUON_BF16 = dict(block=(128, 256, 64), stages=3, group_m=8, num_warps=8, epilogue_bytes=65536, consumers=2,
                  stream_k="auto")
# K <= SMALL_K: twice as many 128 x 128 tiles and a deeper ring, 1.07x cuBLAS at K = 256 against 1.02x
# (notes/gemm/README.md, v4)
GLUON_BF16_SMALL_K = dict(GLUON_BF16, block=(128, 128, 64), stages=4)
SMALL_K = 256
# fp8 (B as B^T, K-major): the bf16 row with K steps of 128 one-byte elements (notes/gemm/README.md, v1)
GLUON_FP8 = dict(block=(128, 256, 128), stages=3, group_m=8, num_warps=8, epilogue_bytes=65536, consumers=1,
                 stream_k="auto")
# issue 36 part 4: the Gluon rows chosen per shape from the napkin's ranking (plan.napkin_configs: its
# top NAPKIN_TOPK of GLUON_CANDIDATES that the kernel takes, plus the table's row above), timed once a
# (shape bucket, dtypes, operand form, device) on the caller's operands (plan.timed_config). 0: off,
# the table rows above. On: 4 (the top-4 pick the H100 sweep's best on 9 of 9 bf16 shapes in two runs, never
# slower than the table; a cold disk cache costs a bucket's first call 2.4-3.5 s of compiles; notes/napkin)
NAPKIN_TOPK = 4
# ... for fp8 operands too (else fp8 keeps GLUON_FP8). On, timed by the CUDA-graph clock (NAPKIN_CLOCK_FP8):
# the pick 1.41x / 1.25x the table at M 64 / M 256 by GPU time, 1.00-1.05x elsewhere (do_bench's timer read host
# time on these short kernels; notes/napkin/runs/topk_fp8_graph_*)
NAPKIN_TOPK_FP8 = True
# a candidate's timing: triton.testing.do_bench's median over about this many ms of launches, each after
# an L2 flush (back-to-back CUDA-event launches read the host's enqueue time). 5 ms picked the same bf16 rows
# as 10 and 20 ms on 9 of 9 shapes at a third of the first call's timing (notes/napkin)
NAPKIN_TIMED_MS = 5.0
# the clock a candidate is timed by (launch.time_plans): "do_bench" (the launch's median after an L2 flush) or
# "graph" (the launch captured once into a CUDA graph, the replays timed by CUDA events: GPU time alone, no host
# time; issue 36). fp8 by the graph (do_bench read host time at fp8 M 256). "agree": the table's row unless both
# clocks time a candidate faster (plan.agreed_pick; each clock's pick can be the other's loser where the operands
# fit L2); bf16 keeps do_bench: agree picked the same rows on 9 of 9 shapes at up to 0.14 s more at a first call
# (notes/napkin: its decision log and its top-k sections)
NAPKIN_CLOCK = "do_bench"
NAPKIN_CLOCK_FP8 = "graph"
# the Gluon kernel's candidate tiles: (BM, BN, BK, stages, consumer partitions, warps in all); each
# compiled for sm_90a on the CPU without spills (tests/gemm/test_gemm_topk_compile.py). Where a row
# does not fit a dtype's shared memory or its TMA box (plan.gluon_legal), it is left out for it.
GLUON_CANDIDATES = (
    (128, 256, 64, 3, 2, 8), (128, 256, 64, 4, 2, 8), (256, 128, 64, 3, 2, 8), (128, 128, 64, 4, 2, 8),
    (128, 128, 64, 3, 2, 8), (128, 128, 64, 4, 1, 4), (64, 256, 64, 3, 1, 4), (64, 256, 64, 4, 1, 4),
    (128, 64, 64, 4, 2, 8), (64, 128, 64, 4, 1, 4),
    (128, 256, 128, 3, 2, 8), (128, 256, 128, 3, 1, 8), (256, 128, 128, 3, 2, 8), (128, 128, 128, 4, 2, 8),
    (128, 128, 128, 4, 1, 4), (64, 256, 128, 3, 1, 4),
)
# GPUs older than Hopper and operands TMA cannot describe: untimed, so no stream-K tail
TL_GPU = dict(block=(128, 128, 64), stages=3, group_m=8, num_warps=8, stream_k="off")
# the interpreter: small tiles, and the stream-K tail wherever the last wave is partial, so the tests
# exercise it
TL_CPU = dict(block=(32, 32, 32), stages=2, group_m=2, num_warps=4, stream_k="always")
# CPU tensors without the interpreter (plan._cpu): 16-bit and fp8 operands upcast to float32 in blocks
# of A, B and C of about this many elements each (8 MiB in float32; fp8's B whole), which bounds the
# temporaries at about the output's size of a 2048^3 bf16 GEMM while the blocks stay large for
# torch's matmul: 2^20 ran 1.9x slower there, 2^22 1.2x faster with 2x the memory (AMD EPYC, AVX2,
# 2 cores, shared with other jobs: +-30%)
CPU_BLOCK_ELEMS = 1 << 21

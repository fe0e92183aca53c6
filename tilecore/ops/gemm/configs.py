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
# the table rows above. H100, session 29 run 8 and session 30 run 1 (experiments/napkin/gpu_topk_configs.py,
# every row checked against float64): the top-4 pick was the sweep's best on 9 of 9 bf16 shapes both times,
# never slower than the table (skinny M 64: the table 1.19-1.21x the pick); on: 4 (the lead, session 30; a warm
# disk cache adds 0.03-0.11 s to a bucket's first call, a cold one 2.4-3.5 s of compiles)
NAPKIN_TOPK = 4
# ... for fp8 operands too (else fp8 keeps GLUON_FP8). Off in session 30: its do_bench timer read the launch's
# host time at M 256 (a 47-70 us kernel) and picked a row 1.17x slower than the table. On since session 31
# (HH), timed by the CUDA-graph clock (NAPKIN_CLOCK_FP8 below): H100 runs 1 and 5 of gpu_topk_configs.py --fp8
# --graph (notes/napkin/runs/topk_fp8_graph_*session31*), 10 fp8 shapes, every row right against float64: by
# GPU time the pick 1.41-1.42x / 1.25x the table at M 64 / M 256, 1.00-1.05x elsewhere; run 5 never slower than
# the table on any shape by either clock, run 1 0.958x at 8192^3 (inside the clock's 2-4% repeat spread)
NAPKIN_TOPK_FP8 = True
# a candidate's timing: triton.testing.do_bench's median over about this many ms of launches, each after
# an L2 flush (H100 run 3 of session 29: the median of 5 back-to-back CUDA-event launches read the host's
# enqueue time at K = 128 / 256 (70-80 us against do_bench's 22-60) and picked rows 9-11% slower). 5 ms:
# session 30's run 1 picked the same bf16 rows at 5, 10 and 20 ms (9 of 9 shapes), the first call's timing
# 0.026-0.109 s at 5 ms against 0.096-0.190 at 20 (kernels compiled; compiling the extra candidates adds
# 2.4-3.5 s once a process where Triton's cache does not hold them)
NAPKIN_TIMED_MS = 5.0
# the clock a candidate is timed by (launch.time_plans): "do_bench" (the launch's median after an L2 flush,
# what sessions 29-30 picked the bf16 rows by) or "graph" (the launch captured once into a CUDA graph, the
# replays timed by CUDA events: GPU time alone, no host time; issue 36, session 31). fp8 is timed by the
# graph: session 30's do_bench read host time at fp8 M 256 (above); session 31's runs 1 and 5: NAPKIN_TOPK_FP8.
# "agree" (session 34, HG): the table's row unless both clocks time a candidate faster (plan.agreed_pick: every
# candidate by do_bench, then the table and do_bench's winners by the graph). Why bf16 might want it: session 33's
# run 2 (notes/napkin/runs/topk_bf16g33_run2_session33_h100.txt): by GPU time do_bench's pick was 1.083-1.088x
# slower than the table at K256 and qkv T8192, while the graph's pick lost 1.060x by do_bench at K256 (operands
# kept in L2 across replays): each clock's pick is the other's loser where the operands fit L2. Session 34's run 3
# (notes/napkin/runs/topk_agree_run3_session34_h100.txt): the agree pick the table or better by both clocks on 9 of
# 9 bf16 shapes, but the same rows as do_bench's pick in that run, at up to 0.14 s more at a first call: not taken
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

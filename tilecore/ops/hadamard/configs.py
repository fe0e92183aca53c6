"""The Hadamard transform's measured tables (``plan.plan`` reads them). Runs behind every figure:
notes/hadamard/README.md; compile reports (shared memory, registers, spills): scripts/hadamard_resources.py.

A row of n elements is split into S slices of N1 x N2 (kernels.py: two tensor-core products per slice,
a float32 butterfly over the slices). Tensor-core FLOP per element: 2 N1 + 4 N2 (2 N2 when N1 = 1).
"""
from __future__ import annotations

# n -> (S, N1, N2): N2 >= 16 (a tensor-core tile; smaller n are zero-padded to 16), N1 = 1 (one exact
# product) or >= 16; chosen by timings on the H100 (notes/hadamard/README.md, v4-v5). n < 16 is listed
# (the op accepts exactly these n) but runs the register butterfly (butterfly.py)
SPLITS = {
    1: (1, 1, 16), 2: (1, 1, 16), 4: (1, 1, 16), 8: (1, 1, 16), 16: (1, 1, 16),
    32: (1, 1, 32), 64: (1, 1, 64), 128: (1, 1, 128),
    256: (4, 1, 64), 512: (1, 32, 16), 1024: (1, 32, 32), 2048: (2, 32, 32),
    4096: (1, 128, 32), 8192: (2, 128, 32), 16384: (4, 128, 32), 32768: (4, 128, 64),
}
MAX_N = max(SPLITS)

# n -> (elements per tile, warps, pipelined load stages, programs per SM) of the pointer path: sweeps on
# the H100 within the compiler's register and shared-memory report (notes/hadamard/README.md, v1-v5)
TUNING = {n: (4096, 8, 3, 4) for n in SPLITS} | {n: (16384, 8, 3, 1) for n in (16, 32, 64, 128)} | {
    256: (32768, 8, 3, 16), 512: (4096, 8, 3, 16), 1024: (8192, 8, 3, 16), 2048: (16384, 8, 3, 4),
    4096: (4096, 8, 5, 16), 8192: (8192, 8, 5, 4), 16384: (4096, 8, 3, 1), 32768: (4096, 8, 3, 1)}
# float32 inputs carry three pieces per stage: smaller tiles and two stages keep them in shared memory
FP32_TUNING = (4096, 8, 2, 4)

# GPUs whose blocks get less shared memory than TUNING asks for there: (bytes a block gets, (n, float32)
# -> tl_config overrides), the first row whose bytes the GPU's reach (dispatch.shared_memory_fit), on
# the pointer path (TMA_TUNING was timed on the H100 only). None: the tables as they are (sm_80: at
# most 160 of its 163 KiB; sm_90a, sm_100a: 216 of 227). Each row is compiled for the GPUs it serves
# by python -m tilecore.portability (CI: tests/test_portability.py; the table: notes/portability.md).
# Untimed there: smaller tiles where they fit (the pipeline keeps its depth), else fewer stages.
SHARED_FITS = (
    (163 * 1024, None),
    # sm_86, sm_89, sm_120 (99 KiB): n = 64, 128, 256 asked 104, 128, 144 KiB (sm_86) -> 56, 80, 72;
    # float32 n = 32768 160 -> 32 with one stage
    (99 * 1024, {(64, False): dict(tile_elems=8192), (128, False): dict(tile_elems=8192),
                 (256, False): dict(tile_elems=16384), (32768, True): dict(num_stages=1)}),
    # ROCm's MI200 and MI300 (64 KiB of LDS): 16-bit n = 16..128, 2048..16384 asked 72-96 KiB (gfx90a),
    # two stages 32-64; n = 256 144 -> 40 (and half the tile); n = 32768 144 -> 32 with one stage
    (64 * 1024, {**{(n, False): dict(num_stages=2) for n in (16, 32, 64, 128, 2048, 8192, 16384)},
                 (256, False): dict(tile_elems=16384, num_stages=2), (32768, False): dict(num_stages=1)}),
)

# float16/bfloat16: n -> (which side goes through TMA descriptors, tuning that differs from TUNING's),
# where that measured faster than pointers on the H100 (notes/hadamard/README.md, v7)
TMA_TUNING = {
    256: ("load", dict(tile_elems=16384, waves=32)),
    512: ("both", dict(split=(1, 16, 32), tile_elems=8192, waves=32)),
    1024: ("both", dict(waves=64)),
    2048: ("both", dict(waves=64)),
    4096: ("both", dict(num_stages=6, num_warps=4, waves=32)),
    8192: ("both", dict(waves=32)),
    16384: ("both", dict(split=(2, 128, 64), num_stages=4)),
    32768: ("both", dict(waves=2)),
}
# below this many elements a TMA launch's host cost (descriptors) outweighs it: 50-830 us against the
# pointer path's 7-24 us for few rows (notes/hadamard/README.md, v8)
TMA_MIN_ELEMENTS = 1 << 24

# Hopper's Gluon kernel (gluon_kernels.py) takes n in GLUON_SIZES; n -> (ring stages, lookahead) where it
# is the default (from TMA_MIN_ELEMENTS elements): 32768 runs best loading exactly a row ahead after a
# ring that fills at the start, 16384 two rows ahead (notes/hadamard/README.md, sessions 11 and 18)
GLUON_SIZES = (16384, 32768)
GLUON_TUNING = {16384: (4, 0), 32768: (8, 4)}
GLUON_STAGES = 4  # the ring's depth for n in GLUON_SIZES without a GLUON_TUNING entry

# programs per "SM" in the interpreter, so that its persistent loops still run several tiles each
INTERPRETER_SMS = 4

# CPU tensors without the interpreter (plan.cpu_plan): up to this n one float32 product x @ H_n (n < 16:
# 16 // n rows at a time against diag(H_n, ...)), above it two, with H_a and H_b (n = a b, a <= b).
# 2^24 float32 elements on an AMD EPYC (AVX2, 2 cores, shared): one product 15-26 ms for n = 2..64
# against 39-117 for two (n >= 16); 55 against 42 at n = 128, 296 against 51 at 1024, 1183 against
# 69 at 4096; two products 124 ms at 32768 (a copy: 7 ms)
CPU_DENSE_MAX_N = 64
# ... over chunks of rows of about this many elements (their float32 temporaries: 16 MiB each), where
# a chunk needs temporaries (16-bit inputs, two products, in place)
CPU_CHUNK_ELEMS = 1 << 22

# n = m x p, m not a power of two (kron.py, kernels_kron.py). A row runs in one program where its
# M_PAD x p float32 values fit this many (the power-of-two kernel's largest row, 32768, holds as many);
# longer rows take two passes through a float32 workspace, the first in column chunks of this width
KRON_MAX_TILE_ELEMS = 32768
KRON_TILE_ELEMS = 8192  # a tile's elements where several rows fit (M_PAD < 64), as TUNING's 4096-16384
KRON_MAX_ROWS = 4  # ... at most this many rows (batched products of 4 rows: 43-56% of copy at 12/20/28 x 64
#                    where 2 or 8 ran 26-42%, 4 warps; H200, session 25, notes/hadamard/README.md)
KRON_WARPS = 4  # the fused kernel's warps: 4 ran 1.1-2.5x faster than 8 or 16 at every 12/20/28 x 2^k timed
KRON_CHUNK_COLUMNS = 64
KRON_WAVES = 4  # programs per SM of the persistent grid (8 and 16 timed: within 1% but at 12 x 512)
QUANT_TILE_ELEMS = 8192  # hadamard_quantize's kron-tiled tile where several rows fit (quantize.kernel_plan)

# hadamard_quantize's "pow2" path (quantize.pow2_plan): hadamard_transform's TUNING / TMA_TUNING tile, with
# these overrides by n (session 25, H200: 4096 at 3 stages 0.359 ms against 6 stages' 0.406, fp8), and
# codes through TMA for the packed 4-bit formats (mxfp4 at 4096: TMA 0.467 ms, pointers 0.666) and, 8-bit,
# at n = 256 only (fp8: TMA 0.269 ms, pointers 0.370; at 4096 pointers 0.342 against 0.359, and 512-32768
# within 1-8% of each other, pointers ahead)
QUANT_POW2_TUNING = {4096: dict(num_stages=4), 1024: dict(waves=16), 2048: dict(num_warps=4)}
# session 26 (H100, FAST epilogue, fp8 / mxfp4 % of copy): 1024 with 16 programs an SM 88.0 / 55.1 against
# 64's 78.8 / 52.4; 2048 on 4 warps 80.2 / 44.9 against 8's 59.1 / 37.6; 4096 with 4 stages 85.8 against 3's
# 84.6 (mxfp4 equal), 2 stages 75.3
# the quantizing epilogue's quotient y / s: False, Markstein's correctly rounded one (three instructions a
# value); True, y times 1 / s with the rotation's 1 / sqrt(n) folded in (one: codes may move by one step at
# near-ties, quantize_kernels._codes_fast). Either by plan tuning "fast".
QUANT_FAST = True  # session 26, H100: fp8 4096 84.6% of copy against 78.5, 128 79.6 / 73.7, nvfp4 47.2 / 43.2
# the m x 2^k kernels' loads (and the transform's stores) through TMA descriptors: "none", "load", "both"
# (kron.kernel_plan; hadamard_quantize's kron-tiled plans take "load" at most). Untimed: "none" until a GPU run
KRON_TMA = "none"
# per-shape overrides of the m x 2^k transform's plan (kron.kernel_plan), 16-bit inputs, where a run measured
# them (session 26, H100, % of copy, same run): 28 x 512 with 3 stages 86.8 against 2 stages' 73.4; 12 x 64
# with 1 stage 84.9 against 73.4; 20 x 1024 on 8 warps 37.6 against 4 warps' 24.8. Other shapes untimed.
# hadamard_transform at m x 2^k with m > 64 on hadamard_quantize's wide_rows kernel (quantize_wide_rows.py storing
# the values: blocks of 64 output sub-rows and K chunks of 64 stopping at m, the mixing 128 columns wide), (m, p) ->
# "pair" or True (kron._wide_rows_plan). Untimed: empty (the kron-tiled kernel) until a GPU run checks and times it
# session 29 final run (H100): the transform at 11008 (172 x 64) on the wide_rows kernel, pairs of 64-wide products
# sharing each H chunk: 1.12x the kron-tiled plan (36.5% of copy in run 7), checked against float64 there
KRON_WIDE_ROWS = {(172, 64): "pair"}
KRON_TUNING = {(28, 512): dict(num_stages=3), (12, 64): dict(num_stages=1), (20, 1024): dict(num_warps=8)}
# hadamard_quantize's kron-tiled plans by n (quantize.kernel_plan), 16-bit inputs: 14336 on 4 warps (session 26,
# H100, FAST: fp8 47.9% of copy against 8 warps' 35.9 and 16 warps' 17.5; mxfp4 8.8 against 8.6)
QUANT_KRON_TUNING = {14336: dict(num_warps=4)}
# session 27: hadamard_quantize's kron-tiled kernel (the model widths) with interleaved slices (slice t = columns
# q S + t of each sub-row: a quantization group's amax without other warps, a thread's codes as one vector;
# quantize_kernels._epilogue_interleaved; plan tuning "interleave": True, each slice loaded strided; 2, all S
# loaded as one vector a column), by format, 16-bit inputs. H100 (run 4 of session 27, checks ok: codes
# 99.999% equal to the float64 reference's, every element written): mxfp4 14336 8.6 -> 31.9% of copy (2 against
# True's 13.9), nvfp4 8.7 -> 31.9, int4 7.9 -> 22.2, mxfp4 28672 7.6 -> 16.9; fp8 per token loses (55.2 -> 39.1
# at 14336, 26.0 -> 19.7 at 28672): off for fp8 and int8. Keys: (format, n), else the format. On where run 4
# checked it on the GPU (18944: K-chunked mixing, strided loads, 1.03x); the same code at the other widths of
# nvfp4 / int4 waits for the next s27 run's checks (then: {"mxfp4": 2, "nvfp4": 2, "int4": 2})
# Session 28 (H100, s27 probe --quick, checks ok: codes 99.9986-99.9996% equal, every element written): nvfp4
# 28672 7.6 -> 16.7% of copy (2.18x), int4 28672 7.5 -> 16.9 (2.24x), nvfp4 18944 8.8 -> 9.2 (1.05x)
QUANT_INTERLEAVE = {("mxfp4", 14336): 2, ("mxfp4", 28672): 2, ("mxfp4", 18944): 2, ("nvfp4", 14336): 2,
                    ("int4", 14336): 2, ("nvfp4", 28672): 2, ("int4", 28672): 2, ("nvfp4", 18944): 2}
# session 27: hadamard_quantize's pow2 kernel with the second product's columns permuted (a thread's values are 8
# consecutive outputs: codes stored as words, not bytes 8 apart; plan tuning "perm"). Keys: (format, n), else the
# format. Session 28 (H100, checks ok at 1024-32768): nvfp4 1.12x at 4096, 1.25-1.26x at 2048 and 32768; mxfp4
# 1.03x at 2048, 1.07x at 32768, 0.98-0.99x at 1024 and 4096; int4 1.00-1.02x (left off)
QUANT_PERM_COLUMNS = {"nvfp4": True, ("mxfp4", 2048): True, ("mxfp4", 32768): True}
# ... and the interleaved slices' vector load through TMA (boxes [1, M_PAD, Q, S]; plan tuning "il_tma"). Keys as
# above. Session 28 (H100, checks ok): mxfp4 14336 1.10x (31.3 -> 34.6% of copy); fp8 14336 0.80x (interleave
# is off for fp8 anyway); the other widths untimed
QUANT_INTERLEAVE_TMA = {("mxfp4", 14336): True}
# session 28 (issue 32): hadamard_quantize's "wide" kernel for m x 2^k with m > 64 (quantize_wide.py: output
# sub-rows in NB blocks of QUANT_WIDE_MB, the mixing's K in chunks of QUANT_WIDE_KC, both stopping at m, where the
# kron-tiled kernel mixes all M_PAD = 256: 2.2x the work at 172). Keys: (format, n), else the format; plan tuning
# "wide". H100 run 10 of session 28 (gpu_quantize_probe --set s28 --quick; every variant's codes 99.98-99.999%
# equal to the float64 reference's, every element written), speed over the shipped kron-tiled plan: fp8 11008
# 1.66x (24.1 -> 40.0% of copy, 4 warps), fp8 18944 1.36x (21.5 -> 29.3), mxfp4 11008 1.29x, nvfp4 11008 1.21x,
# int4 11008 1.17x, int8 11008 1.16x, mxfp4 18944 1.16x: on there, with each one's fastest tuning below
QUANT_WIDE = {("fp8_e4m3", 11008): True, ("fp8_e4m3", 18944): True, ("int4", 11008): True, ("int8", 11008): True,
              ("mxfp4", 11008): True, ("mxfp4", 18944): True, ("nvfp4", 11008): True}
# session 29: the wide plan's mixing 128 columns wide ("wide_rows", quantize_wide_rows.py: two rows' slices at 11008,
# a row's two slices at 18944, side by side: each H_m chunk fetched once for 128 columns, wgmma N = 128; plan tuning
# "wide_rows"; keys as QUANT_WIDE, applies where the wide plan does with Q = 64 and j_outer off). Untimed: off until
# a GPU run checks and times it (experiments/hadamard/gpu_quantize_probe.py --set s29)
QUANT_WIDE_ROWS = {}
QUANT_WIDE_MB = 64
# H100 run 8 of session 28 (fp8 11008, % of the shipped plan's speed): K chunks of 16 0.50x, 32 0.66x; 2 stages at
# 16 0.61x: the products' latency a chunk, so the largest chunk and 2 stages by default (64 untimed until round 2)
QUANT_WIDE_KC = 64
QUANT_WIDE_STAGES = 2
QUANT_WIDE_J_OUTER = False  # block-scaled formats: the blocks one at a time (quantize_wide's J_OUTER); untimed
# ... and the kron-tiled kernel's K-chunked mixing (m > 64) stopping at the last chunk holding sub-rows < m (3 of
# M_PAD / 64 = 4 at 172 and 148: 25% less mixing; plan tuning "k_stop"). Keys as QUANT_INTERLEAVE. Untimed: off
QUANT_K_STOP = {}
# session 29 final run (H100, s29b): the one-warpgroup wide plan (mb 64, 4 warps) at 11008: int8 1.61x, int4 1.51x,
# nvfp4 1.44x, mxfp4 1.30x the previous tunings, codes checked against float64 in the same run
QUANT_WIDE_TUNING = {  # (format, n), else format -> the wide plan's tuning (j_outer, kc, mb, num_warps, num_stages)
    ("fp8_e4m3", 11008): dict(kc=64, num_stages=2, num_warps=4),
    ("fp8_e4m3", 18944): dict(kc=64, num_stages=2, mb=128),
    ("int4", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2),
    ("int8", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2),
    ("mxfp4", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2),
    ("mxfp4", 18944): dict(kc=64, num_stages=2, mb=128),
    ("nvfp4", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2)}
# session 30: hadamard_quantize's Gluon kernel for m x 64 with 128 < m <= 192 (gluon_quantize_wide.py: H_m's blocks
# resident in shared memory, each row's three [64, 64] chunks by TMA, two consumer warpgroups a row each, wgmma),
# plan path "gluon_wide", plan tuning "gluon". Keys: (format, n), else the format. On where runs 3 and 7 of session 30
# (H100, gpu_quantize_probe.py --set s30) checked it (codes 99.983-100% equal to the float64 reference's, every
# element written; e5m2, nvfp4 dynamic, fp8 static, fp16 in too) and run 7 timed it against the wide plan in the same
# run: fp8 0.730 -> 0.384 ms (37.5 -> 71.3% of copy, 1.90x), int8 1.85x (65.1%), mxfp4 2.33x (41.9%), nvfp4 1.87x
# (32.7%), int4 2.62x (49.9%). fp8_e5m2 checked, not timed: off
QUANT_GLUON_WIDE = {("fp8_e4m3", 11008): True, ("int8", 11008): True, ("mxfp4", 11008): True, ("nvfp4", 11008): True,
                    ("int4", 11008): True,
                    # session 31 run 2 (H100, notes/hadamard/runs/gluon_widths_run2_session31_h100.txt): 18944 = 148 x 128
                    # on HALVES 2, checked against float64 (codes 99.98-100% equal, all written, nvfp4 dynamic and fp16
                    # too), over the shipped plan in the same run: fp8 0.943 -> 0.670 ms (1.41x, 40.8% of copy), int8
                    # 1.92x (39.1%), mxfp4 2.89x (31.0%), nvfp4 2.53x (23.4%); int4 not taken (groups span the halves)
                    ("fp8_e4m3", 18944): True, ("int8", 18944): True, ("mxfp4", 18944): True, ("nvfp4", 18944): True,
                    # run 4 of session 31 (notes/hadamard/runs/gluon_widths_r3_run4_session31_h100.txt): int4 at 18944
                    # (the sub-rows' maxima exchanged between the consumers; checked bf16 and fp16) 2.744 -> 0.792 ms
                    # against the tl plan (3.47x), 0.683 with KTRIM (4.0x, 34.0% of copy)
                    ("int4", 18944): True}
QUANT_GLUON_WIDE_STAGES = 2  # the ring's stages (each two rows, 48 KiB); run 7: one stage 0.86x (fp8), 0.97x (mxfp4)
# ... its tuning by (format, n), else format: stages, ahead (block j + 1's mixing issued behind block j's second
# product), pingpong (the two consumers take turns at the products: one's epilogue under the other's products). Run 7
# (all checked): pingpong 0.86x at fp8 (0.444 ms), 1.00-1.01x 4-bit; ahead 0.98-1.01x; both 0.85x fp8; one stage
# 0.86x fp8, 0.97x mxfp4: none kept
QUANT_GLUON_WIDE_TUNING = {}
# session 31: hadamard_quantize's Gluon kernel for m <= 32 x p, p = 128..1024 (gluon_quantize_kron.py: A = H_32 (x) H_2
# resident, rows by TMA as [1, 32, 2, 64] boxes, the H_(p/128) butterfly across blocks, wgmma), plan path "gluon_kron",
# plan tuning "gluon_kron". Keys: (format, n), else the format. Off until a GPU run checks and times it
# (experiments/hadamard/gpu_gluon_widths.py). Run 2 of session 31 (H100, notes/hadamard/runs/
# gluon_widths_run2_session31_h100.txt; every check ok: codes 99.98-100% equal to the float64 reference's, all written,
# e5m2 / nvfp4 dynamic / fp8 static / fp16 too), over the shipped kron-tiled plan in the same run: 14336 fp8 0.507 ->
# 0.382 ms (1.33x, 71.5% of copy), int8 1.19x (62.6%), mxfp4 1.20x (41.5%), int4 2.42x (52.3%); 28672 fp8 1.90x
# (47.5%; INSIDE off 2.53x, 63.4%), int8 1.84x, mxfp4 2.07x, int4 2.27x. nvfp4 1.00x / 0.95x: off
QUANT_GLUON_KRON = {(f, n): True for f in ("fp8_e4m3", "int8", "mxfp4", "int4") for n in (14336, 28672)}
# run 4 of session 31 (gluon_widths_r3_run4_session31_h100.txt, checked): nvfp4 with SCALE_ONCE 14336 0.750 -> 0.630 ms
# (1.19x the tl plan, 37.4% of copy), 28672 (INSIDE on) 1.397 -> 0.903 (1.55x, 26.0%)
QUANT_GLUON_KRON.update({("nvfp4", 14336): True, ("nvfp4", 28672): True})
QUANT_GLUON_KRON_STAGES = 2  # the ring's stages (a stage: two rows at split 1, one at split 2)
# (m, p) -> dict(split=1 or 2, inside=bool) (gluon_kron_tuning's defaults, below, elsewhere). sm_90a, CPU: 28 x 512
# split 2 spills nothing; four blocks a consumer (28 x 512 split 1, 28 x 1024 split 2) spill 92-220 B with the butterfly
# in registers and nothing with INSIDE (each block's mixing by the signs: twice the mixing products)
# Keys (m, p), then (format, n) over it. Run 2: fp8 at 28672 with INSIDE off (the butterfly in registers, 220 B spilled)
# 0.432 ms against INSIDE's 0.576 (1.33x, both checked): the spills cost less than four times the mixing
# Run 4 (checked): INSIDE off at 28672 for int8 1.32x, mxfp4 1.18x, int4 1.23x, nvfp4 1.21x, the transform 1.28x
# (0.539 -> 0.420 ms, 85.3% of copy); nvfp4 keeps INSIDE: with SCALE_ONCE and INSIDE off (0.655 ms, 2.27x) 3 of 114688
# e4m3 scales differed from the float64 reference's (scale boundaries; the strict check's bound is 2): until re-checked
# Session 32 run 1 (notes/hadamard/runs/gluon_widths_final_run1_session32_h100.txt, H100): the shipped nvfp4 (INSIDE)
# had 3 scales off the float64 reference's too (the same scale-boundary exposure, not INSIDE's), INSIDE off 2 (given
# global scale) and 0 (dynamic), both checked ok; INSIDE off 0.913 -> 0.672 ms (1.36x, 35.0% of copy): INSIDE off
QUANT_GLUON_KRON_TUNING = {(28, 512): dict(split=2, inside=False), (28, 1024): dict(split=2, inside=False)}
# hadamard_transform at m x p on the Gluon kernels' STORE format (kron._gluon_fits: the wide one at m x 64 with
# 128 < m <= 192 and 148 x 128, the kron one at m <= 32 x 128..1024), (m, p) -> True. Run 2 of session 31 (H100, checked:
# 1.0x the rounding floor, all written, an inf row as the reference's, in place, H_m^T, odd row counts), over the
# shipped plan in the same run: 172 x 64 0.991 -> 0.533 ms (1.86x, 68.0% of copy), 28 x 512 1.16x (99.5%), 28 x 1024
# 2.05x (63.9%), 148 x 128 1.49x (45.2%)
KRON_GLUON = {(172, 64): True, (28, 512): True, (28, 1024): True, (148, 128): True}
# session 31: the Gluon kernels' group scales (groups of 16 / 32 inside a sub-row: mxfp4, nvfp4) computed once a group
# in a compact layout, then the reciprocals moved back (gluon_quantize_wide._scales_once; plan tuning "scale_once"), not
# on each of the four threads of the group's quad. sm_90a SASS, 11008: nvfp4 7544 -> 6480 instructions (spills 16 ->
# 8 B), mxfp4 5784 -> 5728 (40 -> 12 B). Keys: (format, n), else the format. Run 4 of session 31 (H100, checked, over the
# Gluon kernel without it): nvfp4 11008 1.19x (0.733 -> 0.618 ms), 14336 1.19x, 28672 1.65x (INSIDE), 18944 1.17x;
# mxfp4 0.98-1.05x: off
QUANT_GLUON_SCALE_ONCE = {"nvfp4": True}
# session 31: the Gluon wide kernel's last K chunk of the mixing cut at the 16-multiple past m (gluon_quantize_wide's
# KTRIM; plan tuning "ktrim"): 172 x 64 multiplies K = 48 of the last 64 (32 + 16), 148 x 128 K = 32 (the padded
# sub-rows are zeros either way). sm_90a: wgmma 120 -> 114 (11008), 192 -> 168 (18944); spills fp8 44 -> 12 B (11008),
# 152 -> 56 (18944), mxfp4 11008 40 -> 8. Keys: (format, n), else the format. Run 4 of session 31 (H100, checked, over
# the Gluon kernel without it): 18944 fp8 1.11x (0.665 -> 0.598 ms, 45.7% of copy), int8 1.08x, mxfp4 1.04x, nvfp4
# 1.08x (with SCALE_ONCE 1.28x), int4 1.16x; 11008 fp8 1.03x, int8 1.03x, mxfp4 1.01x, nvfp4 1.00x; the transforms'
# STORE 0.94x (148 x 128) / 0.97x (172 x 64): not there (quantize.gluon_wide_transform)
QUANT_GLUON_KTRIM = {**{(f, 18944): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")},
                     ("fp8_e4m3", 11008): True, ("int8", 11008): True}
# session 31: the Gluon kernels' FOLD (plan tuning "fold"): 1 / sqrt(n) folded into the group maxima and reciprocals
# (as quantize_kernels' FAST epilogue does: y / s = W x (rscale / s)), not multiplied into every value: one FMUL a value
# fewer; codes may move one step at near-ties (the FAST tolerance). Keys: (format, n), else the format. Off until timed
# Session 32 run 1 (notes/hadamard/runs/gluon_widths_final_run1_session32_h100.txt, H100; every FOLD case checked ok:
# codes 99.984-100% equal to the float64 reference's, scales within the bound), over the shipped plan in the same run:
# on where >= 1.02x: 14336 mxfp4 1.06x, nvfp4 1.02, int4 1.03; 28672 fp8 1.07, int8 1.20, mxfp4 1.02, nvfp4 1.12
# (INSIDE; INSIDE off 1.03), int4 1.03; 18944 fp8 1.02, int8 1.04, mxfp4 1.03, int4 1.02; 11008 fp8 1.03, int8 1.03,
# mxfp4 1.03, int4 1.02. Off: fp8 14336 0.97x, int8 14336 1.01, nvfp4 18944 / 11008 1.01
QUANT_GLUON_FOLD = {**{(f, 14336): True for f in ("mxfp4", "nvfp4", "int4")},
                    **{(f, 28672): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")},
                    **{(f, n): True for f in ("fp8_e4m3", "int8", "mxfp4", "int4") for n in (18944, 11008)}}
# session 32: the wide kernel's UNITS at 148 x 128 (HALVES 2; plan tuning "units"): each output block's mixing once
# (consumer 0 the sub-row blocks J = 0, 1 of both column halves, consumer 1 J = 2) instead of both consumers running
# both halves' mixing: 30 products a row instead of 48 (sm_90a, CPU). Keys: (format, n), else the format; the transform
# (kron "gluon" path): KRON_GLUON_TUNING by (m, p) (below). Off until a GPU run checks and times it
# Run 7 of session 32 (notes/hadamard/runs/gluon_widths_s32c_run7_session32_h100.txt, H100, bf16; UNITS checked
# against float64 there (every format at 18944) and in run 2 (fp16 too)), over the shipped HALVES 2 in the same run:
# int4 1.08x (0.669 -> 0.618 ms, 37.6% of copy): on; fp8 0.93x, int8 0.91x, mxfp4 0.98x, nvfp4 0.95x: off. The 148 x 128
# transform: UNITS 1.22x (55.1%), with STORE2 1.79x (80.9%), + KTRIM, NOZERO, CLAMP_LO 1.94x (0.802 -> 0.413 ms, 87.7%)
# but the STORE2 transforms' checks were cut by the run's budget (55 s): off until checked (KRON_GLUON_TUNING empty)
QUANT_GLUON_UNITS = {("int4", 18944): True}
# hadamard_transform's "gluon" plan tuning by (m, p) (kron.gluon_config: split, inside, stages, ktrim, units, store2,
# nozero, clamp_lo; the caller's tuning over it). Session 33 run 1 (notes/hadamard/runs/gluon_widths_s33_run1_session33_h100.txt,
# H100, every check ok: 1.0x the floor, an inf row, 3 rows, in place, H_m^T): 148 x 128 1.99x (44.7 -> 89.1% of copy),
# 28 x 1024 NOZERO + CLAMP_LO 1.05x (89.3%); 172 x 64 1.01x: not taken
KRON_GLUON_TUNING = {(148, 128): dict(units=True, store2=True, stages=2, ktrim=True, nozero=True, clamp_lo=True),
                     (28, 1024): dict(nozero=True, clamp_lo=True)}
# session 32: two switches of both Gluon kernels' value path (plan tunings "nozero", "clamp_lo"; keys (format, n), else
# the format): NOZERO, the group formats' sub-rows past m left unzeroed (one select a value at m < 32, a third of the
# values at m x 64); CLAMP_LO, the second product's lo piece as max(x - h, -2^120) (one max a value, not a compare and
# a select; the same pieces for finite x). The transform: tuning "nozero" / "clamp_lo" on its kron plan. Off until timed
# Run 7 of session 32 (gluon_widths_s32c_run7_session32_h100.txt, H100; both together checked against float64 at
# mxfp4 / nvfp4 / int4 x 14336 / 28672 and mxfp4 11008: codes 99.9989-99.9997% equal, scales within the bound), over the
# shipped plan in the same run: mxfp4 14336 1.06x (42.3 -> 44.9% of copy), nvfp4 14336 1.05x (40.6%), int4 14336 1.04x
# (55.3%), mxfp4 28672 1.08x (43.7%): on there; nvfp4 28672 1.00x: off; the rest untimed (the run's budget)
# Session 33 run 1 (notes/hadamard/runs/gluon_widths_s33_run1_session33_h100.txt, every case checked ok), on where >= 1.03x:
# mxfp4 11008 1.07x, nvfp4 11008 1.06x, mxfp4 18944 1.07x, nvfp4 18944 1.05x, int4 28672 1.04x; CLAMP_LO alone fp8 11008
# 1.03x; left off: int4 11008 1.01x, CLAMP_LO fp8 14336 / 18944 1.00x, int8 28672 1.01x
_NZ_CL = {("mxfp4", 14336): True, ("nvfp4", 14336): True, ("int4", 14336): True, ("mxfp4", 28672): True,
          ("mxfp4", 11008): True, ("nvfp4", 11008): True, ("mxfp4", 18944): True, ("nvfp4", 18944): True,
          ("int4", 28672): True}
QUANT_GLUON_NOZERO = dict(_NZ_CL)
QUANT_GLUON_CLAMP_LO = {**_NZ_CL, ("fp8_e4m3", 11008): True}


# here, not in quantize.py: kron.py's transform plan asks it too, and quantize.py imports kron
def gluon_kron_tuning(m: int, p: int, tuning: dict, fmt: str | None = None) -> tuple[int, bool]:
    """(split, inside) of the "gluon_kron" kernel at m x p (gluon_quantize_kron's SPLIT and INSIDE): the tuning's,
    else QUANT_GLUON_KRON_TUNING's by (m, p), else a consumer a row up to two blocks of 64 sub-rows (p <= 256),
    a row shared by the two consumers past that, and the butterfly across blocks by the mixing's signs (INSIDE) where
    a consumer holds four blocks (sm_90a: 92-220 B spilled with the butterfly in registers, none INSIDE)."""
    table = {**QUANT_GLUON_KRON_TUNING.get((m, p), {}), **QUANT_GLUON_KRON_TUNING.get((fmt, m * p), {})}
    f = p // 64
    split = tuning.get("split") or table.get("split") or (1 if f <= 4 else 2)
    inside = tuning.get("inside", table.get("inside", f // (2 * split) == 4))
    return split, bool(inside)

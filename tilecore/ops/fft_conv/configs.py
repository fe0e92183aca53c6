"""The FFT convolution's tables (plan.py reads them). GPU figures: notes/fft_conv/README.md."""
from __future__ import annotations

# The pair kernel (kernels_pair.py: two sequences as one complex one, float16 DFT matrices on tensor
# cores): N -> (N1, N2, pairs per program, warps), 2N = N1 N2; pairs 0: one pair a program in the
# transpose-free kernel (fft_conv_pair1_kernel, correct on the H200 at 256..4096 but 1.2-1.7x slower
# than the PAIRS kernel: run 4). N1 >= 32 (the first product's inner dimension N1/2 must be >= 16 for
# tl.dot). From the H200 sweeps of session 25 (notes/fft_conv/runs): 256 (32, 16, 2, 4) 44 us in
# runs 3 and 4 (4 pairs: 40 and 61); 1024 (32, 64, 1, 4) 192 us against 203 (64 x 32). At 2048 every
# pair configuration failed (illegal memory accesses, wrong results) but each time after a
# CUFFT_INTERNAL_ERROR in the same process, the references included: the check now keeps cuFFT out
# (gpu_check.py); 2048 runs the long form until a clean run clears them. H100 v7 (session 26): the
# three 2048 candidates, each the first step of a fresh process with no cuFFT before it, still hit an
# illegal memory access: the failure is the kernel's build at 64 x 64, not cuFFT's.
PAIR_CONFIGS = {
    256: (32, 16, 2, 4),
    512: (32, 32, 2, 4),
    1024: (32, 64, 1, 4),  # v7 (H100): loop 4 hoisted 181 us against 192 as candidates, but the plan
    # itself (this configuration through fft_conv) 186 us in that run: within its noise, du (CONJ) untried
    4096: (128, 64, 1, 8),  # 108 bytes of spill (16 warps cap registers at 128: 1.7 KB)
}

# The one-pass three-factor kernel (kernels_mono.py, session 28): N -> (A, B, C, pairs a program, warps),
# 2N = A B C (C = 1: order 2), A/2, B, C >= 16 (or C = 1; tl.dot's smallest inner dimension). Every stage a
# product over one axis of the pair's tile with no permute. OFF (empty) until a GPU run checks it: the
# switch is an entry here, e.g. MONO_CONFIGS = {4096: (32, 16, 16, 4, 8)}
# (experiments/fft_conv/gpu_onepass.py checks and times MONO_CANDIDATES).
MONO_CONFIGS: dict = {}
MONO_CANDIDATES = {  # (A, B, C, loop, warps[, permute[, kfull]]); sm_90a registers, spill bytes
    # run 7 (H100, session 28; every check at the floor), ms against the shipped plan in the same run:
    # 1024 loop 1 0.265 (loop 4 0.285) vs pair 0.190; 2048 32x128 0.766, 64x64 0.691 vs long 0.465;
    # 4096 32x16x16 at 16 warps 2.085 vs pair 0.822; 8192 64x16x16 6.555 vs long 2.363: OFF everywhere.
    # kfull (after run 7): the spectrum and the stage-2 twiddles laid out as the tile (contiguous loads,
    # no per-element gathers: registers 128 -> 95 at 1024, spills 524 -> 52 B at 4096 permuted, 8 warps)
    1024: [(32, 64, 1, 1, 4), (32, 64, 1, 1, 4, False, True)],  # 128, 0; 95, 0
    2048: [(64, 64, 1, 1, 8, False, True)],
    4096: [(32, 16, 16, 1, 8, True, True), (32, 16, 16, 1, 16, True, True),  # 255, 52; 128, 124
           (64, 128, 1, 1, 8, False, True)],  # order 2 in the same kernel: 255, 0
}

# The one-pass kernel in Gluon (gluon_onepass.py, session 29: every DFT stage a wgmma, the DFT matrices
# resident in shared memory, a persistent grid): N -> (A, B, programs a multiprocessor; 0: one program a
# pair, ASYNC: a complex product's four wgmmas issued at once, TMA: u and y by TMA, the next pair's u
# loaded under this one's products), 2N = A B, B = 64. OFF (empty) until a GPU run checks it; the switch
# is an entry here, e.g. GLUON_ONEPASS = {1024: (32, 64, 3, True, True)} (plan.plan takes it on Hopper
# under a checked triton). sm_90a (registers, shared memory; no spill anywhere): 1024 148, 40 KiB (sync
# or ASYNC; TMA: 51 KiB, sync 119 registers: 4 programs fit a multiprocessor); 2048 255 (ASYNC 209,
# ASYNC + TMA 204), 64 KiB (TMA 84 KiB). A 6th entry, CHUNK > 0: the chunked kernel (the tile's columns
# CHUNK at a time, ASYNC; N = 4096 as 128 x 64): 4096 at 32 203 registers, 145 KiB with TMA (one program a
# multiprocessor), 243 / 104 KiB without; 2048 at 32 188, 77 KiB with TMA. A 7th, RFFT: the kernel reads
# the rfft's bins itself (no host layout of the spectrum a call: H x 2N complex gathered, 12.6 MB at
# 1024): 1024 166 registers (TMA, sync or ASYNC), 4096 chunked 255, no spill. An 8th, WARPGROUPS (chunked):
# 2 runs two warpgroups a program (gl.warp_specialize, 4 + 4 warps), each on its own pairs, sharing the
# resident matrices: 4096 218 KiB, 255 / 248 registers, no spill (with RFFT 32 B of spill: left out). A
# 9th, warps (the whole-tile kernel): 8 splits each product's columns between two warpgroups: 1024 with
# TMA + RFFT 121 registers, 52 KiB (2 programs of 8 warps a SM).
# ON (session 29, run 7 on the H100: every check at the floor, bf16 1.04x, correlation, NaN, odd batch;
# op times at B16 H768 bf16 against the shipped paths of the same run): 1024 0.146 ms (3.59x torch.fft)
# vs pair 0.190; 2048 chunked 0.380 (2.78x) vs long 0.472; 4096 two warpgroups 0.745 (2.79x; kernel
# alone 0.573: the host's spectrum layout is the rest) vs pair 0.836.
# Session 30 run 9 (H100, notes/fft_conv/runs/fft_conv_gpu_onepass_run9_session30_h100.txt; every check at the
# floor: bf16 1.04x, fp16 2.5x, correlation, NaN/odd batch, the op's keyed path): the twiddles computed in the
# kernel (TW_SFU, the 10th element) at every N: 1024 0.138 ms (2 programs a SM: 187 registers) vs 0.151; 2048
# 0.204 = 5.17x torch.fft vs 0.253; 4096 0.567 vs 0.612
# Session 31 call 3 (H100, notes/fft_conv/runs/onepass_kpre_run3_session31_h100.txt; every check at the floor: bf16
# 1.04x, correlation, NaN/odd batch, fp16 2.52-2.55x, the op's keyed path): 1024 RFFT 2 + CONTIG + KPRE 3 (the
# channel's spectrum gathered by cp.async into shared memory once for its pairs) 0.1225 ms = 4.28x torch.fft against
# the tuple before's 0.1396 (RFFT 2 alone 0.1292, KPRE 2 0.1330, KPRE 1 0.1398); 4096 KPRE 1 (a chunk's bins loaded
# into registers before its stage 1) 0.4365 = 4.76x against 0.4808 (KPRE 2 + YALIAS 0.4522, KPRE 2 chunk 16 0.600)
# Session 31 call 5 (the final call, H100, notes/fft_conv/runs/onepass_final_run5_session31_h100.txt; every check at the
# floor: bf16 1.04x, correlation, NaN/odd batch, fp16 2.51-2.52x): LEAN 3 (one reduction for u's scales and flags, one
# for the spectrum product's, x read from u's box in the wgmma's layout): 1024 with KPRE 3 at 3 programs a SM (maxnreg
# 168) 0.0753 ms = 6.98x torch.fft, 36.6% of copy (at 2 a SM 0.0848; call 3's tuple 0.1240 in the same run); 2048
# RFFT 2 + LEAN 3 0.1577 = 6.69x (RFFT 2 alone 0.1831, the tuple before 0.2069). 4096 KPRE 1 + LEAN 1 0.4341 against
# 0.4383 / 0.4437 (1-2%, within the run's noise): not flipped
GLUON_ONEPASS: dict = {
    1024: (32, 64, 3, False, True, 0, 2, 1, 4, True, True, 3, False, 3, 168),  # call 3: (32, 64, 2, ..., True, True, 3)
    2048: (64, 64, 2, True, True, 0, 2, 1, 4, True, False, 0, False, 3),  # session 29: (..., 0, True, 1, 4, True) 0.2069
    4096: (128, 64, 1, True, True, 32, 2, 2, 4, True, False, 1, False, 1),  # session 32 call 7: + LEAN 1 (below)
    # (session 31 call 3: (..., 32, 2, 2, 4, True, False, 1) KPRE 1; session 30 run 10: RFFT 2, 0.472 ms)
}
# Session 32 call 7 (H100, notes/fft_conv/runs/onepass_dk_run7_session32_h100.txt; every check at the floor: bf16 1.04x,
# correlation, NaN/odd batch, fp16 2.55x, the op's keyed path): 4096 LEAN 1 on KPRE 1 0.4337 ms = 4.79x torch.fft against
# the tuple before's 0.4464 / 0.4463 in the same run (2.8%; faster in call 2 too, 0.4356 vs 0.4370 / 0.4389, and in
# session 31's call 5, 0.4341 vs 0.4383): ON. PRESCALE 0.4352 (no gain: the reduction it moves off the chain is still
# a barrier round), with KPRE 2 + YALIAS 0.4596, KPRE 0 + YALIAS 0.4758: off
GLUON_ONEPASS_CANDIDATES = {  # checked and timed by experiments/fft_conv/gpu_onepass.py
    # session 29 (H100), op ms: run 7: 1024 ASYNC 0.3456 (kernel 0.1428), ASYNC+TMA 0.3648 (0.1343), ASYNC+TMA+RFFT
    # 0.1478, TMA+RFFT 0.1460, one program a pair 0.1778; 2048 TMA 0.7995 (kernel 0.2391: host layout), chunked RFFT
    # 0.3802; 4096 chunked 1.4139 (1.2300), two warpgroups 0.7454 (0.5725). Run 8: 1024 8 warps 0.267 (slower);
    # 2048 chunked 0.377; 4096 two warpgroups without RFFT 0.747. Session 30: the shipped tuples, re-checked after
    # the stage helpers' refactor and through the op's keyed launch, and a 10th element, TW_SFU: the twiddles
    # computed in the kernel (cos/sin.approx of the exactly reduced angle) instead of read from the (B, A) table
    # (at 4096 the table is 64 KiB a plane and the program's 218 KiB of shared memory leaves L1 ~28 KiB: it
    # comes from L2 every chunk). sm_90a (registers, spill bytes): 1024 187, 0 (166 from the table: 2 programs
    # a SM); 2048 whole 255, 92 (88); 2048 chunked 32 208, 0; 4096 two warpgroups chunk 32 255, 12 (64 from the
    # table), chunk 16 255, 0 (210 KiB)
    # run 9 (H100): 1024 session 29's 0.1506, TW_SFU 2/SM 0.1382; 2048 0.2527, TW_SFU whole 0.2039, chunked 32 0.2682;
    # 4096 0.6120, TW_SFU chunk 32 0.5672, chunk 16 0.6335. Probes (wrong results) of session 29's tuples: 1024 no
    # square products 0.124, no spectrum scale 0.142, no twiddle/spectrum loads 0.091, all three 0.066; 4096 0.537,
    # 0.579, 0.358, 0.234: the loads bind (the spectrum's gather now that the twiddles are computed)
    # Final batch: an 11th element, CONTIG: each walker takes a contiguous block of pairs (a channel's pairs in a
    # row: its spectrum from L1 after the first, where L1 has room) instead of every programs-th; and RFFT 2 at
    # 4096 (each spectrum bin one 64-bit load). sm_90a: 1024 192 registers, 2048 100 B of spill, 4096 12 B
    # run 10 (the lead's final batch): RFFT 2 at 4096 0.472 ms against 0.569 (ON); CONTIG 1% at 1024, slower at 2048
    # Session 31: a 12th element, KPRE: a block's spectrum bins requested before its stage 1, their L2 latency under
    # stages 1-3 (run 9's probes: the loads are ~40% of the time, the spectrum's gather what TW_SFU left): 1 loaded
    # into registers there, 2 gathered by cp.async into a [64, C] int64 shared tile (RFFT 2), 3 as 2 but kept for a
    # channel's next pairs on a CONTIG walk (whole tile). sm_90a (registers, spill bytes, shared KiB): 1024 RFFT 2
    # 190, 0, 50; KPRE 1 205, 0, 50; KPRE 2 183, 0, 66; KPRE 3 179, 0, 66 (3 programs a SM need 168: maxnreg 168
    # spills 24 B without LEAN); 2048 shipped 255, 112 B; KPRE 2 255, 120 B, 116; 4096 shipped 255, 12 B, 218;
    # KPRE 1 chunk 32 255, 4 B, 218; KPRE 2 chunk 16 255, 0, 226 (chunk 32: 250 KiB, over); KPRE 1 chunk 16 255, 0, 210
    # A 14th, LEAN: 1 u's four scale / flag reductions as one and the spectrum product's scale as one (the same
    # values), 2 (whole tile, TMA) x read from u's box in the wgmma's operand layout; a 15th, maxnreg (ptxas's cap).
    # 1024 KPRE 2 + LEAN 3: 170 registers, at maxnreg 168 no spill: 3 programs a SM (66 KiB each); 2048 KPRE 2 + LEAN 3
    # 255, 80 B (shipped 112); 4096 KPRE 2 + YALIAS + LEAN 1 chunk 32 255, 0 B, 224 KiB (LEAN 1 alone: 16 B)
    # call 3 (H100, notes/fft_conv/runs/onepass_kpre_run3_session31_h100.txt), ms: 1024 session 30's tuple 0.1390,
    # RFFT 2 0.1292, KPRE 1 0.1398, KPRE 2 0.1330, KPRE 3 (CONTIG) 0.1225 (ON); 2048 KPRE 2 0.2928 (118 KiB: one
    # program a SM) vs 0.2068; 4096 KPRE 1 0.4365 (ON) vs 0.4777, KPRE 2 chunk 16 0.600, KPRE 2 + YALIAS 0.4522.
    # Final call: LEAN (and 3 programs a SM at 1024) on the new tuples, RFFT 2 at 2048 (7% at 1024). sm_90a: 1024 KPRE 3
    # + LEAN 3 170, 0 (maxnreg 168: 0); 2048 RFFT 2 255, 112 B, + LEAN 3 104 B; 4096 KPRE 1 + LEAN 1 255, 4 B, 224 KiB
    # Session 32 (helper HF): 1024 and 2048 settled (the shipped tuples re-checked only); a 16th element, PRESCALE: the
    # spectrum product's float16 scale from the block's spectrum (L x its largest |Re K|, |Im K| / 256: a bound of
    # |Y| / 256, so D = conj(F_B) @ Y / scale stays under 64 x 256) reduced while stage 3's wgmmas run, where the largest
    # |Y| was reduced after them, on the chain (probe 2, session 30: that reduction 5% at 4096). Emulation: bf16 as the
    # shipped scale (-1..+3%), fp16 up to 16% more error on a DC-like u. sm_90a at 4096: KPRE 1 + LEAN 1 + PRESCALE 255,
    # 4 B (as LEAN 1), 224 KiB; KPRE 2 + YALIAS + LEAN 1 + PRESCALE 255, 0 B, 224 KiB; KPRE 0 + YALIAS + LEAN 1 +
    # PRESCALE 255, 4 B, 192 KiB. (2048 with it: 272 B of spill; 1024 at maxnreg 168: 36 B: not candidates)
    1024: [GLUON_ONEPASS[1024]],
    2048: [GLUON_ONEPASS[2048]],
    4096: [GLUON_ONEPASS[4096],
           (128, 64, 1, True, True, 32, 2, 2, 4, True, False, 1, False, 1, 0, False, True),  # CSCALE
           (128, 64, 1, True, True, 32, 2, 2, 4, True, True, 1, False, 1, 0, False, True),  # CSCALE on a CONTIG walk
           (128, 64, 1, True, True, 32, 2, 2, 4, True, True, 1, False, 1)],  # CONTIG alone
}
# candidates the GPU check times per N: (N1, N2, pairs, warps[, loop[, stages[, hoist]]]); loop: groups
# of pairs a program runs (one program for LOOP groups of one channel), stages: that loop's software
# pipelining, hoist: the DFT matrices, twiddles and spectrum loaded once before the loop (sm_90a at
# 1024, 4 warps: loop 1 141 registers, loop 4 255 hoisted or not (no spill), loop 4 at 2 stages 8
# bytes of spill and 84 KiB of shared memory)
PAIR_CANDIDATES = {
    256: [(32, 16, 2, 4)],
    512: [(32, 32, 2, 4)],
    1024: [(32, 64, 1, 4), (32, 64, 1, 4, 4, 1, True)],
    2048: [(64, 64, 1, 8), (64, 64, 2, 8), (128, 32, 1, 8)],  # (which shapes fault at 2048: v8)
    4096: [(128, 64, 1, 8)],
}
# v7 (H100, session 26) also timed, ms: 256 loop 4 0.0495, hoisted 0.0549 (0.0448 without); 512 0.1017 /
# 0.0853 (0.0836); 1024 loop 2 0.2129, loop 4 0.2090, hoisted 8 warps 0.3575; 4096 loop 4 1.603 (0.823)

# The filter's gradient through the pair kernel's transforms (kernels_pair.fft_conv_dk_pair_kernel: u's
# and dy's pairs transformed, Y conj(X) summed over a program's pairs, the batch sum and one inverse
# DFT a channel on the host): N -> (N1, N2, pair groups a program, warps). Empty until a GPU run
# checks it: dk goes through torch.fft (two rfft of B H sequences of 2N, a product, a batch sum, an
# irfft), the backward step's largest part (notes/fft_conv, v7). The GPU check times the candidates.
# Session 32 call 7 (H100, notes/fft_conv/runs/onepass_dk_run7_session32_h100.txt): at 4096 (128, 64, 8, 8) dk 1.630 ms
# against torch.fft's 2.322 (bf16 1.038x the floor), the training step (forward + backward) 2.626 ms against 3.320 with
# torch.fft's dk (torch.fft's autograd 6.223): ON. 1024's tl candidates 0.260 / 0.268 ms (the Gluon kernel's below)
DK_CONFIGS: dict = {4096: (128, 64, 8, 8)}
# Session 32: the same on the Gluon one-pass kernel's forward stages (gluon_onepass.fft_conv_gluon_dk_kernel: every
# product a wgmma, the DFT matrices resident in shared memory; Hopper, launch.dk_gluon): N -> (A, B, pair groups a
# program), 2N = A B, B = 64. Off (empty) until a GPU run checks it; it goes before DK_CONFIGS where it has N. sm_90a:
# 1024 (32, 64, 8) 201 registers, 0 spill, 38 KiB (2048, 64 x 64: 600 B of spill: not a candidate).
# Emulation (gluon_emulate.emulate_dk): bf16 1.05x the floor, fp16 2.4x.
# Session 32 call 7: 1024 (32, 64, 8) 0.1827 ms against torch.fft's dk 0.6275 (3.43x; LOOP 4 0.1910, the tl kernel
# 0.2597), bf16 1.038x the floor: ON. The training step at B16 H768 did not move (1.579 ms with it, 1.550 with torch.fft's
# dk, torch.fft's autograd 1.607): at 1024 the step's GPU work is ~0.35-0.8 ms, the rest the host's (its launches)
DK_GLUON: dict = {1024: (32, 64, 8)}
# XSMEM (a 4th element; session 32, after call 7, not run on a GPU): u's transform parked in shared memory (float32)
# while dy's runs and the sum kept there, one plane at a time: 2048 (64 x 64) 255 registers, 0 spill, 116 KiB (one
# program a multiprocessor by shared memory)
DK_GLUON_CANDIDATES = {1024: [(32, 64, 8)], 2048: [(64, 64, 8, True)]}
DK_CANDIDATES = {
    256: [(32, 16, 8, 4)],
    512: [(32, 32, 8, 4)],
    1024: [(32, 64, 8, 4), (32, 64, 4, 4)],
    4096: [(128, 64, 8, 8)],
}

# The three-pass form (kernels_long.py) for N whose pair does not fit a program's registers:
# N -> (N1, N2, BN columns a program in passes 1 and 3, BK1 rows in pass 2, KC the chunk of N1 a
# product takes, warps of passes 1 and 3, warps of pass 2). N2 <= 128: pass 2's F_N2 (re, im) whole
# in registers or shared memory. Pass 1's loop over column blocks is not pipelined (pipelined, it
# asked 480 KiB of shared memory at 16384). sm_90a: python -m tilecore.ops.fft_conv.report.
LONG_CONFIGS = {
    2048: (64, 64, 32, 16, 32, 4, 4),  # 454 us (1.73x torch.fft; run 3), the pair kernels crashed there
    8192: (128, 128, 32, 32, 64, 4, 8),  # 2.31 ms against 2.65 (BN 64, BK1 16; run 3)
    16384: (256, 128, 32, 32, 64, 4, 8),  # 5.86 ms against 9.58 (BN 64, BK1 16, KC 32; run 3)
}
LONG_CANDIDATES = {
    2048: [(64, 64, 32, 16, 32, 4, 4)],
    8192: [(128, 128, 32, 32, 64, 4, 8), (128, 128, 32, 64, 64, 4, 8), (128, 128, 16, 32, 64, 4, 8),
           (128, 128, 32, 32, 64, 4, 8, True)],
    16384: [(256, 128, 32, 32, 64, 4, 8), (256, 128, 32, 64, 64, 4, 8), (256, 128, 16, 32, 64, 4, 8),
            (256, 128, 32, 32, 64, 4, 8, True)],  # (True: GAUSS, three-product complex products)
}

# the dtypes the pair kernel serves: its float16 products give bf16 outputs at ~1.04x their rounding
# floor and fp16 outputs at ~2.5x theirs (tests/fft_conv); float32 takes the float32 kernel below
PAIR_DTYPES = ("bfloat16", "float16")

# The float32 kernel (kernels.py, one sequence per program, float32 products): N -> (N1, N2), 2N =
# N1 N2. The whole sequence is one program's registers: at N = 2048 (64 x 64) that spilled 1.7 KB
# (tf32x3, 8 warps), so it serves float32 at 256..1024 (2048 is correct in the interpreter).
TL_FACTORS = {256: (32, 16), 512: (32, 32), 1024: (32, 64)}

# warps per program by N (1024: 170-255 registers, 0-8 bytes of spill)
TL_WARPS = {256: 4, 512: 4, 1024: 8}

# tensor-core precision of the kernel's float32 products on a GPU ("tf32x3": about float32's accuracy)
TL_PRECISION = "tf32x3"

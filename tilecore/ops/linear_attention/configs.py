"""Linear attention's tables (plan.py reads them). The forward's and the no-decay backward's blocks come
from the session-26 GPU sweeps (experiments/linear_attention/gpu_forward.py, gpu_backward.py; each
comment names its figure); the rest are the choices that compile for sm_90a without spilling
(``python -m tilecore.ops.linear_attention.report``; an H100 has 64K registers an SM, 255 a thread)
or what a GPU check passed (notes/linear_attention/README.md)."""
from __future__ import annotations

# tokens a chunk, by decay kind (0 none, 1 scalar, 2 per channel). 64 spilled at Dk = Dv = 128 (and for
# Mamba-2 and Based) where 32 did not (sm_90a, 8 warps). Per-channel decay's intra-chunk scores are
# dots through sub-chunk references but for their diagonal SUB x SUB blocks (elementwise): 64 (was 16
# with every score elementwise, decision 3 of notes/linear_attention)
CHUNK = {0: 32, 1: 32, 2: 64}
CHUNKS = (16, 32, 64)  # what a caller may ask for (tl.dot needs >= 16 rows)

# float32 elements of a program's state block in registers ([BK, BV], Based's [256, BV]): 8192 is 64
# registers a thread at 4 warps
STATE_ELEMS = 8192
# per-channel decay: tokens of a sub-chunk (kernels_tl.SUB: the intra-chunk scores' diagonal blocks are
# elementwise, the rest tensor-core dots), elements of one [BT, SUB, KB] slice of the diagonal blocks,
# and the backward's key-channel block (its diagonal blocks are elementwise over [BT, SUB, block])
CHANNEL_SUB = 16
CHANNEL_SLICE_ELEMS = 8192
# key blocks of 32: run 2 (H100, GLA d128, chunk 64, the register-loop diagonal) dQ 12.2 ms and dK/dV 47.6
# at 32 against 14.8 and 60.5 at 16 (half the dv partial sums, half the dQ programs' repeated do v^T);
# the gathered diagonal compiles at 32 with 36 / 584 bytes spilled (dQ / dK/dV; 0 / 516 at 16)
# What ships is what a GPU check passed (bf16 against float64 on the H100, run 2 of gpu_backward.py): key
# blocks of 16 and the [NC, SUB, SUB, C] diagonal (CHANNEL_DIAG 0). The register-loop (1) and gathered (2)
# diagonals with key blocks of 32 pass the interpreter's tests and compile for sm_90a, but a gated
# backward must be checked on Hopper itself (flash-linear-attention's issue 640: a miscompile there), so
# they stay overrides (plan diag=..., BKQ/BKB=32) until gpu_backward.py has checked them
CHANNEL_BWD_KEY_BLOCK = 16
CHANNEL_DIAG = 0
# per-channel decay's FORWARD with one reference a chunk (kernels_tl._channel_chunk, session 29): 3 the
# factored scores as one dot where the chunk's span of G allows (fp16 8, bf16 64), else the sub-chunk
# form; 4 the same with the operands split hi + lo (three dots: fp16 interpreter 1.45-1.52x the floor
# against diag 0's 1.54-1.74 and 3's 1.89-2.08). The backward kernels read 3 and 4 as 0 (the same code).
# 0: off (the forward takes CHANNEL_DIAG) until experiments/linear_attention/gpu_gla.py checks it on the
# H100 (a gated kernel: FLA's issue 640); on: 3 (fastest) or 4 (diag 0's accuracy). Run 4 of session 29 (H100,
# B16 H16 N4096 d128 bf16, FLA chunk_gla 4.196 ms in run 5): diag 0 14.15 ms, diag 4 3.73, diag 3 3.23, diag 3 at
# chunk 32 / 4 warps 2.44 (1.72x chunk_gla); bf16 against float64: diag 3 2.0x the floor, diag 4 1.42-1.46x,
# diag 0 1.41-1.53x, every check passed. Run 7: diag 3 at chunk 32, BV 128, 8 warps 2.32 ms (1.81x; checked in
# bf16 at d128), diag 4 there 2.78 (1.51x). The final batch checks those blocks in fp16 and at d64 too
# Final run of session 29 (H100): every check passed at chunk 32 / BV 128 (bf16 d128, fp16, d64 v128); 3 stages
# 2.146 ms = 1.96x chunk_gla (4.196, call 5), the same output as 2 stages (2.285). On
CHANNEL_FWD_DIAG = 3
# its blocks (chunk BT, value block BV, warps, stages) where Dk <= 128 and the caller gives no chunk; None: the
# per-channel defaults (chunk 64, BV 64, 8 warps, 2 stages). sm_90a: at chunk 32, 8 warps, diag 3 spills nothing
# at BV 64 or 128 (one program a head), diag 4 16 / 156 B; gpu_gla.py times both against chunk 64. Run 7 (H100):
# dict(BT=32, BV=128, warps=8, stages=2) the fastest (diag 3 2.32 ms against 3.28 at the defaults)
# Session 31 (helper HB, H100, same run as FLA chunk_gla): chunk 64 / BV 128 / 8 warps / 2 stages 2.058 ms against
# the chunk-32 blocks' 2.220 (run 1, runs/forward_s31_run1_session31_h100.txt; chunk_gla 4.052 there: 1.97x against
# 1.83x) and 2.103 against 2.161 (run 3, runs/forward_s31c_run3_session31_h100.txt; 1 stage 2.110, chunk 32 with 4
# stages 2.145; 3 and 4 stages at chunk 64 exceed shared memory at d128); checked against float64 (bf16 d128 weak
# decays 1.998x the floor, strong [-6, 0] + a reset 1.414x, d64 v128 N 77 1.966x; every element written). On. Run 4
# (runs/forward_s31d_run4_session31_h100.txt): 2.121 / 2.062 ms (first / last) against chunk 32's 2.157, FLA chunk_gla
# 4.63 timed alone in that run (2.18-2.25x); fp16 d128 N 1000 checked at chunk 64 (1.986x the floor)
CHANNEL_FWD_BLOCKS: dict | None = dict(BT=64, BV=128, warps=8, stages=2)
# with CHANNEL_FWD_DIAG on: the backward's per-channel intra-chunk terms by the same one reference a chunk
# (kernels_tl._channel_dq_factored / _channel_dk_factored, and the dK/dV kernel's scores by _channel_chunk;
# plan diag 5 / 6). Off until gpu_gla.py --backward checks it on the H100 (FLA issue 640: gated backward)
CHANNEL_BWD_FACTORED = False
# per-channel decay with head dims over CHANNEL_WIDE: chunks of CHANNEL_WIDE_CHUNK (at 64 and Dk = Dv = 256
# the dQ kernel staged 236 KiB of shared memory and the forward spilled 2.2 KB, sm_90a)
CHANNEL_WIDE = 128
CHANNEL_WIDE_CHUNK = 32

# the backward's blocks where the forward's spill there (plan.tl_plan): Based's chunk and value block,
# and for Dk > BWD_KEY_BLOCK the dK/dV kernel's key block and value block
BASED_BWD_CHUNK = 16
BASED_BWD_BV = 32
BWD_KEY_BLOCK = 128
WIDE_BWD_BV = 32

# the forward's blocks (the session-26 sweeps, notes/linear_attention "Forward speed"): 4 warps ran
# 1.5-2.3x faster than 8 at every block on the H100 and the H200 (B16 H16 N4096), and a state block of
# 16384 float32 ([128, 128]: 128 registers a thread) beat 8192 for Dk = 128 (0.56 against 0.68 ms with a
# scalar decay, H200). Based: value blocks of 32 (0.81 ms against 0.93 at 64). Per-channel decay keeps
# the backward's (NUM_WARPS, NUM_STAGES: not swept)
FWD_WARPS = 4
FWD_STATE_ELEMS = 16384
FWD_STAGES = {0: 3, 1: 2}  # by decay kind: no decay 0.344 ms at 3 against 0.392 at 2; scalar 0.564 at 2
BASED_FWD_BV = 32
BASED_FWD_STAGES = 3
# the Gluon forward (gluon_forward.py: the tiles template, TMA and wgmma) on Hopper for phi(x) = x, in the
# (decay kind, Dk) cases its GPU check passed (experiments/linear_attention/gpu_forward.py, run 4, H100):
# no decay at Dk 128, 1.41x the bf16 rounding floor, 0.367 ms at B16 H16 N4096 (98% of the copy bound;
# tl 0.402). Scalar decay at Dk 128 (and Mamba-2, d_state 128) checked in run 5 (1.00-1.42x the floor, a
# reset at N 4097, D and z, N 33; every element written) and timed in run 6: simple GLA 0.489 ms against
# tl 0.585, Mamba-2 2.7B 1.884 against 2.474. Dk 64 (v128): its decay case passed runs 5 and 7's checks
# (1.42x the floor, N 77), timed in run 7 (session 27, H100, B16 H16 N4096): no decay 0.291 ms (93% of the
# copy bound) against tl 0.295, scalar decay 0.418 (65%) against tl 0.451. 2 stages: 0.367 ms against 0.375
# at 3
GLUON_FORWARD = True
GLUON_CHECKED = {(0, 128), (1, 128), (0, 64), (1, 64)}
GLUON_STAGES = 2
# the Gluon forward's PREFETCH (each chunk's decay and beta loaded during the chunk before) and Z_STAGE
# (Mamba-2's z TMA-loaded with the stage, its silu by an approximate division). Run 8 (H100, both as one
# flag then): Mamba-2 2.7B 1.773 ms against 1.886, the scalar decay d128 slower (0.527 against 0.487: 832 B
# spilled against 252). Run 9 (H100, session 27, split; every check passed: Mamba-2 h0 N 1000, N 33):
# Mamba-2 2.7B z_stage 1.553 ms, prefetch + z_stage 1.647, plain 1.885 (FLA chunk_simple_gla 3.393: 2.18x
# the kernel). So Z_STAGE on, PREFETCH off (it applies only where z is given: gluon_forward.forward)
GLUON_PREFETCH = False
GLUON_Z_STAGE = True
# the Gluon forward's OVERLAP (Q K^T, Q S_old and the state update issued together as async wgmmas, P made
# while the last two run; the weighted values in buffers of their own): checked in run 9 (H100) but no
# faster: no decay 0.368 ms against 0.367, scalar decay d128 0.488 against 0.487, d64 0.410 against 0.413,
# Mamba-2 2.008 against 1.885 (with Z_STAGE 1.604 against 1.553). Off
GLUON_OVERLAP = False
# the Gluon forward's G_STAGE (the chunk's cumulative log decay, head-major in log2 units, TMA-loaded with
# the stage: session 28's sm_90a compile put the plain kernel's G loads, and their global latency, before each
# chunk's first wgmma) and FACTORED (the intra-chunk decay 2^(G_i - G_j) as a row times a column factor where
# the chunk's G spans <= 120 in log2 units, else the [64, 64] exps), by whether beta is given (False: linear
# attention's scalar decay; True: Mamba-2). Session 28 (helper HA): compiled, not yet run on a GPU: off until
# gpu_forward.py checks and times them (its g_stage / factored rows); on: (False,) or (False, True).
# Run 7 of session 28 (H100, B16 H16 N4096 bf16, same-run FLA): the scalar decay d128 with G_STAGE 0.375 ms
# (97% of the copy bound, 2.71x chunk_simple_gla 1.016) against 0.485 (o within 6.6e-5 of the checked
# default's; its float64 check is the final batch's: then (False,)); Mamba-2 2.7B G_STAGE + EARLY_WV 1.155 ms
# (3.46x FLA 3.990) against Z_STAGE's 1.540, checked (bf16 vs float64, h0 N 1000 and N 33: 1.00x the floor,
# every element written): on for Mamba-2 (True). FACTORED no faster anywhere (0.375; Mamba-2 1.206): off.
# Run 9 (the final batch): the scalar decay's G_STAGE against float64 right everywhere (a reset at N 4097,
# strong decays d64 N 77, tiny decays N 300, fp16 N 1000 with h0, B1 H1 N 1: 1.17-1.67x the floor, forward()
# equal to the kernel), 0.375 ms again (d64 v128 0.299 = 91%): on for both
GLUON_G_STAGE: tuple = (True, False)
GLUON_FACTORED: tuple = ()
# EARLY_WV (with a decay): the state update's weighted values stored with the old state at the chunk's start
# (one barrier pair a chunk fewer; with beta its own [BT, BV] buffer for beta V), by whether beta is given as
# above. Run 7 of session 28: Mamba-2 1.155 ms against 1.217 with G_STAGE alone, checked (above): on for
# Mamba-2; without beta it read past its buffer ring then (fixed in 1d7ac6a; the final batch checks it) and the
# scalar decay is at the copy bound without it
GLUON_EARLY_WV: tuple = (True,)
# ASYNC_UPDATE (with EARLY_WV): Q S_old and the state update issued async right after Q K^T, so the tensor
# cores run them while P is made (a lighter OVERLAP: no extra buffers). Run 7 of session 28: no faster (scalar
# 0.375, Mamba-2 1.172 against 1.155): off. Session 30 with SILU_TANH: run 5 0.886 ms against 0.903, run 7
# 0.903 against 0.891 (checked: bf16 / fp16 h0 N 1000, N 33 at the default's floor): within the runs' noise, off
GLUON_ASYNC_UPDATE: tuple = ()
# SILU_TANH (Mamba-2's gate with Z_STAGE): sigmoid(z) = (1 + tanh(z / 2)) / 2 by one tanh.approx.f32 (relative
# error ~2^-11, under bf16's rounding of o) instead of ex2 and a division's rcp: a chunk-step's SFU work a
# thread from 96 (32 decay exps, 64 for the gate) to 64. Session 30 (helper HF), H100 run 2 of
# gpu_forward.py --set s30 (runs/gpu_forward_s30_run2_session30_h100.txt): checked against float64 (Mamba-2
# h0 N 1000 1.000x the floor, N 33 1.003x, as the default; every element written), the 2.7B shape's kernel
# 0.928 ms against 1.125 (the copy bound 0.685: 74% from 61%; the probes: the gate and D cost 0.35 ms, the
# decay's exps 0.22). On. Run 5: the kernel 0.903 ms (75.9% of the copy bound 0.686), the public
# mamba2_chunk_scan (keyed path) 0.996 ms and 1.002x the floor against float64 (D, z, h0, N 1000)
GLUON_SILU_TANH = True
# EXP2_FMA (with G_STAGE): the [BT, BT] decay exps' right half (1) or quarter (2) by gluon_forward.exp2_fma (a
# cubic on the FMA pipe, relative error < 7.5e-5) beside the SFU's ex2, by whether beta is given (True:
# Mamba-2): session 30's probes put the decay exps at 0.22 ms of Mamba-2's 1.125 (0.03 once SILU_TANH is on).
# Run 5 (with SILU_TANH): checked (1.000x / 1.003x the floor) but slower, 1.007 ms (half) and 0.956 (a quarter)
# against 0.903: the FMA pipe is not idle. Off
GLUON_EXP2_FMA: dict = {}
# Session 32 (helper HB, issue 33: Mamba-2 toward 75% of the napkin's bound; gluon_forward's D_EARLY, LEAN,
# UPDATE_LATE, Q_REG), by whether beta is given (True: Mamba-2) -> the names on ("d_early", "lean", "update_late",
# "q_reg"). The sm_90a SASS of the shipped Mamba-2 step: ~416 KB through shared memory an SM a chunk-step (the TMA
# stage 64.5 KB, each consumer's wgmma operands 136 KB, its stores and loads 40 KB: ~3,250 of the step's ~4,900
# clocks at 128 B a clock), 290 FMUL and 69 MUFU a thread, five synchronous wgmma groups. D_EARLY: D v from the
# chunk's first v load (no second v load, 8 KB a consumer); LEAN: one causal select on P, the scale on beta V's
# rows (32 FSEL and 32 FMUL a thread fewer), beta V in an allocation of its own (no bar.sync between its stores and
# wv's); UPDATE_LATE: the state update in flight under the epilogue; Q_REG: q
# loaded once into registers for Q K^T and Q S (16 KB a consumer fewer); BETA_LOG (with LEAN): beta and the scale in
# the exponents (Gb = G - log2(beta scale) through the stage), no beta V (FMUL 524 -> 458, 16 KB of shared memory
# freed; only where the caller says beta >= 0: gluon_forward.forward's beta_nonneg, which no launch passes yet).
# Run 2 of gpu_mamba_s32.py (H100, snapshot 90251d7, runs/mamba_s32_run2_session32_h100.txt; timed while FLA's
# autotune still ran on the GPU, rounds +-5%): every variant right against float64 (bf16 / fp16 h0 N 1000, N 33,
# strong decays: 1.000-1.002x the floor as the shipped kernel; scale 0.5 with beta 1.688x, the shipped's); LEAN faster
# than the shipped kernel in each of the three interleaved rounds (0.931 / 0.936 / 0.987 ms against 0.952 / 0.993 /
# 0.995; median 1.061x; the shipped timed again last 1.009); UPDATE_LATE 1.013x, Q_REG 0.990x, D_EARLY 0.945x (spills),
# all four 0.934x. On: LEAN for Mamba-2 (the SASS of today's LEAN equals run 2's up to register names). The rest off;
# BETA_LOG and the clean re-timing (the peer's compiles first) never ran: the session's device time ran out
GLUON_S32: dict = {True: ("lean",)}
# Hedgehog's feature map by kernels_forward.hedgehog_map_kernel (one pass: x read and the features written once in the
# input's dtype, float32 math) where no gradient is recorded, instead of op.hedgehog_map's torch passes (float32
# einsum, two softmaxes, a concatenation, a cast). Session 32 run 7 (gpu_based_s32.py): Hedgehog's forward 2.72 ms
# against FLA's 1.61 on the same torch features, the map most of it. Off: written and interpreter-tested (session 32),
# never timed; op.hedgehog_map's hook is the lead's (NEEDS-LEAD)
HEDGEHOG_FUSED_MAP = False
# Based's Gluon forward (gluon_based.py: Dk 16, no decay, Dv a multiple of 64; its 153 symmetric features
# padded to 160, S^T in wgmma registers). Runs 7-9 (H100, session 27, B16 H16 N4096 d16 v64 bf16): 0.200-0.212
# ms against the tl kernel's 0.804 and FLA parallel_based's 2.04 (9.65-10.26x), 55-58% of the copy bound;
# checked in run 9 as it is now (bf16 h0 N 1000 1.413x the floor, v128 N 77 1.425x, fp16 one tile N 4097
# 1.405x; every element written; final states 1.6e-3 / 2e-4 relative, as the tl kernel's). launch.forward
# runs it where plan's fwd_gluon_based is set and gluon_based.fits takes the tensors
GLUON_BASED = True
GLUON_BASED_STAGES = 2  # 3 stages do not fit beside its feature buffers (227 KiB)
# its OVERLAP (paired selections, the chunk's wgmmas in flight together): checked in run 9, slower (0.211 ms
# against 0.200). Off
GLUON_BASED_OVERLAP = False
# its PAIRED (session 30, helper HF): OVERLAP's paired selections alone (one N = 64 wgmma a feature piece for
# both factors, k's selection under q's product: 10 selection wgmmas a chunk instead of 20), the chunk's other
# wgmmas synchronous. Off until experiments/linear_attention/gpu_forward.py --set s30 checks and times it
GLUON_BASED_PAIRED = False
# its CHAIN (session 30, helper HF): OVERLAP's chunk wgmmas alone (o's three and the state update's two issued
# async, one wait), the selections as without OVERLAP. Session 30 run 5 (H100,
# runs/gpu_forward_s30_run5_session30_h100.txt): checked (bf16 h0 N 1000 1.413x the floor, the default's), 0.1986 ms
# against 0.2021; with SEL_ASYNC 2 0.1928 (60% of the copy bound, from 57%; checked alike). On, with SEL_ASYNC 2
GLUON_BASED_CHAIN = True
# its SEL_ASYNC (session 30, helper HF): a feature piece's two N = 32 selections issued async with one wait (1),
# or q's and k's four together with q's product under k's (2); session 30's probes: the features are a third
# of Based's time (0.064 of 0.202 ms), run 2: PAIRED's N = 64 selections slower (spills). Run 5: 1 0.1960 ms,
# 2 0.1954 against 0.2021, with CHAIN 0.1928; checked (bf16 h0 N 1000 1.413x, fp16 v128 N 77 1.440x: the
# default's). On: 2. Run 7 (the shipped SEL_ASYNC 2 + CHAIN): 0.1903 ms (60.8%) against the session start's 0.2018;
# checked again (fp16 v128 N 77 1.440x, h0 N 4097 1.409x, the public op with h0 N 1000 1.407x). 3: the pieces
# software-pipelined (piece p + 1's q selections in flight under piece p's k product): run 9 0.1854 ms (62.7%)
# against 2's 0.1904, checked (h0 N 1000 1.413x, fp16 v128 N 77 1.44x: the default's). On: 3 (the lead)
GLUON_BASED_SEL_ASYNC = 3
# SEL_REG (with SEL_ASYNC 3): q and k loaded into registers once a chunk, the selections' A operand from registers
# (each selection wgmma then reads its 1 KB selection alone from shared memory, not 3 KB); PHIQ_REG (with SEL_ASYNC
# 3 and CHAIN): phi_q never stored, each piece the register operand of o's phi_q S wgmma, issued as it is made (40
# KB of shared memory free: GLUON_BASED_PHIQ_STAGES stages with it). Session 31 (helper HB): compiled for sm_90a,
# off until gpu_forward.py --set s31 checks and times them on the H100
GLUON_BASED_SEL_REG = False
GLUON_BASED_PHIQ_REG = False
# FEAT_ALU: the features by the CUDA cores (a thread a row of scale q or of k, blocks of 4 x 4 products with the
# linear features and the constant in the diagonal blocks' lower triangles: gluon_based.feature_pairs_alu), no
# selection wgmmas (20 a chunk a consumer, 1.3 of the chunk's 4.6 MFLOP) and no selection reads. Session 31:
# compiled for sm_90a, off until gpu_forward_s31.py checks and times it on the H100. 2: with Q K^T issued async
# before the features (the tensor cores run it under their ALU work); 3: as 2, and phi_q S and the update issued
# before P is made (P V after them). 0: off. Session 31 run 3 (H100, runs/forward_s31c_run3_session31_h100.txt; B16
# H16 N4096 d16 v64, the kernel alone, copy bound 0.1159 ms): shipped (SEL_ASYNC 3 + CHAIN) 0.1820 ms (0.1869 timed
# again last), FEAT_ALU 1 0.1505 (77.0% of the bound), at 3 stages 0.1408 (82.3%, 1.29x), 2 0.1498 / 3 stages 0.1411,
# 3 0.1494; every float64 check right (bf16 h0 N 1000 1.415x the floor, fp16 v128 N 77 1.44x, bf16 h0 N 4097 one
# tile 1.407x; every element written; gluon_based.forward's host path equal). On: 1 at GLUON_BASED_ALU_STAGES. Run 4
# (runs/forward_s31d_run4_session31_h100.txt): 0.1405 ms (82.4%) against the session start's 0.1846 in the same run
# (1.31x); 2 at 3 stages 0.1402, 3 0.1436
GLUON_BASED_FEAT_ALU = 1
# FEAT_ALU's ring depth (its phi_k buffer and the selections' are not needed: 3 stages fit, 213 KB; 4 need 238 KB)
GLUON_BASED_ALU_STAGES = 3
# OUT_DIRECT (with FEAT_ALU): o stored from registers by gl.store, no 16 KB epilogue buffer, so 4 stages fit (224 KB).
# Session 31 run 4 (runs/forward_s31d_run4_session31_h100.txt): checked, but 0.2113 ms at 3 stages and 0.2098 at 4
# against the shipped 0.1405 (the accumulator layout's 4-byte global stores): off
GLUON_BASED_OUT_DIRECT = False

# the backward's blocks where Dk <= BWD_KEY_BLOCK and Dk x Dv <= BWD_STATE_ELEMS (the session-26 sweep, H100,
# B16 H16 N4096 bf16, Dk = Dv = 128, dQ + dK/dV kernels): no decay 2.36 ms at chunks of 64, one key block
# a dQ program and one value block a dK/dV one, 8 warps (4.76 at the forward's blocks: chunks of 32, key
# and value blocks of 64); scalar decay 3.72 the same at 4 warps (6.23; 3.36 with blocks of 64, whose
# two dk parts cost the combine pass more); Based 4 warps 4.79 (5.88 at 8)
BWD_CHUNK = 64
BWD_STATE_ELEMS = 16384
BWD_WARPS = {0: 8, 1: 4}
# the decay kinds those blocks are the default for: the scalar decay's (a gated backward) were timed by the
# sweep, not yet checked on the GPU (see CHANNEL_DIAG's comment); it keeps the blocks run 2 checked
# (the scalar decay's were checked on the H100 in run 2 of session 27 with bf16 do, 1.34-1.43x the floor; the
# unsplit gated path now reads float32 do (launch.kernel_do), and with the split path on for the scalar
# decay these blocks' domain, Dk and Dv <= 128, is the split path's: left as it was)
BWD_BLOCK_KINDS = (0,)
BASED_BWD_WARPS = 4

# the split dK/dV backward (launch.backward_plan; kernels_tl.la_bwd_dkv_kernel PART 1 and 2): one kernel
# writes dk (programs of BKB key channels by every value column), one dv (BV value columns by every key
# channel), so neither has partial sums and both store the input's dtype; the dQ kernel takes its own
# blocks there (session 26 sweep: key blocks of 64, 4 warps, 3 stages 0.553 ms against 0.679 at 128 and 8
# warps). From run 1 of session 27 (no decay, d128): dQ 0.68 + dK/dV 1.67 ms, the dK/dV kernel's 8-warp
# program holding dS [128, 128] and two [64, 128] float32 outputs; the dQ kernel, the same walk with half
# the state and one output, 0.55. Off (no decay kind) until gpu_backward.py checks it on the GPU
# By decay kind: a scalar decay's kernels take chunks of 32 (at 64 and 4 warps ptxas spilled 204 / 392 / 104
# bytes in dQ / dK / dV, sm_90a; at 32: 8 / 64 / 0)
# Run 2 of session 27 (H100, bf16 against float64, N 1008, states, NaN-poisoned buffers: every element
# written) checked the split path without a decay (d128 1.41-1.66x the floor, d64 N 17) and with a scalar
# decay (with and without the EPILOGUE; beta and grouped heads, Dk 128 Dv 64: 1.36-1.73x, dg 0.025, dbeta
# 1.7e-3 relative); the run's time budget cut its timing. Off (lead's call at the session's end): untimed
# (it drops the combine kernel, 1.69 ms in run 1, and the dk partial sums, but nothing measured it), and
# Mamba-2 with D on it (float32 dv store) never ran as-is, while the unsplit gated path with float32 do is
# the form every GPU check since session 24 passed (run 2's Mamba-2 D + z). (1,) for the scalar decay,
# (0, 1) for both, once gpu_backward.py times them. Session 28, run 1 (H100, bf16, B16 H16 N4096 d128; checks as
# run 2's, all pass): no decay split 1.681 ms against the unsplit 2.013 (1.20x) and FLA chunk_linear_attn's
# backward 3.348 (1.99x): on for no decay; the scalar decay's split is checked but its timing was cut again
# Session 28 run 9: with (0, 1) and chunk 64 for the scalar decay, the autograd simple-GLA backward right against
# float64 (dq/dk/dv 1.34-1.43x the floor, dg 4.4e-3 relative), the split path with and without the EPILOGUE
# (every element written) and Mamba-2 with D and with D + z (1.23-1.75x); runs 3-4: 3.34-3.35 ms at chunk 64
# against 7.97 unsplit (2.4x): on for both
BWD_SPLIT_KINDS: tuple = (0, 1)
BWD_SPLIT_MAX_DIM = 128
BWD_SPLIT = {0: dict(BT=64, BKB=64, BV=64, warps=4, stages=2), 1: dict(BT=64, BKB=64, BV=64, warps=4, stages=2)}
BWD_SPLIT_DQ = {0: dict(BKQ=64, warps=4, stages=3), 1: dict(BKQ=64, warps=4, stages=3)}
# on the split path with a scalar decay the kernels do the combine kernel's work (kernels_tl EPILOGUE: the
# diagonal added back, beta applied, the decay's and beta's per-token parts), so no combine kernel runs
# (1.69 ms at B16 H16 N4096 d128 in run 1 of session 27)
BWD_SPLIT_EPILOGUE = True
# dq, dk, dv stored by the kernels in the inputs' dtype where nothing is combined after them (op.py: no
# float32 buffers cast by torch passes afterwards)
BWD_NATIVE_GRADS = True

# the backward's combine kernel (kernels_backward.py): tokens a step of its walk
COMBINE_TOKENS = 32

NUM_WARPS = 8  # 4 spilled 316 bytes in the dK/dV kernel at Dk = Dv = 128
NUM_STAGES = 2  # the chunk loop's software pipelining (loads of the next chunk in flight)
STEP_WARPS = 4

# the decode step's value block
STEP_BV = 64

# head dimensions taken (q/k and v); Based's q/k (its features are 1 + Dk + Dk^2)
MAX_HEAD_DIM = 256
MAX_BASED_DIM = 16

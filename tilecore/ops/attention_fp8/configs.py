"""FP8 attention's configurations (notes/attention_fp8/README.md says where each came from)."""

# tl kernel (kernels_tl.attn_fp8_fwd): block_m query rows x block_n keys a step. Not tuned on a GPU:
# first values, FlashAttention-2's usual tiles; the interpreter's are small (CPU time)
TL_FORWARD = {64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
              128: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
              256: dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)}
TL_INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, UPCAST=True)  # UPCAST: the interpreter's e4m3 cast is wrong (kernels_tl)

# Gluon kernel (gluon_fp8.py): consumers warpgroups of block_m query rows each share a stage of block_n
# keys (K and V^T blocks, e4m3: 128 x D bytes each); only head dims 64 and 128 (the fast ones)
# Measured on the H200 (notes/attention_fp8, runs 3-4, B16 N4096, kernel time without host syncs):
# D 128 non-causal 3.22-3.26 ms whichever of pingpong (FlashAttention-3's warp-scheduler barriers) and
# 2 or 3 stages, causal 1.80; D 64 two consumers 5.64 ms (three: 6.00, ping-pong 5.75), causal with
# ping-pong 3.24 (without 3.36). block_n 256 at D 128 spills 268 bytes and serializes wgmma; three
# consumers at D 128 spill and serialize too
# exp2_fma_every: one exp2 in 2 or 4 by a cubic on the FMA units (gluon_fp8.exp2_split; 0 = all on MUFU): slower
# everywhere on the H100 (session 26 round 1: D128 1.05x / 0.95x bf16 against 1.11x; D64 0.78x / 0.66x against
# 0.80x): the step is issue-bound, not MUFU-bound. cast_late (P rounded just before its wgmma): see the notes.
# k_block_scalar: k descales per block of block_n keys read as one scalar a step (else per key)
# cast_late on (session 26 round 2, H100, B16 H16 N4096, per-head descales): D128 817 TFLOP/s against 694 (1.25x the
# bf16 forward against 1.07x), causal 723 against 619; D64 471 against 391, causal 390 against 347; errors identical
# rescale_tau / p_shift (session 27, OFF: H100 runs 3-4, correct but 0.95-0.98x the default): conditional rescaling (reference.py): a row's max
# moves only where it grows by more than rescale_tau (base 2), O *= alpha skipped where no row of the warpgroup moved;
# P rounded as 2^p_shift p, p_shift + tau <= log2(448). SASS (sm_90a, D128): the steady step's softmax block 331
# instructions against 359 (64 FMUL moved into the branch, ~40 added by the warpgroup's vote); O's error 4% (0.8, 8)
# to 8% (2.8, 6) above the default's (the row max's P is no longer exactly 2^p_shift).
# l_mma (session 27, OFF): l by wgmma of P's 32-key chunks times a [32, 8] block of ones (16 FADD a step instead of
# 64); l then sums the rounded P (reference.py). Its first form (l accumulated in the wgmma accumulator across key
# blocks) was 1.07x at D128 but WRONG (runs 3-4: FP8 wgmma's narrow accumulation); the chunked form is unmeasured.
# exp2_fma_every 8: one exp2 in 8 on the FMA units (new in session 27). Turned on per head dim only where
# experiments/attention_fp8/gpu_speed_s27.py shows a variant faster and its checks pass
# l_mma is a mode since session 28 (gluon_fp8.L_MMA: how the ones block is stored; 0 off, 1 the one to use): it gave
# half of l on the H100 because the ones block, converted from a float16 constant, was half junk (a ptxas 12.8
# miscompile, notes/attention_fp8); the block is now written as bytes. OFF until experiments/attention_fp8/
# gpu_speed_s28.py checks it on the GPU. max_tree (session 28, OFF until a GPU run times it): the row max as a tree
# (gluon_fp8.row_max_tree) instead of a chain of 31 dependent FMNMX a row
# l_mma 1 + max_tree ON since session 29 (H100 runs 2, 4 and the mid batch: right at both tails and in all four timed
# cases; B16 H16 N4096 D128 879 / 852 TFLOP/s against 820 / 810 (1.05-1.07x), causal 1.08-1.09x, D64 537-542 against
# 465-472 (1.14-1.17x), D64 causal 453 against 393 (1.15x)): lse then carries P's e4m3 rounding (reference.py's
# l_rounded), O's weights sum to 1. rescale_late (session 29, OFF): right, but 0.95-1.03x with l_mma (run 7): the
# FMULs between the S and P V issues delay P V's issue
# pv_smem (session 31, OFF until experiments/attention_fp8/gpu_speed_s31.py checks and times it on the H100): P stored
# to shared memory (e4m3, two buffers a consumer) and P V issued with both operands there (gluon_fp8.compute_one with PV_SMEM):
# with P V's A operand in registers ptxas waits for P V before the softmax (no overlap); sm_90a SASS with pv_smem has
# the wait after the last exp2. With block_n2 64 (and 2 stages at D128): split steps of 192 keys (compute_split_smem).
# H100 session 31 runs 1-2: right everywhere, 0.78-0.96x the default (the step's cost is per key; notes). pv_smem 2/3
# (compute_pipe_smem, block_n2 128 at D64 / 64 at D128) and early_exp2 (fp8_softmax_early): not run on a GPU yet
# (job hc_fp8_early of gpu_speed_s31.py)
# s_ahead (session 32: S of key block j issued before the softmax of block j - 1) was right and slower on the H100
# (0.72-0.88x): removed, notes/attention_fp8 (the code at commit ecb1c8e)
GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, pingpong=False, exp2_fma_every=0,
                          cast_late=True, rescale_tau=0.0, p_shift=8, l_mma=1,
                          max_tree=True, rescale_late=False, pv_smem=0),
                 128: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, pingpong=False,
                           exp2_fma_every=0, cast_late=True, rescale_tau=0.0, p_shift=8, l_mma=1, max_tree=True,
                           rescale_late=False, pv_smem=0)}


def gluon_config(d: int, causal: bool) -> dict:
    """The Gluon kernel's configuration: GLUON_FORWARD[d] (ping-pong off everywhere: session 30 run 9 timed D 64
    causal without it at 467 TFLOP/s against 455 with it, bf16 466, checked alike; one run)."""
    return dict(GLUON_FORWARD[d])


def tl_config(d: int, interpret: bool) -> dict:
    """The tl kernel's configuration for head dim ``d`` (padded to 64, 128 or 256 by rows)."""
    if interpret:
        return dict(TL_INTERPRET)
    return dict(TL_FORWARD[64 if d <= 64 else 128 if d <= 128 else 256])

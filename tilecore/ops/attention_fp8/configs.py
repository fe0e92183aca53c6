"""FP8 attention's configurations (notes/attention_fp8/README.md says where each came from)."""

# tl kernel (kernels_tl.attn_fp8_fwd): block_m query rows x block_n keys a step. Not tuned on a GPU:
# first values, FlashAttention-2's usual tiles; the interpreter's are small (CPU time)
TL_FORWARD = {64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
              128: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
              256: dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)}
TL_INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, UPCAST=True)  # UPCAST: the interpreter's e4m3 cast is wrong (kernels_tl)

# Gluon kernel (gluon_fp8.py): two consumer warpgroups of block_m query rows share a stage of block_n keys, D 64 / 128
# only; the fastest form measured on the H100 (every variant tried against it: notes/attention_fp8/README.md).
# k_block_scalar (default True): k's per-block descales read as one scalar a step. p_linear 1: P's e4m3 code by one
# FFMA instead of exp2 (1.19-1.30x, O's error 1.29x; 0: exp2, FlashAttention-3's rounding, the accurate form)
GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, p_shift=8, p_linear=1),
                 128: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, p_shift=8, p_linear=1)}
GLUON_KEYS = frozenset({"block_m", "block_n", "stages", "consumers", "q_buffers", "p_shift", "k_block_scalar",
                        "p_linear"})


def gluon_config(d: int, causal: bool) -> dict:
    """The Gluon kernel's configuration: GLUON_FORWARD[d] (no ping-pong: it was not faster, notes/attention_fp8)."""
    return dict(GLUON_FORWARD[d])


def tl_config(d: int, interpret: bool) -> dict:
    """The tl kernel's configuration for head dim ``d`` (padded to 64, 128 or 256 by rows)."""
    if interpret:
        return dict(TL_INTERPRET)
    return dict(TL_FORWARD[64 if d <= 64 else 128 if d <= 128 else 256])


# The convenience path (quantize.attention_fp8_rotated, tilecore.attention(..., precision="fp8")): v_scales "head" (one
# descale a kv head: a pass over v for its amax, then the quantizing pass) or "block" (one a block of 128
# keys, computed in the quantizing pass; the kernels fold it into O's rescale). "block" since the run
# notes/attention_fp8/runs/e2e34_confirm_run5_session34_h100.txt (H100): D128 causal B16 H16 N4096 end to end 1.707 ms
# = 1.046x bf16 against "head"'s 1.896 (0.941x); O vs float64 32.05x the bf16 floor against 32.33x; FA3's outlier
# test rotated 7.73e-3 against 7.71e-3 (target <= 9.1e-3); the kernel alone 0.958x "head"'s (non-causal e2e not timed)
# q_in_kernel: the head dims at which q is rotated and quantized inside Hopper's kernel (its Q_ROTATE: one bf16 wgmma a
# tile against diag(s) H in shared memory, the codes written over the bf16 Q buffer) instead of rotate_quantize's pass
# over q. H100, B16 H16 N4096 end to end against the pass in the same run: D128
# (notes/attention_fp8/runs/qrot2_s35_run3_session35_h100.txt: causal 1.623 ms = 1.074x bf16 against 1.716 = 1.016x,
# full 2.539 = 1.264x against 2.683 = 1.196x; the kernel against its twin 3.35x the bf16 floor on a GQA tail), D64
# (runs/qrot3_s35_run4_session35_h100.txt: causal 1.174 ms = 1.034x against 1.225 = 0.991x; O against
# float64 identical to the pass's; runs/qrot4_s35_run5_session35_h100.txt: D64 full 1.151x against 1.064x, D128 full
# 1.346x against 1.379x: at D128 full the two about cancel, the first run had +5.7%). q_buffers (by head dim): bf16 Q
# buffers a consumer where not GLUON_FORWARD's q_buffers (D128 with 1: causal 1.099x against 2's 1.074x, full 1.334x
# against 1.346x: not set)
# q_reg: the head dims at which q's codes stay in registers as S's operand (the kernel's Q_REG: the rotation's columns
# permuted so that its accumulator is the e4m3 operand as it lies; no stores, fence or barriers at a tile's start).
# D128 since notes/attention_fp8/runs/pvbf16_s36_run1_session36_h100.txt (H100, B16 H16 N4096 causal, same run):
# the kernel alone 1.412 ms against 1.469 (-3.9%), end to end 1.594 ms eager = 1.153x bf16 against 1.130x, from a
# CUDA graph 1.694 = 1.198x against 1.189x; O vs float64 32.05x the bf16 floor, the same as q in shared memory; on the
# H200 (runs/qreg_s36_run3_session36_h200.txt): causal 1.152x against 1.125x eager, full 1.418x against 1.386x (graph)
# stages (by head dim): the ring's depth where not GLUON_FORWARD's (with q_reg and 1 Q buffer D128 fits 4: 230,248 B;
# that form timed no faster in the H200 run: not set).
# rot_split (with q_reg): the rotation as two [BM, D/2] x [D/2, D/2] products and a butterfly (Sylvester's
# H_D = [[H, H], [H, -H]]): half the tensor work at each tile's start. D128 since runs/final_s36_run5_session36_h100.txt
# (H100, B16 H16 N4096, against q_reg alone in the same run): causal e2e 1.107x bf16 eager against 1.104x, 1.147x
# from a CUDA graph against 1.140x, the kernel 1.340 ms against 1.370; full 1.404x against 1.384x (graph); the run
# before (runs/qreg64_s36_run4_session36_h100.txt) causal graph 1.160x against 1.145x, eager 1.100x against 1.105x;
# right (GQA tails against the twin, FA3's outlier test 7.73e-3)
ROTATED = dict(v_scales="block", q_in_kernel=(64, 128), q_buffers={}, q_reg=(128,), stages={}, rot_split=(128,))

"""FP8 attention's configurations (notes/attention_fp8/README.md says where each came from)."""

# tl kernel (kernels_tl.attn_fp8_fwd): block_m query rows x block_n keys a step. Not tuned on a GPU:
# first values, FlashAttention-2's usual tiles; the interpreter's are small (CPU time)
TL_FORWARD = {64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
              128: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
              256: dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)}
TL_INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, UPCAST=True)  # UPCAST: the interpreter's e4m3 cast is wrong (kernels_tl)

# Gluon kernel (gluon_fp8.py): two consumer warpgroups of block_m query rows share a stage of block_n keys, D 64 / 128
# only; the fastest form measured on the H100 (every variant tried against it: notes/attention_fp8/README.md).
# serial (with consumers 3): a step's P V issued in that step after its softmax (gluon_fp8.AttentionFp8.serial_step),
# so that no float32 P is carried and three consumers fit (the convenience path's D64: ROTATED["serial_c3"]).
# k_block_scalar (default True): k's per-block descales read as one scalar a step. p_linear 1: P's e4m3 code by one
# FFMA instead of exp2 (1.19-1.30x, O's error 1.29x; 0: exp2, FlashAttention-3's rounding, the accurate form).
# hide_first_key (causal): a tile's first key offset through opaque_int, as the bf16 forward's, so that LLVM does not
# hoist step 0's causal mask to every tile's start (the same bits); off here (the kernel on e4m3 q was not faster with
# it), on for the convenience path's kernel by ROTATED["hide_first_key"]. mask32 (causal): a masked step's mask as one
# 32-bit comparison an element against its row's last key (the shared mask compared in 64 bits: LLVM widened the key
# offset); without a causal mask (masks at Nk's tail only) the kernel keeps the shared one; off here (the kernel on
# e4m3 q was not faster with it), on for the convenience path's kernel by ROTATED["mask32"]
GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, p_shift=8, p_linear=1),
                 128: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, p_shift=8, p_linear=1)}
GLUON_KEYS = frozenset({"block_m", "block_n", "stages", "consumers", "q_buffers", "p_shift", "k_block_scalar",
                        "p_linear", "hide_first_key", "mask32", "serial", "q_last_buffers"})


def gluon_config(d: int, causal: bool) -> dict:
    """The Gluon kernel's configuration: GLUON_FORWARD[d] (no ping-pong: it was not faster, notes/attention_fp8)."""
    return dict(GLUON_FORWARD[d])


def tl_config(d: int, interpret: bool) -> dict:
    """The tl kernel's configuration for head dim ``d`` (padded to 64, 128 or 256 by rows)."""
    if interpret:
        return dict(TL_INTERPRET)
    return dict(TL_FORWARD[64 if d <= 64 else 128 if d <= 128 else 256])


# The convenience path (quantize.attention_fp8_rotated, tilecore.attention(..., precision="fp8")); each value is the
# fastest measured on the H100 against the others in the same run (figures and run files: notes/attention_fp8/README.md,
# decision log).
# v_scales: "head" (one descale a kv head: a pass over v for its amax, then the quantizing pass) or "block" (one a
# block of 128 keys, computed in the quantizing pass; the kernels fold it into O's rescale).
# q_in_kernel: the head dims at which q is rotated and quantized inside Hopper's kernel (its Q_ROTATE: one bf16 wgmma a
# tile against diag(s) H in shared memory) instead of rotate_quantize's pass over q.
# q_buffers (by head dim): bf16 Q buffers a consumer where not GLUON_FORWARD's q_buffers. q_last_buffers (by head dim,
# causal only): the last consumer's (its next Q loaded first, under the tile: in causal its rows have the most keys).
# q_reg: the head dims at which q's codes stay in registers as S's operand (the kernel's Q_REG: the rotation's columns
# permuted so that its accumulator is the e4m3 operand as it lies; no stores, fence or barriers at a tile's start).
# stages (by head dim): the ring's depth where not GLUON_FORWARD's.
# hide_first_key: the head dims at which the kernel with q rotated in it takes GLUON_FORWARD's hide_first_key (causal:
# step 0's mask kept in its branch, not hoisted by LLVM to the tile's start, where the rotation is) unless
# GLUON_FORWARD names it. mask32: the same for GLUON_FORWARD's mask32 (causal: the mask in 32 bits).
# serial_c3: head dim -> serial mode where the kernel runs three consumer warpgroups with serial steps (GLUON_FORWARD's
# consumers 3 and serial: a step's P V in that step, no float32 P carried, 160 registers a thread; 1: P V into a zero
# accumulator added to O * alpha, 2: O rescaled first and P V added in place, D128's registers) unless GLUON_FORWARD
# names serial.
ROTATED = dict(v_scales="block", q_in_kernel=(64, 128), q_buffers={128: 1}, q_last_buffers={128: 2}, q_reg=(64,),
               stages={128: 2}, hide_first_key=(64, 128), mask32=(64, 128), serial_c3={64: 1, 128: 2})


# rotate_quantize (quantize.rotate_quantize: the convenience path's k pass, and q's where the kernel does not rotate it)
# by head dim (D >= 128: 128's, else 64's): row_blocks (blocks of 128 rows a program, cut by quantize.FILL_SMS where the
# grid would leave SMs idle), num_warps, num_stages (absent: Triton's default). The interpreter takes one block a
# program and the rest as here.
ROTATE_QUANTIZE = {128: dict(row_blocks=8, num_warps=4, num_stages=2), 64: dict(row_blocks=4, num_warps=4)}


# the quantizers' explicit +-448 clamp of the codes before their e4m3 conversion (rotate_quantize; quantize_v_permuted
# per block), which saturates by itself where compiled (cvt.rn.satfinite, NaN kept: the same codes); False: none (two
# FMNMX an element fewer). The interpreter clamps either way (its conversion is emulated).
QUANTIZE_CLAMP = False


def rotate_quantize_config(d: int, interpret: bool) -> dict:
    """rotate_quantize's launch options for head dim ``d`` (ROTATE_QUANTIZE; one block a program in the interpreter,
    where num_stages means nothing)."""
    cfg = dict(ROTATE_QUANTIZE[128 if d >= 128 else 64])
    if interpret:
        cfg["row_blocks"] = 1
        cfg.pop("num_stages", None)
    return cfg

"""FP8 attention's configurations (notes/attention_fp8/README.md says where each came from)."""

# tl kernel (kernels_tl.attn_fp8_fwd): block_m query rows x block_n keys a step. Not tuned on a GPU:
# first values, FlashAttention-2's usual tiles; the interpreter's are small (CPU time)
TL_FORWARD = {64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
              128: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
              256: dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)}
TL_INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, UPCAST=True)  # UPCAST: the interpreter's e4m3 cast is wrong (kernels_tl)

# Gluon kernel (gluon_fp8.py): two consumer warpgroups of block_m query rows each share a stage of block_n keys (K and
# V^T blocks, e4m3: 128 x D bytes each); only head dims 64 and 128 (the fast ones). The kernel has no other switch:
# P is carried in float32 and rounded just before its wgmma (session 26: 1.25x), l is summed on the tensor cores and
# the row max taken as a tree (session 29: 1.05-1.17x). Every variant tried against it (ping-pong, exp2 on the FMA
# units, conditional or late rescaling, split key steps, P V from shared memory, early exponentials, S ahead, three
# consumers, block_n 256) was right and slower on the H100 or did not fit: notes/attention_fp8/README.md's decision log,
# the code at commit 741bc3b (s_ahead at ecb1c8e). H100, B16 H16 N4096 (session 31 run 1): D128 873 TFLOP/s (1.36x
# bf16), causal 777, D64 548, causal 474. k_block_scalar (default True): k descales per block of block_n keys read as
# one scalar a step (else per key)
GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, p_shift=8),
                 128: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, p_shift=8)}
GLUON_KEYS = frozenset({"block_m", "block_n", "stages", "consumers", "q_buffers", "p_shift", "k_block_scalar",
                        "p_linear"})


def gluon_config(d: int, causal: bool) -> dict:
    """The Gluon kernel's configuration: GLUON_FORWARD[d] (ping-pong off everywhere: session 30 run 9 timed D 64
    causal without it at 467 TFLOP/s against 455 with it, bf16 466, checked alike; one run)."""
    return dict(GLUON_FORWARD[d])


def tl_config(d: int, interpret: bool) -> dict:
    """The tl kernel's configuration for head dim ``d`` (padded to 64, 128 or 256 by rows)."""
    if interpret:
        return dict(TL_INTERPRET)
    return dict(TL_FORWARD[64 if d <= 64 else 128 if d <= 128 else 256])

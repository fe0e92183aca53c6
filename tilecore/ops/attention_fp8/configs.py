"""FP8 attention's configurations (notes/attention_fp8/README.md says where each came from)."""

# tl kernel (kernels_tl.attn_fp8_fwd): block_m query rows x block_n keys a step. Not tuned on a GPU:
# first values, FlashAttention-2's usual tiles; the interpreter's are small (CPU time)
TL_FORWARD = {64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
              128: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
              256: dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)}
TL_INTERPRET = dict(BLOCK_M=32, BLOCK_N=32, UPCAST=True)  # UPCAST: the interpreter's e4m3 cast is wrong (kernels_tl)

# Gluon kernel (gluon_fp8.py): consumers warpgroups of block_m query rows each share a stage of block_n
# keys (K and V^T blocks, e4m3: 128 x D bytes each); only head dims 64 and 128 (the fast ones)
# pingpong: the consumers issue their wgmma in turn (FlashAttention-3's warp-scheduler barriers): off,
# it was 10-15% slower on the H200 (run 3). D 64: three consumers (the bf16 forward's choice there; two
# ran at 0.70x the bf16 forward in run 3). block_n 256 at D 128 spills 268 bytes and serializes wgmma
GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, consumers=3, q_buffers=1, pingpong=False),
                 128: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, pingpong=False)}


def tl_config(d: int, interpret: bool) -> dict:
    """The tl kernel's configuration for head dim ``d`` (padded to 64, 128 or 256 by rows)."""
    if interpret:
        return dict(TL_INTERPRET)
    return dict(TL_FORWARD[64 if d <= 64 else 128 if d <= 128 else 256])

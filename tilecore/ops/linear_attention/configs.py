"""Linear attention's tables (plan.py reads them). None of these is timed yet: they are the choices
that compile for sm_90a without spilling (``python -m tilecore.ops.linear_attention.report``; an H100
has 64K registers an SM, 255 a thread), to be replaced by experiments/linear_attention/gpu_check.py's
sweep (notes/linear_attention/README.md)."""
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
CHANNEL_BWD_KEY_BLOCK = 16

# the backward's blocks where the forward's spill there (plan.tl_plan): Based's chunk and value block,
# and for Dk > BWD_KEY_BLOCK the dK/dV kernel's key block and value block
BASED_BWD_CHUNK = 16
BASED_BWD_BV = 32
BWD_KEY_BLOCK = 128
WIDE_BWD_BV = 32

NUM_WARPS = 8  # 4 spilled 316 bytes in the dK/dV kernel at Dk = Dv = 128
NUM_STAGES = 2  # the chunk loop's software pipelining (loads of the next chunk in flight)
STEP_WARPS = 4

# the decode step's value block
STEP_BV = 64

# head dimensions taken (q/k and v); Based's q/k (its features are 1 + Dk + Dk^2)
MAX_HEAD_DIM = 256
MAX_BASED_DIM = 16

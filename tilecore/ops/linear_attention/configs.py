"""Linear attention's tables (plan.py reads them). None of these is measured yet: they are first
choices by register arithmetic (an H100 has 64K registers an SM, 255 a thread), to be replaced by
experiments/linear_attention/gpu_check.py's sweep (notes/linear_attention/README.md)."""
from __future__ import annotations

# tokens a chunk, by decay kind (0 none, 1 scalar, 2 per channel). Per-channel decay's intra-chunk
# scores are elementwise over [BT, BT, KB] (no dot): its chunk is short, so those stay few (the
# FLOPs a token of the dots do not depend on the chunk: 4 Dk Dv + BT (Dk + Dv))
CHUNK = {0: 64, 1: 64, 2: 16}
CHUNKS = (16, 32, 64)  # what a caller may ask for (tl.dot needs >= 16 rows)

# float32 elements of a program's state block in registers ([BK, BV], Based's [256, BV]): 8192 is 64
# registers a thread at 4 warps
STATE_ELEMS = 8192
# per-channel decay: elements of one [BT, BT, KB] slice of the intra-chunk scores
CHANNEL_SLICE_ELEMS = 4096

NUM_WARPS = 4

# the decode step's value block
STEP_BV = 64

# head dimensions taken (q/k and v); Based's q/k (its features are 1 + Dk + Dk^2)
MAX_HEAD_DIM = 256
MAX_BASED_DIM = 16

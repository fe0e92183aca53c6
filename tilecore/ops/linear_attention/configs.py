"""Linear attention's tables (plan.py reads them): each value with one line of reason. The runs behind them (figures,
dates, files) are in notes/linear_attention/README.md's decision log and notes/linear_attention/configs_history.md
(these comments' earlier history); blocks not timed are the ones that compile for sm_90a without spilling
(``python -m tilecore.ops.linear_attention.report``)."""
from __future__ import annotations

# tokens a chunk by decay kind (0 none, 1 scalar, 2 per channel): 64 spilled at Dk = Dv = 128 where 32 did not
CHUNK = {0: 32, 1: 32, 2: 64}
CHUNKS = (16, 32, 64)  # what a caller may ask for (tl.dot needs >= 16 rows)

# float32 elements of a program's state block in registers: 64 registers a thread at 4 warps
STATE_ELEMS = 8192
# per-channel decay's sub-chunk tokens and [BT, SUB, KB] slice elements: the diagonal blocks' elementwise form
CHANNEL_SUB = 16
CHANNEL_SLICE_ELEMS = 8192
# per-channel backward's key block and diagonal form: what the H100's float64 check passed (FLA issue 640)
CHANNEL_BWD_KEY_BLOCK = 16
CHANNEL_DIAG = 0
# per-channel forward's scores as one factored dot where G's span allows (3): fastest, GPU-checked (decision 39)
CHANNEL_FWD_DIAG = 3
# its blocks where Dk <= 128: chunk 64 / BV 128 / 8 warps / 2 stages, 2.18-2.25x chunk_gla (decisions 55, 57)
CHANNEL_FWD_BLOCKS: dict | None = dict(BT=64, BV=128, warps=8, stages=2)
# the backward's factored per-channel terms: off, never GPU-checked (a gated backward: FLA issue 640)
CHANNEL_BWD_FACTORED = False
# per-channel decay over this head dim takes chunks of 32 (at 64 the dQ kernel staged 236 KiB at d256)
CHANNEL_WIDE = 128
CHANNEL_WIDE_CHUNK = 32

# the backward's own blocks where the forward's spill (Based's chunk / value block; Dk > 128's key / value blocks)
BASED_BWD_CHUNK = 16
BASED_BWD_BV = 32
BWD_KEY_BLOCK = 128
WIDE_BWD_BV = 32

# the tl forward's blocks by the sweeps: 4 warps 1.5-2.3x faster than 8, [128, 128] state blocks
FWD_WARPS = 4
FWD_STATE_ELEMS = 16384
FWD_STAGES = {0: 3, 1: 2}  # by decay kind: the faster in the sweep (no decay 0.344 ms at 3 against 0.392 at 2)
BASED_FWD_BV = 32  # 0.81 ms against 0.93 at 64
BASED_FWD_STAGES = 3
# the Gluon forward for phi(x) = x on Hopper, in the (decay kind, Dk) cases a float64 GPU check passed
GLUON_FORWARD = True
GLUON_CHECKED = {(0, 128), (1, 128), (0, 64), (1, 64)}
GLUON_STAGES = 2  # 0.367 ms against 0.375 at 3
# the GLA forward (per-channel decay) on Hopper (gluon_gla_forward.py): checked against float64 on the GPU (bf16,
# fp16, strong decays + a reset, N 1000 / 4097, Dk 64, Dv 256, states, the public op) and 3.78x the tl forward in
# the same run (an H200: 0.558 ms against 2.106; 3.61x on an H100; notes decision 290); 2 stages (80 KB each at
# Dk 128 with float32 g: 3 do not fit)
GLUON_GLA = True
GLUON_GLA_STAGES = 2
# Hedgehog's one-pass map where no gradient is recorded: checked, the forward 0.613 ms against 2.740 (decision 90)
HEDGEHOG_FUSED_MAP = True
# the same under autograd (op._HedgehogMap, hedgehog_map_backward): checked, fwd+bwd 3.26 ms against torch's map's
# 11.45-26.29 with W's gradient (decision 95)
HEDGEHOG_FUSED_MAP_GRAD = True
# the map kernels' projection dot: "tf32x3" (tensor cores; float32's accuracy but for lo x lo): checked at the map's
# floor, fwd+bwd 2.45 ms against ieee's 3.26 (same run); ieee spills from Dk x F 64 x 64 up in the backward
HEDGEHOG_MAP_PRECISION = "tf32x3"
# with tf32x3 and 16-bit x: the products with x as one operand by two tf32 products (x is exact in tf32, so tf32x3's
# third is zero: kernels_forward.dot_tf32x2), the same accuracy: checked, the forward 0.457 ms against 0.500 and fwd+bwd
# faster in both rounds (decision 104)
HEDGEHOG_MAP_EXACT_X = True
# the map backward's (rows, warps) by Dk x F (each padded to a power of two >= 16) up to the first number: what compiles
# for sm_90a with tf32x3 without spilling (64 rows at 64 x 32: 231 registers; 64 x 64: 228 at 32 rows; 128 x 64 at 32
# rows / 8 warps: 255, 0 B). 64 rows at <= 2048: checked, fwd+bwd 1.898 ms against 2.450 (decision 97)
HEDGEHOG_MAP_BWD_BLOCKS: tuple = ((2048, 64, 4), (4096, 32, 4), (8192, 32, 8))
# the map backward's programs over all heads (each a range of rows and one float32 dW partial): 1024 / 2048 slower
HEDGEHOG_MAP_BWD_PROGRAMS = 512
# Based's Gluon forward (Dk 16, no decay, Dv a multiple of 64; the features by the CUDA cores): 0.1405 ms = 82% of the
# copy bound, 14.6x parallel_based, GPU-checked (decisions 54, 57)
GLUON_BASED = True
GLUON_BASED_STAGES = 3  # 3 stages fit (213 KB) and were the faster; 4 needed 238 KB beside the selection buffers

# the backward's blocks where Dk <= 128 and Dk x Dv <= 16384 (the H100 sweep: 2.36 ms against 4.76)
BWD_CHUNK = 64
BWD_STATE_ELEMS = 16384
BWD_WARPS = {0: 8, 1: 4}
# the decay kinds those blocks are the default for: no decay (the scalar decay's are the split path's domain)
BWD_BLOCK_KINDS = (0,)
# Based's backward by its quadratic state's symmetry from zeros (kernels_tl SYM): checked, 2.57 ms against 4.48 (1.74x,
# 2.03x FLA parallel_based, same run: decision 96)
BASED_BWD_SYM = True
BASED_BWD_WARPS = 4  # 4.79 ms against 5.88 at 8
# the split dK/dV backward (one kernel writes dk, one dv) for both kinds: checked, 1.20x / 2.4x the unsplit
BWD_SPLIT_KINDS: tuple = (0, 1)
BWD_SPLIT_MAX_DIM = 128
BWD_SPLIT = {0: dict(BT=64, BKB=64, BV=64, warps=4, stages=2), 1: dict(BT=64, BKB=64, BV=64, warps=4, stages=2)}
BWD_SPLIT_DQ = {0: dict(BKQ=64, warps=4, stages=3), 1: dict(BKQ=64, warps=4, stages=3)}
# the split kernels do the combine's work with a scalar decay (no 1.69 ms combine kernel)
BWD_SPLIT_EPILOGUE = True
# dq, dk, dv stored in the inputs' dtype where nothing combines after them (no torch cast passes)
BWD_NATIVE_GRADS = True
# the backward without a decay or with a scalar one by gluon_scalar_bwd's kernels on Hopper (dq, dk, dv each the forward's
# walk in other roles): float64-checked on an H200 (bf16 / fp16, a reset, N 1000, states, Mamba-2's gradients), 2.36x /
# 1.50x the split kernels at d 128 with a scalar decay / without (notes decisions 300, 305)
BWD_GLUON = True
# the (Dk, Dv) it takes: where the public op's eager backward was faster too (d 128: 2.32x with a decay, 1.76x
# without); at d 64 its GPU time was 1.36x the split kernels' but the eager op 0.74x (host-bound: decision 305)
BWD_GLUON_DIMS = ((128, 128),)
BWD_GLUON_STAGES = 2  # 64.5 KB a stage at d 128 with a decay (3 do not fit); d 64 at 3: 1.014x, not taken
# dk and dv by one reverse walk at Dk = Dv = 128 (gluon_scalar_bwd.la_bwd_dkv_gluon_kernel: 1.61 GB against the two
# walks' 2.42): checked, 1.13x / 1.21x the dk and dv walks' kernels with / without a decay (decision 301)
BWD_GLUON_DKV = True

# the combine kernel's tokens a step of its walk
COMBINE_TOKENS = 32

NUM_WARPS = 8  # 4 spilled 316 bytes in the dK/dV kernel at Dk = Dv = 128
NUM_STAGES = 2  # the chunk loop's software pipelining (loads of the next chunk in flight)
STEP_WARPS = 4  # the decode step's (untimed as a kernel: experiments/linear_attention/gpu_forward_s33.py times it)
STEP_BV = 64  # the decode step's value block (ditto)

# head dimensions taken (q/k and v); Based's q/k (its features are 1 + Dk + Dk^2)
MAX_HEAD_DIM = 256
MAX_BASED_DIM = 16

# GPUs whose blocks get less shared memory than the tables above ask there (issue 31): rows of (least bytes a block
# gets, caps on the stages), the first row whose bytes the GPU's reach (dispatch.shared_memory_fit; plan.tl_plan and
# launch.backward_plan). Each row compiled for the GPUs it serves by python -m tilecore.portability
# (notes/portability.md); untimed there. The H100 (227 KiB) and the A100 (163) take the first row: no change.
SHARED_FITS = (
    (163 * 1024, {}),
    # sm_86, sm_89, sm_120 (99 KiB): per-channel decay's forward (CHANNEL_FWD_BLOCKS) at D128 asked 128 KiB
    # on sm_86 -> 48 in one stage (BV 64 in two: 104)
    (99 * 1024, dict(channel_fwd_stages=1)),
    # ROCm's MI200 / MI300 (64 KiB of LDS), and the row above's cut: the split dQ kernel at D128 asked 80 KiB on
    # gfx90a -> 48 in two stages
    (64 * 1024, dict(channel_fwd_stages=1, dq_stages=2)),
)

"""GLA's backward (per-channel log decay; kernels_backward_gla.py, kernels_backward_gla_chunked.py; issue 33): which
path runs it and its blocks, apart from configs.py. Each value's history (runs, figures, what was tried) is in
notes/linear_attention/README.md: the decision log and section "configs_gla_bwd's keys and their history"."""
from __future__ import annotations

# the chunk-parallel form: the fastest path checked against float64 on the H100 (FLA's issue 640: a gated backward
# ships only where the GPU checked it); None / "split" / "split_combine" / "epilogue" are the slower checked paths
GLA_BWD_PATH: str | None = "chunked"
# head dims it takes: a dQ / dK program of the split paths holds every value column (dS [BKB, Dv] float32)
MAX_DIM = 128
# the split kernels' intra-chunk form: 5, one reference a key block (6, hi + lo operands, was miscompiled on the H100)
DIAG = 5
# the split paths' blocks: chunk 32 was their fastest checked (9.33 ms against 12.2 at chunk 64)
BLOCKS = dict(split_BT=32, split_BKB=64, split_BV=64, split_warps=4, split_stages=2, dq_BKQ=64, dq_warps=4,
              dq_stages=3)

# the chunk-parallel form's blocks and switches (kernels_backward_gla_chunked.backward reads every key; a variant
# overrides any of them): each the fastest checked on the H100, the switches off until a run shows them faster
CHUNKED = dict(
    BT=64,  # chunk: 64 with the value loop (chunk 32 was slower once the loop came)
    BV=128,  # the walks' value block: every value column (g read once a head)
    BKB=32,  # the dqk kernel's key block: 2 programs an SM (16: do v^T made 8 times a chunk, slower)
    KD=64,  # the dv kernel's key-channel step (32 slower)
    BK_DG=64,  # the dg kernel's key block (unused with dg_fused)
    walk_warps=4,  # with walk_BK 64: 2 walks an SM
    walk_stages=2,  # 3 not faster
    dqk_warps=4,  # 8 a program (one an SM) 1.7x slower
    dv_warps=4,  # 8 slower
    stages=2,  # the dv kernel's and the fallbacks' stages
    split=False,  # the factored operands as hi + lo: three dots, no accuracy needed beyond one
    dqk_apart=False,  # dq and dk by two launches: slower than the value loop
    dv_BV=128,  # the dv kernel's value block: its scores made once a chunk (64 slower)
    walks_fused=False,  # both walks in one launch: no faster
    wide_apart=True,  # the sub-chunk fallback in launches of its own (its registers off the common launch)
    dv_wide_apart=True,  # the dv kernel's fallback by the dqk kernel's flags, the same way
    dk_at=False,  # dk's intra term from a second score dot: needs the whole-columns dqk kernel (dqk_VB None)
    dqk_VB=64,  # the dqk value loop's block (32 slower)
    dqk_stages=3,  # the value loop's stages (4 slower)
    dqk_maxnreg=None,  # register caps spilled and lost
    wide_group=8,  # the dqk fallback launch's flags a program (fewer programs reading a zero flag)
    dg_fused=True,  # dg stored whole by the dqk kernel (no dg kernel)
    dg_local=True,  # dg's later-token part from S_c and dS_c (no S_(c+1) load)
    dqk_early=False,  # the first value block loaded before the span test: no faster
    walk_BK=64,  # the walks by key blocks of 64 (each row of S walks on its own): 1.2x the whole rows
    walk_maxnreg=None,  # caps: no gain
    dv_maxnreg=None,  # caps: no gain
    dqk_lean=True,  # r from do v^T's diagonal (no product and row sum a value block)
    dqk_dotscan=True,  # dG's reverse sum as three bf16 dots (fewer shuffles than tl.cumsum)
    dqk_form=3,  # one reduction for G's span, two exp tiles, no span branch (11 / 27: within noise, more error)
    dv_form=53,  # one reduction a key block, two exp tiles, no branch on the flags, the scores made transposed (P^T:
    # P^T do's register operand as it comes; 1.008x / 1.017x 5 at d 128 / d 64), each key block's dS_c rows loaded with
    # its q, k, g (+ 32: one global round trip a block fewer; 1.046x / 1.094x 21 at d 128 / d 64)
    dqk_flat=0,  # n > 0: the dqk common launch by n chunks a program, loads by TMA (CHUNKED_FLAT_DIMS sets it)
    dqk_flat_stages=None,  # its num_stages (None: dqk_stages)
    dqk_gluon=0,  # n > 0: where the flat launch runs, the Gluon kernel on the tiles template instead (gluon_gla_bwd: a
    # ring of n stages, the next tile's TMA loads under this tile's chain; CHUNKED_FLAT_DIMS sets it)
    dqk_gluon_form=0,  # its FORM (2: every sum over tokens by bf16 dots with a 0/1 matrix, bf16 inputs; + gluon_gla_bwd's
    # FORM bits); off until an H100 run
    dqk_gluon_scan=True,  # the Gluon kernel also where FORM 2 does not apply (fp16 inputs: its scans over tokens)
    dv_flat=0,  # n > 0: the dv kernel's common launch by n chunks a program, loads and store by TMA, P^T made directly
    # (gla_dv_flat_kernel); off until an H100 run
    dv_flat_stages=None,  # its num_stages (None: stages)
    dqk_dyn=True,  # the dqk value loop bounded by Dv at run time: a one-block loop is never folded into straight-line
    # code (that build is miscompiled on the H100 at d 64)
)

# the (Dk, Dv) pairs where CHUNKED's dqk_VB, dqk_form and dv_form were checked on the H100 (with dqk_dyn); other head
# dims take CHUNKED_OTHER_DIMS
CHUNKED_CHECKED_DIMS = ((128, 128), (64, 64), (32, 32))
CHUNKED_OTHER_DIMS = dict(dqk_VB=32, dqk_form=0, dv_form=0)
# the (Dk, Dv) pairs where the flat dqk launch (chunks a program, loads by TMA) was checked and faster on the H100, with
# its chunks a program and stages: at d 64 3 stages keep a chunk's copies in flight with 2 programs an SM (110.7 KB);
# a d 128 chunk is 64 KB, so 2 stages (the copies after the chain) keep 2 an SM; where Gluon runs the Gluon kernel
# instead (dqk_gluon: 1.04x the flat launch at d 128), its sums over tokens by dots with bf16 inputs (dqk_gluon_form 2:
# 1.04-1.09x its scans at d 128; at d 64 2 stages; its scans lost there: fp16 keeps the flat one), with gluon_gla_bwd's
# FORM bits: 1538 (2 + STORE_TMA + DG_TMA: the stores by TMA; 1.16x / 1.15x the chain's pointer stores with v do^T's
# product and gl.exp; with g not float32 the launch takes DG_LATE for DG_TMA) + PIECES_RZ (the sums' bf16 pieces by
# truncation) + DG_TWO (dG's sums from two pieces): 99842 at d 128 and d 64 (1.08-1.09x 1538 / 1.06-1.08x 34306 in
# two and three runs); at d 32 (one key block a chunk) the Gluon kernel by a pair of chunks a tile, 3 stages (1.48x the
# common tl launch; 3 stages 1.03-1.06x 2), + J_SMEM + DG_TWO (75266: J from shared memory, 1.037-1.049x in three runs;
# DG_TWO 1.011-1.028x in three), and the dv kernel by descriptors, 4 chunks a program (1.10x the pointer kernel;
# 1.18-1.52x slower at d 64 / 128, where it stays off)
CHUNKED_FLAT_DIMS = {(128, 128): dict(dqk_flat=2, dqk_flat_stages=2, dqk_gluon=2, dqk_gluon_form=99842),
                     (64, 64): dict(dqk_flat=3, dqk_flat_stages=3, dqk_gluon=2, dqk_gluon_form=99842,
                                    dqk_gluon_scan=False),
                     (32, 32): dict(dqk_flat=2, dqk_flat_stages=3, dqk_gluon=3, dqk_gluon_form=75266,
                                    dqk_gluon_scan=False, dv_flat=4, dv_flat_stages=3)}

# "split_combine": the combine kernel's key block and tokens a step (a head's dq / dk / dg by cdiv(Dk, 32) programs)
COMBINE_KEY_BLOCK = 32
COMBINE_TOKENS = 32

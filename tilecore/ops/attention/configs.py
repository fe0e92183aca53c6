"""Attention's measured configurations, one line of why each; the runs behind them are in
notes/attention (by session). plan.py reads these tables; nothing here asks about the device.
Figures are on the H100 against cuDNN unless said otherwise."""
from __future__ import annotations


# --------------------------------------------------------------------------------------------
# the tl kernels (kernels_tl.py); in the interpreter small blocks, so tests cover several


def forward_config(d: int, interpret: bool) -> dict:
    """The tl query-block forward's blocks and launch options for head dim ``d``."""
    if interpret:
        return dict(BLOCK_M=32, BLOCK_N=16)
    if d <= 64:  # the fastest of four tried at B 16 H 16 N 4096
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    if d <= 128:  # 128 x 64 with 8 warps: as fast without a mask, 13% slower with one
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    if d <= 256:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    return dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=1)  # past 256 (planned: decode takes it); untimed


def backward_config(d: int, interpret: bool) -> dict:
    """The tl dk/dv and dq kernels' blocks for head dim ``d``."""
    if interpret:
        return dict(BLOCK_M=16, BLOCK_N=32)
    if d <= 128:  # 1.4-2.1x the 8-warp and 128-wide variants tried
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    if d <= 192:  # MLA's 192 / 128: 169-173 TFLOP/s against 32 x 32's 87-89
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    if d <= 256:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
    # MLA's 576 / 512 (a 1024-wide padded tile): untimed, correctness first (issue 35)
    return dict(BLOCK_M=16, BLOCK_N=16, num_warps=8, num_stages=1)


# GPUs whose blocks get less shared memory than the tl configurations above ask for there: (bytes a
# block gets, kernel -> {largest head dim: overrides}), the first row whose bytes the GPU's reach
# (dispatch.shared_memory_fit; plan.fitted). None: as above (sm_80: at most 138 of its 163 KiB).
# Each row is compiled for the GPUs it serves by python -m tilecore.portability (notes/portability.md).
# Untimed there: fewer stages, and on ROCm fewer keys a step.
SHARED_FITS = (
    (163 * 1024, None),
    # sm_86, sm_89, sm_120 (99 KiB): the split-key kernel asked 102, 136, 138 KiB (sm_86) -> 70, 72, 74
    (99 * 1024, {"decode": {64: dict(num_stages=3), 128: dict(num_stages=2), 256: dict(num_stages=2)}}),
    # ROCm's MI200 and MI300 (64 KiB of LDS): split-key D128 and D256 128 KiB (gfx90a) -> 32; forward
    # D128 72 -> 40
    (64 * 1024, {"decode": {128: dict(BLOCK_N=64, num_stages=2), 256: dict(BLOCK_N=32, num_stages=2)},
                 "forward": {128: dict(BLOCK_N=64, num_stages=2)}}),
)
PREPROCESS_BLOCK_M = {True: 16, False: 64}  # rows a program of the backward's preprocess; key: interpreted
INTERPRETER_SMS = 4  # SMs as if the interpreter had them, for grids sized per SM (decode's splits)


# --------------------------------------------------------------------------------------------
# Hopper's Gluon forward (gluon_kernels.py): query rows per consumer warpgroup (block_m), keys a step
# (block_n), ring depth, consumer warpgroups, Q buffers per consumer (P V always overlaps the softmax)

GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2),
                 # two Q buffers: N = 512 +15% (causal +18%), N = 8192 +8%
                 128: dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2)}
# issue 35's features the Gluon forward serves by default (plan.features: "window", "softcap"): right
# and faster than the tl forward (window 4096 over N 32768: 3.78 against 6.16 ms)
GLUON_FORWARD_FEATURES: frozenset = frozenset({"window", "softcap"})
# issue 35's features the Gluon backward (and dq kernel) serve by default: right and faster than the
# tl kernels (window 4096 over N 32768: 11.0 against 16.8 ms)
GLUON_BACKWARD_FEATURES: frozenset = frozenset({"window", "softcap"})
# issue 35's MLA prefill head sizes (q/k head dim, v's) on the Gluon forward (gluon_kernels.py,
# QK_PIECES 3: Q and K by 64-column pieces, no power-of-two TMA box holding 192 columns). Registers
# as D128's (S 64 x 128, O 64 x 128: 168 a thread, no spill; causal 20 B); shared memory is the bound
# (227 KiB): 128-key stages of K (48 KiB) and V (32 KiB) twice, one Q buffer of the tile's 128 rows
# shared by the consumers (48 KiB), O stored in two halves through 8 KiB epilogue buffers: 224 KiB.
# Routed: 1.04x the D128 forward's rate (causal 0.96x), 1.01-1.04x cuDNN on the same 192 / 128
GLUON_FORWARD_DV = {(192, 128): dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=1, qk_pieces=3,
                                     o_halves=True)}
GLUON_FORWARD_DV_ROUTED = True
SHORT_TILE_KEY_BLOCKS = 8  # tiles of at most this many key blocks (on average) are short: carried
THREE_CONSUMERS_MIN_N = {False: 2048, True: 1024}  # D64 three consumers from here: N 4096 +5-8%
THREE_CONSUMERS_Q2_MAX_N = 4096  # ... with two Q buffers each up to here: +1.4-4.4%
SHORT_CAUSAL_KEYS = 512  # causal rows seeing at most this many keys: 64-key blocks, N 512 +18-35%
SHORT_CAUSAL_STAGES = {128: 3}  # ... in 3 stages at D128: N 512 causal 0.87 -> 0.95x


def gluon_forward_config(d: int, n: int, nk: int, causal: bool, dv: int | None = None) -> dict:
    """The Gluon forward's configuration for head dim ``d`` (v's ``dv``, default d) and these lengths:
    GLUON_FORWARD[d]; at D = 64 from THREE_CONSUMERS_MIN_N[causal], three consumers (tiles short and
    not causal: not); else short tiles carry the pipeline across tiles (not at D128 causal: -1 to
    -2%); else D128 without a mask holds Q in registers (+1.3-2.2%); causal
    rows seeing at most SHORT_CAUSAL_KEYS keys take 64-key blocks. Dv != D: GLUON_FORWARD_DV[d, dv]
    (no carry, no Q in registers: Q is in column pieces), 64-key blocks in 3 stages for short causal
    rows as D128's (untimed)."""
    keys = max(nk - n / 2, nk / 2) if causal else nk  # keys a query row sees, on average (about)
    if dv is not None and dv != d:
        cfg = dict(GLUON_FORWARD_DV[d, dv])
        if causal and keys <= SHORT_CAUSAL_KEYS:
            cfg.update(block_n=64, stages=3)  # 184 KiB of shared memory
        return cfg
    cfg = dict(GLUON_FORWARD[d])
    short = keys / cfg["block_n"] <= SHORT_TILE_KEY_BLOCKS
    if causal and keys <= SHORT_CAUSAL_KEYS:
        cfg["block_n"] = 64
        cfg["stages"] = SHORT_CAUSAL_STAGES.get(d, cfg["stages"])
    if d == 64 and n >= THREE_CONSUMERS_MIN_N[causal] and (causal or not short):
        cfg.update(consumers=3, q_buffers=2 if n <= THREE_CONSUMERS_Q2_MAX_N else 1)
    elif short and not (causal and d == 128):
        cfg["carry"] = True
    elif d == 128 and not causal:
        cfg["q_regs"] = True
    return cfg




# --------------------------------------------------------------------------------------------
# Hopper's Gluon backward (gluon_backward.py): query rows a step (block_m), keys a consumer
# (block_n; a tile is two), ring depth, and where dQ comes from (dq_from, DQ_MODES)

# dQ in the kernel, added by TMA reductions to a float32 buffer: "fused" (the step's own), "lagged"
# (one step late, with the next step's dV and dK), "warpgroup" (a warpgroup of its own, D64); or
# after the kernel: "gluon" (gluon_dq.py's kernel), "tl" (kernels_tl.attn_bwd_dq). The kernel's DQ
# constexpr: 0 none, 1 fused, 3 lagged, 4 warpgroup (2 was "overlapped", no longer shipped)
DQ_MODES = {"tl": 0, "gluon": 0, "fused": 1, "lagged": 3, "warpgroup": 4}
GLUON_BACKWARD = {
    # K and V rows held in registers, dQ by its own warpgroup: 1.13-1.16x
    (64, False): dict(block_m=64, block_n=64, stages=2, dq_from="warpgroup", kv_regs=True),
    (64, True): dict(block_m=64, block_n=64, stages=2, dq_from="warpgroup", kv_regs=True),
    (128, False): dict(block_m=64, block_n=64, stages=2, dq_from="lagged"),  # 1.00-1.03x vs fused's 0.98-1.02x
    (128, True): dict(block_m=64, block_n=64, stages=2, dq_from="fused")}  # lagged lost 1-3% causal
# MLA 192 / 128 (issue 35): dK/dV by 64-column pieces at 64 query rows a step (AttentionBackwardPieces.compute), then the dq kernel:
# fwd+bwd 0.929x / 0.984x the 128/128 rate against 32 rows' 0.883x / 0.922x
GLUON_BACKWARD_DV = {(192, 128): dict(block_m=64, block_n=64, stages=3, dq_from="gluon", qk_pieces=3)}
GLUON_DQ_DV = {(192, 128): dict(block_m=64, block_n=64, stages=3, qk_pieces=3)}
GLUON_BACKWARD_DV_ROUTED = True
GLUON_BACKWARD_DV_GROUPED = True
FUSED_DQ_MIN_N = {False: 1024, True: 4096}  # D128 below this N: dQ by the Gluon dq kernel (faster on short tiles)
GLUON_DQ = {64: dict(block_m=64, block_n=128, stages=3),  # gluon_dq.py: rows a consumer, keys a step, stages
            128: dict(block_m=64, block_n=64, stages=4)}  # 4 stages: causal 383 -> 388 TFLOP/s


# a sliding window's backward (the kernels fold causal into the window, so it takes the non-causal
# config: lagged dQ at D128) with another dQ mode from N >= FUSED_DQ_MIN_N[False]: {d: dq_from}. Fused at
# D128: window 4096 over N 32768 1.275x Flex against lagged's 1.207x, fewer spills (452 B against 584).
# {}: back to the non-causal config's lagged.
# Not with a softcap yet (plan_backward; sm_90a fused + window + softcap spills 652 B): gpu_window_bwd.py checks it
GLUON_BACKWARD_WINDOW_DQ: dict = {128: "fused"}


def gluon_backward_config(d: int, n: int, causal: bool, dv: int | None = None, window: bool = False) -> dict:
    """The Gluon backward's configuration for head dim ``d`` (v's ``dv``, default d) and N query rows:
    GLUON_BACKWARD's, but at D = 128 with dQ from the Gluon dq kernel below FUSED_DQ_MIN_N[causal];
    Dv != D: GLUON_BACKWARD_DV[d, dv]. ``window`` (a sliding window, causal folded in: ``causal`` False):
    dQ by GLUON_BACKWARD_WINDOW_DQ[d] where it names one and N is past FUSED_DQ_MIN_N[False]."""
    if dv is not None and dv != d:
        return dict(GLUON_BACKWARD_DV[d, dv])
    cfg = dict(GLUON_BACKWARD[d, causal])
    if d == 128 and n < FUSED_DQ_MIN_N[causal]:
        # no dQ in this kernel: dP's accumulator from -delta (gluon_backward's DP_FROM_DELTA) takes its spills
        # from 56 / 96 B to 8 / 0 (causal / not), 1.035x causal N2048; with dQ fused / lagged it was 0.986x /
        # 0.995x (notes/attention)
        cfg.update(dq_from="gluon", dp_from_delta=True)
    elif window and d in GLUON_BACKWARD_WINDOW_DQ:
        cfg.update(dq_from=GLUON_BACKWARD_WINDOW_DQ[d], kv_regs=False)
    return cfg


# --------------------------------------------------------------------------------------------
# the persistent Gluon kernels' tile order (plan.py)

L2_GROUP_BYTES = 8 << 20  # shared operands of the heads kept together: D128 fwd +0-5%, bwd +2-13%
TILE_OVERHEAD_STEPS = 2  # a tile's fixed cost in steps, for the balanced schedule (~2.5-4 us a tile)
DEVICE_TABLES_MAX = 64  # causal schedules kept on the device (the last used; a few KB to 33 KB each)


# An eager call recording a gradient on inputs the split-key path serves (decode_fits: few queries): True plans
# the one-launch Gluon forward there instead (O and lse from one kernel: one launch and one allocation fewer
# on the host, issue 31's "attention N256 recording a gradient" row; another kernel, so other bits than the
# call without a gradient). H100: host 0.69x a recorded call at N256 D64, fwd+bwd 0.92x / 0.76x (full / causal)
ONE_LAUNCH_WHEN_RECORDING = True

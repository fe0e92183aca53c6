"""attention_varlen's measured tables: the Gluon forward's and backward's switches, routed features and
blocks, each with a one-line reason; the runs and their history are in notes/attention/varlen.md ("configs'
history") and notes/attention/README.md's "Issue 35 part B" decision log. The dQ modes and the dq kernel's
blocks are the fixed-length backward's (tilecore.ops.attention.configs: DQ_MODES, GLUON_DQ)."""

# the Gluon varlen forward for eligible CUDA calls: checked, 0.92x fixed, 1.63x tl, 1.73x Flex
VARLEN_GLUON_FORWARD = True
# features routed to it: windows checked against float64, 1.16x tl at (1024, 0)
VARLEN_GLUON_FEATURES: frozenset = frozenset({"window"})
# the fixed forward's blocks; tiles drawn longest first; zero_tail_v keeps a neighbour's inf / NaN V out
VARLEN_GLUON_FORWARD_CONFIG = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, drawn=True,
                                        zero_tail_v=True),
                               128: dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2, drawn=True,
                                         zero_tail_v=True)}
# the Gluon varlen backward: checked, 1.66x the tl kernels on the 64K long tail
VARLEN_GLUON_BACKWARD = True
VARLEN_GLUON_BACKWARD_FEATURES: frozenset = frozenset({"window"})  # windows checked in the same run
# D128 dQ split off ("gluon"): fused takes 1.16-1.23x its time; D64: the fixed kernel's modes
VARLEN_GLUON_BACKWARD_CONFIG = {(64, False): dict(block_m=64, block_n=64, stages=2, dq_from="lagged"),
                                (64, True): dict(block_m=64, block_n=64, stages=2, dq_from="fused"),
                                (128, False): dict(block_m=64, block_n=64, stages=2, dq_from="gluon"),
                                (128, True): dict(block_m=64, block_n=64, stages=2, dq_from="gluon")}
# zero_tail (a neighbour's inf / NaN rows zeroed in shared memory) off: +7-8% on the long tail
VARLEN_GLUON_BACKWARD_ZERO_TAIL = False

# the tl kernels (op.block_config) where a GPU's blocks get less shared memory than they ask there (issue 31): rows
# of (least bytes a block gets, kernel -> {largest head dim: overrides}), the first row whose bytes the GPU's reach
# (dispatch.shared_memory_fit). Each row compiled for the GPUs it serves by python -m tilecore.portability
# (notes/portability.md); untimed there. sm_80..sm_90a and the 99 KiB GPUs take the first row: no change (sm_86:
# forward D128 88 KiB, D256 68; dK/dV 84, 88; dQ 72, 64).
SHARED_FITS = (
    (99 * 1024, None),
    # ROCm's MI200 / MI300 (64 KiB of LDS): the forward at 64 < D <= 128 asked 72 KiB on gfx90a -> 40 in two stages
    # (the fixed-length forward's ROCm row: 64 keys a step, 2 stages too); D64 40 and D256 36, the backward's 16-40
    # fit as they are
    (64 * 1024, {"forward": {64: {}, 128: dict(num_stages=2)}}),
)


def varlen_gluon_backward_config(d: int, causal: bool) -> dict:
    """The Gluon varlen backward's blocks, stages, dQ mode and zero_tail for head dim ``d`` (causal: also
    a window)."""
    return dict(VARLEN_GLUON_BACKWARD_CONFIG[d, bool(causal)], zero_tail=VARLEN_GLUON_BACKWARD_ZERO_TAIL)

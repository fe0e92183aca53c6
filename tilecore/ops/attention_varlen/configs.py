"""attention_varlen's measured tables: the Gluon forward's and backward's switches, routed features and
blocks, each with the run that set it (notes/attention/README.md, "Issue 35 part B"). The dQ modes and the
dq kernel's blocks are the fixed-length backward's (tilecore.ops.attention.configs: DQ_MODES, GLUON_DQ)."""

# attention_varlen's Gluon forward (gluon_forward.py; op.forward_gluon) for eligible CUDA calls
# (Hopper, bf16/fp16, D == Dv in VARLEN_GLUON_FORWARD_CONFIG, TMA-describable inputs): session 27's
# H100 runs 2-3 checked it (bf16/fp16 1.23-1.32x the floor, lengths 0/1/odd, GQA, softcap, D64, 64K
# long-tailed, a CUDA graph) and timed it at 0.92x the fixed-length forward's TFLOP/s, 1.63x the tl
# varlen kernel, Flex 1.73x its time (notes/attention/runs/gpu_varlen_gluon_run2_session27_h100)
VARLEN_GLUON_FORWARD = True
# features of it routed there when VARLEN_GLUON_FORWARD is on ("window": a sliding window, flash-attn's
# window_size). Session 28 (H100, run 3): windows (100, 37) and causal (300, -1) + softcap checked against
# float64; a (1024, 0) causal window over the long-tailed batch 1.284 ms against the tl kernel's 1.485 (1.16x)
VARLEN_GLUON_FEATURES: frozenset = frozenset({"window"})
# the fixed forward's blocks (GLUON_FORWARD) with tiles drawn from a counter in the work table's
# longest-first order (drawn=False: program p takes tiles p, p + P, ...; gpu_varlen --quick times it);
# zero_tail_v: zero the next sequence's V rows a partial last key block reads, so that its inf / NaN cannot
# reach this sequence (session 28, H100: with it the other sequences stay finite, O 1.19x the floor; without
# it they do not)
VARLEN_GLUON_FORWARD_CONFIG = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2, drawn=True,
                                        zero_tail_v=True),
                               128: dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2, drawn=True,
                                         zero_tail_v=True)}
# attention_varlen's Gluon backward (gluon_backward.py; op.backward_gluon). Session 28, H100 run 10
# (gpu_varlen_bwd.py): every check right against float64 (bf16 / fp16; lengths 0, 1, odd, 129; N != Nk; GQA;
# causal and not; softcap; a window (100, 37); D64; fused and split dQ; NaN-poisoned grads, a sentinel past
# the end); the 64K long-tailed causal batch's backward 5.296 ms with dQ split off ("gluon": the dK/dV kernel,
# then attention_varlen_dq_kernel) against 6.195 fused and the tl kernels' 8.775 (1.66x): 0.85x the fixed
# length's backward rate, fwd+bwd 0.88x (target 0.95). On; windows routed (VARLEN_GLUON_BACKWARD_FEATURES).
# Blocks as the fixed D128 backward's; D64 keeps the fixed kernel's dQ modes (checked, untimed)
VARLEN_GLUON_BACKWARD = True
VARLEN_GLUON_BACKWARD_FEATURES: frozenset = frozenset({"window"})
VARLEN_GLUON_BACKWARD_CONFIG = {(64, False): dict(block_m=64, block_n=64, stages=2, dq_from="lagged"),
                                (64, True): dict(block_m=64, block_n=64, stages=2, dq_from="fused"),
                                (128, False): dict(block_m=64, block_n=64, stages=2, dq_from="gluon"),
                                (128, True): dict(block_m=64, block_n=64, stages=2, dq_from="gluon")}

# zero_tail: the next sequence's rows that a box reads (K / V past Nk once a tile; Q, dO, lse, delta past N
# in a sequence's last query block) zeroed in shared memory, so that an inf / NaN there stays in its
# sequence (gluon_backward.ZERO_TAIL; D128 spills causal 348 B as without it, no mask 568 against 300;
# unchecked on a GPU: run 10's budget skipped its rows). Without it an inf / NaN in the next sequence's first
# rows can turn this sequence's last rows' gradients NaN (never finite and wrong): op.py's docstring says so.
# Session 29's H100 run 1: on, right with a neighbour's inf / NaN and +7-8% on the 64K long tail (5.53-5.59 ms
# against 5.17); off, the first sequence's gradients were not finite. "checked" (ZERO_TAIL 2): the zeroing only in
# sequences whose neighbour rows a box reads hold an inf / NaN (op.neighbour_rows_nonfinite: one pass over
# ~67 query and 128 key rows a sequence; sm_90a D128 causal split: spills 276 / 376 B against on's 300 / 392 and
# off's 128 / 188; the default's PTX unchanged); gpu_varlen_bwd.py --zero-tail checks and times it
VARLEN_GLUON_BACKWARD_ZERO_TAIL = False


def varlen_gluon_backward_config(d: int, causal: bool) -> dict:
    """The Gluon varlen backward's blocks, stages, dQ mode and zero_tail for head dim ``d`` (causal: also
    a window)."""
    return dict(VARLEN_GLUON_BACKWARD_CONFIG[d, bool(causal)], zero_tail=VARLEN_GLUON_BACKWARD_ZERO_TAIL)

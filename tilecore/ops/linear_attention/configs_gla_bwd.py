"""GLA's backward (per-channel log decay; kernels_backward_gla.py, kernels_backward_gla_chunked.py; issue 33,
session 30): which path runs it and their blocks, apart from configs.py (other helpers edit that file's forward
entries in the same session)."""
from __future__ import annotations

# Which path per-channel decay's backward takes (op.py's _backward_impl asks kernels_backward_gla.takes, then
# kernels_backward_gla.run): None the shipped one (launch.backward: unsplit kernels at key blocks of 16 with the
# sub-chunk form, then the combine kernel); "split" launch's split dQ / dK / dV kernels with the factored terms (DIAG)
# at BLOCKS, then the combine kernel ("split_combine": dv stored by its kernel, the combine by key blocks); "epilogue" the same kernels doing the combine's work (no combine kernel);
# "chunked" the chunk-parallel form (kernels_backward_gla_chunked.py, CHUNKED). A gated backward ships only where an
# H100 run checked it against float64 (flash-linear-attention's issue 640: a Hopper miscompile of such kernels under
# triton 3.4-3.7; the unsplit kernels at DIAG 6 were WRONG there, run 1 of session 30).
# Run 1 of session 30 (H100, B16 H16 N4096 d128 bf16, experiments/linear_attention/gpu_gla_bwd.py): shipped 60.8 ms;
# "split" at chunk 32 9.33 (kernels 7.45 + combine), every check passed (bf16 weak decays dq/dk/dv 1.57 / 1.56 /
# 1.95x the floor, dg 0.028 relative; strong decays + a reset 1.00-1.43x, dg 0.065; fp16 1.64-1.96x); "epilogue" at
# chunk 32 10.9 (checked). Run 7: "chunked" at chunk 32 with the fallback apart 8.37 ms, "split_combine" 8.61, "split"
# 9.36, every one checked (the same errors to three digits). On: "chunked" where the final batch's "chunked configs"
# row (CHUNKED as below) passes; else "chunked" with CHUNKED's dv_BV None (run 7's checked 8.37); "split_combine" or
# "split" are the walk kernels' checked alternatives
# on: "chunked" (the lead, session 30 run 10 on the H100: 7.82 ms against the shipped 60.9, every float64 check
# passing: bf16 weak decays, strong decays + reset, fp16; the chunk-64 key-block-32 variants' dk is wrong there)
GLA_BWD_PATH: str | None = "chunked"
# head dims it takes (a dQ / dK program holds every value column: dS [BKB, Dv] float32 in registers)
MAX_DIM = 128
# the kernels' DIAG: 5 the intra-chunk terms with one reference a chunk per key block (the sub-chunk form where a
# block's span of G is too wide), 6 the same with operands split hi + lo; the interpreter (fp16): diag 6 1.44-1.75x
# the floor, diag 5 1.88-2.12x (decision 41)
DIAG = 5
# launch.backward_plan's split keys ("split" and "epilogue"): the scalar decay's split blocks (session 28 run 3: 3.35
# ms at B16 H16 N4096 d128) but chunks of 32: dQ programs of 64 key channels, dK of 64 key channels x every value
# column, dV of 64 value columns x every key channel; 4 warps. Run 1 of session 30: chunk 32 9.33 ms, 64 12.2
# ("split"); "epilogue" 10.9 / 15.9, 8 warps 16.4 / 11.3, key blocks of 32 at chunk 32 15.5
BLOCKS = dict(split_BT=32, split_BKB=64, split_BV=64, split_warps=4, split_stages=2, dq_BKQ=64, dq_warps=4,
              dq_stages=3)

# the chunk-parallel form (kernels_backward_gla_chunked.py: a states walk, a state-gradients walk, then every chunk's
# dq / dk / dg parts and dv at once, then dg's sums over chunks): chunk BT, the walks' value block BV, the dqk
# kernel's key block BKB, the dv kernel's key-channel step KD, the dg walk's key block, warps and stages, split
# (the factored operands as hi + lo: three dots) and dqk_apart (dq and dk by two launches: fewer live tiles, q dq
# through memory)
# (dv_BV: the dv kernel's value block, None: BV; walks_fused: both walks in one launch; wide_apart: the dqk kernel's
# sub-chunk fallback in a launch of its own, for the blocks whose span flagged them; dv_wide_apart: with it, the dv
# kernel's too, by the same flags; dk_at: dk's intra term from a second score dot v do^T, not tl.trans of the
# first: run 7's wrong dk at chunk 64 with key blocks of 32 is suspected there). Run 3 of session 30 (H100, B16 H16 N4096 d128 bf16, every check
# passed): chunk 32 9.21 ms (states 1.28, dstates 1.28, dqk 4.08, dv 2.00, dg 0.57), chunk 64 9.55 (1.01, 1.02, 4.98,
# 1.96, 0.57), chunk 64 dq / dk apart 9.24 (dqk 1.84 + 2.82); 8 warps slower everywhere (10.2-12.6); the split
# path 9.37 in the same run. The blocks: run 3's fastest checked (chunk 32)
# Run 7 (snapshot ac459d9): chunk 32 with the fallback apart 8.37 ms (dqk 3.15 + 0.12), checked; the dv kernel at
# value blocks of 128 1.24 ms against 1.96 (in variants whose dk failed: chunk 64, key blocks of 32). The blocks: chunk
# 32, the fallback apart, dv at value blocks of 128 (the final batch's "chunked configs" row checks this combination)
# Session 31 (dqk_VB: the dqk kernel's value columns by a loop of blocks of it, None every column at once (v, do, S_c,
# dS_c [.., 128] live together: 255 registers, 140 B spilled on sm_90a at chunk 32); dqk_stages: that kernel's
# num_stages, None: stages; dqk_maxnreg: ptxas's register cap for it (.maxnreg; not on the fallback's own launch,
# whose sub-chunk form would spill under it), None: none)
# wide_group: with wide_apart, each program of the fallback's launch reads this many flags (None: one)
# dg_local (session 32, with dg_fused): the later tokens' part as e^G_last <S_c, dS_c> + sum_t k e^(G_last - G) v dS_c^T
# (S_(c+1) by its update from S_c), no load of S_(c+1) in the value loop (a load each block, not pipelined), q and k
# loaded before the span test; dqk_early (with dg_local): the first value block's v, do, S_c, dS_c too (every load of a
# program's first step in flight at once)
# dqk_lean (session 32, with dqk_VB): the diagonal's do_t . v_t from do v^T's diagonal, not a product and row sum of
# v and do each value block
# dqk_dotscan (session 32, with dg_local): dG's reverse sum in the dqk kernel as bf16 dots with a triangle of ones (dG
# split in three bf16 pieces), not tl.cumsum's shuffles
# dqk_probe (session 32; timing only, gradients WRONG: never on): 1 the dqk kernel without its value loop, 2 without
# its intra-chunk dots (experiments/linear_attention/gpu_gla_bwd.py's probe rows: what each part costs)
# dv_loop (session 32): the dv kernel's key blocks (KD) by a loop Triton pipelines (cp.async), not unrolled
# walk_BK (session 32): the walks' key block (None: every key channel): each row of S / dS walks on its own (its
# channel's decay), so the walks run cdiv(Dk, walk_BK) x more programs with a smaller state each; walk_maxnreg and
# dv_maxnreg: register caps (ptxas .maxnreg) of the walks and of the dv kernel (not its fallback launch)
# dg_fused (with dqk_VB): the dqk kernel stores dg whole, the later tokens' part as sum_v S_(c+1) dS_c per channel
# (the decay gradient at the next chunk's first token), no dg kernel (0.57 ms at B16 H16 N4096 d128)
# ON (session 31, HA, the last call: notes/linear_attention/runs/gla_bwd_dqk4_run5_session31_h100.txt, H100 B16 H16
# N4096 d128 bf16): chunk 64, key blocks 32, the dqk value loop (VB 32), dg from the dqk kernel (dg_fused), the walks
# by every value column at 8 warps, the dv fallback apart, the dqk fallback by 8 flags a program: **6.074 ms against
# 7.881** for session 30's CHUNKED in the same run (1.30x; states 0.85, dstates 0.84, dqk 3.26 + 0.05, dv 1.03 + 0.04,
# no dg kernel), every float64 check right (bf16 N 1008 weak decays dq / dk / dv 1.58 / 1.56 / 1.95x the floor, dg
# 0.0066 relative against 0.028; strong [-6, 0] + a reset 1.00-1.42x, dg 0.0027 against 0.065; N 4097 strong + a
# reset 1.00-1.42x, dg 0.0036 against 0.067; fp16 1.64-1.96x). Session 30's: BT=32, BV=64, BKB=64, walk_warps=4,
# dv_wide_apart=False, dqk_VB=None, wide_group=None, dg_fused=False. Chunk 64 / key blocks 32 WITHOUT the value loop
# (dqk_VB None) at 4 warps is miscompiled on the H100 (dk wrong: decision 61 of notes/linear_attention/README.md)
# ON (session 32, HA, call 3: notes/linear_attention/runs/gla_bwd_s32b_run7_session32_h100.txt, H100 B16 H16 N4096 d128
# bf16, each kernel timed alone, every float64 check right): the dqk kernel's value loop at 3 stages with dg_local,
# dqk_lean and dqk_dotscan: 2.868 ms against 3.244 for session 31's (1.13x; 3 stages alone 2.947, lean alone 2.896); the
# walks by key blocks of 64 at 4 warps (512 programs, 2 an SM): states 0.695 / dstates 0.693 against 0.838 / 0.830 (1.2x);
# the dv kernel as it was (1.018: key channels by 32, value blocks of 64, the pipelined key loop and 8 warps were all
# slower). Session 31's: walk_BK None, walk_warps 8, dqk_stages None, dg_local / dqk_lean / dqk_dotscan False
# dqk_VB 64 (session 33, HA; notes/linear_attention/runs/gla_bwd_s32c_run1_session33_h100.txt, every float64 check right):
# backward 5.315 ms against 5.462 / 5.453 for dqk_VB 32 in the same run (dqk 2.774 against 2.866 / 2.868)
CHUNKED = dict(BT=64, BV=128, BKB=32, KD=64, BK_DG=64, walk_warps=4, walk_stages=2, dqk_warps=4, dv_warps=4, stages=2,
               split=False, dqk_apart=False, dv_BV=128, walks_fused=False, wide_apart=True, dv_wide_apart=True,
               dk_at=False, dqk_VB=64, dqk_stages=3, dqk_maxnreg=None, wide_group=8, dg_fused=True,
               dg_local=True, dqk_early=False, walk_BK=64, walk_maxnreg=None, dv_maxnreg=None,
               dqk_lean=True, dqk_dotscan=True, dqk_probe=0, dv_loop=False, dqk_form=0, dv_form=0)

# "split_combine": the combine kernel's key block (a head's dq / dk / dg by cdiv(Dk, it) programs: launch's combine
# runs B x H programs of every channel, 256 at B16 H16, each walking 4096 tokens) and tokens a step
COMBINE_KEY_BLOCK = 32
COMBINE_TOKENS = 32

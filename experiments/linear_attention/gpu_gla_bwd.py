"""GLA (per-channel log decay) BACKWARD on the GPU (issue 33, session 30): every variant float64-checked and
timed, each in a process of its own (an illegal address kills only its own CUDA context; session 29's run 7
lost every row to one faulting variant).

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py              (H100, < 90 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --smoke      (CPU, interpreter: shapes only)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --compile    (CPU: the chunked kernels' sm_90a spills)
    ... --variants "shipped,split diag5 bt64"                                      (a subset, by name)

* The main process writes the check cases' inputs and their float64 gradients (autograd through
  linear_attention_reference on the GPU: dq, dk, dv, dg, dh0 of <o, do> + <S_N, dS_N>) to a scratch folder,
  while one worker process a variant compiles its kernels (tiny shapes, the checked and timed
  specializations).
* Each worker then checks its variant against them (bf16 d128 N 1008 weak decays: the factored path; strong
  decays in [-6, 0] with a reset: the fallback; fp16 N 1008 H 2), outputs NaN-poisoned where the path takes
  buffers (else a finite check), error as a multiple of the rounding floor (dg, dh0 relative), and waits.
* The main process then lets the workers time one at a time (nothing else on the GPU): B16 H16 N4096 d128
  bf16, log decays -U(0, 0.3), with an initial and a final state; the whole backward as op.py runs it
  (launch.backward, native gradients, the forward's ht given) and where it applies its kernels alone (without
  the combine pass); the shipped forward beside it (the fwd + bwd ratio). A worker not done by its deadline
  is killed (its row says so).
Prints a table last; JSON to $OUT/linear_attention_gla_bwd_s30.json (session 31: _s31.json).

Session 31 (issue 33, the dqk kernel toward its bound): variants named "cfg ..." are configs_gla_bwd.CHUNKED (the
shipped blocks) with their overrides (the dqk kernel's value loop dqk_VB, warps, register cap); a fourth check, bf16
N 4097 (a 1-token last chunk) with strong decays and a reset; the table's last lines give the dqk kernel (the common
launch, "dqk0w") against its HBM bound: the bytes it must move (q, k, g, v, do, S_c, dS_c read once; dq, dk, DG
written) over the copy bandwidth measured in the same run.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --s31     (session 31's variants, < 140 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --s33     (session 33's dqk forms, < 100 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --s33b    (session 33's second list, < 100 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --s33c    (the confirmation: configs' vs the start)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd.py --s33d    (g_pre 2 against configs', < 80 s)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
COMPILE = "--compile" in sys.argv  # the chunked variants' kernels compiled for sm_90a on this machine (no GPU)
WORKER = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv else None
SCRATCH = Path(sys.argv[sys.argv.index("--dir") + 1]) if "--dir" in sys.argv else None
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import launch, linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.plan import IDENTITY, plan, tl_plan  # noqa: E402

try:  # session 30's GLA backward (may be absent in an older snapshot)
    from tilecore.ops.linear_attention import kernels_backward_gla  # noqa: E402
except Exception:  # noqa: BLE001 (absent or broken: its variants are left out, the rest run)
    traceback.print_exc(limit=2)
    kernels_backward_gla = None
try:
    from tilecore.ops.linear_attention import kernels_backward_gla_chunked  # noqa: E402
except Exception:  # noqa: BLE001
    traceback.print_exc(limit=2)
    kernels_backward_gla_chunked = None

DEV = "cpu" if SMOKE else "cuda"
START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
S33D = "--s33d" in sys.argv  # session 33's third list (g_pre 2)
S33C = "--s33c" in sys.argv  # session 33's confirmation
S33B = "--s33b" in sys.argv  # session 33's second list
S33 = "--s33" in sys.argv or S33B or S33C or S33D  # session 33's list (HA: the dqk kernel's skeleton)
S32C = "--s32c" in sys.argv  # session 32's confirmation list
S32B = "--s32b" in sys.argv  # session 32's second list (call 3)
S32 = "--s32" in sys.argv or S32B or S32C or S33  # session 32's variants (with session 31's checks)
S31 = "--s31" in sys.argv or S32  # session 31's variants and checks (the N 4097 one compiles every kernel again)
WARM_DEADLINE = 95.0 if S32 else 85.0 if S31 else 60.0  # the main process stops waiting for workers' compiles + checks
TIME_DEADLINE = 124.0 if S32 else 112.0 if S31 else 84.0  # no timing starts past it
TIME_EACH = 9.0  # a worker's timing: the next one starts past it
FINAL_DEADLINE = 138.0 if S32 else 130.0 if S31 else 88.0  # the fp16 checks (after every timing) end here: workers still running are
# killed

# (name, tl_plan overrides, backward_plan overrides, path): path "launch" = launch.backward as op.py calls it;
# "gla" = kernels_backward_gla.backward (the split kernels with the GLA epilogue: no combine pass). Ordered
# safest first; every one runs in its own process anyway.
# shipped: diag 0's sub-chunk form (the forward's diag 3 reads as 0 in the backward kernels), key blocks of 16,
# chunk 64, the combine kernel (session 26 run 2: 62.8 ms autograd; session 28: 53-62)
VARIANTS = [
    ("shipped", {}, {}, "launch"),
    # run 1 of session 30 (H100, snapshot 4ee85d1; every float64 check passed but diag6 kb16's): shipped 60.8 ms,
    # diag5 kb16 26.4, split diag5 chunk 64 12.2 / chunk 32 9.33 (kernels 7.45 + the combine), split diag6 chunk 64
    # 13.5; the GLA epilogue (no combine) chunk 32 10.9, chunk 64 15.9, chunk 64 w8 11.3, chunk 32 kb32 15.5, chunk 32
    # w8 16.4; diag6 kb16 (unsplit) WRONG (dk 1.0e4x the floor) and then an illegal address. Run 3 (snapshot
    # b8098be, all checks passed): split diag5 chunk 32 9.37, chunk 16 10.85; chunked chunk 32 9.21 (states 1.28,
    # dstates 1.28, dqk 4.08, dv 2.00, dg 0.57), chunk 64 9.55 (dqk 4.98), chunk 64 dq/dk apart 9.24, 8 warps 10.2-12.6
    ("split diag5 bt32", dict(diag=5), dict(split=True, split_BT=32), "launch"),
    # the split kernels with dv stored in v's dtype and the combine kernel by key blocks of 32 (launch's: a program a
    # head, 256 walking 4096 tokens: 1.88 ms in run 1)
    ("split_combine diag5 bt32", dict(diag=5), dict(split=True, split_BT=32), "split_combine"),
    # the chunk-parallel form (kernels_backward_gla_chunked; configs_gla_bwd.CHUNKED overrides in the backward_plan
    # slot). sm_90a spills of the dqk kernel: chunk 64 2896 B, chunk 32 692; with the fallback in a launch of its own
    # (wide): chunk 64 992, chunk 32 140, chunk 64 key blocks of 32 80
    ("chunked configs", dict(diag=5), {}, "chunked"),
    # run 7 (snapshot ac459d9): chunk 32 wide 8.37 ms (dqk 3.15 + 0.12), chunk 64 wide 8.79, checked; chunk 64 key
    # blocks of 32 wide 7.86, with dv's value blocks of 128 7.13 (dv 1.24 from 1.96) but dk WRONG (3.6e3x the floor;
    # every chunk 64 key block 32 variant); chunk 32 key blocks 32 10.4; fused walks no faster (2.01 = 1.01 + 1.01);
    # walks at value blocks of 32 slower (1.9 each); split_combine 8.61 checked
    ("chunked bt32 wide", dict(diag=5), dict(BT=32, wide_apart=True), "chunked"),
    ("chunked bt32 wide dvbv128", dict(diag=5), dict(BT=32, wide_apart=True, dv_BV=128), "chunked"),
    ("chunked bt32 wide2 dvbv128", dict(diag=5), dict(BT=32, wide_apart=True, dv_wide_apart=True, dv_BV=128),
     "chunked"),
    ("chunked bt64 wide dvbv128", dict(diag=5), dict(wide_apart=True, dv_BV=128), "chunked"),
    # dk from a second score dot (dk_at): the suspected fix of chunk 64 key blocks 32's wrong dk
    ("chunked bt64 kb32 wide at", dict(diag=5), dict(BKB=32, wide_apart=True, dk_at=True), "chunked"),
    ("chunked bt64 kb32 wide at dvbv128", dict(diag=5), dict(BKB=32, wide_apart=True, dk_at=True, dv_BV=128),
     "chunked"),
    ("chunked bt64 kb32 wide2 at dvbv128", dict(diag=5), dict(BKB=32, wide_apart=True, dv_wide_apart=True,
                                                              dk_at=True, dv_BV=128), "chunked"),
    ("chunked bt32 wide at dvbv128", dict(diag=5), dict(BT=32, wide_apart=True, dk_at=True, dv_BV=128), "chunked"),
    # the walks with every value column a program (g read once a head, not once a value block), 8 warps (sm_90a: 183 /
    # 212 registers, no spill; dv at chunk 32, value blocks 128: 217, none)
    ("chunked bt32 wide dvbv128 walk128", dict(diag=5), dict(BT=32, wide_apart=True, dv_BV=128, BV=128, walk_warps=8),
     "chunked"),
    ("chunked bt64 kb32 wide at dvbv128 walk128", dict(diag=5), dict(BKB=32, wide_apart=True, dk_at=True, dv_BV=128,
                                                                     BV=128, walk_warps=8), "chunked"),
]
# session 31: configs' CHUNKED (chunk 32, key blocks 64, the fallback apart, dv at value blocks of 128) with the dqk
# kernel's value loop. sm_90a (triton 3.6): the shipped dqk kernel 255 registers, 140 B spilled (4 warps: 2 programs
# an SM); VB 32 / 8 warps / maxnreg 128: 128, 0 (16 warps an SM); VB 32 / 8 warps: 170, 0; VB 32 / 4 warps: 244, 0;
# VB 64 / 1 stage: 255, 0; chunk 64 key blocks 32 VB 32: 248, 0 (session 30's wrong-dk blocks, other code)
S31_VARIANTS = [
    ("cfg vb32 w8 r128", dict(diag=5), dict(dqk_VB=32, dqk_warps=8, dqk_maxnreg=128), "chunked"),
    # the fallback's launch by programs of 8 flags (wide_group: 8192 programs, not 65536 that mostly read a 0)
    ("cfg vb32 w8 r128 g8", dict(diag=5), dict(dqk_VB=32, dqk_warps=8, dqk_maxnreg=128, wide_group=8), "chunked"),
    ("cfg vb32 w8", dict(diag=5), dict(dqk_VB=32, dqk_warps=8), "chunked"),
    ("cfg vb32", dict(diag=5), dict(dqk_VB=32), "chunked"),
    ("cfg vb64 s1", dict(diag=5), dict(dqk_VB=64, dqk_stages=1), "chunked"),
    ("cfg vb32 w8 r128 apart", dict(diag=5), dict(dqk_VB=32, dqk_warps=8, dqk_maxnreg=128, dqk_apart=True,
                                                  wide_apart=False), "chunked"),
    ("cfg bt64 kb32 vb32", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32), "chunked"),
]
# Run 2 of session 31 (H100, snapshot e5eaf2b; notes/linear_attention/runs/gla_bwd_dqk_run2_session31_h100.txt), every
# check right (the N 4097 one not run: the workers lacked --s31): the value loop at chunk 32 is SLOWER, dqk 3.17 ms
# shipped -> vb32 3.54, vb64 s1 3.59, vb32 w8 r128 4.52, vb32 w8 6.36, apart 3.05 + 4.36; chunk 64 key blocks 32 with
# the loop (vb32) 3.14, its whole backward 7.17 ms against 7.87 (walks 1.02 + 1.02 against 1.29 + 1.28, dv 1.24 against
# 1.40) and right, where session 30's whole-columns kernel at those blocks gave a wrong dk (gpu_gla_bwd_dk64.py: a
# miscompile at 4 warps, right at 8). Run 3: the chunk 64 key blocks 32 loop with the walks by every value column (8
# warps: 0.84 + 0.83 ms in session 30's run 11) and the dv kernel's fallback apart (1.02 + 0.04 there)
S31_RUN3 = [
    ("cfg bt64 kb32 vb32", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32), "chunked"),
    ("cfg bt64 kb32 vb32 walk128", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32, BV=128, walk_warps=8), "chunked"),
    ("cfg bt64 kb32 vb32 walk128 dvw", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32, BV=128, walk_warps=8,
                                                          dv_wide_apart=True), "chunked"),
    ("cfg bt64 kb32 vb32 walk128 dvw g8", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32, BV=128, walk_warps=8,
                                                             dv_wide_apart=True, wide_group=8), "chunked"),
    # dg whole from the dqk kernel (dg_fused: the later tokens' part as sum_v S_(c+1) dS_c), no dg kernel (0.57 ms)
    ("cfg bt64 kb32 vb32 fused", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32, dg_fused=True), "chunked"),
    ("cfg bt64 kb32 vb32 walk128 dvw g8 fused", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=32, BV=128, walk_warps=8,
                                                                   dv_wide_apart=True, wide_group=8, dg_fused=True),
     "chunked"),
    ("cfg bt64 kb32 vb64", dict(diag=5), dict(BT=64, BKB=32, dqk_VB=64), "chunked"),
    ("cfg bt64 kb32 w8", dict(diag=5), dict(BT=64, BKB=32, dqk_warps=8), "chunked"),  # whole columns, 8 warps
]
# the last call's (run 3 and 3b did not run): the candidate (every part) and the two steps to it, and the dqk kernel at
# 8 warps (151 registers, 0 spilled) in it
S31_LAST = [S31_RUN3[0], S31_RUN3[2], S31_RUN3[5],
            ("cfg bt64 kb32 vb32 w8 walk128 dvw g8 fused", dict(diag=5), dict(
                BT=64, BKB=32, dqk_VB=32, dqk_warps=8, BV=128, walk_warps=8, dv_wide_apart=True, wide_group=8,
                dg_fused=True), "chunked")]
# session 32 (HA, issue 33: the dqk kernel from 38% of its bound): over configs' CHUNKED (session 31's flip), dg_local
# (the later tokens' dg part from S_c, dS_c and the chunk's k, v: no unpipelined load of S_(c+1) each value block; q, k
# issued before the span test), dqk_early (the first value block's tiles before the span test too), register caps for
# 3 / 4 programs an SM, key blocks of 16, the dv kernel's key channels by 32 and its value blocks of 64 (+ a cap), and
# the walks by key blocks (walk_BK: 2-4x the programs, each a smaller state) riding on the rows (each kernel is timed
# alone: the per-kernel table separates them). sm_90a (registers / spilled B): dqk shipped 254/0, local 255/0, local
# early 255/28, local r168 168/368, kb16 192/0, kb16 r168 168/0 (3 programs an SM), kb16 r128 128/92; dv shipped 255/4,
# KD 32 245/0, BV 64 KD 32 236/0, + r168 168/224; walks shipped (BK 128, BV 128, 8 warps) 255/0 (1 program an SM),
# BK 64 8 warps r128 128/0 (2 an SM), BK 64 4 warps 255/0, BK 32 4 warps 153/0 (3 an SM; mma.sync), + r128 128/12;
# dqk lean (r from do v^T's diagonal) + dotscan (dG's reverse sum as three bf16 dots with a triangle of ones, not
# tl.cumsum's shuffles): 255/76, 160 shuffles in the SASS against 368 (the dv kernel's pipelined key loop, dv_loop, lost
# in sessions 32 and 41 and is removed: its rows left this list)
W64R = dict(walk_BK=64, walk_warps=8, walk_maxnreg=128)
S32_VARIANTS = [
    ("cfg s32 local", dict(diag=5), dict(dg_local=True), "chunked"),
    ("cfg s32 local r168", dict(diag=5), dict(dg_local=True, dqk_maxnreg=168), "chunked"),
    ("cfg s32 local kb16 wbk64w8r128", dict(diag=5), dict(dg_local=True, BKB=16, **W64R), "chunked"),
    ("cfg s32 local kb16 r168 wbk32", dict(diag=5), dict(dg_local=True, BKB=16, dqk_maxnreg=168, walk_BK=32,
                                                         walk_warps=4), "chunked"),
    ("cfg s32 local kb16 r128 wbk32r128", dict(diag=5), dict(dg_local=True, BKB=16, dqk_maxnreg=128, walk_BK=32,
                                                             walk_warps=4, walk_maxnreg=128), "chunked"),
    ("cfg s32 local dvkd32 wbk64w4", dict(diag=5), dict(dg_local=True, KD=32, walk_BK=64, walk_warps=4), "chunked"),
    ("cfg s32 local dvbv64 kd32", dict(diag=5), dict(dg_local=True, dv_BV=64, KD=32), "chunked"),
    ("cfg s32 local dvbv64 kd32 r168", dict(diag=5), dict(dg_local=True, dv_BV=64, KD=32, dv_maxnreg=168), "chunked"),
    # timing only (gradients WRONG, their checks FAIL by design): the dqk kernel without its value loop (201 registers,
    # 0 B), without its intra-chunk dots (174, 0: 3 programs an SM)
    ("probe s32 local no-value-loop", dict(diag=5), dict(dg_local=True, dqk_probe=1), "chunked"),
    ("probe s32 local no-intra-dots", dict(diag=5), dict(dg_local=True, dqk_probe=2), "chunked"),
]
# Call 2 of session 32 (H100, snapshot 90251d7; notes/linear_attention/runs/gla_bwd_s32_run2_session32_h100.txt; the list
# then: local, local r168, r168, kb64 w8, local st3, local dvkd32, local dvw8), every check right: dqk shipped 3.257 ms,
# local 3.407, local r168 3.592, r168 3.620, key blocks 64 at 8 warps 3.870, local with 3 stages 3.132 (the only faster
# one); dv KD 32 1.264 and 8 warps 1.764 against 1.026. Register caps (more programs an SM, with spills) are slower, and
# the value loop's stages help. --s32b (call 3's list): the stages on the shipped form, then the session's forms with 3
W32R = dict(walk_BK=32, walk_warps=4, walk_maxnreg=128)
W64W4 = dict(walk_BK=64, walk_warps=4)
S32B_VARIANTS = [
    ("cfg s32 st3 walkst3", dict(diag=5), dict(dqk_stages=3, walk_stages=3), "chunked"),  # walks: 180 KB shared
    ("cfg s32 st4 wbk32r128", dict(diag=5), dict(dqk_stages=4, **W32R), "chunked"),
    ("cfg s32 local st3", dict(diag=5), dict(dg_local=True, dqk_stages=3), "chunked"),
    ("cfg s32 local st4 wbk64w4", dict(diag=5), dict(dg_local=True, dqk_stages=4, **W64W4), "chunked"),
    ("cfg s32 lean st3 dvbv64 kd32", dict(diag=5), dict(dqk_lean=True, dqk_stages=3, dv_BV=64, KD=32), "chunked"),
    ("cfg s32 kb16 st3 wbk64w8r128", dict(diag=5), dict(BKB=16, dqk_stages=3, **W64R), "chunked"),
    ("cfg s32 kb16 r168 st3", dict(diag=5), dict(BKB=16, dqk_maxnreg=168, dqk_stages=3), "chunked"),
    ("probe s32 st3 no-value-loop", dict(diag=5), dict(dqk_stages=3, dqk_probe=1), "chunked"),
    ("probe s32 st3 no-intra-dots", dict(diag=5), dict(dqk_stages=3, dqk_probe=2), "chunked"),
]
# Call 3 (run 7, notes/linear_attention/runs/gla_bwd_s32b_run7_session32_h100.txt; every check right): dqk shipped 3.244
# ms, 3 stages 2.947, local + lean + dotscan at 3 stages 2.868 (44% of its bound), lean at 3 stages 2.896, local at 3
# 3.094, at 4 3.022, key blocks 16 3.65-4.55; the walks by key blocks of 64 at 4 warps 0.695 / 0.693 against 0.838 /
# 0.830, at 3 stages (BK 128) 0.792 / 0.776; probes: without the value loop 2.018, without the intra dots 2.564; the dv
# kernel's variants slower (1.33-2.30 against 1.018). Flipped: configs' CHUNKED = the best dqk form + the key-block walks.
# --s32c (the confirmation): configs' CHUNKED against session 31's in one run, and the walks at 3 stages on top
S31_CHUNKED = dict(walk_BK=None, walk_warps=8, dqk_stages=None, dg_local=False, dqk_lean=False, dqk_dotscan=False)
S32C_VARIANTS = [
    ("cfg s31 shipped", dict(diag=5), S31_CHUNKED, "chunked"),
    ("cfg s32 walkst3", dict(diag=5), dict(walk_stages=3), "chunked"),  # BK 64 4 warps: 106 KB shared, 2 an SM
    # two more of the same kinds: the dqk value loop by blocks of 64 (2 steps at 3 stages: 255 registers, 40 B spilled
    # against 76, 64 KB shared) and the walks by key blocks of 32 at 4 warps uncapped (153 registers: 3 programs an SM,
    # mma.sync; capped at 128 in call 3 its dk was 1.77x the floor)
    ("cfg s32 vb64", dict(diag=5), dict(dqk_VB=64), "chunked"),
    ("cfg s32 wbk32", dict(diag=5), dict(walk_BK=32), "chunked"),
    ("cfg s32 again", dict(diag=5), {}, "chunked"),  # configs' CHUNKED timed again last (the run's noise)
]
# --s33 (session 33, HA): configs' CHUNKED (dqk_VB 64 since call 1) against the dqk kernel's session-33 forms
# (CHUNKED dqk_form: 1 one three-way reduction for G's span and G_last and two exp tiles, sm_90a 255 registers 72 B
# spilled, 55 barriers against 61, 3360 SASS instructions against 3472; 2 no branch on the span, the value loop before
# g's scan; 3 both: 0 B spilled, 3240 instructions); the dv kernel's dv_form 1 (one three-way reduction a key block,
# two exp tiles: 23 barriers against 35, 146 MUFU against 194, 4520 instructions against 4784, 0 B spilled against 4)
S33_VARIANTS = [
    ("cfg s33 form1", dict(diag=5), dict(dqk_form=1), "chunked"),
    ("cfg s33 form2", dict(diag=5), dict(dqk_form=2), "chunked"),
    ("cfg s33 form3", dict(diag=5), dict(dqk_form=3), "chunked"),
    ("cfg s33 dvform1", dict(diag=5), dict(dv_form=1), "chunked"),
    ("cfg s33 form3 dvform1", dict(diag=5), dict(dqk_form=3, dv_form=1), "chunked"),
    ("cfg s33 again", dict(diag=5), {}, "chunked"),  # configs' CHUNKED timed again last (the run's noise)
]
# --s33b (after call 4's flip of dqk_form 3 + dv_form 1): dqk_form 11 (the diagonal r k, r q inside the intra dots, no
# r: sm_90a 3120 instructions, 49 barriers, 13 layout conversions against 3240 / 55 / 17, 253 registers, 0 B), 27 (and
# E, Ei's products in the dots' layout: 240 registers, 3136 / 49 / 14), dv_form 5 (no branch on the flags: every
# chunk's loads at once, marked chunks written again by the fallback launch)
S33B_VARIANTS = [
    ("cfg s33b form11", dict(diag=5), dict(dqk_form=11), "chunked"),
    ("cfg s33b form27", dict(diag=5), dict(dqk_form=27), "chunked"),
    ("cfg s33b dv5", dict(diag=5), dict(dv_form=5), "chunked"),
    ("cfg s33b form27 dv5", dict(diag=5), dict(dqk_form=27, dv_form=5), "chunked"),
    ("cfg s33b form11 dv5", dict(diag=5), dict(dqk_form=11, dv_form=5), "chunked"),
    # g_pre 2: the states walk also stores each chunk's span middles, G_last and the dqk flags (no G): dqk 2776
    # instructions, 38 barriers, 228 registers; dv 3904 / 17; the states walk 2688 / 29 against 2160 / 22
    ("cfg s33b form27 dv5 gpre2", dict(diag=5), dict(dqk_form=27, dv_form=5, g_pre=2), "chunked"),
    ("cfg s33b again", dict(diag=5), {}, "chunked"),
]
VARIANTS += S31_VARIANTS[:-1] + S31_RUN3 + S31_LAST[3:] + S32_VARIANTS + S32B_VARIANTS + S32C_VARIANTS + S33_VARIANTS
# --s33c (the confirmation): configs' CHUNKED against the session's start (session 32's CHUNKED: dqk_VB 32, no
# session-33 forms) in one run, configs' again last
S33C_VARIANTS = [
    ("cfg s33 start", dict(diag=5), dict(dqk_VB=32, dqk_form=0, dv_form=0), "chunked"),
    ("cfg s33c again", dict(diag=5), {}, "chunked"),
]
# --s33d (after call 6; configs' = dqk_form 3 + dv_form 5): g_pre 2 (the states walk stores the span middles, G_last
# and the dqk flags; sm_90a dqk 2824 instructions / 46 barriers against 3240 / 55, dv 3904 / 17 against 4504 / 23, the
# states walk 2688 / 29 against 2160 / 22), and with dqk_form 27 (2776 / 38)
S33D_VARIANTS = [
    ("cfg s33d gpre2", dict(diag=5), dict(g_pre=2), "chunked"),
    ("cfg s33d gpre2 form27", dict(diag=5), dict(g_pre=2, dqk_form=27), "chunked"),
    ("cfg s33d again", dict(diag=5), {}, "chunked"),
]
VARIANTS += S33B_VARIANTS + S33C_VARIANTS + S33D_VARIANTS
if S33D and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S33D_VARIANTS
elif S33C and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S33C_VARIANTS
elif S33B and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S33B_VARIANTS
elif S33 and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S33_VARIANTS
elif S32C and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S32C_VARIANTS
elif S32B and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S32B_VARIANTS
elif S32 and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S32_VARIANTS
elif S31 and "--variants" not in sys.argv:
    VARIANTS = [v for v in VARIANTS if v[0] == "chunked configs"] + S31_LAST
if "--variants" in sys.argv:
    wanted = sys.argv[sys.argv.index("--variants") + 1].split(",")
    VARIANTS = [v for v in VARIANTS if v[0] in wanted]
if kernels_backward_gla is None:
    VARIANTS = [v for v in VARIANTS if v[3] not in ("gla", "split_combine")]
if kernels_backward_gla_chunked is None:
    VARIANTS = [v for v in VARIANTS if v[3] != "chunked"]

# the chunked variants' blocks are these with the variant's changes ("chunked configs": configs_gla_bwd.CHUNKED as
# it is, the candidate to ship)
CHUNKED_BASE = dict(BT=64, BV=64, BKB=64, KD=64, BK_DG=64, walk_warps=4, walk_stages=2, dqk_warps=4, dv_warps=4,
                    stages=2, split=False, dqk_apart=False, dv_BV=None, walks_fused=False, wide_apart=False,
                    dv_wide_apart=False, dk_at=False)

# check cases: (name, make's arguments); N 1008 (a multiple of 16: the timed kernels' specialization) ends in a
# partial chunk of 48 (of 16 at chunk 32)
CHECKS = [
    ("bf16 d128 h0 N1008 weak decays", dict(B=1, N=1008, H=16, Dk=128, Dv=128)),
    ("bf16 d128 h0 N1008 strong [-6, 0] + reset", dict(B=1, N=1008, H=16, Dk=128, Dv=128, decay=6.0, reset=True,
                                                       seed=2)),
    ("fp16 d128 h0 N1008 per token 0.05", dict(B=1, N=1008, H=2, Dk=128, Dv=128, per_token=0.05,
                                               dtype=torch.float16, seed=3)),
]
if S31:  # N 4097: a last chunk of one token, strong decays with a reset (bf16, before the timing)
    CHECKS.insert(2, ("bf16 d128 h0 N4097 strong [-6, 0] + reset", dict(B=1, N=4097, H=4, Dk=128, Dv=128, decay=6.0,
                                                                        reset=True, seed=4)))
N_EARLY = len(CHECKS) - 1  # the checks before the timing (the fp16 one, its own compiles, after)
GRADS = ("dq", "dk", "dv", "dg", "dh0")


def elapsed() -> float:
    return time.time() - START


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def make(B, N, H, Dk, Dv, *, dtype=torch.bfloat16, decay=0.3, per_token=None, reset=False, seed=0, dev=None):
    """q, k, v, log decay g, initial state h0, do, dht (a final-state gradient) and ht (a final state's stand-in
    for timing; the checks use the reference's). Log decays -U(0, decay) or ~per_token each (+-20%); reset: -inf
    on a quarter of the channels mid-way."""
    dev = dev or DEV
    torch.manual_seed(seed)
    t = dict(q=torch.randn(B, N, H, Dk, dtype=dtype, device=dev), k=torch.randn(B, N, H, Dk, dtype=dtype, device=dev),
             v=torch.randn(B, N, H, Dv, dtype=dtype, device=dev))
    if per_token is not None:
        g = -per_token * (0.8 + 0.4 * torch.rand(B, N, H, Dk, device=dev))
    else:
        g = -torch.rand(B, N, H, Dk, device=dev) * decay
    if reset:
        g[:, N // 2, :, : Dk // 4] = float("-inf")
    t.update(g=g, h0=torch.randn(B, H, Dk, Dv, device=dev), do=torch.randn(B, N, H, Dv, dtype=dtype, device=dev),
             dht=torch.randn(B, H, Dk, Dv, device=dev), ht=torch.randn(B, H, Dk, Dv, device=dev))
    return t


def smoke_shape(mk: dict) -> dict:
    return dict(mk, N=min(mk["N"], 70), H=2, Dk=32, Dv=32) if SMOKE else mk


# --------------------------------------------------------------------------------------------
# a variant's backward


def variant_plans(variant, t):
    _, plan_over, split_over, path = variant
    if path == "chunked":  # its own blocks (run_backward passes them)
        split_over = {}
    chunk = 64 if plan_over else None  # the shipped plan's chunk is configs' (64 for per-channel decay)
    p = tl_plan(t["q"], t["v"], t["g"], IDENTITY, chunk, **plan_over) if plan_over else plan(t["q"], t["v"], t["g"],
                                                                                            IDENTITY)
    return launch.backward_plan(p, t["q"], t["v"], t["g"], IDENTITY, None, **split_over)


def run_backward(variant, t, ht, out=None, steps=None):
    """(dq, dk, dv, dg, dh0) of the variant's backward (native gradients, as op.py asks)."""
    p = variant_plans(variant, t)
    scale = t["q"].shape[-1] ** -0.5
    if variant[3] == "chunked":  # the variant's blocks over session 30's first defaults (configs may move on)
        blocks = chunked_blocks(variant)
        dq, dk, dv, dg, _, dh0 = kernels_backward_gla_chunked.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"],
                                                                       t["h0"], ht, t["dht"], scale, out=out,
                                                                       steps=steps, **blocks)
    elif variant[3] == "split_combine":
        dq, dk, dv, dg, _, dh0 = kernels_backward_gla.backward_split(p, t["do"], t["q"], t["k"], t["v"], t["g"],
                                                                     t["h0"], ht, t["dht"], scale, out=out)
    elif variant[3] == "gla":
        dq, dk, dv, dg, _, dh0 = kernels_backward_gla.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], t["h0"],
                                                               ht, t["dht"], scale, out=out)
    else:
        dq, dk, dv, dg, _, dh0 = launch.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], None, t["h0"], None, ht,
                                                 t["dht"], scale, IDENTITY, native=True)
    return dq, dk, dv, dg, dh0


def chunked_blocks(variant) -> dict:
    """A chunked variant's overrides of configs_gla_bwd.CHUNKED: "chunked configs" none, "cfg ..." its own, the rest
    its own over session 30's first defaults (CHUNKED_BASE)."""
    if variant[0] == "chunked configs":
        return {}
    return dict(variant[2]) if variant[0].startswith(("cfg ", "probe ")) else dict(CHUNKED_BASE, **variant[2])


def dqk_bytes(B, N, H, Dk, Dv, BT, elt=2) -> int:
    """The HBM bytes the dqk kernel (the common launch) must move at least: q, k (elt), g (float32), v, do (elt) and
    S_c, dS_c (elt, (B, H, NT, Dk, Dv)) read once; dq, dk (elt) and DG (float32) written; TOT and the flags
    (B H NT Dk float32, B H NT key blocks bytes) left out."""
    NT = -(-N // BT)
    tokens = B * N * H
    return tokens * (2 * Dk * elt + Dk * 4 + 2 * Dv * elt) + 2 * B * H * NT * Dk * Dv * elt + tokens * Dk * (2 * elt + 4)


def kernel_bytes(B, N, H, Dk, Dv, BT, elt=2) -> dict:
    """Session 32: each chunked kernel's compulsory HBM bytes (inputs read once, outputs written once; g float32):
    states k, v, g -> S_c; dstates q, do, g -> dS_c; dqk (dqk_bytes); dv q, k, g, do, dS_c -> dv. Over the copy
    bandwidth of the same run: each kernel's bound (the napkin has no GLA-backward model; this is its HBM term)."""
    NT = -(-N // BT)
    tokens = B * N * H
    states = B * H * NT * Dk * Dv * elt
    return dict(states=tokens * (Dk * elt + Dv * elt + Dk * 4) + states,
                dstates=tokens * (Dk * elt + Dv * elt + Dk * 4) + states,
                dqk0w=dqk_bytes(B, N, H, Dk, Dv, BT, elt),
                dvw=tokens * (2 * Dk * elt + Dk * 4 + 2 * Dv * elt) + states)


def kernels_only(variant, t, ht):
    """The dQ and dK/dV kernels alone (launch.backward_kernels: without the combine pass), or None."""
    if variant[3] != "launch":
        return None
    p = variant_plans(variant, t)
    do = launch.kernel_do(p, t["do"], t["v"], t["g"])
    scale = t["q"].shape[-1] ** -0.5
    return lambda: launch.backward_kernels(p, do, t["q"], t["k"], t["v"], t["g"], None, t["h0"], t["dht"], scale,
                                           IDENTITY)


def poisoned(t):
    """NaN-filled output buffers for the gla path (dq, dk, dv in the inputs' dtypes, dg, dh0 float32)."""
    nan = float("nan")
    return dict(dq=torch.full_like(t["q"], nan), dk=torch.full_like(t["k"], nan), dv=torch.full_like(t["v"], nan),
                dg=torch.full_like(t["g"], nan), dh0=torch.full_like(t["h0"], nan))


# --------------------------------------------------------------------------------------------
# main process: the reference gradients


def reference_case(mk: dict) -> dict:
    t = make(**smoke_shape(mk))
    leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
    o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=t["q"].shape[-1] ** -0.5,
                                       initial_state=leaves[4])
    ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
    return dict(inputs={k: x.cpu() for k, x in t.items()}, ref=[r.cpu() for r in ref], ht=st.float().cpu())


def check_variant(variant, case: dict) -> dict:
    t = {k: x.to(DEV) for k, x in case["inputs"].items()}
    ht = case["ht"].to(DEV)
    out = poisoned(t) if variant[3] != "launch" else None
    grads = run_backward(variant, t, ht, out)
    if DEV == "cuda":
        torch.cuda.synchronize()
    live = t["g"] >= -100  # dg is 0 where the floor clamps
    row = {}
    for name, got, ref, x in zip(GRADS, grads, case["ref"], (t["q"], t["k"], t["v"], None, None)):
        ref = ref.to(DEV)
        row[f"{name}_finite"] = bool(torch.isfinite(got).all())
        if out is not None:
            row[f"{name}_written"] = bool(not torch.isnan(got).any())
        if x is not None:
            row[name] = round(accuracy.rel_rms(got, ref) / accuracy.rounding_floor(ref, x.dtype), 3)
        elif name == "dg":
            row[name] = accuracy.rel_rms(got[live], ref[live])
        else:
            row[name] = accuracy.rel_rms(got, ref)
    row["pass"] = all(row[f"{n}_finite"] and row.get(f"{n}_written", True) for n in GRADS) and all(
        row[n] <= 2.5 for n in ("dq", "dk", "dv")) and row["dg"] < 0.1 and row["dh0"] < 0.01
    return row


# --------------------------------------------------------------------------------------------
# a worker: compile, check, then time when told


def time_variant(variant, res: dict):
    """The variant's times at B16 H16 N4096 d128 bf16 into res (its tensors freed on return)."""
    t = make(16, 4096, 16, 128, 128)
    res["bwd_ms"] = bench(lambda: run_backward(variant, t, t["ht"]))
    fn = kernels_only(variant, t, t["ht"])
    if fn is not None:
        res["kernels_ms"] = bench(fn)
    if variant[3] == "chunked":  # each kernel alone (after one in-order run wrote what they read)
        steps = []
        run_backward(variant, t, t["ht"], steps=steps)
        for _, kernel, grid, args, kw in steps:
            kernel[grid](*args, **kw)
        res["steps_ms"] = {step: round(bench(lambda: kernel[grid](*args, **kw)), 4)
                           for step, kernel, grid, args, kw in steps}
    if variant[3] == "chunked" and variant[0] in ("chunked configs", S31_RUN3[0][0]):  # the copy bandwidth
        x = torch.empty(2 ** 30 // 2, dtype=torch.bfloat16, device=DEV)  # 1 GiB
        y = torch.empty_like(x)
        res["copy_GBps"] = round(2 * x.numel() * 2 / bench(lambda: y.copy_(x)) / 1e6, 1)
        del x, y
    if variant[0] == "shipped":  # the shipped forward (CHANNEL_FWD_DIAG 3, chunk 32, BV 128, 3 stages)
        p = plan(t["q"], t["v"], t["g"], IDENTITY)
        res["fwd_ms"] = bench(lambda: launch.forward(p, t["q"], t["k"], t["v"], t["g"], None, None, None, t["h0"],
                                                     t["q"].shape[-1] ** -0.5, IDENTITY, final_state=True,
                                                     keep_linear=False))


def worker(name: str, scratch: Path):
    variant = next(v for v in VARIANTS if v[0] == name)
    res = dict(variant=name, check={}, errors=[])

    def dump():
        (scratch / f"{name}.json").write_text(json.dumps(res, default=str))

    try:
        tiny = make(1, 128, 16, 128, 128)
        run_backward(variant, tiny, tiny["ht"])
        torch.cuda.synchronize()
        res["compiled_s"] = round(elapsed(), 1)
    except Exception as err:  # noqa: BLE001
        res["errors"].append(f"compile: {type(err).__name__}: {err}"[:400])
        dump()
        return
    while not (scratch / "refs.pt").exists() and elapsed() < WARM_DEADLINE:
        time.sleep(0.05)
    cases = torch.load(scratch / "refs.pt")
    for case_name, _ in CHECKS[:N_EARLY]:  # bf16 (the fp16 case compiles its own kernels: after every timing)
        try:
            res["check"][case_name] = check_variant(variant, cases[case_name])
        except Exception as err:  # noqa: BLE001
            res["errors"].append(f"check {case_name}: {type(err).__name__}: {err}"[:400])
            dump()
            return  # a faulted context checks nothing more
        dump()
    res["checked_s"] = round(elapsed(), 1)
    dump()
    (scratch / f"{name}.ready").touch()
    go = scratch / f"{name}.go"
    while not go.exists():
        if (scratch / "all_timed").exists():  # not timed (past the deadline)
            return
        time.sleep(0.02)
    try:
        time_variant(variant, res)
    except Exception as err:  # noqa: BLE001
        res["errors"].append(f"time: {type(err).__name__}: {err}"[:400])
        dump()
        return
    torch.cuda.empty_cache()  # the timed tensors are gone: the next worker's timing needs the memory (run 9: OOM)
    dump()
    (scratch / f"{name}.timed").touch()
    while not (scratch / "all_timed").exists():
        time.sleep(0.05)
    for case_name, _ in CHECKS[N_EARLY:]:
        try:
            res["check"][case_name] = check_variant(variant, cases[case_name])
        except Exception as err:  # noqa: BLE001
            res["errors"].append(f"check {case_name}: {type(err).__name__}: {err}"[:400])
        dump()
    (scratch / f"{name}.done").touch()


# --------------------------------------------------------------------------------------------
# main


def table(rows: list[dict]):
    print("\ncheck (bf16/fp16 vs float64 autograd; dq dk dv: x the rounding floor; dg, dh0: relative) | "
          + " | ".join(c for c, _ in CHECKS))
    for r in rows:
        cells = []
        for case_name, _ in CHECKS:
            c = r["check"].get(case_name)
            cells.append("-" if not c else ", ".join(f"{c[n]:.3g}" for n in GRADS) + (" ok" if c["pass"] else " FAIL"))
        print(f"{r['variant']} | " + " | ".join(cells))
    fwd = next((r.get("fwd_ms") for r in rows if r.get("fwd_ms")), None)
    base = "cfg s33 start" if S33C else "cfg s31 shipped" if S32C else "shipped"
    ship = next((r.get("bwd_ms") for r in rows if r["variant"] == base and r.get("bwd_ms")), None)
    if ship is None:  # session 31: the shipped path is the chunked one, configs' CHUNKED
        ship = next((r.get("bwd_ms") for r in rows if r["variant"] == "chunked configs" and r.get("bwd_ms")), None)
    if not S32:
        print(f"\ntime B16 H16 N4096 d128 bf16 (ms): shipped forward {fwd}")
        print("variant | backward ms | kernels alone ms (chunked: each kernel) | x shipped | bwd / fwd | all checks pass "
              "| errors")
    for r in rows if not S32 else []:
        ms = r.get("bwd_ms")
        passed = bool(r["check"]) and len(r["check"]) == len(CHECKS) and all(c["pass"] for c in r["check"].values())
        parts = r.get("steps_ms") or (r.get("kernels_ms") and round(r["kernels_ms"], 3))
        print(f"{r['variant']} | {ms and round(ms, 3)} | {parts} | "
              f"{ship / ms if ship and ms else '-':.4} | {ms / fwd if fwd and ms else '-':.4} | {passed} | "
              f"{'; '.join(r['errors'])[:200]}")
    copy = next((r["copy_GBps"] for r in rows if r.get("copy_GBps")), None)
    if copy and S32:  # each kernel against its HBM bound (kernel_bytes / the copy bandwidth), then the total
        from tilecore.ops.linear_attention import configs_gla_bwd

        print(f"\nper kernel: ms (% of its HBM bound at the run's copy bandwidth {copy} GB/s; B16 H16 N4096 d128 bf16)")
        print("variant | backward ms (sum of bounds) | x shipped | checks | states | dstates | dqk (common) | dqk fallback "
              "| dv | dv fallback")
        for r in rows:
            steps = r.get("steps_ms") or {}
            variant = next((v for v in VARIANTS if v[0] == r["variant"]), None)
            if not steps or variant is None:
                continue
            BT = dict(configs_gla_bwd.CHUNKED, **chunked_blocks(variant))["BT"]
            bound = {k: b / copy / 1e6 for k, b in kernel_bytes(16, 4096, 16, 128, 128, BT).items()}
            cell = {k: (f"{steps[k]:.3f} ({100 * bound[k] / steps[k]:.0f}%)" if k in steps and k in bound else
                        f"{steps[k]:.3f}" if k in steps else "-") for k in ("states", "dstates", "dqk0w", "dqk0ww",
                                                                            "dvw", "dvww")}
            ms = r.get("bwd_ms")
            passed = len(r["check"]) == len(CHECKS) and all(c["pass"] for c in r["check"].values())
            print(f"{r['variant']} | {ms and round(ms, 3)} ({sum(bound.values()):.3f}) | "
                  f"{ship / ms if ship and ms else float('nan'):.3f} | {'pass' if passed else 'FAIL'} | "
                  + " | ".join(cell.values()) + (f" | {'; '.join(r['errors'])[:120]}" if r["errors"] else ""))
    elif copy:
        from tilecore.ops.linear_attention import configs_gla_bwd

        print(f"\ndqk kernel (common launch) against its HBM bound at the copy bandwidth {copy} GB/s (B16 H16 N4096 "
              "d128 bf16): variant | dqk ms | bytes GB | bound ms | % of bound | x chunked configs' dqk")
        base = next((r["steps_ms"].get("dqk0w") for r in rows if r["variant"] == "chunked configs"
                     and r.get("steps_ms")), None)
        for r in rows:
            steps = r.get("steps_ms") or {}
            ms = steps.get("dqk0w") or (steps.get("dqk1", 0) + steps.get("dqk2", 0)) or None
            if not ms:
                continue
            variant = next((v for v in VARIANTS if v[0] == r["variant"]), None)
            BT = dict(configs_gla_bwd.CHUNKED, **chunked_blocks(variant))["BT"] if variant else 32
            gb = dqk_bytes(16, 4096, 16, 128, 128, BT) / 1e9
            bound = gb / copy * 1e3
            print(f"{r['variant']} | {ms:.3f} | {gb:.2f} | {bound:.3f} | {100 * bound / ms:.0f}% | "
                  f"{base / ms if base else float('nan'):.2f}")


def main_smoke():
    rows = []
    cases = {name: reference_case(mk) for name, mk in CHECKS}
    for variant in VARIANTS:
        row = dict(variant=variant[0], check={}, errors=[])
        for case_name, _ in CHECKS:
            try:
                row["check"][case_name] = check_variant(variant, cases[case_name])
            except Exception as err:  # noqa: BLE001
                traceback.print_exc(limit=4)
                row["errors"].append(f"check {case_name}: {type(err).__name__}: {err}"[:400])
        print(row, flush=True)
        rows.append(row)
    table(rows)


def main():
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="gla_bwd_"))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    logs = {v[0]: open(scratch / f"{v[0]}.log", "w") for v in VARIANTS}  # a file: a full pipe would block
    procs = {v[0]: subprocess.Popen([sys.executable, __file__, "--worker", v[0], "--dir", str(scratch)]
                                    + (["--s33d"] if S33D else ["--s33c"] if S33C else ["--s33b"] if S33B else
                                       ["--s33"] if S33 else
                                       ["--s32c"] if S32C else
                                       ["--s32b"] if S32B else
                                       ["--s32"] if S32 else ["--s31"] if S31 else []), env=env,
                                    stdout=logs[v[0]], stderr=subprocess.STDOUT) for v in VARIANTS}
    cases = {}
    for name, mk in CHECKS:
        cases[name] = reference_case(mk)
    torch.save(cases, scratch / "refs.tmp")
    os.replace(scratch / "refs.tmp", scratch / "refs.pt")
    print(f"references ready at {elapsed():.0f} s", flush=True)
    device = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    del cases
    torch.cuda.empty_cache()
    # wait for every worker's checks (or its exit) until the deadline
    while elapsed() < WARM_DEADLINE and any(p.poll() is None and not (scratch / f"{n}.ready").exists()
                                             for n, p in procs.items()):
        time.sleep(0.1)
    pending = list(procs)  # timing one at a time, in the listed order as each is ready
    while pending and elapsed() < TIME_DEADLINE:
        pending = [n for n in pending if procs[n].poll() is None]
        name = next((n for n in pending if (scratch / f"{n}.ready").exists()), None)
        if name is None:
            time.sleep(0.1)
            continue
        pending.remove(name)
        p = procs[name]
        (scratch / f"{name}.go").touch()
        t0 = time.time()
        while p.poll() is None and not (scratch / f"{name}.timed").exists() and time.time() - t0 < TIME_EACH:
            time.sleep(0.02)
        print(f"timed {name} in {time.time() - t0:.1f} s", flush=True)
    (scratch / "all_timed").touch()  # the workers' fp16 checks now
    while elapsed() < FINAL_DEADLINE and any(p.poll() is None for p in procs.values()):
        time.sleep(0.1)
    rows = []
    for name, p in procs.items():
        if p.poll() is None:
            p.kill()
        p.wait()
        logs[name].close()
        log = (scratch / f"{name}.log").read_text(errors="replace")
        path = scratch / f"{name}.json"
        row = json.loads(path.read_text()) if path.exists() else dict(variant=name, check={}, errors=[])
        if not (scratch / f"{name}.done").exists():
            row["errors"].append(f"exit {p.returncode}: {log.strip()[-300:]}")
        rows.append(row)
        if row["errors"]:
            print(name, "errors:", row["errors"], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    name = "linear_attention_gla_bwd_s31.json" if S31 else "linear_attention_gla_bwd_s30.json"
    (OUT / name).write_text(json.dumps(dict(device=device, rows=rows), indent=1, default=str))
    table(rows)
    print(f"{elapsed():.0f} s; JSON: {OUT / name}")


def main_compile():
    """Registers and spilled bytes of each chunked variant's kernels, compiled for sm_90a (triton 3.6's ptxas; no
    GPU): B1 N256 H2 d128 bf16, the timed specializations but for the sizes."""
    from tilecore.tiles.compile import compile_kernel, resources

    print("variant | kernel | registers | spilled bytes | shared bytes")
    for variant in VARIANTS:
        if variant[3] != "chunked":
            continue
        t = make(1, 256, 2, 128, 128, dev="cpu")
        p = tl_plan(t["q"], t["v"], t["g"], IDENTITY, 64, diag=5)
        steps = []
        kernels_backward_gla_chunked.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], t["h0"], t["ht"], t["dht"],
                                              0.1, steps=steps, **chunked_blocks(variant))
        for step, kernel, _, args, kw in steps:
            kw = dict(kw)
            warps, stages = kw.pop("num_warps"), kw.pop("num_stages", 2)
            extra = {"maxnreg": kw.pop("maxnreg")} if "maxnreg" in kw else {}
            try:
                r = resources(compile_kernel(kernel, dict(zip(kernel.arg_names, args), **kw), num_warps=warps,
                                             num_stages=stages, **extra))
                print(f"{variant[0]} | {step} | {r.registers} | {r.spill_stores} | {r.shared}", flush=True)
            except Exception as err:  # noqa: BLE001
                print(f"{variant[0]} | {step} | failed: {type(err).__name__}: {err}"[:300], flush=True)


if __name__ == "__main__":
    if COMPILE:
        main_compile()
    elif WORKER:
        worker(WORKER, SCRATCH)
    elif SMOKE:
        main_smoke()
    else:
        main()

"""FP8 attention, session 32 (issue 34: the forward to 1.5x bf16): S of key block j issued before the softmax of block
j - 1 (configs key ``s_ahead``, gluon_fp8.AttentionFp8.compute_ahead), checked, then timed beside the shipped default
and tilecore's bf16 forward in the same run. The checks, timing and table are gpu_speed_s30.py's (imported; this file
names the variants).

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_speed_s32.py [--budget 130] [--trace d128]
    [--variants ahead_l0,ahead,...] [--cases d128,d128c,d64,d64c]      (~120-140 s on the H100)

Why: the shipped step issues S_j with P_{j-1} V_{j-1} and waits for S_j before its softmax: the trace (sessions 30-31,
D128) has entry -> S done ~600 of the step's ~2,300 cycles, the tensor cores busy ~1,024. With S_AHEAD a tile takes
n + 2 steps, step s holding K_s and V_{s-2}: step s issues S_s and P_{s-2} V_{s-2}, runs the softmax of block s - 1 on
the scores carried from step s - 1 while both are on the tensor cores, then waits for them (nothing in flight across
the loop's back edge). sm_90a SASS (tests/attention_fp8/test_s_ahead_compile.py): S's QGMMA before the first MUFU.EX2
of the steady softmax block and the wait after its last, no spill in the step, wgmma not serialized. It carries S
(64 float32 registers a thread at 128 keys) beside the S in flight and O: at D128 that fits only with P through
shared memory (pv_smem 1) and l summed in registers (l_mma 0): 0 spills in the step, 168 bytes outside it; with l on
the tensor cores (l_mma 1) ptxas serializes the wgmma (C7512). The register-P form (cast_late 2, P packed) compiles at
D64 but ptxas puts the wait at the top of the softmax block again (the S issue waited for before any exp2): a contrast.

Variants (overrides of the shipped l_mma + tree config):
  ahead_l0      s_ahead, pv_smem 1, l_mma 0 (D128's fit; D64 too: 0 spills)
  ahead         s_ahead, pv_smem 1, l_mma 1 (D64 only: D128 serialized)
  smem_l0       pv_smem 1, l_mma 0 without s_ahead (session 31: 785 TFLOP/s, 0.90x): the same P path, to separate the
                S-ahead's effect from the shared-memory P's cost
  ahead_packed  s_ahead with P in registers, packed (cast_late 2; D64): the wait above the softmax (see above)
Checks (gpu_speed_s30): NaN-poisoned outputs, two (batch, head) slices of every timed case against float64 and the
float32 emulation (128-key blocks, l of float32 P where l_mma 0, of the rounded P where 1); tails (GQA B2 Hq8 Hkv2
N1000 Nk1100, per-block q and k descales: K_PER_BLOCK, D128 causal and D64) for the s_ahead variants.
--trace d128: program 0's SM clock per phase, default against ahead_l0 (after the cases: TRACE_LAST).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_speed_s30 as base  # noqa: E402

base.VARIANTS = {
    "ahead_l0": (dict(s_ahead=True, pv_smem=1, l_mma=0), ("d128", "d128c", "d64", "d64c")),
    "ahead": (dict(s_ahead=True, pv_smem=1), ("d64", "d64c")),
    "smem_l0": (dict(pv_smem=1, l_mma=0), ("d128",)),
    "ahead_packed": (dict(s_ahead=True, cast_late=2), ("d64",)),
}
RUN = "ahead_l0,ahead,smem_l0,ahead_packed"
base.JSON_NAME = "attention_fp8_speed_s32.json"
base.TAIL_VARIANTS = ("ahead_l0", "ahead")
base.TRACE_VARIANTS = (("default", {}), ("ahead_l0", dict(s_ahead=True, pv_smem=1, l_mma=0)))
base.TRACE_LAST = True

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a.startswith("--variants") for a in argv):
        argv += ["--variants", RUN]
    if not any(a.startswith("--budget") for a in argv):
        argv += ["--budget", "130"]
    sys.argv = [sys.argv[0]] + argv
    raise SystemExit(base.main())

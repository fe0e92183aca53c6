"""FP8 attention, session 31 (issue 34: the forward to 1.5x bf16): P V from shared memory (configs key ``pv_smem``,
gluon_fp8.AttentionFp8.compute_pv_smem) checked, then timed beside the shipped default and tilecore's bf16 forward in
the same run. The checks, timing and table are gpu_speed_s30.py's (imported; this file only names the variants).

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_speed_s31.py [--budget 135] [--trace d128]
    [--variants smem,smem_lmma0,...] [--cases d128,d128c,d64,d64c]      (~120-140 s on the H100)

Why: with P V's A operand in registers, ptxas waits for P V (WARPGROUP.DEPBAR) right after the row max, before any
exp2, so the softmax never runs under P V (session 30's SASS, every variant). With P stored to shared memory (e4m3,
keys permuted as V's, two buffers a consumer, fence + warpgroup barrier) both operands of P V are in shared memory and
the only registers in flight are O's: sm_90a SASS of the steady step (D128) has the wait after the last MUFU.EX2 and
P's four STSM, 0 spills (the default: 32 bytes), no float32 P carried between steps.

Variants (overrides of the shipped l_mma + tree config):
  smem          pv_smem 1 (l by the tensor cores: P's 32-key chunks read from the buffer's K-slices)
  smem_lmma0    pv_smem 1, l summed in registers (64 FADD a step; in case the K-sliced chunks read wrong or cost)
  smem_late     pv_smem 1 with rescale_late (O *= alpha between the S and P V issues, while S runs)
  smem_q8       pv_smem 1, one exp2 in 8 on the FMA units (if the MUFU, not the issue, binds once P V overlaps)
  smem_c3       pv_smem 1, three consumers (D64: the bf16 forward's; without a float32 P carried they may fit)
  smem_bn192q8  smem_bn192 with one exp2 in 8 on the FMA units (run 1: q8 1.03x over smem at D128)
  smem_bn192    pv_smem 1, key steps of 128 + 64 (block_n2 64, gluon_fp8.compute_split_smem), 2 stages (3 need 257 KB
                at D128): sm_90a D128 16 bytes of spills (the register-P split step: 256 and wgmma serialized)
Checks (gpu_speed_s30): NaN-poisoned outputs, two (batch, head) slices of every timed case against float64 and the
float32 emulation; tails (GQA B2 Hq8 Hkv2 N1000 Nk1100, per-block q and k descales, D128 causal and D64) for the
variants in TAIL_VARIANTS (the split steps': D64 causal and not, per-head k descales). N 4096 is not a multiple of
192: the timed cases' last key block is partial. --trace d128: program 0's SM clock per phase of the step, default against smem.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_speed_s30 as base  # noqa: E402

base.VARIANTS = {
    "smem": (dict(pv_smem=1), ("d128", "d128c", "d64", "d64c")),
    "smem_late": (dict(pv_smem=1, rescale_late=True), ("d128", "d64")),
    "smem_lmma0": (dict(pv_smem=1, l_mma=0), ("d128",)),
    "smem_q8": (dict(pv_smem=1, exp2_fma_every=-8), ("d128",)),
    "smem_c3": (dict(pv_smem=1, consumers=3, pingpong=False), ("d64", "d64c")),
    "smem_bn192": (dict(pv_smem=1, block_n2=64, stages=2), ("d128", "d128c", "d64")),
    "smem_bn192q8": (dict(pv_smem=1, block_n2=64, stages=2, exp2_fma_every=-8), ("d128",)),
}
RUN2 = "smem,smem_late,smem_bn192,smem_bn192q8"  # (run 1, call 1: smem, smem_lmma0, smem_pp, smem_q8, smem_c3)
base.JSON_NAME = "attention_fp8_speed_s31.json"
base.TAIL_VARIANTS = ("smem", "smem_late", "smem_bn192")
base.TRACE_VARIANTS = (("default", {}), ("smem_bn192", dict(pv_smem=1, block_n2=64, stages=2)))

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a.startswith("--variants") for a in argv):
        argv += ["--variants", RUN2]
    if not any(a.startswith("--budget") for a in argv):
        argv += ["--budget", "135"]
    sys.argv = [sys.argv[0]] + argv
    raise SystemExit(base.main())

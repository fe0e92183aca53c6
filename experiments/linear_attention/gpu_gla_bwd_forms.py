"""GLA backward's kernels (issue 33): the Gluon dq / dk kernel's FORM bits (gluon_gla_bwd) and the dv kernel's blocks
against configs' in one run. Each variant is checked against float64 ON THE GPU first (a gated backward can be
miscompiled on Hopper: FLA's issue 640), then its kernel timed alone in interleaved rounds (< 150 s on an H100).

Checks: bf16 B2 N1024 H16, an initial state and a final state's gradient, weak decays -U(0, 0.3) and strong ones
-U(0, 6) with a reset mid-chunk; outputs NaN-poisoned; dq / dk / dv as multiples of the bf16 rounding floor (<= 2.5),
dg / dh0 relative (< 0.05 / 0.01); "op" rows: the public op through autograd (gpu_gla_op.check). Timing at B16 H16
N4096 in the main process: the variant's kernel ("dqk0w", "dvw") or the whole backward ("bwd") in six interleaved
rounds, do_bench (L2 flushed between calls) and CUDA-graph medians, against its HBM bound at this run's copy bandwidth
(gpu_gla_s37.dqk_bytes, dv_bytes). A batch's "modes" pairs are also timed more ways (``modes``): back to back
with the host ahead, after an L2 flush with the host ahead, after a flush with the host's launch in the gap (do_bench's
way), and the host's time a launch: which of them an eager / graph difference comes from.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_forms.py [--batch e] [--variants "..."] [--smoke]
JSON to $OUT/gla_bwd_<batch>.json (rewritten after each row); the table last. ``--smoke``: the checks on the CPU (the
interpreter runs the tl kernels; the Gluon forms are not taken there), tiny shapes, no timing. ``--deadline S``: no
timing round past S seconds (170). ``--scalar`` (alone): the scalar-decay backward as shipped against the GLA backward on
the decay broadcast to every channel (``scalar_routes``). (Sessions 39-40 ran it
as gpu_gla_s39.py / gpu_gla_s40.py: their run files name those commits.)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.gpu_script import Run, check, eager_ms, poisoned, time_rounds  # noqa: E402
from experiments.linear_attention.gpu_gla_s37 import (backward, dqk_bytes, load_reference, make, ref_path,  # noqa: E402
                                                      warm)

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
BATCH = sys.argv[sys.argv.index("--batch") + 1] if "--batch" in sys.argv else "e"
WARM_DEADLINE = 20.0  # the shared kernels' compile: the variants start then at the latest
WORKER_DEADLINE = 900.0 if SMOKE else 75.0  # a worker still compiling then is killed (its row says so)
TIME_DEADLINE = float(sys.argv[sys.argv.index("--deadline") + 1]) if "--deadline" in sys.argv else 170.0  # no timing
# round starts past it
CHECK_SHAPE = (1, 128, 2) if SMOKE else (2, 1024, 16)  # B, N, H
TIME_SHAPE = (16, 4096, 16)
CASES = {"weak": dict(decay=0.3, reset=False, seed=1), "strong+reset": dict(decay=6.0, reset=True, seed=2)}
# name: (Dk = Dv, CHUNKED overrides, the kernel timed: "dvw" the dv common launch, "dqk0w" the dq / dk one, "bwd" the
# whole backward)
# gluon_gla_bwd FORM: 2 + STORE_TMA 512 + DG_TMA 1024 (1538); DG_LATE 2048 for DG_TMA, J_SMEM 8192, PIECES_RZ 32768,
# DG_TWO 65536 (dG's sums by two pieces). configs': d 32 9730 (+ J_SMEM), d 64 34306 (+ PIECES_RZ), d 128 1538. Removed
# after calls 1 and 3 (their rows dropped from batch e): DG_ROUND 131072 (both dG sums in one round), AT_OWN 262144 (a^T
# in its own buffer), STORE_LATE 524288 (dq's and dk's TMA stores after dG's barrier), SPLIT_P 1048576 (the third
# piece's buffer apart), KEEP_QK 2097152 (q, k, g's clamp read before the barriers that precede their buffers' writes);
# after call 7 ROW_SUM 4194304 (no J sums: G_last and dG's column totals from L's last row by a reduction over rows);
# session 42, after its call 3: DG_OWN 8388608 (dg through a float32 buffer of each consumer's own; its rows dropped from
# batches j-l)
D32 = 9730
TWO, RZ = 65536, 32768
BATCHES = {
    # call 1 (runs/ha_s41a_run1_session41_h100.txt, at 9f1c8051; call 3, ha_s41c_run3, at 477ffbf7 with the STORE_LATE /
    # SPLIT_P / KEEP_QK rows): d 32 / d 64's dq / dk kernel: DG_TWO (sm_90a d 32: 12 -> 0 B spilled, 108 -> 92 wgmmas)
    # on configs' (the rows of the removed bits dropped)
    "e": {
        "d32 configs dqk": (32, {}, "dqk0w"),
        "d32 two": (32, dict(dqk_gluon_form=D32 | TWO), "dqk0w"),
        "d32 two rz": (32, dict(dqk_gluon_form=D32 | TWO | RZ), "dqk0w"),
        "d32 configs bwd": (32, {}, "bwd"),
        "d32 two bwd": (32, dict(dqk_gluon_form=D32 | TWO), "bwd"),
        "d64 configs dqk": (64, {}, "dqk0w"),
        "d64 two": (64, dict(dqk_gluon_form=34306 | TWO), "dqk0w"),
    },
    # call 1 (runs/ha_s41b_run1_session41_h100.txt): d 128 PIECES_RZ's eager / graph split (``modes``: the kernel and the
    # whole backward), DG_TWO; the dv kernel at 8 warps (the pipelined key loop's two rows, dv_loop: lost, removed)
    "f": {
        "d128 configs dqk": (128, {}, "dqk0w"),
        "d128 rz": (128, dict(dqk_gluon_form=34306), "dqk0w"),
        "d128 configs bwd": (128, {}, "bwd"),
        "d128 rz bwd": (128, dict(dqk_gluon_form=34306), "bwd"),
        "d128 two": (128, dict(dqk_gluon_form=1538 | TWO), "dqk0w"),
        "d128 rz two": (128, dict(dqk_gluon_form=34306 | TWO), "dqk0w"),
        "d128 dv configs": (128, {}, "dvw"),
        "d128 dv 8 warps": (128, dict(dv_warps=8), "dvw"),
    },
    # call 4, after calls 1 and 3 (runs/ha_s41c_run3_session41_h100.txt, at 477ffbf7: batch e with STORE_LATE, SPLIT_P
    # and KEEP_QK, 21 -> 12 bar.syncs a chain: 0.99-1.00x configs', removed): d 32's DG_TWO + PIECES_RZ (1.029x in call 1)
    # and DG_TWO (1.015x, 1.011x) again, the whole backward, the public op through autograd with DG_TWO + PIECES_RZ
    "g": {
        "d32 configs dqk": (32, {}, "dqk0w"),
        "d32 two": (32, dict(dqk_gluon_form=D32 | TWO), "dqk0w"),
        "d32 two rz": (32, dict(dqk_gluon_form=D32 | TWO | RZ), "dqk0w"),
        "d32 configs bwd": (32, {}, "bwd"),
        "d32 two rz bwd": (32, dict(dqk_gluon_form=D32 | TWO | RZ), "bwd"),
        "d32 two rz op": (32, dict(op=(2, 1024, 3, 32, True), dims={"32,32": dict(dqk_gluon_form=D32 | TWO | RZ)}), None),
    },
    # call 2, after call 1 (d 128 DG_TWO + PIECES_RZ 99842: 1.437 ms = 87.1% against configs' 1.546, 1.076x by graphs,
    # 1.063x eager; d 64 DG_TWO on configs' PIECES_RZ (99842 too): 0.6361 = 84.4% against 0.6799, 1.069x): both again,
    # the whole backward, bf16 g (DG_LATE for DG_TMA: 100866), the public op through autograd with 99842 patched in;
    # modes (PIECES_RZ alone lost 0.2 ms after an L2 flush even with the host ahead): + two ways of flushing
    "h": {
        "d128 configs dqk": (128, {}, "dqk0w"),
        "d128 rz": (128, dict(dqk_gluon_form=34306), "dqk0w"),
        "d128 rz two": (128, dict(dqk_gluon_form=34306 | TWO), "dqk0w"),
        "d128 configs bwd": (128, {}, "bwd"),
        "d128 rz two bwd": (128, dict(dqk_gluon_form=34306 | TWO), "bwd"),
        "d128 rz two bf16 g": (128, dict(dqk_gluon_form=34306 | TWO, g_dtype="bf16"), None),
        "d128 rz two op": (128, dict(op=(1, 1024, 2, 128, True), dims={"128,128": dict(dqk_gluon_form=34306 | TWO)}),
                           None),
        "d64 configs dqk": (64, {}, "dqk0w"),
        "d64 two": (64, dict(dqk_gluon_form=34306 | TWO), "dqk0w"),
        "d64 configs bwd": (64, {}, "bwd"),
        "d64 two bwd": (64, dict(dqk_gluon_form=34306 | TWO), "bwd"),
        "d64 two bf16 g": (64, dict(dqk_gluon_form=34306 | TWO, g_dtype="bf16"), None),
        "d64 two op": (64, dict(op=(2, 1024, 3, 64, False), dims={"64,64": dict(dqk_gluon_form=34306 | TWO)}), None),
    },
}
BATCHES["i"] = {  # the session's last call (after calls 1-5: configs' now d 32 75266, d 64 / d 128 99842): the flips
    # against the session's start (9730 / 34306 / 1538), the kernel, the whole backward and the public op through autograd
    # as shipped (call 7, runs/ha_s41g_run7_session41_h100.txt; its ROW_SUM rows, 0.947-0.962x, dropped with the bit)
    "d32 configs dqk": (32, {}, "dqk0w"),
    "d32 start dqk": (32, dict(dqk_gluon_form=D32), "dqk0w"),
    "d32 configs bwd": (32, {}, "bwd"),
    "d32 start bwd": (32, dict(dqk_gluon_form=D32), "bwd"),
    "d32 configs op": (32, dict(op=(2, 1024, 3, 32, True)), None),
    "d64 configs dqk": (64, {}, "dqk0w"),
    "d64 start dqk": (64, dict(dqk_gluon_form=34306), "dqk0w"),
    "d128 configs dqk": (128, {}, "dqk0w"),
    "d128 start dqk": (128, dict(dqk_gluon_form=1538), "dqk0w"),
    "d128 configs bwd": (128, {}, "bwd"),
    "d128 start bwd": (128, dict(dqk_gluon_form=1538), "bwd"),
    "d128 configs op": (128, dict(op=(1, 1024, 2, 128, True)), None),
}
# session 42: DG_LATE (dg through the pieces' buffers, waited at the next tile's start) at d 32, the control of DG_OWN
# (removed: decision 254 of notes/linear_attention/README.md)
DG_TMA_BIT, LATE = 1024, 2048
S41_D32, S41_D64 = 75266, 99842  # configs' at the session's start (d 128 as d 64)
BATCHES["j"] = {  # call 1: DG_OWN at d 32 and d 64 against configs' (at d 128 its 16 KB do not fit: 246 KB shared),
    # d 32's whole backward and its public op; the pointer dv kernel with each key block's dS_c rows loaded with its q, k,
    # g (dv_form bit 32: sm_90a d 128 255 registers, 0 B, the first key block's 8 LDG.128 of dS_c moved from after its
    # scores to the program's first loads)
    "d32 configs dqk": (32, {}, "dqk0w"),
    "d32 late": (32, dict(dqk_gluon_form=S41_D32 - DG_TMA_BIT + LATE), "dqk0w"),
    "d32 configs bwd": (32, {}, "bwd"),
    "d64 configs dqk": (64, {}, "dqk0w"),
    "d128 configs dqk": (128, {}, "dqk0w"),
    "d128 dv configs": (128, {}, "dvw"),
    "d128 dv dhs early": (128, dict(dv_form=53), "dvw"),  # (dv_form 21 + 32: dS_c's rows loaded with q, k, g)
    "d128 dv dhs early kd32": (128, dict(dv_form=53, KD=32), "dvw"),  # (four key blocks, each one round trip)
    "d64 dv configs": (64, {}, "dvw"),
    "d64 dv dhs early": (64, dict(dv_form=53), "dvw"),
}
BATCHES["k"] = {  # call 2, after call 1 (runs/ha_s42a_run2_session42_h100.txt: dv_form 53 1.046x / 1.094x 21 at d 128 / d 64,
    # flipped; DG_OWN 0.976x at d 32, 1.020x at d 64): the dv flip against 21 again (the kernel, d 128's whole backward,
    # the public op through autograd as shipped), d 64's DG_OWN again, d 32's configs'
    "d128 dv configs": (128, {}, "dvw"),
    "d128 dv s41": (128, dict(dv_form=21), "dvw"),
    "d128 configs bwd": (128, {}, "bwd"),
    "d128 dv s41 bwd": (128, dict(dv_form=21), "bwd"),
    "d128 configs op": (128, dict(op=(1, 1024, 2, 128, True)), None),
    "d64 dv configs": (64, {}, "dvw"),
    "d64 dv s41": (64, dict(dv_form=21), "dvw"),
    "d64 configs dqk": (64, {}, "dqk0w"),
    "d64 configs op": (64, dict(op=(2, 1024, 3, 64, False)), None),
    "d32 configs dqk": (32, {}, "dqk0w"),
}
BATCHES["l"] = {  # call 3, after call 2 (runs/ha_s42c_run4_session42_h100.txt: dv_form 53 1.041x / 1.098x 21, 78.9% / 90.0%;
    # d 64 DG_OWN 1.010x, 1.020x in call 1: flipped, configs' d 64 now 8487426): d 64 as shipped against the session's
    # start (99842), the kernel, the whole backward, bf16 g (DG_OWN whatever g's dtype) and the public op through autograd;
    # the d 128 dv flip a third time; d 32's configs' (runs/ha_s42d_run5_session42_h100.txt: DG_OWN 0.997x there, removed:
    # the two d 64 dq / dk rows are one form since)
    "d64 configs dqk": (64, {}, "dqk0w"),
    "d64 start dqk": (64, dict(dqk_gluon_form=S41_D64), "dqk0w"),
    "d64 configs bwd": (64, {}, "bwd"),
    "d64 start bwd": (64, dict(dqk_gluon_form=S41_D64, dv_form=21), "bwd"),
    "d64 configs bf16 g": (64, dict(g_dtype="bf16"), None),
    "d64 configs op": (64, dict(op=(2, 1024, 3, 64, True)), None),
    "d128 dv configs": (128, {}, "dvw"),
    "d128 dv s41": (128, dict(dv_form=21), "dvw"),
    "d32 configs dqk": (32, {}, "dqk0w"),
}
BATCHES["m"] = {  # call 4 (the session's last): as shipped (the session's start + dv_form 53) against the start (dv_form 21),
    # the whole backward at d 128 and d 64, the d 128 dv kernel a fourth time, d 32's dq / dk and whole backward
    "d128 configs bwd": (128, {}, "bwd"),
    "d128 start bwd": (128, dict(dv_form=21), "bwd"),
    "d128 dv configs": (128, {}, "dvw"),
    "d128 dv s41": (128, dict(dv_form=21), "dvw"),
    "d64 configs bwd": (64, {}, "bwd"),
    "d64 start bwd": (64, dict(dv_form=21), "bwd"),
    "d32 configs dqk": (32, {}, "dqk0w"),
    "d32 configs bwd": (32, {}, "bwd"),
}
# session 43, call 1 (runs/ha_pair_s43a_run1_session43_h200.txt, batch n at c09c34c8): PAIR (FORM 16777216: at d 32 each
# consumer took both chunks of every other tile as two chains, their scratch the stage's buffers; 528 B spilled at 240
# registers) right to the digit but 0.4433 ms against configs' 0.3099 (0.70x; whole backward 1.061 / 0.913 ms): removed
# with its rows (decision 270 of notes/linear_attention/README.md)
# call 3 (runs/ha_three_s43c_run3_session43_h200.txt, batch p at e7369cab): THREE (FORM 16777216: three chunks a tile,
# three consumers at 160 registers, 2 stages, 226 KB, 372 B spilled) right to the digit but 0.4129 ms against 0.3095
# (0.75x): removed with its rows (decision 272)
# session 44 (HB), call 1 (runs/hb_lean_s44a_run1_session44_h200.txt, batch q at 284d95bb): LEAN (FORM 33554432: d 32's
# chain with fewer live registers, sm_90a peak 205 -> 175, at 160 156 -> 64 B spilled; THREE + LEAN 124 B against 372),
# A_LATE (536870912) and THREE (16777216) right to the digit but 0.966x / 0.742x / THREE + LEAN 0.860x / + A_LATE
# 0.805x configs' 75266 (0.3087 ms): removed with their rows (decisions 310-312 of notes/linear_attention/README.md)
BATCHES["r"] = {  # calls 2-3: what a register cap costs the shipped chain with two consumers (sm_90a spills: 172 B at
    # 160, 72 B at 176, 48 B at 200). Call 2 (runs/hb_regs_s44b_run2_session44_h200.txt): every row right; configs'
    # 0.3089 ms, capped at 160 0.3598 (0.859x), the rest untimed (the capped row's whole-backward timing raised: fixed)
    "d32 configs dqk": (32, {}, "dqk0w"),
    "d32 configs regs160": (32, dict(consumer_regs=160), "dqk0w"),
    "d32 configs regs176": (32, dict(consumer_regs=176), "dqk0w"),
    "d32 configs regs200": (32, dict(consumer_regs=200), "dqk0w"),
}
BATCHES["o"] = {  # call 2: d 32's dq / dk and whole backward as shipped (the session's figure on the device)
    "d32 configs dqk": (32, {}, "dqk0w"),
    "d32 configs bwd": (32, {}, "bwd"),
}
MODES = {"f": (("d128 configs dqk", "d128 rz"), ("d128 configs bwd", "d128 rz bwd")),
         "h": (("d128 configs dqk", "d128 rz", "d128 rz two"),)}  # timed more ways (``modes``)
VARIANTS = BATCHES[BATCH]
if "--variants" in sys.argv:
    keep = sys.argv[sys.argv.index("--variants") + 1].split(",")
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in keep}


def dv_bytes(B, N, H, Dk, Dv, BT=64, elt=2) -> int:
    """The dv kernel's compulsory HBM bytes: q, k (elt), g (float32), do (elt), dS_c (elt) read once; dv (elt)
    written."""
    NT = -(-N // BT)
    return B * N * H * (2 * Dk * elt + Dk * 4 + 2 * Dv * elt) + B * H * NT * Dk * Dv * elt


def knobs(over: dict):
    """A variant's (CHUNKED overrides, the inputs' dtype: None for make's bf16 q, k, v, do, or "bf16 g": g in bf16)."""
    over = dict(over)
    if over.pop("g_dtype", None) == "bf16":
        return over, "bf16 g"
    return over, {"fp16": torch.float16}.get(over.pop("dtype", None))


def with_dtype(t: dict, dtype) -> dict:
    """The inputs with q, k, v, do in dtype, or g in bf16 (rounded once: the reference takes the rounded ones)."""
    if dtype == "bf16 g":
        return dict(t, g=t["g"].to(torch.bfloat16))
    return t if dtype is None else dict(t, **{n: t[n].to(dtype) for n in ("q", "k", "v", "do")})


def step_of(t, ht, over, name: str):
    """The launch ``name`` of the variant's backward: (kernel's name, a callable running it alone); "bwd": the whole
    backward (kernels_backward_gla_chunked.backward, its buffers allocated each call)."""
    if name == "bwd":
        return "backward", (lambda: backward(t, ht, over))
    over = dict(over)
    regs = over.pop("consumer_regs", None)
    steps = []
    backward(t, ht, over, steps=steps)
    s = next(s for s in steps if s[0] == name)
    kernel = getattr(s[1], "__name__", None) or s[1].fn.__name__
    kw = with_regs(s, regs)
    return kernel, (lambda: s[1][s[2]](*s[3], **kw))


def with_regs(step, regs):
    """A recorded launch's options, the Gluon dq / dk kernel's CONSUMER_REGS set to regs (None: as recorded; the tl
    kernels the interpreter takes in a smoke have no such option)."""
    kernel = getattr(step[1], "__name__", None) or step[1].fn.__name__
    if regs is None or (SMOKE and kernel != "gla_dqk_gluon_kernel"):
        return step[4]
    assert kernel == "gla_dqk_gluon_kernel", kernel
    return dict(step[4], CONSUMER_REGS=regs)


def check_variant(name: str) -> dict:
    """The variant's backward against float64 on both cases (its own process)."""
    from tilecore import accuracy
    from tilecore.ops.linear_attention import linear_attention_reference

    D, over, which = VARIANTS[name]
    row = dict(variant=name)
    if "op" in over:  # the public op through autograd with configs' defaults (gpu_gla_op.check against float64)
        from experiments.linear_attention.gpu_gla_op import check as op_check

        from tilecore.ops.linear_attention import configs_gla_bwd
        from tilecore.tiles.switches import patched

        dims = dict(configs_gla_bwd.CHUNKED_FLAT_DIMS)  # ("dims": a head dim's entry replaced, as a flip would)
        for key, value in over.get("dims", {}).items():  # ("Dk,Dv": JSON keys)
            at = tuple(int(x) for x in key.split(","))
            dims[at] = dict(dims[at], **value)
        with patched(configs_gla_bwd, CHUNKED_FLAT_DIMS=dims):
            r = op_check(*((1, 128, 1) + over["op"][3:] if SMOKE else over["op"]))  # (B, N, H, D, strong)
        cell = dict(dq=r["dq"], dk=r["dk"], dv=r["dv"], dg=round(r["dg"], 5), dh0=r["dh0"], o=r["o"], **{"pass": r["pass"]})
        return dict(row, **{"strong+reset" if over["op"][-1] else "weak": cell}, kernel="(public op)",
                    **{"pass": r["pass"]})
    over, dtype = knobs(over)
    regs = over.pop("consumer_regs", None)  # (the dq / dk kernel's register cap: its launches recorded and run here)
    for case, kw in CASES.items():
        t = with_dtype(make(*CHECK_SHAPE, D, **kw), dtype)
        if SMOKE or dtype is not None:  # (other inputs: their own reference)
            leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
            o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=D ** -0.5, initial_state=leaves[4])
            ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
            st = st.detach().float()
        else:
            backward(t, t["h0"], over)  # (compiled while the main process makes the references)
            torch.cuda.synchronize()
            ref, st = load_reference(D, case)
        out = dict(dq=poisoned(t["q"]), dk=poisoned(t["k"]), dv=poisoned(t["v"]), dg=poisoned(t["g"].float()),
                   dh0=poisoned(t["h0"]))
        if regs is None or SMOKE:  # (the smoke: the interpreter's bf16 runs on an upcast, not in the caller's buffers)
            got = backward(t, st, over, out=out)
        else:  # (bf16 on the GPU: the caller's buffers, written by the recorded launches)
            steps = []
            got = backward(t, st, over, out=out, steps=steps)
            for step in steps:
                step[1][step[2]](*step[3], **(with_regs(step, regs) if step[0] == "dqk0w" else step[4]))
        if not SMOKE:
            torch.cuda.synchronize()
        got = [got[i] for i in (0, 1, 2, 3, 5)]
        live = t["g"] >= -100  # (dg where the floor clamped g is 0 by definition)
        res = {nm: check(x, r) for nm, x, r in zip(("dq", "dk", "dv"), got[:3], ref[:3])}
        cell = {nm: res[nm]["err_over_floor"] for nm in res}
        cell["dg"] = round(accuracy.rel_rms(got[3][live], ref[3][live]), 5)
        cell["dh0"] = round(accuracy.rel_rms(got[4], ref[4]), 6)
        finite = bool(torch.isfinite(got[3]).all() and torch.isfinite(got[4]).all())
        cell["pass"] = all(r["pass"] for r in res.values()) and finite and cell["dg"] < 0.05 and cell["dh0"] < 0.01
        row[case] = cell
    row["kernel"] = step_of(t, st, over, which)[0] if which else None
    row["pass"] = all(row[c]["pass"] for c in CASES)
    return row


def timing(run: Run, rows: dict) -> None:
    """Each passing variant's kernel alone (interleaved rounds, eager and graph medians), a head dim at a time; the
    composed backward once (eager, disturbed by the other lanes: a guide only)."""
    B, N, H = TIME_SHAPE
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / eager_ms(lambda: y.copy_(x)) / 1e6  # GB/s, read + write
    x = y = None  # (freed)
    run.extra["copy_GBps"] = round(copy, 1)
    for D in dict.fromkeys(d for d, _, _ in VARIANTS.values()):
        names = [n for n, (d, o, w) in VARIANTS.items() if d == D and w and "dtype" not in o and rows.get(n, {}).get("pass")]
        if not names or run.left() <= 0:
            continue
        torch.cuda.empty_cache()
        t = make(B, N, H, D, decay=0.3, reset=False, seed=0)
        ht = torch.randn(B, H, D, D, device=DEV)
        fns = {}
        for name in names:
            _, over, which = VARIANTS[name]
            if which != "bwd":
                rows[name]["bound_ms"] = round((dv_bytes if which == "dvw" else dqk_bytes)(B, N, H, D, D) / copy / 1e6,
                                               4)
            fns[name] = step_of(t, ht, over, which)[1]
            fns[name]()  # (compiled at this shape's specialization, if it differs)
        torch.cuda.synchronize()
        # six rounds: with the order reversed every other round each variant runs as often early as late in a round
        # (the rounds' figures of one variant differ by position: ~0.335 / ~0.349 ms alternating for d 32's)
        times = time_rounds(fns, rounds=6, graph=True, deadline=run)
        for pair in MODES.get(BATCH, ()):
            pair = [n for n in pair if n in fns]
            if len(pair) > 1 and run.left() > 0:
                for n, m in (run.attempt("modes", modes, {n: fns[n] for n in pair}) or {}).items():
                    rows[n]["modes"] = m
                    run.say(json.dumps(dict(variant=n, **{w: x["median"] for w, x in m.items()})))
        for name in names:
            r = rows[name]
            r.update(ms=times.get(f"{name}_ms"), graph_ms=times.get(f"{name}_graph_ms"),
                     rounds=times.get(f"{name}_rounds"))
            best = r["graph_ms"] or r["ms"]
            r["pct"] = round(100 * r["bound_ms"] / best, 1) if best and "bound_ms" in r else None
            over = VARIANTS[name][1]
            r["bwd_ms"] = (round(eager_ms(lambda: backward(t, ht, over), warmup=3, rep=20), 4)
                           if run.left() > 4 and VARIANTS[name][2] != "bwd" and "consumer_regs" not in over else None)
            # (a register cap is the recorded dq / dk launch's option: no whole backward carries it)
            run.say(json.dumps(dict(variant=name, ms=r["ms"], graph_ms=r["graph_ms"], pct=r["pct"], bwd_ms=r["bwd_ms"])))
        t = ht = None  # (freed before the next head dim's inputs)


def modes(fns: dict, reps: int = 20, rounds: int = 3) -> dict:
    """Each kernel of ``fns`` four more ways, in interleaved rounds (the order reversed every other round), medians over
    rounds: "b2b_ms" ``reps`` launches back to back with the host ahead (a GPU spin first, so no launch waits for the
    host), "flush_ms" each launch after an L2 flush (do_bench's 256 MB zeroing) with the host ahead (only the kernel
    between the events), "flush_host_ms" the same without the spin (do_bench's way: where the host's launch takes
    longer than the GPU's flush and kernel, the gap is inside the events), "host_us" the host's time to enqueue one
    launch (with the spin: enqueue only), "flush_read_ms" as flush_ms with the L2 flushed by a read of 256 MB (clean
    lines, no write-back), "flush_gap_ms" as flush_ms with ~0.1 ms of GPU spin between the flush and the kernel."""
    import time

    cache = torch.empty(64 * 2 ** 20, dtype=torch.int32, device=DEV)
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    def spin():
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # (~60 ms of GPU clocks: the host enqueues what follows meanwhile)

    def b2b(fn):
        spin()
        s, e = ev(), ev()
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / reps

    def flushed(fn, ahead, how="zero"):
        if ahead:
            spin()
        else:
            torch.cuda.synchronize()
        marks = [(ev(), ev()) for _ in range(reps)]
        for s, e in marks:
            if how == "read":  # (L2 left holding clean lines, nothing to write back)
                cache.sum(dtype=torch.int64)
            else:
                cache.zero_()
            if how == "gap":  # (the flush's writes drained before the kernel starts)
                torch.cuda._sleep(200_000)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in marks)

    def host(fn):
        spin()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        us = (time.perf_counter() - t) / reps * 1e6
        torch.cuda.synchronize()
        return us

    ways = dict(b2b_ms=b2b, flush_ms=lambda f: flushed(f, True), flush_host_ms=lambda f: flushed(f, False),
                host_us=host, flush_read_ms=lambda f: flushed(f, True, "read"),
                flush_gap_ms=lambda f: flushed(f, True, "gap"))
    per = {n: {w: [] for w in ways} for n in fns}
    names = list(fns)
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            for w, how in ways.items():
                per[n][w].append(round(how(fns[n]), 4))
    return {n: {w: dict(median=round(statistics.median(v), 4), rounds=v) for w, v in ws.items()} for n, ws in per.items()}


def scalar_routes(run: Run) -> dict:
    """The brief's second item (``--scalar``): the scalar-decay backward as shipped against the per-channel (GLA)
    backward on the decay broadcast to every channel (its dg summed back over the channels by autograd), both through
    the public op: float64-checked (B2 N1024 H4, decays -U(0, 0.3), a reset mid-chunk), then timed at B16 H16 N4096
    through autograd, eager do_bench medians in interleaved rounds: the backward alone (the forward's graph kept) and
    forward + backward (the broadcast's copy included)."""
    from triton.testing import do_bench

    from tilecore import linear_attention
    from tilecore.ops.linear_attention import linear_attention_reference

    def graph(q, k, v, g, route):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g)]
        dec = leaves[3] if route == "scalar" else leaves[3].unsqueeze(-1).expand(*g.shape, q.shape[-1]).contiguous()
        return linear_attention(*leaves[:3], decay=dec), leaves

    def inputs(B, N, H, D, seed):
        torch.manual_seed(seed)
        dt = torch.float16 if SMOKE else torch.bfloat16  # (the interpreter's bf16 dots are wrong)
        q, k, v = (torch.randn(B, N, H, D, device=DEV, dtype=dt) for _ in range(3))
        g = -torch.rand(B, N, H, device=DEV) * 0.3
        return q, k, v, g

    out = {}
    for D in (32,) if SMOKE else (128, 64):
        q, k, v, g = inputs(*((1, 128, 2) if SMOKE else (2, 1024, 4)), D, 3)
        g[:, 77, 1] = float("-inf")
        do = torch.randn_like(v)
        ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, g)]
        o_ref = linear_attention_reference(*ref_leaves[:3], decay=ref_leaves[3], scale=D ** -0.5)
        o_ref = o_ref[0] if isinstance(o_ref, tuple) else o_ref
        ref = torch.autograd.grad((o_ref * do.double()).sum(), ref_leaves)
        for route in ("scalar", "broadcast"):
            o, leaves = graph(q, k, v, g, route)
            got = torch.autograd.grad(o, leaves, do)
            cell = {n: check(a, r)["err_over_floor"] for n, a, r in zip(("dq", "dk", "dv"), got[:3], ref[:3])}
            live = g > -100
            cell["dg"] = round(float((got[3][live].double() - ref[3][live]).norm() / ref[3][live].norm()), 6)
            cell["pass"] = all(check(a, r)["pass"] for a, r in zip(got[:3], ref[:3])) and cell["dg"] < 0.05 and bool(
                torch.isfinite(got[3]).all())
            out[f"d{D} {route} check"] = cell
            run.say(json.dumps(dict(d=D, route=route, **cell)))
    for D in () if SMOKE else (128, 64):
        if run.left() < 15:
            break
        torch.cuda.empty_cache()
        q, k, v, g = inputs(16, 4096, 16, D, 4)
        do = torch.randn_like(v)
        fns = {}
        for route in ("scalar", "broadcast"):
            o, leaves = graph(q, k, v, g, route)
            fns[f"d{D} {route} bwd"] = (lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, do, retain_graph=True))

            def fwd_bwd(route=route):
                o, leaves = graph(q, k, v, g, route)
                return torch.autograd.grad(o, leaves, do)
            fns[f"d{D} {route} fwd+bwd"] = fwd_bwd
        per = {n: [] for n in fns}
        for r in range(3):
            for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                per[n].append(round(do_bench(fns[n], warmup=3, rep=30), 4))
        for n, xs in per.items():
            out[n] = dict(ms=statistics.median(xs), rounds=xs)
            run.say(json.dumps(dict(variant=n, **out[n])))
        q = k = v = g = do = fns = None
    return out


def main():
    if "--scalar" in sys.argv:  # (the brief's second item alone)
        run = Run("gla_bwd_scalar", deadline=TIME_DEADLINE)  # (--deadline: its timing starts only with 15 s left)
        res = run.attempt("scalar", scalar_routes, run) or {}
        run.extra["scalar"] = res
        for n, r in res.items():
            run.row(n, **{k: (v if not isinstance(v, list) else "/".join(map(str, v))) for k, v in r.items()})
        run.finish(["name", "ms", "rounds", "dq", "dk", "dv", "dg", "pass"])
        return
    if "--one" in sys.argv:
        print("ROW " + json.dumps(check_variant(sys.argv[sys.argv.index("--one") + 1])), flush=True)
        return
    if "--warm" in sys.argv:  # (gpu_gla_s37's: configs' backward at the check shape)
        warm(int(sys.argv[sys.argv.index("--warm") + 1]))
        return
    run = Run(f"gla_bwd_{BATCH}", deadline=TIME_DEADLINE)
    run.extra.update(check_shape=CHECK_SHAPE, time_shape=TIME_SHAPE, variants={k: v[1:] for k, v in VARIANTS.items()})
    os.environ["HA_REFS"] = tempfile.mkdtemp()  # (the workers inherit it)

    def spawn(*args):
        return subprocess.Popen([sys.executable, __file__, *args] + ["--smoke"] * SMOKE
                                + ["--batch", BATCH, "--variants", ",".join(VARIANTS)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    dims = list(dict.fromkeys(d for d, _, _ in VARIANTS.values()))
    procs = {}
    if SMOKE:
        procs = {n: spawn("--one", n) for n in VARIANTS}
    else:
        warmers = {D: spawn("--warm", str(D)) for D in dims}
        # the variants whose blocks differ from configs' (nothing of the warm-up's to wait for) from the start
        apart = [n for n, (_, o, _) in VARIANTS.items() if "BKB" in o or "op" in o or "dtype" in o or "g_dtype" in o]
        procs.update({n: spawn("--one", n) for n in apart})
        for D in dims:  # the references meanwhile (written once, read by every variant of the head dim)
            for case in CASES:
                from experiments.linear_attention.gpu_gla_s37 import reference as make_reference

                make_reference(D, case, ref_path(D, case).with_suffix(".tmp"))
                ref_path(D, case).with_suffix(".tmp").rename(ref_path(D, case))
                ref_path(D, case).with_suffix(".done").touch()
            torch.cuda.empty_cache()
            run.say(f"d{D} references")
        for D in dims:
            try:
                warmers[D].communicate(timeout=max(1.0, WARM_DEADLINE - run.elapsed()))
            except subprocess.TimeoutExpired:
                pass  # (the variants compile what is left)
            run.say(f"d{D} warm")
            procs.update({n: spawn("--one", n) for n, (d, _, _) in VARIANTS.items() if d == D and n not in apart})
    rows = {}
    for n, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(1.0, WORKER_DEADLINE - run.elapsed()))
            got = [ln[4:] for ln in out.splitlines() if ln.startswith("ROW ")]
            rows[n] = json.loads(got[0]) if got else dict(variant=n, error=(err.strip().splitlines() or ["?"])[-1][:200])
        except subprocess.TimeoutExpired:
            p.kill()
            rows[n] = dict(variant=n, error=f"killed at {WORKER_DEADLINE:.0f} s (compiling)")
        if "error" in rows[n]:
            run.errors.append(f"{n}: {rows[n]['error']}")
        run.say(json.dumps(rows[n])[:400])
    if not SMOKE:
        run.attempt("timing", timing, run, rows)
    for n in VARIANTS:
        r = rows[n]
        cells = {c: f"{r[c]['dq']}/{r[c]['dk']}/{r[c]['dv']} {r[c]['dg']}" + ("" if r[c]["pass"] else " FAIL")
                 for c in CASES if c in r}
        rnd = (r.get("rounds") or {}).get("graph") or (r.get("rounds") or {}).get("eager") or []
        eager_rnd = (r.get("rounds") or {}).get("eager") or []
        run.row(n, pass_=r.get("pass"), weak=cells.get("weak"), strong=cells.get("strong+reset"), ms=r.get("ms"),
                graph_ms=r.get("graph_ms"), rounds="/".join(f"{x:.4f}" for x in rnd) or None, bound_ms=r.get("bound_ms"),
                pct=r.get("pct"), bwd_ms=r.get("bwd_ms"), kernel=r.get("kernel"), error=r.get("error"),
                eager_rounds="/".join(f"{x:.4f}" for x in eager_rnd) or None,
                modes="/".join(str(x["median"]) for x in r["modes"].values()) if "modes" in r else None)
    print(f"\nGLA backward forms ({run.meta.get('gpu')}; checks bf16 B{CHECK_SHAPE[0]} N{CHECK_SHAPE[1]} H{CHECK_SHAPE[2]}"
          f" dq/dk/dv x floor, dg rel; times B16 H16 N4096 (graph rounds), copy {run.extra.get('copy_GBps', '-')} GB/s;"
          " pct of the bound by the graph median)")
    if BATCH in MODES:
        print("modes: b2b_ms / flush_ms / flush_host_ms / host_us / flush_read_ms / flush_gap_ms (``modes``)")
    run.finish(["name", "pass_", "weak", "strong", "ms", "graph_ms", "rounds", "pct", "bwd_ms"]
               + (["modes"] if BATCH in MODES else []))


if __name__ == "__main__":
    main()

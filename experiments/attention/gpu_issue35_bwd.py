"""Issue 35's open backward targets (session 38, helper HD): softcap, sliding window, packed, each against its peer
in one run.

softcap: the causal backward with softcap 30 against the same without it (target >= 0.9x the speed).
window: window (4096, 0) over N 32768 against FlexAttention with the same mask (target >= 1.3x).
packed (diagnostic): the varlen backward with dQ split (shipped) and fused, on the long tail's sequences >= 4096 as a
    batch and on the whole 64K long tail: whether a fused launch over the work table's long prefix can pay.
Session 38 timed candidates here, each removed after its runs (notes/attention's decision log, session 38): the softcap's
softmax under dP's wgmma (1.001x), its derivative kept in float32 (0.995x; fp16 dQ error 1.64 -> 1.47x the floor), a
window's balanced tile schedule (1.031x, 1.003x, 0.956x in three calls), a consumer skipping its window-missed
steps (0.958x). Session 41 (helper HT) timed the cap's derivative folded into dS (y - y tanh^2, float32) alone
(calls 1, 3, 5: 1.020 / 1.009 / 0.978x at causal N4096; removed) and with dP's wgmma accumulating from -delta
(call 5: 1.034x, shipped as the fixed kernels' SOFTCAP 3); the phases that timed them are at 7604ad14. Session 43 (HT):
phase first timed SOFTCAP 4 and 5 (the derivative before P) against SOFTCAP 3 and the plain backward at B16 H16 N4096;
5 shipped as SOFTCAP 3 (phase first now times the shipped softcap against the plain backward, at N:D cases).

Phases (run in the order given, each where its time is left; checks against float64 into NaN-poisoned dq / dk / dv;
GPU time from CUDA graphs in interleaved rounds):
  softcap:  B8 H16 N4096 D128 causal backward (preprocess + kernel + dq copy), no softcap / softcap 30
  schecks:  softcap 30 causal N 4048 (a partial last block) with dQ fused, bf16 and fp16
  window:   B2 H16 N32768 D128 window (4096, 0) backward
  wchecks:  windows (1008, 0) causal and (304, 208), N 4048
  flex:     Flex's backward (compiled, same mask) beside ours, eager do_bench, 2 interleaved rounds
  both:     window (1008, 0) + softcap 30, GQA 16/4
  packed:   see above
  delta:    the plain backward with dP's accumulator from -delta (config dp_from_delta) against the shipped config,
            D128 causal N4096 / N2048, full N4096; softcap 30 beside causal N4096
  dchecks:  that variant and the shipped config against float64: causal N4048 bf16 / fp16, causal GQA N2000, full
  first:    the shipped softcap backward against the plain backward, B16 H16 N4096 causal and full (N:D cases)
  fchecks, fchecks2, fchecks64: the shipped softcap against float64 (see checks_first)
  nan:      both softcap forms with NaN q / k rows, causal and a window, against float64 and each other's NaN pattern
  empty:    a NaN in a query row that sees no key: dQ 0 there (the dq kernel, fused, D64), NaN where the reference's
  fsoft:    the forward with softcap 30 against the forward without it, B16 H16 N4096 (N:D cases)
  capture:  a causal forward planned inside a patched block entered on every call, from CUDA graphs, against the same
            call unpatched (the patched + graph artefact: see phase_capture)
Writes $OUT/issue35_bwd.json; the table last.

    PYTHONPATH=. python experiments/attention/gpu_issue35_bwd.py [--phases softcap,schecks,window,wchecks,flex,both,packed]
        [--rounds 3] [--deadline 55]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.common.gpu_script import Run, check, eager_ms, poisoned, time_rounds  # noqa: E402
from tilecore.ops.attention import launch, plan  # noqa: E402
from tilecore.ops.attention.reference import (attention_backward_reference, attention_reference,  # noqa: E402
                                              effective_window)

CAP = 30.0


def folded(causal, window):
    """(causal, window) as the Gluon kernels take them: causal folded into a set window."""
    left, right = effective_window(causal, window)
    if (left, right) in ((-1, -1), (-1, 0)):
        return causal, (-1, -1)
    return False, (left, right)


def inputs(b, hq, hkv, n, d, dtype, seed=0, nk=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, n, d, dtype=dtype, device="cuda", generator=g)
    k, v = (torch.randn(b, hkv, nk or n, d, dtype=dtype, device="cuda", generator=g) for _ in range(2))
    dout = torch.randn(b, hq, n, d, dtype=dtype, device="cuda", generator=g)
    return q, k, v, dout


def forward(q, k, v, causal, window, softcap):
    scale = q.shape[-1] ** -0.5
    out, lse = poisoned(q), torch.full(q.shape[:3], float("nan"), device=q.device)
    launch.forward(plan.plan_forward(q, k, v, causal, scale, window=window, softcap=softcap), q, k, v, out, lse,
                   causal, scale, window, softcap)
    return out, lse


def backward_fn(q, k, v, dout, out, lse, causal, window, softcap, **overrides):
    """A callable running the Gluon backward with the shipped config (updated by ``overrides``: dq_from), its
    NaN-poisoned gradients and its plan."""
    c, w = folded(causal, window)
    scale = q.shape[-1] ** -0.5
    base = plan.plan_backward(dout, q, k, v, c, scale, path="gluon", window=w, softcap=softcap)
    p = plan.plan_backward(dout, q, k, v, c, scale, path="gluon", window=w, softcap=softcap,
                           config=dict(base.config, **overrides))
    grads = [poisoned(t) for t in (q, k, v)]

    def run():
        launch.backward(p, dout, q, k, v, out, lse, None, *grads, c, scale, w, softcap)
    return run, grads, p


def reference_grads(q, k, v, dout, causal, window, softcap):
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, causal=causal, window_size=window, softcap=softcap)
    return torch.autograd.grad(ref, (q64, k64, v64), dout.double())


def formula_grads(q, k, v, dout, causal, window, softcap):
    """float64 gradients by the FlashAttention-2 formulas (attention_backward_reference): the cap's derivative of the
    masked scores, so a masked NaN score gives dS 0 (autograd through attention_reference takes tanh' of it: NaN)."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    scale = q.shape[-1] ** -0.5
    o, lse = attention_reference(q64, k64, v64, causal=causal, scale=scale, window_size=window, softcap=softcap)
    return attention_backward_reference(dout.double(), q64, k64, v64, o, lse, None, causal=causal, scale=scale,
                                        window_size=window, softcap=softcap, compute_dtype=torch.float64)


def check_case(run, name, b, hq, hkv, n, causal, window, softcap, dtype, variants, d=128):
    q, k, v, dout = inputs(b, hq, hkv, n, d, dtype, seed=hash(name) % 1000)
    ref = reference_grads(q, k, v, dout, causal, window, softcap)
    out, lse = forward(q, k, v, causal, window, softcap)
    for label, overrides in variants.items():
        fn, grads, _ = backward_fn(q, k, v, dout, out, lse, causal, window, softcap, **overrides)
        fn()
        torch.cuda.synchronize()
        row = {}
        ok = True
        for g_name, g, r in zip(("dq", "dk", "dv"), grads, ref):
            c = check(g, r, tol=2.5)
            row[f"{g_name}_x"] = c.get("err_over_floor")
            ok &= bool(c["pass"])
        run.row(f"check {name} {str(dtype)[6:]} {label}", kind="check", pass_=ok, **row)


def checks_softcap(run):
    for dtype in (torch.bfloat16, torch.float16):
        check_case(run, "softcap30 causal N4048", 1, 16, 16, 4048, True, (-1, -1), CAP, dtype,
                   {"fused": dict(dq_from="fused")})


def checks_window(run):
    check_case(run, "window (1008,0) causal N4048", 1, 16, 16, 4048, True, (1008, 0), 0.0, torch.bfloat16,
               {"shipped": {}})
    check_case(run, "window (304,208) N4048", 1, 16, 16, 4048, False, (304, 208), 0.0, torch.bfloat16,
               {"shipped": {}})


def checks_both(run):
    check_case(run, "window (1008,0)+softcap GQA 16/4 N4048", 1, 16, 4, 4048, True, (1008, 0), CAP, torch.bfloat16,
               {"shipped": {}})


def graph_rounds(run, fns, rounds):
    """time_rounds of ``fns`` from CUDA graphs: (its dict, a row of the medians with each round's figures)."""
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    row = {k_: v_ for k_, v_ in t.items() if not k_.endswith("_rounds")}
    row["rounds"] = {k_: v_ for k_, v_ in t.items() if k_.endswith("_rounds")}
    return t, row


def bwd_flops(b, h, n, d, keys_seen):
    return 2.5 * 4 * keys_seen * d * h * b


def phase_softcap(run, rounds):
    b, h, n, d = 8, 16, 4096, 128
    q, k, v, dout = inputs(b, h, h, n, d, torch.bfloat16, seed=1)
    fns = {}
    out0, lse0 = forward(q, k, v, True, (-1, -1), 0.0)
    fns["nocap"] = backward_fn(q, k, v, dout, out0, lse0, True, (-1, -1), 0.0)[0]
    out1, lse1 = forward(q, k, v, True, (-1, -1), CAP)
    fns["softcap"] = backward_fn(q, k, v, dout, out1, lse1, True, (-1, -1), CAP)[0]
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    run.say("softcap compiled")
    t, row = graph_rounds(run, fns, rounds)
    if t.get("nocap_graph_ms") and t.get("softcap_graph_ms"):
        row["softcap_of_nocap"] = t["nocap_graph_ms"] / t["softcap_graph_ms"]
    run.row(f"softcap{CAP:g} causal B{b} H{h} N{n} D{d} bwd", kind="time", **row)


def phase_delta(run, rounds, cases="4096c,2048c,4096f"):
    """The plain backward (no softcap) with dP's accumulator from -delta (config dp_from_delta, as SOFTCAP 3 has it)
    against the same config without it (both forced: the shipped config takes it where dQ is the dq kernel's): D128 causal N4096 (dQ fused), causal N2048 (dQ by the dq kernel), full N4096
    (lagged); softcap 30 beside the causal N4096 pair (its ratio to either denominator)."""
    b, h, d = 8, 16, 128
    for n, causal in ((int(c[:-1]), c[-1] == "c") for c in cases.split(",")):
        q, k, v, dout = inputs(b, h, h, n, d, torch.bfloat16, seed=3)
        out0, lse0 = forward(q, k, v, causal, (-1, -1), 0.0)
        fns = {"plain": backward_fn(q, k, v, dout, out0, lse0, causal, (-1, -1), 0.0, dp_from_delta=False)[0],
               "delta": backward_fn(q, k, v, dout, out0, lse0, causal, (-1, -1), 0.0, dp_from_delta=True)[0]}
        if causal and n == 4096:
            out1, lse1 = forward(q, k, v, causal, (-1, -1), CAP)
            fns["softcap"] = backward_fn(q, k, v, dout, out1, lse1, causal, (-1, -1), CAP)[0]
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        t, row = graph_rounds(run, fns, rounds)
        if t.get("plain_graph_ms") and t.get("delta_graph_ms"):
            row["delta_speedup"] = t["plain_graph_ms"] / t["delta_graph_ms"]
            if t.get("softcap_graph_ms"):
                row["softcap_of_plain"] = t["plain_graph_ms"] / t["softcap_graph_ms"]
                row["softcap_of_delta"] = t["delta_graph_ms"] / t["softcap_graph_ms"]
        run.row(f"dP from -delta {'causal' if causal else 'full'} B{b} H{h} N{n} D{d} bwd", kind="time", **row)


def checks_delta(run):
    for dtype in (torch.bfloat16, torch.float16):
        check_case(run, "dP from -delta causal N4048", 1, 16, 16, 4048, True, (-1, -1), 0.0, dtype,
                   {"shipped": {}, "delta": dict(dp_from_delta=True)})
    check_case(run, "dP from -delta causal GQA 16/4 N2000", 1, 16, 4, 2000, True, (-1, -1), 0.0, torch.bfloat16,
               {"shipped": {}, "delta": dict(dp_from_delta=True)})
    check_case(run, "dP from -delta full N4048", 1, 16, 16, 4048, False, (-1, -1), 0.0, torch.bfloat16,
               {"shipped": {}, "delta": dict(dp_from_delta=True)})
    # not causal below FUSED_DQ_MIN_N[False]: the dq kernel's dQ, where the shipped config now takes -delta
    check_case(run, "dP from -delta full GQA 16/4 N1000", 2, 16, 4, 1000, False, (-1, -1), 0.0, torch.bfloat16,
               {"shipped": {}, "delta off": dict(dp_from_delta=False)})


def phase_first(run, rounds, cases="4096c,4096f", batch=16):
    """The shipped softcap backward (SOFTCAP 3: the cap's derivative into dP - delta before P, since session 43)
    against the plain backward (no softcap, the shipped config), B16 H16 bf16 at N4096, causal (dQ fused) and full
    (lagged) by default. Session 43's calls 1-3 timed the forms before it here (SOFTCAP 4: 0.990x / 1.032x the
    session-41 kernel; 5, shipped: 1.025-1.036x causal, 1.056-1.093x full); the phases that did are at cd4c5e4e."""
    h = 16
    for case in cases.split(","):  # N, c (causal) / f (full), optionally :D (128)
        shape, _, dim = case.partition(":")
        n, causal, d = int(shape[:-1]), shape[-1] == "c", int(dim or 128)
        q, k, v, dout = inputs(batch, h, h, n, d, torch.bfloat16, seed=4)
        out0, lse0 = forward(q, k, v, causal, (-1, -1), 0.0)
        out1, lse1 = forward(q, k, v, causal, (-1, -1), CAP)
        fns = {"plain": backward_fn(q, k, v, dout, out0, lse0, causal, (-1, -1), 0.0)[0],
               "softcap": backward_fn(q, k, v, dout, out1, lse1, causal, (-1, -1), CAP)[0]}
        softcap_against_plain(run, fns, rounds, f"softcap{CAP:g} {'causal' if causal else 'full'} B{batch} H{h} N{n} "
                              f"D{d} bwd")
        del q, k, v, dout, out0, lse0, out1, lse1, fns
        torch.cuda.empty_cache()


def softcap_against_plain(run, fns, rounds, name, **extra):
    """fns "plain" and "softcap" run once, then timed from CUDA graphs in interleaved rounds: a row with the softcap's
    speed over the plain one's."""
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    t, row = graph_rounds(run, fns, rounds)
    if all(t.get(f"{x}_graph_ms") for x in fns):
        row["softcap_of_plain"] = t["plain_graph_ms"] / t["softcap_graph_ms"]
    run.row(name, kind="time", **extra, **row)



def phase_fsoft(run, rounds, cases="4096c,4096f,4096c:64"):
    """The forward with softcap 30 against the same forward without it (issue 35: >= 0.9x the speed; 0.913x / 0.838-
    0.864x in session 26's two H100 rounds, not timed since), B16 H16 bf16, the shipped plans (tanh.approx.f32,
    SOFTCAP 2), from CUDA graphs in interleaved rounds. N, c (causal) / f (full), optionally :D (128)."""
    h, batch = 16, 16
    for case in cases.split(","):
        shape, _, dim = case.partition(":")
        n, causal, d = int(shape[:-1]), shape[-1] == "c", int(dim or 128)
        q, k, v, _ = inputs(batch, h, h, n, d, torch.bfloat16, seed=6)
        scale = d ** -0.5
        outs = {x: (torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)) for x in ("plain", "softcap")}
        plans = {x: plan.plan_forward(q, k, v, causal, scale, softcap=cap) for x, cap in (("plain", 0.0),
                                                                                          ("softcap", CAP))}
        fns = {}
        for x, cap in (("plain", 0.0), ("softcap", CAP)):
            fns[x] = (lambda p=plans[x], o=outs[x], cap=cap, t=(q, k, v):
                      launch.forward(p, *t, *o, causal, scale, (-1, -1), cap))
        softcap_against_plain(run, fns, rounds, f"softcap{CAP:g} {'causal' if causal else 'full'} B{batch} H{h} N{n} "
                              f"D{d} fwd", paths=[plans[x].path for x in fns])
        del q, k, v, outs, fns
        torch.cuda.empty_cache()


def checks_nan(run):
    """NaN inputs through the softcap backward, causal (rows and keys masked on the diagonal blocks), B1 H4 N1024 bf16:
    q row 100 of head 0 and k row 500 of head 1 NaN; a window (200, 0) in heads 2, 3 with q row 300 and k row 40 NaN.
    Against float64 (check's nonfinite_ok: NaN where the reference has NaN, finite where it is finite; session 43's
    call 2: neither softcap form matched it, both the same NaN pattern)."""
    for window in ((-1, -1), (200, 0)):
        q, k, v, dout = inputs(1, 4, 4, 1024, 128, torch.bfloat16, seed=7)
        q[0, 0, 100], k[0, 1, 500], q[0, 2, 300], k[0, 3, 40] = (float("nan"),) * 4
        ref = reference_grads(q, k, v, dout, True, window, CAP)
        out, lse = forward(q, k, v, True, window, CAP)
        nan = {}
        for label, overrides in {"shipped": {}}.items():
            fn, grads, _ = backward_fn(q, k, v, dout, out, lse, True, window, CAP, **overrides)
            fn()
            torch.cuda.synchronize()
            row, ok = {}, True
            for g_name, g, r in zip(("dq", "dk", "dv"), grads, ref):
                c = check(g, r, tol=2.5)
                row[f"{g_name}_x"] = c.get("err_over_floor")
                row[f"{g_name}_nonfinite_ok"] = c.get("nonfinite_ok")
                ok &= bool(c["pass"])
            nan[label] = [g.isnan() for g in grads]
            same = all(torch.equal(a, b) for a, b in zip(nan[label], nan["shipped"]))
            run.row(f"check NaN inputs causal window {window} N1024 {label}", kind="check", pass_=ok,
                    nan_as_shipped=same, **row)


def checks_empty(run):
    """A NaN in a query row that sees no key gives that row dQ 0 (the float64 FlashAttention-2 formulas', formula_grads;
    the tl kernels' and the CPU path's, tests/attention/test_backward_nan_empty_rows.py); before, the dq kernel's
    SOFTCAP 3 gave it NaN (ds - ds tanh^2 with tanh NaN). N 1100 over Nk 1000, B1 H4 bf16, softcap 30: rows 0-99 see
    no key, causal or with a window (200, 0); q row 70 of head 0 NaN (no key; its 64-row block's rows 100-127 see
    keys, so the block is visited and masked: a block of empty rows alone has no step), q row 600 of head 1 NaN (keys). dQ by
    the dq kernel (causal, window) and fused (causal) at D128, by the dQ warpgroup at D64 (causal). pass_: dQ's check (NaN where the reference's, finite
    elsewhere, error <= 2.5x the floor) and row 70's dQ exactly 0. dK / dV: the error over the elements finite in both
    (the reference's dK is NaN at every key of heads 0 and 1: q^T dS multiplies dS's 0 by the NaN row; the kernels'
    only where a NaN row's block meets the key). autograd_empty_row_dq_nan: autograd through attention_reference."""
    cases = [(128, "dq kernel", dict(dq_from="gluon"), (-1, -1)), (128, "dq kernel", dict(dq_from="gluon"), (200, 0)),
             (128, "fused", dict(dq_from="fused"), (-1, -1)), (64, "shipped", {}, (-1, -1))]
    for d, label, overrides, window in cases:
        if run.left() < 6:
            return
        q, k, v, dout = inputs(1, 4, 4, 1100, d, torch.bfloat16, seed=11, nk=1000)
        q[0, 0, 70, 7], q[0, 1, 600, 3] = float("nan"), float("nan")
        ref = formula_grads(q, k, v, dout, True, window, CAP)
        autograd_dq = reference_grads(q, k, v, dout, True, window, CAP)[0]
        out, lse = forward(q, k, v, True, window, CAP)
        fn, grads, _ = backward_fn(q, k, v, dout, out, lse, True, window, CAP, **overrides)
        fn()
        torch.cuda.synchronize()
        c = check(grads[0], ref[0], tol=2.5)
        row = {"dq_x": c.get("err_over_floor"), "dq_nonfinite_ok": c.get("nonfinite_ok"),
               "empty_row_dq_zero": bool((grads[0][0, 0, 70] == 0).all()),
               "ref_empty_row_dq_zero": bool((ref[0][0, 0, 70] == 0).all()),
               "autograd_empty_row_dq_nan": bool(torch.isnan(autograd_dq[0, 0, 70]).any())}
        for g_name, g, r in zip(("dk", "dv"), grads[1:], ref[1:]):
            both = torch.isfinite(r) & torch.isfinite(g)
            row[f"{g_name}_x"] = check(g[both], r[both]).get("err_over_floor")
        ok = bool(c["pass"]) and row["empty_row_dq_zero"]
        run.row(f"check empty NaN row {'causal' if window == (-1, -1) else window} D{d} {label}", kind="check",
                pass_=ok, **row)


def checks_first(run, which="a"):
    """The shipped softcap kernel against float64 (softcap 30): "a" causal N4048 with
    dQ fused (bf16, fp16) and full N4048 (lagged, bf16); "b" causal N2000 (the dq kernel's dQ), full N4048 fp16, window
    (1008, 0) + softcap GQA 16/4 N4048; "d64" D64 causal N4048 (bf16, fp16) and window (1008, 0) + softcap."""
    if which == "a":
        for dtype in (torch.bfloat16, torch.float16):
            check_case(run, "softcap30 causal N4048", 1, 16, 16, 4048, True, (-1, -1), CAP, dtype,
                       {"fused": dict(dq_from="fused")})
        check_case(run, "softcap30 full N4048", 1, 16, 16, 4048, False, (-1, -1), CAP, torch.bfloat16,
                   {"shipped": {}})
    elif which == "d64":  # D64: dQ from its warpgroup (DQ 4)
        for dtype in (torch.bfloat16, torch.float16):
            check_case(run, "softcap30 D64 causal N4048", 1, 16, 16, 4048, True, (-1, -1), CAP, dtype,
                       {"shipped": {}}, d=64)
        check_case(run, "window (1008,0)+softcap D64 N4048", 1, 16, 16, 4048, True, (1008, 0), CAP, torch.bfloat16,
                   {"shipped": {}}, d=64)
    else:
        check_case(run, "softcap30 causal N2000", 2, 16, 16, 2000, True, (-1, -1), CAP, torch.bfloat16,
                   {"shipped": {}})
        check_case(run, "softcap30 full N4048", 1, 16, 16, 4048, False, (-1, -1), CAP, torch.float16,
                   {"shipped": {}})
        check_case(run, "window (1008,0)+softcap GQA 16/4 N4048", 1, 16, 4, 4048, True, (1008, 0), CAP,
                   torch.bfloat16, {"shipped": {}})


def phase_capture(run, rounds):
    """The patched + CUDA graph artefact (session 42) after 46579743: the causal forward (D64 B16 H16 N4096, where
    round-robin's longest program is 1.21x the balanced table's in plan's cost model) planned and launched inside a
    switches.patched block entered on every call (its switches at their shipped values: the same table), so that
    do_bench_cudagraph's warm-up and capture run in different generations, against the same call unpatched. Before the
    fix the capture launched round-robin; now it must launch the warm-up's table (the plan's schedule, recorded on each
    call, is that tensor) and take the unpatched time."""
    from tilecore import dispatch
    from tilecore.ops.attention import configs
    from tilecore.tiles.switches import patched

    b, h, n, d = 16, 16, 4096, 64
    q, k, v, _ = inputs(b, h, h, n, d, torch.bfloat16, seed=5)
    scale = d ** -0.5
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)
    shipped = plan.plan_forward(q, k, v, True, scale)
    seen = []

    def unpatched():
        launch.forward(shipped, q, k, v, out, lse, True, scale)

    def in_block():
        with patched(configs, TILE_OVERHEAD_STEPS=configs.TILE_OVERHEAD_STEPS):
            p = plan.plan_forward(q, k, v, True, scale)
            seen.append((dispatch.capturing(q.device), p.schedule is shipped.schedule))
            launch.forward(p, q, k, v, out, lse, True, scale)
    fns = {"unpatched": unpatched, "patched": in_block}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    t, row = graph_rounds(run, fns, rounds)
    captured = [same for capturing, same in seen if capturing]
    row.update(table=shipped.schedule is not None, captures=len(captured), captured_the_table=all(captured) and bool(captured))
    if t.get("unpatched_graph_ms") and t.get("patched_graph_ms"):
        row["patched_over_unpatched"] = t["patched_graph_ms"] / t["unpatched_graph_ms"]
    run.row(f"capture in a patched block: causal fwd B{b} H{h} N{n} D{d}", kind="time", pass_=row["captured_the_table"],
            **row)


WINDOW_STATE = {}


def phase_window(run, rounds):
    b, h, n, left, d = 2, 16, 32768, 4096, 128
    q, k, v, dout = inputs(b, h, h, n, d, torch.bfloat16, seed=2)
    window = (left, 0)
    out, lse = forward(q, k, v, True, window, 0.0)
    fns = {"ours": backward_fn(q, k, v, dout, out, lse, True, window, 0.0)[0]}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    run.say("window compiled")
    t, row = graph_rounds(run, fns, rounds)
    keys = sum(min(i, left) + 1 for i in range(n))
    for name in fns:
        if t.get(f"{name}_graph_ms"):
            row[f"{name}_tflops"] = bwd_flops(b, h, n, d, keys) / t[f"{name}_graph_ms"] / 1e9
    run.row(f"window ({left},0) causal B{b} H{h} N{n} D{d} bwd", kind="time", **row)
    WINDOW_STATE.update(q=q, k=k, v=v, dout=dout, fns=fns, left=left, n=n)


def phase_flex(run):
    """FlexAttention's backward with the same mask (compiled; eager do_bench, the L2 flushed) beside ours, eager too."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    st = WINDOW_STATE
    q, k, v, dout, fns, left, n = (st[x] for x in ("q", "k", "v", "dout", "fns", "left", "n"))

    def sliding(bb, hh, qi, ki):
        return (qi >= ki) & (qi - ki <= left)
    mask = create_block_mask(sliding, None, None, n, n, device=q.device)
    compiled = torch.compile(flex_attention, dynamic=False)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    o = compiled(qg, kg, vg, block_mask=mask)
    flex_bwd = lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)  # noqa: E731
    flex_bwd()
    run.say("flex compiled")
    row = {}
    for r in range(2):  # interleaved: Flex, ours, Flex, ours reversed
        names = ["flex"] + list(fns) if r == 0 else list(fns)[::-1] + ["flex"]
        for name in names:
            ms = eager_ms(flex_bwd if name == "flex" else fns[name], warmup=10, rep=60)
            row.setdefault(f"{name}_ms_rounds", []).append(round(ms, 4))
    for name in ["flex"] + list(fns):
        row[f"{name}_ms"] = min(row[f"{name}_ms_rounds"])  # the better of two rounds each
    for name in fns:
        row[f"{name}_x_flex"] = row["flex_ms"] / row[f"{name}_ms"]
    run.row(f"window ({left},0) flex vs ours, eager", kind="time", **row)


def phase_packed(run, rounds):
    """Issue 35's packed backward (0.93x FLOP-matched): where it loses is the long sequences, which the fixed path
    runs with dQ fused (~9% over a split there) and the varlen path splits. Does the varlen kernel with dQ fused
    beat its split on the long sequences alone (a batch of the >= 4096 ones) and on the whole long tail?"""
    from experiments.attention.gpu_varlen import long_tailed_lengths
    from tilecore.ops.attention_varlen import configs as varlen_configs, op as varlen

    h, d = 16, 128
    lengths = long_tailed_lengths(65536)
    scale = d ** -0.5
    batches = {"long": [n for n in lengths if n >= 4096], "all": lengths}
    row = {}
    for label, lens in batches.items():
        total = sum(lens)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(3)
        q, k, v, dout = (torch.randn(total, h, d, dtype=torch.bfloat16, device="cuda", generator=g) for _ in range(4))
        out, lse = varlen.forward_gluon(q, k, v, cu, cu, True, scale, 0.0)
        fns = {}
        for mode in ("gluon", "fused"):
            cfg = dict(varlen_configs.varlen_gluon_backward_config(d, True), dq_from=mode)
            grads = tuple(torch.empty_like(t) for t in (q, k, v))
            fns[f"{label}_{'split' if mode == 'gluon' else 'fused'}"] = (
                lambda cfg=cfg, grads=grads: varlen.backward_gluon(dout, q, k, v, out, lse, None, cu, cu, True, scale,
                                                                   -1, -1, 0.0, grads=grads, config=cfg))
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        t = time_rounds(fns, rounds=rounds, eager=True, deadline=run)
        t.update(run.attempt(f"packed {label} graphs", time_rounds, fns, rounds=rounds, graph=True, eager=False,
                             deadline=run) or {})
        row.update({k_: v_ for k_, v_ in t.items() if not k_.endswith("_rounds")})
        for kind, suffix in (("graph_ms", "_graph"), ("ms", "")):
            if t.get(f"{label}_split_{kind}") and t.get(f"{label}_fused_{kind}"):
                row[f"{label}_fused_over_split{suffix}"] = t[f"{label}_split_{kind}"] / t[f"{label}_fused_{kind}"]
        row[f"{label}_lengths"] = lens if label == "long" else len(lens)
        if run.left() < 10:
            break
    run.row("packed 64K long tail H16 D128 causal: varlen bwd split vs fused", kind="time", **row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="softcap,schecks,window,wchecks,flex,both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=55.0)
    ap.add_argument("--delta-cases", default="4096c,2048c,4096f", help="phase delta's N and c (causal) / f (full)")
    ap.add_argument("--first-cases", default="4096c,4096f", help="phase first's N and c (causal) / f (full), :D (128)")
    ap.add_argument("--batch", type=int, default=16, help="phase first's batch")
    ap.add_argument("--fsoft-cases", default="4096c,4096f,4096c:64", help="phase fsoft's N, c / f, :D")
    args = ap.parse_args()
    run = Run("issue35_bwd", deadline=args.deadline)
    steps = {"softcap": lambda: phase_softcap(run, args.rounds), "schecks": lambda: checks_softcap(run),
             "window": lambda: phase_window(run, args.rounds), "wchecks": lambda: checks_window(run),
             "flex": lambda: phase_flex(run), "both": lambda: checks_both(run),
             "packed": lambda: phase_packed(run, args.rounds), "delta": lambda: phase_delta(run, args.rounds, args.delta_cases),
             "dchecks": lambda: checks_delta(run),
             "first": lambda: phase_first(run, args.rounds, args.first_cases, args.batch),
             "fchecks": lambda: checks_first(run, "a"), "fchecks2": lambda: checks_first(run, "b"),
             "capture": lambda: phase_capture(run, args.rounds), "nan": lambda: checks_nan(run),
             "empty": lambda: checks_empty(run), "fsoft": lambda: phase_fsoft(run, args.rounds, args.fsoft_cases),
             "fchecks64": lambda: checks_first(run, "d64")}
    need = {"flex": 22, "both": 12, "packed": 15, "first": 30, "fchecks2": 15, "fchecks64": 15, "nan": 12, "capture": 10, "empty": 12, "fsoft": 15}  # seconds a phase needs left to start (compiles)
    for name in args.phases.split(","):  # in the order given
        if name == "flex" and not WINDOW_STATE:
            continue
        if run.left() > need.get(name, 5):
            run.attempt(name, steps[name])
        else:
            run.say(f"skipped {name}: {run.left():.0f} s left")
    run.finish(["name", "pass_", "dq_x", "dk_x", "dv_x", "empty_row_dq_zero", "nan_as_shipped", "dq_nonfinite_ok", "dk_nonfinite_ok", "nocap_graph_ms", "softcap_graph_ms", "softcap_of_nocap",
                "ours_graph_ms", "ours_tflops", "flex_ms", "ours_ms", "ours_x_flex", "plain_graph_ms", "delta_graph_ms", "delta_speedup",
                "softcap_of_plain", "softcap_of_delta",
                "unpatched_graph_ms", "patched_graph_ms", "patched_over_unpatched", "long_fused_over_split_graph",
                "long_fused_over_split", "all_fused_over_split_graph", "all_fused_over_split"])


if __name__ == "__main__":
    main()

"""Issue 35, session 26: the Gluon backward (dK/dV and dQ kernels) with a sliding window and a softcap,
and the Gluon forward's softcap by tanh.approx.f32 (now its default), on the GPU.

1. Correctness (bf16, fp16 on a few), against the float64 reference (reference.py), error as a
   multiple of the rounding floor, into NaN-poisoned buffers (every element written):
   - the forced Gluon backward (path "gluon": dQ fused / lagged / warpgroup / the dq kernel, by the
     plan's N and D) for window, softcap (tanh.approx and the exact form), both, grouped heads,
     N != Nk, rows that see no key; a saturating softcap (scores past the cap);
   - the default forward (Gluon, softcap by tanh.approx) and its exact form (config tanh_approx False);
   - varlen (gpu_varlen.check_varlen: lengths 0, 1, odd; the tl kernels, softcap by tanh.approx).
2. Timing (bf16, triton.testing.do_bench medians, peers in the same run; gpu_features.py's shapes):
   - window 4096 over N 32768 (B 2, H 16, D 128): default (forward Gluon, backward tl) and the
     forced Gluon backward, against full causal and FlexAttention with the same block mask;
   - softcap 30 causal (B 16, H 16, N 4096, D 128): no softcap, default, forward exact form, the
     Gluon backward (tanh.approx and exact), FlexAttention;
   - varlen packed long-tailed 64K tokens against fixed B16 N4096 (gpu_varlen.time_packed), and with
     softcap 30 against none.
Prints a table last; writes JSON to $OUT (default /tmp/out)/attention_features_s26.json. Under 4 minutes.

  PYTHONPATH=. python experiments/attention/gpu_features_s26.py            # on the GPU
  PYTHONPATH=. python experiments/attention/gpu_features_s26.py --smoke    # CPU, interpreter, tiny, no timing
  PYTHONPATH=. python experiments/attention/gpu_features_s26.py --quick    # <= 90 s: the varlen rows only
  PYTHONPATH=. python experiments/attention/gpu_features_s26.py --cases 0,5 --budget 500   # some Gluon checks

Rows are printed as they are made and the JSON is rewritten after each section (session 26's round 3
printed nothing within its 200 s limit: the table came at the end, and the Gluon checks compile a
forward, backward and dQ kernel per window / softcap / dQ mode / tanh form, 10-40 s each).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback

SMOKE = "--smoke" in sys.argv
QUICK = "--quick" in sys.argv
if SMOKE:  # before triton is imported: the kernels run in its interpreter
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from tilecore import accuracy  # noqa: E402
from tilecore.ops.attention import attention, launch, plan  # noqa: E402
from tilecore.ops.attention.reference import attention_reference, effective_window  # noqa: E402

class PrintedRows(list):
    """The table's rows, each printed (flushed) as it is added: session 26's round 3 printed nothing
    within its 200 s limit because the table came only at the end (and its checks compile dozens of
    Gluon kernel variants: each window / softcap / dQ mode / tanh form is a forward, backward and dQ
    compile of 10-40 s on the host)."""

    def append(self, row):
        super().append(row)
        section, case, figures = row
        print(f"{section:6} {case:70} {figures}", flush=True)


ROWS = PrintedRows()  # the table: (section, case, figures)
RESULTS = {"correctness": [], "timing": [], "errors": []}


def device() -> str:
    return "cpu" if SMOKE else "cuda"


def note_error(what: str, exc: BaseException) -> None:
    text = f"{type(exc).__name__}: {exc}"
    print(f"[{what}] FAILED: {text}")
    traceback.print_exc(limit=4)
    RESULTS["errors"].append(dict(case=what, error=text[:2000]))
    ROWS.append(("error", what, text[:100]))


def make(b, hq, hkv, n, nk, d, dv, dtype, q_scale=1.0):
    g = torch.Generator(device=device()).manual_seed(0)
    q = torch.randn(b, hq, n, d, dtype=torch.float32, device=device(), generator=g).mul_(q_scale).to(dtype)
    k = torch.randn(b, hkv, nk, d, dtype=dtype, device=device(), generator=g)
    v = torch.randn(b, hkv, nk, dv, dtype=dtype, device=device(), generator=g)
    return q, k, v


def folded(causal, window):
    """(causal, window) as the Gluon kernels see them: causal folded into a window where one is set
    (so the forced plans take the non-causal schedule and config, as the kernel does)."""
    left, right = effective_window(causal, window)
    if (left, right) in ((-1, -1), (-1, 0)):
        return causal, (-1, -1)
    return False, (left, right)


def gluon_backward(dout, q, k, v, out, lse, causal, window, softcap, tanh_approx=True, extra=None):
    """dq, dk, dv by the forced Gluon backward into NaN-poisoned buffers; ``extra``: config keys
    (dq_from) over the plan's."""
    causal, window = folded(causal, window)
    scale = q.shape[-1] ** -0.5
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    bwd_plan = plan.plan_backward(dout, q, k, v, causal, scale, path="gluon", window=window, softcap=softcap)
    if not tanh_approx or extra:
        bwd_plan = plan.plan_backward(dout, q, k, v, causal, scale, path="gluon", window=window, softcap=softcap,
                                      config=bwd_plan.config | dict(tanh_approx=tanh_approx) | (extra or {}))
    launch.backward(bwd_plan, dout, q, k, v, out, lse, None, *grads, causal, scale, window, softcap)
    return grads, bwd_plan


def forward(q, k, v, causal, window, softcap, path=None, tanh_approx=True):
    """(out, lse) into NaN-poisoned buffers by the plan's path (or ``path``), the Gluon softcap's
    tanh by tanh.approx unless ``tanh_approx`` is False."""
    scale = q.shape[-1] ** -0.5
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    fwd_plan = plan.plan_forward(q, k, v, causal, scale, window=window, softcap=softcap, path=path)
    if not tanh_approx and fwd_plan.path == "gluon":
        fwd_plan = plan.plan_forward(q, k, v, causal, scale, window=window, softcap=softcap, path=fwd_plan.path,
                                     config=fwd_plan.config | dict(tanh_approx=False))
    launch.forward(fwd_plan, q, k, v, out, lse, causal, scale, window, softcap)
    return out, lse, fwd_plan.path


# --------------------------------------------------------------------------------------------
# correctness

CHECKS = [  # name, B, Hq, Hkv, N, Nk, D, causal, window, softcap, q_scale
    ("window (256, 0) D128 N1000", 1, 4, 2, 1000, 1000, 128, False, (256, 0), 0.0, 1.0),
    ("window (100, 37) N<Nk D64", 1, 4, 4, 700, 1100, 64, False, (100, 37), 0.0, 1.0),
    ("window (64, -1) causal N>Nk D64 GQA", 1, 4, 1, 900, 600, 64, True, (64, -1), 0.0, 1.0),
    ("window (300, 200) D128 N2048", 1, 4, 4, 2048, 2048, 128, False, (300, 200), 0.0, 1.0),
    ("window (1000, 0) causal D128 N3000 GQA", 1, 8, 2, 3000, 3000, 128, True, (1000, 0), 0.0, 1.0),
    ("softcap 30 causal D128 N1000", 1, 4, 2, 1000, 1000, 128, True, (-1, -1), 30.0, 1.0),
    ("softcap 30 causal D128 N4096", 1, 2, 2, 4096, 4096, 128, True, (-1, -1), 30.0, 1.0),
    ("softcap 2 (saturating) D64", 1, 4, 4, 600, 700, 64, False, (-1, -1), 2.0, 1.0),
    ("softcap 30, scores past it, D128", 1, 4, 4, 1500, 1500, 128, False, (-1, -1), 30.0, 12.0),
    ("window + softcap D128 GQA N2048", 1, 8, 2, 2048, 2048, 128, True, (200, -1), 20.0, 1.0),
    ("window + softcap D64 N1500", 1, 4, 4, 1500, 1500, 64, False, (500, 100), 50.0, 4.0),
    # keys no query sees (key tiles of no step: dK = dV = 0) and, D64, the dQ warpgroup's empty tiles
    ("window (0, 0) N<Nk D128", 1, 2, 2, 300, 1000, 128, False, (0, 0), 0.0, 1.0),
    ("window (3, 1) N<Nk D64 GQA softcap", 1, 4, 2, 200, 900, 64, False, (3, 1), 10.0, 1.0),
]
SMOKE_CHECKS = [("window (9, 3) smoke", 1, 2, 1, 40, 50, 16, False, (9, 3), 0.0, 1.0),
                ("softcap smoke", 1, 2, 2, 24, 24, 32, True, (-1, -1), 2.0, 1.0)]


def errors(got, ref):
    return {name: accuracy.error_over_floor(g, r) for name, g, r in zip(("dq", "dk", "dv"), got, ref)}


def check_case(name, b, hq, hkv, n, nk, d, causal, window, softcap, q_scale, dtype) -> None:
    q, k, v = make(b, hq, hkv, n, nk, d, d, dtype, q_scale)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_reference(q64, k64, v64, causal=causal, window_size=window, softcap=softcap)
    dout = torch.randn(ref.shape, dtype=dtype, device=q.device)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    ref, ref_lse = ref.detach(), ref_lse.detach()
    live = torch.isfinite(ref_lse)

    def lse_ok(lse):
        return bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.allclose(
            lse[live].double(), ref_lse[live], rtol=1e-3, atol=1e-3))

    # forward: the default plan (Gluon with tanh.approx), and with a softcap the exact form too
    variants = [True, False] if softcap and not SMOKE else [True]
    out = lse = None
    for approx in variants:
        o, l, path = forward(q, k, v, causal, window, softcap, tanh_approx=approx)
        err = accuracy.error_over_floor(o, ref)
        ok = bool(torch.isfinite(o).all()) and lse_ok(l) and err <= 2.0
        label = f"{name} {str(dtype)[6:]} fwd [{path}{', exact tanh' if not approx else ''}]"
        RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), what="forward", path=path, tanh_approx=approx,
                                           ok=ok, lse_ok=lse_ok(l), out_over_floor=err))
        ROWS.append(("check", label, f"{'ok' if ok else 'BAD'} out {err:.2f}"))
        if approx:
            out, lse = o, l
    # backward: the forced Gluon path (from the forward's out and lse), tanh.approx and exact, and the
    # (the softmax under dP's wgmma, softcap_overlap, was removed in session 33); then the default autograd path
    if SMOKE or (d in (64, 128) and q.is_cuda):
        for approx, extra in [(a, None) for a in variants]:
            path = "gluon"
            try:
                if SMOKE:  # the interpreter cannot run Gluon: the tl backward through the same launch helper
                    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                    launch.backward_into(dout, q, k, v, out, lse, None, *grads, causal, d ** -0.5, window, softcap)
                    path = "tl"
                    dq_from = "-"
                else:
                    grads, bwd_plan = gluon_backward(dout, q, k, v, out, lse, causal, window, softcap, approx, extra)
                    dq_from = bwd_plan.config["dq_from"]
            except Exception as exc:  # noqa: BLE001
                note_error(f"check {name} {dtype} backward", exc)
                continue
            unwritten = int(sum(g.isnan().sum() for g in grads))
            errs = errors(grads, ref_grads)
            ok = unwritten == 0 and max(errs.values()) <= 3.0
            label = (f"{name} {str(dtype)[6:]} bwd [{path} dq {dq_from}{', exact tanh' if not approx else ''}"
                     "]")
            RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), what="backward", path=path, dq_from=dq_from,
                                               tanh_approx=approx, ok=ok, unwritten=unwritten,
                                               **{f"{k_}_over_floor": v_ for k_, v_ in errs.items()}))
            ROWS.append(("check", label, ("ok " if ok else "BAD ") + " ".join(f"{k_} {v_:.2f}" for k_, v_ in errs.items())
                         + (f" unwritten {unwritten}" if unwritten else "")))
    # the default path through autograd (plans: forward and backward Gluon for window / softcap)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out_d = attention(qg, kg, vg, causal=causal, window_size=window, softcap=softcap)
    grads = torch.autograd.grad(out_d, (qg, kg, vg), dout)
    errs = errors(grads, ref_grads)
    err_out = accuracy.error_over_floor(out_d.detach(), ref)
    bwd_path = plan.plan_backward(dout, q, k, v, causal, d ** -0.5, window=window, softcap=softcap).path
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    ok = finite and err_out <= 2.0 and max(errs.values()) <= 3.0
    RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), what="default autograd", path=bwd_path, ok=ok,
                                       out_over_floor=err_out, **{f"{k_}_over_floor": v_ for k_, v_ in errs.items()}))
    ROWS.append(("check", f"{name} {str(dtype)[6:]} default autograd [bwd {bwd_path}]",
                 ("ok " if ok else "BAD ") + f"out {err_out:.2f} " + " ".join(f"{k_} {v_:.2f}" for k_, v_ in errs.items())))


def load_varlen_script():
    spec = importlib.util.spec_from_file_location(
        "gpu_varlen", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_varlen.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.SMOKE = SMOKE
    return mod


def check_varlen(dtype) -> None:
    mod = load_varlen_script()
    cases = ([([3, 0, 17, 1], [3, 0, 17, 1], 2, 1, 16, 16, dict(causal=True))] if SMOKE else
             [([1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, 128, dict(causal=True)),
              ([700, 129, 2000], [900, 129, 2000], 16, 4, 128, 128,
               dict(causal=True, window_size=(100, 50), softcap=20.0))])
    for lens_q, lens_k, hq, hkv, d, dv, options in cases:
        try:
            mod.check_varlen(dtype, lens_q, lens_k, hq, hkv, d, dv, options)
            row = mod.RESULTS["check"][-1]
            RESULTS["correctness"].append(dict(what="varlen", **{k_: v_ for k_, v_ in row.items()}))
            ROWS.append(("check", f"varlen {str(dtype)[6:]} q{lens_q} {options}"[:70],
                         f"{'ok' if row['ok'] else 'BAD'} out {row['O_x_floor']:.2f} dq {row['dq_x_floor']:.2f} "
                         f"dk {row['dk_x_floor']:.2f} dv {row['dv_x_floor']:.2f} unwritten {row['unwritten']}"))
        except Exception as exc:  # noqa: BLE001
            note_error(f"check varlen {lens_q} {dtype}", exc)


# --------------------------------------------------------------------------------------------
# timing


def bench(fn) -> float:
    """Median ms of fn (do_bench: warm-up, then repeats); --smoke: one call, wall time."""
    if SMOKE:
        t0 = time.time()
        fn()
        return (time.time() - t0) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def default_times(q, k, v, causal, window, softcap):
    """(forward ms, backward ms) of tilecore.attention (its plans' paths)."""
    run = lambda: attention(q, k, v, causal=causal, window_size=window, softcap=softcap)
    out = run()
    dout = torch.randn_like(out)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out_g = attention(qg, kg, vg, causal=causal, window_size=window, softcap=softcap)
    back = lambda: torch.autograd.grad(out_g, (qg, kg, vg), dout, retain_graph=True)
    return bench(run), bench(back)


def forced_times(q, k, v, causal, window, softcap, tanh_approx=True, backward=True, extra=None):
    """(forward ms, backward ms) with the forward by its plan (tanh_approx as given) and the
    backward by the forced Gluon path (causal folded into the window): plans made once, launches into
    buffers made once (as tilecore.attention's cached plans do)."""
    scale = q.shape[-1] ** -0.5
    out, lse, _ = forward(q, k, v, causal, window, softcap, tanh_approx=tanh_approx)
    fwd_plan = plan.plan_forward(q, k, v, causal, scale, window=window, softcap=softcap)
    if fwd_plan.path == "gluon":
        fwd_plan = plan.plan_forward(q, k, v, causal, scale, window=window, softcap=softcap, path="gluon",
                                     config=fwd_plan.config | dict(tanh_approx=tanh_approx))
    fwd = bench(lambda: launch.forward(fwd_plan, q, k, v, out, lse, causal, scale, window, softcap))
    if not backward:
        return fwd, None
    dout = torch.randn_like(out)
    grads, bwd_plan = gluon_backward(dout, q, k, v, out, lse, causal, window, softcap, tanh_approx, extra)
    c, w = folded(causal, window)
    return fwd, bench(lambda: launch.backward(bwd_plan, dout, q, k, v, out, lse, None, *grads, c, scale, w, softcap))


def flex_times(q, k, v, mask_mod=None, score_mod=None):
    """(forward ms, backward ms) of FlexAttention compiled, with a block mask from mask_mod."""
    if SMOKE:  # its CPU compile takes minutes; the GPU run catches its failures
        return None, None
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, h, n, _ = q.shape
    nk = k.shape[2]
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, n, nk, device=q.device)
    flex = torch.compile(flex_attention, dynamic=False)
    run = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)
    run()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask)
    dout = torch.randn_like(out)
    back = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    return bench(run), bench(back)


def timed(section, name, fn):
    try:
        t0 = time.time()
        fwd, bwd = fn()
        RESULTS["timing"].append(dict(section=section, case=name, fwd_ms=fwd, bwd_ms=bwd, wall_s=time.time() - t0))
        return fwd, bwd
    except Exception as exc:  # noqa: BLE001 - report and go on
        note_error(f"{section}: {name}", exc)
        return None, None


def ratio(a, b):
    return None if a is None or b is None else a / b


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def time_window(dtype):
    b, h, n, w, d = (1, 2, 96, 16, 16) if SMOKE else (2, 16, 32768, 4096, 128)
    q, k, v = make(b, h, h, n, n, d, d, dtype)
    causal = timed("window", f"full causal N{n}", lambda: default_times(q, k, v, True, (-1, -1), 0.0))
    default = timed("window", f"window ({w}, 0) default", lambda: default_times(q, k, v, True, (w, 0), 0.0))
    fused = (None, None) if SMOKE else timed("window", f"window ({w}, 0) gluon bwd dq fused",
                                             lambda: forced_times(q, k, v, True, (w, 0), 0.0,
                                                                  extra=dict(dq_from="fused")))

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= w)

    flex = timed("window", f"flex window ({w}, 0)", lambda: flex_times(q, k, v, mask_mod=sliding))
    work = (min(w + 1, n) * n - min(w + 1, n) * (min(w + 1, n) - 1) / 2) / (n * (n + 1) / 2)
    for i, what in enumerate(("fwd", "bwd")):
        ROWS.append(("time", f"window {w} N{n} {what}",
                     f"default {fmt(default[i])} ms = {fmt(ratio(default[i], causal[i]))} causal (work {work:.3f}); "
                     f"flex {fmt(flex[i])} ms: x flex {fmt(ratio(flex[i], default[i]))} (target >= 1.3); "
                     + (f"bwd dq fused {fmt(fused[1])} ms" if i else
                        f"forced {fmt(fused[0])} ms")))


def time_softcap(dtype):
    q, k, v = make(1, 2, 2, 64, 64, 16, 16, dtype) if SMOKE else make(16, 16, 16, 4096, 4096, 128, 128, dtype)
    plain = timed("softcap", "no softcap causal N4096", lambda: default_times(q, k, v, True, (-1, -1), 0.0))
    default = timed("softcap", "softcap 30 default", lambda: default_times(q, k, v, True, (-1, -1), 30.0))
    approx = (None, None) if SMOKE else timed("softcap", "softcap 30 gluon forced",
                                              lambda: forced_times(q, k, v, True, (-1, -1), 30.0))
    exact = (None, None) if SMOKE else timed("softcap", "softcap 30 gluon exact tanh",
                                             lambda: forced_times(q, k, v, True, (-1, -1), 30.0, tanh_approx=False))

    def cap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 30.0) * 30.0

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    flex = timed("softcap", "flex softcap 30", lambda: flex_times(q, k, v, mask_mod=causal_mask, score_mod=cap))
    for i, what in enumerate(("fwd", "bwd")):
        ROWS.append(("time", f"softcap 30 causal N{q.shape[2]} {what}",
                     f"x no-softcap: default {fmt(ratio(plain[i], default[i]))} "
                     + f"forced {fmt(ratio(plain[i], approx[i]))} "
                     + f"exact tanh {fmt(ratio(plain[i], exact[i]))} (target >= 0.9); "
                     f"flex {fmt(flex[i])} ms, x flex {fmt(ratio(flex[i], default[i]))}"))


def time_varlen(dtype):
    if SMOKE:
        return
    mod = load_varlen_script()
    lengths = mod.long_tailed_lengths(65536)
    if not QUICK:  # the tl path's peers (timed by gpu_varlen.py --quick against the Gluon forward)
        mod.time_packed("packed long-tailed", lengths)
    for row in mod.RESULTS["time"]:
        RESULTS["timing"].append(dict(section="varlen", **row))
        figures = {k_: v_ for k_, v_ in row.items() if isinstance(v_, (int, float))}
        ROWS.append(("time", "varlen packed long-tailed 64K (tl, unchanged)",
                     " ".join(f"{k_} {v_:.3g}" for k_, v_ in figures.items() if "tflops" in k_ or k_.endswith("_ms"))))
    # softcap 30 on the same batch, the varlen kernels' tanh by exp2 (default) and by tanh.approx
    from tilecore.ops.attention_varlen import op as varlen

    cu = mod.cu_of(lengths, device())
    g = torch.Generator(device=device()).manual_seed(3)
    q, k, v = (torch.randn(int(cu[-1]), 16, 128, dtype=dtype, device=device(), generator=g) for _ in range(3))
    times = {}
    for name, cap, approx in (("no softcap", 0.0, None), ("softcap 30 exp2", 30.0, False),
                              ("softcap 30 tanh.approx", 30.0, True)):
        try:
            args = (cu, cu, True, 128 ** -0.5, -1, 0, cap)
            out, lse = varlen.forward_kernels(q, k, v, *args, tanh_approx=approx)
            dout = torch.randn_like(out)
            fwd = bench(lambda: varlen.forward_kernels(q, k, v, *args, out=out, lse=lse, tanh_approx=approx))
            bwd = bench(lambda: varlen.backward_kernels(dout, q, k, v, out, lse, None, *args, tanh_approx=approx))
            times[name] = (fwd, bwd)
            RESULTS["timing"].append(dict(section="varlen", case=f"varlen long-tailed {name}", fwd_ms=fwd, bwd_ms=bwd))
        except Exception as exc:  # noqa: BLE001
            note_error(f"varlen {name}", exc)
    base = times.get("no softcap", (None, None))
    for name in ("softcap 30 exp2", "softcap 30 tanh.approx"):
        t = times.get(name, (None, None))
        ROWS.append(("time", f"varlen long-tailed {name} x no-softcap",
                     f"fwd {fmt(ratio(base[0], t[0]))} bwd {fmt(ratio(base[1], t[1]))}"))


def check_varlen_tanh_approx(dtype) -> None:
    """The varlen kernels' softcap by tanh.approx (VARLEN_TANH_APPROX's candidate) against float64, into
    NaN-poisoned buffers, forward and backward with a window and GQA."""
    from tilecore.ops.attention_varlen import op as varlen
    from tilecore.ops.attention_varlen.reference import varlen_reference

    mod = load_varlen_script()
    lens_q, lens_k, hq, hkv, d = ([7, 1, 0, 20], [9, 5, 3, 20], 2, 1, 16) if SMOKE else (
        [700, 1, 0, 2000], [900, 5, 3, 2000], 16, 4, 128)
    cu_q, cu_k = mod.cu_of(lens_q, device()), mod.cu_of(lens_k, device())
    g = torch.Generator(device=device()).manual_seed(4)
    q = torch.randn(sum(lens_q), hq, d, dtype=dtype, device=device(), generator=g)
    k, v = (torch.randn(sum(lens_k), hkv, d, dtype=dtype, device=device(), generator=g) for _ in range(2))
    args = (cu_q, cu_k, True, d ** -0.5, 100, 0, 20.0)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((hq, q.shape[0]), float("nan"), device=q.device)
    varlen.forward_kernels(q, k, v, *args, out=out, lse=lse, tanh_approx=True)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = varlen_reference(q64, k64, v64, cu_q, cu_k, causal=True, scale=d ** -0.5, window_size=(100, 0),
                                    softcap=20.0)
    dout = torch.randn_like(out)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    varlen.backward_kernels(dout, q, k, v, out, lse, None, *args, grads=grads, tanh_approx=True)
    unwritten = int(out.isnan().sum() + sum(t.isnan().sum() for t in grads))
    err_out = accuracy.error_over_floor(out, ref.detach())
    errs = errors(grads, ref_grads)
    ok = unwritten == 0 and err_out <= 2.0 and max(errs.values()) <= 3.0
    RESULTS["correctness"].append(dict(what="varlen tanh.approx", dtype=str(dtype), ok=ok, unwritten=unwritten,
                                       out_over_floor=err_out, **{f"{k_}_over_floor": v_ for k_, v_ in errs.items()}))
    ROWS.append(("check", f"varlen softcap 20 window tanh.approx {str(dtype)[6:]}",
                 ("ok " if ok else "BAD ") + f"out {err_out:.2f} " + " ".join(f"{k_} {v_:.2f}" for k_, v_ in errs.items())
                 + f" unwritten {unwritten}"))


# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter, tiny shapes, no timing")
    ap.add_argument("--skip", default="", help="comma-separated: checks,window,softcap,varlen")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--budget", type=float, default=200.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--quick", action="store_true",
                    help="<= 90 s: the varlen rows only (tanh.approx checked, softcap 30 timed); budget 75 s")
    ap.add_argument("--cases", default="", help="comma-separated indices of CHECKS to run (default: all)")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if args.quick:
        skip |= {"gluon_checks", "window", "softcap"}
        args.budget = min(args.budget, 75.0)
    cases = CHECKS if not args.cases else [CHECKS[int(i)] for i in args.cases.split(",")]
    t0 = time.time()
    if not args.smoke:
        RESULTS["device"] = torch.cuda.get_device_name()
        RESULTS["torch"] = torch.__version__
    budget = float("inf") if args.smoke else args.budget

    def within_budget(what: str) -> bool:
        if time.time() - t0 < budget:
            return True
        ROWS.append(("skip", what, f"past the {budget:.0f} s budget"))
        return False

    def checks(dtype, cases):
        for case in cases:
            if within_budget(f"check {case[0]} {dtype}"):
                try:
                    check_case(*case, dtype)
                except Exception as exc:  # noqa: BLE001
                    note_error(f"check {case[0]} {dtype}", exc)

    def save():  # after each section: a run cut short keeps what it measured
        RESULTS["wall_s"] = time.time() - t0
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attention_features_s26.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)

    check_dtype = torch.float16 if args.smoke else torch.bfloat16  # the interpreter's bf16 dot is wrong
    if "checks" not in skip:
        if "gluon_checks" not in skip:
            checks(check_dtype, SMOKE_CHECKS if args.smoke else cases)
            save()
        if within_budget("check varlen") and not args.quick:
            check_varlen(check_dtype)
        if within_budget("check varlen tanh.approx"):
            try:
                check_varlen_tanh_approx(check_dtype)
            except Exception as exc:  # noqa: BLE001
                note_error("check varlen tanh.approx", exc)
        save()
    for name, fn in (("window", time_window), ("softcap", time_softcap), ("varlen", time_varlen)):
        if name not in skip and within_budget(f"timing {name}"):
            try:
                fn(torch.float16 if args.smoke else torch.bfloat16)
            except Exception as exc:  # noqa: BLE001
                note_error(name, exc)
            if not args.smoke:
                torch.cuda.empty_cache()
            save()
    if "checks" not in skip and "gluon_checks" not in skip and not args.smoke:
        checks(torch.float16, cases[::3])
    save()
    path = os.path.join(args.out, "attention_features_s26.json")
    print(f"\nwrote {path} ({RESULTS['wall_s']:.0f} s), errors: {len(RESULTS['errors'])}")
    print(f"{'':6} {'case':70} result")
    for section, case, figures in ROWS:
        print(f"{section:6} {case:70} {figures}")


if __name__ == "__main__":
    main()

"""Issue 37, session 40 (helper HF): TCHUNK, the order-3 kernel's chunk transposed (gluon_order3._tchunk: rows k_a, KG
A2 = 64 of them, so KG 4 at 8192 and 2 at 16384; T held as the wgmma's NVMMA tile, stage 1b reading its chunk from there
as the B operand, stages 1b and 3 feeding 3 and 3' as register A operands, D^T and T' back over the chunk: no staging
tile, no -Im F_B), checked against float64 and timed against the shipped order-3 tuples, the op and torch.fft in the
same run.

    PYTHONPATH=. python experiments/fft_conv/gpu_s40.py --n 8192 [--variants t_c64,t_f16] [--conj LABELS]
        [--odd LABELS] [--op t_c64,t_f16] [--rounds 3] [--deadline 100]

B16 H768 bf16 at --n (8192 or 16384); the filter's spectrum precomputed once, complex64 (``c64``) and float16
(``f16``: filter_spectrum(k, n, torch.float16)). Variants (label: the tuple of plan.order3_plan; the shipped launch
is configs.GLUON_ORDER3[n]'s, "f16 shipped" GLUON_ORDER3_HALF[n]'s):
  s39_c64, s39_f16  the tuples shipped before session 40 (untransposed chunks; S39)
  t_c64, t_f16      the programs a SM and warpgroups of those (8192: two programs; 16384: one, two warpgroups a pair)
                    with TCHUNK at KG ORDER3_TCHUNK_KG[n], G1 2, complex64 / float16 bins; t1_c64 at G1 1
  td_*              + DIRECT (1a and 1'a in the wgmmas' own layouts: no layout conversion a column)
  h_c64             the shipped complex64 tuple at RFFT 4: the complex64 spectrum cast a call to float16 bins over
                    each channel's largest |re|, |im| (launch.scaled_half_bins, the cast inside the timed call), the
                    outputs times that value
  (calls 2-3 also timed t4_* / t4d_* at G1 4 and te_* / t4e_* with DIRECT 2, T's side only: both lost and were
  removed, notes/fft_conv; 80f6af9c has both)
* rows "check": each variant's output (y poisoned with NaN first: an element never written shows) on a B2 H64 slice
  against float64, as a multiple of bf16's rounding floor, every element of y written; with --conj the correlation
  (the backward's du: CONJ) of the labels named; with --odd an odd batch (B3) with a NaN in one sequence (that
  sequence NaN, its partner finite); the shipped launch's output too.
* with --op C,F: the op with GLUON_ORDER3[n] = variant C and GLUON_ORDER3_HALF[n] = variant F patched in: its plan,
  its output the same bits as the variant's launch, three calls the same bits, du through its backward vs float64.
* rows "time": interleaved rounds (do_bench medians after warm-up; then from CUDA graphs): torch.fft (rfft, product,
  irfft in float32), the op on c64 (shipped), the shipped launch, each variant's launch; x torch.fft, the ratio to the
  shipped launch on the same spectrum kind (c64: the shipped launch; f16: "f16 shipped"), to s39's of that kind
  where timed, and % of copy (the op's bytes, u + the complex64 spectrum + y, at the anchors' 2,997 GB/s).
Writes $OUT/fft_conv_gpu_s40_<n>.json after every row; prints a short table last. --smoke: the CPU path (torch.fft
plans, tiny shape) to check the script itself.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.common.gpu_script import Run, check, poisoned, same_bits, time_rounds  # noqa: E402
from experiments.fft_conv.gpu_s38 import correlation, inputs  # noqa: E402
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, model  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv.plan import ORDER3_TCHUNK_KG, order3_plan  # noqa: E402
from tilecore.ops.fft_conv.plan import plan as conv_plan  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

TOL = 1.3  # bf16: order 3 at ~1.07x the floor; float16 bins ~+0.01


# the shipped tuples before session 40 (complex64, float16 bins): the untransposed chunks
S39 = {8192: ((2, True, 2, 2), (2, True, 2, 2, 1, 3, True)), 16384: ((1, True, 1, 2, 2), (1, True, 1, 2, 2, 3, True))}


def tuples(n):
    """label -> the order3_plan tuple (configs.GLUON_ORDER3's form) of each variant: t[d]_<c64|f16> = TCHUNK at
    G1 2, d: + DIRECT; s39_<kind>: the tuples shipped before (S39)."""
    per_sm, wg = S39[n][0][0], (S39[n][0][4] if len(S39[n][0]) > 4 else 1)
    kg = ORDER3_TCHUNK_KG[n]
    out = {}
    for direct in (False, True):
        for kind, rfft in (("c64", 2), ("f16", 3)):
            out[f"t{'d' if direct else ''}_{kind}"] = (per_sm, True, kg, 2, wg, rfft, False, True) + ((True,) if direct
                                                                                                    else ())
    out["t1_c64"] = (per_sm, True, kg, 1, wg, 2, False, True)
    # RFFT 4: the complex64 spectrum cast a call to float16 bins over each channel's largest part (the shipped tuple's
    # other fields)
    shipped = configs.GLUON_ORDER3[n]
    out["h_c64"] = (*shipped[:5], 4, *shipped[6:])
    out["s39_c64"], out["s39_f16"] = S39[n]
    return out


def variants(n):
    """label -> (plan, spectrum kind)."""
    out = {"f16 shipped": (order3_plan(n, *configs.GLUON_ORDER3_HALF[n]), "f16")}
    for label, t in tuples(n).items():
        out[label] = (order3_plan(n, *t), "f16" if len(t) > 5 and t[5] == 3 else "c64")
    return out


def op_checks(run, labels, ud, kd, spectra, ref, n):
    """The op with configs.GLUON_ORDER3[n] = variant C and GLUON_ORDER3_HALF[n] = variant F patched in
    (tilecore.tiles.switches.patched; the op's first call under the patch makes its key's plan, so its later calls,
    timed, keep it): its plan, its output the same bits as the variant's launch, three calls the same bits, and du
    (autograd through the op's backward: the CONJ build) against float64 on a B2 H64 slice."""
    c64, f16 = labels
    t = tuples(n)
    with patched(configs, GLUON_ORDER3={**configs.GLUON_ORDER3, n: t[c64]},
                 GLUON_ORDER3_HALF={**configs.GLUON_ORDER3_HALF, n: t[f16]}):
        for label, kind in ((c64, "c64"), (f16, "f16")):
            y = fft_conv(ud, spectra[kind])
            picked = conv_plan(n, ud.device, ud.dtype, kind == "f16")
            again = same_bits([y, y], [fft_conv(ud, spectra[kind]), fft_conv(ud, spectra[kind])])
            want = order3_plan(n, *t[label])
            mine = torch.empty_like(ud)
            conv_launch.launch(want, ud, spectra[kind], mine, False)
            same = same_bits(y, mine)
            r = check(y[:2, :64].cpu(), ref, TOL)
            run.row(f"check op {kind} ({label})", plan_is_variant=picked == want, same_bits_as_launch=same,
                    calls_same_bits=again, **{**r, "pass": r["pass"] and same and again and picked == want})
        g = torch.Generator().manual_seed(5)
        u = torch.randn(2, 64, n, generator=g).to(torch.bfloat16)
        dy = torch.randn(2, 64, n, generator=g).to(torch.bfloat16)
        for kind in ("c64", "f16"):
            x = u.cuda().requires_grad_(True)
            sk = filter_spectrum(kd[:64], n) if kind == "c64" else filter_spectrum(kd[:64], n, torch.float16)
            fft_conv(x, sk).backward(dy.cuda())
            r = check(x.grad.cpu(), correlation(dy.double(), kd[:64].cpu().double()), TOL)
            run.row(f"check op du {kind}", path=conv_plan(n, x.device, x.dtype, kind == "f16").path, **r)


def odd_batch(run, label, p, kind, kd, n):
    """An odd batch (B3: the second pair's half past the batch) with a NaN in sequence (1, 2): that sequence NaN, its
    pair's partner (0, 2) finite, as the float64 reference."""
    g = torch.Generator().manual_seed(3)
    u = torch.randn(3, 4, n, generator=g).to(torch.bfloat16)
    u[1, 2, 100] = float("nan")
    k = kd[:4]
    spectrum = filter_spectrum(k, n) if kind == "c64" else filter_spectrum(k, n, torch.float16)
    ref = fft_conv_reference(u.double(), k.cpu().double())
    y = poisoned(u.cuda())
    conv_launch.launch(p, u.cuda(), spectrum, y, False)
    r = check(y.cpu(), ref, TOL)
    partner = bool(torch.isfinite(y[0, 2]).all())
    run.row(f"check odd+nan {label}", partner_finite=partner, **{**r, "pass": r["pass"] and partner})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--variants", default="t_c64,t_f16")
    ap.add_argument("--conj", default="", help="variant labels whose correlation to check (a compile each)")
    ap.add_argument("--odd", default="", help="variant labels to check on an odd batch with a NaN")
    ap.add_argument("--op", default="", help="C,F: the op with variant C (complex64) and F (float16 bins) patched in")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=100)
    ap.add_argument("--smoke", action="store_true", help="CPU: the script's own path on torch.fft plans")
    a = ap.parse_args()
    n = a.n
    run = Run(f"fft_conv_gpu_s40_{n}", deadline=a.deadline)
    if a.smoke:  # (no GPU: the rows' plumbing only, on the op's CPU path)
        g = torch.Generator().manual_seed(40)
        u = torch.randn(2, 4, 256, generator=g).to(torch.bfloat16)
        k = torch.randn(4, 256, generator=g).to(torch.bfloat16) / 16
        run.row("check smoke op", **check(fft_conv(u, k), fft_conv_reference(u.double(), k.double()), TOL))
        for label, (p, kind) in variants(n).items():
            run.row(f"plan {label}", plan=str(p)[:120], kind=kind)
        t = time_rounds({"op": lambda: fft_conv(u, k)}, rounds=1, deadline=run)
        run.row("time smoke op", ms=t["op_ms"])
        run.finish(["name", "pass", "err_over_floor", "ms"])
        return 0
    B, H = 16, 768
    ref, ref_c, ud, kd, spectra = inputs(n, 40, B, H)
    shipped = conv_plan(n, ud.device, ud.dtype)
    table = variants(n)
    chosen = [("shipped launch", shipped, "c64")]
    chosen += [(label, *table[label]) for label in ["f16 shipped"] + [x for x in a.variants.split(",") if x]]
    conj_of = {x for x in a.conj.split(",") if x}
    run.extra.update(n=n, shipped=str(shipped), variants={label: str(p) for label, p, _ in chosen})
    for label, p, kind in chosen:
        for conj in (False, True) if label in conj_of else (False,):
            def one(label=label, p=p, kind=kind, conj=conj):
                y = poisoned(ud)
                conv_launch.launch(p, ud, spectra[kind], y, conj)
                written = bool(torch.isfinite(y).all())
                r = check(y[:2, :64].cpu(), ref_c if conj else ref, TOL)
                run.row(f"check {label}{' conj' if conj else ''}", all_written=written,
                        **{**r, "pass": r["pass"] and written})
            run.attempt(f"check {label}{' conj' if conj else ''}", one)
    for label in (x for x in a.odd.split(",") if x):
        run.attempt(f"odd {label}", odd_batch, run, label, table[label][0], table[label][1], kd, n)
    if a.op:
        run.attempt("op", op_checks, run, a.op.split(","), ud, kd, spectra, ref, n)
    fns = {"torch.fft": lambda: torch.fft.irfft(torch.fft.rfft(ud.float(), n=2 * n) * spectra["c64"], n=2 * n)[..., :n],
           "op c64": lambda: fft_conv(ud, spectra["c64"])}
    ys = {label: torch.empty_like(ud) for label, _, _ in chosen}
    for label, p, kind in chosen:
        fns[label] = (lambda p=p, kind=kind, y=ys[label]: conv_launch.launch(p, ud, spectra[kind], y, False))
    copy_ms = model.op_bytes(B, H, n) / model.COPY_GBS / 1e6
    kinds = {label: kind for label, _, kind in chosen}

    def rows(t, graph):
        key = "_graph_ms" if graph else "_ms"
        base = t["torch.fft" + key]
        for name in fns:
            ms = t[name + key]
            f16 = kinds.get(name) == "f16"
            peer = "f16 shipped" if f16 else "shipped launch"
            old = ("s39_f16" if f16 else "s39_c64") + key
            run.row(f"time {name}" + (" (graph)" if graph else ""), ms=ms, x_torch_fft=round(base / ms, 3),
                    vs_shipped=round(t[peer + key] / ms, 4), vs_s39=round(t[old] / ms, 4) if old in t else None,
                    pct_copy=round(100 * copy_ms / ms, 1), rounds=t[f"{name}_rounds"])

    run.attempt("time eager", lambda: rows(time_rounds(fns, rounds=a.rounds, deadline=run), False))
    if run.left() > 8:
        run.attempt("time graph", lambda: rows(time_rounds(fns, rounds=2, graph=True, eager=False, deadline=run), True))
    run.finish(["name", "pass", "err_over_floor", "ms", "x_torch_fft", "vs_shipped", "vs_s39", "pct_copy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

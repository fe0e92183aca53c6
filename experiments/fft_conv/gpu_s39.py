"""Issue 37, session 39 (helper HF): LEAN 4 at N = 4096, the chunked kernel's chunk transposed (rows k_a: stage 1's
and stage 3's outputs are the next wgmma's register A operands, a chunk stages one tile in shared memory, not three;
gluon_onepass._transposed_walk), checked against float64 and timed against the shipped kernel, the op and torch.fft
in the same run.

    PYTHONPATH=. python experiments/fft_conv/gpu_s39.py [--variants c64_k0,f16_k0] [--conj LABELS] [--rounds 3]
        [--no-half] [--op c64_k0,f16_k0] [--odd LABELS]

B16 H768 bf16 at 4096; the filter's spectrum precomputed once, complex64 (``c64``) and float16 (``f16``:
filter_spectrum(k, n, torch.float16)). Variants (label: the LEAN 4 tuple's spectrum and KPRE): c64_k0, c64_k1 (RFFT 2,
complex64 bins), f16_k0, f16_k1 (RFFT 3, float16 bins). Call 5 also ran c64_c32 / f16_c32, the chunks of 32 shipped
before LEAN 4 (removed after it: 74581689 has them); from call 4 "shipped launch" and the op are c64_k0's / f16_k0's.
* rows "check": each variant's output (y poisoned with NaN first: an element never written shows) on a B2 H64 slice
  against float64, as a multiple of bf16's rounding floor, every element of y written; with --conj the correlation
  (the backward's du: CONJ) of the labels named (a compile each); the shipped launch's output too.
* with --op C,F (device call 4): the op with configs.GLUON_ONEPASS[4096] = variant C and GLUON_ONEPASS_HALF[4096] = variant F
  patched in (tilecore.tiles.switches.patched; the op's first call under the patch makes its key's plan, so its later
  calls, timed, keep it): its plan, its output the same bits as the variant's launch, three calls the same bits, and
  its du (autograd through the op's backward: the CONJ build) against float64 on a B2 H64 slice; "op c64" / "op f16"
  are then the op on those tuples (the shipped op before them: the shipped launch's row, within 1% of it in call 3).
* with --odd: an odd batch (B3, the last pair's half past the batch) with a NaN in one sequence, each label's launch
  against float64 (the NaN's sequence NaN, its pair's partner finite); and the same u with rows N + 1 apart (not
  TMA-describable: u and y by pointers).
* with --step: the training step as shipped, fft_conv(u, k) forward + backward (du and dk: the filter's gradient by
  configs.DK_CONFIGS' kernel at 4096) against torch.fft's autograd (rfft, product, irfft in float32) in interleaved
  rounds; du and dk first checked against float64 autograd on a B2 H64 slice.
* rows "time": interleaved rounds (do_bench medians after warm-up, and from CUDA graphs: other lanes' compiles disturb
  eager times): torch.fft (rfft, product, irfft in float32), the op on c64 (shipped), the op on f16 (shipped
  GLUON_ONEPASS_HALF; --no-half leaves it out: one compile less), the shipped launch, each variant's launch; x
  torch.fft, the ratio to the op on the same spectrum, and % of copy (the op's bytes, u + the complex64 spectrum + y,
  at the anchors' 2,997 GB/s).
Writes $OUT/fft_conv_gpu_s39.json after every row; prints a short table last.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402
from experiments.common.gpu_script import same_bits  # noqa: E402
from experiments.fft_conv.gpu_s38 import check_launches, correlation, inputs  # noqa: E402
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, model  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv.plan import gluon_plan  # noqa: E402
from tilecore.ops.fft_conv.plan import plan as conv_plan  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

TOL = 1.3  # bf16: order 2 at ~1.04x the floor; float16 bins ~+0.01
N = 4096
# the LEAN 4 tuples: (A, B, per_sm, ASYNC, TMA, CHUNK, RFFT, WARPGROUPS, warps, TW_SFU, CONTIG, KPRE, YALIAS, LEAN)
VARIANTS = {f"{kind}_k{kpre}": (128, 64, 1, True, True, 64, 2 if kind == "c64" else 3, 2, 4, True, 2, kpre, True, 5)
            for kind in ("c64", "f16") for kpre in (0, 1)}



def odd_batch(run, label, p, kind, kd, n):
    """An odd batch (B3: the second pair's half past the batch, TMA's zeros) with a NaN in sequence (1, 2): that
    sequence NaN, its pair's partner (0, 2) finite, as the float64 reference."""
    g = torch.Generator().manual_seed(3)
    u = torch.randn(3, 4, n, generator=g).to(torch.bfloat16)
    u[1, 2, 100] = float("nan")
    k = kd[:4]
    spectrum = filter_spectrum(k, n) if kind == "c64" else filter_spectrum(k, n, torch.float16)
    y = poisoned(u.cuda())
    conv_launch.launch(p, u.cuda(), spectrum, y, False)
    ref = fft_conv_reference(u.double(), k.cpu().double())
    r = check(y.cpu(), ref, TOL)
    partner = bool(torch.isfinite(y[0, 2]).all())
    run.row(f"check odd+nan {label}", partner_finite=partner, **{**r, "pass": r["pass"] and partner})
    # u's rows 2 (N + 1) bytes apart: not TMA-describable, so the launch takes u and y by pointers (the same kernel's
    # pointer path)
    wide = torch.zeros(3, 4, n + 1, dtype=torch.bfloat16, device="cuda")
    wide[..., 1:] = u.cuda()
    y = poisoned(wide[..., 1:])
    conv_launch.launch(p, wide[..., 1:], spectrum, y, False)
    r = check(y.cpu(), ref, TOL)
    run.row(f"check pointers {label}", **r)


def op_checks(run, labels, ud, kd, spectra):
    """The op on the patched tuples (see the docstring): plan, same bits, three calls, du through the backward."""
    c64, f16 = labels
    tuples = dict(GLUON_ONEPASS={**configs.GLUON_ONEPASS, N: VARIANTS[c64]},
                  GLUON_ONEPASS_HALF={**configs.GLUON_ONEPASS_HALF, N: VARIANTS[f16]})
    n = N
    with patched(configs, **tuples):
        for label, kind in ((c64, "c64"), (f16, "f16")):
            y = fft_conv(ud, spectra[kind])
            picked = conv_plan(n, ud.device, ud.dtype, kind == "f16")
            again = same_bits([y, y], [fft_conv(ud, spectra[kind]), fft_conv(ud, spectra[kind])])
            want = gluon_plan(*VARIANTS[label])
            mine = torch.empty_like(ud)
            conv_launch.launch(want, ud, spectra[kind], mine, False)
            same = same_bits(y, mine)
            ref = fft_conv_reference(ud[:2, :64].cpu().double(), kd[:64].cpu().double())
            r = check(y[:2, :64].cpu(), ref, TOL)
            run.row(f"check op {kind} ({label})", plan_is_variant=picked == want, same_bits_as_launch=same,
                    calls_same_bits=again, **{**r, "pass": r["pass"] and same and again and picked == want})
        # du through the op's backward (the correlation with k: the CONJ build), on a slice planned under the patch
        g = torch.Generator().manual_seed(5)
        u = torch.randn(2, 64, n, generator=g).to(torch.bfloat16)
        dy = torch.randn(2, 64, n, generator=g).to(torch.bfloat16)
        for kind in ("c64", "f16"):
            x = u.cuda().requires_grad_(True)
            sk = filter_spectrum(kd[:64], n) if kind == "c64" else filter_spectrum(kd[:64], n, torch.float16)
            fft_conv(x, sk).backward(dy.cuda())
            r = check(x.grad.cpu(), correlation(dy.double(), kd[:64].cpu().double()), TOL)
            run.row(f"check op du {kind}", path=conv_plan(n, x.device, x.dtype, kind == "f16").path, **r)


def step(run, ud, kd, n):
    """The training step (see the docstring): du, dk checked on a slice, then timed against torch.fft's autograd."""
    g = torch.Generator().manual_seed(7)
    dy = torch.randn(ud.shape, generator=g).to(torch.bfloat16).cuda()
    u64 = ud[:2, :64].cpu().double().requires_grad_()
    k64 = kd[:64].cpu().double().requires_grad_()
    ref_du, ref_dk = torch.autograd.grad(fft_conv_reference(u64, k64), (u64, k64), dy[:2, :64].cpu().double())
    us = ud[:2, :64].clone().requires_grad_()
    ks = kd[:64].clone().requires_grad_()
    du, dk = torch.autograd.grad(fft_conv(us, ks), (us, ks), dy[:2, :64])
    run.row("check step du", **check(du.cpu(), ref_du, TOL))
    run.row("check step dk", **check(dk.cpu(), ref_dk, TOL))
    uf = ud.clone().requires_grad_()
    kf = kd.clone().requires_grad_()

    def torch_step():
        y = torch.fft.irfft(torch.fft.rfft(uf.float(), n=2 * n) * torch.fft.rfft(kf.float(), n=2 * n),
                            n=2 * n)[..., :n].to(uf.dtype)
        return torch.autograd.grad(y, (uf, kf), dy)

    t = time_rounds({"ours": lambda: torch.autograd.grad(fft_conv(uf, kf), (uf, kf), dy), "torch": torch_step},
                    rounds=2, deadline=run)
    run.row("time step fwd+bwd", ms=t["ours_ms"], torch_ms=t["torch_ms"], x_torch_fft=round(t["torch_ms"] / t["ours_ms"], 3),
            rounds=t["ours_rounds"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="c64_k1,f16_k0")
    ap.add_argument("--conj", default="", help="variant labels whose correlation to check (a compile each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-half", action="store_true", help="leave the op on the float16 spectrum out")
    ap.add_argument("--op", default="", help="C,F: the op with variant C (complex64) and F (float16 bins) patched in")
    ap.add_argument("--odd", default="", help="variant labels to check on an odd batch with a NaN")
    ap.add_argument("--step", action="store_true", help="also the training step (forward + backward) as shipped")
    a = ap.parse_args()
    run = Run("fft_conv_gpu_s39", deadline=55)
    B, H, n = 16, 768, N
    ref, ref_c, ud, kd, spectra = inputs(n, 39, B, H)
    shipped = conv_plan(n, ud.device, ud.dtype)
    variants = [("shipped launch", shipped, "c64")]
    variants += [(label, gluon_plan(*VARIANTS[label]), label[:3]) for label in a.variants.split(",") if label]
    conj_of = {x for x in a.conj.split(",") if x}
    run.extra.update(n=n, shipped=str(shipped), variants={lab: VARIANTS[lab] for lab, _, _ in variants[1:]})
    check_launches(run, variants, conj_of, ud, spectra, ref, ref_c, TOL)
    for label in (x for x in a.odd.split(",") if x):
        run.attempt(f"odd {label}", odd_batch, run, label, gluon_plan(*VARIANTS[label]), label[:3], kd, n)
    if a.op:
        run.attempt("op", op_checks, run, a.op.split(","), ud, kd, spectra)
    fns = {"torch.fft": lambda: torch.fft.irfft(torch.fft.rfft(ud.float(), n=2 * n) * spectra["c64"], n=2 * n)[..., :n],
           "op c64": lambda: fft_conv(ud, spectra["c64"])}
    if not a.no_half:
        fns["op f16"] = lambda: fft_conv(ud, spectra["f16"])
    ys = {label: torch.empty_like(ud) for label, _, _ in variants}
    for label, p, kind in variants:
        fns[label] = (lambda p=p, kind=kind, y=ys[label]: conv_launch.launch(p, ud, spectra[kind], y, False))
    copy_ms = model.op_bytes(B, H, n) / model.COPY_GBS / 1e6
    kinds = {"op f16": "f16", **{label: kind for label, _, kind in variants}}

    def rows(t, graph):
        key = "_graph_ms" if graph else "_ms"
        base = t["torch.fft" + key]
        for name in fns:
            ms = t[name + key]
            op = t[("op f16" if kinds.get(name) == "f16" and "op f16" + key in t else "op c64") + key]
            run.row(f"time {name}" + (" (graph)" if graph else ""), ms=ms, x_torch_fft=round(base / ms, 3),
                    vs_op=round(op / ms, 4), pct_copy=round(100 * copy_ms / ms, 1),
                    rounds=t[f"{name}_rounds"])

    if a.step:
        run.attempt("step", step, run, ud, kd, n)
    run.attempt("time eager", lambda: rows(time_rounds(fns, rounds=a.rounds, deadline=run), False))
    if run.left() > 6:
        run.attempt("time graph", lambda: rows(time_rounds(fns, rounds=2, graph=True, eager=False, deadline=run), True))
    run.finish(["name", "pass", "err_over_floor", "ms", "x_torch_fft", "vs_op", "pct_copy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 37, session 38 (helper HF): the float16 filter spectrum (filter_spectrum(k, n, torch.float16), kept by the
caller) through the op, each checked against float64 and timed against the shipped path and torch.fft in the same run.

    PYTHONPATH=. python experiments/fft_conv/gpu_s38.py [--sizes 1024,4096] [--rounds 3] [--only LABELS]
        [--conj LABELS] [--min-left S]
    (sizes: 1024, 2048, 4096: each has float16-bin candidates; the order-3 sizes: gpu_order3.py)

Per size (B16 H768 bf16; the filter's spectrum precomputed once, complex64 ``c64`` and float16 ``f16``):
* rows "check": every variant's output (y poisoned with NaN first, so an element never written shows) on a B2 H64
  slice against float64 (the error as a multiple of bf16's rounding floor; every element of y written), the
  convolution and the correlation (the backward's du: the kernel with CONJ); the op with the float16 spectrum under
  the HALF table patched in (tilecore.tiles.switches.patched): its path, the same bits as the candidate's launch;
* rows "time": interleaved rounds (do_bench medians after warm-up; and from CUDA graphs, as the GPU is shared by
  other lanes): torch.fft (rfft, product, irfft in float32), the shipped op on c64, the op on f16 with the shipped
  tables (padded rows: "op f16 widened", to complex64 a call, where no HALF entry has n, else "op f16 padded rows":
  the HALF entry reading the padded rows as they are), the op on f16
  with the HALF entry (or candidate, patched in; three calls the same bits), the shipped
  plan's launch alone, and every candidate's launch; x torch.fft and % of copy (the op's bytes, u + the spectrum +
  y, at the anchors' 2,997 GB/s) printed.
Candidates: configs.GLUON_ONEPASS_HALF_CANDIDATES (the order-3 candidates of session 38 were removed in session 41:
4e2506ec has them); the shipped plan's correlation is not rebuilt (a compile each).
Writes $OUT/fft_conv_gpu_s38.json (after every row); prints a short table last.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.common.gpu_script import Run, check, poisoned, same_bits, time_rounds  # noqa: E402
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, model  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv.plan import gluon_plan  # noqa: E402
from tilecore.ops.fft_conv.plan import plan as conv_plan  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

TOL = 1.3  # bf16: order 2 at ~1.04x the floor, order 3 ~1.07x; one rounding of K more (float16 bins) ~+0.01


def correlation(u64, k64):
    n = u64.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u64, n=2 * n) * torch.fft.rfft(k64, n=2 * n).conj(), n=2 * n)[..., :n]


def check_launches(run, chosen, conj_of, ud, spectra, ref, ref_c, tol=TOL):
    """Each (label, plan, spectrum kind) of ``chosen`` launched on u (y poisoned first: an element never written
    shows), its B2 H64 slice against float64 as a row "check <label>"; the labels in ``conj_of`` also as the
    correlation (the backward's du: CONJ). (gpu_s39.py and gpu_order3.py take it too.)"""
    for label, p, kind in chosen:
        for conj in (False, True) if label in conj_of else (False,):
            def one(label=label, p=p, kind=kind, conj=conj):
                y = poisoned(ud)
                conv_launch.launch(p, ud, spectra[kind], y, conj)
                written = bool(torch.isfinite(y).all())
                r = check(y[:2, :64].cpu(), ref_c if conj else ref, tol)
                run.row(f"check {label}{' conj' if conj else ''}", all_written=written,
                        **{**r, "pass": r["pass"] and written})
            run.attempt(f"check {label}{' conj' if conj else ''}", one)


def candidates(n):
    """(label, plan, spectrum kind) of each variant at n: the shipped plan on complex64 bins first."""
    out = [("shipped launch", conv_plan(n, torch.device("cuda"), torch.bfloat16), "c64")]
    for c in configs.GLUON_ONEPASS_HALF_CANDIDATES.get(n, []):
        out.append((f"half rfft3 kpre{c[11]}", gluon_plan(*c), "f16"))
    return out


def half_switch(n, plan_tuple):
    if n in configs.GLUON_ORDER3:
        return patched(configs, GLUON_ORDER3_HALF={**configs.GLUON_ORDER3_HALF, n: tuple(plan_tuple)})
    return patched(configs, GLUON_ONEPASS_HALF={**configs.GLUON_ONEPASS_HALF, n: tuple(plan_tuple)})


def inputs(n, seed, B=16, H=768):
    """B16 H768 bf16 u and a filter whose spectrum peaks away from chunk 0's bins (a chunked kernel's running scale
    grows); the float64 convolution and correlation of a B2 H64 slice; u and k on the GPU; k's spectrum complex64
    ("c64") and float16 ("f16"). (gpu_s39.py takes them too.)"""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(B, H, n, generator=g).to(torch.bfloat16)
    k = (torch.randn(H, n, generator=g) * torch.cos(torch.arange(n) * 2.9) / math.sqrt(n)).to(torch.bfloat16)
    ref = fft_conv_reference(u[:2, :64].double(), k[:64].double())
    ref_c = correlation(u[:2, :64].double(), k[:64].double())
    ud, kd = u.cuda(), k.cuda()
    spectra = {"c64": filter_spectrum(kd, n), "f16": filter_spectrum(kd, n, torch.float16)}
    return ref, ref_c, ud, kd, spectra


def size(run, n, rounds, only=None, conj_of=None):
    B, H = 16, 768
    ref, ref_c, ud, kd, spectra = inputs(n, n + 38, B, H)
    # the widened op's spectrum: a float16 view with padded rows (another signature than f16's: its own op plan); where
    # a HALF entry has n the op runs that entry on the padded rows as they are (launch.half_bins keeps a view whose bins
    # are contiguous), else widens them to complex64 a call
    wide_label = "op f16 padded rows" if n in configs.GLUON_ORDER3_HALF or n in configs.GLUON_ONEPASS_HALF else "op f16 widened"
    wide = torch.zeros(H, n + 2, 2, dtype=torch.float16, device="cuda")
    wide[:, :n + 1] = spectra["f16"]
    strided = wide[:, :n + 1]
    variants = [v for v in candidates(n) if only is None or v[0] == "shipped launch" or v[0] in only]
    outs = {}
    for label, p, kind in variants:
        checked = label == "shipped launch" or (conj_of is not None and label not in conj_of)
        for conj in ((False,) if checked else (False, True)):  # (each conj build: a compile)
            y = poisoned(ud)
            conv_launch.launch(p, ud, spectra[kind], y, conj)
            written = bool(torch.isfinite(y).all())
            r = check(y[:2, :64].cpu(), ref_c if conj else ref, TOL)
            run.row(f"check {n} {label}{' conj' if conj else ''}", path=p.path, all_written=written,
                    **{**r, "pass": r["pass"] and written})
            if not conj:
                outs[label] = y
    # the op on the float16 spectrum: the shipped HALF table's tuple, else the first candidate patched in (its first
    # call makes the key's plan)
    half_tuple = (configs.GLUON_ORDER3_HALF.get(n) or configs.GLUON_ONEPASS_HALF.get(n)
                  or (configs.GLUON_ONEPASS_HALF_CANDIDATES.get(n) or [None])[0])
    fns = {"torch.fft": lambda: torch.fft.irfft(torch.fft.rfft(ud.float(), n=2 * n) * spectra["c64"], n=2 * n)[..., :n],
           "op c64": lambda: fft_conv(ud, spectra["c64"]),
           wide_label: lambda: fft_conv(ud, strided)}
    if half_tuple is not None:
        with half_switch(n, half_tuple):
            y_op = fft_conv(ud, spectra["f16"])
            picked = conv_plan(n, ud.device, ud.dtype, True)
        # (calls 2 and 3 go by the key's kept launch, _GluonConv where the path is "gluon": the same bits)
        again = same_bits([y_op, y_op], [fft_conv(ud, spectra["f16"]), fft_conv(ud, spectra["f16"])])
        cand = next((lab for lab, p, kind in variants if p == picked), None)
        same = same_bits(y_op, outs[cand]) if cand else None  # (None: that tuple's launch not among the variants)
        r = check(y_op[:2, :64].cpu(), ref, TOL)
        run.row(f"check {n} op f16 half", path=picked.path, rfft=picked.rfft, same_bits_as_launch=same,
                calls_same_bits=again, **{**r, "pass": r["pass"] and same is not False and again and picked.rfft == 3})
        fns["op f16 half"] = lambda: fft_conv(ud, spectra["f16"])
    y_w = fft_conv(ud, strided)
    run.row(f"check {n} {wide_label}", **check(y_w[:2, :64].cpu(), ref, TOL))
    ys = {label: torch.empty_like(ud) for label, _, _ in variants}
    for label, p, kind in variants:
        fns[label] = (lambda p=p, kind=kind, y=ys[label]: conv_launch.launch(p, ud, spectra[kind], y, False))
    copy_ms = model.op_bytes(B, H, n) / model.COPY_GBS / 1e6  # (u and y bf16, the spectrum complex64: the bytes)

    def rows(t, kind):
        key = "_graph_ms" if kind == "graph" else "_ms"
        base, shipped = t["torch.fft" + key], t["op c64" + key]
        for name in fns:
            ms = t[name + key]
            run.row(f"time {n} {name}" + (" (graph)" if kind == "graph" else ""), ms=ms, x_torch_fft=round(base / ms, 3),
                    vs_op=round(shipped / ms, 4), pct_copy=round(100 * copy_ms / ms, 1), rounds=t[f"{name}_rounds"])

    rows(time_rounds(fns, rounds=rounds, deadline=run), "eager")
    if run.left() > 8:  # (CUDA graphs: GPU time without the host's launches; other lanes' compiles disturb eager times)
        run.attempt(f"graph {n}", lambda: rows(time_rounds(fns, rounds=2, graph=True, eager=False, deadline=run), "graph"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="candidate labels to run (comma-separated, _ for a space; the shipped launch always)")
    ap.add_argument("--conj", help="candidate labels whose correlation to check (default: every candidate's)")
    ap.add_argument("--min-left", type=float, default=30, help="seconds left before the deadline to start a later size")
    a = ap.parse_args()
    run = Run("fft_conv_gpu_s38", deadline=55)
    # (labels with "_" for their spaces: half_rfft3_kpre3)
    only = {x.replace("_", " ") for x in a.only.split(",")} if a.only else None
    conj_of = {x.replace("_", " ") for x in a.conj.split(",") if x} if a.conj is not None else None
    for i, n in enumerate(int(s) for s in a.sizes.split(",")):
        if run.left() > (15 if i == 0 else a.min_left):  # (a later size's compiles must fit before the job's limit)
            run.attempt(f"size {n}", size, run, n, a.rounds, only, conj_of)
        else:
            run.say(f"size {n} skipped: {run.left():.0f} s left")
    run.finish(["name", "pass", "err_over_floor", "same_bits_as_launch", "ms", "x_torch_fft", "vs_op", "pct_copy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

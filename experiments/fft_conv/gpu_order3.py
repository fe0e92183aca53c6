"""Issue 37: the order-3 one-pass Gluon kernel (gluon_order3.py) at 8192 / 16384, checked against float64 and timed
against torch.fft, a measured copy and the shipped tuples in the same run; ``--profile``: where its time goes (ncu's
warp-state sampling by SASS instruction, where the device has ncu and lets it count).

    PYTHONPATH=. python experiments/fft_conv/gpu_order3.py --n 8192 [--variants c64,f16] [--conj c64,f16]
        [--odd c64] [--op] [--rounds 3] [--deadline 100]
    PYTHONPATH=. python experiments/fft_conv/gpu_order3.py --n 8192 --profile [--variants c64]   (under ncu: see
        --ncu, which runs ncu on this script and writes the summary)
    PYTHONPATH=. python experiments/fft_conv/gpu_order3.py --n 8192 --ncu c64 [--deadline 150]

B16 H768 bf16 at --n (8192 or 16384); the filter's spectrum precomputed once, complex64 (``c64``) and float16
(``f16``: filter_spectrum(k, n, torch.float16)). Variants (label: a plan.order3_plan tuple and its spectrum kind):
  c64   configs.GLUON_ORDER3[n] (the shipped launch: RFFT 4, the complex64 spectrum cast a call to scaled float16 bins)
  f16   configs.GLUON_ORDER3_HALF[n] (RFFT 3: a float16 spectrum's bins as they are)
  c64_k, f16_k  (8192) c64 / f16 with KFULL toggled (on at 8192 since session 43: the bins laid out a call as the
        chunks read them, launch.laid_half_bins, one kernel: c64 at RFFT 4's scaled bits, f16 as they are; each chunk's
        bins eight 16-byte loads a thread instead of 32 4-byte gathers); the timing adds the casts alone: "bins torch"
        (reference.scaled_half_bins, the five torch passes RFFT 4 made until session 43), "bins fused"
        (launch.scaled_half_bins), "bins laid c64" / "bins laid f16" (launch.laid_half_bins)
  (session 43, call 1 timed c64_f, RFFT 4's cast by one kernel against the torch passes: 8f5c0c8d's script has it; a
  layout probe by windows of f gathered in registers (tl.gather) was not run: 15.8 KB of spill at 32 registers)
  (session 44: call 1 timed c64_h / f16_h, KFULL's layout by a program a half row against the index table's gather,
  shipped since, and c64_hp / f16_hp with PREFETCH too, 7a350e78's script; call 2 PREFETCH at 16384 as c64_p /
  f16_p, d677f602's)
  c64_s, f16_s  (8192) c64 / f16 with STACK toggled (on since session 42: 1a / 1'a four columns a2 a product against F2
                in the wgmmas' layouts, u read once a pair; off: the columns two a wait, layout conversions)
  (session 42, calls 1-2 timed STACK's forms 1 / 2 / 3 as c64_s1 ... and WARPIO beside STACK as c64_s3t: eeea21c3 /
  d3087a39 have them; call 5 1a / 1'a in the wgmma layouts at 16384 as c64_w / f16_w: 3abf8d24, and the layout
  conversions it replaced; session 41: c64_1, c64_v / f16_v, c64_w / f16_w)
  (session 41: call 3 timed c64_1, 8192 at one program a SM, 0.69x, and c64_v / f16_v, the 8-byte u / y accesses,
  shipped since; jobs hf_s41c / hf_s41d c64_o / f16_o, the tuples before them: dc82cd0b's script has them)
* rows "check": each variant's output (y poisoned with NaN first: an element never written shows) on a B2 H64 slice
  against float64, as a multiple of bf16's rounding floor, every element of y written; with --conj the correlation
  (the backward's du: CONJ) of the labels named; with --odd an odd batch (B3) with a NaN in one sequence (that
  sequence NaN, its partner finite).
* with --op: the op on each spectrum kind: its plan is the variant's, its output the same bits as the variant's
  launch, three calls the same bits; du and dk through its backward (B2 H64) against float64 (dk: the filter's
  gradient, torch.fft's at these N, rounded to k's bf16). --op-as SUFFIX: the same with the variants c64SUFFIX /
  f16SUFFIX patched into configs (switches.patched; the op's plan memo keys on the switches' generation). --fp16:
  float16 u through the op (both spectrum kinds), y and du against float64 at float16's floor (tolerance 4x).
* rows "time": interleaved rounds (do_bench medians after warm-up; then from CUDA graphs): torch.fft (rfft, product,
  irfft in float32), the op on c64 and f16, each variant's launch, a copy of u into y (y.copy_(u): 2 |u| bytes);
  x torch.fft, the ratio to the shipped launch of its kind, % of copy (the op's bytes, u + the complex64 spectrum + y,
  at the anchors' 2,997 GB/s) and % of the measured copy's rate.
Writes $OUT/fft_conv_gpu_order3_<n>.json after every row; prints a short table last. --smoke: the CPU path (torch.fft
plans, tiny shape) to check the script itself.
"""
import argparse
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.common.gpu_script import Run, check, poisoned, same_bits, time_rounds  # noqa: E402
from experiments.fft_conv.gpu_s38 import check_launches, correlation, inputs  # noqa: E402
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, model  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv.plan import order3_plan  # noqa: E402
from tilecore.ops.fft_conv.plan import plan as conv_plan  # noqa: E402
from tilecore.ops.fft_conv.reference import scaled_half_bins  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

TOL = 1.3  # bf16: order 3 at ~1.07x the floor; float16 bins ~+0.01
TOL_FP16 = 4.0  # fp16 u: order 3 at ~3.0-3.2x float16's floor (the emulation, session 34's run)


def tuples(n):
    """label -> (the order3_plan tuple, spectrum kind) of each variant."""
    out = {"c64": (configs.GLUON_ORDER3[n], "c64"), "f16": (configs.GLUON_ORDER3_HALF[n], "f16")}
    for label in ("c64", "f16"):
        t = tuple(out[label][0]) + (False,) * (4 - len(out[label][0]))  # (per_sm, warpgroups, rfft, stack)
        if n == 8192:  # STACK toggled (it takes F2 = F_16 four times on the diagonal: 8192 only)
            out[label + "_s"] = (t[:3] + (not t[3],) + t[4:], label)
    for label in ("c64", "f16"):
        t = tuple(out[label][0]) + (False,) * (5 - len(out[label][0]))
        if n == 8192:  # KFULL toggled (the bins laid out a call as the chunks read them: 16-byte loads; 8192 only)
            out[label + "_k"] = (t[:4] + (not t[4],), label)
    return out


def variants(n):
    """label -> (plan, spectrum kind)."""
    return {label: (order3_plan(n, *t), kind) for label, (t, kind) in tuples(n).items()}


def dk_reference(u64, dy64, filter_len):
    """dL/dk of y = causal conv(u, k) for the loss <dy, y>: sum over the batch of the correlation of dy with u."""
    n = u64.shape[-1]
    cross = (torch.fft.rfft(dy64, n=2 * n) * torch.fft.rfft(u64, n=2 * n).conj()).sum(0)
    return torch.fft.irfft(cross, n=2 * n)[:, :filter_len]


def op_checks(run, ud, kd, spectra, ref, n, suffix=""):
    """The op on each spectrum kind: its plan is the shipped tuple's (``suffix``: the variant c64<suffix> /
    f16<suffix>'s, its tuples patched into configs.GLUON_ORDER3 / _HALF for the block), its output the same bits as
    that launch, three calls the same bits; du and dk through its backward against float64 (B2 H64)."""
    table = variants(n)
    if suffix:  # (a suffix only one spectrum kind has, c64_f: the other kind's shipped tuple)
        t = tuples(n)
        with patched(configs, GLUON_ORDER3={**configs.GLUON_ORDER3, n: t.get("c64" + suffix, t["c64"])[0]},
                     GLUON_ORDER3_HALF={**configs.GLUON_ORDER3_HALF, n: t.get("f16" + suffix, t["f16"])[0]}):
            return _op_checks(run, ud, kd, spectra, ref, n, table, suffix)
    return _op_checks(run, ud, kd, spectra, ref, n, table, suffix)


def _op_checks(run, ud, kd, spectra, ref, n, table, suffix):
    for label in (x + suffix if x + suffix in table else x for x in ("c64", "f16")):
        p, kind = table[label]
        y = fft_conv(ud, spectra[kind])
        picked = conv_plan(n, ud.device, ud.dtype, kind == "f16")
        again = same_bits([y, y], [fft_conv(ud, spectra[kind]), fft_conv(ud, spectra[kind])])
        mine = torch.empty_like(ud)
        conv_launch.launch(p, ud, spectra[kind], mine, False)
        same = same_bits(y, mine)
        r = check(y[:2, :64].cpu(), ref, TOL)
        run.row(f"check op {label}", plan_is_variant=picked == p, same_bits_as_launch=same, calls_same_bits=again,
                **{**r, "pass": r["pass"] and same and again and picked == p})
    g = torch.Generator().manual_seed(5)
    u = torch.randn(2, 64, n, generator=g).to(torch.bfloat16)
    dy = torch.randn(2, 64, n, generator=g).to(torch.bfloat16)
    for kind in ("c64", "f16"):
        x = u.cuda().requires_grad_(True)
        k = kd[:64].clone().requires_grad_(True)
        sk = filter_spectrum(k, n) if kind == "c64" else filter_spectrum(k, n, torch.float16)
        fft_conv(x, sk).backward(dy.cuda())
        r = check(x.grad.cpu(), correlation(dy.double(), kd[:64].cpu().double()), TOL)
        picked = conv_plan(n, x.device, x.dtype, kind == "f16")
        run.row(f"check op du {kind}{suffix}", path=picked.path, stack=picked.stack, **r)
        r = check(k.grad.cpu(), dk_reference(u.double(), dy.double(), n), TOL)
        run.row(f"check op dk {kind}{suffix}", dtype=str(k.grad.dtype), **r)


def same_launch_bits(run, first, second, table, ud, spectra):
    """The launches of labels ``first`` and ``second`` on the whole B16 H768 u (each y poisoned first): the same bits
    (a variant that changes no arithmetic), else their largest difference over the first's largest |y| (another build
    may fuse other multiply-adds: ptxas contracts PTX's mul and add)."""
    ys = []
    for label in (first, second):
        p, kind = table[label]
        y = poisoned(ud)
        conv_launch.launch(p, ud, spectra[kind], y, False)
        ys.append(y)
    diff = float((ys[0].float() - ys[1].float()).abs().max() / ys[0].float().abs().max())
    run.row(f"same {first}:{second}", **{"pass": same_bits(ys[0], ys[1]), "max_diff_rel": diff})


def fp16_checks(run, n):
    """float16 u through the op (its shipped plan, both spectrum kinds; B2 H64, y poisoned first), y and du against
    float64, with float16's floor (order 3 ~3x it: one float16 rounding of T more than order 2)."""
    g = torch.Generator().manual_seed(16)
    u = torch.randn(2, 64, n, generator=g).to(torch.float16)
    k = (torch.randn(64, n, generator=g) / math.sqrt(n)).to(torch.float16)
    dy = torch.randn(2, 64, n, generator=g).to(torch.float16)
    ref = fft_conv_reference(u.double(), k.double())
    ref_du = correlation(dy.double(), k.double())
    for kind in ("c64", "f16"):
        x = u.cuda().detach().requires_grad_(True)  # (a fresh leaf each kind)
        kk = k.cuda()
        sk = filter_spectrum(kk, n) if kind == "c64" else filter_spectrum(kk, n, torch.float16)
        y = fft_conv(x, sk)
        y.backward(dy.cuda())
        picked = conv_plan(n, x.device, x.dtype, kind == "f16")
        run.row(f"check fp16 op {kind}", path=picked.path, stack=picked.stack, **check(y.detach().cpu(), ref, TOL_FP16))
        run.row(f"check fp16 op du {kind}", **check(x.grad.cpu(), ref_du, TOL_FP16))


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


def profile(n, labels, calls=3):
    """The variants' launches, ``calls`` each, nothing else on the GPU between them (what ncu captures)."""
    B, H = 16, 768
    _, _, ud, _, spectra = inputs(n, 40, B, H)
    table = variants(n)
    y = torch.empty_like(ud)
    for label in labels:
        p, kind = table[label]
        for _ in range(calls):
            conv_launch.launch(p, ud, spectra[kind], y, False)
    torch.cuda.synchronize()


STALLS = [f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in (
    "barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "wait", "math_pipe_throttle", "dispatch_stall",
    "lg_throttle", "membar", "not_selected", "selected", "sleeping", "tex_throttle", "no_instruction", "drain",
    "branch_resolving", "misc")] + ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                                     "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
                                     "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
                                     "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"]


def _rows(text):
    """The rows of ncu's CSV output (lines before the header dropped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"')), None)
    return [] if start is None else list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _number(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def ncu_summary(run, n, label, deadline):
    """ncu on one launch of ``label`` (the second: past the compile): its sections' headline metrics and the
    warp-state samples by SASS opcode and by instruction (the 30 heaviest), as rows."""
    exe = shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
                                        if os.path.exists(p)), None)
    if exe is None:
        run.row(f"ncu {label}", status="no ncu on this device")
        return
    out = os.environ.get("OUT", ".")
    rep = os.path.join(out, f"order3_{n}_{label}")
    cmd = [exe, "--kernel-name", "regex:order3", "--launch-skip", "1", "--launch-count", "1",
           "--section", "SpeedOfLight", "--section", "ComputeWorkloadAnalysis", "--section", "MemoryWorkloadAnalysis",
           "--section", "Occupancy", "--section", "SchedulerStats", "--section", "WarpStateStats",
           "--section", "SourceCounters", "--section", "InstructionStats", "--metrics", ",".join(STALLS), "-f", "-o", rep,
           sys.executable, os.path.abspath(__file__), "--n", str(n), "--profile", "--variants", label]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, deadline))
    if r.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):  # (a section this ncu lacks: the sampling alone)
        run.row(f"ncu {label} sections", status=f"ncu failed ({r.returncode})", tail=(r.stdout + r.stderr)[-800:])
        keep = {"SpeedOfLight", "WarpStateStats", "SourceCounters"}
        cmd = [c for i, c in enumerate(cmd) if not (c == "--section" and cmd[i + 1] not in keep)
               and not (i > 0 and cmd[i - 1] == "--section" and c not in keep)
               and not (c == "--metrics" or (i > 0 and cmd[i - 1] == "--metrics"))]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, deadline))
    if r.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
        run.row(f"ncu {label}", status=f"ncu failed ({r.returncode})", tail=(r.stdout + r.stderr)[-1500:])
        return
    details = subprocess.run([exe, "-i", rep + ".ncu-rep", "--page", "details", "--csv"], capture_output=True,
                             text=True, timeout=120).stdout
    metrics = {}
    for row in _rows(details):
        name = f"{row.get('Section Name', '')}: {row.get('Metric Name', '')} ({row.get('Metric Unit', '')})"
        metrics[name] = row.get("Metric Value")
    run.row(f"ncu {label} details", metrics=metrics)
    source = subprocess.run([exe, "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                            capture_output=True, text=True, timeout=120)
    rows = _rows(source.stdout)
    if not rows:
        run.row(f"ncu {label} source", status="no source page", tail=(source.stdout + source.stderr)[-1500:])
        return
    columns = [c for c in rows[0] if c]
    sampled = [c for c in columns if "Sampling" in c and "Not" not in c and "All" in c] or [
        c for c in columns if "Sampling" in c]
    text_col = next((c for c in columns if c.strip().lower() in ("source", "sass")), columns[min(1, len(columns) - 1)])
    by_op, heavy, total = defaultdict(float), [], 0.0
    for i, row in enumerate(rows):
        s = sum(_number(row.get(c)) or 0.0 for c in sampled[:1])
        sass = str(row.get(text_col, "")).strip()
        words = [w for w in sass.replace(";", " ").split() if not w.startswith("@")]
        op = words[0].split(".")[0] if words else "?"
        by_op[op] += s
        total += s
        heavy.append((s, i, sass[:90]))
    heavy.sort(reverse=True)
    run.row(f"ncu {label} stalls by opcode", column=sampled[:1], columns=columns[:40], total=total,
            share={op: round(v / total, 4) for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:25]}
            if total else {})
    run.row(f"ncu {label} heaviest instructions", rows=[dict(samples=s, index=i, sass=t) for s, i, t in heavy[:30]],
            instructions=len(rows))
    with open(os.path.join(out, f"fft_conv_order3_ncu_source_{n}_{label}.json"), "w") as f:
        json.dump({"columns": columns, "rows": rows[:4000]}, f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--variants", default="c64,f16")
    ap.add_argument("--conj", default="", help="variant labels whose correlation to check (a compile each)")
    ap.add_argument("--odd", default="", help="variant labels to check on an odd batch with a NaN")
    ap.add_argument("--op", action="store_true", help="the op's plan, bits, du and dk")
    ap.add_argument("--fp16", action="store_true", help="float16 u through the op: y and du against float64")
    ap.add_argument("--op-as", default="", help="a variant suffix (_s: c64_s / f16_s): the op's checks with that "
                                                 "variant's tuples patched into configs (tiles.switches.patched)")
    ap.add_argument("--bins", action="store_true", help="time the spectrum's casts a call alone")
    ap.add_argument("--same", default="", help="label pairs a:b whose launches must give the same bits (B16 H768)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=100)
    ap.add_argument("--profile", action="store_true", help="the variants' launches only (under ncu)")
    ap.add_argument("--ncu", default="", help="variant labels to profile with ncu (a run of this script each)")
    ap.add_argument("--smoke", action="store_true", help="CPU: the script's own path on torch.fft plans")
    a = ap.parse_args()
    n = a.n
    labels = [x for x in a.variants.split(",") if x]
    if a.profile:
        profile(n, labels)
        return 0
    run = Run(f"fft_conv_gpu_order3_{n}", deadline=a.deadline)
    if a.smoke:  # (no GPU: the rows' plumbing only, on the op's CPU path)
        g = torch.Generator().manual_seed(41)
        u = torch.randn(2, 4, 256, generator=g).to(torch.bfloat16)
        k = torch.randn(4, 256, generator=g).to(torch.bfloat16) / 16
        run.row("check smoke op", **check(fft_conv(u, k), fft_conv_reference(u.double(), k.double()), TOL))
        dy = torch.randn(2, 4, 256, generator=g).to(torch.bfloat16)
        x = u.clone().requires_grad_(True)
        kk = k.clone().requires_grad_(True)
        fft_conv(x, kk).backward(dy)
        run.row("check smoke dk", **check(kk.grad, dk_reference(u.double(), dy.double(), 256), TOL))
        for label, (p, kind) in variants(n).items():
            run.row(f"plan {label}", plan=str(p)[:120], kind=kind)
        run.row("ncu parse smoke", rows=len(_rows('==PROF== x\n"Source","Warp Stall Sampling (All Samples)"\n'
                                                  '"HGMMA.64x64x16",3\n')))
        t = time_rounds({"op": lambda: fft_conv(u, k)}, rounds=1, deadline=run)
        run.row("time smoke op", ms=t["op_ms"])
        run.finish(["name", "pass", "err_over_floor", "ms"])
        return 0
    for label in (x for x in a.ncu.split(",") if x):
        run.attempt(f"ncu {label}", ncu_summary, run, n, label, run.left())
    if a.ncu:
        run.finish(["name", "status", "total"])
        return 0
    B, H = 16, 768
    ref, ref_c, ud, kd, spectra = inputs(n, 40, B, H)
    table = variants(n)
    chosen = [(label, *table[label]) for label in labels]
    conj_of = {x for x in a.conj.split(",") if x}
    run.extra.update(n=n, variants={label: str(p) for label, p, _ in chosen})
    check_launches(run, chosen, conj_of, ud, spectra, ref, ref_c, TOL)
    for pair in (x for x in a.same.split(",") if x):
        run.attempt(f"same {pair}", same_launch_bits, run, *pair.split(":"), table, ud, spectra)
    for label in (x for x in a.odd.split(",") if x):
        run.attempt(f"odd {label}", odd_batch, run, label, table[label][0], table[label][1], kd, n)
    if a.op:
        run.attempt("op", op_checks, run, ud, kd, spectra, ref, n)
    if a.op_as:
        run.attempt(f"op as {a.op_as}", op_checks, run, ud, kd, spectra, ref, n, a.op_as)
    if a.fp16:
        run.attempt("fp16", fp16_checks, run, n)
    y_copy = torch.empty_like(ud)
    fns = {"torch.fft": lambda: torch.fft.irfft(torch.fft.rfft(ud.float(), n=2 * n) * spectra["c64"], n=2 * n)[..., :n],
           "op c64": lambda: fft_conv(ud, spectra["c64"]), "op f16": lambda: fft_conv(ud, spectra["f16"]),
           "copy u": lambda: y_copy.copy_(ud)}
    ys = {label: torch.empty_like(ud) for label, _, _ in chosen}
    for label, p, kind in chosen:
        fns[label] = (lambda p=p, kind=kind, y=ys[label]: conv_launch.launch(p, ud, spectra[kind], y, False))
    if a.bins:  # the casts a call alone (torch's five passes: the cast until session 43)
        fns["bins torch"] = lambda: scaled_half_bins(spectra["c64"])
        fns["bins fused"] = lambda: conv_launch.scaled_half_bins(spectra["c64"])
        if n == 8192:  # (KFULL's layout: 8192 only)
            fns["bins laid c64"] = lambda: conv_launch.laid_half_bins(spectra["c64"], n)
            fns["bins laid f16"] = lambda: conv_launch.laid_half_bins(spectra["f16"], n)
    copy_ms = model.op_bytes(B, H, n) / model.COPY_GBS / 1e6
    kinds = {label: kind for label, _, kind in chosen}

    def rows(t, graph):
        key = "_graph_ms" if graph else "_ms"
        base = t["torch.fft" + key]
        copy_gbs = 2 * ud.numel() * ud.element_size() / t["copy u" + key] / 1e6
        measured_ms = model.op_bytes(B, H, n) / copy_gbs / 1e6
        for name in fns:
            ms = t[name + key]
            peer = ("f16" if kinds.get(name) == "f16" or name == "op f16" else "bins torch" if name.startswith("bins ")
                    else "c64")
            run.row(f"time {name}" + (" (graph)" if graph else ""), ms=ms, x_torch_fft=round(base / ms, 3),
                    vs_shipped=round(t[peer + key] / ms, 4) if peer + key in t else None,
                    pct_copy=round(100 * copy_ms / ms, 1), pct_measured_copy=round(100 * measured_ms / ms, 1),
                    copy_gbs=round(copy_gbs), rounds=t[f"{name}_rounds"])

    run.attempt("time eager", lambda: rows(time_rounds(fns, rounds=a.rounds, deadline=run), False))
    if run.left() > 8:
        run.attempt("time graph", lambda: rows(time_rounds(fns, rounds=2, graph=True, eager=False, deadline=run), True))
    run.finish(["name", "pass", "err_over_floor", "ms", "x_torch_fft", "vs_shipped", "pct_copy", "pct_measured_copy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

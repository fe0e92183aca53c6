"""FP8 attention's convenience path (issue 34) against tilecore's bf16 forward by GPU time, and config forms of the
kernel (forms()) against the shipped one in the same run. (Sessions 40-41; session 40's runs name it gpu_s40.py.)

    PYTHONPATH=. python experiments/attention_fp8/gpu_rotated.py [--budget 200]
        [--cases d128c,d64c,plain128c,plain64c,tail,outlier,d128,d64,passes] [--forms ship,c2] [--smoke]

Forms (forms(); the first is the base every other is compared with): "ship" (the shipped configs: three consumer
warpgroups with serial steps at D64 (since session 41, q's codes in registers) and D128 (since session 42: serial 2, one
bf16 Q buffer, 2 stages, the full rotation, codes in shared memory; causal since session 43: the last consumer's Q in
two buffers)), "c2" (D64 on two consumers, P V under the next
step's softmax, codes in shared memory: before session 41), "c3s" (D64's three with the codes in shared memory),
"d128c2" (D128 on two consumers with q's codes in registers: before session 42, less the split rotation, removed),
"noql" (D128 causal before session 43: one Q buffer for every consumer; the shipped form gives the last consumer
two, its next Q loaded first). Session 43's ql12 / lsel / qreg3 lost: notes/attention_fp8's decision log.
Session 42's d128c3 / d128c3q2 / d128c3s2 / d128c3o4 / d128c3r / d128split, session 41's c3st4, gf64c3 and d128c3, its
carry forms and session 40's (old, m32, noclamp, st4, nohide) are in notes/attention_fp8's decision log. O is compared
bit for bit with the base's (serial steps round O * alpha + P V once: not the same bits as two consumers').

Phases (each only where the budget allows; rows printed as they come, the table last):
* d128c, d64c, d128, d64: B16 H16 N4096 ``tilecore.attention(..., precision="fp8")`` in the forms and tilecore's bf16
  forward: O of each against float64 on the last (batch, head) (outputs poisoned: the allocator's block filled with
  NaN first), each form's O bit for bit against the base's; interleaved rounds of CUDA-graph times and GPU time by the
  profiler (each call after a synchronize: the sum of its kernels, and each kernel's: the k and v passes' share).
* tail: B2 Hq8 Hkv2 N1008 Nk1104 D128 and D64 causal, D128 full (GQA, tails), and B1 Hq4 Hkv2 N1100 Nk900 D128
  causal (rows with no key: O 0): each form against float64 and bit for bit against the base's.
* outlier: FlashAttention-3's outlier test (N(0,1) + N(0,100) with probability 0.001), B1 H16 N2048 D128 causal,
  RMSE against float64 (target <= 9.1e-3 rotated), each form.
* passes: the k pass (rotate_quantize) and the v pass (quantize_v_permuted per block) shipped and with the explicit
  +-448 clamp (configs.QUANTIZE_CLAMP True), bit for bit, and against torch's bf16 -> e4m3 cast of the same tensor,
  from CUDA graphs.
* stamps128c, stamps128: the D128 kernel alone in the forms, with clock stamps of each tile's phases
  (experiments/attention_fp8/stamps.py), B16 H16 N4096 causal / full: O against float64 and bit for bit, CUDA-graph
  times of each form with and without the stamps, the phases' medians over every tile.
* plain128c, plain64c: attention_fp8 on e4m3 inputs with per-head descales (the kernel alone, GLUON_FORWARD's
  config), B16 H16 N4096 causal, in the forms.

JSON: $OUT/attention_fp8_rotated.json (experiments/common/gpu_script.Run).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.gpu_script import Run, check, profiled, same_bits, sync, time_rounds  # noqa: E402


def reference(q, k, v, causal):
    """float64 attention (B, Hq, N, D) of (B, Hkv, Nk, D) keys (GQA), causal bottom right: the library's reference."""
    from tilecore.ops.attention.reference import attention_reference

    return attention_reference(q, k, v, causal=causal)[0]


def poison_allocator(like: torch.Tensor):
    """Fill the caching allocator's next block of like's size with NaN (an element a kernel skips then stays NaN)."""
    x = torch.full_like(like, float("nan"))
    del x


def gpu_us(fn, calls: int = 3) -> dict:
    """GPU time of ``fn`` by the profiler (gpu_script.profiled: CUPTI's kernels of ``calls`` calls after an unrecorded
    one): the median over calls of the sum of a call's kernels (us), and the last call's kernels [(name, us)]. Each
    call is made after a synchronize (sync inside the recorded function), as before: GPU time, not eager time."""
    if not torch.cuda.is_available():
        return {"total_us": None, "kernels": []}

    def synced():
        sync()
        fn()

    prof = profiled(synced, calls)
    ks = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "Memset" not in e.name
                 and "Memcpy" not in e.name), key=lambda e: e.time_range.start)
    if not ks:
        return {"total_us": None, "kernels": []}
    per = max(1, len(ks) // calls)
    totals = [sum(e.time_range.end - e.time_range.start for e in ks[c * per:(c + 1) * per]) for c in range(calls)]
    return {"total_us": round(statistics.median(totals), 1),
            "kernels": [(e.name[:40], round(e.time_range.end - e.time_range.start, 1)) for e in ks[-per:]]}


def outlier_inputs(B, H, N, D, device, dtype, seed=1):
    """q, k, v of FlashAttention-3's outlier test: entries N(0, 1) plus N(0, 100) with probability 0.001."""
    g = torch.Generator(device=device).manual_seed(seed)

    def one():
        x = torch.randn(B, H, N, D, device=device, generator=g)
        big = torch.rand(B, H, N, D, device=device, generator=g) < 0.001
        return (x + big * torch.randn(B, H, N, D, device=device, generator=g) * 10.0).to(dtype)
    return one(), one(), one()


def med(xs):
    """The median of the figures that are there (None where none is)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return round(a / b, 4) if a and b else None


def forms(names):
    """name -> (the module configs patched for that form: tiles.switches.patched keyword arguments by module, the head
    dims it changes anything at)."""
    from tilecore.ops.attention_fp8 import configs

    rot = configs.ROTATED
    table = {"ship": ({}, (64, 128)),
             # D64: two consumers, P V under the next step's softmax, q's codes in shared memory (before session 41)
             "c2": ({configs: dict(ROTATED=dict(rot, serial_c3={128: 2}, q_reg=()))}, (64,)),
             # D64: three serial consumers with q's codes in shared memory (session 41 call 3's c3s)
             "c3s": ({configs: dict(ROTATED=dict(rot, q_reg=()))}, (64,)),
             # D128 before session 42: two consumers, q's codes in registers, two Q buffers, 3 stages
             "d128c2": ({configs: dict(ROTATED=dict(rot, serial_c3={64: 1}, q_reg=(64, 128), q_buffers={},
                                                    stages={}))}, (128,)),
             # D128 causal before session 43: one Q buffer for every consumer (the shipped form gives the last
             # consumer two, its next Q loaded first). Session 43's ql12 (the last two consumers'), lsel (O stored
             # before lse) and qreg3 (q's codes in registers on three consumers) lost: notes/attention_fp8
             "noql": ({configs: dict(ROTATED=dict(rot, q_last_buffers={}))}, (128,))}
    return {n: table[n] for n in names if n in table}  # (a removed form is left out: main says which)


def same_codes(a, b) -> bool:
    """(codes, descales) a and b equal: every bit, but a NaN may be another NaN (e4m3's 0x7f or 0xff; float32's)."""
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        nx, ny = x.float().isnan(), y.float().isnan()
        if not torch.equal(nx, ny):
            return False
        bits = torch.uint8 if x.element_size() == 1 else torch.int32
        if not torch.equal(x.view(bits)[~nx], y.view(bits)[~ny]):
            return False
    return True


def under(patches, fn):
    """``fn`` called with the patches applied (a with-block of tiles.switches.patched per module)."""
    from tilecore.tiles.switches import patched

    def call(*a):
        with contextlib.ExitStack() as stack:
            for module, values in patches.items():
                stack.enter_context(patched(module, **values))
            return fn(*a)
    return call


def arguments():
    """The command line (the module's docstring says what the cases and forms are)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--cases", default="d128c,d64c,plain128c,plain64c,tail,outlier,d128")
    ap.add_argument("--forms", default="ship,c2", help="ship (the shipped configs), c2, c3s, d128c2, noql (forms()); "
                    "the first is the base")
    ap.add_argument("--stamp-forms", default="", help="the forms the stamps cases run (default: every form)")
    ap.add_argument("--pass-dims", default="128,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-rounds", type=int, default=4, help="profiler rounds (each form's calls after a sync)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: the script's plumbing only")
    return ap.parse_args()


def main():
    args = arguments()
    import tilecore
    from tilecore.ops.attention_fp8 import quantize

    run = Run("attention_fp8_rotated", deadline=args.budget)
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    dt = torch.float32 if smoke else torch.bfloat16
    fm = forms(args.forms.split(","))
    run.errors += [f"form {n}: not in forms() (removed: notes/attention_fp8)" for n in args.forms.split(",") if n not in fm]
    base = args.forms.split(",")[0]
    run.extra["forms"] = {n: {getattr(m, "__name__", str(m)): v for m, v in p.items()} for n, (p, _) in fm.items()}

    def fp8_forms(causal, D):
        return {n: under(p, lambda q, k, v: tilecore.attention(q, k, v, causal=causal, precision="fp8"))
                for n, (p, dims) in fm.items() if D in dims}

    def attention_case(label, B, H, N, D, causal):
        g = torch.Generator(device=dev).manual_seed(N + D + 40)
        q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
        ref = reference(q[-1:, -1:], k[-1:, -1:], v[-1:, -1:], causal)[0, 0]
        fns = {"bf16": lambda: tilecore.attention(q, k, v, causal=causal)}
        outs = {}
        for name, f in fp8_forms(causal, D).items():
            poison_allocator(q)
            outs[name] = f(q, k, v)
            fns[name] = (lambda f=f: f(q, k, v))
        poison_allocator(q)
        outs["bf16"] = fns["bf16"]()
        for name, o in outs.items():
            run.row(f"{label} check {name}", **check(o[-1, -1], ref, tol=40.0 if name != "bf16" else 2.5),
                    written_all=bool(torch.isfinite(o).all()))
        for n in outs:
            if n not in (base, "bf16"):
                run.row(f"{label} {base} == {n} bits", **{"pass": same_bits(outs[base], outs[n])})
        del outs
        t = time_rounds(fns, rounds=args.rounds, graph=True, eager=False, deadline=run)
        row = {f"{n}_graph_ms": t.get(f"{n}_graph_ms") for n in fns}
        for n in fns:
            if n == "bf16":
                continue
            row[f"{n}_x_bf16_graph"] = ratio(t.get("bf16_graph_ms"), t.get(f"{n}_graph_ms"))
            if n != base and base in fns:
                row[f"{n}_x_base_graph"] = ratio(t.get(f"{base}_graph_ms"), t.get(f"{n}_graph_ms"))
        row["rounds"] = {n: t.get(f"{n}_rounds") for n in fns}
        run.row(f"{label} graph", **row)
        if run.left() < 6:
            return
        gpu = {n: [] for n in fns}
        kernels = {}
        for r in range(args.gpu_rounds):  # interleaved
            for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                res = gpu_us(fns[n])
                gpu[n].append(res["total_us"])
                kernels[n] = res["kernels"]
        grow = {f"{n}_gpu_us": gpu[n] for n in fns}
        if not smoke:
            for n in fns:
                if n == "bf16":
                    continue
                grow[f"{n}_x_bf16_gpu"] = ratio(med(gpu["bf16"]), med(gpu[n]))
                if n != base and base in gpu:
                    grow[f"{n}_x_base_gpu"] = ratio(med(gpu[base]), med(gpu[n]))
        grow["kernels"] = kernels
        run.row(f"{label} gpu time", **grow)

    def passes():
        """The k pass (rotate_quantize, 128-key block descales) and the v pass (quantize_v_permuted per block) without
        and with the explicit +-448 clamp before the e4m3 conversion (configs.QUANTIZE_CLAMP True: the conversion saturates
        by itself), each checked bit for bit against the shipped one, against the cast of the same tensor (the same
        bytes: read 2, write 1 an element), one kernel each, from CUDA graphs in interleaved rounds."""
        from tilecore.ops.attention_fp8 import configs
        from tilecore.tiles.switches import patched

        def clamped(fn):
            def call():
                with patched(configs, QUANTIZE_CLAMP=True):
                    return fn()
            return call

        for D in [int(d) for d in args.pass_dims.split(",")]:
            B, H, N = (1, 2, 512) if smoke else (16, 16, 4096)
            g = torch.Generator(device=dev).manual_seed(7 + D)
            x = torch.randn(B, H, N, D, device=dev, generator=g).to(dt)
            x[0, 0, 5, 3] = float("nan")  # a NaN's code stays NaN (both forms); its block's descale is NaN
            signs = quantize.rotation_signs(D, x.device)
            kf = (lambda x=x, s=signs: quantize.rotate_quantize(x, signs=s, scales="block"))
            vf = (lambda x=x: quantize.quantize_v_permuted(x, per="block"))
            fns = {"cast": lambda x=x: x.to(torch.float8_e4m3fn), "k_ship": kf, "k_clamp": clamped(kf),
                   "v_ship": vf, "v_clamp": clamped(vf)}
            for n in ("k", "v"):
                ship, new = fns[f"{n}_ship"](), fns[f"{n}_clamp"]()
                run.row(f"passes D{D} {n} clamp bits", **{"pass": same_codes(ship, new),
                                                           "bitwise": same_bits(ship, new)})
            x[0, 0, 5, 3] = 1.0
            t = time_rounds(fns, rounds=args.rounds, graph=True, eager=False, deadline=run)
            row = {}
            moved = 3 * x.numel()
            for n in fns:
                ms = t.get(f"{n}_graph_ms")
                row[f"{n}_us"] = round(ms * 1e3, 2) if ms else None
                row[f"{n}_GBps"] = round(moved / (ms * 1e-3) / 1e9, 1) if ms else None
            for n in fns:
                if n != "cast":
                    row[f"{n}_of_cast"] = ratio(row.get("cast_us"), row.get(f"{n}_us"))
            for n in ("k", "v"):
                row[f"{n}_ship_x_clamp"] = ratio(row.get(f"{n}_clamp_us"), row.get(f"{n}_ship_us"))
            row["rounds"] = {n: t.get(f"{n}_rounds") for n in fns}
            run.row(f"passes D{D}", **row)

    def plain(label, B, H, N, D, causal):
        """attention_fp8 on e4m3 q, k, v with per-head descales (the kernel alone, its GLUON_FORWARD config) in the
        forms: O against float64, bit for bit against old's, CUDA-graph times and TFLOP/s."""
        from tilecore.ops.attention_fp8.quantize import quantize_fp8

        g = torch.Generator(device=dev).manual_seed(N + D + 2)
        q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
        ref = reference(q[-1:, -1:], k[-1:, -1:], v[-1:, -1:], causal)[0, 0]
        q8, qs = quantize_fp8(q, per="head")
        k8, ks = quantize_fp8(k, per="head")
        v8, vs = quantize_fp8(v, per="head", layout="keys_permuted")
        fns, outs = {}, {}
        for name, (p, dims) in fm.items():
            f = under(p, lambda: tilecore.attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal,
                                                         out_dtype=dt, v_layout="keys_permuted", check_scales=False))
            poison_allocator(q)
            outs[name] = f()
            fns[name] = f
            run.row(f"{label} check {name}", **check(outs[name][-1, -1], ref, tol=40.0))
        for n in outs:
            if n != base:
                run.row(f"{label} {base} == {n} bits", **{"pass": same_bits(outs[base], outs[n])})
        del outs
        t = time_rounds(fns, rounds=args.rounds, graph=True, eager=False, deadline=run)
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        row = {f"{n}_graph_ms": t.get(f"{n}_graph_ms") for n in fns}
        row.update({f"{n}_tflops": round(flops / (t[f"{n}_graph_ms"] * 1e9), 1) for n in fns if t.get(f"{n}_graph_ms")})
        for n in fns:
            if n != base:
                row[f"{n}_x_base_graph"] = ratio(t.get(f"{base}_graph_ms"), t.get(f"{n}_graph_ms"))
        row["rounds"] = {n: t.get(f"{n}_rounds") for n in fns}
        run.row(f"{label} time", **row)

    def stamped_case(label, causal):
        """The convenience path's D128 kernel (B16 H16 N4096) in each form that changes D128, with clock stamps of each
        tile's phases (stamps.py: the library's kernel, its op wrapped through the kernel's WRAP): each form's O bit
        for bit against the base's (unstamped and stamped) and against float64, every launch timed from CUDA graphs
        in interleaved rounds (the kernel alone: the forms' ratio, and what the stamps cost), then each form's phases'
        medians over every tile (stamps.analyse) and two programs' first tiles (stamps.timeline)."""
        from experiments.attention_fp8 import stamps
        from tilecore.ops.attention_fp8 import gluon_fp8, launch
        from tilecore.tiles.launch import CachedLaunch, TmaOperand

        B, H, N, D = (1, 2, 256, 128) if smoke else (16, 16, 4096, 128)
        g = torch.Generator(device=dev).manual_seed(N + D + 43)
        q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
        ref = reference(q[-1:, -1:], k[-1:, -1:], v[-1:, -1:], causal)[0, 0]
        if smoke:  # the plumbing: the path's own output (no Gluon kernel on the CPU)
            run.row(f"{label} check", **check(tilecore.attention(q, k, v, causal=causal, precision="fp8")[-1, -1], ref,
                                             tol=40.0))
            return
        signs = quantize.rotation_signs(D, q.device)
        k8, ks = quantize.rotate_quantize(k, rotate=True, signs=signs, scales="block")
        v8, vs = quantize.quantize_v_permuted(v, per="block")
        kernel = CachedLaunch(gluon_fp8.attention_fp8_fwd_kernel)
        fns, bufs, outs, shapes = {}, {}, {}, {}
        for name, (patches, dims) in fm.items():
            if D not in dims or (args.stamp_forms and name not in args.stamp_forms.split(",")):
                continue
            # the launch (its options, tiling and schedule table) made inside the form's patches, once, eagerly
            attend = under(patches, lambda: launch.q_rotated_launch(q, signs, k8, v8, ks, vs, causal, D ** -0.5,
                                                                    q.dtype))()
            tiles = -(-N // (attend.layout.block_m * attend.layout.consumers)) * B * H
            buf = torch.zeros(tiles, stamps.SLOTS, dtype=torch.int64, device=dev)

            def with_stamps(attend=attend, buf=buf):
                bm, bn = attend.layout.block_m, attend.layout.block_n
                out = torch.empty_like(q)
                lse = torch.empty((B, H, N), dtype=torch.float32, device=dev)
                a = (TmaOperand(q, [1, 1, bm, D]), TmaOperand(k8, [1, 1, bn, D]), TmaOperand(v8, [1, 1, D, bn]),
                     TmaOperand(out, [1, 1, bm, D]), lse, attend.signs, ks, vs, *attend.tail, vs.shape[2])
                kernel[attend.grid](*a, **attend.options, WRAP=stamps.stamped, wrap_arg=buf)
                return out

            fns[name] = (lambda attend=attend: attend(q, k8, v8, ks, vs)[0])
            fns[f"{name}_stamped"] = with_stamps
            bufs[name] = (buf, attend)
            for n in (name, f"{name}_stamped"):
                poison_allocator(q)
                outs[n] = fns[n]()
                run.row(f"{label} check {n}", **check(outs[n][-1, -1], ref, tol=40.0),
                        written_all=bool(torch.isfinite(outs[n]).all()))
            shapes[name] = dict(options={k_: v_ for k_, v_ in attend.options.items() if k_ != "signs"},
                                scheduled=attend.tail[-1] is not None)
        run.row(f"{label} launches", **shapes)
        first = next(iter(outs))
        for n in outs:
            if n != first:
                run.row(f"{label} {first} == {n} bits", **{"pass": same_bits(outs[first], outs[n])})
        run.row(f"{label} path == {first} bits",
                **{"pass": same_bits(outs[first], under(fm[first][0], lambda: tilecore.attention(
                    q, k, v, causal=causal, precision="fp8"))())})
        outs.clear()
        t = time_rounds(fns, rounds=args.rounds, graph=True, eager=False, deadline=run)
        row = {f"{n}_graph_us": round(t[f"{n}_graph_ms"] * 1e3, 1) if t.get(f"{n}_graph_ms") else None for n in fns}
        base_n = next(iter(bufs))
        for n in bufs:
            row[f"{n}_stamped_x_{n}"] = ratio(t.get(f"{n}_graph_ms"), t.get(f"{n}_stamped_graph_ms"))
            if n != base_n:
                row[f"{n}_x_{base_n}_kernel"] = ratio(t.get(f"{base_n}_graph_ms"), t.get(f"{n}_graph_ms"))
        row["rounds"] = {n: t.get(f"{n}_rounds") for n in fns}
        run.row(f"{label} time", **row)
        for n, (buf, attend) in bufs.items():
            if run.left() < 3:
                break
            buf.zero_()
            fns[f"{n}_stamped"]()
            sync()
            rows = buf.cpu().tolist()
            phases = run.row(f"{label} {n} phases", **stamps.analyse(rows, attend.layout.consumers))
            for key, val in phases.items():  # the row is cut at 600 characters when printed: one line a phase
                if isinstance(val, dict):
                    run.say(f"  {label} {n} {key}: " + " ".join(f"{k_} {v_}" for k_, v_ in val.items()))
            progs = sorted({int(r[stamps.PROGRAM]) for r in rows if r[stamps.CONSUMER]})
            for p in (progs[0], progs[len(progs) // 2]) if progs else ():
                run.row(f"{label} {n} timeline program {p}",
                        tiles=stamps.timeline(rows, p, 4, attend.layout.consumers, phases.get("sm_ghz", 1.755)))

    def tail():
        for D, causal, N, Nk in ((128, True, 1008, 1104), (64, True, 1008, 1104), (128, False, 1008, 1104),
                                 (128, True, 1100, 900)):
            B, Hq, Hkv = (1, 4, 2) if smoke else ((2, 8, 2) if N < Nk else (1, 4, 2))
            if smoke:
                N, Nk = (40, 56) if N < Nk else (56, 40)
            g = torch.Generator(device=dev).manual_seed(11 + D)
            q = torch.randn(B, Hq, N, D, device=dev, generator=g).to(dt)
            k, v = (torch.randn(B, Hkv, Nk, D, device=dev, generator=g).to(dt) for _ in range(2))
            ref = reference(q, k, v, causal)
            outs = {}
            c = ("c" if causal else "") + ("" if N < Nk else "_nokey")
            for name, f in fp8_forms(causal, D).items():
                poison_allocator(q)
                outs[name] = f(q, k, v)
                run.row(f"tail D{D}{c} check {name}", **check(outs[name], ref, tol=40.0))
            for n in outs:
                if n != base:
                    run.row(f"tail D{D}{c} {base} == {n} bits", **{"pass": same_bits(outs[base], outs[n])})

    def outlier():
        B, H, N, D = (1, 2, 64, 128) if smoke else (1, 16, 2048, 128)
        q, k, v = outlier_inputs(B, H, N, D, dev, dt)
        ref = reference(q, k, v, True)
        row = {}
        for name, f in fp8_forms(True, D).items():
            row[f"{name}_rmse"] = (f(q, k, v).double() - ref).pow(2).mean().sqrt().item()
        row["bf16_rmse"] = (tilecore.attention(q, k, v, causal=True).double() - ref).pow(2).mean().sqrt().item()
        row["pass"] = max(v for n, v in row.items() if n != "bf16_rmse") <= 9.1e-3
        run.row("outlier causal rotated", **row)

    shapes = {"d128c": (128, True), "d64c": (64, True), "d128": (128, False), "d64": (64, False)}
    plains = {"plain128c": (128, True), "plain64c": (64, True)}
    need = {"stamps128c": 25, "stamps128": 25, "passes": 10, "tail": 8, "outlier": 6, "d128c": 15, "d64c": 15, "d128": 15, "d64": 15, "plain128c": 10,
            "plain64c": 10}
    for c in args.cases.split(","):
        if run.left() < need.get(c, 10):
            run.errors.append(f"{c}: skipped for the time budget ({run.elapsed():.0f} s)")
            run.say("skipped for the time budget:", c)
            continue
        if c in shapes:
            D, causal = shapes[c]
            B, H, N = (1, 2, 256) if smoke else (16, 16, 4096)
            run.attempt(c, attention_case, c, B, H, N, D, causal)
        elif c in plains:
            D, causal = plains[c]
            B, H, N = (1, 2, 256) if smoke else (16, 16, 4096)
            run.attempt(c, plain, c, B, H, N, D, causal)
        elif c in ("stamps128c", "stamps128"):
            run.attempt(c, stamped_case, c, c.endswith("c"))
        else:
            run.attempt(c, {"passes": passes, "tail": tail, "outlier": outlier}[c])
    cols = ["name", "pass", "err_over_floor"] + [f"{n}_x_bf16_graph" for n in fm] + [f"{n}_x_bf16_gpu" for n in fm] \
        + [f"{n}_x_base_{w}" for n in fm if n != base for w in ("graph", "gpu")]
    run.finish(cols + ["k_ship_of_cast", "k_ship_x_clamp", "v_ship_x_clamp"])


if __name__ == "__main__":
    main()

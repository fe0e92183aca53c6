"""GPU check and timing of the GEMM kernels, in phases that each run in a child process with a time
limit (a wrong mbarrier phase hangs the GPU; the parent then reports it and goes on).

    PYTHONPATH=. python3 experiments/gemm/gemm_probe.py [--phases check,time,ablate,fp8] [--out DIR]

check: poisoned outputs, float64 references, error / rounding floor, twice for determinism.
time: bf16 square and M=N=4096 small-K against torch.matmul, interleaved (A B A B); GPU time from
    back-to-back calls in one CUDA graph (harness.graph_median_ms).
reps4096: 4096^3, ten interleaved repetitions (the case at parity), GROUP_M 4 / 8 / 16; 8192^3, six, 4 / 8.
streamk: the stream-K tail on and off (the same kernel otherwise) against torch.matmul.
ablate: ring depth (1..4 stages) and tile order (GROUP_M 1 vs 8). fp8: against torch._scaled_mm.
public: the public functions (every size class, fp8, autograd, torch.compile). host: host time a call.

Kernels run through the op's plan and launch: plan.plan(..., path=, config=) with configs.py's rows
(GLUON_BF16, GLUON_FP8, TL_GPU) and documented overrides of their keys, then launch.launch(plan, ...).
(Until the tiles v2 port it also timed one 8-warp consumer and had a "consumers" phase from before
two consumers shipped: git show bb6b420:scripts/device/gemm_probe.py.)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LIMITS = {"reps4096": 90, "host": 40, "check": 90, "time": 120, "ablate": 90, "fp8": 50, "public": 60, "streamk": 150}


def parent(args):
    results = {}
    for phase in args.phases.split(","):
        t = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, "--child", phase, "--out", args.out],
                               timeout=LIMITS[phase], capture_output=True, text=True)
            status = f"rc={r.returncode}"
            out, err = r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            status = "TIMEOUT (hang?)"
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        print(f"===== phase {phase}: {status}, {time.time() - t:.0f} s", flush=True)
        print(out[-6000:], flush=True)
        if err.strip():
            print("stderr:", err[-2500:], flush=True)
        with open(os.path.join(args.out, "gemm_probe.log"), "a") as f:
            f.write(f"===== phase {phase}: {status}\n" + out + "\n--- stderr ---\n" + err)


def child(phase, out_dir):
    import torch
    import triton

    import tilecore
    from tilecore import accuracy, env
    from tilecore.bench.harness import graph_median_ms, median_ms
    from tilecore.ops.gemm import configs, launch, reference
    from tilecore.ops.gemm import plan as planner

    dev = torch.device("cuda")
    rows = []

    def gluon(a, b, bias=None, out_dtype=None, sa=None, sb=None, c=None, **cfg):
        """The Gluon kernel with configs.py's row updated by ``cfg`` (block, stages, group_m,
        epilogue_bytes, consumers, stream_k), into ``c`` if given."""
        fp8 = sa is not None
        out_dtype = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
        scales = (sa, sb) if fp8 else None
        p = planner.plan(a, b, out_dtype=out_dtype, bias=bias, scales=scales, path="gluon",
                         config=dict(configs.GLUON_FP8 if fp8 else configs.GLUON_BF16, **cfg))
        assert p.path == "gluon", p
        return launch.launch(p, a, b, bias, scales, out=c)

    def tl(a, b, c, **cfg):
        """The tl kernel on the GPU with configs.TL_GPU updated by ``cfg``, into ``c``."""
        p = planner.plan(a, b, out_dtype=c.dtype, path="tl", config=dict(configs.TL_GPU, **cfg))
        assert p.path == "tl", p
        return launch.launch(p, a, b, out=c)

    if phase == "host":
        import cProfile
        import pstats

        from tilecore.bench.harness import host_us
        from tilecore.ops.gemm import op
        a = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
        b = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
        fns = {"plan + launch (gluon, direct)": lambda: gluon(a, b),
               "plan + launch": lambda: launch.launch(planner.plan(a, b, out_dtype=torch.bfloat16), a, b),
               "torch.ops.tilecore.gemm": lambda: torch.ops.tilecore.gemm(a, b, None, torch.bfloat16),
               "tilecore.gemm": lambda: tilecore.gemm(a, b), "torch.matmul": lambda: torch.matmul(a, b)}
        for name, f in fns.items():
            print(f"host+launch per call {name:28s} {host_us(f, calls=300, warmup=20):8.1f} us", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            tilecore.gemm(a, b)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return

    if phase == "public":
        # the public functions after the launch fast path: every size class, cached compiled kernels
        bad = 0
        for (M, N, K) in [(4096, 4096, 4096), (1000, 1096, 520), (1024, 1096, 520), (1, 256, 64), (257, 264, 72),
                          (4096, 4096, 4096), (64, 8, 8), (3000, 45, 200)]:
            for out_dtype in (None, torch.float32):
                for b_t in (False, True):
                    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                    b = torch.randn(N, K, device=dev, dtype=torch.bfloat16).t() if b_t else torch.randn(K, N, device=dev, dtype=torch.bfloat16)
                    bias = torch.randn(N, device=dev, dtype=torch.bfloat16) if b_t else None
                    ref = reference.gemm_f64(a, b, bias)
                    for rep in range(2):
                        c = tilecore.gemm(a, b, bias=bias, out_dtype=out_dtype)
                        e = accuracy.rel_rms(c, ref) if c.dtype == torch.float32 else accuracy.error_over_floor(c, ref)
                        ok = bool(torch.isfinite(c).all()) and e < (2e-5 if c.dtype == torch.float32 else 1.6)
                        bad += not ok
                        if not ok or rep == 0:
                            print(f"{'ok ' if ok else 'BAD'} tilecore.gemm {M}x{N}x{K} out={c.dtype} B^T={b_t} bias={bias is not None} rep={rep} err={e:.3g}", flush=True)
        for (M, N, K) in [(4096, 4096, 4096), (1000, 1096, 512), (1000, 1096, 520)]:
            a = (torch.randn(M, K, device=dev) * 4).to(torch.float8_e4m3fn)
            b = (torch.randn(N, K, device=dev) * 4).to(torch.float8_e4m3fn).t()
            for rowwise in (False, True):
                sa = torch.rand(M, 1, device=dev) + 0.5 if rowwise else torch.tensor(0.75, device=dev)
                sb = torch.rand(1, N, device=dev) + 0.5 if rowwise else torch.tensor(1.25, device=dev)
                for rep in range(2):
                    c = tilecore.gemm_fp8(a, b, sa, sb)
                    e = accuracy.error_over_floor(c, reference.gemm_fp8_f64(a, b, sa, sb))
                    ok = bool(torch.isfinite(c).all()) and e < 1.6
                    bad += not ok
                    if not ok or rep == 0:
                        print(f"{'ok ' if ok else 'BAD'} gemm_fp8 {M}x{N}x{K} rows={rowwise} err={e:.3g}", flush=True)
        a = torch.randn(512, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(256, 384, device=dev, dtype=torch.bfloat16, requires_grad=True)
        tilecore.gemm(a, b).float().square().sum().backward()
        a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        (a64 @ b64).square().sum().backward()
        print(f"autograd rel err dA {accuracy.rel_rms(a.grad, a64.grad):.2e} dB {accuracy.rel_rms(b.grad, b64.grad):.2e}")
        f = torch.compile(lambda x, y: tilecore.gemm(x, y) * 2, fullgraph=True, backend="aot_eager")
        x, y = a.detach(), b.detach()
        print("torch.compile fullgraph rel err", accuracy.rel_rms(f(x, y), reference.gemm_f64(x, y) * 2))
        print(f"PUBLIC SUMMARY: {bad} bad", flush=True)
        return

    if phase == "check":
        print(env.report(), flush=True)
        bad = 0

        def check(name, fn, ref, out_like, floor_max=1.6):
            nonlocal bad
            c = torch.full_like(out_like, float("nan"))
            fn(c)
            torch.cuda.synchronize()
            c2 = torch.full_like(out_like, float("nan"))
            fn(c2)
            torch.cuda.synchronize()
            written = bool(torch.isfinite(c).all())
            same = bool(torch.equal(c, c2))
            if c.dtype == torch.float32:
                e = accuracy.rel_rms(c, ref)
                ok = e < 2e-5
                unit = " rel"
            else:
                e = accuracy.error_over_floor(c, ref)
                ok = e < floor_max
                unit = "x floor"
            ok = ok and written and same
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name:52s} written={written} deterministic={same} err={e:.3g}{unit}",
                  flush=True)

        torch.manual_seed(0)
        for (M, N, K) in [(4096, 4096, 4096), (1000, 1096, 520), (257, 264, 72), (64, 8, 8), (128, 256, 64),
                          (3000, 2056, 1000)]:
            for dtype in (torch.bfloat16, torch.float16):
                a = torch.randn(M, K, device=dev, dtype=dtype)
                b = torch.randn(K, N, device=dev, dtype=dtype)
                ref = reference.gemm_f64(a, b)
                out = torch.empty(M, N, device=dev, dtype=dtype)
                check(f"gluon {str(dtype)[6:]} {M}x{N}x{K}", lambda c: gluon(a, b, c=c), ref, out)
                check(f"gluon stream-K always {str(dtype)[6:]} {M}x{N}x{K}",
                      lambda c: gluon(a, b, c=c, stream_k="always"), ref, out)
                if dtype == torch.bfloat16 and M in (1000, 4096):
                    bt = torch.randn(N, K, device=dev, dtype=dtype)
                    check(f"gluon B^T {M}x{N}x{K}", lambda c: gluon(a, bt.t(), c=c), reference.gemm_f64(a, bt.t()), out)
                    bias = torch.randn(N, device=dev, dtype=dtype)
                    check(f"gluon bias {M}x{N}x{K}", lambda c: gluon(a, b, bias=bias, c=c),
                          reference.gemm_f64(a, b, bias), out)
                    o32 = torch.empty(M, N, device=dev)
                    check(f"gluon out fp32 {M}x{N}x{K}", lambda c: gluon(a, b, out_dtype=torch.float32, c=c), ref, o32)
                    for stages, group in ((1, 8), (2, 8), (3, 1), (4, 16)):
                        # 4 stages fit 227 KiB only with a 32 KiB (sliced) epilogue buffer
                        check(f"gluon stages={stages} group={group} {M}x{N}x{K}",
                              lambda c: gluon(a, b, c=c, stages=stages, group_m=group,
                                              epilogue_bytes=32768 if stages == 4 else 65536), ref, out)
                    check(f"gluon small-K config {M}x{N}x{K}", lambda c: gluon(a, b, c=c, **configs.GLUON_BF16_SMALL_K),
                          ref, out)
                    check(f"gluon v1 (stages=3, whole-tile epilogue) {M}x{N}x{K}",
                          lambda c: gluon(a, b, c=c, stages=3, epilogue_bytes=None), ref, out)
                    check(f"gluon whole tiles only (no stream-K) {M}x{N}x{K}",
                          lambda c: gluon(a, b, c=c, stream_k="off"), ref, out)
        for (M, N, K) in [(4096, 4096, 4096), (1000, 1096, 528)]:  # fp8 rows of K bytes: TMA needs K % 16 == 0
            a = (torch.randn(M, K, device=dev) * 4).to(torch.float8_e4m3fn)
            b = (torch.randn(N, K, device=dev) * 4).to(torch.float8_e4m3fn).t()
            for rowwise in (False, True):
                sa = torch.rand(M, 1, device=dev) + 0.5 if rowwise else torch.tensor([0.75], device=dev)
                sb = torch.rand(1, N, device=dev) + 0.5 if rowwise else torch.tensor([1.25], device=dev)
                out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
                check(f"gluon fp8 {'rows' if rowwise else 'tensor'} {M}x{N}x{K}",
                      lambda c: gluon(a, b, sa=sa, sb=sb, c=c), reference.gemm_fp8_f64(a, b, sa, sb), out)
        # the public functions, the tl path for TMA-unfriendly sizes, autograd
        a = torch.randn(300, 200, device=dev, dtype=torch.bfloat16)
        b = torch.randn(200, 45, device=dev, dtype=torch.bfloat16)
        check("tl (N=45, not TMA-able) via tilecore.gemm", lambda c: c.copy_(tilecore.gemm(a, b)),
              reference.gemm_f64(a, b), torch.empty(300, 45, device=dev, dtype=torch.bfloat16))
        a = torch.randn(512, 256, device=dev, dtype=torch.bfloat16)
        b = torch.randn(256, 384, device=dev, dtype=torch.bfloat16)
        check("tl kernel on the GPU 512x384x256", lambda c: tl(a, b, c),
              reference.gemm_f64(a, b), torch.empty(512, 384, device=dev, dtype=torch.bfloat16))
        a.requires_grad_()
        b.requires_grad_()
        tilecore.gemm(a, b).float().square().sum().backward()
        a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        (a64 @ b64).square().sum().backward()
        print(f"autograd rel err dA {accuracy.rel_rms(a.grad, a64.grad):.2e} dB {accuracy.rel_rms(b.grad, b64.grad):.2e}")
        # stream-K: which cases used it, and every flag lowered again after the launches
        from tilecore.tiles import schedule
        for (M, N, K) in [(4096, 4096, 4096), (1000, 1096, 520), (3000, 2056, 1000), (1024, 1024, 16384)]:
            print(f"stream-K plan {M}x{N}x{K} (128x256x64): programs, units =",
                  schedule.stream_k_plan(schedule.num_tiles(M, N, 128, 256), -(-K // 64), dev), "(always:",
                  schedule.stream_k_plan(schedule.num_tiles(M, N, 128, 256), -(-K // 64), dev, "always"), ")", flush=True)
        a = torch.randn(1024, 16384, device=dev, dtype=torch.bfloat16)
        b = torch.randn(16384, 1024, device=dev, dtype=torch.bfloat16)
        check("gluon 1024x1024x16384 (32 tiles over every SM)", lambda c: gluon(a, b, c=c),
              reference.gemm_f64(a, b), torch.empty(1024, 1024, device=dev, dtype=torch.bfloat16))
        a = torch.randn(1000, 3000, device=dev, dtype=torch.float16)
        b = torch.randn(3000, 1096, device=dev, dtype=torch.float16)
        check("tl kernel with the stream-K tail 1000x1096x3000", lambda c: tl(a, b, c, stream_k="always"), reference.gemm_f64(a, b),
              torch.empty(1000, 1096, device=dev, dtype=torch.float16))
        # a CUDA graph's own buffers, replayed twice
        a = torch.randn(3000, 4096, device=dev, dtype=torch.bfloat16)
        b = torch.randn(4096, 2056, device=dev, dtype=torch.bfloat16)
        c = torch.empty(3000, 2056, device=dev, dtype=torch.bfloat16)

        def graphed(out):
            gluon(a, b, c=c, stream_k="always")
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                gluon(a, b, c=c, stream_k="always")
            for _ in range(2):
                c.fill_(float("nan"))
                gr.replay()
            out.copy_(c)
        check("gluon in a CUDA graph 3000x2056x4096", graphed, reference.gemm_f64(a, b), torch.empty_like(c))
        torch.cuda.synchronize()
        _, flags = schedule.stream_k_buffers(dev, 1, 1)  # this stream's set, as the launches used it
        raised = int(flags.count_nonzero())
        bad += raised != 0
        print(f"stream-K flags left raised after all launches: {raised}", flush=True)
        print(f"CHECK SUMMARY: {bad} bad", flush=True)
        return

    def bench(fn):
        return median_ms(fn, warmup_ms=25, rep_ms=100)

    def tf(M, N, K, ms):
        return 2 * M * N * K / ms / 1e9

    def compare(label, M, N, K, variants, reps=2, graphs=True, public=()):
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        for fn in variants.values():
            fn(a, b)
        torch.cuda.synchronize()
        res = {name: [] for name in variants}
        res.update({name + " (call)": [] for name in public})
        for _ in range(reps):
            for name, fn in variants.items():
                res[name].append(tf(M, N, K, (graph_median_ms if graphs else bench)(lambda: fn(a, b))))
                if name in public:
                    res[name + " (call)"].append(tf(M, N, K, bench(lambda: fn(a, b))))
        cub = max(res["cuBLAS"])
        cub_med = statistics.median(res["cuBLAS"])
        for name, v in res.items():
            # paired: each repetition against the cuBLAS call of the same repetition (clocks drift)
            paired = statistics.median(x / c for x, c in zip(v, res["cuBLAS"]))
            row = dict(phase=phase, case=label, M=M, N=N, K=K, series=name, tflops=v, ratio=max(v) / cub,
                       ratio_median=statistics.median(v) / cub_med, ratio_paired_median=paired)
            rows.append(row)
            print(f"{label:10s} {M:>5}x{N:>5}x{K:>5} {name:30s} " + " ".join(f"{x:7.1f}" for x in v)
                  + f"  ratio {max(v) / cub:.3f} (medians {statistics.median(v) / cub_med:.3f}, paired {paired:.3f})",
                  flush=True)
        del a, b
        torch.cuda.empty_cache()

    cublas = lambda a, b: torch.matmul(a, b)
    both = ("cuBLAS", "tilecore.gemm")
    if phase == "time":
        print("graph replays (GPU time); '(call)' = do_bench of the Python call, host included", flush=True)
        for s in (4096, 8192, 16384):
            compare("square", s, s, s, {"cuBLAS": cublas, "tilecore.gemm": lambda a, b: tilecore.gemm(a, b),
                                        "GROUP_M=16": lambda a, b: gluon(a, b, group_m=16)},
                    reps=3 if s < 16384 else 2, public=both)
        for k in (64, 128, 256, 512, 1024):
            compare("persistent", 4096, 4096, k, {"cuBLAS": cublas, "tilecore.gemm": lambda a, b: tilecore.gemm(a, b),
                                                  "128x256x64": lambda a, b: gluon(a, b, block=(128, 256, 64), stages=3),
                                                  "128x128x64": lambda a, b: gluon(a, b, block=(128, 128, 64), stages=4)},
                    reps=2, public=both)
    if phase == "reps4096":
        # 4096^3 sits at parity: enough interleaved repetitions for a median of the ratio to mean something
        compare("square", 4096, 4096, 4096, {"cuBLAS": cublas, "tilecore.gemm": lambda a, b: tilecore.gemm(a, b),
                                             "GROUP_M=4": lambda a, b: gluon(a, b, group_m=4),
                                             "GROUP_M=16": lambda a, b: gluon(a, b, group_m=16)}, reps=10)
        compare("square", 8192, 8192, 8192, {"cuBLAS": cublas, "tilecore.gemm": lambda a, b: tilecore.gemm(a, b),
                                             "GROUP_M=4": lambda a, b: gluon(a, b, group_m=4)}, reps=6)
    if phase == "streamk":
        print("graph replays (GPU time), A B A B interleaved; whole tiles = the same kernel without the stream-K tail",
              flush=True)
        sk = {"cuBLAS": cublas, "auto (default)": lambda a, b: gluon(a, b),
              "stream-K always": lambda a, b: gluon(a, b, stream_k="always"),
              "whole tiles": lambda a, b: gluon(a, b, stream_k="off")}
        for s_ in (4096, 8192, 16384):
            compare("square", s_, s_, s_, sk, reps=6 if s_ < 16384 else 2)
        for k in (512, 1024):
            compare("persistent", 4096, 4096, k, sk, reps=2)
        compare("few tiles", 1024, 1024, 16384, sk, reps=2)
        compare("tail", 3000, 2056, 4096, sk, reps=2)
        s_ = 8192
        a = torch.randn(s_, s_, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(s_, s_, device=dev).to(torch.float8_e4m3fn).t()
        sa = torch.rand(s_, 1, device=dev) + 0.5
        sb = torch.rand(1, s_, device=dev) + 0.5
        fns = {"torch._scaled_mm": lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
               "fp8 stream-K always": lambda: gluon(a, b, sa=sa, sb=sb, stream_k="always"),
               "fp8 whole tiles": lambda: gluon(a, b, sa=sa, sb=sb, stream_k="off")}
        res = {}
        for _ in range(2):
            for n, f in fns.items():
                f()
                res.setdefault(n, []).append(tf(s_, s_, s_, graph_median_ms(f)))
        base = max(res["torch._scaled_mm"])
        for n, v in res.items():
            rows.append(dict(phase=phase, case="fp8 rows", M=s_, N=s_, K=s_, series=n, tflops=v, ratio=max(v) / base))
            print(f"fp8 rows {s_:>5}^3 {n:22s} " + " ".join(f"{x:7.1f}" for x in v) + f"  ratio {max(v) / base:.3f}",
                  flush=True)
    if phase == "ablate":
        v = {"cuBLAS": cublas}
        for st in (1, 2, 3, 4):
            v[f"stages={st}"] = (lambda st: lambda a, b: gluon(a, b, stages=st, epilogue_bytes=32768))(st)
        compare("depth", 4096, 4096, 4096, v, reps=2)
        for s in (8192, 16384):
            compare("order", s, s, s, {"cuBLAS": cublas, "GROUP_M=1 (row-major)": lambda a, b: gluon(a, b, group_m=1),
                                       "GROUP_M=4": lambda a, b: gluon(a, b, group_m=4),
                                       "GROUP_M=8": lambda a, b: gluon(a, b, group_m=8),
                                       "GROUP_M=16": lambda a, b: gluon(a, b, group_m=16)}, reps=2)
    if phase == "fp8":
        for s in (4096, 8192):
            a = torch.randn(s, s, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(s, s, device=dev).to(torch.float8_e4m3fn).t()
            for rowwise in (False, True):
                sa = torch.rand(s, 1, device=dev) + 0.5 if rowwise else torch.tensor(0.75, device=dev)
                sb = torch.rand(1, s, device=dev) + 0.5 if rowwise else torch.tensor(1.25, device=dev)
                fns = {"torch._scaled_mm": lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                       "tilecore.gemm_fp8": lambda: tilecore.gemm_fp8(a, b, sa, sb)}
                res = {}
                for _ in range(2):
                    for n, f in fns.items():
                        f()
                        res.setdefault(n, []).append(tf(s, s, s, graph_median_ms(f)))
                        res.setdefault(n + " (call)", []).append(tf(s, s, s, bench(f)))
                base = max(res["torch._scaled_mm"])
                del res["torch._scaled_mm (call)"]
                for n, v in res.items():
                    rows.append(dict(phase=phase, case="fp8 rows" if rowwise else "fp8 tensor", M=s, N=s, K=s,
                                     series=n, tflops=v, ratio=max(v) / base))
                    print(f"fp8 {'rows  ' if rowwise else 'tensor'} {s:>5}^3 {n:22s} " + " ".join(f"{x:7.1f}" for x in v)
                          + f"  ratio {max(v) / base:.3f}", flush=True)
    with open(os.path.join(out_dir, f"gemm_{phase}.json"), "w") as f:
        json.dump({"meta": env.metadata(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--phases", default="check,time,ablate,fp8")
    p.add_argument("--child")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    if args.child:
        child(args.child, args.out)
    else:
        parent(args)

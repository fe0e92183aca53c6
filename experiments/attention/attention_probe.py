"""GPU check and timing of tilecore.attention, in phases that each run in a child process with a time
limit (an illegal address in one phase must not lose the others' results).

    PYTHONPATH=. python3 experiments/attention/attention_probe.py [--phases check,time,sweep,compile] [--out DIR]
    PYTHONPATH=. python3 experiments/attention/attention_probe.py --dry      (the check's logic on the CPU)

check: bf16 and fp16, forward and backward (public API + autograd) against a float64 reference, as
    error / rounding floor; outputs of a second, direct call (launch.forward_into,
    backward_into: the same plan) into NaN-poisoned buffers must equal the first bit for bit (every element
    written, deterministic); rows with no key give 0, lse = -inf and zero dq. torch SDPA (flash) on
    the same data where its masking is the same (N == Nk).
time: B=16 H=16 N=4096, D 64 and 128, causal and not, bf16: forward and backward TFLOP/s of tilecore,
    SDPA cuDNN and SDPA flash, interleaved in one process (forward 4 B H N^2 D, halved when causal;
    backward 2.5x the forward's).
sweep: a few forward block shapes of the Gluon forward (launch.forward_into(path="gluon", config=)
    with block_m, block_n, stages) of the same cases, and with SWEEP_BWD=1 the tl backward's
    (backward_into(path="tl", config=)), within what time is left.
public: the forward through the public function against direct calls (launch.forward_into with the
    Gluon path forced, and planned), interleaved.
bench: the attention bench suite, quick (N = 4096), saved as JSON and PNG.
compile: torch.compile(fullgraph=True) (inductor) of forward + backward through the custom ops.

(Until the tiles v2 port this probe also had phases bwd, parts, tiles, variants and schedule, which
timed unshipped forward and backward variants (dQ modes, Q buffers, ping-pong, the carried pipeline,
round-robin against balanced tiles) and swapped kernels' internals to do it: git show
bb6b420:scripts/device/attention_probe.py. Their figures are in notes/attention/.)
"""
import argparse
import json
import os
import subprocess
import sys
import time

LIMITS = {"public": 120, "check": 200, "time": 60, "sweep": 150, "bench": 65, "compile": 60}  # the run gets 300 s
B, H, N = 16, 16, 4096


def parent(args):
    results = {}
    t0 = time.time()
    for phase in args.phases.split(","):
        t = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, "--child", phase, "--out", args.out],
                               timeout=LIMITS[phase], capture_output=True, text=True)
            status, out, err = f"rc={r.returncode}", r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            status = "TIMEOUT"
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        results[phase] = status
        print(f"===== phase {phase}: {status}, {time.time() - t:.0f} s (total {time.time() - t0:.0f} s)", flush=True)
        print(out[-3500:], flush=True)
        if err.strip():
            print("stderr:", err[-1500:], flush=True)
        with open(os.path.join(args.out, "attention_probe.log"), "a") as f:
            f.write(f"===== phase {phase}: {status}\n{out}\n--- stderr ---\n{err}\n")
    summary(args.out)


def summary(out_dir):
    """The short table, last: TFLOP/s and ratios from the time phase (and the sweep's best)."""
    path = os.path.join(out_dir, "attention_time.json")
    if not os.path.exists(path):
        print("no timing results")
        return
    data = json.load(open(path))
    best = {}
    sweep_path = os.path.join(out_dir, "attention_sweep.json")
    if os.path.exists(sweep_path):
        for r in json.load(open(sweep_path))["rows"]:
            key = (r["D"], r["causal"], r["pass"])
            best[key] = max(best.get(key, 0), r["tflops"])
    print(f"\n{data['meta']['gpu']} | torch {data['meta']['torch']} | triton {data['meta']['triton']} | "
          f"B={B} H={H} N={N} bf16, TFLOP/s")
    print(f"{'D':>4} {'causal':>6} {'pass':>4} {'tilecore':>9} {'best cfg':>8} {'cuDNN':>7} {'flash':>7} "
          f"{'/cuDNN':>7} {'/flash':>7}")
    for r in data["rows"]:
        tc, cu, fl = r["tilecore"], r.get("cuDNN (SDPA)"), r.get("flash (SDPA)")
        bc = best.get((r["D"], r["causal"], r["pass"]))
        f = lambda x: f"{x:7.0f}" if x else "      -"
        print(f"{r['D']:>4} {str(r['causal']):>6} {r['pass']:>4} {tc:9.0f} {bc or 0:8.0f} {f(cu)} {f(fl)} "
              f"{tc / cu if cu else 0:7.2f} {tc / fl if fl else 0:7.2f}")


# ------------------------------------------------------------------------------------------------


def _meta():
    import torch
    import triton

    gpu = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {"gpu": gpu.name if gpu else "cpu (dry run)", "sms": gpu.multi_processor_count if gpu else 0, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def check(out_dir, dry=False):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tilecore
    from tilecore.accuracy import error_over_floor
    from tilecore.ops.attention import launch
    from tilecore.ops.attention.reference import attention_reference

    dev = "cpu" if dry else "cuda"
    cases = [  # B, Hq, Hkv, N, Nk, D, causal
        (2, 8, 2, 1000, 1000, 64, False), (2, 8, 2, 1000, 1000, 64, True),
        (1, 4, 4, 4097, 4097, 128, False), (1, 4, 4, 4097, 4097, 128, True),
        (1, 4, 1, 1000, 4097, 96, True), (1, 4, 2, 4097, 1000, 128, True),
        (2, 4, 4, 1, 17, 64, True), (2, 4, 4, 17, 17, 256, False), (1, 2, 2, 1000, 1000, 80, True),
        (2, 8, 4, 777, 1500, 128, False, "bnhd"), (2, 8, 8, 300, 300, 64, True, "bnhd"),
    ]
    if dry:  # the script's own logic on the CPU, through the interpreter (fp16: its bf16 dot is wrong)
        cases = [(1, 2, 1, 17, 40, 16, True), (1, 2, 2, 40, 17, 80, True), (1, 2, 2, 17, 17, 64, False)]
        plan = [(torch.float16, c) for c in cases]
    else:
        # every case in bf16, cases 2 to 5 also in fp16 (each new shape class compiles four kernels)
        plan = [(torch.bfloat16, c) for c in cases] + [(torch.float16, c) for c in cases[1:5]]
    rows = []
    for dtype, (b, hq, hkv, n, nk, d, causal, *layout) in plan:
        g = torch.Generator(device=dev).manual_seed(n * 7 + d)

        def mk(h, length):  # "bnhd": (B, N, H, D) memory seen as (B, H, N, D), as many models store it
            if layout:
                return torch.randn(b, length, h, d, device=dev, dtype=dtype, generator=g).transpose(1, 2).requires_grad_()
            return torch.randn(b, h, length, d, device=dev, dtype=dtype, generator=g).requires_grad_()
        q, k, v = mk(hq, n), mk(hkv, nk), mk(hkv, nk)
        do = torch.randn(b, hq, n, d, device=dev, dtype=dtype, generator=g)
        out, lse = tilecore.attention(q, k, v, causal=causal, return_lse=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ro, rl = attention_reference(q64, k64, v64, causal=causal)
        rdq, rdk, rdv = torch.autograd.grad(ro, (q64, k64, v64), do.double())
        scale = d ** -0.5
        # every element written, same bits: a direct call into NaN-poisoned buffers
        po = torch.full_like(out, float("nan"))
        pl = torch.full_like(lse, float("nan"))
        launch.forward_into(q.detach(), k.detach(), v.detach(), po, pl, causal, scale)
        pdq, pdk, pdv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        launch.backward_into(do, q.detach(), k.detach(), v.detach(), out, lse, None, pdq, pdk, pdv,
                             causal, scale)
        # dq of the Gluon backward sums float32 atomics in no fixed order: every element written and
        # as accurate as the first call's, not the same bits
        dq_same = torch.equal(pdq, dq)
        dq_ok = dq_same or (bool(torch.isfinite(pdq).all()) and error_over_floor(pdq, rdq) < 4)
        same = (torch.equal(po, out) and torch.equal(pl, lse) and dq_ok
                and torch.equal(pdk, dk) and torch.equal(pdv, dv))
        finite = all(bool(torch.isfinite(t).all()) for t in (out, dq, dk, dv))
        empty = max(0, n - nk) if causal else 0  # rows with no key to attend to
        empty_ok = empty == 0 or bool((out[:, :, :empty] == 0).all() and (dq[:, :, :empty] == 0).all()
                                      and torch.isneginf(lse[:, :, :empty]).all())
        live = torch.isfinite(rl)
        lse_err = float((lse.double() - rl)[live].abs().max()) if live.any() else 0.0
        row = dict(dtype=str(dtype)[6:], B=b, Hq=hq, Hkv=hkv, N=n, Nk=nk, D=d, causal=causal,
                   out=error_over_floor(out, ro), dq=error_over_floor(dq, rdq), dk=error_over_floor(dk, rdk),
                   dv=error_over_floor(dv, rdv), lse_max_abs=lse_err, same_bits_poisoned=same,
                   finite=finite, empty_rows_ok=empty_ok, dq_same_bits=dq_same)
        if n == nk:  # SDPA's causal is top-left aligned: compare only where the masks agree
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    so = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
                sg = torch.autograd.grad(so, (q, k, v), do)
                row.update(flash_out=error_over_floor(so, ro), flash_dq=error_over_floor(sg[0], rdq),
                           flash_dk=error_over_floor(sg[1], rdk), flash_dv=error_over_floor(sg[2], rdv))
            except RuntimeError as e:
                row["flash"] = f"unavailable: {str(e)[:60]}"
        rows.append(row)
        json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_check.json"), "w"),
                  indent=1)
        ok = same and finite and empty_ok and max(row["out"], row["dq"], row["dk"], row["dv"]) < 4
        print(f"{'ok  ' if ok else 'FAIL'} {row['dtype']}{' ' + layout[0] if layout else ''} B{b} H{hq}/{hkv} N{n} Nk{nk} D{d} causal={causal}: "
              f"err/floor out {row['out']:.2f} dq {row['dq']:.2f} dk {row['dk']:.2f} dv {row['dv']:.2f} "
              f"lse {lse_err:.1e}" + (f" | flash out {row['flash_out']:.2f} dq {row['flash_dq']:.2f} "
                                      f"dk {row['flash_dk']:.2f} dv {row['flash_dv']:.2f}" if "flash_out" in row else "")
              + ("" if same else " NOT-ALL-WRITTEN/NONDETERMINISTIC") + ("" if empty_ok else " EMPTY-ROWS-WRONG")
              + ("" if dq_same else " (dq: other bits)"),
              flush=True)
        del q, k, v, do, out, lse, dq, dk, dv, q64, k64, v64, ro, rl, rdq, rdk, rdv
        torch.cuda.empty_cache()


def _inputs(d, dtype=None):
    import torch

    dtype = dtype or torch.bfloat16
    mk = lambda: torch.randn(B, H, N, d, device="cuda", dtype=dtype).requires_grad_()
    return mk(), mk(), mk(), torch.randn(B, H, N, d, device="cuda", dtype=dtype)


def _fwd_flops(d, causal):
    return 4 * B * H * N * N * d / (2 if causal else 1)


def _series():
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tilecore

    def sdpa(backend):
        def f(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f
    return {"tilecore": lambda q, k, v, causal: tilecore.attention(q, k, v, causal=causal),
            "cuDNN (SDPA)": sdpa(SDPBackend.CUDNN_ATTENTION), "flash (SDPA)": sdpa(SDPBackend.FLASH_ATTENTION)}


def timing(out_dir):
    import torch
    from triton.testing import do_bench

    rows = []
    for d in (64, 128):
        q, k, v, do = _inputs(d)
        for causal in (False, True):
            fl = _fwd_flops(d, causal)
            fwd, bwd = {}, {}
            for name, f in _series().items():
                try:
                    with torch.no_grad():
                        fwd[name] = do_bench(lambda: f(q, k, v, causal), warmup=25, rep=100, return_mode="median")
                    out = f(q, k, v, causal)
                    bwd[name] = do_bench(lambda: out.backward(do, retain_graph=True), warmup=25, rep=100,
                                         grad_to_none=[q, k, v], return_mode="median")
                    del out
                except RuntimeError as e:
                    print(f"{name} D={d} causal={causal}: {str(e)[:100]}")
            for p, ms in (("fwd", fwd), ("bwd", bwd)):
                mult = 1 if p == "fwd" else 2.5
                row = {"D": d, "causal": causal, "pass": p, "ms": ms}
                row.update({name: mult * fl / t / 1e9 for name, t in ms.items()})
                rows.append(row)
                print(f"D={d} causal={causal} {p}: " + ", ".join(f"{n} {row[n]:.0f} TFLOP/s ({t:.3f} ms)"
                                                                 for n, t in ms.items()), flush=True)
            json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_time.json"), "w"), indent=1)
        del q, k, v, do
        torch.cuda.empty_cache()


def sweep(out_dir):
    import torch
    from triton.testing import do_bench

    from tilecore.ops.attention import launch

    t0 = time.time()
    # the second run's candidates, next to the defaults the first run picked (configs.*_config)
    # forward: the Gluon kernel's blocks and ring depth (the tl kernel's best for reference);
    # backward: the tl kernels' candidates (only when asked: SWEEP_BWD=1)
    G = lambda bm, bn, st: dict(block_m=bm, block_n=bn, stages=st)
    fwd_cfgs = {64: [G(64, 128, 3), G(64, 64, 3), G(64, 64, 4)],
                128: [G(64, 128, 2), G(64, 64, 3), G(64, 64, 2)]}
    bwd_cfgs = [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
                dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2)] if os.environ.get("SWEEP_BWD") else []
    rows = []
    for d in (64, 128):
        q, k, v, do = (t.detach() for t in _inputs(d))
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for causal in (False, True):
            fl = _fwd_flops(d, causal)
            for p, cfgs in (("fwd", fwd_cfgs[d]), ("bwd", bwd_cfgs)):
                for cfg in cfgs:
                    if time.time() - t0 > LIMITS["sweep"] - 12:
                        break
                    if p == "fwd" and "block_m" in cfg:
                        fn = lambda: launch.forward_into(q, k, v, out, lse, causal, d ** -0.5, path="gluon",
                                                         config=cfg)
                    elif p == "fwd":
                        fn = lambda: launch.forward_into(q, k, v, out, lse, causal, d ** -0.5, path="tl", config=cfg)
                    else:
                        launch.forward_into(q, k, v, out, lse, causal, d ** -0.5)
                        fn = lambda: launch.backward_into(do, q, k, v, out, lse, None, dq, dk, dv, causal,
                                                          d ** -0.5, path="tl", config=cfg)
                    if p == "fwd" and "block_m" in cfg:  # scheduling variants must give the default's bits
                        ref_o, ref_l = torch.empty_like(out), torch.empty_like(lse)
                        launch.forward_into(q, k, v, ref_o, ref_l, causal, d ** -0.5)
                        out.fill_(float("nan"))
                        lse.fill_(float("nan"))
                        fn()
                        same = torch.equal(out, ref_o) and torch.equal(lse, ref_l)
                        print(f"D={d} causal={causal} {cfg}: same bits as the default: {same}", flush=True)
                        del ref_o, ref_l
                    try:
                        ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                        print(f"D={d} causal={causal} {p} {cfg}: {type(e).__name__} {str(e)[:80]}")
                        continue
                    tf = (1 if p == "fwd" else 2.5) * fl / ms / 1e9
                    rows.append({"D": d, "causal": causal, "pass": p, "cfg": cfg, "ms": ms, "tflops": tf})
                    print(f"D={d} causal={causal} {p} {cfg}: {tf:.0f} TFLOP/s", flush=True)
                    json.dump({"meta": _meta(), "rows": rows},
                              open(os.path.join(out_dir, "attention_sweep.json"), "w"), indent=1)
        del q, k, v, do, out, dq, dk, dv
        torch.cuda.empty_cache()


def public_gap(out_dir):
    """The forward through the public function against direct calls, same process, interleaved:
    where does the gap between the sweep's and the time phase's figures come from?"""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import tilecore
    from tilecore.ops.attention import configs, launch

    rows = []
    for d in (128, 64):
        q, k, v, _ = _inputs(d)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        for causal in (False, True):
            fl = _fwd_flops(d, causal)
            out, lse = torch.empty_like(qd), torch.empty(B, H, N, device="cuda")
            cfg = configs.GLUON_FORWARD[d]

            def fresh():
                o, l = torch.empty_like(qd), torch.empty(B, H, N, device="cuda")
                launch.forward_into(qd, kd, vd, o, l, causal, d ** -0.5)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)

            fns = {"forward_into, gluon path": lambda: launch.forward_into(qd, kd, vd, out, lse, causal, d ** -0.5,
                                                                           path="gluon", config=cfg),
                   "forward_into, fresh outputs": fresh,
                   "tilecore.attention (detached)": lambda: tilecore.attention(qd, kd, vd, causal=causal),
                   "tilecore.attention (requires_grad, no_grad)": lambda: _no_grad(tilecore.attention, q, k, v, causal),
                   "cuDNN": cudnn}
            res = {name: [] for name in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    res[name].append(fl / do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e9)
            rows.append({"D": d, "causal": causal, "tflops": res})
            print(f"D={d} causal={causal}: " + ", ".join(f"{n} {' '.join(f'{x:.0f}' for x in v)}" for n, v in res.items()),
                  flush=True)
            json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_public_gap.json"), "w"),
                      indent=1)


def _no_grad(f, q, k, v, causal):
    import torch

    with torch.no_grad():
        return f(q, k, v, causal=causal)


def bench(out_dir):
    """The bench suite (tilecore bench attention --quick), saved under out_dir: checks the suite."""
    from pathlib import Path

    from tilecore.bench import harness
    from tilecore.bench.suites import SUITES

    result = harness.run_suite(SUITES["attention"], quick=True)
    print(harness.table(result))
    harness.save(result, Path(out_dir))


def compile_check(out_dir):
    import torch

    import tilecore

    q, k, v = (torch.randn(2, 4, 257, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    f = torch.compile(lambda q, k, v: tilecore.attention(q, k, v, causal=True).float().square().sum(), fullgraph=True)
    t = time.time()
    loss = f(q, k, v)
    loss.backward()
    g = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    tilecore.attention(q, k, v, causal=True).float().square().sum().backward()
    same = all(torch.allclose(a, x.grad, rtol=1e-2, atol=1e-2) for a, x in zip(g, (q, k, v)))
    print(f"torch.compile(fullgraph=True, inductor) fwd+bwd: {time.time() - t:.1f} s, grads match eager: {same}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="check,time,sweep,compile")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "../../notes/attention/runs")))
    ap.add_argument("--child")
    ap.add_argument("--dry", action="store_true", help="run the check phase's logic on the CPU, small")
    args = ap.parse_args()
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"
        return check(args.out, dry=True)
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        {"check": check, "time": timing, "sweep": sweep, "bench": bench, "compile": compile_check,
         "public": public_gap}[args.child](args.out)
    else:
        parent(args)


if __name__ == "__main__":
    main()

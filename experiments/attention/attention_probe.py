"""GPU check and timing of tilecore.attention, in phases that each run in a child process with a time
limit (an illegal address in one phase must not lose the others' results).

    PYTHONPATH=. python3 scripts/device/attention_probe.py [--phases check,time,sweep,compile] [--out DIR]

check: bf16 and fp16, forward and backward (public API + autograd) against a float64 reference, as
    error / rounding floor; outputs of a second, direct kernel call into NaN-poisoned buffers must
    equal the first bit for bit (every element written, deterministic); rows with no key give 0,
    lse = -inf and zero dq. torch SDPA (flash) on the same data where its masking is the same (N == Nk).
time: B=16 H=16 N=4096, D 64 and 128, causal and not, bf16: forward and backward TFLOP/s of tilecore,
    SDPA cuDNN and SDPA flash, interleaved in one process (forward 4 B H N^2 D, halved when causal;
    backward 2.5x the forward's).
sweep: a few forward and backward block shapes of the same cases, within what time is left.
bench: the attention bench suite, quick (N = 4096), saved as JSON and PNG.
compile: torch.compile(fullgraph=True) (inductor) of forward + backward through the custom ops.
bwd: the backward's variants (Gluon with dq fused or not, tl), each checked on a small GQA case
    with tails, then timed directly next to cuDNN's and flash's backward.
parts: where the Gluon backward's time goes: the preprocess (delta, with and without zeroing the
    float32 dQ buffer), a separate memset, the kernel alone, the float32 -> bf16 conversion of dQ, the tl dq
    kernel, and the whole backward_into, next to cuDNN's autograd backward.
tiles: the forward's per-tile cost: one or two Q buffers per consumer, the ping-pong order,
    N = 512 .. 4096, next to cuDNN.
variants: forward options (FWD_VARIANTS) over the default config, each checked against float64 on
    odd shapes and on "growing" scores (the row max keeps rising along the keys), then timed at
    N = 4096, 1024, 512 (B * N fixed) next to the default and cuDNN, interleaved three times.
schedule: causal tiles from a balanced schedule against round-robin (forward, two and three
    consumers; backward): same bits checked, then timed next to cuDNN.
"""
import argparse
import json
import os
import subprocess
import sys
import time

LIMITS = {"schedule": 420, "variants": 520, "tiles": 330, "public": 120, "check": 200, "time": 60, "sweep": 150, "bench": 65, "compile": 60, "bwd": 240, "parts": 120}  # the run gets 300 s
B, H, N = 16, 16, 4096
# the variants phase's candidates (kernels.forward_gluon options over gluon_forward_config's), and lengths
# (B * N fixed at 16 x 4096 tokens a head). Session 8 tried lazy_rescale (O rescaled only when a
# row max grew by > 2^8; removed: 3-11% slower), the carry, three consumers and a later P V
# wait (removed: no gain); notes/attention.md. Session 9: 64-key blocks for short tiles, the ring
# depth, Q buffers and key blocks at N = 4096 and 8192, then one Q buffer against D128's two.
# Session 10: the pipeline carried across tiles at D64 (causal N = 4096 is its weakest forward point).
# Session 12: two against three consumers at D64 once causal tiles count from the last row (the
# partial tile, where N is not a multiple of the tile's rows, became the lightest, not the heaviest).
# Then three consumers with a deeper ring (4, 5 stages: slower everywhere, removed), and two against
# three again at N = 8192 (causal: +0.2% and +7.8% in two runs).
# Session 13: a tile's row blocks rotated among the consumers from tile to tile (removed: 2-7%
# slower causal), then three consumers with two Q buffers each (the rotated variant had them).
# Then the causal first block's mask hidden from the compiler or not (a "hide" knob, removed once
# hidden won: notes/attention_fwd_hide_session13_h100.json), and two against three consumers again.
# Last, two against three consumers where causal tiles are shortest (N = 512, 1024).
# Session 14: the consumers' ping-pong order at D = 128 once more (session 2's g7 found it neutral),
# then Q as the register operand of S = Q K^T (loaded once a tile).
# Session 22: deeper rings where causal tiles take 64-key blocks (N <= 1024: their stages are half
# as large; session 9 had read D128 N = 512 causal 293 -> 304 TFLOP/s with 4 stages, unshipped).
# First run: D128 3 stages +8.3% (N 512) / +2.8% (1024), D64 4 stages -1% / +1%
# (notes/attention_fwd_short_causal_stages_session22_h100.json); then 3 against 4 at D128 (3 shipped).
# Then D64's short causal tiles: the pipeline carried or not, two or three consumers, ping-pong.
FWD_VARIANTS = {"not carried": dict(carry=False, consumers=2, only_d=64, only_causal=True),
                "carried, 2 consumers": dict(carry=True, consumers=2, only_d=64, only_causal=True),
                "3 consumers": dict(carry=False, consumers=3, q_buffers=2, only_d=64, only_causal=True),
                "ping-pong": dict(carry=False, consumers=2, pingpong=True, only_d=64, only_causal=True)}
VARIANT_LENGTHS = (512, 1024)
VARIANT_HEAD_DIMS = (64,)
VARIANT_REPEATS = 5


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
    from tilecore.ops.attention import kernels
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
        kernels.forward_into(q.detach(), k.detach(), v.detach(), po, pl, causal, scale)
        pdq, pdk, pdv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        kernels.backward_into(do, q.detach(), k.detach(), v.detach(), out, lse, None, pdq, pdk, pdv,
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


def _same_tokens(n, d):
    """Random bf16 q, k, v of length n with B * N tokens a head (batch b = B * N / n), and empty
    out and lse for the forward: (b, q, k, v, out, lse)."""
    import torch

    b = B * N // n
    q, k, v = (torch.randn(b, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return b, q, k, v, torch.empty_like(q), torch.empty(b, H, n, device="cuda")


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

    from tilecore.ops.attention import kernels

    t0 = time.time()
    # the second run's candidates, next to the defaults the first run picked (kernels.*_config)
    # forward: the Gluon kernel's blocks and ring depth (the tl kernel's best for reference);
    # backward: the tl kernels' candidates (only when asked: SWEEP_BWD=1)
    G = lambda bm, bn, st, ovl, c: dict(block_m=bm, block_n=bn, stages=st, overlap=ovl, consumers=c)
    fwd_cfgs = {64: [G(64, 128, 3, True, 2), G(64, 64, 3, True, 2), G(64, 64, 4, True, 2)],
                128: [G(64, 128, 2, True, 2), G(64, 64, 3, True, 2), G(64, 64, 2, True, 2)]}
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
                        fn = lambda: kernels.forward_gluon(q, k, v, out, lse, causal, d ** -0.5, **cfg)
                    elif p == "fwd":
                        fn = lambda: kernels.forward_into(q, k, v, out, lse, causal, d ** -0.5, config=cfg)
                    else:
                        kernels.forward_into(q, k, v, out, lse, causal, d ** -0.5)
                        fn = lambda: kernels.backward_into(do, q, k, v, out, lse, None, dq, dk, dv, causal,
                                                           d ** -0.5, config=cfg)
                    if p == "fwd" and "block_m" in cfg:  # scheduling variants must give the default's bits
                        ref_o, ref_l = torch.empty_like(out), torch.empty_like(lse)
                        kernels.forward_into(q, k, v, ref_o, ref_l, causal, d ** -0.5)
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


def backward_variants(out_dir):
    """The backward's variants, timed directly (GPU time, delta preprocess included) next to cuDNN's
    and flash's autograd backward in the same process: the Gluon kernel with dq fused (atomics) or
    from the tl dq kernel, and the tl kernels. Each Gluon variant is first checked against the tl
    kernels' gradients (error over the rounding floor of a float64 reference, small shape)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from tilecore.accuracy import error_over_floor
    from tilecore.ops.attention import kernels
    from tilecore.ops.attention.reference import reference_grads

    G = lambda **kw: dict(block_m=64, block_n=64, stages=2, dq_from="fused") | kw
    variants_by_d = {
        64: {"overlapped": G(dq_from="overlapped"), "+ gluon dq": G(dq_from="gluon"),
             "+ gluon dq, 64 keys": G(dq_from="gluon", dq_config=dict(block_m=64, block_n=64, stages=4))},
        128: {"fused": G(), "+ tl dq": G(dq_from="tl"), "+ gluon dq": G(dq_from="gluon"),
              "+ gluon dq, 128 keys": G(dq_from="gluon", dq_config=dict(block_m=64, block_n=128, stages=2))}}
    rows = []
    for d in (64, 128):
        variants = variants_by_d[d]
        for causal in (False, True):
            # correctness first: small GQA cases with tails (the second, causal, has 700 rows with
            # no key: their dq must be 0), float64 reference, gradients poisoned before the run
            for b, hq, hkv, n, nk in ((2, 4, 2, 700, 900), (1, 4, 1, 1000, 300)):
                g = torch.Generator(device="cuda").manual_seed(d + causal + n)
                mk = lambda h, length: torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16, generator=g)
                q, k, v, do = mk(hq, n), mk(hkv, nk), mk(hkv, nk), mk(hq, n)
                ref = reference_grads(q, k, v, do, causal=causal)
                out, lse = torch.empty_like(q), torch.empty(b, hq, n, device="cuda")
                kernels.forward_into(q, k, v, out, lse, causal, d ** -0.5)
                for name, cfg in variants.items():
                    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                    kernels.backward_into(do, q, k, v, out, lse, None, *grads, causal, d ** -0.5, gluon=cfg)
                    errs = [error_over_floor(x, r) for x, r in zip(grads, ref)]
                    written = not any(x.isnan().any().item() for x in grads)
                    print(f"D={d} causal={causal} N{n} Nk{nk} {name}: err/floor dq {errs[0]:.2f} dk {errs[1]:.2f} "
                          f"dv {errs[2]:.2f}" + ("" if max(errs) < 4 and written else "  FAIL"), flush=True)
                del q, k, v, do, ref, out, lse
            # timing, B16 H16 N4096
            q, k, v, do = _inputs(d)
            fl = 2.5 * _fwd_flops(d, causal)
            qd, kd, vd = q.detach(), k.detach(), v.detach()
            out, lse = torch.empty_like(qd), torch.empty(B, H, N, device="cuda")
            kernels.forward_into(qd, kd, vd, out, lse, causal, d ** -0.5)
            dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
            ms = {}
            for name, cfg in list(variants.items()) + [("tl", None), ("dk/dv kernel alone", "alone")]:
                if cfg == "alone":  # the Gluon kernel without dq (the tl dq kernel skipped): the split
                    tl_dq, kernels._backward_dq = kernels._backward_dq, lambda *a, **k: None
                    kw = dict(gluon=G(dq_from="tl"))
                elif cfg:
                    kw = dict(gluon=cfg)
                else:
                    kw = dict(config=kernels.backward_config(d, interpret=False))
                fn = lambda: kernels.backward_into(do, qd, kd, vd, out, lse, None, dq, dk, dv, causal, d ** -0.5, **kw)
                try:
                    ms[name] = do_bench(fn, warmup=10, rep=50, return_mode="median")
                except Exception as e:  # noqa: BLE001 - record and go on
                    print(f"D={d} causal={causal} {name}: {type(e).__name__} {str(e)[:100]}", flush=True)
                if cfg == "alone":
                    kernels._backward_dq = tl_dq
            for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                ms[name] = do_bench(lambda: o.backward(do, retain_graph=True), warmup=10, rep=50,
                                    grad_to_none=[q, k, v], return_mode="median")
                del o
            tf = {name: fl / t / 1e9 for name, t in ms.items()}
            rows.append({"D": d, "causal": causal, "ms": ms, "tflops": tf})
            print(f"D={d} causal={causal} bwd TFLOP/s: " + ", ".join(
                f"{n} {t:.0f} ({t / tf['cuDNN']:.2f}x)" for n, t in tf.items()), flush=True)
            json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_bwd.json"), "w"), indent=1)
            del q, k, v, do, qd, kd, vd, out, lse, dq, dk, dv
            torch.cuda.empty_cache()


def backward_parts(out_dir):
    """Each part of the Gluon backward timed alone (GPU time, medians), B16 H16 N4096 bf16."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from tilecore.ops.attention import kernels

    bench = lambda f: do_bench(f, warmup=10, rep=50, return_mode="median")
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            cfg = kernels.key_split_config(d, causal)  # its dQ modes below
            q, k, v, do = _inputs(d)
            qd, kd, vd = q.detach(), k.detach(), v.detach()
            out, lse = torch.empty_like(qd), torch.empty(B, H, N, device="cuda")
            kernels.forward_into(qd, kd, vd, out, lse, causal, d ** -0.5)
            dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
            delta, dq_sum, stats = kernels.backward_preprocess(out, do, lse, None, dq_sum=True, row_stats=True)
            ms = {"delta": bench(lambda: kernels.backward_delta(out, do, lse, None)),
                  "delta + row stats + zero dq_sum": bench(lambda: kernels.backward_preprocess(
                      out, do, lse, None, dq_sum=True, row_stats=True)),
                  "delta + zero dq_sum": bench(lambda: kernels.backward_delta(out, do, lse, None, dq_sum=True)),
                  "memset dq_sum": bench(lambda: dq_sum.zero_()),
                  "convert dq": bench(lambda: dq.copy_(dq_sum))}
            for mode in ("fused", "overlapped", "tl"):
                c = cfg | dict(dq_from=mode)
                ms[f"kernel {mode}"] = bench(lambda: kernels.backward_gluon_kernel(
                    do, qd, kd, vd, stats, dq_sum, dk, dv, causal, d ** -0.5, **c))
            ms["tl dq kernel"] = bench(lambda: kernels._backward_dq(do, qd, kd, vd, lse, delta, dq, causal, d ** -0.5,
                                                                    kernels.backward_config(d, interpret=False)))
            ms["backward_into"] = bench(lambda: kernels.backward_into(do, qd, kd, vd, out, lse, None, dq, dk, dv,
                                                                      causal, d ** -0.5))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms["cuDNN backward"] = bench(lambda: o.backward(do, retain_graph=True))
            fl = 2.5 * _fwd_flops(d, causal)
            rows.append({"D": d, "causal": causal, "config": cfg, "ms": ms})
            print(f"D={d} causal={causal} ({cfg['dq_from']}): " + ", ".join(f"{n} {t:.3f}" for n, t in ms.items())
                  + f" | backward_into {fl / ms['backward_into'] / 1e9:.0f} TFLOP/s, cuDNN {fl / ms['cuDNN backward'] / 1e9:.0f}",
                  flush=True)
            json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_bwd_parts.json"), "w"), indent=1)
            del q, k, v, do, qd, kd, vd, out, lse, dq, dk, dv, delta, dq_sum, o
            torch.cuda.empty_cache()


def public_gap(out_dir):
    """The forward through the public function against direct kernel calls, same process, interleaved:
    where does the gap between the sweep's and the time phase's figures come from?"""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import tilecore
    from tilecore.ops.attention import kernels

    rows = []
    for d in (128, 64):
        q, k, v, _ = _inputs(d)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        for causal in (False, True):
            fl = _fwd_flops(d, causal)
            out, lse = torch.empty_like(qd), torch.empty(B, H, N, device="cuda")
            cfg = kernels.GLUON_FORWARD[d]

            def fresh():
                o, l = torch.empty_like(qd), torch.empty(B, H, N, device="cuda")
                kernels.forward_into(qd, kd, vd, o, l, causal, d ** -0.5)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)

            fns = {"direct forward_gluon": lambda: kernels.forward_gluon(qd, kd, vd, out, lse, causal, d ** -0.5, **cfg),
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


def _next_to_cudnn(fns, q, k, v, causal, flops, label, repeats=3):
    """TFLOP/s of each of ``fns`` and of cuDNN's forward on q, k, v: ``repeats`` repetitions taking
    them in turn; prints the medians and their ratio to cuDNN's, returns every repetition's figures."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tilecore.bench.harness import interleaved_ms

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ms = interleaved_ms(dict(fns, cuDNN=cudnn), repeats, warmup_ms=10, rep_ms=50)
    res = {name: [flops / t / 1e9 for t in ts] for name, ts in ms.items()}
    med = {name: sorted(x)[repeats // 2] for name, x in res.items()}
    print(f"{label}: " + ", ".join(f"{name} {m:.0f} ({m / med['cuDNN']:.3f}x)" for name, m in med.items()), flush=True)
    return res


def tile_costs(out_dir):
    """The forward's per-tile cost: the Gluon forward with one or two Q buffers per consumer
    (``q_buffers``), poisoned outputs checked bit for bit against the default, then timed next to
    cuDNN, interleaved three times, at N = 512, 1024, 4096 with B * N fixed (16 x 4096 tokens a head):
    fewer key blocks a tile means more tiles, so time(N) separates the per-tile cost from the per-block one."""
    import torch

    from tilecore.ops.attention import kernels

    # (session 5 also timed a release of Q one step before a tile's end, alone and with two buffers:
    # within noise of two buffers; removed, its code is at a26a475, notes/attention.md f2)
    variants = {"q1": dict(q_buffers=1), "q2": dict(q_buffers=2), "q2 pingpong": dict(q_buffers=2, pingpong=True)}
    rows = []
    for d in (128, 64):
        for n in (4096, 1024, 512):
            b, q, k, v, out, lse = _same_tokens(n, d)
            for causal in (False, True):
                fl = 4 * b * H * n * n * d / (2 if causal else 1)
                ref_o, ref_l = torch.empty_like(q), torch.empty_like(lse)
                kernels.forward_gluon(q, k, v, ref_o, ref_l, causal, d ** -0.5, **kernels.GLUON_FORWARD[d])
                fns = {}
                for name, opts in variants.items():
                    cfg = dict(kernels.GLUON_FORWARD[d], **opts)
                    out.fill_(float("nan"))
                    lse.fill_(float("nan"))
                    kernels.forward_gluon(q, k, v, out, lse, causal, d ** -0.5, **cfg)
                    same = torch.equal(out, ref_o) and torch.equal(lse, ref_l)
                    if n == 4096 or not same:  # a line per variant once (it ran), then only mismatches
                        print(f"D={d} N={n} causal={causal} {name}: ran, same bits as the default: {same}", flush=True)
                    fns[name] = (lambda cfg=cfg: kernels.forward_gluon(q, k, v, out, lse, causal, d ** -0.5, **cfg))
                res = _next_to_cudnn(fns, q, k, v, causal, fl, f"D={d} N={n} causal={causal}")
                rows.append({"D": d, "N": n, "B": b, "causal": causal, "tflops": res})
                json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_tile_costs.json"), "w"),
                          indent=1)
            del q, k, v, out, lse, ref_o, ref_l
            torch.cuda.empty_cache()


def _variants(d, causal):
    """The default and FWD_VARIANTS's options for head dim d (an entry's only_d and only_causal
    restrict it)."""
    out = {"default": {}}
    for name, opts in FWD_VARIANTS.items():
        if opts.get("only_d", d) == d and opts.get("only_causal", causal) == causal:
            out[name] = {k: v for k, v in opts.items() if k not in ("only_d", "only_causal")}
    return out


def fwd_variants(out_dir):
    """FWD_VARIANTS against float64 (error over the rounding floor, outputs poisoned), then timed."""
    import torch

    from tilecore.accuracy import error_over_floor
    from tilecore.ops.attention import kernels
    from tilecore.ops.attention.reference import attention_reference

    cases = [(2, 8, 2, 1000, 1000, 64, False, ""), (2, 8, 2, 1000, 1000, 64, True, "growing"),
             (1, 4, 2, 4097, 1000, 128, True, ""), (1, 4, 1, 1000, 4097, 128, False, "growing"),
             (2, 4, 4, 1, 17, 64, True, ""), (2, 4, 4, 1000, 1000, 128, True, "growing")]
    bad = 0
    for b, hq, hkv, n, nk, d, causal, kind in cases:
        g = torch.Generator(device="cuda").manual_seed(n + nk + d)
        mk = lambda h, length: torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16, generator=g)
        q, k, v = mk(hq, n), mk(hkv, nk), mk(hkv, nk)
        if kind == "growing":  # scores' spread rises 8x along the keys: the row max moves by >> 2^8 often
            k = (k.float() * torch.linspace(1, 8, nk, device="cuda")[:, None]).to(k.dtype)
            q = q * 2
        ro, rl = attention_reference(q.double(), k.double(), v.double(), causal=causal)
        line = []
        for name, opts in _variants(d, causal).items():
            out = torch.full_like(q, float("nan"))
            lse = torch.full((b, hq, n), float("nan"), device="cuda")
            kernels.forward_gluon(q, k, v, out, lse, causal, d ** -0.5, **(kernels.gluon_forward_config(d, n, nk, causal) | opts))
            torch.cuda.synchronize()
            written = not out.isnan().any().item() and not lse.isnan().any().item()
            err = error_over_floor(out, ro)
            fin = rl.isfinite()
            lse_err = (lse.double() - rl)[fin].abs().max().item() if fin.any() else 0.0
            same_inf = torch.equal(lse.isinf(), rl.isinf())
            ok = written and err < 2.0 and lse_err < 1e-3 and same_inf
            bad += not ok
            line.append(f"{name} {err:.3f}x floor, lse {lse_err:.1e}{'' if ok else ' FAIL'}")
        print(f"D={d} causal={causal} B{b} H{hq}/{hkv} N{n} Nk{nk} {kind}: " + "; ".join(line), flush=True)
    print(f"VARIANTS CHECK: {bad} bad", flush=True)
    rows = []
    for d in VARIANT_HEAD_DIMS:
        for n in VARIANT_LENGTHS:
            b, q, k, v, out, lse = _same_tokens(n, d)
            for causal in (False, True):
                fl = 4 * b * H * n * n * d / (2 if causal else 1)
                fns = {name: (lambda opts=opts: kernels.forward_gluon(
                    q, k, v, out, lse, causal, d ** -0.5, **(kernels.gluon_forward_config(d, n, n, causal) | opts)))
                    for name, opts in _variants(d, causal).items()}
                res = _next_to_cudnn(fns, q, k, v, causal, fl, f"D={d} N={n} causal={causal}", VARIANT_REPEATS)
                rows.append({"D": d, "N": n, "B": b, "causal": causal, "tflops": res})
                json.dump({"meta": _meta(), "variants": FWD_VARIANTS, "rows": rows},
                          open(os.path.join(out_dir, "attention_fwd_variants.json"), "w"), indent=1)
            del q, k, v, out, lse
            torch.cuda.empty_cache()


def causal_schedule(out_dir):
    """Causal tiles from a balanced schedule (tiles.schedule.balanced_schedule) against round-robin:
    the forward (two and, at D = 64, three consumers) and the backward. Checked first: the same
    bits both ways (a tile's work does not depend on which program runs it; the backward's dq adds
    in no fixed order, so dk and dv only), and the balanced default against float64; then timed next
    to cuDNN, interleaved three times, N = 1024 .. 16384 with B * N fixed."""
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from tilecore.accuracy import error_over_floor
    from tilecore.ops.attention import kernels
    from tilecore.ops.attention.reference import attention_reference

    rr_tables = {}

    def rr_table(device, *key):  # a table that holds round-robin: what reading a table costs
        if key not in rr_tables:
            programs = key[-1]
            owner = torch.arange(triton.cdiv(key[1], key[3]) * key[5]) % programs
            offsets = programs + 1 + torch.cumsum(torch.bincount(owner, minlength=programs), 0)
            rr_tables[key] = torch.cat([torch.tensor([programs + 1]), offsets, torch.argsort(owner, stable=True),
                                        torch.zeros(1, dtype=torch.int64)]).to(torch.int32).to(device)
        return rr_tables[key]

    def forward(q, k, v, out, lse, d, cfg):
        cfg = dict(cfg)
        if cfg.pop("rr_table", False):
            kernels.causal_schedule, real = rr_table, kernels.causal_schedule
            try:
                kernels.forward_gluon(q, k, v, out, lse, True, d ** -0.5, **cfg)
            finally:
                kernels.causal_schedule = real
        else:
            kernels.forward_gluon(q, k, v, out, lse, True, d ** -0.5, **cfg)

    def configs(d, n):
        base = kernels.gluon_forward_config(d, n, n, True)
        out = {"2c rr": dict(base, consumers=2, balanced=False), "2c balanced": dict(base, consumers=2),
               "2c rr table": dict(base, consumers=2, rr_table=True)}
        if d == 64:
            three = dict(base, consumers=3, q_buffers=1)
            three.pop("carry", None)
            out |= {"3c rr": dict(three, balanced=False), "3c balanced": three}
        return out

    bad = 0
    for b, hq, hkv, n, nk, d in ((2, 8, 2, 1000, 1000, 64), (1, 4, 2, 4097, 1000, 128), (2, 4, 4, 3000, 3000, 128),
                                 (3, 6, 3, 2500, 2600, 64)):
        g = torch.Generator(device="cuda").manual_seed(n + nk + d)
        mk = lambda h, length: torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16, generator=g)
        q, k, v = mk(hq, n), mk(hkv, nk), mk(hkv, nk)
        ro, _ = attention_reference(q.double(), k.double(), v.double(), causal=True)
        outs = {}
        for name, cfg in configs(d, n).items():
            out = torch.full_like(q, float("nan"))
            lse = torch.full((b, hq, n), float("nan"), device="cuda")
            forward(q, k, v, out, lse, d, cfg)
            outs[name] = (out, lse)
        line = []
        for name, (out, lse) in outs.items():
            twin = outs[name.replace("balanced", "rr").replace(" table", "")]
            same = torch.equal(out, twin[0]) and torch.equal(lse, twin[1])
            err = error_over_floor(out, ro)
            ok = same and err < 2.0 and not out.isnan().any().item()
            bad += not ok
            line.append(f"{name} {err:.3f}x floor{'' if same else ' DIFFERS from rr'}{'' if ok else ' FAIL'}")
        # backward: dk, dv bit for bit, both ways
        do = mk(hq, n)
        out, lse = outs["2c rr"]
        grads = {}
        for balanced in (False, True):
            gq, gk, gv = (torch.full_like(t, float("nan")) for t in (q, k, v))
            kernels.backward_into(do, q, k, v, out, lse, None, gq, gk, gv, True, d ** -0.5,
                                  gluon=dict(kernels.GLUON_BACKWARD[d, True], balanced=balanced))
            grads[balanced] = (gq, gk, gv)
        same = torch.equal(grads[0][1], grads[1][1]) and torch.equal(grads[0][2], grads[1][2])
        dq_close = (grads[0][0].float() - grads[1][0].float()).abs().max().item()
        bad += not same
        line.append(f"bwd dk/dv same bits: {same}, dq max diff {dq_close:.1e}")
        print(f"D={d} B{b} H{hq}/{hkv} N{n} Nk{nk}: " + "; ".join(line), flush=True)
    print(f"SCHEDULE CHECK: {bad} bad", flush=True)

    rows = []
    for d in (64, 128):
        for n in (4096, 1024, 2048, 16384):
            b, q, k, v, out, lse = _same_tokens(n, d)
            fl = 2 * b * H * n * n * d
            fns = {name: (lambda cfg=cfg: forward(q, k, v, out, lse, d, cfg)) for name, cfg in configs(d, n).items()}
            res = _next_to_cudnn(fns, q, k, v, True, fl, f"fwd D={d} N={n} causal")
            rows.append({"pass": "fwd", "D": d, "N": n, "B": b, "tflops": res})
            if n == 4096:  # the backward, balanced or not, next to cuDNN's
                do = torch.randn_like(q)
                kernels.forward_into(q, k, v, out, lse, True, d ** -0.5)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
                fns = {f"bwd {'balanced' if bal else 'rr'}": (lambda bal=bal: kernels.backward_into(
                    do, q, k, v, out, lse, None, dq, dk, dv, True, d ** -0.5,
                    gluon=dict(kernels.GLUON_BACKWARD[d, True], balanced=bal))) for bal in (False, True)}
                fns["cuDNN"] = lambda: o.backward(do, retain_graph=True)
                res = {name: [] for name in fns}
                for _ in range(3):
                    for name, fn in fns.items():
                        ms = do_bench(fn, warmup=10, rep=50, grad_to_none=[qg, kg, vg], return_mode="median")
                        res[name].append(2.5 * fl / ms / 1e9)
                med = {name: sorted(x)[1] for name, x in res.items()}
                print(f"bwd D={d} N={n} causal: " + ", ".join(f"{name} {m:.0f} ({m / med['cuDNN']:.3f}x)"
                                                            for name, m in med.items()), flush=True)
                rows.append({"pass": "bwd", "D": d, "N": n, "B": b, "tflops": res})
                del do, dq, dk, dv, qg, kg, vg, o
            json.dump({"meta": _meta(), "rows": rows}, open(os.path.join(out_dir, "attention_schedule.json"), "w"),
                      indent=1)
            del q, k, v, out, lse
            torch.cuda.empty_cache()


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
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--child")
    ap.add_argument("--dry", action="store_true", help="run the check phase's logic on the CPU, small")
    args = ap.parse_args()
    if args.dry:
        os.environ["TRITON_INTERPRET"] = "1"
        return check(args.out, dry=True)
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        {"check": check, "time": timing, "sweep": sweep, "bench": bench, "compile": compile_check,
         "bwd": backward_variants, "parts": backward_parts, "public": public_gap,
         "tiles": tile_costs, "variants": fwd_variants, "schedule": causal_schedule}[args.child](args.out)
    else:
        parent(args)


if __name__ == "__main__":
    main()

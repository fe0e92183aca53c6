"""The tiles v2 port on the GPU: the ported kernels against the code before the port, in one call.

Two snapshots of the ``tilecore`` package (``--old DIR``, ``--new DIR``, each holding a ``tilecore/``)
are run in turn, ROUNDS times interleaved, each in its own process: every case is checked (a digest
of each output of fixed-seed inputs, compared between the two trees: bit for bit, and against a float64
reference as a multiple of the rounding floor) and timed (GPU time: ``triton.testing.do_bench``
medians after warm-up, through the public ops). The table gives new / old per case (> 1: the port
is faster) from the medians of the rounds.

    python experiments/tiles/port_check.py --old .port/old --new .port/new [--rounds 3] [--out DIR] [--only attn]

``--only TEXT`` keeps the cases whose name contains TEXT (``attn``: the attention forward and backward; several
texts separated by commas: any of them).
"""
import argparse
import hashlib
import json
import os
import statistics
import zlib
import subprocess
import sys


def cases(only: str = ""):
    """(name, kind, params): the ported kernels' shipped configurations, at sizes that fill the chip."""
    if only:  # comma-separated: a case whose name contains any of them
        return [c for c in cases() if any(part and part in c[0] for part in only.split(","))]
    out = []
    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 256), (1024, 1024, 16384)):
        out.append((f"gemm bf16 {m}x{n}x{k}", "gemm", dict(m=m, n=n, k=k)))
    out.append(("gemm_fp8 8192^3", "gemm_fp8", dict(m=8192, n=8192, k=8192)))
    for n in (16384, 32768):
        out.append((f"hadamard bf16 n={n}", "hadamard", dict(rows=2 ** 28 // n, n=n)))
    for d, n, causal, b, h, hkv in ((64, 4096, False, 16, 16, 16), (64, 4096, True, 16, 16, 16),
                                    (128, 4096, False, 16, 16, 16), (128, 4096, True, 16, 16, 16),
                                    (128, 512, True, 128, 16, 16), (128, 1024, False, 64, 16, 16),
                                    (64, 1024, False, 64, 16, 16), (64, 2048, True, 32, 16, 16),
                                    (64, 8192, False, 8, 16, 16), (128, 4096, True, 8, 32, 8)):
        name = f"attn fwd D{d} N{n}{' causal' if causal else ''}{' gqa' if hkv != h else ''}"
        out.append((name, "attention", dict(b=b, h=h, hkv=hkv, n=n, d=d, causal=causal)))
    for d, n, causal, b, h, hkv in ((64, 4096, False, 16, 16, 16), (64, 4096, True, 16, 16, 16),
                                    (128, 4096, False, 16, 16, 16), (128, 4096, True, 16, 16, 16),
                                    (128, 1024, True, 64, 16, 16), (128, 2048, False, 32, 16, 16),
                                    (64, 4096, True, 8, 32, 8), (128, 4096, True, 8, 32, 8)):
        name = f"attn bwd D{d} N{n}{' causal' if causal else ''}{' gqa' if hkv != h else ''}"
        out.append((name, "attention_bwd", dict(b=b, h=h, hkv=hkv, n=n, d=d, causal=causal)))
    return out


def worker(tree: str, save: str, check: bool, only: str = ""):
    sys.path.insert(0, tree)
    import torch
    import triton

    import tilecore
    assert tilecore.__file__.startswith(os.path.abspath(tree)), tilecore.__file__
    dev = "cuda"
    rows = []
    for name, kind, p in cases(only):
        g = torch.Generator(device=dev).manual_seed(zlib.crc32(name.encode()))
        if kind in ("gemm", "gemm_fp8"):
            a = torch.randn(p["m"], p["k"], device=dev, generator=g)
            b = torch.randn(p["k"], p["n"], device=dev, generator=g)
            if kind == "gemm":
                a, b = a.bfloat16(), b.bfloat16()
                fn = lambda: tilecore.gemm(a, b)
            else:
                a8 = a.to(torch.float8_e4m3fn)
                b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
                one = torch.ones((), device=dev)
                fn = lambda: tilecore.gemm_fp8(a8, b8, one, one)
            flops = 2 * p["m"] * p["n"] * p["k"]
        elif kind == "hadamard":
            x = torch.randn(p["rows"], p["n"], device=dev, generator=g).bfloat16()
            fn = lambda: tilecore.hadamard_transform(x, scale=p["n"] ** -0.5)
            flops = None
        elif kind == "attention_bwd":
            q, k, v = (torch.randn(p["b"], hh, p["n"], p["d"], device=dev, generator=g).bfloat16().requires_grad_()
                       for hh in (p["h"], p["hkv"], p["hkv"]))
            do = torch.randn(p["b"], p["h"], p["n"], p["d"], device=dev, generator=g).bfloat16()
            o = tilecore.attention(q, k, v, causal=p["causal"])
            fn = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            flops = 10 * p["b"] * p["h"] * p["n"] * p["n"] * p["d"] // (2 if p["causal"] else 1)
        else:
            q = torch.randn(p["b"], p["h"], p["n"], p["d"], device=dev, generator=g).bfloat16()
            k = torch.randn(p["b"], p["hkv"], p["n"], p["d"], device=dev, generator=g).bfloat16()
            v = torch.randn(p["b"], p["hkv"], p["n"], p["d"], device=dev, generator=g).bfloat16()
            fn = lambda: tilecore.attention(q, k, v, causal=p["causal"])
            flops = 4 * p["b"] * p["h"] * p["n"] * p["n"] * p["d"] // (2 if p["causal"] else 1)
        with torch.inference_mode(kind != "attention_bwd"):
            y = fn()
            torch.cuda.synchronize()
            # dQ is summed by TMA reductions in no fixed order: only dK and dV are bit-reproducible
            exact = y[1:] if kind == "attention_bwd" else (y,)
            digest = hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
                                             for t in exact)).hexdigest() if check else None
            ms = triton.testing.do_bench(fn, warmup=100, rep=400, return_mode="median")
        row = dict(case=name, ms=ms, tflops=flops / ms / 1e9 if flops else None, digest=digest)
        if check and kind == "attention":  # the float64 reference on a slice of heads
            hs = slice(0, 2)
            qd, kd, vd = (t[:1, hs].double() for t in (q, k if p["hkv"] == p["h"] else k.repeat_interleave(
                p["h"] // p["hkv"], 1), v if p["hkv"] == p["h"] else v.repeat_interleave(p["h"] // p["hkv"], 1)))
            ref = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=p["causal"])
            err = (y[:1, hs].double() - ref).abs().max().item()
            floor = (ref.bfloat16().double() - ref).abs().max().item()
            row["err_over_floor"] = err / floor
        if check and kind == "attention_bwd":  # float64 reference of the first kv head's group
            grp = p["h"] // p["hkv"]
            qd = q[:1, :grp].detach().double().requires_grad_()
            kd = k[:1, :1].detach().double().requires_grad_()
            vd = v[:1, :1].detach().double().requires_grad_()
            ref_o = torch.nn.functional.scaled_dot_product_attention(
                qd, kd.expand(-1, grp, -1, -1), vd.expand(-1, grp, -1, -1), is_causal=p["causal"])
            refs = torch.autograd.grad(ref_o, (qd, kd, vd), do[:1, :grp].double())
            worst = 0.0
            for got, ref in zip((y[0][:1, :grp], y[1][:1, :1], y[2][:1, :1]), refs):
                floor = (ref.bfloat16().double() - ref).abs().max().item()
                worst = max(worst, (got.double() - ref).abs().max().item() / floor)
            row["err_over_floor"] = worst
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old")
    ap.add_argument("--new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--worker")
    ap.add_argument("--save")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.save, a.check, a.only)
        return
    saves = {t: "-" for t in ("old", "new")}
    times = {t: {} for t in saves}
    extra = {}
    for r in range(a.rounds):
        for tag, tree in (("old", a.old), ("new", a.new)):
            cmd = [sys.executable, __file__, "--worker", tree, "--save", saves[tag], "--only", a.only] + (
                ["--check"] if r == 0 else [])
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                print(f"{tag} round {r} failed:\n{res.stderr[-4000:]}")
                sys.exit(1)
            for line in res.stdout.splitlines():
                row = json.loads(line)
                times[tag].setdefault(row["case"], []).append(row["ms"])
                if "err_over_floor" in row:
                    extra.setdefault(row["case"], {})[f"err_over_floor_{tag}"] = row["err_over_floor"]
                if row["digest"]:
                    extra.setdefault(row["case"], {})[f"digest_{tag}"] = row["digest"]
        # each round's table is written as it completes, so a run cut short by a time limit still reports
        report(a, times, extra, r + 1)


def report(a, times, extra, rounds):
    import torch
    import triton
    table = []
    for name, _, _ in cases(a.only):
        e = extra.get(name, {})
        same = e.get("digest_old") == e.get("digest_new")
        mo, mn = statistics.median(times["old"][name]), statistics.median(times["new"][name])
        table.append(dict(case=name, old_ms=mo, new_ms=mn, new_over_old_speed=mo / mn, bitwise_equal=same,
                          old_rounds=times["old"][name], new_rounds=times["new"][name],
                          **{k: v for k, v in e.items() if k.startswith("err")}))
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                rounds=rounds, timing="GPU time, do_bench median, public ops, interleaved old/new processes")
    with open(os.path.join(a.out, "port_check.json"), "w") as fh:
        json.dump(dict(meta=meta, rows=table), fh, indent=1)
    print(json.dumps(meta))
    print(f"{'case':32s} {'old ms':>9s} {'new ms':>9s} {'speed':>7s}  bitwise  err/floor")
    for t in table:
        print(f"{t['case']:32s} {t['old_ms']:9.4f} {t['new_ms']:9.4f} {t['new_over_old_speed']:7.3f}  "
              f"{str(t['bitwise_equal']):7s}  {t.get('err_over_floor_new', '')}", flush=True)


if __name__ == "__main__":
    main()

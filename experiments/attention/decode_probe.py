"""GPU check and timing of the split-key (decode) path of tilecore.attention.

    PYTHONPATH=. python3 experiments/attention/decode_probe.py [--phases check,time,cross] [--out DIR]

check: bf16 and fp16 at decode shapes (1-16 queries, grouped heads, tails, causal rows with no key,
    a strided cache), public API and a direct call into NaN-poisoned buffers, against float64: error
    as a multiple of the rounding floor, lse error, empty rows 0 / -inf.
time: one query against Nk cached keys, Hq 32 / Hkv 8 D 128 bf16 (the bench suite's cases): GB/s of
    the split-key path's variants (keys a step, ring depth, programs a SM aimed at), the query-block
    forward it replaces, and torch SDPA's flash and cuDNN, against copy, interleaved three times.
The split-key path's calls go through launch.forward_into(path="decode", config=, splits=); a
variant aiming at P programs a SM passes the splits plan.decode_splits gives for P * SMs programs.

host: host time a call (no sync between calls) and GPU time (CUDA graph of back-to-back calls) of
    the public function, the split-key kernels alone and SDPA at small decode shapes, a cProfile of
    the public call.
parts: GPU time (CUDA graph of back-to-back calls: what a server that captures decode sees) of the
    split-key path's variants and SDPA's flash and cuDNN, as x copy (Hq 32 / Hkv 8, D 128, 1 query).
cross: 16 queries (speculative decode, chunked prefill's tail) against 1024-16384 keys: the split-key
    path against the query-block forward (Gluon), grouped and multi-head, GPU time, for the threshold.
"""
import argparse
import itertools
import json
import os
import statistics
import time

import torch

PHASES = ("check", "time", "cross", "host", "parts")


def _meta():
    import triton

    gpu = torch.cuda.get_device_properties(0)
    return {"gpu": gpu.name, "sms": gpu.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "commit": os.environ.get("TILECORE_COMMIT"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def check():
    from tilecore import accuracy
    from tilecore.ops.attention import attention, attention_reference, launch

    rows = []
    cases = [  # B, Hq, Hkv, N, Nk, D, causal, layout
        (4, 32, 8, 1, 4097, 128, False, "bhnd"), (2, 32, 8, 1, 16384, 128, False, "cache"),
        (3, 64, 8, 3, 1000, 128, True, "bhnd"), (2, 16, 16, 16, 4097, 64, True, "bhnd"),
        (1, 32, 1, 4, 17, 128, True, "bhnd"), (2, 8, 2, 16, 10, 64, True, "bhnd"),
        (1, 4, 1, 1, 1, 96, False, "bhnd"), (16, 32, 8, 1, 2048, 64, False, "cache"),
        # up to 64 queries where a kv head packs at most 128 rows: two row blocks, D 256, N > Nk
        (2, 32, 8, 32, 3000, 128, True, "bhnd"), (2, 16, 16, 64, 5000, 64, False, "cache"),
        (1, 8, 4, 50, 20, 256, True, "bhnd"), (3, 8, 8, 17, 33, 256, False, "bhnd"),
        # few query tiles (B = 1 chunked prefill): up to 512 queries, many row blocks
        (1, 8, 8, 300, 5000, 128, True, "bhnd"), (1, 32, 8, 128, 20000, 64, False, "cache"),
        (1, 4, 2, 512, 400, 128, True, "bhnd"),
        (8200, 8, 8, 1, 40, 64, False, "bhnd"),  # more than 65535 (batch, kv head) programs
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for b, hq, hkv, n, nk, d, causal, layout in cases:
            torch.manual_seed(len(rows))
            q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype)
            if layout == "cache":  # the first nk rows of a (B, Nmax, Hkv, D) cache
                k, v = (torch.randn(b, nk + 300, hkv, d, device="cuda", dtype=dtype)[:, :nk].transpose(1, 2)
                        for _ in range(2))
            else:
                k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype) for _ in range(2))
            ref, ref_lse = attention_reference(q, k, v, causal=causal)
            out, lse = attention(q, k, v, causal=causal, return_lse=True)
            o2 = torch.full_like(out, float("nan"))
            l2 = torch.full_like(lse, float("nan"))
            launch.forward_into(q, k, v, o2, l2, causal, d ** -0.5, path="decode")
            torch.cuda.synchronize()
            empty = torch.isneginf(ref_lse)
            live = ~empty
            row = dict(dtype=str(dtype)[6:], B=b, Hq=hq, Hkv=hkv, N=n, Nk=nk, D=d, causal=causal, layout=layout,
                       err_floor=accuracy.error_over_floor(out, ref),
                       lse_err=float((lse[live].double() - ref_lse[live]).abs().max()) if live.any() else 0.0,
                       written=bool(not torch.isnan(o2).any() and not torch.isnan(l2).any()),
                       same_bits=bool(torch.equal(o2, out) and torch.equal(l2, lse)),
                       empty_rows_ok=bool((out[empty] == 0).all() and torch.isneginf(lse[empty]).all()))
            row["ok"] = (row["err_floor"] <= 2.0 and row["lse_err"] < 1e-3 and row["written"] and row["same_bits"]
                         and row["empty_rows_ok"])
            rows.append(row)
            print(f"{row['dtype']:9} B{b} H{hq}/{hkv} N{n} Nk{nk} D{d} {'causal' if causal else 'full':6} {layout:5} "
                  f"err {row['err_floor']:.2f}x floor, lse {row['lse_err']:.1e}, written {row['written']}, "
                  f"same bits {row['same_bits']}, empty rows {row['empty_rows_ok']} -> {'ok' if row['ok'] else 'FAIL'}",
                  flush=True)
    return rows


def _sdpa(backend):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q, k, v):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return f


def _splits(q, k, config, programs_per_sm):
    """The key ranges plan_forward's decode plan picks (plan.decode_splits), but aiming at
    ``programs_per_sm`` programs a SM instead of configs.DECODE_PROGRAMS_PER_SM."""
    from tilecore import dispatch
    from tilecore.ops.attention import configs as attention_configs
    from tilecore.ops.attention_decode import configs, plan
    from tilecore.tiles.launch import cdiv

    B, Hq, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    interpret = dispatch.interpreted(q.device)
    block_n = (config or configs.decode_config(D, interpret))["BLOCK_N"]
    row_blocks = cdiv(N * (Hq // Hkv), plan.tile_rows(N, Hq // Hkv))
    sms = attention_configs.INTERPRETER_SMS if interpret else dispatch.num_sms(q.device)
    return plan.decode_splits(B * Hkv * row_blocks, Nk, block_n, programs_per_sm * sms, configs.DECODE_MIN_SPLIT_KEYS)


def _split_keys(config=None, programs_per_sm=None):
    from tilecore.ops.attention import launch

    def f(q, k, v):
        B, Hq, N, D = q.shape
        out = torch.empty_like(q)
        lse = torch.empty((B, Hq, N), device=q.device, dtype=torch.float32)
        splits = _splits(q, k, config, programs_per_sm) if programs_per_sm else None
        launch.forward_into(q, k, v, out, lse, False, D ** -0.5, path="decode", config=config, splits=splits)
        return out
    return f


def _query_blocks(q, k, v):
    from tilecore.ops.attention import launch

    B, Hq, N, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, N), device=q.device, dtype=torch.float32)
    # the query-block (Gluon) forward itself at its planned config (configs.gluon_forward_config):
    # without path="gluon" the plan would take the split-key path here
    launch.forward_into(q, k, v, out, lse, False, D ** -0.5, path="gluon")
    return out


def _timed(impls, make_set, nbytes, repeats=3):
    from tilecore.bench.harness import interleaved_ms, rotating

    nxt = rotating(make_set, nbytes)
    fns = {}
    for name, f in impls.items():
        try:
            f(*nxt())
        except RuntimeError as err:
            print(f"  {name}: refused ({str(err)[:80]})")
            continue
        fns[name] = (lambda f: lambda: f(*nxt()))(f)
    with torch.no_grad():
        ms = interleaved_ms(fns, repeats)
    return {name: statistics.median(ts) for name, ts in ms.items()}


TIME_VARIANTS = {
    "split (default)": _split_keys(),
    "split n128 s3": _split_keys(dict(BLOCK_N=128, num_warps=4, num_stages=3)),
    "split n64 s4": _split_keys(dict(BLOCK_N=64, num_warps=4, num_stages=4)),
    "split n64 s2": _split_keys(dict(BLOCK_N=64, num_warps=4, num_stages=2)),
    "split n64 w8": _split_keys(dict(BLOCK_N=64, num_warps=8, num_stages=3)),
    "split 2/SM": _split_keys(programs_per_sm=2),
    "split 8/SM": _split_keys(programs_per_sm=8),
}


def time_decode(copy_gbs):
    import tilecore

    hq, hkv, d = 32, 8, 128
    impls = dict(TIME_VARIANTS)
    impls.update({"public": lambda q, k, v: tilecore.attention(q, k, v), "query blocks": _query_blocks,
                  "flash (SDPA)": _sdpa("FLASH_ATTENTION"), "cuDNN (SDPA)": _sdpa("CUDNN_ATTENTION")})
    rows = []
    for b in (1, 16, 64):
        for nk in (1024, 4096, 16384):
            nbytes = 2 * (2 * b * hkv * nk * d + 2 * b * hq * d)

            def make_set():
                return (torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16),
                        *(torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)))
            ms = _timed(impls, make_set, nbytes)
            row = dict(B=b, Nk=nk, ms=ms, gbs={n: nbytes / t / 1e6 for n, t in ms.items()})
            rows.append(row)
            print(f"B{b:3} Nk{nk:6}: " + "  ".join(f"{n} {row['gbs'][n] / copy_gbs:.2f}" for n in ms), flush=True)
    return rows


CROSS_HEADS = ((32, 8, 128), (32, 32, 128), (32, 8, 64), (32, 32, 64))
CROSS_SIZES = ((1, 16384), (4, 8192), (16, 2048), (64, 1024))


def cross(queries=(16,), heads=CROSS_HEADS, sizes=CROSS_SIZES):
    """A few queries: the split-key path against the query-block forward, GPU time (CUDA graph)."""
    from tilecore.bench.harness import graph_median_ms

    rows = []
    for hq, hkv, d in heads:
        for (b, nk), n in itertools.product(sizes, queries):
            q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            with torch.no_grad():
                us = {name: graph_median_ms(lambda: f(q, k, v)) * 1e3
                      for name, f in (("split", _split_keys()), ("query blocks", _query_blocks))}
            rows.append(dict(Hq=hq, Hkv=hkv, D=d, B=b, N=n, Nk=nk, us=us))
            print(f"N{n} H{hq}/{hkv} D{d} B{b} Nk{nk}: split {us['split']:.1f} us, query blocks "
                  f"{us['query blocks']:.1f} us ({us['query blocks'] / us['split']:.2f}x)", flush=True)
    return rows


def host():
    import cProfile
    import pstats

    import tilecore
    from tilecore.bench.harness import graph_median_ms, host_us

    rows = []
    hq, hkv, d = 32, 8, 128
    for b, nk in ((1, 1024), (1, 16384), (16, 4096)):
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        impls = {"public": lambda: tilecore.attention(q, k, v), "split kernels": lambda: _split_keys()(q, k, v),
                 "query blocks": lambda: _query_blocks(q, k, v), "flash (SDPA)": lambda: _sdpa("FLASH_ATTENTION")(q, k, v),
                 "cuDNN (SDPA)": lambda: _sdpa("CUDNN_ATTENTION")(q, k, v)}
        for name, f in impls.items():
            with torch.no_grad():
                host = host_us(f)
                gpu_us = graph_median_ms(f) * 1e3
            rows.append(dict(B=b, Nk=nk, impl=name, host_us=host, gpu_us=gpu_us))
            print(f"B{b} Nk{nk} {name:14}: host {host:6.1f} us a call, GPU {gpu_us:6.1f} us (graph)", flush=True)
    q = torch.randn(1, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, hkv, 1024, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            tilecore.attention(q, k, v)
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return rows


# parts phase: (keys a step, ring depth) tried beside decode_config's, per head dim; session 21 tried
# at D 128: 2 programs a SM, 64-key steps with 3 and 4 stages, 128 with 2, 32 with 6 (128 x 3 shipped)
PARTS_CONFIGS = {64: ((64, 3), (128, 4), (256, 3)), 128: ((64, 3),), 256: ((64, 2), (64, 3), (32, 4), (16, 6))}


def parts(heads=((32, 8, 128),)):
    """GPU time (CUDA graph of back-to-back calls) of split-key variants and SDPA, as x copy."""
    from tilecore.bench.harness import copy_ceiling, graph_median_ms

    copy = copy_ceiling().value
    rows = []
    for hq, hkv, d in heads:
        variants = {"default": {}} | {f"n{bn} s{st}": dict(config=dict(BLOCK_N=bn, num_warps=4, num_stages=st))
                                      for bn, st in PARTS_CONFIGS[d]}
        for b, nk in ((1, 1024), (1, 4096), (1, 16384), (4, 4096), (16, 1024), (16, 4096), (64, 4096)):
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            nbytes = 2 * (2 * b * hkv * nk * d + 2 * b * hq * d)
            impls = {name: _split_keys(**opts) for name, opts in variants.items()}
            impls.update({"flash (SDPA)": _sdpa("FLASH_ATTENTION"), "cuDNN (SDPA)": _sdpa("CUDNN_ATTENTION")})
            us = {}
            with torch.no_grad():
                for name, f in impls.items():
                    try:
                        us[name] = graph_median_ms(lambda: f(q, k, v)) * 1e3
                    except RuntimeError as err:  # a backend that refuses the head dim
                        print(f"  {name}: refused ({str(err)[:60]})")
            rows.append(dict(Hq=hq, Hkv=hkv, D=d, B=b, Nk=nk, bytes=nbytes, us=us, copy_gbs=copy))
            print(f"H{hq}/{hkv} D{d} B{b} Nk{nk} [{nbytes / 1e6:.1f} MB]: " + ", ".join(
                f"{n} {t:.1f} us ({nbytes / t / 1e3 / copy:.2f})" for n, t in us.items()), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--out", default=".")
    ap.add_argument("--queries", default="16", help="cross phase: query counts, comma-separated")
    ap.add_argument("--heads", default=None, help="cross and parts phases: Hq/Hkv/D triples, e.g. 32/8/128,8/8/128")
    ap.add_argument("--sizes", default=None, help="cross phase: B/Nk pairs, e.g. 1/2048,2/16384")
    args = ap.parse_args()
    from tilecore.bench.harness import copy_ceiling

    parse = lambda text: tuple(tuple(int(x) for x in item.split("/")) for item in text.split(","))
    result = {"meta": _meta()}
    ceiling = copy_ceiling()
    result["copy_gbs"] = ceiling.value
    print(result["meta"], f"copy {ceiling.value:.0f} GB/s", flush=True)
    for phase in args.phases.split(","):
        t = time.time()
        if phase == "check":
            result["check"] = check()
        elif phase == "time":
            result["time"] = time_decode(ceiling.value)
        elif phase == "cross":
            result["cross"] = cross(tuple(int(x) for x in args.queries.split(",")),
                                    parse(args.heads) if args.heads else CROSS_HEADS,
                                    parse(args.sizes) if args.sizes else CROSS_SIZES)
        elif phase == "parts":
            result["parts"] = parts(parse(args.heads) if args.heads else ((32, 8, 128),))
        elif phase == "host":
            result["host"] = host()
        print(f"===== {phase}: {time.time() - t:.0f} s", flush=True)
        with open(os.path.join(args.out, "decode_probe.json"), "w") as f:
            json.dump(result, f, indent=1)
    if "check" in result:
        print(f"check: {sum(r['ok'] for r in result['check'])}/{len(result['check'])} ok, worst err "
              f"{max(r['err_floor'] for r in result['check']):.2f}x floor")
    if "time" in result:
        names = list(result["time"][0]["gbs"])
        print("x copy | " + " | ".join(names))
        for r in result["time"]:
            print(f"B{r['B']} Nk{r['Nk']} | " + " | ".join(f"{r['gbs'].get(n, 0) / ceiling.value:.2f}" for n in names))


if __name__ == "__main__":
    main()

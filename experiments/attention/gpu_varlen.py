"""GPU check and timing of tilecore.attention_varlen and tilecore.attention_with_kvcache (issue 35
part B), with flash-attn's call signatures (tilecore.compat.flash_attn) checked too.

    PYTHONPATH=. python3 experiments/attention/gpu_varlen.py            # on the H100: check, then time
    PYTHONPATH=. python3 experiments/attention/gpu_varlen.py --quick    # the Gluon forward only, <= 90 s
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/attention/gpu_varlen.py --smoke --quick
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/attention/gpu_varlen.py --smoke   # CPU: tiny shapes

check (bf16 and fp16 against float64, error as a multiple of the rounding floor): packed batches with
    lengths 0, 1, odd and long (GQA, causal, window, softcap, Dv != D) forward into NaN-poisoned
    outputs and backward; paged (16..256) and contiguous caches poisoned with NaN past every length,
    decode and chunked prefill with the append; a CUDA graph of a paged decode step replayed after
    its lengths changed on the device; the compat functions against tilecore's own.
time (bf16, triton.testing.do_bench medians): a packed batch of 64K tokens, H 16, D 128, causal,
    lengths long-tailed (and 16 x 4096 uniform), forward and forward + backward, against
    tilecore.attention on the fixed-length batch B 16 x N 4096 (same tokens), FlexAttention compiled
    with the document mask, and SDPA on the padded batch; paged decode (B 32, 4096 keys each, Hq 32 /
    Hkv 8, D 128, one new token appended) for page sizes 16..256 against the contiguous cache and
    tilecore.attention's decode, as CUDA-graph replays (GPU time), with the copy bandwidth of the run.
quick (--quick, session 27): the Gluon varlen forward (gluon_varlen.py) in bf16/fp16 against float64
    (lengths 0, 1, odd, Nk != N, GQA, softcap, D64, a 64K-token long-tailed batch on 2 heads) into
    NaN-poisoned outputs with a sentinel past the end, and in a CUDA graph replayed with new
    cu_seqlens; then its time against the tl varlen forward, the fixed-length Gluon forward (B16 N4096,
    same tokens), SDPA on the padded batch and FlexAttention with the document mask (compiled, last).
Prints a table last; writes $OUT/gpu_varlen.json (default /tmp/out). Each case catches its errors.
"""
import argparse
import json
import math
import os
import time
import traceback

import torch

SMOKE = False
RESULTS = {"check": [], "time": [], "errors": []}


def _device():
    return "cpu" if SMOKE else "cuda"


def _meta():
    import triton

    meta = {"torch": torch.__version__, "triton": triton.__version__, "smoke": SMOKE,
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if torch.cuda.is_available() and not SMOKE:
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
    return meta


def guarded(name):
    def wrap(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - report and go on
                RESULTS["errors"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
                print(f"[error] {name}: {type(e).__name__}: {e}")
                traceback.print_exc()
        return run
    return wrap


def cu_of(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


# --------------------------------------------------------------------------------------------
# check


def check_varlen(dtype, lens_q, lens_k, hq, hkv, d, dv, options):
    from tilecore import accuracy
    from tilecore.ops.attention_varlen import op as varlen
    from tilecore.ops.attention_varlen.reference import varlen_reference

    dev = _device()
    cu_q, cu_k = cu_of(lens_q, dev), cu_of(lens_k, dev)
    q = torch.randn(sum(lens_q), hq, d, dtype=dtype, device=dev)
    k = torch.randn(sum(lens_k), hkv, d, dtype=dtype, device=dev)
    v = torch.randn(sum(lens_k), hkv, dv, dtype=dtype, device=dev)
    scale = options.get("scale", d ** -0.5)
    left, right = options.get("window_size", (-1, -1))
    args = (cu_q, cu_k, options.get("causal", False), scale, left, right, options.get("softcap", 0.0))
    out = torch.full((q.shape[0], hq, dv), float("nan"), dtype=dtype, device=dev)
    lse = torch.full((hq, q.shape[0]), float("nan"), device=dev)
    varlen.forward_kernels(q, k, v, *args, out=out, lse=lse)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = varlen_reference(q64, k64, v64, cu_q, cu_k, **options)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    loss = (ref * dout.double()).sum() + (torch.where(torch.isneginf(ref_lse), 0.0, ref_lse) * dlse.double()).sum()
    ref_grads = torch.autograd.grad(loss, (q64, k64, v64))
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    varlen.backward_kernels(dout, q, k, v, out, lse, dlse, *args, grads=grads)
    live = torch.isfinite(ref_lse)
    row = {"case": f"varlen {str(dtype)[6:]} q{lens_q} k{lens_k} H{hq}/{hkv} D{d}/{dv} {options}",
           "unwritten": int(out.isnan().sum() + lse.isnan().sum() + sum(g.isnan().sum() for g in grads)),
           "O_x_floor": accuracy.error_over_floor(out, ref.detach()),
           "lse_max_err": float((lse[live].double() - ref_lse.detach()[live]).abs().max()) if live.any() else 0.0,
           "empty_rows_ok": bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))),
           **{f"d{n}_x_floor": accuracy.error_over_floor(g, r) for n, g, r in zip("qkv", grads, ref_grads)}}
    row["ok"] = (row["unwritten"] == 0 and row["O_x_floor"] <= 2.0 and row["lse_max_err"] < 1e-3
                 and row["empty_rows_ok"] and all(row[f"d{n}_x_floor"] <= 3.0 for n in "qkv"))
    RESULTS["check"].append(row)


def make_cache(lengths, hkv, d, dv, page, dtype, dev, max_pages):
    """Caches with rows < length random and everything else NaN (paged: shuffled pages, page 0 NaN
    and every unused table entry naming it)."""
    b = len(lengths)
    if page is None:
        cap = max_pages
        k_cache = torch.full((b, cap, hkv, d), float("nan"), dtype=dtype, device=dev)
        v_cache = torch.full((b, cap, hkv, dv), float("nan"), dtype=dtype, device=dev)
        for i, n in enumerate(lengths):
            k_cache[i, :n] = torch.randn(n, hkv, d, dtype=dtype, device=dev)
            v_cache[i, :n] = torch.randn(n, hkv, dv, dtype=dtype, device=dev)
        return k_cache, v_cache, None
    pages = 1 + b * max_pages
    k_cache = torch.full((pages, page, hkv, d), float("nan"), dtype=dtype, device=dev)
    v_cache = torch.full((pages, page, hkv, dv), float("nan"), dtype=dtype, device=dev)
    table = (1 + torch.randperm(b * max_pages, device=dev)).view(b, max_pages).int()
    for i, n in enumerate(lengths):
        used = -(-n // page)
        kk = torch.randn(used * page, hkv, d, dtype=dtype, device=dev)
        vv = torch.randn(used * page, hkv, dv, dtype=dtype, device=dev)
        kk[n:] = float("nan")
        vv[n:] = float("nan")
        k_cache[table[i, :used].long()] = kk.view(used, page, hkv, d)
        v_cache[table[i, :used].long()] = vv.view(used, page, hkv, dv)
        table[i, used:] = 0
    return k_cache, v_cache, table


def check_kvcache(dtype, lengths, nnew, nq, hq, hkv, d, dv, page, options, max_pages):
    from tilecore import accuracy
    from tilecore.ops.attention_kvcache import attention_with_kvcache
    from tilecore.ops.attention_kvcache.reference import kvcache_reference

    dev = _device()
    total = [n + nnew for n in lengths]
    k_cache, v_cache, table = make_cache(total, hkv, d, dv, page, dtype, dev, max_pages)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=dev)
    new_k = torch.randn(len(lengths), nnew, hkv, d, dtype=dtype, device=dev)
    new_v = torch.randn(len(lengths), nnew, hkv, dv, dtype=dtype, device=dev)
    clean_k, clean_v = k_cache.clone(), v_cache.clone()
    q = torch.randn(len(lengths), nq, hq, d, dtype=dtype, device=dev)
    ref, ref_lse = kvcache_reference(q, clean_k, clean_v, seqlens, k=new_k if nnew else None,
                                     v=new_v if nnew else None, block_table=table, **options)
    out, lse = attention_with_kvcache(q, k_cache, v_cache, new_k if nnew else None, new_v if nnew else None,
                                      cache_seqlens=seqlens, block_table=table, return_lse=True, **options)
    live = torch.isfinite(ref_lse)
    row = {"case": f"kvcache {str(dtype)[6:]} lens{lengths}+{nnew} Nq{nq} H{hq}/{hkv} D{d}/{dv} page {page} {options}",
           "nan_read_or_unwritten": int(out.isnan().sum() + lse.isnan().sum()),
           "O_x_floor": accuracy.error_over_floor(out, ref),
           "lse_max_err": float((lse[live].double() - ref_lse[live]).abs().max()) if live.any() else 0.0}
    row["ok"] = row["nan_read_or_unwritten"] == 0 and row["O_x_floor"] <= 2.0 and row["lse_max_err"] < 1e-3
    RESULTS["check"].append(row)


def check_cuda_graph():
    """A paged decode step captured once, replayed after cache_seqlens changed on the device."""
    from tilecore import accuracy
    from tilecore.ops.attention_kvcache import attention_with_kvcache
    from tilecore.ops.attention_kvcache.reference import kvcache_reference

    if SMOKE:
        RESULTS["check"].append({"case": "cuda graph (skipped on the CPU)", "ok": True})
        return
    dev = _device()
    lengths = [100, 517, 1, 2000]
    k_cache, v_cache, table = make_cache([n + 2 for n in lengths], 8, 128, 128, 64, torch.bfloat16, dev, 40)
    k_cache, v_cache = k_cache.nan_to_num(), v_cache.nan_to_num()
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=dev)
    q = torch.randn(4, 1, 32, 128, dtype=torch.bfloat16, device=dev)
    k = torch.randn(4, 1, 8, 128, dtype=torch.bfloat16, device=dev)
    v = torch.randn(4, 1, 8, 128, dtype=torch.bfloat16, device=dev)
    attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table)
    seqlens += 1  # the next step: one more key cached; the graph reads the lengths on the device
    k.copy_(torch.randn_like(k))
    v.copy_(torch.randn_like(v))
    snapshot_k, snapshot_v = k_cache.clone(), v_cache.clone()
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = kvcache_reference(q, snapshot_k, snapshot_v, seqlens, k=k, v=v, block_table=table)
    err = accuracy.error_over_floor(out, ref)
    RESULTS["check"].append({"case": "cuda graph: paged decode replayed with new lengths", "O_x_floor": err,
                             "ok": err <= 2.0})


def check_compat():
    import tilecore
    from tilecore.compat import flash_attn as fa

    dev = _device()
    n, d, dtype = (20, 16, torch.float16) if SMOKE else (300, 128, torch.bfloat16)
    q = torch.randn(2, n, 8, d, dtype=dtype, device=dev)
    k = torch.randn(2, n, 2, d, dtype=dtype, device=dev)
    v = torch.randn(2, n, 2, d, dtype=dtype, device=dev)
    same = torch.equal(fa.flash_attn_func(q, k, v, causal=True, window_size=(7, 0), softcap=30.0),
                       tilecore.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                                          window_size=(7, 0), softcap=30.0).transpose(1, 2))
    cu = torch.tensor([0, n, 2 * n], dtype=torch.int32, device=dev)
    packed = fa.flash_attn_varlen_func(q.reshape(2 * n, 8, d), k.reshape(2 * n, 2, d), v.reshape(2 * n, 2, d),
                                       cu, cu, n, n, causal=True)
    dense = fa.flash_attn_func(q, k, v, causal=True)
    diff = float((packed.view(2, n, 8, d).float() - dense.float()).abs().max())
    RESULTS["check"].append({"case": "compat: flash_attn_func = tilecore.attention; varlen of equal lengths ~ dense",
                             "equal": same, "varlen_vs_dense_max_abs": diff, "ok": same and diff < 0.05})


def run_checks():
    f16, bf16 = torch.float16, torch.bfloat16
    if SMOKE:
        varlen_cases = [([5, 0, 1, 19], [5, 2, 1, 19], 2, 1, 16, 16, dict(causal=True))]
        kv_cases = [([0, 17], 1, 1, 2, 1, 16, 16, 16, dict(), 4),
                    ([3, 20], 2, 2, 2, 1, 16, 16, None, dict(causal=True), 32)]
        dtypes = ()  # the fp16 pass below covers the smoke cases
    else:
        varlen_cases = [
            ([1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, 128, dict(causal=True)),
            ([300, 1, 1025, 0], [300, 5, 1300, 7], 32, 8, 128, 128, dict()),
            ([700, 129, 2000], [900, 129, 2000], 16, 4, 128, 128, dict(causal=True, window_size=(100, 50),
                                                                       softcap=20.0)),
            ([999, 1], [999, 1], 8, 2, 192, 128, dict(causal=True)),
        ]
        kv_cases = [
            ([0, 1, 4095, 1000, 33], 1, 1, 32, 8, 128, 128, page, dict(), 4096 // page + 1) for page in (16, 256)
        ] + [
            ([17, 3000, 250], 16, 16, 32, 8, 128, 128, 32, dict(causal=True), 100),  # chunked prefill
            ([17, 3000, 250], 7, 7, 16, 2, 128, 128, 128, dict(causal=True, window_size=(512, -1), softcap=30.0), 30),
            ([5, 4000], 1, 1, 32, 8, 128, 128, None, dict(), 4200),  # contiguous
        ]
        dtypes = (bf16,)
    # each case a few kernel compiles (~5 s each): fp16 on the first case of each only
    for case in varlen_cases[:1] if not SMOKE else varlen_cases:
        guarded(f"check varlen fp16 {case}")(check_varlen)(f16, *case)
    for case in kv_cases[:1] if not SMOKE else kv_cases:
        guarded(f"check kvcache fp16 {case}")(check_kvcache)(f16, *case)
    for dtype in dtypes:
        for case in varlen_cases:
            guarded(f"check varlen {case}")(check_varlen)(dtype, *case)
        for case in kv_cases:
            guarded(f"check kvcache {case}")(check_kvcache)(dtype, *case)
    guarded("check cuda graph")(check_cuda_graph)()
    guarded("check compat")(check_compat)()


# --------------------------------------------------------------------------------------------
# time


def bench(fn):
    import triton

    if SMOKE:  # shapes and imports only
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_bench(fn):
    """GPU time of fn as a CUDA-graph replay (what a server that captures decode steps sees)."""
    if SMOKE:
        return bench(fn)
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay)


def long_tailed_lengths(total, seed=0, longest=16384, shortest=16):
    """Lengths from a log-normal (median ~800, a long tail to 16K) until ``total`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        n = int(math.exp(torch.randn(1, generator=g).item() * 1.2 + math.log(800)))
        lengths.append(max(shortest, min(longest, n, total - sum(lengths))))
    return lengths


def causal_flops(lengths, h, d):
    return sum(4 * n * n / 2 * d * h for n in lengths)


def time_packed(label, lengths, h=16, d=128):
    import tilecore
    from tilecore.ops.attention_varlen import attention_varlen

    dev = _device()
    total = sum(lengths)
    cu = cu_of(lengths, dev)
    dtype = torch.float16 if SMOKE else torch.bfloat16
    q, k, v = (torch.randn(total, h, d, dtype=dtype, device=dev, requires_grad=True) for _ in range(3))
    flops = causal_flops(lengths, h, d)
    row = {"case": f"packed {label}: {len(lengths)} seqs, {total} tokens, longest {max(lengths)}, H{h} D{d} causal",
           "lengths": lengths, "flops_fwd": flops}

    def fwd():
        return attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)

    with torch.no_grad():
        row["varlen_fwd_ms"] = bench(fwd)
    out = fwd()
    dout = torch.randn_like(out)
    row["varlen_bwd_ms"] = bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    RESULTS["time"].append(row)

    @guarded(f"time fixed-length tilecore.attention ({label})")
    def fixed():
        n = 16 if SMOKE else 4096
        b = total // n
        qf, kf, vf = (torch.randn(b, h, n, d, dtype=dtype, device=dev, requires_grad=True) for _ in range(3))
        with torch.no_grad():
            row["fixed_B%d_N%d_fwd_ms" % (b, n)] = t = bench(lambda: tilecore.attention(qf, kf, vf, causal=True))
        of = tilecore.attention(qf, kf, vf, causal=True)
        dof = torch.randn_like(of)
        tb = bench(lambda: torch.autograd.grad(of, (qf, kf, vf), dof, retain_graph=True))
        row["fixed_B%d_N%d_bwd_ms" % (b, n)] = tb
        fixed_flops = causal_flops([n] * b, h, d)
        row["fixed_fwd_tflops"] = fixed_flops / t / 1e9
        row["fixed_bwd_tflops"] = 2.5 * fixed_flops / tb / 1e9
    fixed()
    row["varlen_fwd_tflops"] = flops / row["varlen_fwd_ms"] / 1e9
    row["varlen_bwd_tflops"] = 2.5 * flops / row["varlen_bwd_ms"] / 1e9

    @guarded(f"time sdpa padded ({label})")
    def sdpa_padded():
        import torch.nn.functional as F
        nmax = max(lengths)
        qp, kp, vp = (torch.randn(len(lengths), h, nmax, d, dtype=dtype, device=dev, requires_grad=True)
                      for _ in range(3))
        with torch.no_grad():
            row["sdpa_padded_fwd_ms"] = bench(lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True))
        op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        dop = torch.randn_like(op)
        row["sdpa_padded_bwd_ms"] = bench(lambda: torch.autograd.grad(op, (qp, kp, vp), dop, retain_graph=True))
        del qp, kp, vp, op, dop
    sdpa_padded()

    @guarded(f"time flex document mask ({label})")
    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev),
                                      torch.tensor(lengths, device=dev))

        def document_causal(b, hh, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)
        mask = create_block_mask(document_causal, None, None, total, total, device=dev)
        compiled = torch.compile(flex_attention)
        qx, kx, vx = (t.detach().transpose(0, 1).unsqueeze(0).requires_grad_() for t in (q, k, v))
        with torch.no_grad():
            row["flex_fwd_ms"] = bench(lambda: compiled(qx, kx, vx, block_mask=mask))
        ox = compiled(qx, kx, vx, block_mask=mask)
        dox = torch.randn_like(ox)
        row["flex_bwd_ms"] = bench(lambda: torch.autograd.grad(ox, (qx, kx, vx), dox, retain_graph=True))
    if os.environ.get("GPU_VARLEN_FLEX", "1") != "0" and not SMOKE:
        flex()


def time_copy():
    x = torch.empty(1 << (10 if SMOKE else 29), dtype=torch.bfloat16, device=_device())
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / ms / 1e6  # GB/s


def time_decode(copy_gbs, b=32, n=4096, hq=32, hkv=8, d=128):
    import tilecore
    from tilecore.ops.attention_kvcache import attention_with_kvcache

    dev = _device()
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device=dev)
    k_new = torch.randn(b, 1, hkv, d, dtype=torch.bfloat16, device=dev)
    v_new = torch.randn(b, 1, hkv, d, dtype=torch.bfloat16, device=dev)
    seqlens = torch.full((b,), n - 1, dtype=torch.int32, device=dev)
    bytes_read = 2 * b * n * hkv * d * 2
    row = {"case": f"decode B{b} keys {n} H{hq}/{hkv} D{d} bf16 (GPU time, graph replays), copy {copy_gbs:.0f} GB/s"}
    kc = torch.randn(b, n, hkv, d, dtype=torch.bfloat16, device=dev)
    vc = torch.randn(b, n, hkv, d, dtype=torch.bfloat16, device=dev)
    row["contiguous_us"] = 1e3 * graph_bench(lambda: attention_with_kvcache(q, kc, vc, k_new, v_new,
                                                                            cache_seqlens=seqlens))
    qa = q.transpose(1, 2)
    ka, va = kc.transpose(1, 2), vc.transpose(1, 2)
    row["tilecore_attention_decode_us"] = 1e3 * graph_bench(lambda: tilecore.attention(qa, ka, va))
    del kc, vc
    for page in (16, 32, 64, 128, 256):
        @guarded(f"time paged decode page {page}")
        def paged():
            pages = b * n // page
            kp = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device=dev)
            vp = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device=dev)
            table = torch.randperm(pages, device=dev).int().view(b, n // page)
            row[f"paged{page}_us"] = 1e3 * graph_bench(
                lambda: attention_with_kvcache(q, kp, vp, k_new, v_new, cache_seqlens=seqlens, block_table=table))
        paged()
    for key in [k for k in row if k.endswith("_us")]:
        row[key.replace("_us", "_pct_copy")] = 100 * bytes_read / (row[key] * 1e-6) / 1e9 / copy_gbs
    RESULTS["time"].append(row)


def run_timing():
    if SMOKE:  # one pass of each timed call at tiny shapes (float16: the interpreter's bf16 is not exact)
        guarded("time packed smoke")(time_packed)("smoke", [16, 40, 8], h=2, d=16)
        guarded("time decode smoke")(time_decode)(1.0, b=2, n=256, hq=4, hkv=2, d=16)
        return
    total = 65536
    guarded("time packed long-tailed")(time_packed)("long-tailed", long_tailed_lengths(total))
    guarded("time packed uniform")(time_packed)("uniform 16 x 4096", [4096] * 16)
    copy = guarded("time copy")(time_copy)() or float("nan")
    guarded("time decode")(time_decode)(copy)


# --------------------------------------------------------------------------------------------
# sweep: the kernels' block configurations (varlen.block_config's are ptxas-picked, untimed)

FWD_CONFIGS = [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),  # the shipped one first
               dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, UNMASKED_MIDDLE=False),  # every block masked
               dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
               dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3),
               dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2)]
DKDV_CONFIGS = [dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=1),
                dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=1, UNMASKED_MIDDLE=False),
                dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2),
                dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
                dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
                dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2)]
DQ_CONFIGS = [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
              dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, UNMASKED_MIDDLE=False),
              dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
              dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
              dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=2)]


def _config_name(c):
    name = "x".join(str(c[x]) for x in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
    return name + ("" if c.get("UNMASKED_MIDDLE", True) else " all-masked")


def sweep_varlen(label, lengths, h=16, d=128):
    from tilecore.ops.attention_varlen import op as varlen

    dev = _device()
    dtype = torch.float16 if SMOKE else torch.bfloat16
    total = sum(lengths)
    cu = cu_of(lengths, dev)
    q, k, v = (torch.randn(total, h, d, dtype=dtype, device=dev) for _ in range(3))
    args = (cu, cu, True, d ** -0.5, -1, -1, 0.0)
    out, lse = varlen.forward_kernels(q, k, v, *args)
    dout = torch.randn_like(out)
    flops = causal_flops(lengths, h, d)
    row = {"case": f"sweep {label}: {len(lengths)} seqs, {total} tokens, H{h} D{d} causal (kernels alone, ms)"}
    small = (lambda c: dict(c, BLOCK_M=16, BLOCK_N=16)) if SMOKE else (lambda c: c)
    for c in FWD_CONFIGS:
        name = "fwd " + _config_name(c)
        guarded(f"sweep {label} {name}")(lambda: row.__setitem__(name, bench(
            lambda: varlen.forward_kernels(q, k, v, *args, config=small(c)))))()
    for kind, configs in (("dkdv", DKDV_CONFIGS), ("dq", DQ_CONFIGS)):
        for c in configs:
            name = f"{kind} " + _config_name(c)
            other = "dq" if kind == "dkdv" else "dkdv"
            # time the pass alone: the other one at a tiny grid is not possible, so time both and
            # subtract the other's shipped time measured once below
            guarded(f"sweep {label} {name}")(lambda: row.__setitem__(name, bench(
                lambda: varlen.backward_kernels(dout, q, k, v, out, lse, None, *args,
                                                config={kind: small(c),
                                                        other: small(varlen.block_config(d, SMOKE, other))}))))()
    row["flops_fwd"] = flops
    RESULTS["time"].append(row)


def sweep_decode(b=32, n=4096, hq=32, hkv=8, d=128):
    from tilecore.ops.attention_kvcache import op as kvcache

    dev = _device()
    if SMOKE:
        b, n, hq, hkv, d = 2, 256, 4, 2, 16
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device=dev)
    kc = torch.randn(b, n, hkv, d, dtype=torch.bfloat16, device=dev)
    vc = torch.randn(b, n, hkv, d, dtype=torch.bfloat16, device=dev)
    k_new = torch.randn(b, 1, hkv, d, dtype=torch.bfloat16, device=dev)
    v_new = torch.randn(b, 1, hkv, d, dtype=torch.bfloat16, device=dev)
    seqlens = torch.full((b,), n - 1, dtype=torch.int32, device=dev)
    row = {"case": f"sweep decode B{b} keys {n} H{hq}/{hkv} D{d} (graph replays, us)"}
    row["append only"] = 1e3 * graph_bench(lambda: kvcache.append(kc, vc, k_new, v_new, seqlens, None))
    for splits in (None, 1, 2, 4):
        name = f"attention only, splits {splits or 'default'}"
        guarded(f"sweep decode {name}")(lambda: row.__setitem__(name, 1e3 * graph_bench(
            lambda: kvcache.forward_kernels(q, kc, vc, 1, seqlens, None, False, d ** -0.5, -1, -1, 0.0, n,
                                            splits=splits))))()
    RESULTS["time"].append(row)


def run_sweep():
    if SMOKE:
        guarded("sweep smoke")(sweep_varlen)("smoke", [16, 40], h=2, d=16)
        guarded("sweep decode smoke")(sweep_decode)()
        return
    guarded("sweep uniform")(sweep_varlen)("uniform 16 x 4096", [4096] * 16)
    guarded("sweep long-tailed")(sweep_varlen)("long-tailed", long_tailed_lengths(65536))
    guarded("sweep decode")(sweep_decode)()


# --------------------------------------------------------------------------------------------
# --quick: the Gluon varlen forward (gluon_varlen.py, session 27), checked and timed in <= 90 s

QUICK_BUDGET_S = 75.0  # optional cases are skipped (and said so) once the run is past this
START = [time.time()]


def over_budget(name, reserve=0.0):
    """Past the budget (less ``reserve`` seconds: what the case itself may take, e.g. a compile)?"""
    if not SMOKE and time.time() - START[0] > QUICK_BUDGET_S - reserve:
        RESULTS["errors"].append({"case": name, "error": f"skipped: past the {QUICK_BUDGET_S:.0f} s budget"})
        print(f"[skip] {name}: past the budget")
        return True
    return False


def gluon_forward(q, k, v, cu_q, cu_k, causal, scale, softcap, out=None, lse=None, config=None, left=-1, right=-1):
    """The Gluon varlen forward; under --smoke (the CPU interpreter, where Gluon does not run) the tl
    forward in its place, so that shapes and the script's paths are exercised."""
    from tilecore.ops.attention_varlen import op as varlen

    if SMOKE:
        return varlen.forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap, out=out, lse=lse)
    return varlen.forward_gluon(q, k, v, cu_q, cu_k, causal, scale, softcap, left, right, out=out, lse=lse,
                                config=config)


def check_gluon(dtype, lens_q, lens_k, hq, hkv, d, options, ref_heads=None):
    """The Gluon forward into NaN-poisoned O / lse (O a slice of a larger buffer whose tail holds a
    sentinel: never written) against float64 (on the first ``ref_heads`` heads where given: 64K
    tokens), and against the tl forward on every head."""
    from tilecore import accuracy
    from tilecore.ops.attention_varlen import op as varlen
    from tilecore.ops.attention_varlen.reference import varlen_reference

    dev = _device()
    cu_q, cu_k = cu_of(lens_q, dev), cu_of(lens_k, dev)
    total_q, total_k = sum(lens_q), sum(lens_k)
    q = torch.randn(total_q, hq, d, dtype=dtype, device=dev)
    k = torch.randn(total_k, hkv, d, dtype=dtype, device=dev)
    v = torch.randn(total_k, hkv, d, dtype=dtype, device=dev)
    causal, softcap = options.get("causal", False), options.get("softcap", 0.0)
    left, right = options.get("window_size", (-1, -1))
    scale = d ** -0.5
    buf = torch.full(((total_q + 64) * hq * d,), 7.0, dtype=dtype, device=dev)
    out = buf[:total_q * hq * d].view(total_q, hq, d).fill_(float("nan"))
    lse = torch.full((hq, total_q), float("nan"), device=dev)
    gluon_forward(q, k, v, cu_q, cu_k, causal, scale, softcap, out=out, lse=lse, left=left, right=right)
    table_ok = torch.equal(varlen.work_table(cu_q, cu_k, total_q, hq, 128),
                           varlen.work_table_torch(cu_q, cu_k, total_q, hq, 128))  # the tl kernel = its twin
    tl_out, tl_lse = varlen.forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap)
    heads = hq if ref_heads is None else ref_heads
    group = hq // hkv
    kh = max(1, heads // group)
    ref, ref_lse = varlen_reference(q[:, :heads].double(), k[:, :kh].double(), v[:, :kh].double(), cu_q, cu_k,
                                    causal=causal, softcap=softcap, window_size=(left, right))
    live = torch.isfinite(ref_lse)
    lse_h = lse[:heads]
    row = {"case": f"gluon varlen fwd {str(dtype)[6:]} q{lens_q if len(lens_q) <= 8 else f'[{len(lens_q)} seqs, {total_q}]'}"
                   f" k{lens_k if len(lens_k) <= 8 else f'[{len(lens_k)} seqs, {total_k}]'} H{hq}/{hkv} D{d} {options}"
                   + (f" (float64 on {heads} heads)" if ref_heads else ""),
           "table_ok": table_ok, "unwritten": int(out.isnan().sum() + lse.isnan().sum()),
           "written_past_end": int((buf[total_q * hq * d:] != 7.0).sum()),
           "O_x_floor": accuracy.error_over_floor(out[:, :heads], ref),
           "tl_O_x_floor": accuracy.error_over_floor(tl_out[:, :heads], ref),
           "vs_tl_max_abs": float((out.float() - tl_out.float()).abs().max()),
           "lse_max_err": float((lse_h[live].double() - ref_lse[live]).abs().max()) if live.any() else 0.0,
           "empty_rows_ok": bool(torch.equal(torch.isneginf(lse_h), torch.isneginf(ref_lse))),
           "empty_rows_zero": bool((out[:, :heads].transpose(0, 1)[torch.isneginf(ref_lse)] == 0).all())}
    row["ok"] = (table_ok and row["unwritten"] == 0 and row["written_past_end"] == 0 and row["O_x_floor"] <= 2.0
                 and row["lse_max_err"] < 1e-3 and row["empty_rows_ok"] and row["empty_rows_zero"])
    RESULTS["check"].append(row)


def check_gluon_neighbour_nonfinite():
    """A sequence's last key block reads the next sequence's rows (TMA): inf in the next sequence's V
    and NaN in its K must not reach this sequence's O (gluon_varlen zeroes those V rows)."""
    from tilecore import accuracy
    from tilecore.ops.attention_varlen.reference import varlen_reference

    dev = _device()
    dtype = torch.float16 if SMOKE else torch.bfloat16
    lengths, d = ([10, 5, 7], 16) if SMOKE else ([100, 50, 77], 128)
    cu = cu_of(lengths, dev)
    q, k, v = (torch.randn(sum(lengths), 4, d, dtype=dtype, device=dev) for _ in range(3))
    a, b = lengths[0], lengths[0] + lengths[1]
    v[a:b] = float("inf")
    k[a:b] = float("nan")
    from tilecore.ops.attention_varlen import configs
    keep = torch.ones(sum(lengths), dtype=torch.bool, device=dev)
    keep[a:b] = False
    ref, _ = varlen_reference(q.double(), k.double(), v.double(), cu, cu, causal=True)
    for zero in (True, False):  # zero_tail_v on (the fix, checked) and off (the default: informational)
        config = dict(configs.VARLEN_GLUON_FORWARD_CONFIG[d], zero_tail_v=zero) if d in (64, 128) else None
        out, _ = gluon_forward(q, k, v, cu, cu, True, d ** -0.5, 0.0, config=config)
        finite = bool(torch.isfinite(out[keep]).all())
        err = accuracy.error_over_floor(out[keep], ref[keep])
        RESULTS["check"].append({"case": f"gluon varlen fwd: inf V / NaN K in the next sequence, causal, "
                                         f"zero_tail_v={zero}" + ("" if zero else " (informational)"),
                                 "others_finite": finite, "O_x_floor": err,
                                 "ok": (finite and err <= 2.0) or not zero})


def check_gluon_graph():
    """The Gluon forward captured in a CUDA graph, replayed after cu_seqlens changed on the device
    (same totals): the work table is rebuilt on the device at each replay."""
    from tilecore import accuracy
    from tilecore.ops.attention_varlen.reference import varlen_reference

    if SMOKE:
        RESULTS["check"].append({"case": "gluon cuda graph (skipped on the CPU)", "ok": True})
        return
    dev = _device()
    cu = cu_of([1000, 24, 3000, 72], dev)
    q, k, v = (torch.randn(4096, 8, 128, dtype=torch.bfloat16, device=dev) for _ in range(3))
    gluon_forward(q, k, v, cu, cu, True, 128 ** -0.5, 0.0)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = gluon_forward(q, k, v, cu, cu, True, 128 ** -0.5, 0.0)
    cu.copy_(cu_of([7, 4000, 1, 88], dev))
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = varlen_reference(q.double(), k.double(), v.double(), cu, cu, causal=True)
    err = accuracy.error_over_floor(out, ref)
    RESULTS["check"].append({"case": "gluon cuda graph: replayed with new cu_seqlens", "O_x_floor": err,
                             "ok": err <= 2.0})


def time_gluon(label, lengths, h=16, d=128, causal=True, peers=True):
    import tilecore
    from tilecore.ops.attention_varlen import op as varlen

    dev = _device()
    total = sum(lengths)
    cu = cu_of(lengths, dev)
    dtype = torch.float16 if SMOKE else torch.bfloat16
    q, k, v = (torch.randn(total, h, d, dtype=dtype, device=dev) for _ in range(3))
    flops = causal_flops(lengths, h, d) if causal else sum(4 * n * n * d * h for n in lengths)
    row = {"case": f"gluon fwd {label}: {len(lengths)} seqs, {total} tokens, longest {max(lengths)}, H{h} D{d}"
                   f"{' causal' if causal else ''}", "lengths": lengths, "flops_fwd": flops}
    scale = d ** -0.5
    RESULTS["time"].append(row)
    row["gluon_varlen_fwd_ms"] = bench(lambda: gluon_forward(q, k, v, cu, cu, causal, scale, 0.0))
    row["tl_varlen_fwd_ms"] = bench(lambda: varlen.forward_kernels(q, k, v, cu, cu, causal, scale, -1, -1, 0.0))
    row["gluon_varlen_fwd_tflops"] = flops / row["gluon_varlen_fwd_ms"] / 1e9
    row["tl_varlen_fwd_tflops"] = flops / row["tl_varlen_fwd_ms"] / 1e9
    if not peers:
        return

    @guarded(f"time fixed-length Gluon forward ({label})")
    def fixed():
        n = 16 if SMOKE else 4096
        b = total // n
        qf, kf, vf = (torch.randn(b, h, n, d, dtype=dtype, device=dev) for _ in range(3))
        row[f"fixed_B{b}_N{n}_fwd_ms"] = t = bench(lambda: tilecore.attention(qf, kf, vf, causal=causal))
        fixed_flops = causal_flops([n] * b, h, d) if causal else 4 * n * n * d * h * b
        row["fixed_fwd_tflops"] = fixed_flops / t / 1e9
    fixed()

    @guarded(f"time sdpa padded ({label})")
    def sdpa_padded():
        import torch.nn.functional as F
        nmax = max(lengths)
        qp, kp, vp = (torch.randn(len(lengths), h, nmax, d, dtype=dtype, device=dev) for _ in range(3))
        row["sdpa_padded_fwd_ms"] = bench(lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal))
    if not over_budget(f"sdpa padded ({label})"):
        sdpa_padded()

    @guarded(f"time flex document mask ({label})")
    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev), torch.tensor(lengths, device=dev))

        def document_mask(b, hh, qi, ki):
            return (doc[qi] == doc[ki]) & ((qi >= ki) if causal else True)
        mask = create_block_mask(document_mask, None, None, total, total, device=dev)
        compiled = torch.compile(flex_attention)
        qx, kx, vx = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        row["flex_fwd_ms"] = bench(lambda: compiled(qx, kx, vx, block_mask=mask))
    # torch.compile of flex_attention and its block mask: ~20-30 s
    if not SMOKE and os.environ.get("GPU_VARLEN_FLEX", "1") != "0" and not over_budget(f"flex ({label})", 25.0):
        flex()


def time_gluon_configs(label, lengths, configs_by_name, h=16, d=128, causal=True):
    """The Gluon varlen forward at other configs (configs.VARLEN_GLUON_FORWARD_CONFIG's variants)."""
    dev = _device()
    total = sum(lengths)
    cu = cu_of(lengths, dev)
    dtype = torch.float16 if SMOKE else torch.bfloat16
    q, k, v = (torch.randn(total, h, d, dtype=dtype, device=dev) for _ in range(3))
    flops = causal_flops(lengths, h, d)
    row = {"case": f"gluon fwd configs {label}: {len(lengths)} seqs, {total} tokens, H{h} D{d} (TFLOP/s)"}
    RESULTS["time"].append(row)
    for name, cfg in configs_by_name.items():
        if not over_budget(f"gluon config {name}"):
            guarded(f"gluon config {name}")(lambda: row.__setitem__(name, flops / 1e9 / bench(
                lambda: gluon_forward(q, k, v, cu, cu, causal, d ** -0.5, 0.0, config=cfg))))()


def time_gluon_window(label, lengths, window, h=16, d=128):
    """A causal sliding window (left, 0) on the packed batch: the Gluon forward (forced) against the tl one."""
    from tilecore.ops.attention_varlen import op as varlen

    dev = _device()
    cu = cu_of(lengths, dev)
    dtype = torch.float16 if SMOKE else torch.bfloat16
    q, k, v = (torch.randn(sum(lengths), h, d, dtype=dtype, device=dev) for _ in range(3))
    row = {"case": f"gluon fwd window {window} causal {label}: {len(lengths)} seqs, {sum(lengths)} tokens, H{h} D{d}"}
    RESULTS["time"].append(row)
    row["gluon_varlen_fwd_ms"] = bench(lambda: gluon_forward(q, k, v, cu, cu, True, d ** -0.5, 0.0,
                                                             left=window[0], right=window[1]))
    row["tl_varlen_fwd_ms"] = bench(lambda: varlen.forward_kernels(q, k, v, cu, cu, True, d ** -0.5, *window, 0.0))


def run_quick():
    """Checks first (each a few seconds; every Gluon variant compiles once), then times; flex (a
    torch.compile) last."""
    f16, bf16 = torch.float16, torch.bfloat16
    if SMOKE:
        guarded("gluon configs smoke")(time_gluon_configs)("smoke", [16, 40], {"shipped": None}, h=2, d=16)
        guarded("gluon window smoke")(time_gluon_window)("smoke", [16, 40], (8, 0), h=2, d=16)
        guarded("gluon check smoke")(check_gluon)(f16, [5, 0, 1, 19], [5, 2, 1, 19], 2, 1, 16, dict(causal=True))
        guarded("gluon check smoke neighbour")(check_gluon_neighbour_nonfinite)()
        guarded("gluon check smoke window")(check_gluon)(f16, [9, 40], [12, 40], 2, 1, 16,
                                                        dict(causal=True, window_size=(5, -1)))
        guarded("gluon check smoke gqa")(check_gluon)(f16, [3, 20], [7, 20], 4, 2, 16, dict(), ref_heads=2)
        guarded("gluon time smoke")(time_gluon)("smoke", [16, 40, 8], h=2, d=16)
        return
    tail = long_tailed_lengths(65536)
    first = [
        (bf16, [1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, dict(causal=True)),
        (bf16, [300, 1, 1025, 0, 129], [300, 5, 1300, 7, 129], 32, 8, 128, dict()),  # GQA, Nk != N
        (bf16, [700, 129, 2000, 64], [900, 129, 2000, 70], 16, 4, 128, dict(causal=True)),  # bottom-right
        (bf16, tail, tail, 16, 16, 128, dict(causal=True), 2),  # 64K tokens: float64 on 2 heads
    ]
    later = [
        (f16, [1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, dict(causal=True)),
        (bf16, [700, 129, 2000, 64], [900, 129, 2000, 70], 16, 4, 128, dict(causal=True, softcap=20.0)),
        (bf16, [129, 4096, 17, 0, 300], [129, 4096, 17, 5, 300], 8, 8, 64, dict(causal=True)),  # D64
        # the window (not routed by default: configs.VARLEN_GLUON_FEATURES), forced here
        (bf16, [700, 129, 2000, 64], [900, 129, 2000, 70], 16, 4, 128, dict(window_size=(100, 37))),
        (bf16, [700, 129, 3000, 1], [900, 129, 3000, 1], 16, 4, 128, dict(causal=True, window_size=(300, -1),
                                                                          softcap=20.0)),
    ]

    def checks(cases):
        for case in cases:
            name = f"gluon check {case[0]} {case[1][:8]} {case[5:]}"
            if not over_budget(name):
                guarded(name)(check_gluon)(*case)
    checks(first)
    guarded("gluon check: a neighbour's inf / NaN")(check_gluon_neighbour_nonfinite)()
    guarded("gluon time long-tailed")(time_gluon)("long-tailed", tail)  # its peers skipped past the budget
    checks(later)
    if not over_budget("gluon cuda graph"):
        guarded("gluon cuda graph")(check_gluon_graph)()
    if not over_budget("gluon time uniform"):
        guarded("gluon time uniform")(time_gluon)("uniform 16 x 4096", [4096] * 16, peers=False)
    if not over_budget("gluon time long-tailed, not causal"):
        guarded("gluon time long-tailed, not causal")(time_gluon)("long-tailed", tail, causal=False, peers=False)
    if not over_budget("gluon time window"):
        guarded("gluon time window")(time_gluon_window)("long-tailed", tail, (1024, 0))
    from tilecore.ops.attention_varlen import configs
    shipped = configs.VARLEN_GLUON_FORWARD_CONFIG[128]
    time_gluon_configs("long-tailed", tail, {"drawn (shipped)": shipped,
                                             "round-robin tiles": dict(shipped, drawn=False),
                                             "one Q buffer": dict(shipped, q_buffers=1)})


# --------------------------------------------------------------------------------------------


def table():
    print("\n== check ==")
    for r in RESULTS["check"]:
        extras = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                          if k not in ("case", "ok"))
        print(f"{'PASS' if r.get('ok') else 'FAIL'} {r['case']}\n     {extras}")
    print("\n== time ==")
    for r in RESULTS["time"]:
        print(r["case"])
        for k, v in r.items():
            if k not in ("case", "lengths") and isinstance(v, float):
                print(f"   {k:40s} {v:10.3f}")
        if "varlen_fwd_ms" in r and "flex_fwd_ms" in r:
            print(f"   flex / varlen fwd {r['flex_fwd_ms'] / r['varlen_fwd_ms']:.2f}x, "
                  f"bwd {r['flex_bwd_ms'] / r['varlen_bwd_ms']:.2f}x")
        if "varlen_fwd_tflops" in r and "fixed_fwd_tflops" in r:
            print(f"   varlen / fixed TFLOP/s fwd {r['varlen_fwd_tflops'] / r['fixed_fwd_tflops']:.2f}x, "
                  f"bwd {r['varlen_bwd_tflops'] / r['fixed_bwd_tflops']:.2f}x")
        if "gluon_varlen_fwd_ms" in r:
            g = r["gluon_varlen_fwd_ms"]
            print(f"   gluon varlen fwd: {r['tl_varlen_fwd_ms'] / g:.2f}x the tl varlen"
                  + (f", {r['gluon_varlen_fwd_tflops'] / r['fixed_fwd_tflops']:.2f}x fixed-length TFLOP/s"
                     if "fixed_fwd_tflops" in r else "")
                  + (f", flex {r['flex_fwd_ms'] / g:.2f}x its time" if "flex_fwd_ms" in r else "")
                  + (f", sdpa padded {r['sdpa_padded_fwd_ms'] / g:.2f}x its time" if "sdpa_padded_fwd_ms" in r
                     else ""))
            continue
        if "sdpa_padded_fwd_ms" in r:
            print(f"   sdpa padded / varlen fwd {r['sdpa_padded_fwd_ms'] / r['varlen_fwd_ms']:.2f}x, "
                  f"bwd {r['sdpa_padded_bwd_ms'] / r['varlen_bwd_ms']:.2f}x")
        if "contiguous_us" in r:
            for page in (16, 32, 64, 128, 256):
                if f"paged{page}_us" in r:
                    print(f"   paged {page} / contiguous speed {r['contiguous_us'] / r[f'paged{page}_us']:.2f}x")
    print(f"\nerrors: {len(RESULTS['errors'])}")
    for e in RESULTS["errors"]:
        print(f"   {e['case']}: {e['error'][:200]}")


def main():
    global SMOKE, QUICK_BUDGET_S
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, no timing (the CPU interpreter)")
    parser.add_argument("--phases", default="check,time")
    parser.add_argument("--quick", action="store_true",
                        help="the Gluon varlen forward only: checks and times in <= 90 s (phases ignored)")
    parser.add_argument("--budget", type=float, default=QUICK_BUDGET_S,
                        help="--quick: seconds after which optional cases are skipped")
    args = parser.parse_args()
    SMOKE = args.smoke
    QUICK_BUDGET_S = args.budget
    if args.quick:
        args.phases = "quick"
    START[0] = time.time()
    torch.manual_seed(0)
    start = time.time()
    RESULTS["meta"] = _meta()
    phases = args.phases.split(",")
    if "check" in phases:
        run_checks()
    if "time" in phases:
        run_timing()
    if "sweep" in phases:
        run_sweep()
    if "quick" in phases:
        run_quick()
    RESULTS["meta"]["seconds"] = time.time() - start
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_varlen.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    table()


if __name__ == "__main__":
    main()

"""Issue 35's FlexAttention targets that no run had measured: the packed batch's backward and the paged
decode, each against torch's FlexAttention (compiled) in the same process.

    PYTHONPATH=. python3 experiments/attention/gpu_issue35_flex.py            # H100, ~2 min (Flex compiles)
    PYTHONPATH=. python3 experiments/attention/gpu_issue35_flex.py --only paged

packed: 64K tokens, H16 D128 causal, lengths long-tailed (gpu_varlen.long_tailed_lengths, seed 0):
    tilecore.attention_varlen forward and forward + backward (autograd, eager calls) against
    flex_attention with the document mask (compiled), and the fixed-length tilecore.attention on
    B16 x N4096 (same token count) for the per-token ratio. Targets: >= 1.3x Flex, >= 0.95x fixed.
paged: decode, B32, 4096 keys a sequence, Hq 32 / Hkv 8, D128, page 128 (Flex's block size must equal
    the page; 128 is Flex's default), pages in a random order: tilecore.attention_with_kvcache with a
    block_table against torch's PagedAttention helper over flex_attention (its converted block mask on
    the physical cache), both eager do_bench medians and tilecore also from a CUDA graph (do_bench_cudagraph).
    Target: >= 1.3x Flex's paged attention.
chunked (session 44): chunked prefill, a chunk of new queries whose keys are appended to a cache of 4096 keys (B8,
    Hq 32 / Hkv 8, D128, causal aligned to the bottom right; chunk 512, and 1 for decode), through
    tilecore.attention_with_kvcache with paged caches (pages 16..256, shuffled) and with the contiguous cache holding
    the same keys; GPU time from CUDA graphs, interleaved rounds (gpu_script.time_rounds). Target: >= 0.95x the
    contiguous cache's speed (never timed for a chunk before). Checks: sequence 0's O of each layout against float64.
    --splits-ab (session 44): the split kernel alone (forward_kernels, the chunk appended already) with the shipped
    key splits (one wave of (batch, kv head) programs: 3 at B8 Hkv8, and a merge pass) against one split (no merge:
    the chunk's 32 row blocks a kv head already fill the GPU), contiguous and page 128, in the same rounds.
    Beside it (chunk 512, page 128: Flex's block must equal the page), torch's PagedAttention over flex_attention with
    the causal mask on the same pages, against ours without the append (the chunk's keys already in the cache), eager
    do_bench, the better of two interleaved rounds each: issue 35's >= 1.3x Flex's paged attention, for a chunk.
Checks (bf16): tilecore's and Flex's outputs against a float64 reference of one sequence each (the
longest short one for packed, sequence 0 for paged), error as a multiple of the bf16 rounding floor;
outputs poisoned with NaN before the call. Writes $OUT/issue35_flex.json and prints a table last.
"""
import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.attention.gpu_varlen import long_tailed_lengths  # noqa: E402 (the batch gpu_varlen times)
from experiments.common.gpu_script import eager_ms, graph_ms, time_rounds  # noqa: E402

RESULTS = {"rows": [], "checks": [], "errors": []}


def bench(fn):
    return eager_ms(fn, warmup=25, rep=100)


def guarded(name, fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report, go on to the next case
        RESULTS["errors"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
        print(f"[error] {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()


def reference(q, k, v, causal):
    """float64 attention of one sequence: q (N, Hq, D), k / v (Nk, Hkv, D) -> (N, Hq, D)."""
    hq, hkv = q.shape[1], k.shape[1]
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    kd, vd = (t.repeat_interleave(hq // hkv, 0) for t in (kd, vd))
    s = qd @ kd.transpose(1, 2) * q.shape[-1] ** -0.5
    if causal:
        n, nk = s.shape[-2:]
        mask = torch.ones(n, nk, dtype=torch.bool, device=s.device).tril(nk - n)
        s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ vd).transpose(0, 1)


def floor_multiple(out, ref):
    """max |out - ref| over the bf16 rounding floor of ref (half an ulp at |ref|'s max)."""
    err = (out.double() - ref).abs().max().item()
    floor = ref.abs().max().item() * 2.0 ** -9
    return err / floor


def packed():
    import tilecore
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev, h, d = "cuda", 16, 128
    lengths = long_tailed_lengths(65536)
    total = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(total, h, d, dtype=torch.bfloat16, device=dev, requires_grad=True) for _ in range(3))
    do = torch.randn(total, h, d, dtype=torch.bfloat16, device=dev)
    row = {"case": f"packed {len(lengths)} seqs {total} tokens longest {max(lengths)} H{h} D{d} causal"}
    RESULTS["rows"].append(row)

    def ours():
        return tilecore.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)

    def ours_fb():
        o = ours()
        return torch.autograd.grad(o, (q, k, v), do)

    # check one mid-length sequence against float64 (Flex below on the same)
    with torch.no_grad():
        o = ours()
    i = sorted(range(len(lengths)), key=lambda j: lengths[j])[len(lengths) // 2]
    a, b = cu[i].item(), cu[i + 1].item()
    ref = reference(q[a:b].detach(), k[a:b].detach(), v[a:b].detach(), True)
    RESULTS["checks"].append({"case": f"packed seq {i} (N {b - a}) tilecore O", "x_floor": floor_multiple(o[a:b], ref),
                              "nan": bool(o.isnan().any())})
    row["tilecore_fwd_ms"] = bench(lambda: ours())
    row["tilecore_fwdbwd_ms"] = bench(ours_fb)

    def fixed():
        n, bb = 4096, total // 4096
        qf, kf, vf = (torch.randn(bb, h, n, d, dtype=torch.bfloat16, device=dev, requires_grad=True)
                      for _ in range(3))
        dof = torch.randn(bb, h, n, d, dtype=torch.bfloat16, device=dev)
        row["fixed_fwd_ms"] = bench(lambda: tilecore.attention(qf, kf, vf, causal=True))
        row["fixed_fwdbwd_ms"] = bench(lambda: torch.autograd.grad(tilecore.attention(qf, kf, vf, causal=True),
                                                                   (qf, kf, vf), dof))
        row["fixed_tokens"] = bb * n
    guarded("fixed", fixed)

    def flex():
        doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev), torch.tensor(lengths, device=dev))

        def document_causal(b_, h_, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)
        mask = create_block_mask(document_causal, None, None, total, total, device=dev)
        compiled = torch.compile(flex_attention)
        qx, kx, vx = (t.detach().transpose(0, 1).unsqueeze(0).requires_grad_() for t in (q, k, v))
        dox = do.transpose(0, 1).unsqueeze(0)
        with torch.no_grad():
            ox = compiled(qx, kx, vx, block_mask=mask)
        of = ox[0].transpose(0, 1)
        RESULTS["checks"].append({"case": f"packed seq {i} Flex O", "x_floor": floor_multiple(of[a:b], ref)})
        row["flex_fwd_ms"] = bench(lambda: compiled(qx, kx, vx, block_mask=mask))
        row["flex_fwdbwd_ms"] = bench(lambda: torch.autograd.grad(compiled(qx, kx, vx, block_mask=mask),
                                                                  (qx, kx, vx), dox))
    guarded("flex packed", flex)
    for part in ("fwd", "fwdbwd"):
        if f"flex_{part}_ms" in row:
            row[f"{part}_x_flex"] = row[f"flex_{part}_ms"] / row[f"tilecore_{part}_ms"]
        if f"fixed_{part}_ms" in row:  # per-token throughput ratio, same token count
            row[f"{part}_x_fixed"] = row[f"fixed_{part}_ms"] / row[f"tilecore_{part}_ms"] * total / row["fixed_tokens"]
    print(row, flush=True)


def paged(page=128, b=32, n=4096, hq=32, hkv=8, d=128):
    import tilecore

    dev = "cuda"
    pages = b * n // page
    row = {"case": f"paged decode B{b} keys {n} Hq{hq}/Hkv{hkv} D{d} page {page}"}
    RESULTS["rows"].append(row)
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device=dev)
    kp = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device=dev)
    vp = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device=dev)
    table = torch.randperm(pages, device=dev).int().view(b, n // page)
    seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
    out = torch.full((b, 1, hq, d), float("nan"), dtype=torch.bfloat16, device=dev)
    out.copy_(tilecore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table))
    k0 = kp[table[0].long()].reshape(n, hkv, d)
    v0 = vp[table[0].long()].reshape(n, hkv, d)
    ref = reference(q[0], k0, v0, False)
    RESULTS["checks"].append({"case": "paged seq 0 tilecore O", "x_floor": floor_multiple(out[0], ref),
                              "nan": bool(out.isnan().any())})
    row["tilecore_us"] = 1e3 * bench(lambda: tilecore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens,
                                                                             block_table=table))
    row["tilecore_graph_us"] = 1e3 * graph_ms(lambda: tilecore.attention_with_kvcache(
        q, kp, vp, cache_seqlens=seqlens, block_table=table))

    def flex():
        call, of = flex_paged(q, kp, vp, table, n, lambda b_, h_, qi, ki: ki >= 0)
        RESULTS["checks"].append({"case": "paged seq 0 Flex O", "x_floor": floor_multiple(of[0], ref)})
        row["flex_us"] = 1e3 * bench(call)
        row["x_flex"] = row["flex_us"] / row["tilecore_us"]
    guarded(f"flex paged {page}", flex)
    print(row, flush=True)


def flex_paged(q, kp, vp, table, nk, mask_mod):
    """torch's PagedAttention over flex_attention (compiled) on tilecore's physical pages: logical block j of sequence
    i is page table[i, j] (the page size is Flex's block size); ``mask_mod`` a logical mask of q (B, N, Hq, D)'s rows
    against nk keys. (The call, its output as (B, N, Hq, D).)"""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    (b, n), (pages, page, hkv, d), dev = q.shape[:2], kp.shape, q.device
    blocks = -(-nk // page)
    pa = PagedAttention(pages, page, b, device=dev)
    pa.page_table[:, :blocks] = table[:, :blocks].long()
    pa.physical_to_logical[torch.arange(b, device=dev)[:, None], table[:, :blocks].long()] = \
        torch.arange(blocks, device=dev)[None, :]
    pa.capacity[:] = blocks * page
    kc = kp.reshape(1, pages * page, hkv, d).transpose(1, 2)  # (1, Hkv, pages*page, D) views
    vc = vp.reshape(1, pages * page, hkv, d).transpose(1, 2)
    qx = q.transpose(1, 2)  # (B, Hq, N, D)
    logical = create_block_mask(mask_mod, b, None, n, nk, device=dev, BLOCK_SIZE=page)
    physical = pa.convert_logical_block_mask(logical)
    compiled = torch.compile(flex_attention)

    def call():
        return compiled(qx, kc, vc, block_mask=physical, enable_gqa=True)
    return call, call().transpose(1, 2)


def chunked(chunk, b=8, n=4096, hq=32, hkv=8, d=128, pages=(16, 32, 64, 128, 256), rounds=3, flex_page=128,
            splits_ab=False):
    import tilecore
    from tilecore.ops.attention_kvcache import op as kvcache_op

    dev, total = "cuda", n + chunk
    g = torch.Generator(device=dev).manual_seed(chunk)
    q = torch.randn(b, chunk, hq, d, dtype=torch.bfloat16, device=dev, generator=g)
    kn, vn = (torch.randn(b, chunk, hkv, d, dtype=torch.bfloat16, device=dev, generator=g) for _ in range(2))
    kc, vc = (torch.randn(b, total, hkv, d, dtype=torch.bfloat16, device=dev, generator=g) for _ in range(2))
    seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
    row = {"case": f"chunked prefill B{b} cache {n} + chunk {chunk} Hq{hq}/Hkv{hkv} D{d} causal, graphs"}
    RESULTS["rows"].append(row)
    layouts = {"contiguous": (kc, vc, None)}
    for page in pages:  # the same keys on shuffled pages
        count = b * -(-total // page)
        table = torch.randperm(count, device=dev).int().view(b, -1)
        kp, vp = (torch.full((count, page, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev) for _ in range(2))
        for src, dst in ((kc, kp), (vc, vp)):
            dst.view(-1, hkv, d)[(table.long()[:, :, None] * page + torch.arange(page, device=dev)).view(b, -1)[
                :, :total]] = src
        layouts[f"paged{page}"] = (kp, vp, table)
    k0, v0 = torch.cat([kc[0, :n], kn[0]]), torch.cat([vc[0, :n], vn[0]])
    ref = reference(q[0], k0, v0, True)
    fns = {}
    for name, (kk, vv, table) in layouts.items():
        out = tilecore.attention_with_kvcache(q, kk, vv, kn, vn, cache_seqlens=seqlens, block_table=table,
                                              causal=True)
        RESULTS["checks"].append({"case": f"chunk {chunk} {name} seq 0 O", "x_floor": floor_multiple(out[0], ref),
                                  "nan": bool(out.isnan().any())})
        fns[name] = (lambda kk=kk, vv=vv, table=table: tilecore.attention_with_kvcache(
            q, kk, vv, kn, vn, cache_seqlens=seqlens, block_table=table, causal=True))
    if splits_ab and chunk > 1:  # the split kernel alone (the chunk appended above), the shipped splits and one
        for name in ("contiguous", f"paged{flex_page}"):
            kk, vv, table = layouts[name]
            capacity = kk.shape[1] if table is None else table.shape[1] * kk.shape[1]
            for label, splits in (("fk", None), ("fk1", 1)):
                out = torch.full_like(q, float("nan"))
                kvcache_op.forward_kernels(q, kk, vv, chunk, seqlens, table, True, d ** -0.5, -1, -1, 0.0, capacity,
                                           splits=splits, out=out)
                RESULTS["checks"].append({"case": f"chunk {chunk} {name} {label} seq 0 O",
                                          "x_floor": floor_multiple(out[0], ref), "nan": bool(out.isnan().any())})
                fns[f"{name}_{label}"] = (lambda kk=kk, vv=vv, table=table, capacity=capacity, splits=splits:
                                          kvcache_op.forward_kernels(q, kk, vv, chunk, seqlens, table, True, d ** -0.5,
                                                                     -1, -1, 0.0, capacity, splits=splits))
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False)
    row.update({k_: v_ for k_, v_ in t.items() if not k_.endswith("_rounds")})
    row["rounds"] = {k_: v_ for k_, v_ in t.items() if k_.endswith("_rounds")}
    for name in fns:
        if name.startswith("paged") and "_" not in name and t.get(f"{name}_graph_ms") and t.get("contiguous_graph_ms"):
            row[f"{name}_of_contiguous"] = t["contiguous_graph_ms"] / t[f"{name}_graph_ms"]
        if name.endswith("_fk1") and t.get(f"{name}_graph_ms") and t.get(f"{name[:-1]}_graph_ms"):
            row[f"{name[:-4]}_one_split_speedup"] = t[f"{name[:-1]}_graph_ms"] / t[f"{name}_graph_ms"]
    print(row, flush=True)
    if flex_page not in pages or chunk == 1:
        return

    def flex():  # the chunk's keys already in the cache (Flex does not append): ours the same, eager do_bench
        kk, vv, table = layouts[f"paged{flex_page}"]
        full = torch.full((b,), total, dtype=torch.int32, device=dev)
        call, of = flex_paged(q, kk, vv, table, total, lambda b_, h_, qi, ki: ki <= qi + n)
        RESULTS["checks"].append({"case": f"chunk {chunk} paged{flex_page} seq 0 Flex O",
                                  "x_floor": floor_multiple(of[0], ref)})
        def ours():
            return tilecore.attention_with_kvcache(q, kk, vv, cache_seqlens=full, block_table=table, causal=True)
        for r in range(2):  # interleaved: Flex, ours, then ours, Flex
            for name, fn in (("flex", call), ("ours", ours))[:: 1 if r == 0 else -1]:
                row.setdefault(f"{name}_paged{flex_page}_ms_rounds", []).append(round(bench(fn), 5))
        row["flex_ms"] = min(row[f"flex_paged{flex_page}_ms_rounds"])
        row["ours_no_append_ms"] = min(row[f"ours_paged{flex_page}_ms_rounds"])
        row["x_flex"] = row["flex_ms"] / row["ours_no_append_ms"]
        print(row, flush=True)
    guarded(f"flex chunked {chunk}", flex)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="packed,paged", help="packed, paged, chunked (comma-separated)")
    ap.add_argument("--chunks", default="512,1", help="chunked's chunk sizes")
    ap.add_argument("--splits-ab", action="store_true",
                    help="chunked: also the split kernel alone with the shipped key splits against one split")
    args = ap.parse_args()
    from experiments.common.meta import meta
    RESULTS["meta"] = meta()
    print(RESULTS["meta"], flush=True)
    if "paged" in args.only:
        guarded("paged", paged)
    if "packed" in args.only:
        guarded("packed", packed)
    if "chunked" in args.only:
        for chunk in (int(c) for c in args.chunks.split(",")):
            guarded(f"chunked {chunk}", lambda chunk=chunk: chunked(chunk, splits_ab=args.splits_ab))
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "issue35_flex.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    print("\n== checks (x the bf16 rounding floor)")
    for c in RESULTS["checks"]:
        print(f"{c['case']:<40} {c['x_floor']:.2f}" + (" NaN!" if c.get("nan") else ""))
    print("== times")
    for r in RESULTS["rows"]:
        print(r["case"])
        print("   " + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if isinstance(v, float)))
    for e in RESULTS["errors"]:
        print("error:", e["case"], e["error"][:200])


if __name__ == "__main__":
    main()

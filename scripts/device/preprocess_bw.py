"""The Gluon backward's preprocess (delta, row stats, zeroed float32 dQ) against a copy of the same
bytes, at the bench shape (B16 H16 N4096, D = 64 and 128, bf16), by block rows and warps; and the
same work split into torch.zeros (a memset) plus the delta kernel without the zeroing.

    PYTHONPATH=. python3 scripts/device/preprocess_bw.py [--out DIR]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from attention_knobs import meta  # noqa: E402 (scripts/device)
from tilecore.ops.attention import kernels  # noqa: E402


def launch(out, do, lse, delta, stats, acc, n_pad, zero, block_m, warps):
    B, H, N, D = out.shape
    kernels._DELTA[kernels.row_block_grid(B * H, N, block_m)](
        out, do, lse, lse, delta, stats, acc, *out.stride(), *do.stride(), H, N, D, n_pad, HAS_DLSE=False,
        ZERO_DQ_SUM=zero, ROW_STATS=True, BLOCK_M=block_m, BLOCK_D=kernels.block_d(D), num_warps=warps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res = {"meta": meta(), "rows": []}
    for d in (64, 128):
        B, H, N = 16, 16, 4096
        out, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lse = torch.randn(B, H, N, device="cuda")
        delta = torch.empty(B, H, N, device="cuda")
        stats = torch.empty(B * H, 2, N, device="cuda")
        acc = torch.empty(B, H, N, d, device="cuda")
        nbytes = 2 * out.numel() * 2 + acc.numel() * 4 + 3 * delta.numel() * 4
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        fns = {"copy of the same bytes": lambda: dst.copy_(src)}
        for block_m in (32, 64, 128):
            for warps in (4, 8):
                fns[f"fused, {block_m} rows, {warps} warps"] = (
                    lambda bm=block_m, w=warps: launch(out, do, lse, delta, stats, acc, N, True, bm, w))
        fns["zeros + delta (64 rows, 4 warps)"] = lambda: (acc.zero_(), launch(out, do, lse, delta, stats, acc, N,
                                                                              False, 64, 4))
        fns["zeros alone"] = lambda: acc.zero_()
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        # correctness of each fused config: delta against float64, zeros written
        for name, f in fns.items():
            if name.startswith("fused"):
                acc.fill_(float("nan"))
                delta.fill_(float("nan"))
                f()
                ref = (out.double() * do.double()).sum(-1)
                ok = bool(torch.allclose(delta.double(), ref, rtol=1e-4, atol=1e-3)) and not acc.any().item()
                assert ok, name
        times = {name: [] for name in fns}
        for _ in range(5):  # interleaved rounds
            for name, f in fns.items():
                times[name].append(do_bench(f, warmup=10, rep=50))
        copy = sorted(times["copy of the same bytes"])[2]
        for name, ts in times.items():
            t = sorted(ts)[2]
            row = dict(D=d, variant=name, ms=t, pct_of_copy=100 * copy / t)
            res["rows"].append(row)
            print(f"D{d} {name:40s} {t * 1e3:7.1f} us  {100 * copy / t:5.1f}% of copy", flush=True)
    json.dump(res, open(os.path.join(args.out, "preprocess_bw.json"), "w"), indent=1)


if __name__ == "__main__":
    main()

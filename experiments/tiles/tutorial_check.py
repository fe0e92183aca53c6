"""docs/tiles.md's op on the GPU: silu(x @ W_gate) * (x @ W_up) from the tutorial's Gluon kernel, against
the doc's float64 reference (rows sampled, error as a multiple of the bf16 rounding floor; the output
poisoned first and checked written), and timed (GPU time, do_bench medians) against torch eager (two
cuBLAS GEMMs and the elementwise epilogue) and against one cuBLAS GEMM of x by [W_gate | W_up], the
work's floor.

    python experiments/tiles/tutorial_check.py [--out DIR]
"""
import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile

import torch
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tutorial():
    src = "\n\n".join(re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, "docs", "tiles.md")).read(), flags=re.S))
    path = os.path.join(tempfile.mkdtemp(), "tiles_tutorial.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location("tiles_tutorial", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tiles_tutorial"] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    t = tutorial()
    rows = []
    for m, k, n in ((8192, 4096, 14336), (4096, 4096, 11008), (2048, 2048, 8192), (1000, 1000, 1000)):
        g = torch.Generator(device="cuda").manual_seed(m + k + n)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        wg = (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).bfloat16()
        wu = (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).bfloat16()
        y = t.silu_gate(x, wg, wu)
        assert not y.isnan().any(), "unwritten (NaN) or NaN output"
        pick = torch.randperm(m, generator=torch.Generator().manual_seed(0))[:256].cuda()
        ref = t.silu_gate_reference(x[pick].double(), wg.double(), wu.double())
        err = (y[pick].double() - ref).abs().max().item()
        floor = (ref.bfloat16().double() - ref).abs().max().item()
        ms = triton.testing.do_bench(lambda: t.silu_gate(x, wg, wu), warmup=50, rep=200, return_mode="median")
        eager = triton.testing.do_bench(lambda: torch.nn.functional.silu(x @ wg) * (x @ wu), warmup=50, rep=200,
                                        return_mode="median")
        w = torch.cat([wg, wu], dim=1)
        gemm = triton.testing.do_bench(lambda: x @ w, warmup=50, rep=200, return_mode="median")
        rows.append(dict(m=m, k=k, n=n, err_over_floor=err / floor, ms=ms, torch_eager_ms=eager, one_gemm_ms=gemm,
                         tflops=4 * m * n * k / ms / 1e9))
        print(json.dumps(rows[-1]), flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                timing="GPU time, do_bench median (eager calls)")
    with open(os.path.join(a.out, "tutorial_check.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"{'M x K x N':22s} {'err/floor':>9s} {'ms':>8s} {'TFLOP/s':>8s} {'x eager':>8s} {'x 1 GEMM':>8s}")
    for r in rows:
        print(f"{r['m']}x{r['k']}x{r['n']:<10d} {r['err_over_floor']:9.2f} {r['ms']:8.3f} {r['tflops']:8.0f} "
              f"{r['torch_eager_ms'] / r['ms']:8.2f} {r['one_gemm_ms'] / r['ms']:8.2f}")


if __name__ == "__main__":
    main()

"""Does the ptxas that compiles a kernel change its speed? torch.compile (Inductor) sets
TRITON_PTXAS_PATH to torch's bundled ptxas in the process (torch/_inductor/runtime/compile_tasks.py,
_set_triton_ptxas_path) when it compiles a Triton kernel itself; every Triton kernel compiled later in
that process (tilecore's included) is then built by that ptxas, not by Triton's own. Each child here
compiles tilecore's kernels in a fresh Triton cache under one ptxas and times them (do_bench GPU time)
against a copy or cuBLAS in the same process.

    python experiments/common/ptxas_check.py [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, torch, triton
from triton.testing import do_bench
import tilecore
res = {}
for n in (1024, 2048, 4096):
    x = torch.randn(2**28 // n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    th = do_bench(lambda: tilecore.hadamard_transform(x, n ** -0.5), warmup=50, rep=300)
    tc = do_bench(lambda: out.copy_(x), warmup=50, rep=300)
    res[f"hadamard n{n} x copy"] = tc / th
    del x, out
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
res["gemm 4096^3 x cuBLAS"] = do_bench(lambda: a @ a, warmup=50, rep=300) / do_bench(lambda: tilecore.gemm(a, a), warmup=50, rep=300)
q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
res["attention fwd causal D128 x SDPA"] = do_bench(sdpa, warmup=20, rep=200) / do_bench(
    lambda: tilecore.attention(q, k, v, causal=True), warmup=20, rep=200)
from triton import knobs
res["ptxas"] = str(knobs.nvidia.ptxas.path)
print("RESULT " + json.dumps(res))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    torch_ptxas = Path(torch.__file__).parent / "bin" / "ptxas"
    runs = {"triton's ptxas": None, "torch's ptxas (what Inductor sets)": str(torch_ptxas)}
    rows = {}
    for name, path in runs.items():
        env = dict(os.environ)
        env.pop("TRITON_PTXAS_PATH", None)
        if path:
            env["TRITON_PTXAS_PATH"] = path
        with tempfile.TemporaryDirectory() as cache:
            env["TRITON_CACHE_DIR"] = cache
            p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        rows[name] = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")),
                          {"error": p.stderr[-1500:]})
        if path:
            v = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
            rows[name]["ptxas_version"] = v[-1] if v else "?"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    for name, r in rows.items():
        print(f"== {name}")
        for k, v in r.items():
            print(f"   {k:36s} {v if isinstance(v, str) else round(v, 4)}")


if __name__ == "__main__":
    main()

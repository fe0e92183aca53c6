"""How long a user waits on an op's first call: each op in a fresh process, first with an empty
Triton cache (cold), then again with the cache the first process left (warm disk cache, the case
issue 31 targets at <= 1 s). A process times its first call (forward, then backward where the op has
one), its second call, and a steady-state call, each synchronized, and the import of tilecore.

    python experiments/common/first_call.py [--ops gemm,hadamard,...] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = {
    # name: (setup code making `fwd` (a callable returning an output) and `grad_inputs`)
    "gemm": "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
            "b = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
            "fwd = lambda: tilecore.gemm(a, b)",
    "gemm_fp8": "a = torch.randn(4096, 4096, device='cuda').to(torch.float8_e4m3fn)\n"
                "b = torch.randn(4096, 4096, device='cuda').to(torch.float8_e4m3fn).t().contiguous().t()\n"
                "s = torch.ones((), device='cuda')\n"
                "fwd = lambda: tilecore.gemm_fp8(a, b, s, s)",
    "hadamard": "x = torch.randn(8192, 4096, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
                "fwd = lambda: tilecore.hadamard_transform(x, 4096 ** -0.5)",
    "attention": "q, k, v = (torch.randn(2, 16, 4096, 128, device='cuda', dtype=torch.bfloat16, requires_grad=True) "
                 "for _ in range(3))\n"
                 "fwd = lambda: tilecore.attention(q, k, v)",
    "attention_causal": "q, k, v = (torch.randn(2, 16, 4096, 128, device='cuda', dtype=torch.bfloat16, "
                        "requires_grad=True) for _ in range(3))\n"
                        "fwd = lambda: tilecore.attention(q, k, v, causal=True)",
    "attention_d64_gqa": "q = torch.randn(2, 32, 2048, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
                         "k, v = (torch.randn(2, 8, 2048, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True) "
                         "for _ in range(2))\n"
                         "fwd = lambda: tilecore.attention(q, k, v, causal=True)",
    "decode": "q = torch.randn(4, 32, 1, 128, device='cuda', dtype=torch.bfloat16)\n"
              "k, v = (torch.randn(4, 8, 8192, 128, device='cuda', dtype=torch.bfloat16) for _ in range(2))\n"
              "fwd = lambda: tilecore.attention(q, k, v)",
}

CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t1 = time.perf_counter()
import tilecore
t2 = time.perf_counter()
# torch's own first backward with a given gradient imports sympy (torch.autograd's _make_grads: ~2 s on
# the H100's host), whatever the op: paid here, once, and timed apart
t3 = time.perf_counter()
w = torch.ones(2, device="cuda", requires_grad=True)
(w * 2).backward(torch.ones(2, device="cuda"))
torch.cuda.synchronize()
t4 = time.perf_counter()
{setup}
torch.cuda.synchronize()

def timed(f):
    torch.cuda.synchronize(); t = time.perf_counter(); r = f(); torch.cuda.synchronize()
    return r, time.perf_counter() - t

def step():
    out, tf = timed(fwd)
    tb = None
    if out.requires_grad:
        g = torch.randn_like(out)
        _, tb = timed(lambda: out.backward(g))
    return tf, tb

res = {{"import_torch_cuda_s": t1 - t0, "import_tilecore_s": t2 - t1, "torch_first_backward_s": t4 - t3}}
import cProfile, io, os, pstats
for name in ("first", "second", "third"):
    prof = cProfile.Profile() if name == "first" and os.environ.get("FIRST_CALL_PROFILE") else None
    if prof:
        prof.enable()
    tf, tb = step()
    if prof:
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
        res["first_profile"] = text.getvalue()[-6000:]
    res[name + "_fwd_s"] = tf
    res[name + "_bwd_s"] = tb
print("RESULT " + json.dumps(res))
'''


def run(op, cache):
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD.format(setup=CASES[op])], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["process_wall_s"] = wall
            return r
    return {"error": (p.stderr or p.stdout)[-2000:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=",".join(CASES))
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for op in a.ops.split(","):
        with tempfile.TemporaryDirectory() as cache:
            cold = run(op, cache)
            warm = run(op, cache)
        rows.append({"op": op, "cold": cold, "warm": warm})
    for r in rows:
        for kind in ("cold", "warm"):
            if "first_profile" in r[kind]:
                print(f"== {r['op']} {kind}: first call's profile\n{r[kind].pop('first_profile')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)

    def ms(d, k):
        v = d.get(k)
        return "-" if v is None else f"{v * 1e3:.0f}"

    print(f"{'op':20s} {'cache':5s} {'import':>7s} {'torchbw':>8s} {'1st fwd':>8s} {'1st bwd':>8s} {'2nd fwd':>8s} {'2nd bwd':>8s} "
          f"{'3rd fwd':>8s} {'3rd bwd':>8s}  (ms)")
    for r in rows:
        for kind in ("cold", "warm"):
            d = r[kind]
            if "error" in d:
                print(f"{r['op']:20s} {kind:5s} ERROR {d['error'][-300:]}")
                continue
            print(f"{r['op']:20s} {kind:5s} {ms(d, 'import_tilecore_s'):>7s} {ms(d, 'torch_first_backward_s'):>8s} "
                  f"{ms(d, 'first_fwd_s'):>8s} "
                  f"{ms(d, 'first_bwd_s'):>8s} {ms(d, 'second_fwd_s'):>8s} {ms(d, 'second_bwd_s'):>8s} "
                  f"{ms(d, 'third_fwd_s'):>8s} {ms(d, 'third_bwd_s'):>8s}")


if __name__ == "__main__":
    main()

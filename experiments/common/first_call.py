"""How long a user waits on an op's first call: each op in a fresh process, first with an empty
Triton cache (cold), then again with the cache the first process left (warm disk cache, the case
issue 31 targets at <= 1 s). A process times its first call (forward, then backward where the op has
one), its second call, and a steady-state call, each synchronized, and the import of tilecore.

    python experiments/common/first_call.py [--ops first|later|all|gemm,hadamard,...] [--json out.json]
        [--jobs 8] [--warm-jobs 3] [--budget 85]

Session 30: the ops added after session 24 too (LATER); the cold processes (which fill each op's cache) run
--jobs at a time (their figures then include the other compiles' CPU contention: read them as an upper
bound), the warm ones --warm-jobs at a time (16 cores: a few at once leave each its own cores); no process
starts after --budget seconds (those ops say "skipped"). --json defaults to $OUT/first_call_<ops>.json.
Session 30 run 4: every op's warm first call <= 1 s (1st fwd 413-662 ms). Since then gemm's NAPKIN_TOPK and
attention's NAPKIN_FORWARD_TOPK are on: a shape bucket's first call times its candidates (configs: +0.03-0.11 s
with a warm disk cache), which these rows now include.
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
FIRST = list(CASES)

_BF = "device='cuda', dtype=torch.bfloat16"
LATER = {
    "layer_norm": f"x = torch.randn(8192, 4096, {_BF}, requires_grad=True)\n"
                  f"w, b = (torch.randn(4096, {_BF}, requires_grad=True) for _ in range(2))\n"
                  "fwd = lambda: tilecore.layer_norm(x, w, b)",
    "rms_norm": f"x = torch.randn(8192, 4096, {_BF}, requires_grad=True)\n"
                f"w = torch.randn(4096, {_BF}, requires_grad=True)\n"
                "fwd = lambda: tilecore.layer_norm(x, w, rms=True)",
    "apply_rotary": f"x = torch.randn(4, 2048, 16, 128, {_BF}, requires_grad=True)\n"
                    f"cos, sin = torch.randn(2048, 64, {_BF}), torch.randn(2048, 64, {_BF})\n"
                    "fwd = lambda: tilecore.apply_rotary(x, cos, sin)",
    "fft_conv": f"u = torch.randn(8, 256, 2048, {_BF}, requires_grad=True)\n"
                "k = torch.randn(256, 2048, device='cuda', requires_grad=True)\n"
                "fwd = lambda: tilecore.fft_conv(u, k)",
    "linear_attention": f"q, k, v = (torch.randn(4, 2048, 16, 128, {_BF}, requires_grad=True) for _ in range(3))\n"
                        "fwd = lambda: tilecore.linear_attention(q, k, v)",
    "linear_attention_decay": f"q, k, v = (torch.randn(4, 2048, 16, 128, {_BF}, requires_grad=True) for _ in range(3))\n"
                              "g = (-torch.rand(4, 2048, 16, device='cuda') * 0.1).requires_grad_()\n"
                              "fwd = lambda: tilecore.linear_attention(q, k, v, decay=g)",
    "mamba2_chunk_scan": f"x = torch.randn(2, 2048, 16, 64, {_BF}, requires_grad=True)\n"
                         "dt = (torch.rand(2, 2048, 16, device='cuda') * 0.1).requires_grad_()\n"
                         "A = (-torch.rand(16, device='cuda')).requires_grad_()\n"
                         f"B, C = (torch.randn(2, 2048, 1, 128, {_BF}, requires_grad=True) for _ in range(2))\n"
                         "fwd = lambda: tilecore.mamba2_chunk_scan(x, dt, A, B, C)",
    "linear_attention_step": f"q, k, v = (torch.randn(8, 16, 128, {_BF}) for _ in range(3))\n"
                             "state = torch.randn(8, 16, 128, 128, device='cuda')\n"
                             "fwd = lambda: tilecore.linear_attention_step(q, k, v, state)",
    "mamba2_step": f"x = torch.randn(8, 32, 64, {_BF})\n"
                   "dt, A = torch.rand(8, 32, device='cuda'), -torch.rand(32, device='cuda')\n"
                   f"B, C = torch.randn(8, 1, 128, {_BF}), torch.randn(8, 1, 128, {_BF})\n"
                   "state = torch.randn(8, 32, 64, 128, device='cuda')\n"
                   "fwd = lambda: tilecore.mamba2_step(state, x, dt, A, B, C)",
    "hadamard_quantize": f"x = torch.randn(8192, 4096, {_BF})\n"
                         "fwd = lambda: tilecore.hadamard_quantize(x, format='fp8_e4m3')[0]",
    "attention_fp8": f"q = torch.randn(2, 16, 4096, 128, {_BF})\n"
                     "from tilecore.ops.attention_fp8 import quantize_fp8\n"
                     "q8 = q.to(torch.float8_e4m3fn)\n"
                     "v8, vs = quantize_fp8(q, layout='keys_permuted')\n"
                     "one = torch.ones(2, 16, device='cuda')\n"
                     "fwd = lambda: tilecore.attention_fp8(q8, q8, v8, q_scale=one, k_scale=one, v_scale=vs, "
                     "v_layout='keys_permuted', check_scales=False)",
    "attention_varlen": f"q, k, v = (torch.randn(8192, 16, 128, {_BF}, requires_grad=True) for _ in range(3))\n"
                        "cu = torch.tensor([0, 1000, 4000, 8192], dtype=torch.int32, device='cuda')\n"
                        "fwd = lambda: tilecore.attention_varlen(q, k, v, cu, cu, 4192, 4192, causal=True)",
    "attention_with_kvcache": f"q = torch.randn(4, 1, 32, 128, {_BF})\n"
                              f"kc, vc = (torch.randn(256, 64, 8, 128, {_BF}) for _ in range(2))\n"
                              "table = torch.arange(256, dtype=torch.int32, device='cuda').view(4, 64)\n"
                              "lens = torch.full((4,), 4000, dtype=torch.int32, device='cuda')\n"
                              "fwd = lambda: tilecore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, "
                              "block_table=table)",
}
CASES.update(LATER)

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


def run(op, cache, deadline=None):
    if deadline is not None and time.perf_counter() > deadline:
        return {"error": "skipped (--budget spent)"}
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD.format(setup=CASES[op])], env=env, capture_output=True,
                           text=True, timeout=None if deadline is None else max(5.0, deadline + 5 - t))
    except subprocess.TimeoutExpired:
        return {"error": "timed out (--budget)"}
    wall = time.perf_counter() - t
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["process_wall_s"] = wall
            return r
    return {"error": (p.stderr or p.stdout)[-2000:]}


def main():
    from concurrent.futures import ThreadPoolExecutor

    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="first", help="first, later, all, or names separated by commas")
    ap.add_argument("--json")
    ap.add_argument("--jobs", type=int, default=8, help="cold processes at once")
    ap.add_argument("--warm-jobs", type=int, default=3, help="warm processes at once")
    ap.add_argument("--budget", type=float, default=85.0, help="seconds after which no process starts")
    ap.add_argument("--smoke", action="store_true", help="print each op's child script and exit (no GPU)")
    a = ap.parse_args()
    ops = {"first": FIRST, "later": list(LATER), "all": list(CASES)}.get(a.ops) or a.ops.split(",")
    unknown = [op for op in ops if op not in CASES]
    if unknown:
        raise SystemExit(f"unknown ops {unknown}; known: {list(CASES)}")
    if a.smoke:  # each op's setup on CPU tensors (torch's CPU paths), a forward and a backward: names and shapes
        import torch

        import tilecore
        for op in ops:
            compile(CHILD.format(setup=CASES[op]), op, "exec")  # the child script parses
            scope = {"torch": torch, "tilecore": tilecore}
            try:
                exec(CASES[op].replace("'cuda'", "'cpu'"), scope)
                out = scope["fwd"]()
                if out.requires_grad:
                    out.backward(torch.randn_like(out))
                print(f"smoke {op}: ok {tuple(out.shape)}")
            except Exception as err:  # noqa: BLE001
                print(f"smoke {op}: {type(err).__name__}: {err}")
        return
    if a.json is None:
        out_dir = os.environ.get("OUT", "/tmp/out")
        os.makedirs(out_dir, exist_ok=True)
        a.json = os.path.join(out_dir, f"first_call_{a.ops if a.ops in ('first', 'later', 'all') else 'ops'}.json")
    deadline = time.perf_counter() + a.budget
    caches = {op: tempfile.mkdtemp(prefix=f"first_call_{op}_") for op in ops}
    with ThreadPoolExecutor(a.jobs) as pool:  # cold: each op fills its own cache
        cold = dict(zip(ops, pool.map(lambda op: run(op, caches[op], deadline), ops)))
    with ThreadPoolExecutor(a.warm_jobs) as pool:  # warm: the cache its cold process left
        warm = dict(zip(ops, pool.map(lambda op: run(op, caches[op], deadline), ops)))
    rows = [{"op": op, "cold": cold[op], "warm": warm[op]} for op in ops]
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

    print(f"cold: {a.jobs} processes at once, warm: {a.warm_jobs} at once; target: warm 1st fwd and 1st bwd <= 1000 ms")
    print(f"{'op':20s} {'cache':5s} {'import':>7s} {'torchbw':>8s} {'1st fwd':>8s} {'1st bwd':>8s} {'2nd fwd':>8s} {'2nd bwd':>8s} "
          f"{'3rd fwd':>8s} {'3rd bwd':>8s}  (ms)")
    for r in rows:
        for kind in ("cold", "warm"):
            d = r[kind]
            if "error" in d:
                print(f"{r['op']:20s} {kind:5s} ERROR {d['error'][-300:]}")
                continue
            over = " OVER" if kind == "warm" and max(d.get("first_fwd_s") or 0, d.get("first_bwd_s") or 0) > 1 else ""
            print(f"{r['op']:20s} {kind:5s} {ms(d, 'import_tilecore_s'):>7s} {ms(d, 'torch_first_backward_s'):>8s} "
                  f"{ms(d, 'first_fwd_s'):>8s} "
                  f"{ms(d, 'first_bwd_s'):>8s} {ms(d, 'second_fwd_s'):>8s} {ms(d, 'second_bwd_s'):>8s} "
                  f"{ms(d, 'third_fwd_s'):>8s} {ms(d, 'third_bwd_s'):>8s}{over}")


if __name__ == "__main__":
    main()

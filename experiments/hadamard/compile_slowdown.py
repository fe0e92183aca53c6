"""Issue 31's intermittent slowdown: Hadamard at n = 2048 (2^28 bf16 elements) ran at 77% of copy instead
of ~99% in 4 of 19 processes, for the whole process, each of which had run torch.compile earlier.

Each child process times the transform and a copy of the same bytes (do_bench GPU time), runs
torch.compile on what a user compiles (an MLP with GEMMs, a softmax, a norm, the Hadamard op itself,
default and max-autotune), and times both again; then it records what could carry a slowdown: the
tensors' addresses mod 2 MiB, the L2 persisting-cache limit, the compiled kernel's binary hash and
registers, Triton's knobs that differ from before, and the allocator's segments. Several processes,
because the slowdown came in some processes only.

    python experiments/hadamard/compile_slowdown.py [--procs 5] [--json out.json]
"""
import argparse
import json
import subprocess
import sys

CHILD = r'''
import ctypes, hashlib, json, os, sys, torch, triton
from triton.testing import do_bench
import tilecore
from tilecore.ops.hadamard import launch as hl

def knobs_snapshot():
    from triton import knobs
    out = {}
    for group in ("compilation", "runtime", "nvidia", "cache", "build"):
        g = getattr(knobs, group, None)
        if g is None:
            continue
        for name in dir(g):
            if name.startswith("_"):
                continue
            try:
                v = getattr(g, name)
            except Exception as err:
                v = f"<{type(err).__name__}>"
            if callable(v) and not isinstance(v, (str, int, float, bool)):
                v = type(v).__name__
            out[f"{group}.{name}"] = repr(v)[:80]
    return out

def l2_persisting_limit():
    lib = ctypes.CDLL("libcudart.so") if os.path.exists("/usr/local/cuda/lib64/libcudart.so") else None
    try:
        lib = lib or ctypes.CDLL("libcudart.so.13")
    except OSError:
        try:
            lib = ctypes.CDLL("libcudart.so.12")
        except OSError:
            return None
    v = ctypes.c_size_t(0)
    rc = lib.cudaDeviceGetLimit(ctypes.byref(v), 6)  # cudaLimitPersistingL2CacheSize
    return {"rc": rc, "bytes": v.value}

def kernel_info():
    out = []
    for key, entry in list(hl._launch_hadamard.compiled._data.items()):
        compiled = entry[0]
        asm = getattr(compiled, "asm", {})
        cubin = asm.get("cubin", b"")
        out.append({"hash": hashlib.sha1(cubin if isinstance(cubin, bytes) else str(cubin).encode()).hexdigest()[:12],
                    "n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
                    "shared": getattr(compiled.metadata, "shared", None)})
    return out

n = 2048
x = torch.randn(2**28 // n, n, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
scale = n ** -0.5

def bench():
    t_had = do_bench(lambda: tilecore.hadamard_transform(x, scale), warmup=50, rep=300)
    t_copy = do_bench(lambda: out.copy_(x), warmup=50, rep=300)
    return {"hadamard_ms": t_had, "copy_ms": t_copy, "ratio": t_copy / t_had}

res = {"before": bench(), "x_mod_2MiB": x.data_ptr() % (2 << 20), "l2_before": l2_persisting_limit(),
       "kernel_before": kernel_info()}
k0 = knobs_snapshot()
mode = sys.argv[1]
# what a user compiles
w1 = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w2 = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
def mlp(a):
    return torch.nn.functional.gelu(a @ w1) @ w2
def norm_softmax(a):
    return torch.softmax(torch.nn.functional.layer_norm(a, a.shape[-1:]), -1)
a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for fn in (mlp, norm_softmax, lambda t: tilecore.hadamard_transform(t, 4096 ** -0.5)):
    c = torch.compile(fn, mode=None if mode == "default" else mode)
    y = c(a)
    y.float().sum().backward()
torch.cuda.synchronize()
res["after"] = bench()
res["x_mod_2MiB_after"] = x.data_ptr() % (2 << 20)
res["l2_after"] = l2_persisting_limit()
res["kernel_after"] = kernel_info()
k1 = knobs_snapshot()
res["knobs_changed"] = {k: (k0.get(k), v) for k, v in k1.items() if k0.get(k) != v}
# a fresh tensor pair allocated after compile, and the transform re-planned on it
x2 = torch.randn_like(x)
res["fresh_after"] = {"ratio": do_bench(lambda: out.copy_(x2), warmup=50, rep=300) /
                      do_bench(lambda: tilecore.hadamard_transform(x2, scale), warmup=50, rep=300),
                      "x2_mod_2MiB": x2.data_ptr() % (2 << 20)}
res["segments"] = len(torch.cuda.memory_snapshot())
res["clocks"] = os.popen("nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader").read().strip()
print("RESULT " + json.dumps(res))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for i in range(a.procs):
        mode = "default"
        p = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True)
        r = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
        rows.append({"mode": mode, **(r or {"error": p.stderr[-1500:]})})
        r = rows[-1]
        if "error" in r:
            print(i, mode, "ERROR", r["error"][-600:])
        else:
            print(f"{i} {mode:28s} before {r['before']['ratio']:.3f} after {r['after']['ratio']:.3f} fresh "
                  f"{r['fresh_after']['ratio']:.3f} kernel {[k['hash'] for k in r['kernel_before']]} -> "
                  f"{[k['hash'] for k in r['kernel_after']]} l2 {r['l2_before']} -> {r['l2_after']} "
                  f"knobs changed {r['knobs_changed']} clocks {r['clocks']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

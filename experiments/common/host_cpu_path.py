"""The CPU path's cost (issue 31: CPU tensors through torch's own CPU kernels, "within 2x of the torch op it stands
for, in time and memory"): each op on CPU tensors (TRITON_INTERPRET unset: dispatch's "reference" backend) against
the torch code a user would write for it, same inputs, same process.

Time: the median of --reps calls after one warm-up call, the two sides interleaved call by call. Memory: the peak
resident memory a call adds over what was resident before it (Linux: /proc/self/clear_refs "5" resets VmHWM, then
VmHWM - VmRSS before the call; the process runs with MALLOC_MMAP_THRESHOLD_=131072, so every buffer of 128 KiB or
more is mapped for its life and unmapped when freed), the median of 3 calls. The result
is checked against the torch code (max |diff| over max |torch|, printed).

    python experiments/common/host_cpu_path.py [--reps 5] [--threads 2] [--only attention,gemm] [--json out.json]

Figures on a shared machine swing; read the ratios, each within one row."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # (before tilecore: the CPU path is torch's, not the interpreter)
if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and __name__ == "__main__":
    # glibc's malloc raises its mmap threshold after frees (up to 32 MiB), and then serves buffers from a heap
    # that keeps freed pages resident: a fixed threshold of 128 KiB maps every buffer and unmaps it when freed,
    # so the resident peak is what the call held (set before the process starts: re-executed with it)
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"})

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def peak_bytes(fn) -> int:
    """Resident memory the call adds at its peak over what was resident before it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status()["VmRSS"]
    out = fn()
    del out
    return max(0, _status()["VmHWM"] - before)


def cases(only):
    import tilecore

    g = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    def hadamard_matrix(n):
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return h

    out = {}

    def add(name, ours, theirs):
        if not only or any(o in name for o in only):
            out[name] = (ours, theirs)

    for dt in (torch.float32, torch.bfloat16):
        tag = str(dt).removeprefix("torch.")
        q, k, v = (randn(1, 8, 4096, 64, dtype=dt) for _ in range(3))
        add(f"attention causal N4096 {tag}", lambda q=q, k=k, v=v: tilecore.attention(q, k, v, causal=True),
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        a, b = randn(2048, 2048, dtype=dt), randn(2048, 2048, dtype=dt)
        add(f"gemm 2048^3 {tag}", lambda a=a, b=b: tilecore.gemm(a, b), lambda a=a, b=b: a @ b)
        x = randn(4096, 4096, dtype=dt)
        w, bias = randn(4096, dtype=dt), randn(4096, dtype=dt)
        add(f"layer_norm 4096x4096 {tag}", lambda x=x, w=w, bias=bias: tilecore.layer_norm(x, w, bias),
            lambda x=x, w=w, bias=bias: F.layer_norm(x, (4096,), w, bias))
        add(f"rms_norm 4096x4096 {tag}", lambda x=x, w=w: tilecore.layer_norm(x, w, rms=True),
            lambda x=x, w=w: F.rms_norm(x, (4096,), w))
        xh = randn(4096, 1024, dtype=dt)
        h = (hadamard_matrix(1024) / 32).to(dt)
        add(f"hadamard 4096x1024 {tag}", lambda xh=xh: tilecore.hadamard_transform(xh, scale=1024 ** -0.5),
            lambda xh=xh, h=h: xh @ h)
    qg, kg, vg = (randn(1, 8, 1024, 64).requires_grad_() for _ in range(3))

    def attention_step(fn):
        def run():
            for t in (qg, kg, vg):
                t.grad = None
            fn(qg, kg, vg).sum().backward()
            return qg.grad
        return run
    add("attention fwd+bwd causal N1024 float32", attention_step(lambda q, k, v: tilecore.attention(q, k, v, causal=True)),
        attention_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
    xr = randn(4, 1024, 8, 128, dtype=torch.bfloat16)
    cos, sin = randn(1024, 64, dtype=torch.bfloat16), randn(1024, 64, dtype=torch.bfloat16)

    def rotary_torch():
        c, s = cos[:, None], sin[:, None]
        a1, a2 = xr[..., :64], xr[..., 64:]
        return torch.cat((a1 * c - a2 * s, a2 * c + a1 * s), -1)
    add("apply_rotary 4x1024x8x128 bfloat16", lambda: tilecore.apply_rotary(xr, cos, sin), rotary_torch)
    u, kf = randn(4, 256, 4096, dtype=torch.bfloat16), randn(256, 4096)

    def fft_torch():
        n = 2 * u.shape[-1]
        return torch.fft.irfft(torch.fft.rfft(u.float(), n) * torch.fft.rfft(kf, n), n)[..., :u.shape[-1]].to(u.dtype)
    add("fft_conv 4x256x4096 bfloat16", lambda: tilecore.fft_conv(u, kf), fft_torch)
    ql, kl, vl = (randn(1, 2048, 8, 64) for _ in range(3))
    add("linear_attention N2048 float32", lambda: tilecore.linear_attention(ql, kl, vl),
        lambda: (torch.tril(ql.transpose(1, 2) @ kl.transpose(1, 2).transpose(-1, -2) * 64 ** -0.5)
                 @ vl.transpose(1, 2)).transpose(1, 2))  # scale Dk^-0.5; (B, N, H, D), as linear_attention returns
    lens = torch.tensor([0, 1000, 3000, 4096], dtype=torch.int32)
    qv = randn(4096, 8, 64, dtype=torch.bfloat16)
    parts = [qv[int(a):int(b)].transpose(0, 1) for a, b in zip(lens[:-1], lens[1:])]

    def varlen_torch():  # (total, H, D), as attention_varlen returns
        return torch.cat([F.scaled_dot_product_attention(p, p, p, is_causal=True).transpose(0, 1) for p in parts])
    add("attention_varlen 3 seqs bfloat16", lambda: tilecore.attention_varlen(qv, qv, qv, lens, lens, 2000, 2000,
                                                                               causal=True), varlen_torch)
    xq = randn(4096, 4096, dtype=torch.bfloat16)
    hq = (hadamard_matrix(4096) / 64).to(torch.bfloat16)
    add("hadamard_quantize fp8 4096x4096 bfloat16", lambda: tilecore.hadamard_quantize(xq, format="fp8_e4m3"),
        lambda: (xq @ hq).to(torch.float8_e4m3fn))
    return out


def _flat(y):
    if isinstance(y, (tuple, list)):
        return torch.cat([_flat(t) for t in y if isinstance(t, torch.Tensor)])
    return y.detach().float().reshape(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for name, (ours, theirs) in cases([s for s in a.only.split(",") if s]).items():
        try:
            y_ours, y_theirs = ours(), theirs()  # (warm-up, and the check)
            if "hadamard_quantize" in name:  # codes: compare the values they stand for against the torch cast
                y_ours, y_theirs = y_ours[0].float() * y_ours[1].float(), y_theirs.float()
            a_, b_ = _flat(y_ours), _flat(y_theirs)
            diff = float((a_ - b_).abs().max() / b_.abs().max().clamp_min(1e-30)) if a_.shape == b_.shape else None
            t = {"ours": [], "torch": []}
            for _ in range(a.reps):
                for side, fn in (("ours", ours), ("torch", theirs)):
                    start = time.perf_counter()
                    fn()
                    t[side].append(time.perf_counter() - start)
            mem = {side: statistics.median(peak_bytes(fn) for _ in range(3)) for side, fn in (("ours", ours),
                                                                                               ("torch", theirs))}
            row = {"op": name, "ours_ms": statistics.median(t["ours"]) * 1e3, "torch_ms": statistics.median(t["torch"]) * 1e3,
                   "ours_mb": mem["ours"] / 2**20, "torch_mb": mem["torch"] / 2**20, "max_rel_diff": diff}
        except Exception as err:  # noqa: BLE001
            row = {"op": name, "error": f"{type(err).__name__}: {err}"[:300]}
        rows.append(row)
        print(row, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": a.threads, "reps": a.reps, "rows": rows}, f, indent=1)
    print(f"\n{'op':42s} {'ms':>9s} {'torch ms':>9s} {'ratio':>6s} {'MB':>8s} {'torch MB':>9s} {'ratio':>6s} {'diff':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['op']:42s} {r['error']}")
            continue
        mem_ratio = r["ours_mb"] / r["torch_mb"] if r["torch_mb"] > 0.5 else float("nan")
        diff = "-" if r["max_rel_diff"] is None else f"{r['max_rel_diff']:.1e}"
        print(f"{r['op']:42s} {r['ours_ms']:9.1f} {r['torch_ms']:9.1f} {r['ours_ms'] / r['torch_ms']:6.2f} "
              f"{r['ours_mb']:8.1f} {r['torch_mb']:9.1f} {mem_ratio:6.2f} {diff:>8s}")


if __name__ == "__main__":
    main()

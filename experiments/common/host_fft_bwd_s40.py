"""Why fft_conv's fwd+bwd row (host_rows.py: u (2, 64, 1024) bf16, k (64, 1024) float32, both recording a gradient,
then torch.autograd.grad of both) takes ~1.1-1.4 ms a call for ours and for torch.fft's autograd alike on the H100
(session 39 calls 4 and 7), where the forward alone is ~40-90 us of host time: the GPU's time a call against the
host's, and the GPU kernels of one call by torch.profiler (CUDA activity), for k float32 (the row's) and bf16.

    python experiments/common/host_fft_bwd_s40.py [--smoke] [--deadline 60]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.gpu_script import Run, host_us, same_bits, time_rounds  # noqa: E402


def cases(device, k_dtype):
    import tilecore
    gen = torch.Generator(device=device).manual_seed(40)
    bf = dict(device=device, dtype=torch.bfloat16)
    u = torch.randn(2, 64, 1024, generator=gen, **bf).requires_grad_()
    k = torch.randn(64, 1024, generator=gen, device=device).to(k_dtype).requires_grad_()
    du = torch.randn(2, 64, 1024, generator=gen, **bf)

    def ours():
        y = tilecore.fft_conv(u, k)
        return (y, *torch.autograd.grad(y, (u, k), du))

    def peer():
        n = 2 * u.shape[-1]
        y = torch.fft.irfft(torch.fft.rfft(u.float(), n) * torch.fft.rfft(k.float(), n), n)[..., :u.shape[-1]]
        y = y.to(u.dtype)
        return (y, *torch.autograd.grad(y, (u, k), du))

    return ours, peer


def kernels(fn, calls: int = 10, top: int = 8) -> list:
    """The GPU kernels of ``calls`` calls by torch.profiler: (us a call, launches a call, name), the longest first."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append([round(t / calls, 2), round(e.count / calls, 2), e.key[:90]])
    rows.sort(key=lambda r: -r[0])
    return rows[:top]


def cpu_ops(fn, calls: int = 10, top: int = 10) -> list:
    """The host's ops of ``calls`` calls by torch.profiler (CPU activity, every thread: the autograd engine's device
    thread too): (self us a call, calls a call, name), the longest self time first."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [[round(e.self_cpu_time_total / calls, 2), round(e.count / calls, 2), e.key[:90]]
            for e in prof.key_averages() if e.self_cpu_time_total]
    rows.sort(key=lambda r: -r[0])
    return rows[:top]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--deadline", type=float, default=60.0)
    a = ap.parse_args()
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    run = Run("host_fft_bwd", deadline=a.deadline)
    x = torch.randn(2, 64, 1024, device=device, requires_grad=True)
    gx = torch.randn(2, 64, 1024, device=device)

    def trivial():  # the autograd engine's own cost a call: one node
        return torch.autograd.grad(x * 2, x, gx)
    run.row("autograd.grad of x * 2 (one node)", trivial_host_us=round(host_us(trivial, calls=50 if a.smoke else 300), 1))
    for k_dtype in (torch.float32, torch.bfloat16):
        name = str(k_dtype).removeprefix("torch.")
        ours, peer = cases(device, k_dtype)
        first = ours()
        run.row(f"k {name}: same bits on calls 1..3", same=all(same_bits(ours(), first) for _ in range(2)))
        t = time_rounds({"ours": ours, "torch": peer}, rounds=3, graph=False)
        host = {f"{w}_host_us": round(host_us(f, calls=50 if a.smoke else 300), 1) for w, f in
                (("ours", ours), ("torch", peer))}
        run.row(f"k {name}: time", **t, **host)
        if device == "cuda" and run.left() > 10:
            for who, f in (("ours", ours), ("torch", peer)):
                run.attempt(f"k {name}: kernels {who}",
                            lambda who=who, f=f: run.row(f"k {name}: kernels {who}", kernels=kernels(f)))
            for who, f in (("ours", ours), ("torch", peer)):
                run.attempt(f"k {name}: host ops {who}",
                            lambda who=who, f=f: run.row(f"k {name}: host ops {who}", ops=cpu_ops(f)))
    run.finish(["name", "ours_ms", "torch_ms", "ours_host_us", "torch_host_us", "trivial_host_us", "same"])


if __name__ == "__main__":
    main()

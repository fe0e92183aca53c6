"""Why fft_conv's fwd+bwd row (host_rows.py: u (2, 64, 1024) bf16, k (64, 1024) float32, both recording a gradient,
then torch.autograd.grad of both) takes ~1.1-1.4 ms a call for ours and for torch.fft's autograd alike on the H100
(session 39 calls 4 and 7), where the forward alone is ~40-90 us of host time: the GPU's time a call against the
host's, and the GPU kernels of one call by torch.profiler (CUDA activity), for k float32 (the row's) and bf16.

    python experiments/common/host_fft_bwd.py [--smoke] [--deadline 60]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.gpu_script import Run, check, host_us, profiled, same_bits, time_rounds  # noqa: E402


def reference(u, k, du):
    """y and (du, dk) in float64 (torch.fft), the leaves' dtypes' references."""
    u64, k64 = u.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    n = 2 * u.shape[-1]
    y = torch.fft.irfft(torch.fft.rfft(u64, n) * torch.fft.rfft(k64, n), n)[..., :u.shape[-1]]
    return (y.detach(), *torch.autograd.grad(y, (u64, k64), du.double()))


def ab_keyed_backward(run, device, smoke: bool) -> None:
    """op.KEYED_BACKWARD on / off: float64 checks of y, du, dk with it on, the same bits on vs off, host time a
    fwd+bwd in interleaved rounds (ours on, off, torch's)."""
    import statistics

    from tilecore.ops.fft_conv import op as fft_op
    from tilecore.tiles.switches import patched
    for k_dtype in (torch.float32, torch.bfloat16):
        name = str(k_dtype).removeprefix("torch.")
        ours, peer, (u, k, du) = cases(device, k_dtype, inputs=True)
        with patched(fft_op, KEYED_BACKWARD=True):
            ons = [ours() for _ in range(4)]
        with patched(fft_op, KEYED_BACKWARD=False):
            off = ours()
        ref = reference(u, k, du)
        # (a float32 dk is torch.fft's float32 correlation on either path: its error is float32 FFT rounding over 2N
        # points, many times float32's floor, so it is read against torch's own autograd of the same convolution)
        for label, out, r, theirs in zip(("y", "du", "dk"), ons[-1], ref, peer()):
            peer_err = check(theirs, r)["err_over_floor"]
            tol = 3.0 if out.dtype != torch.float32 else max(3.0, 1.5 * peer_err)
            run.row(f"KEYED_BACKWARD k {name}: check {label}", **check(out, r, tol=tol), torch_err_over_floor=peer_err)
        times = {"on": [], "off": [], "torch": []}
        for r in range(1 if smoke else 7):
            for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
                with patched(fft_op, KEYED_BACKWARD=setting == "on"):
                    times[setting].append(round(host_us(ours, calls=20 if smoke else 300), 1))
            times["torch"].append(round(host_us(peer, calls=20 if smoke else 300), 1))
        run.row(f"KEYED_BACKWARD k {name}: host us a fwd+bwd", same_bits_on_vs_off=same_bits(ons[-1], off),
                same_bits_calls_on=all(same_bits(o, ons[0]) for o in ons[1:]),
                **{f"{w}_us": statistics.median(v) for w, v in times.items()}, rounds_us=times)


def cases(device, k_dtype, inputs: bool = False):
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

    return (ours, peer, (u, k, du)) if inputs else (ours, peer)


def kernels(fn, calls: int = 10, top: int = 8) -> list:
    """The GPU kernels of ``calls`` calls by torch.profiler: (us a call, launches a call, name), the longest first."""
    rows = []
    for e in profiled(fn, calls).key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append([round(t / calls, 2), round(e.count / calls, 2), e.key[:90]])
    rows.sort(key=lambda r: -r[0])
    return rows[:top]


def cpu_ops(fn, calls: int = 10, top: int = 10) -> list:
    """The host's ops of ``calls`` calls by torch.profiler (CPU activity, every thread: the autograd engine's device
    thread too): (self us a call, calls a call, name), the longest self time first."""
    rows = [[round(e.self_cpu_time_total / calls, 2), round(e.count / calls, 2), e.key[:90]]
            for e in profiled(fn, calls, cpu=True).key_averages() if e.self_cpu_time_total]
    rows.sort(key=lambda r: -r[0])
    return rows[:top]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--deadline", type=float, default=60.0)
    ap.add_argument("--ab", action="store_true", help="op.KEYED_BACKWARD on / off (ab_keyed_backward) alone")
    a = ap.parse_args()
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    run = Run("host_fft_bwd", deadline=a.deadline)
    if a.ab:
        run.attempt("KEYED_BACKWARD A/B", ab_keyed_backward, run, device, a.smoke)
        run.finish(["name", "pass", "err_over_floor", "torch_err_over_floor", "on_us", "off_us", "torch_us",
                    "same_bits_on_vs_off"])
        return
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

"""What a filter-spectrum kernel would take off fft_conv's eager host time (issue 31): the row's filter k (64, 1024)
float32 transformed by one Triton kernel (the zero-padded filter's 2N-point real DFT, no cat and no cuFFT call) and
handed to ``tilecore.fft_conv(u, spectrum)``, against the shipped ``fft_conv(u, k)`` (torch.cat of k with kept zeros,
then torch.fft.rfft, then the conv: session 41's parts, cat 7.9 + rfft 10.1 us of its 39) in the same rounds.

    python experiments/common/host_fft_spectrum.py [--calls 300] [--rounds 7] [--deadline 80] [--smoke]

A probe, not the library's: fft_conv's kernels and configs are HF's (a kernel of the filter's transform, or the conv
kernel reading k's taps itself, would be theirs). The kernel, ``padded_rfft_kernel``: one program a channel, the
2N = P x 64 point DFT of k[:L] (L <= N, zero past it) in four steps, each a float32 product (``tl.dot`` at
input_precision "ieee": FMAs, no TF32): A = E_P[:, :P/2] K (K: the taps as (P/2, 64): j = 64 j1 + j2; the
upper half of the padded filter is zero, so half of E_P's columns), the twiddles exp(-2 pi i m1 j2 / 2N), then
X = B E_64, bin m = m1 + P m2 stored for m <= N as float32 (re, im) pairs: filter_spectrum's complex64 layout.
Angles from integer products reduced mod 2N (no large float arguments to sin / cos).

Phases: (1) float64 checks: the kernel's spectrum against the float64 DFT (relative error, and cuFFT's beside it);
y = fft_conv(u, kernel's spectrum) and y = fft_conv(u, k) against the float64 convolution (gpu_script.check: the
error as a multiple of the rounding floor, every element written), u poisoned first. (2) host us a call, interleaved
rounds: fft_conv(u, k) shipped; the kernel's spectrum + fft_conv(u, spectrum) (the launch kept as the library keeps
one: tiles.launch.KeyedLaunch, y and the spectrum by new_empty); fft_conv(u, spectrum) alone (the floor);
cat + rfft alone; the kernel alone; torch's fft convolution (the yardstick row). (3) GPU time from CUDA graphs: the
kernel against cat + rfft. Writes $OUT/host_fft_spectrum.json (gpu_script.Run), a table last.
"""
import argparse
import math
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # (the CPU: the kernel through Triton's interpreter, which must be on before triton.jit)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.gpu_script import Run, check, host_rounds, poisoned, same_bits, time_rounds  # noqa: E402
import tilecore  # noqa: E402
from tilecore.tiles.launch import CachedLaunch, KeyedLaunch  # noqa: E402

TWO_PI = 2.0 * math.pi


@triton.jit
def padded_rfft_kernel(k_ptr, out_ptr, L, stride_k, stride_o, M: tl.constexpr, P: tl.constexpr, Q: tl.constexpr):
    """out[h, m] = sum_{j < L} k[h, j] exp(-2 pi i j m / M), m = 0 .. M / 2, as (re, im) float32 pairs; M = P Q."""
    h = tl.program_id(0)
    HALF: tl.constexpr = P // 2  # (taps j < M / 2: j1 < P / 2)
    j1 = tl.arange(0, HALF)
    j2 = tl.arange(0, Q)
    m1 = tl.arange(0, P)
    m2 = tl.arange(0, Q)
    j = j1[:, None] * Q + j2[None, :]
    taps = tl.load(k_ptr + h * stride_k + j, mask=j < L, other=0.0).to(tl.float32)  # (P/2, Q)
    # step 1: A = E_P[:, :P/2] K, E_P[m1, j1] = exp(-2 pi i m1 j1 / P)
    a1 = ((m1[:, None] * j1[None, :]) % P).to(tl.float32) * (6.283185307179586 / P)
    a_re = tl.dot(tl.cos(a1), taps, input_precision="ieee")
    a_im = -tl.dot(tl.sin(a1), taps, input_precision="ieee")
    # step 2: the twiddles exp(-2 pi i m1 j2 / M)
    a2 = ((m1[:, None] * j2[None, :]) % M).to(tl.float32) * (6.283185307179586 / M)
    c2, s2 = tl.cos(a2), tl.sin(a2)
    b_re = a_re * c2 + a_im * s2
    b_im = a_im * c2 - a_re * s2
    # step 3: X = B E_Q, E_Q[j2, m2] = exp(-2 pi i j2 m2 / Q)
    a3 = ((j2[:, None] * m2[None, :]) % Q).to(tl.float32) * (6.283185307179586 / Q)
    c3, s3 = tl.cos(a3), tl.sin(a3)
    x_re = tl.dot(b_re, c3, input_precision="ieee") + tl.dot(b_im, s3, input_precision="ieee")
    x_im = tl.dot(b_im, c3, input_precision="ieee") - tl.dot(b_re, s3, input_precision="ieee")
    m = m1[:, None] + P * m2[None, :]
    keep = m <= M // 2
    base = out_ptr + h * stride_o + 2 * m
    tl.store(base, x_re, mask=keep)
    tl.store(base + 1, x_im, mask=keep)


_KERNEL = CachedLaunch(padded_rfft_kernel)


class PaddedRfft:
    """The kernel's call for one (H, L, N) and device, kept as the library keeps a launch (KeyedLaunch: after its first
    launch no key is hashed): the spectrum allocated by new_empty (k's device), one launch."""

    def __init__(self, k: torch.Tensor, n: int):
        H, L = k.shape
        M = 2 * n
        Q = 64
        if M % Q or M // Q < 32 or k.stride(-1) != 1:
            raise ValueError(f"padded_rfft: 2n a multiple of 64 with 2n / 64 >= 32 and k's rows contiguous; got n {n}")
        self.shape, self.H, self.L = (H, n + 1, 2), H, L
        self.launch = KeyedLaunch(_KERNEL, ("padded_rfft", H, L, n, k.dtype, k.stride(0), k.device), (H,),
                                  dict(M=M, P=M // Q, Q=Q, num_warps=4 if M <= 2048 else 8))

    def __call__(self, k: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """k's spectrum, complex64 (H, n + 1); ``out``: the float32 (H, n + 1, 2) pairs to write (a poisoned buffer)."""
        if out is None:
            out = k.new_empty(self.shape, dtype=torch.float32)
        self.launch((k, out, self.L, k.stride(0), 2 * self.shape[1]))
        return torch.view_as_complex(out)


def reference_spectrum(k: torch.Tensor, n: int) -> torch.Tensor:
    """The float64 DFT of k zero-padded to 2n, bins 0..n (complex128)."""
    return torch.fft.rfft(k.double(), n=2 * n)


def reference_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    n = u.shape[-1]
    y = torch.fft.irfft(torch.fft.rfft(u.double(), n=2 * n) * torch.fft.rfft(k.double(), n=2 * n), n=2 * n)
    return y[..., :n]


def gpu_at(run: Run, n: int, H: int = 768):
    """The kernel against cat + rfft at H channels, seqlen n (a full-length filter): float64 check of the kernel's
    spectrum (into a poisoned buffer), then GPU ms from CUDA graphs in interleaved rounds."""
    k = torch.randn(H, n, device="cuda") / math.sqrt(n)
    zeros = torch.zeros(H, n, device="cuda")
    recipe = PaddedRfft(k, n)
    spec = recipe(k, poisoned(torch.empty(H, n + 1, 2, device="cuda")))
    ref = reference_spectrum(k, n)
    err = (spec.cdouble() - ref).abs().pow(2).mean().sqrt().item() / ref.abs().max().item()
    run.row(f"GPU ms (graph) H{H} N{n}", written=bool(torch.isfinite(torch.view_as_real(spec)).all()),
            kernel_rms_rel_err=err, **time_rounds({"kernel": lambda: recipe(k),
                                                   "cat_rfft": lambda: torch.fft.rfft(torch.cat((k, zeros), 1))},
                                                  rounds=3, graph=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--deadline", type=float, default=80.0)
    ap.add_argument("--gpu-n", type=int, nargs="*", default=[], help="seqlens timed at H 768 (GPU time: kernel, cat+rfft)")
    ap.add_argument("--n", type=int, default=1024, help="the row's seqlen (1024: host_time's fft_conv row)")
    ap.add_argument("--smoke", action="store_true", help="CPU under the interpreter: 2 channels, the checks alone")
    a = ap.parse_args()
    dev = "cpu" if a.smoke else "cuda"
    B, H, N = (1, 2, a.n) if a.smoke else (2, 64, a.n)
    run = Run("host_fft_spectrum", deadline=a.deadline)
    run.extra.update(shape=dict(B=B, H=H, N=N), calls=a.calls, rounds=a.rounds)
    gen = torch.Generator(device=dev).manual_seed(42)
    u = torch.randn(B, H, N, generator=gen, device=dev).to(torch.bfloat16)
    k = torch.randn(H, N, generator=gen, device=dev) / math.sqrt(N)
    k_short = torch.randn(H, 300, generator=gen, device=dev)
    zeros = torch.zeros(H, N, device=dev)

    def spectra(kk):
        """The kernel's spectrum (into a NaN-poisoned buffer: every bin written?) and cuFFT's (rfft(k.float(), n=2N),
        what fft_conv takes) against the float64 DFT: the largest and the RMS error over the largest bin's size."""
        spec = PaddedRfft(kk, N)(kk, poisoned(torch.empty(H, N + 1, 2, device=kk.device)))
        ref = reference_spectrum(kk, N)
        scale = ref.abs().max().item()
        cufft = torch.fft.rfft(kk.float(), n=2 * N)
        err = {"kernel": (spec.cdouble() - ref).abs(), "cufft": (cufft.cdouble() - ref).abs()}
        return dict(written=bool(torch.isfinite(torch.view_as_real(spec)).all()),
                    **{f"{w}_rel_err": e.max().item() / scale for w, e in err.items()},
                    **{f"{w}_rms_rel_err": e.pow(2).mean().sqrt().item() / scale for w, e in err.items()})

    for name, kk in ((f"k ({H}, {N}) float32", k), (f"k ({H}, 300) float32", k_short),
                     (f"k ({H}, {N}) bf16", k.to(torch.bfloat16))):
        run.attempt(f"spectrum {name}", lambda kk=kk, name=name: run.row(f"spectrum {name}", **spectra(kk)))

    def conv_checks():
        ref = reference_conv(u, k)
        spec = PaddedRfft(k, N)(k)
        y_kernel = tilecore.fft_conv(u, spec)  # (fft_conv's y is its own fresh tensor; its checks are fft_conv's)
        y_shipped = tilecore.fft_conv(u, k)
        run.row("y by the kernel's spectrum", **check(y_kernel, ref))
        run.row("y shipped (cat + rfft)", **check(y_shipped, ref),
                same_bits_as_kernel_spectrum=bool(same_bits(y_kernel, y_shipped)))
    run.attempt("conv checks", conv_checks)
    if a.smoke:
        run.finish(["name", "written", "kernel_rel_err", "cufft_rel_err", "err_over_floor", "pass"])
        return
    recipe = PaddedRfft(k, N)
    for _ in range(3):
        recipe(k)  # (the launch kept)
    spec = recipe(k)

    def torch_fft():
        n2 = 2 * N
        return torch.fft.irfft(torch.fft.rfft(u.float(), n2) * torch.fft.rfft(k, n2), n2)[..., :N].to(u.dtype)
    fns = {
        "shipped fft_conv(u, k)": lambda: tilecore.fft_conv(u, k),
        "kernel spectrum + fft_conv(u, spectrum)": lambda: tilecore.fft_conv(u, recipe(k)),
        "fft_conv(u, spectrum) alone": lambda: tilecore.fft_conv(u, spec),
        "cat + rfft alone": lambda: torch.fft.rfft(torch.cat((k, zeros), 1)),
        "kernel alone": lambda: recipe(k),
        "torch fft conv": torch_fft,
    }
    for f in fns.values():
        f()
    run.attempt("host", lambda: run.row("host us a call", **host_rounds(fns, rounds=a.rounds, calls=a.calls)))
    run.attempt("gpu", lambda: run.row("GPU ms (graph)", **time_rounds(
        {"kernel": lambda: recipe(k), "cat_rfft": lambda: torch.fft.rfft(torch.cat((k, zeros), 1))},
        rounds=3, graph=True)))
    for n in a.gpu_n:  # (where the kernel's float32 FMA products stop paying: H 768, the channels)
        if run.left() < 10:
            run.row(f"GPU ms (graph) H768 N{n}", skipped="deadline")
            continue
        run.attempt(f"gpu N{n}", lambda n=n: gpu_at(run, n))
    run.finish(["name", "written", "kernel_rel_err", "cufft_rel_err", "err_over_floor", "pass", "kernel_graph_ms",
                "cat_rfft_graph_ms"])


if __name__ == "__main__":
    main()

"""Small kernels by GPU time (issue 36, session 39): the figures the napkin's two small-kernel terms are
derived from and checked on.

Each case is the bench's own builder (tilecore/bench/suites: inputs rotated past L2, a CUDA graph of back-to-back
calls, do_bench's median over its replays / calls: harness.graph_replay), so the figures are the same quantity as
benchmarks/results/h100-80gb-hbm3/hadamard-latency.json's and attention-decode.json's rows, and each kernel of a
call is timed on its own by the profiler (CUPTI kernel durations of eager calls: the kernel's run without the gap
before it). Cases:

- ``empty``: an empty Triton kernel from a graph (the launch floor), and a copy of 2 KiB-8 MiB (torch copy_);
- ``hadamard``: tilecore.hadamard_transform of 1 row for n = 256 ... 32768, and of 132 / 264 rows at n 4096 and
  16384 (one tile a program, then two), each checked against a float64 fast Walsh-Hadamard transform;
- ``programs``: n 4096 through the tl plan with its table's programs an SM and with one or two (132-396 rows);
- ``decode``: tilecore.attention at B 1, one query, Nk 1024 / 4096 / 16384 (Hq 32, Hkv 8, D 128: the bench's),
  its split-key kernel and merge by the profiler, checked against a float64 softmax;
- ``peers``: SDPA's flash and cuDNN decode at the same shapes (enable_gqa, the bench's call), kernel by kernel.

    python experiments/napkin/gpu_small_kernels.py [--smoke] [--phases empty,hadamard,decode,programs]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402

from experiments.common.gpu_script import Run, check, poisoned, profiled  # noqa: E402


@triton.jit
def empty_kernel(out_ptr):
    pass


def graph_us(fn) -> float | None:
    """One call's GPU time (us), as the bench times a graph-timed suite (harness.graph_replay, median_ms)."""
    if not torch.cuda.is_available():
        return None
    from tilecore.bench.harness import graph_replay, median_ms

    replay, calls = graph_replay(fn)
    return median_ms(replay, warmup_ms=10, rep_ms=40) / calls * 1e3


def kernel_us(fn, calls: int = 20) -> dict:
    """{kernel name: median device us a call} of ``fn``'s eager calls, by the profiler (CUPTI)."""
    if not torch.cuda.is_available():
        return {}
    per: dict = {}
    for e in profiled(fn, calls).events():
        t = e.time_range.elapsed_us()
        if t and str(getattr(e, "device_type", "")).endswith("CUDA"):
            per.setdefault(e.name[:40], []).append(t)
    return {k: round(sorted(v)[len(v) // 2], 3) for k, v in per.items() if len(v) >= calls // 2}


def fwht64(x: torch.Tensor) -> torch.Tensor:
    """H_n x along the last axis in float64 (Sylvester order), by log2(n) butterfly passes."""
    y = x.double().clone()
    n = y.shape[-1]
    h = 1
    while h < n:
        y = y.view(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(*x.shape[:-1], n)
        h *= 2
    return y


def empty_cases(run: Run) -> None:
    from tilecore.bench.suites.copy import torch_copy

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.zeros(1, device=dev)
    if dev == "cuda":
        run.row("empty kernel", graph_us=graph_us(lambda: empty_kernel[(1,)](out)))
    for nbytes in (2 << 10, 8 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20):
        if run.left() < 40 or dev != "cuda":
            break
        fn = torch_copy(nbytes // 2, torch.bfloat16)()
        run.row(f"copy {nbytes >> 10} KiB", graph_us=graph_us(fn), kernels=kernel_us(fn))


def hadamard_cases(run: Run, smoke: bool) -> None:
    from tilecore import hadamard_transform

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = [(1, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)] + [(132, 4096), (264, 4096),
                                                                                     (132, 16384), (264, 16384)]
    if smoke:
        sizes = [(1, 256), (3, 64)]
    for rows, n in sizes:
        if run.left() < 22 and not smoke:
            break
        x = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)
        scale = n ** -0.5
        ref = fwht64(x) * scale
        y = hadamard_transform(x, scale)
        ok = check(y, ref)
        if dev != "cuda":
            run.row(f"hadamard rows {rows} n {n}", **ok)
            continue
        sets = [torch.randn(rows, n, device=dev, dtype=torch.bfloat16) for _ in range(max(1, min(64, (200 << 20) // (4 * rows * n))))]
        it = iter(range(1 << 30))
        fn = lambda: hadamard_transform(sets[next(it) % len(sets)], scale)  # noqa: E731
        run.row(f"hadamard rows {rows} n {n}", **ok, graph_us=graph_us(fn), kernels=kernel_us(fn))


def programs_cases(run: Run, smoke: bool) -> None:
    """n 4096 by the tl plan with its programs an SM (TUNING: 16) and with one or two (plan's ``waves``): do two
    programs on one SM run their chains one after the other (the hadamard-latency row of 256 rows, 1.40x the
    one-program chain)? Each checked against float64."""
    from tilecore.ops.hadamard import launch, plan

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 256 if smoke else 4096
    for rows in ((3,) if smoke else (132, 264, 396)):
        for waves in (None, 1, 2):
            if run.left() < 6 and not smoke:
                return
            x = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)
            scale = n ** -0.5
            kw = {} if waves is None else {"waves": waves}
            out = poisoned(x)
            p = plan.plan(x, out, **kw)
            launch.launch(p, x, out, scale)
            ok = check(out, fwht64(x) * scale)
            name = f"programs rows {rows} n {n} waves {waves or 'table'} grid {p.grid[0]}"
            if dev != "cuda":
                run.row(name, **ok)
                continue
            sets = [(t, torch.empty_like(t)) for t in
                    (torch.randn(rows, n, device=dev, dtype=torch.bfloat16) for _ in range(max(1, min(64, (200 << 20) // (4 * rows * n)))))]
            it = iter(range(1 << 30))

            def fn():
                a, b = sets[next(it) % len(sets)]
                launch.launch(p, a, b, scale)
            run.row(name, **ok, graph_us=graph_us(fn), kernels=kernel_us(fn))


def decode_cases(run: Run, smoke: bool) -> None:
    import tilecore

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for nk in ((64,) if smoke else (1024, 4096, 16384)):
        if run.left() < 8 and not smoke:
            break
        g = torch.Generator(device=dev).manual_seed(nk)
        q = torch.randn(1, 32, 1, 128, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, 8, nk, 128, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, 8, nk, 128, device=dev, dtype=torch.bfloat16, generator=g)
        kk, vv = k.double().repeat_interleave(4, dim=1), v.double().repeat_interleave(4, dim=1)
        s = q.double() @ kk.transpose(-1, -2) / 128 ** 0.5
        ref = torch.softmax(s, dim=-1) @ vv
        out = poisoned(q)
        out.copy_(tilecore.attention(q, k, v))
        ok = check(out, ref)
        if dev != "cuda":
            run.row(f"decode B1 Nk{nk}", **ok)
            continue
        nsets = max(1, min(64, (200 << 20) // (2 * 2 * 8 * nk * 128 * 2)))
        sets = [(q, k.clone().normal_(), v.clone().normal_()) for _ in range(nsets)]
        it = iter(range(1 << 30))

        def fn():
            a, b, c = sets[next(it) % len(sets)]
            return tilecore.attention(a, b, c)
        run.row(f"decode B1 Nk{nk}", **ok, graph_us=graph_us(fn), kernels=kernel_us(fn))


def peer_decode_cases(run: Run, smoke: bool) -> None:
    """SDPA's flash and cuDNN decode at B 1 (the bench's builders: tilecore/bench/suites/attention_decode.py), each
    kernel by the profiler: what FlashAttention-2's split-KV decode runs beyond tilecore's (its 4 misses)."""
    if smoke or not torch.cuda.is_available():
        return
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for nk in (1024, 4096, 16384):
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            if run.left() < 5:
                return
            g = torch.Generator(device="cuda").manual_seed(nk)
            q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(1, 8, nk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            kk, vv = k.double().repeat_interleave(4, dim=1), v.double().repeat_interleave(4, dim=1)
            ref = torch.softmax(q.double() @ kk.transpose(-1, -2) / 128 ** 0.5, dim=-1) @ vv

            def fn(q=q, k=k, v=v, backend=backend):
                with sdpa_kernel(backend), torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            ok = run.attempt(f"{name} Nk{nk}", lambda: check(fn(), ref))
            if ok is None:
                continue
            nsets = max(1, min(64, (200 << 20) // (2 * 2 * 8 * nk * 128 * 2)))
            sets = [(q, k.clone().normal_(), v.clone().normal_()) for _ in range(nsets)]
            it = iter(range(1 << 30))

            def rot(backend=backend, sets=sets, it=it):
                a, b, c = sets[next(it) % len(sets)]
                with sdpa_kernel(backend), torch.no_grad():
                    return F.scaled_dot_product_attention(a, b, c, enable_gqa=True)
            run.row(f"{name} decode B1 Nk{nk}", **ok, graph_us=graph_us(rot), kernels=kernel_us(rot))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU / interpreter: the checks on tiny shapes, no timing")
    ap.add_argument("--deadline", type=float, default=55.0)
    ap.add_argument("--phases", default="empty,hadamard,decode", help="of: empty, hadamard, decode, programs, peers")
    args = ap.parse_args(argv)
    phases = set(args.phases.split(","))
    run = Run("napkin_small_kernels", deadline=args.deadline)
    run.say("device", run.meta.get("gpu"))
    if "empty" in phases:
        run.attempt("empty and copies", empty_cases, run)
    if "hadamard" in phases:
        run.attempt("hadamard", hadamard_cases, run, args.smoke)
    if "programs" in phases:
        run.attempt("programs", programs_cases, run, args.smoke)
    if "decode" in phases:
        run.attempt("decode", decode_cases, run, args.smoke)
    if "peers" in phases:
        run.attempt("peer decode", peer_decode_cases, run, args.smoke)
    for r in run.rows:  # the table's kernel column: each kernel's device us, short names
        r["kern"] = " ".join(f"{k[:14]}={v}" for k, v in (r.get("kernels") or {}).items())[:70]
    run.finish(["name", "pass", "err_over_floor", "graph_us", "kern"])
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""RotatedLinear's curve at Llama-3-8B's MLP shapes (issue 32): tilecore.nn.RotatedLinear (hadamard_quantize's e4m3
per-token codes of R x in one pass, then gemm_fp8 with per-token and per-channel scales) against the bf16 linear
(torch.nn.functional.linear, cuBLAS) at 4096 -> 14336 and 14336 -> 4096, 1..8192 tokens, and the same fp8 layer
without the rotation (the rotation's cost). Times from CUDA graphs (do_bench_cudagraph medians over interleaved
rounds: GPU time without the host's launches; eager times beside at >= 512 tokens). Output error against the float64
linear with and without the rotation (activations with four outlier channels 60x the rest), and the bf16 linear's.
Target: faster than the bf16 linear from 512 tokens.

    PYTHONPATH=. python experiments/hadamard/gpu_rotated_linear.py [--tokens 1,16,...] [--deadline 55] [--smoke]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.common.gpu_script import Run, time_rounds  # noqa: E402

SHAPES = ((4096, 14336), (14336, 4096))  # Llama-3-8B: the MLP's up / gate projection, its down projection
TOKENS = (1, 16, 128, 512, 1024, 2048, 4096, 8192)


def activations(tokens, k, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(tokens, k, generator=g, device=dev, dtype=torch.float32)
    x[:, :4] *= 60  # outlier channels, as LLM activations have
    return x.to(torch.bfloat16)


def _warm(job):
    """One (k_in, k_out, tokens) forward in a fresh process, so that the kernels compile in parallel (Triton's disk
    cache then holds them for the timed process)."""
    k_in, k_out, tokens = job
    try:
        from tilecore.nn import RotatedLinear

        lin = torch.nn.Linear(k_in, k_out, bias=False, device="cuda", dtype=torch.bfloat16)
        x = activations(tokens, k_in, "cuda", 0)
        for rotate in (True, False):
            RotatedLinear.from_linear(lin, rotate=rotate)(x)
        torch.cuda.synchronize()
        return None
    except Exception as err:  # noqa: BLE001
        return f"{job}: {type(err).__name__}: {str(err)[:200]}"


def warm(shapes, tokens_list, run):
    import multiprocessing as mp

    jobs = [(k_in, k_out, t) for k_in, k_out in shapes for t in tokens_list]
    with mp.get_context("spawn").Pool(min(12, len(jobs))) as pool:
        for err in pool.imap_unordered(_warm, jobs):
            if err:
                run.errors.append("warm " + err)
    run.say(f"warmed {len(jobs)} shapes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--deadline", type=float, default=55.0)
    ap.add_argument("--smoke", action="store_true", help="small shapes (a CPU run of the script's logic)")
    a = ap.parse_args()
    shapes = ((256, 512),) if a.smoke else SHAPES
    tokens_list = [int(t) for t in a.tokens.split(",")]
    run = Run("gpu_rotated_linear", deadline=a.deadline)
    from tilecore.nn import RotatedLinear

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda":
        run.attempt("warm", warm, shapes, tokens_list, run)
    torch.manual_seed(0)
    for k_in, k_out in shapes:
        lin = torch.nn.Linear(k_in, k_out, bias=False, device=dev, dtype=torch.bfloat16)
        rot = RotatedLinear.from_linear(lin, rotate=True)
        plain = RotatedLinear.from_linear(lin, rotate=False)
        w = lin.weight
        # the error at 512 tokens against the float64 linear (fresh inputs; outputs compared whole: every element)
        x = activations(512, k_in, dev, 1)
        exact = x.double() @ w.double().T
        errs = {}
        for name, f in (("rotated", rot), ("plain_fp8", plain), ("bf16", lambda t: torch.nn.functional.linear(t, w))):
            y = f(x).double()
            errs[f"err_{name}"] = round(float((y - exact).norm() / exact.norm()), 5)
            errs[f"finite_{name}"] = bool(torch.isfinite(y).all())
        run.row(f"error {k_in}->{k_out} x512", **errs)
        for tokens in tokens_list:
            if run.left() < 4:
                run.errors.append(f"skipped {k_in}->{k_out} x{tokens}: deadline")
                continue
            x = activations(tokens, k_in, dev, tokens)
            fns = {"bf16": lambda: torch.nn.functional.linear(x, w), "rotated": lambda: rot(x),
                   "plain": lambda: plain(x)}
            for f in fns.values():  # compile / plan outside the timing
                f()
            res = run.attempt(f"time {k_in}->{k_out} x{tokens}", time_rounds, fns, rounds=2, graph=True,
                              eager=tokens >= 512 or dev == "cpu", rep=20)
            if res is None:
                continue
            key = "graph_ms" if "bf16_graph_ms" in res else "ms"
            row = {"bf16_ms": res.get(f"bf16_{key}"), "rotated_ms": res.get(f"rotated_{key}"),
                   "plain_ms": res.get(f"plain_{key}"), "timer": key}
            row["speedup"] = round(row["bf16_ms"] / row["rotated_ms"], 3)
            row["rotation_cost"] = round(row["rotated_ms"] / row["plain_ms"], 3)
            if "rotated_ms" in res and key != "ms":
                row["eager_speedup"] = round(res["bf16_ms"] / res["rotated_ms"], 3)
            run.row(f"{k_in}->{k_out} x{tokens}", **row)
    run.finish(["name", "bf16_ms", "rotated_ms", "plain_ms", "speedup", "rotation_cost", "eager_speedup",
                "err_rotated", "err_plain_fp8", "err_bf16"])


if __name__ == "__main__":
    main()

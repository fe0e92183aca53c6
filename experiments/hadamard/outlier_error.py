"""Quantization error with and without the Hadamard rotation on activations with outlier channels, for
every hadamard_quantize format, and the error of the matmul that consumes them (issue 32's accuracy
table). Numerics only: runs on the CPU (torch's CPU path) or a GPU, same figures up to rounding.

Activations: T tokens x n channels, N(0, 1), with a few channels (8 of 4096) scaled by 50-100, as LLM
activations have. Error = ||dequantized - x|| / ||x|| in the original basis (rotated back), and for the
matmul ||dq(x) W - x W|| / ||x W|| with W (n x 1024) N(0, 1) in float64, the rotation folded into W
(y W' with W' = H W / sqrt(n): the same product as x W in exact arithmetic).

    PYTHONPATH=. python3 experiments/hadamard/outlier_error.py [--tokens 512] [--n 4096] [--out DIR]
"""
import argparse
import json
import os

import torch

from tilecore.ops.hadamard import hadamard_matrix
from tilecore.ops.hadamard.quantize import dequantize, hadamard_quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS


def activations(tokens, n, outliers=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n, generator=g)
    channels = torch.randperm(n, generator=g)[:outliers]
    x[:, channels] *= 50 + 50 * torch.rand(outliers, generator=g)
    return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--out", default=os.environ.get("OUT", "notes/hadamard/runs"))
    args = p.parse_args()
    x = activations(args.tokens, args.n)
    w = torch.randn(args.n, 1024, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = x.double() @ w
    h = hadamard_matrix(args.n) / args.n**0.5  # orthonormal, symmetric (Sylvester)
    rows = []
    for fmt in FORMATS:
        row = {"format": fmt}
        for rotate in (False, True):
            codes, scales = hadamard_quantize(x, format=fmt, rotate=rotate)
            y = dequantize(codes, scales, format=fmt).double()  # the rotated domain when rotate
            back = y @ h.T if rotate else y  # x ~ H^T y / sqrt(n); H symmetric
            row[f"x_err_{'rot' if rotate else 'plain'}"] = float((back - x.double()).norm() / x.double().norm())
            prod = y @ (h @ w) if rotate else y @ w
            row[f"matmul_err_{'rot' if rotate else 'plain'}"] = float((prod - exact).norm() / exact.norm())
        rows.append(row)
    print(f"{'format':10s} {'x plain':>9s} {'x rotated':>10s} {'x W plain':>10s} {'x W rotated':>12s}")
    for r in rows:
        print(f"{r['format']:10s} {r['x_err_plain']:9.4f} {r['x_err_rot']:10.4f} {r['matmul_err_plain']:10.4f} "
              f"{r['matmul_err_rot']:12.4f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "outlier_error.json"), "w") as f:
        json.dump({"tokens": args.tokens, "n": args.n, "outlier_channels": 8, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

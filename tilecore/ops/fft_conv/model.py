"""What each FFT-convolution path must move and compute (pure Python: the GPU check prints it beside
the measured time, notes/fft_conv/README.md reasons from it).

Per call of B x H sequences of N (bf16 u and y, L = 2N = N1 N2, a pair = two sequences as one complex
one, B H / 2 pairs):

* the op's own bytes (the issue's bound): u read, y written (2 bytes an element each), the spectrum read
  (complex64 (H, N + 1));
* tensor-core FLOPs of the order-2 Monarch DFT a pair (every stage four real products):
  forward x @ F_N1[:N1/2] (N2 x N1/2 x N1) and @ F_N2 (N1 x N2 x N2), the inverse the same:
  8 L N1 + 16 L N2 (FLOPs = 2 multiply-adds);
* "long" adds a float16 scratch of 2 L elements a pair written by pass 1, read and written by pass 2,
  read by pass 3 (16 L bytes a pair), and reads u twice in pass 1 (its scales, then its columns).

Ceilings: a copy's bandwidth and dense float16 tensor FLOP/s as measured on the H100
(../shared/anchors.md: 2,997 GB/s copy, cuBLAS 680 TFLOP/s at 8192^3): a lower bound for each pass is
max(bytes / bandwidth, FLOPs / tensor rate).
"""
from __future__ import annotations

COPY_GBS = 2997.0  # H100 device-to-device copy, GB/s (read + written)
TENSOR_TFLOPS = 680.0  # H100 bf16 / fp16 cuBLAS 8192^3


def op_bytes(batch: int, heads: int, n: int, elem: int = 2) -> int:
    """u read, y written, the spectrum read."""
    return 2 * batch * heads * n * elem + heads * (n + 1) * 8


def pair_flops(n1: int, n2: int) -> int:
    """Tensor-core FLOPs of one pair's transform, forward and inverse (order 2)."""
    size = n1 * n2
    return 8 * size * n1 + 16 * size * n2


def mono_flops(a: int, b: int, c: int) -> int:
    """Tensor-core FLOPs of one pair's transform in the one-pass three-factor kernel (kernels_mono.py),
    forward and inverse, L = a b c: 8 L a (the first factor's half skipped) + 16 L b + 16 L c (c = 1:
    order 2, the pair kernel's count)."""
    size = a * b * c
    return 8 * size * a + 16 * size * b + (16 * size * c if c > 1 else 0)


def order3_flops(a: int, b: int) -> int:
    """Tensor-core FLOPs of one pair in the order-3 method (gluon_order3.py), forward and inverse, L = a b, a = 16 A2
    (8 FLOPs a complex multiply-add: four real products): 1a B x 16 x 16 a column a2 (K = 16, a1 >= 8 zero), 1b and
    1'b B A2 A2 for each of the 16 values of k1, 3 and 3' B B A2 likewise, 1'a B x 16 x 8 a column. At 8192 (256 x 64):
    3.0 M complex multiply-adds against order 2's 6.3 M (mono_flops(256, 64, 1)). The kernel's wgmmas run more:
    order3_wgmma_flops."""
    a2 = a // 16
    return 8 * (b * 16 * 16 * a2 + 2 * b * a * a2 + 2 * b * b * a + b * 16 * 8 * a2)


def order3_wgmma_flops(a: int, b: int, stack: bool = False) -> int:
    """The FLOPs the order-3 kernel's wgmmas execute a pair: as order3_flops, but stages 1b and 1'b take a chunk's 64
    rows k_a (b / A2 values of k1) in one [64, 64] @ [64, 64] product with F2 = b / A2 copies of F_A2 on its diagonal,
    the zeros multiplied too: B B A each, as stages 3 and 3' (at 8192 4.6 M complex multiply-adds a pair, 1.52x
    order3_flops; at 16384 9.2 M, 1.30x). ``stack`` (STACK, 8192): 1a and 1'a four columns a product against F2 (F_16
    four times on its diagonal), K and N 64, the block diagonal's zeros and 1'a's unused a1 >= 8 multiplied too: 6.3 M
    at 8192 (1.37x the columns' 4.6 M)."""
    a2 = a // 16
    first, last = (64, 64) if stack else (16, 8)
    return 8 * (b * 16 * first * a2 + 4 * b * b * a + b * 16 * last * a2)


def passes(path: str, batch: int, heads: int, n: int, n1: int = 0, n2: int = 0, elem: int = 2,
           n3: int = 1) -> list[dict]:
    """[{pass, bytes, flops, bytes_ms, flops_ms, bound_ms}] of one call on ``path`` ("pair" | "long" |
    "mono" | "order3"; n3: the mono kernel's third factor)."""
    pairs = heads * -(-batch // 2)
    size = 2 * n
    spectrum = heads * (n + 1) * 8
    seq = batch * heads * n * elem  # all of u (or of y)
    scratch = pairs * 2 * size * 2  # float16 (re, im) of every pair
    f = pairs * pair_flops(n1, n2) if n1 else 0
    first = pairs * 4 * size * n1  # a pair's first forward stage (and its last inverse one)
    if path == "pair":
        rows = [("one pass", 2 * seq + spectrum, f)]
    elif path == "mono":
        rows = [("one pass", 2 * seq + spectrum, pairs * mono_flops(n1, n2, n3))]
    elif path == "order3":
        rows = [("one pass", 2 * seq + spectrum, pairs * order3_flops(n1, n2))]
    elif path == "long":
        rows = [("1: columns", 2 * seq + scratch, first),
                ("2: rows", 2 * scratch + spectrum, f - 2 * first),
                ("3: inverse columns", scratch + seq, first)]
    else:
        return []
    out = []
    for name, nbytes, flops in rows:
        bytes_ms = nbytes / COPY_GBS / 1e6
        flops_ms = flops / TENSOR_TFLOPS / 1e9
        out.append({"pass": name, "bytes": nbytes, "flops": flops, "bytes_ms": bytes_ms, "flops_ms": flops_ms,
                    "bound_ms": max(bytes_ms, flops_ms)})
    return out


def bound_ms(path: str, batch: int, heads: int, n: int, n1: int = 0, n2: int = 0, n3: int = 1) -> float:
    """The sum over the passes of each one's max(bytes, FLOPs) time: the best this path can do."""
    return sum(p["bound_ms"] for p in passes(path, batch, heads, n, n1, n2, n3=n3))


def table(batch: int = 16, heads: int = 768) -> str:
    """The model at the issue's B16 H768 for the shipped plans and the one-pass kernel's first candidate a N
    (python -m tilecore.ops.fft_conv.model)."""
    from tilecore.ops.fft_conv import configs

    lines = [f"{'N':>6} {'path':>6} {'N1xN2':>8} {'pass':>19} {'MB':>8} {'GFLOP':>7} {'bytes ms':>8} "
             f"{'flops ms':>8} {'bound ms':>8}   op bytes ms"]
    plans = {n: ("pair", c[0], c[1]) for n, c in configs.PAIR_CONFIGS.items()}
    plans.update({n: ("long", c[0], c[1]) for n, c in configs.LONG_CONFIGS.items()})
    rows = [(n, *plans[n], 1) for n in sorted(plans)]
    rows += [(n, "mono", c[0], c[1], c[2]) for n, cands in sorted(configs.MONO_CANDIDATES.items()) for c in cands[:1]]
    rows += [(n, "order3", 2 * n // 64, 64, 1) for n in sorted(configs.GLUON_ORDER3)]
    for n, path, n1, n2, n3 in rows:
        own = op_bytes(batch, heads, n) / COPY_GBS / 1e6
        factors = f"{n1}x{n2}" + (f"x{n3}" if n3 > 1 else "")
        for p in passes(path, batch, heads, n, n1, n2, n3=n3):
            lines.append(f"{n:>6} {path:>6} {factors:>8} {p['pass']:>19} {p['bytes'] / 1e6:>8.1f} "
                         f"{p['flops'] / 1e9:>7.1f} {p['bytes_ms']:>8.4f} {p['flops_ms']:>8.4f} "
                         f"{p['bound_ms']:>8.4f}   {own:.4f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())

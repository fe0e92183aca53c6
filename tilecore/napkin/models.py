"""Built-in diagrams. Each is a few lines of Diagram calls; a new model is written the same way."""
from __future__ import annotations

import math

from .diagram import Diagram
from .errors import ShapeMismatchError, UnknownModelError


def matmul(m=4096, n=4096, k=4096, dtype="bf16") -> Diagram:
    """C[m,n] = A[m,k] B[k,n] (the paper's a x b x c is m x k x n)."""
    d = Diagram("matmul", m=m, k=k, n=n)
    A, B = d.input("A", "m k", dtype), d.input("B", "k n", dtype)
    return d.output(d.contract(A, B, out="m n", name="C", dtype=dtype))


def bmm(batch=16, m=1024, n=1024, k=1024, dtype="bf16") -> Diagram:
    """Batched matmul: matmul woven over a batch axis that both operands have."""
    return matmul(m, n, k, dtype).weave("b", batch, ["A", "B"])


def attention(batch=16, heads=16, seq=4096, d=128, kv_heads=None, kv_seq=None, causal=False,
              dtype="bf16", qk_dtype=None, pv_dtype=None) -> Diagram:
    """softmax(Q K^T) V per head. Grouped-query attention when kv_heads < heads: K and V are
    broadcast over the r = heads / kv_heads query heads that share them."""
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ShapeMismatchError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    qk, pv = qk_dtype or dtype, pv_dtype or dtype
    g = Diagram("attention", q=seq, x=kv_seq or seq, d=d, e=d)
    Q, K, V = g.input("Q", "q d", qk), g.input("K", "x d", qk), g.input("V", "x e", pv)
    S = g.contract(Q, K, out="q x", name="S", dtype="fp32")
    g.output(g.softmax_contract(S, V, over="x", name="O", causal="q" if causal else None, dtype=dtype))
    if kv_heads != heads:
        g = g.weave("r", heads // kv_heads, ["Q"])      # query heads sharing one K, V
    g = g.weave("h", kv_heads, ["Q", "K", "V"])
    g = g.weave("b", batch, ["Q", "K", "V"])
    g.name = ("causal " if causal else "") + ("gqa" if kv_heads != heads else "attention")
    return g


def gated_mlp(tokens=8192, model=4096, hidden=14336, dtype="bf16") -> Diagram:
    """Y = (silu(X W1) * (X W3)) W2, the SwiGLU feed-forward block."""
    g = Diagram("gated_mlp", t=tokens, m=model, f=hidden, o=model)
    X = g.input("X", "t m", dtype)
    W1, W3, W2 = g.input("W1", "m f", dtype), g.input("W3", "m f", dtype), g.input("W2", "f o", dtype)
    h1 = g.contract(X, W1, out="t f", name="H1", dtype="fp32")
    h3 = g.contract(X, W3, out="t f", name="H3", dtype="fp32")
    a = g.map("silu", h1, name="A", unit="sfu", ops=1, dtype="fp32")
    p = g.map("mul", a, h3, name="G", unit="alu", ops=2, dtype=dtype)
    return g.output(g.contract(p, W2, out="t o", name="Y", dtype=dtype))


def layernorm(rows=65536, n=4096, dtype="bf16", rms=False) -> Diagram:
    """y = (x - mean) / sqrt(var + eps) * w + b along n; RMSnorm drops the mean and bias. The
    normalize step uses every element again after the statistics, so n cannot be streamed."""
    g = Diagram("rmsnorm" if rms else "layernorm", t=rows, n=n)
    X, W = g.input("X", "t n", dtype), g.input("W", "n", dtype)
    sq = g.map("square", X, name="X2", ops=1, dtype="fp32")
    ms = g.reduce(sq, "n", kind="mean", name="meansq")
    if rms:
        inv = g.map("rsqrt", ms, name="inv", unit="sfu", dtype="fp32")
        return g.output(g.map("x*inv*w", X, inv, W, name="Y", ops=2, dtype=dtype))
    B = g.input("B", "n", dtype)
    mu = g.reduce(X, "n", kind="mean", name="mean")
    inv = g.map("rsqrt(meansq-mean^2)", ms, mu, name="inv", unit="sfu", dtype="fp32")
    return g.output(g.map("(x-mean)*inv*w+b", X, mu, inv, W, B, name="Y", ops=4, dtype=dtype))


def rmsnorm(rows=65536, n=4096, dtype="bf16") -> Diagram:
    return layernorm(rows, n, dtype, rms=True)


def rotary(batch=16, seq=4096, heads=32, d=128, rotary_dim=None, dtype="bf16") -> Diagram:
    """Rotary embedding of x (batch, seq, heads, d): each of the rotary_dim / 2 pairs of a head turns by
    its token's angle (cos, sin tables of seq x rotary_dim / 2, shared by every head and batch); the
    d - rotary_dim other features are copied. Memory-bound: the bytes of x in and out."""
    rotary_dim = rotary_dim or d
    if rotary_dim % 2 or not 0 < rotary_dim <= d:
        raise ShapeMismatchError(f"rotary: rotary_dim must be even and in [2, d = {d}], got {rotary_dim}")
    g = Diagram("rotary", t=seq, h=heads, p=rotary_dim // 2, j=2)
    X = g.input("X", "t h p j", dtype)  # j: the two features of a pair
    C, S = g.input("cos", "t p", dtype), g.input("sin", "t p", dtype)
    outs = [g.map("x cos -+ x' sin", X, C, S, name="Y", ops=3, dtype=dtype)]
    if rotary_dim < d:
        rest = g.input("Xrest", ("t", "h", g.axis("q", d - rotary_dim)), dtype)
        outs.append(g.map("identity", rest, name="Yrest", ops=0, dtype=dtype))
    g.output(*outs)
    return g.weave("b", batch, ["X"] + (["Xrest"] if rotary_dim < d else []))


def linear_attention(batch=16, heads=16, seq=4096, d=128, dtype="bf16") -> Diagram:
    """Non-causal linear attention O = phi(Q) (phi(K)^T V): the key axis is reduced into a d x d
    state first, so it streams with a plain sum accumulator."""
    g = Diagram("linear_attention", q=seq, x=seq, d=d, e=d)
    Q, K, V = g.input("Q", "q d", dtype), g.input("K", "x d", dtype), g.input("V", "x e", dtype)
    fk = g.map("phi", K, name="phiK", unit="sfu", dtype=dtype)
    kv = g.contract(fk, V, out="d e", name="KV", dtype=dtype)
    fq = g.map("phi", Q, name="phiQ", unit="sfu", dtype=dtype)
    g.output(g.contract(fq, kv, out="q e", name="O", dtype=dtype))
    return g.weave("h", heads, ["Q", "K", "V"]).weave("b", batch, ["Q", "K", "V"])


def hadamard(rows=2**28 // 4096, n=4096, dtype="bf16", radix=16) -> Diagram:
    """y = x H_n along rows of n = 2^p, as a Kronecker product of H16 stages (plus one H2/H4/H8
    stage when p is not a multiple of 4): each stage contracts one 16-wide digit of the index."""
    p = int(round(math.log2(n)))
    if n < 2 or 2 ** p != n:
        raise ShapeMismatchError(f"hadamard: n must be a power of two >= 2, got {n}")
    radices = [16] * (p // 4) + ([2 ** (p % 4)] if p % 4 else [])
    # radix=2: the same stages done as fp32 butterflies on the ALU (Dao's fast-hadamard-transform):
    # log2(r) additions per output element instead of an r-wide dot product on tensor cores
    stage_dtype = "fp32" if radix == 2 else dtype
    g = Diagram("hadamard", r=rows)
    ins = [g.axis(f"i{t}", r) for t, r in enumerate(radices)]
    outs = [g.axis(f"j{t}", r) for t, r in enumerate(radices)]
    cur = g.input("X", ("r", *ins), dtype)
    axes = ["r", *ins]
    for t in range(len(radices)):
        Ht = g.constant(f"H{radices[t]}_{t}", (outs[t], ins[t]), stage_dtype)
        axes[1 + t] = outs[t]
        last = t == len(radices) - 1
        cur = g.contract(cur, Ht, out=tuple(axes), name="Y" if last else f"X{t + 1}",
                         dtype=dtype if last else stage_dtype,
                         ops_per_point=math.log2(radices[t]) / radices[t] if radix == 2 else 2.0)
    return g.output(cur)


def copy(n=2**29, dtype="bf16") -> Diagram:
    """Read and write every element once: the bandwidth ceiling."""
    g = Diagram("copy", i=n)
    return g.output(g.map("identity", g.input("X", "i", dtype), name="Y", ops=0, dtype=dtype))


# name -> (constructor, size keywords it accepts, one-line description)
MODELS = {
    "matmul": (matmul, ("m", "n", "k"), "C = A B"),
    "bmm": (bmm, ("batch", "m", "n", "k"), "batched matmul"),
    "attention": (attention, ("batch", "heads", "seq", "d", "kv_heads", "kv_seq", "causal"),
                  "multi-head attention (FlashAttention); kv_heads < heads: grouped-query"),
    "gqa": (lambda **kw: attention(**{"kv_heads": 2, **kw}),
            ("batch", "heads", "seq", "d", "kv_heads", "kv_seq", "causal"), "grouped-query attention"),
    "gated_mlp": (gated_mlp, ("tokens", "model", "hidden"), "SwiGLU feed-forward"),
    "layernorm": (layernorm, ("rows", "n"), "layer normalization"),
    "rmsnorm": (rmsnorm, ("rows", "n"), "RMS normalization"),
    "rotary": (rotary, ("batch", "seq", "heads", "d", "rotary_dim"), "rotary position embedding (pairs turned by angle)"),
    "linear_attention": (linear_attention, ("batch", "heads", "seq", "d"), "non-causal linear attention"),
    "hadamard": (hadamard, ("rows", "n", "radix"), "Hadamard transform along rows (H16 Kronecker stages; radix=2: fp32 butterflies)"),
    "copy": (copy, ("n",), "read and write once (bandwidth ceiling)"),
}


def build(name: str, dtype: str = "bf16", **sizes) -> Diagram:
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; accepted: {', '.join(MODELS)}")
    fn, accepted, _ = MODELS[name]
    bad = [k for k in sizes if k not in accepted]
    if bad:
        raise UnknownModelError(f"model {name!r} has no size {bad[0]!r}; accepted: {', '.join(accepted)}")
    return fn(dtype=dtype, **sizes)

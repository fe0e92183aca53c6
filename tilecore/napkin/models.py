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


def backward_recompute(g: Diagram, dtype: str):
    """The attention backward's inputs on ``g`` (axes q, x, d, e) and its recomputed P and dS:
    S = Q K^T, P = exp(S - L), dP = dO V^T, dS = P (dP - D). Returns (Q, K, dO, P, dS)."""
    Q, K, V = g.input("Q", "q d", dtype), g.input("K", "x d", dtype), g.input("V", "x e", dtype)
    dO, L, Dl = g.input("dO", "q e", dtype), g.input("L", "q", "fp32"), g.input("D", "q", "fp32")
    S = g.contract(Q, K, out="q x", name="S", dtype="fp32")
    P = g.map("exp(S - L)", S, L, name="P", unit="sfu", ops=1, dtype=dtype)
    dP = g.contract(dO, V, out="q x", name="dP", dtype="fp32")
    dS = g.map("P (dP - D)", P, dP, Dl, name="dS", unit="alu", ops=2, dtype=dtype)
    return Q, K, dO, P, dS


def attention_backward(batch=16, heads=16, seq=4096, d=128, kv_heads=None, causal=False,
                       dtype="bf16") -> Diagram:
    """The FlashAttention backward: from Q, K, V, dO and the forward's row log-sum-exp L and
    D = rowsum(dO * O), recompute S = Q K^T and P = exp(S - L), then dP = dO V^T, dS = P (dP - D),
    dV = P^T dO, dK = dS^T Q, dQ = dS K: five contractions (2.5x the forward's FLOPs). dK and dV reduce
    over the queries, dQ over the keys, so one of the two is summed across thread blocks in HBM."""
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ShapeMismatchError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    g = Diagram("attention_backward", q=seq, x=seq, d=d, e=d)
    Q, K, dO, P, dS = backward_recompute(g, dtype)
    dV = g.contract(P, dO, out="x e", name="dV", dtype=dtype)
    dK = g.contract(dS, Q, out="x d", name="dK", dtype=dtype)
    dQ = g.contract(dS, K, out="q d", name="dQ", dtype=dtype)
    g.output(dQ, dK, dV)
    if causal:  # every op over both the query and the key axis skips the masked chunks
        import dataclasses
        g.ops = [dataclasses.replace(op, causal=("q", "x")) if {"q", "x"} <= set(op.axes) else op
                 for op in g.ops]
    if kv_heads != heads:
        g = _reweave_causal(g, causal, "r", heads // kv_heads, ["Q", "dO", "L", "D"])
    g = _reweave_causal(g, causal, "h", kv_heads, ["Q", "K", "V", "dO", "L", "D"])
    g = _reweave_causal(g, causal, "b", batch, ["Q", "K", "V", "dO", "L", "D"])
    g.name = ("causal " if causal else "") + "attention backward"
    return g


def _reweave_causal(g: Diagram, causal: bool, axis: str, size: int, inputs) -> Diagram:
    """weave() replays the recipe, which does not carry a mask set after the fact: set it again."""
    out = g.weave(axis, size, inputs)
    if causal:
        import dataclasses
        out.ops = [dataclasses.replace(op, causal=("q", "x")) if {"q", "x"} <= set(op.axes) else op
                   for op in out.ops]
    return out


def decode(batch=1, heads=32, kv_heads=8, kv_seq=4096, d=128, dtype="bf16") -> Diagram:
    """One decoding step: one query a head against kv_seq cached keys (attention with seq = 1)."""
    return attention(batch=batch, heads=heads, kv_heads=kv_heads, seq=1, kv_seq=kv_seq, d=d, dtype=dtype)


# name -> (constructor, size keywords it accepts, one-line description)
MODELS = {
    "matmul": (matmul, ("m", "n", "k"), "C = A B"),
    "bmm": (bmm, ("batch", "m", "n", "k"), "batched matmul"),
    "attention": (attention, ("batch", "heads", "seq", "d", "kv_heads", "kv_seq", "causal"),
                  "multi-head attention (FlashAttention); kv_heads < heads: grouped-query"),
    "gqa": (lambda **kw: attention(**{"kv_heads": 2, **kw}),
            ("batch", "heads", "seq", "d", "kv_heads", "kv_seq", "causal"), "grouped-query attention"),
    "attention_backward": (attention_backward, ("batch", "heads", "seq", "d", "kv_heads", "causal"),
                           "the FlashAttention backward (dQ, dK, dV from Q, K, V, dO, L, D)"),
    "decode": (decode, ("batch", "heads", "kv_heads", "kv_seq", "d"), "one decoding step against a KV cache"),
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


# ------------------------------------------------------------------ chunked forms (issue 36, the planner)
def linear_attention_chunked(batch=16, heads=16, seq=4096, d=128, chunk=64, dtype="bf16") -> Diagram:
    """Causal linear attention in chunks of L = `chunk` tokens (c = seq / L chunks): inside a chunk,
    the masked L x L product (Q K^T * mask) V; across chunks, each chunk's d x e state K^T V, prefix-
    summed over the chunks before it and applied as Q state. O(N L d + N d e) work instead of O(N^2 d).
    The prefix over chunks is written as a map (one add an element): the diagram language has no scan,
    so the engine may tile c where a kernel needs a second pass (the state kernel of chunked kernels)."""
    if seq % chunk:
        raise ShapeMismatchError(f"linear_attention_chunked: chunk ({chunk}) must divide seq ({seq})")
    g = Diagram("linear_attention_chunked", c=seq // chunk, l=chunk, s=chunk, d=d, e=d)
    Q, K, V = g.input("Q", "c l d", dtype), g.input("K", "c s d", dtype), g.input("V", "c s e", dtype)
    S = g.contract(Q, K, out="c l s", name="S", dtype="fp32")
    Sm = g.map("causal mask l >= s", S, name="Sm", ops=1, dtype=dtype)
    intra = g.contract(Sm, V, out="c l e", name="Ointra", dtype="fp32")
    H = g.contract(K, V, out="c d e", name="H", dtype="fp32")
    Hp = g.map("exclusive prefix sum over c", H, name="Hprefix", ops=1, dtype=dtype)
    inter = g.contract(Q, Hp, out="c l e", name="Ointer", dtype="fp32")
    g.output(g.map("add", intra, inter, name="O", ops=1, dtype=dtype))
    return g.weave("h", heads, ["Q", "K", "V"]).weave("b", batch, ["Q", "K", "V"])


def linear_attention_causal_quadratic(batch=16, heads=16, seq=4096, d=128, dtype="bf16") -> Diagram:
    """Causal linear attention as written: (Q K^T * mask) V over the whole sequence (the baseline the
    chunked form beats for long sequences)."""
    g = Diagram("linear_attention_quadratic", q=seq, x=seq, d=d, e=d)
    Q, K, V = g.input("Q", "q d", dtype), g.input("K", "x d", dtype), g.input("V", "x e", dtype)
    S = g.contract(Q, K, out="q x", name="S", dtype="fp32")
    Sm = g.map("causal mask q >= x", S, name="Sm", ops=1, dtype=dtype)
    g.output(g.contract(Sm, V, out="q e", name="O", dtype=dtype))
    return g.weave("h", heads, ["Q", "K", "V"]).weave("b", batch, ["Q", "K", "V"])


def mamba2_ssd(batch=16, heads=32, seq=4096, headdim=64, state=128, chunk=64, groups=None, gate=False,
               skip=False, dtype="bf16") -> Diagram:
    """Mamba-2's SSD scan in chunks of L tokens (Dao & Gu 2024, the chunked algorithm): per chunk,
    the diagonal block Y_diag = (C B^T * decay mask) X; each chunk's state B^T (decay * X) (n x p);
    states passed across chunks with their decays (a prefix, written as a map as in the chunked
    linear attention); the off-diagonal output C state * exp(cumulative decay). Inputs X (tokens x
    head dim p), B and C (tokens x state n), a (the per-token cumulative log decay, one a head; given
    twice, indexed by the query and the key position of a chunk).

    ``groups``: B and C shared by heads // groups heads each (mamba_ssm's ngroups; None: a B and a C a
    head, the form without groups); the heads of a group are woven as axes of at most 64 each (hg, hh)
    that B and C lack. ``gate``: the output times silu(z), z (tokens x p) a head (one SFU op an element:
    the tanh.approx form of the sigmoid). ``skip``: + D x (D a scalar a head, no bytes; x already read),
    one ALU op an element. With groups=1, gate and skip: mamba_chunk_scan_combined's traffic (x, z, y a head,
    B and C once a batch row, the decays)."""
    if seq % chunk:
        raise ShapeMismatchError(f"mamba2_ssd: chunk ({chunk}) must divide seq ({seq})")
    if groups is not None and (groups < 1 or heads % groups):
        raise ShapeMismatchError(f"mamba2_ssd: groups ({groups}) must divide heads ({heads})")
    g = Diagram("mamba2_ssd", c=seq // chunk, l=chunk, s=chunk, n=state, p=headdim)
    X, B, C = g.input("X", "c s p", dtype), g.input("B", "c s n", dtype), g.input("C", "c l n", dtype)
    aq, ak = g.input("Aq", "c l", "fp32"), g.input("Ak", "c s", "fp32")
    Z = g.input("Z", "c l p", dtype) if gate else None
    G = g.contract(C, B, out="c l s", name="G", dtype="fp32")
    L = g.map("exp(segsum(a)) causal", aq, ak, name="Lmask", unit="sfu", ops=1, dtype="fp32")
    M = g.map("mul", G, L, name="M", ops=1, dtype=dtype)
    Yd = g.contract(M, X, out="c l p", name="Ydiag", dtype="fp32")
    dec = g.map("exp(a_last - a)", ak, name="decay", unit="sfu", ops=1, dtype="fp32")
    Bd = g.map("mul", B, dec, name="Bd", ops=1, dtype=dtype)
    H = g.contract(Bd, X, out="c n p", name="H", dtype="fp32")
    Hp = g.map("decayed exclusive prefix over c", H, name="Hprefix", ops=2, dtype=dtype)
    Yo = g.contract(C, Hp, out="c l p", name="Yoff", dtype="fp32")
    if not (gate or skip):
        g.output(g.map("ydiag + exp(a) * yoff", Yd, Yo, aq, name="Y", unit="sfu", ops=2, dtype=dtype))
    else:
        Y = g.map("ydiag + exp(a) * yoff", Yd, Yo, aq, name="Ylin", unit="sfu", ops=2,
                  dtype="fp32" if (gate or skip) else dtype)
        if skip:  # D a scalar a head, x the input already read: one FMA an element
            Y = g.map("y + D x", Y, name="Yskip", unit="alu", ops=1, dtype="fp32" if gate else dtype)
        if gate:
            Y = g.map("y * silu(z)", Y, Z, name="Y", unit="sfu", ops=1, dtype=dtype)
        g.output(Y)
    per_head = ["X", "Aq", "Ak"] + (["Z"] if gate else [])
    shared = ["B", "C"]
    if groups is None:
        g = g.weave("h", heads, per_head + shared)
    else:  # heads = groups x hg x hh: B and C vary with the group only (axes of <= 64: the search's tiles)
        per_group = heads // groups
        hg = math.gcd(per_group, 64)
        g = g.weave("hg", hg, per_head)
        if per_group // hg > 1:
            g = g.weave("hh", per_group // hg, per_head)
        if groups > 1:
            g = g.weave("g", groups, per_head + shared)
    return g.weave("b", batch, per_head + shared)


MODELS.update({
    "linear_attention_chunked": (linear_attention_chunked, ("batch", "heads", "seq", "d", "chunk"),
                                 "causal linear attention, chunked (intra-chunk masked product + state prefix)"),
    "mamba2_ssd": (mamba2_ssd, ("batch", "heads", "seq", "headdim", "state", "chunk", "groups", "gate", "skip"),
                   "Mamba-2 SSD scan, chunked (groups: B/C shared by a group's heads; gate: times silu(z); skip: + D x)"),
})

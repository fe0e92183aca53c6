"""Linear attention's portable kernels in Triton ``tl`` (any GPU, and the CPU through the interpreter):
the chunked forward, the backward's dQ (a forward sweep) and dK/dV (a reverse sweep), and the decode
step. reference.py states the math; chunked.py is the same chunked form in PyTorch.

Layout (B, N, H, D), any strides: q, k (B, N, Hqk, Dk) with head h reading q/k head h // GROUP; v, o
(B, N, H, Dv); log decay g (B, N, H) ("scalar", DECAY = 1) or (B, N, H, Dk) ("channel", DECAY = 2);
beta (B, N, H) float32, a factor on each token's contribution beta_t phi(k_t) v_t^T (Mamba-2's dt);
states (B, H, F, Dv) float32, any strides (Mamba-2's (b, h, p, s) states go in as a transposed view).
Batch, head and token offsets are 64-bit.

The chunked form. A program owns one head and a block of BV value columns, and walks the sequence a
chunk of BT tokens at a time with the head's state S (F, BV) in registers (float32):

    o_chunk = scale * [ mask(Q K^T * decay(i, j) * beta_j) V  +  exp(G_i) * (Q S) ]        (intra, inter)
    S      <- exp(G_last) * S  +  (K * exp(G_last - G_j) * beta_j)^T V

where G is the chunk's inclusive cumulative log decay, counted from the chunk's start, and
decay(i, j) = exp(G_i - G_j) for j <= i. Both products are tensor-core dots (tl.dot).

Keeping the cumulative decay stable. G is never summed past a chunk, only within one (<= BT terms),
and every factor used is exp of a difference that is <= 0 for log decays <= 0: G_i - G_j (j <= i), G_i,
and G_last - G_j; none is split into exp(G_i) * exp(-G_j), which overflows. Above the diagonal the
exponent is replaced by -inf before exp (exp(G_i - G_j) there could be inf, and inf * 0 is NaN), and
the product is masked again after (a NaN or inf in a later key of the chunk must not reach earlier
rows). Each log decay is clamped at LOG_DECAY_FLOOR = -100 (exp(-100) = 4e-44, below every float32
normal number, so a factor that small is already nothing next to the others): -inf (a reset) and
-1e30 then give no NaN (-inf - -inf) and G stays >= -100 BT, so its rounding (|G| * 2^-24) stays
below 4e-4 absolute even in a chunk made of such resets. NaN decays propagate (the clamp keeps NaN).

Per-channel decay (GLA): decay(i, j) depends on the key channel d, so the intra-chunk scores are
sum_d q_id k_jd exp(G_id - G_jd), taken elementwise over [BT, BT, KB] slices of the channels (KB of
them at a time) rather than as a dot; the inter-chunk products are dots on q * exp(G) and
k * exp(G_last - G) as above.

Based (FEATURE = 1): q, k of Dk <= 16 (padded to 16). The intra-chunk scores are the polynomial
1 + s + s^2 / 2 of s = scale q.k (one 16-deep dot), never the expanded features; the state lives in
feature space, as three pieces S0 (1, BV), S1 (16, BV), S2 (256, BV) (the 1, x, vec(x x^T) / sqrt(2)
features), and the inter-chunk products expand q and k to their 256 quadratic features in registers
([BT, 16, 16] -> [BT, 256]), so they are never written to memory. The state's rows in memory are
[1, Dk, Dk * Dk] (F = 1 + Dk + Dk^2).
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from tilecore.tiles.ops import block_ptrs

LOG_DECAY_FLOOR = tl.constexpr(-100.0)
SQRT_HALF = tl.constexpr(math.sqrt(0.5))
# per-channel decay: tokens of a sub-chunk (the diagonal blocks of the intra-chunk scores, elementwise)
SUB = tl.constexpr(16)


# --------------------------------------------------------------------------------------------
# tile steps


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b in float32; IEEE: full float32 products (float32 inputs), else the operands' own (tf32 is
    never used: it would round float32 operands to 10 bits)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _rows(base, t0, offs_t, cols, col_ok, N, s_n, s_d):
    """Tokens t0 + offs_t (zeros past N) and columns ``cols`` (zeros where not col_ok) of one head."""
    ok = ((t0 + offs_t) < N)[:, None] & col_ok[None, :]
    return tl.load(block_ptrs(base, t0, offs_t, cols, s_n, s_d), mask=ok, other=0.0)


@triton.jit
def _store_rows(base, t0, offs_t, cols, col_ok, N, s_n, s_d, x):
    ok = ((t0 + offs_t) < N)[:, None] & col_ok[None, :]
    tl.store(block_ptrs(base, t0, offs_t, cols, s_n, s_d), x.to(base.dtype.element_ty), mask=ok)


@triton.jit
def _token_values(base, t0, offs_t, N, s_n):
    """One float32 a token (zeros past N): [BT]."""
    rows = t0 + offs_t
    return tl.load(base + rows.to(tl.int64) * s_n, mask=rows < N, other=0.0).to(tl.float32)


@triton.jit
def _cumulative(g):
    """(G, G_last) of a chunk's log decays g [BT] (zeros past N): clamped at the floor (NaN kept), G the
    inclusive cumulative sum from the chunk's start, G_last its last element, read exactly."""
    g = tl.where(g < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g)
    G = tl.cumsum(g, 0)
    last = tl.arange(0, g.shape[0]) == g.shape[0] - 1
    return G, tl.sum(tl.where(last, G, 0.0), 0)


@triton.jit
def _cumulative_channels(g):
    """_cumulative for per-channel log decays g [BT, C]: G [BT, C], G_last [C]."""
    g = tl.where(g < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g)
    G = tl.cumsum(g, 0)
    last = tl.arange(0, g.shape[0]) == g.shape[0] - 1
    return G, tl.sum(tl.where(last[:, None], G, 0.0), 0)


@triton.jit
def _pair_decay(G, causal):
    """exp(G_i - G_j) for j <= i, 0 above the diagonal (whose exponent is never evaluated): [BT, BT]."""
    return tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))


@triton.jit
def _row(x, offs_t, r):
    """Row r of x [BT, C] (exactly): [C]."""
    return tl.sum(tl.where((offs_t == r)[:, None], x, 0.0), 0)


@triton.jit
def _sub_rows(base, t0, cols, col_ok, N, s_n, s_d, NC: tl.constexpr):
    """A chunk's tokens as [NC, SUB, C] (sub-chunk, token within it, column), zeros past N and where not
    col_ok."""
    rows = t0 + tl.arange(0, NC)[:, None, None] * SUB + tl.arange(0, SUB)[None, :, None]
    ptrs = base + rows.to(tl.int64) * s_n + cols.to(tl.int64)[None, None, :] * s_d
    return tl.load(ptrs, mask=(rows < N) & col_ok[None, None, :], other=0.0)


@triton.jit
def _sub_cumulative(g):
    """Per-channel log decays g [NC, SUB, C] clamped at the floor and summed within each sub-chunk (the
    differences G_i - G_j of one sub-chunk do not depend on where the sum starts)."""
    return tl.cumsum(tl.where(g < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g), 1)


@triton.jit
def _diagonal_decay(G, tri4):
    """exp(G_id - G_jd) on a sub-chunk's pairs j <= i, 0 elsewhere (never evaluated there): G [NC, SUB, C]
    -> [NC, SUB, SUB, C]."""
    return tl.exp(tl.where(tri4, G[:, :, None, :] - G[:, None, :, :], float("-inf")))


@triton.jit
def _block_diagonal(d, NC: tl.constexpr):
    """[NC, SUB, SUB] sub-chunk blocks placed on the diagonal of a [NC SUB, NC SUB] matrix (0 elsewhere)."""
    c = tl.arange(0, NC)
    same = (c[:, None] == c[None, :])[:, None, :, None]
    return tl.reshape(tl.where(same, d[:, :, None, :], 0.0), [NC * SUB, NC * SUB])


@triton.jit
def _diagonal_of(x, NC: tl.constexpr):
    """The [NC, SUB, SUB] sub-chunk blocks on the diagonal of x [NC SUB, NC SUB]."""
    c = tl.arange(0, NC)
    same = (c[:, None] == c[None, :])[:, None, :, None]
    return tl.sum(tl.where(same, tl.reshape(x, [NC, SUB, NC, SUB]), 0.0), 2)


@triton.jit
def _sub_factors(G, offs_t, j: tl.constexpr):
    """The factors of key sub-chunk j's reference r = its last token, per channel: (exp(G_i - G_r) on the
    rows of later sub-chunks, exp(G_r - G_j) on sub-chunk j's rows), 0 on other rows; both exponents are
    <= 0 for log decays <= 0, and the rows outside are -inf before exp. G [BT, C] -> two [BT, C]."""
    sub = (offs_t // SUB)[:, None]
    Gr = _row(G, offs_t, (j + 1) * SUB - 1)[None, :]
    later = sub > j
    here = sub == j
    return (tl.exp(tl.where(later, G - Gr, float("-inf"))), tl.exp(tl.where(here, Gr - G, float("-inf"))))


@triton.jit
def _channel_scores(a, b, G, a_base, b_base, g_base, t0, N, DK, s_an, s_ad, s_bn, s_bd, s_gn, s_gd,
                    BK: tl.constexpr, KD: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr, gl_base=None, s_ln=0,
                    DIAG: tl.constexpr = 0):
    """sum_d a_id b_jd exp(G_id - G_jd) for j <= i, 0 above: per-channel decay's intra-chunk scores
    [BT, BT] float32 of a, b [BT, BK] (q and k, as loaded) with G [BT, BK] their chunk's cumulative log
    decay, on tensor cores by sub-chunks of SUB tokens.

    For a query sub-chunk after key sub-chunk j, with r the last token of j (per channel):
    exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j), both exponents <= 0 (G is non-increasing), so
    neither factor overflows, and one that underflows is one whose true product is below float32's
    range too: score = (a_i exp(G_i - G_r)) . (b_j exp(G_r - G_j)), one dot per key sub-chunk. The
    diagonal sub-chunks (i, j in one sub-chunk) are elementwise over [NC, SUB, SUB, KD] slices of the
    channels, loaded again as [NC, SUB, KD] (a register tensor's channels cannot be sliced; they come from
    L1 or L2, the chunk's q and k having just been loaded)."""
    BT: tl.constexpr = a.shape[0]
    NC: tl.constexpr = BT // SUB
    offs_t = tl.arange(0, BT)
    af = a.to(tl.float32)
    bf = b.to(tl.float32)
    s = tl.zeros([BT, BT], dtype=tl.float32)
    for j in tl.static_range(NC - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        s += _dot((af * fq).to(MMA), tl.trans((bf * fk).to(MMA)), IEEE)
    if DIAG == 2:  # gathered (the default: launch.py passes GL, the sub-chunk-local cumulative log decay)
        offs_k = tl.arange(0, BK)
        k_ok = offs_k < DK
        gl = _rows(gl_base, t0, offs_t, offs_k, k_ok, N, s_ln, 1)
        s += _diagonal_scores(af, gl, b_base, gl_base, t0, offs_k, k_ok, N, s_bn, s_bd, s_ln)
        causal = offs_t[:, None] >= offs_t[None, :]
        return tl.where(causal, s, 0.0)
    ii = tl.arange(0, SUB)
    tri4 = (ii[:, None] >= ii[None, :])[None, :, :, None]
    d = tl.zeros([NC, SUB, SUB], dtype=tl.float32)
    # a loop, not unrolled nor pipelined: unrolled, its loads were staged in shared memory (248 KiB at 128
    # channels in slices of 4, sm_90a)
    for c0 in tl.range(0, BK, KD, num_stages=1):
        cols = c0 + tl.arange(0, KD)
        ok = cols < DK
        a3 = _sub_rows(a_base, t0, cols, ok, N, s_an, s_ad, NC).to(tl.float32)
        b3 = _sub_rows(b_base, t0, cols, ok, N, s_bn, s_bd, NC).to(tl.float32)
        G3 = _sub_cumulative(_sub_rows(g_base, t0, cols, ok, N, s_gn, s_gd, NC).to(tl.float32))
        d += tl.sum(tl.where(tri4, a3[:, :, None, :] * b3[:, None, :, :] * _diagonal_decay(G3, tri4), 0.0), 3)
    s += _block_diagonal(d, NC)
    causal = offs_t[:, None] >= offs_t[None, :]
    return tl.where(causal, s, 0.0)  # a NaN or inf in a later key stays out of earlier rows


@triton.jit
def _channel_scores_in_registers(qf, kf, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """_channel_scores (DIAG 0's math) on tiles already in registers, for _channel_chunk's wide spans: the
    off-diagonal sub-chunks as dots through each key sub-chunk's last token, the diagonal 16 x 16 blocks a
    loop over the key token within them on [NC, SUB, C] views (no reloads, no [NC, SUB, SUB, C] tensor:
    lighter in registers than DIAG 0's slices, which made the factored kernel spill). qf, kf float32 [BT, C],
    G [BT, C]; masked [BT, BT] float32."""
    BT: tl.constexpr = qf.shape[0]
    C: tl.constexpr = qf.shape[1]
    NC: tl.constexpr = BT // SUB
    offs_t = tl.arange(0, BT)
    s = tl.zeros([BT, BT], dtype=tl.float32)
    for j in tl.static_range(NC - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        s += _dot((qf * fq).to(MMA), tl.trans((kf * fk).to(MMA)), IEEE)
    ii = tl.arange(0, SUB)
    q3 = tl.reshape(qf, [NC, SUB, C])
    k3 = tl.reshape(kf, [NC, SUB, C])
    G3 = tl.reshape(G, [NC, SUB, C])
    d = tl.zeros([NC, SUB, SUB], dtype=tl.float32)
    for jj in range(SUB):
        sel = ii == jj
        e = tl.exp(tl.where((ii >= jj)[None, :, None], G3 - _pick(G3, sel)[:, None, :], float("-inf")))
        col = tl.sum(q3 * _pick(k3, sel)[:, None, :] * e, 2)  # [NC, SUB(i)]: scores against key jj
        d += tl.where(sel[None, None, :], col[:, :, None], 0.0)
    s += _block_diagonal(d, NC)
    causal = offs_t[:, None] >= offs_t[None, :]
    return tl.where(causal, s, 0.0)


@triton.jit
def _factor_span(MMA: tl.constexpr):
    """The widest span (max - min over a chunk, per channel) of the cumulative log decay that
    _channel_chunk factors about the span's middle: each factor then within e^(+-span / 2), in range of the
    dot's operand dtype (fp16: e^4 keeps |q| e^4 far below 65504 and |q| e^-4 above its subnormals for
    |q| >= 1e-3; bf16 and float32: e^32, with float32's exponent range)."""
    if MMA == tl.float16:
        return 8.0
    else:
        return 64.0


@triton.jit
def _channel_chunk(q, k, G, G_last, q_base, k_base, g_base, t0, N, DK, s_qn, s_qd, s_kn, s_kd, s_gn, s_gd,
                   BK: tl.constexpr, KD: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr,
                   SPLIT: tl.constexpr = False):
    """Per-channel decay's chunk factors with ONE reference a chunk (plan diag 3; 4: SPLIT): (P, Qg, Kg) of q, k
    [BT, BK] (as loaded), G [BT, BK] their chunk's cumulative log decay and G_last [BK]:

        P  [BT, BT] = mask(sum_d q_id k_jd exp(G_id - G_jd))     (not scaled)
        Qg [BT, BK] = q exp(G)                 (the inter-chunk product's rows, Qg S)
        Kg [BT, BK] = k exp(G_last - G)        (the state update's keys, Kg^T V)

    With m = (max_t G + min_t G) / 2 per channel, exp(G_i - G_j) = exp(G_i - m) exp(m - G_j): where the
    chunk's span (max - min, every channel) is <= _factor_span(MMA), both factors lie within
    e^(+-span / 2), so P is one tensor-core dot of (q exp(G - m)) against (k exp(m - G)), and Qg, Kg are the
    same two tiles times a per-channel factor (no more exps). Entries above the diagonal may overflow
    (e^span) and are masked after the dot. A wider span (strong decays, a reset: each log decay is floored
    at -100, a span of >= 100) or a NaN takes the sub-chunk form (_channel_scores_in_registers: factors
    <= 1, the diagonal 16 x 16 blocks elementwise), so no factor leaves the operand's range. The branch is uniform
    (one span a chunk).

    Rounding: the factored operands are rounded to MMA (fp16 interpreter: 2.0x the floor against the
    sub-chunk form's 1.7x, where the diagonal blocks are float32). SPLIT: each operand as hi + lo (both
    MMA) and three dots (hi hi + hi lo + lo hi), so P carries only its own rounding."""
    BT: tl.constexpr = q.shape[0]
    qf = q.to(tl.float32)
    kf = k.to(tl.float32)
    hi = tl.max(G, 0)
    lo = tl.min(G, 0)
    span = tl.max(hi - lo, 0)
    offs_t = tl.arange(0, BT)
    causal = offs_t[:, None] >= offs_t[None, :]
    if span <= _factor_span(MMA):
        mid = 0.5 * (hi + lo)
        qs = qf * tl.exp(G - mid[None, :])
        ks = kf * tl.exp(mid[None, :] - G)
        qh = qs.to(MMA)
        kh = ks.to(MMA)
        s = _dot(qh, tl.trans(kh), IEEE)
        if SPLIT:
            s += _dot(qh, tl.trans((ks - kh.to(tl.float32)).to(MMA)), IEEE)
            s += _dot((qs - qh.to(tl.float32)).to(MMA), tl.trans(kh), IEEE)
        p = tl.where(causal, s, 0.0)
        qg = qs * tl.exp(mid)[None, :]
        kg = ks * tl.exp(G_last - mid)[None, :]
    else:
        p = _channel_scores_in_registers(qf, kf, G, MMA, IEEE)
        qg = qf * tl.exp(G)
        kg = kf * tl.exp(G_last[None, :] - G)
    return p, qg, kg


@triton.jit
def _split_dot(a, b, MMA: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    """a @ b of float32 tiles on MMA operands; SPLIT: each as hi + lo (hi hi + hi lo + lo hi: three dots)."""
    ah = a.to(MMA)
    bh = b.to(MMA)
    out = _dot(ah, bh, IEEE)
    if SPLIT:
        out += _dot(ah, (b - bh.to(tl.float32)).to(MMA), IEEE)
        out += _dot((a - ah.to(tl.float32)).to(MMA), bh, IEEE)
    return out


@triton.jit
def _channel_dq_factored(a, kq, G, MMA: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    """_channel_dq (sum_j a_ij k_jd exp(G_id - G_jd), a masked [BT, BT]) with one reference a chunk as in
    _channel_chunk: exp(G - m) * (a @ (k exp(m - G))) where this block's span of G is <= _factor_span, else
    _channel_dq_loop (the sub-chunk form in registers). [BT, C] float32."""
    kf = kq.to(tl.float32)
    hi = tl.max(G, 0)
    lo = tl.min(G, 0)
    span = tl.max(hi - lo, 0)
    if span <= _factor_span(MMA):
        mid = 0.5 * (hi + lo)
        dq = tl.exp(G - mid[None, :]) * _split_dot(a, kf * tl.exp(mid[None, :] - G), MMA, IEEE, SPLIT)
    else:
        dq = _channel_dq_loop(a, kq, G, MMA, IEEE)
    return dq


@triton.jit
def _channel_dk_factored(a, qb, G, MMA: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    """_channel_dk (sum_i a_ij q_id exp(G_id - G_jd)) with one reference a chunk: exp(m - G) * (a^T @ (q exp(G -
    m))) where the span allows, else _channel_dk_loop. [BT, C] float32."""
    qf = qb.to(tl.float32)
    hi = tl.max(G, 0)
    lo = tl.min(G, 0)
    span = tl.max(hi - lo, 0)
    if span <= _factor_span(MMA):
        mid = 0.5 * (hi + lo)
        dk = tl.exp(mid[None, :] - G) * _split_dot(tl.trans(a), qf * tl.exp(G - mid[None, :]), MMA, IEEE, SPLIT)
    else:
        dk = _channel_dk_loop(a, qb, G, MMA, IEEE)
    return dk


@triton.jit
def _channel_dq(a, kq, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """sum_j a_ij k_jd exp(G_id - G_jd) (the backward's intra-chunk dq, per-channel decay) of a [BT, BT]
    (masked: 0 above the diagonal), k and G [BT, C]: dots through each key sub-chunk's reference as in
    _channel_scores, the diagonal sub-chunks elementwise over [NC, SUB, SUB, C]. [BT, C] float32."""
    BT: tl.constexpr = a.shape[0]
    C: tl.constexpr = kq.shape[1]
    NC: tl.constexpr = BT // SUB
    offs_t = tl.arange(0, BT)
    kf = kq.to(tl.float32)
    dq = tl.zeros([BT, C], dtype=tl.float32)
    for j in tl.static_range(NC - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        dq += fq * _dot(a.to(MMA), (kf * fk).to(MMA), IEEE)
    ii = tl.arange(0, SUB)
    tri4 = (ii[:, None] >= ii[None, :])[None, :, :, None]
    G3 = tl.reshape(G, [NC, SUB, C])
    e = _diagonal_decay(G3, tri4) * tl.reshape(kf, [NC, SUB, C])[:, None, :, :]  # [NC, SUB(i), SUB(j), C]
    dq += tl.reshape(tl.sum(_diagonal_of(a, NC)[:, :, :, None] * e, 2), [BT, C])
    return dq


@triton.jit
def _channel_dk(a, qb, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """sum_i a_ij q_id exp(G_id - G_jd) (the backward's intra-chunk dk, per-channel decay) of a [BT, BT]
    (masked: 0 above the diagonal), q and G [BT, C]; as _channel_dq, transposed. [BT, C] float32."""
    BT: tl.constexpr = a.shape[0]
    C: tl.constexpr = qb.shape[1]
    NC: tl.constexpr = BT // SUB
    offs_t = tl.arange(0, BT)
    qf = qb.to(tl.float32)
    dk = tl.zeros([BT, C], dtype=tl.float32)
    for j in tl.static_range(NC - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        dk += fk * _dot(tl.trans(a.to(MMA)), (qf * fq).to(MMA), IEEE)
    ii = tl.arange(0, SUB)
    tri4 = (ii[:, None] >= ii[None, :])[None, :, :, None]
    G3 = tl.reshape(G, [NC, SUB, C])
    e = _diagonal_decay(G3, tri4) * tl.reshape(qf, [NC, SUB, C])[:, :, None, :]  # [NC, SUB(i), SUB(j), C]
    dk += tl.reshape(tl.sum(_diagonal_of(a, NC)[:, :, :, None] * e, 1), [BT, C])
    return dk


@triton.jit
def _pick(x3, sel):
    """x3 [NC, SUB, C] at one token of each sub-chunk (sel [SUB], one True): [NC, C]."""
    return tl.sum(tl.where(sel[None, :, None], x3, 0.0), 1)


@triton.jit
def _channel_dq_loop(a, kq, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """_channel_dq with the diagonal sub-chunks a loop over the key token within them ([NC, SUB, C] at a
    time, not [NC, SUB, SUB, C]: a quarter of the registers at SUB = 16, C = 64)."""
    BT: tl.constexpr = a.shape[0]
    C: tl.constexpr = kq.shape[1]
    NC: tl.constexpr = BT // SUB
    offs_t = tl.arange(0, BT)
    kf = kq.to(tl.float32)
    dq = tl.zeros([BT, C], dtype=tl.float32)
    for j in tl.static_range(NC - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        dq += fq * _dot(a.to(MMA), (kf * fk).to(MMA), IEEE)
    ii = tl.arange(0, SUB)
    a3 = _diagonal_of(a, NC)  # [NC, SUB(i), SUB(j)]
    G3 = tl.reshape(G, [NC, SUB, C])
    k3 = tl.reshape(kf, [NC, SUB, C])
    dq3 = tl.zeros([NC, SUB, C], dtype=tl.float32)
    for jj in range(SUB):
        sel = ii == jj
        a_col = tl.sum(tl.where(sel[None, None, :], a3, 0.0), 2)  # [NC, SUB(i)]
        e = tl.exp(tl.where((ii >= jj)[None, :, None], G3 - _pick(G3, sel)[:, None, :], float("-inf")))
        dq3 += a_col[:, :, None] * _pick(k3, sel)[:, None, :] * e
    return dq + tl.reshape(dq3, [BT, C])


@triton.jit
def _channel_dk_loop(a, qb, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """_channel_dk with the diagonal sub-chunks a loop over the query token within them."""
    BT: tl.constexpr = a.shape[0]
    C: tl.constexpr = qb.shape[1]
    NC: tl.constexpr = BT // SUB
    offs_t = tl.arange(0, BT)
    qf = qb.to(tl.float32)
    dk = tl.zeros([BT, C], dtype=tl.float32)
    for j in tl.static_range(NC - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        dk += fk * _dot(tl.trans(a.to(MMA)), (qf * fq).to(MMA), IEEE)
    ii = tl.arange(0, SUB)
    a3 = _diagonal_of(a, NC)  # [NC, SUB(i), SUB(j)]
    G3 = tl.reshape(G, [NC, SUB, C])
    q3 = tl.reshape(qf, [NC, SUB, C])
    dk3 = tl.zeros([NC, SUB, C], dtype=tl.float32)
    for i in range(SUB):
        sel = ii == i
        a_row = tl.sum(tl.where(sel[None, :, None], a3, 0.0), 1)  # [NC, SUB(j)]
        e = tl.exp(tl.where((ii <= i)[None, :, None], _pick(G3, sel)[:, None, :] - G3, float("-inf")))
        dk3 += a_row[:, :, None] * _pick(q3, sel)[:, None, :] * e
    return dk + tl.reshape(dk3, [BT, C])


@triton.jit
def _sub_gather(base, t0, offs_t, jj, cols, col_ok, N, s_n, s_d):
    """For each row i of a chunk, token jj of i's sub-chunk (t0 + (i // SUB) SUB + jj), columns ``cols``:
    [BT, C] (rows repeat: they come from L1), zeros past N."""
    rows = t0 + (offs_t // SUB) * SUB + jj
    ok = (rows < N)[:, None] & col_ok[None, :]
    return tl.load(base + rows.to(tl.int64)[:, None] * s_n + cols.to(tl.int64)[None, :] * s_d, mask=ok, other=0.0)


@triton.jit
def _diagonal_scores(af, gl, b_base, gl_base, t0, offs_k, k_ok, N, s_bn, s_bd, s_ln):
    """The diagonal sub-chunks of the per-channel scores, sum_d a_id b_jd exp(GL_id - GL_jd) for i, j in one
    sub-chunk, j <= i (0 elsewhere), one key token of every sub-chunk at a time: af [BT, C] (float32), gl
    [BT, C] the sub-chunk-local cumulative log decay of the chunk's rows, b and GL of the key token
    gathered from memory ([BT, C], elementwise: no [.., SUB, SUB, C] tensor, no layout change). [BT, BT]."""
    BT: tl.constexpr = af.shape[0]
    offs_t = tl.arange(0, BT)
    pos = offs_t % SUB
    s = tl.zeros([BT, BT], dtype=tl.float32)
    for jj in range(SUB):
        kj = _sub_gather(b_base, t0, offs_t, jj, offs_k, k_ok, N, s_bn, s_bd).to(tl.float32)
        glj = _sub_gather(gl_base, t0, offs_t, jj, offs_k, k_ok, N, s_ln, 1)
        live = (pos >= jj) & (t0 + offs_t < N)  # and row i past N: its GL is 0, GL_j's is not (exp > 1)
        col = tl.sum(af * kj * tl.exp(tl.where(live[:, None], gl - glj, float("-inf"))), 1)
        s += tl.where(offs_t[None, :] == ((offs_t // SUB) * SUB + jj)[:, None], col[:, None], 0.0)
    return s


@triton.jit
def _diagonal_dq(a, gl, k_base, gl_base, t0, cols, col_ok, N, s_kn, s_kd, s_ln):
    """sum_j a_ij k_jd exp(GL_id - GL_jd) over the diagonal sub-chunks (j in i's, j <= i), as
    _diagonal_scores: [BT, C]."""
    BT: tl.constexpr = a.shape[0]
    offs_t = tl.arange(0, BT)
    pos = offs_t % SUB
    dq = tl.zeros(gl.shape, dtype=tl.float32)
    for jj in range(SUB):
        target = (offs_t // SUB) * SUB + jj
        a_col = tl.sum(tl.where(offs_t[None, :] == target[:, None], a, 0.0), 1)  # a[i, its sub-chunk's jj]
        kj = _sub_gather(k_base, t0, offs_t, jj, cols, col_ok, N, s_kn, s_kd).to(tl.float32)
        glj = _sub_gather(gl_base, t0, offs_t, jj, cols, col_ok, N, s_ln, 1)
        live = (pos >= jj) & (t0 + offs_t < N)
        dq += a_col[:, None] * kj * tl.exp(tl.where(live[:, None], gl - glj, float("-inf")))
    return dq


@triton.jit
def _diagonal_dk(a, gl, q_base, gl_base, t0, cols, col_ok, N, s_qn, s_qd, s_ln):
    """sum_i a_ij q_id exp(GL_id - GL_jd) over the diagonal sub-chunks (i in j's, i >= j): [BT, C]."""
    BT: tl.constexpr = a.shape[0]
    offs_t = tl.arange(0, BT)
    pos = offs_t % SUB
    dk = tl.zeros(gl.shape, dtype=tl.float32)
    for ii in range(SUB):
        source = (offs_t // SUB) * SUB + ii
        a_row = tl.sum(tl.where(offs_t[:, None] == source[None, :], a, 0.0), 0)  # a[its sub-chunk's ii, j]
        qi = _sub_gather(q_base, t0, offs_t, ii, cols, col_ok, N, s_qn, s_qd).to(tl.float32)
        gli = _sub_gather(gl_base, t0, offs_t, ii, cols, col_ok, N, s_ln, 1)
        live = (pos <= ii) & (source + t0 < N)  # query token ii past N: its GL is 0 (exp > 1)
        dk += a_row[:, None] * qi * tl.exp(tl.where(live[:, None], gli - gl, float("-inf")))
    return dk


@triton.jit
def _offdiagonal_dq(a, kq, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """The off-diagonal sub-chunks of _channel_dq (dots through each key sub-chunk's reference)."""
    BT: tl.constexpr = a.shape[0]
    offs_t = tl.arange(0, BT)
    kf = kq.to(tl.float32)
    dq = tl.zeros(G.shape, dtype=tl.float32)
    for j in tl.static_range(BT // SUB - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        dq += fq * _dot(a.to(MMA), (kf * fk).to(MMA), IEEE)
    return dq


@triton.jit
def _offdiagonal_dk(a, qb, G, MMA: tl.constexpr, IEEE: tl.constexpr):
    """The off-diagonal sub-chunks of _channel_dk."""
    BT: tl.constexpr = a.shape[0]
    offs_t = tl.arange(0, BT)
    qf = qb.to(tl.float32)
    dk = tl.zeros(G.shape, dtype=tl.float32)
    for j in tl.static_range(BT // SUB - 1):
        fq, fk = _sub_factors(G, offs_t, j)
        dk += fk * _dot(tl.trans(a.to(MMA)), (qf * fq).to(MMA), IEEE)
    return dk


@triton.jit
def _quadratic(x, BT: tl.constexpr, BK: tl.constexpr):
    """Based's quadratic features vec(x x^T) of x [BT, BK] (float32), in registers: [BT, BK * BK]."""
    return tl.reshape(x[:, :, None] * x[:, None, :], [BT, BK * BK])


@triton.jit
def _based_rows(DK, BK: tl.constexpr):
    """(row in memory, valid) of the padded quadratic features a * BK + b: 1 + Dk + a * Dk + b."""
    r = tl.arange(0, BK * BK)
    a = r // BK
    b = r % BK
    return 1 + DK + a * DK + b, (a < DK) & (b < DK)


@triton.jit
def _state_block(base, rows, row_ok, cols, col_ok, s_f, s_v):
    """A block of a head's state (float32): rows ``rows``, value columns ``cols``."""
    ptrs = base + rows.to(tl.int64)[:, None] * s_f + cols.to(tl.int64)[None, :] * s_v
    return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _store_state_block(base, rows, row_ok, cols, col_ok, s_f, s_v, x):
    ptrs = base + rows.to(tl.int64)[:, None] * s_f + cols.to(tl.int64)[None, :] * s_v
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gate(o, v, d_row, z, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """Mamba-2's epilogue: (o + D v) * silu(z)."""
    if HAS_D:
        o = o + d_row[None, :] * v
    if HAS_Z:
        o = o * z * tl.sigmoid(z)
    return o


# --------------------------------------------------------------------------------------------
# forward


@triton.jit
def la_fwd_kernel(Q, K, V, G, BETA, DSKIP, Z, H0, O, OLIN, HT,
                  sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd,
                  sgb, sgn, sgh, sgd, sbb, sbn, sbh, szb, szn, szh, szd, sob, son, soh, sod,
                  s0b, s0h, s0f, s0v, stb, sth, stf, stv, sdh, sdv,
                  N, H, GROUP, DK, DV, scale, VBLOCKS,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
                  DECAY: tl.constexpr, FEATURE: tl.constexpr, HAS_BETA: tl.constexpr, HAS_D: tl.constexpr,
                  HAS_Z: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_OLIN: tl.constexpr,
                  MMA: tl.constexpr, IEEE: tl.constexpr, GL=None, DIAG: tl.constexpr = 2, REDO=None):
    """Program (batch * head, value block): o (and o before D and z: OLIN) of every token, and the final
    state, of its head's BV value columns. GL (per-channel decay): the sub-chunk-local cumulative log
    decay, contiguous (B, N, H, Dk) float32 (launch.sub_cumulative; read where DIAG is 2). DIAG 3 (per-channel
    decay): one reference a chunk where its span allows (_channel_chunk), else the sub-chunk form; DIAG 4
    the same with its scores' operands split hi + lo; 5 and 6 as 3 and 4 (the backward kernels' factored
    intra-chunk terms; they read 3 and 4 as 0). Grid: (B * H * VBLOCKS,), a head's value blocks
    consecutive (they run together and walk the chunks abreast, so q and k come from HBM once, then L2).
    REDO (int32 [B * H], from gluon_gla_forward's kernel): a program runs only where its head is flagged (a chunk
    too wide for the Gluon kernel's factored operands), rewriting that head's o and final state."""
    bh = tl.program_id(0) // VBLOCKS
    if REDO is not None:
        if tl.load(REDO + bh) == 0:
            return
    vblock = tl.program_id(0) % VBLOCKS
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    offs_t = tl.arange(0, BT)
    causal = offs_t[:, None] >= offs_t[None, :]
    offs_k = tl.arange(0, BK)
    k_ok = offs_k < DK
    offs_v = vblock * BV + tl.arange(0, BV)
    v_ok = offs_v < DV
    q_base = Q + b * sqb + hk * sqh
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + h * svh
    g_base = G + b * sgb + h * sgh
    d_row = tl.zeros([BV], dtype=tl.float32)
    if HAS_D:
        d_row = tl.load(DSKIP + h * sdh + offs_v * sdv, mask=v_ok, other=0.0).to(tl.float32)

    # the head's state: S (Dk, BV), or Based's S0 (BV), S1 (16, BV), S2 (256, BV)
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if FEATURE == 1:
        S0 = tl.zeros([BV], dtype=tl.float32)
        S2 = tl.zeros([BK * BK, BV], dtype=tl.float32)
        quad_rows, quad_ok = _based_rows(DK, BK)
    if HAS_H0:
        h0 = H0 + b * s0b + h * s0h
        if FEATURE == 1:
            S0 = tl.sum(_state_block(h0, offs_k * 0, offs_k == 0, offs_v, v_ok, s0f, s0v), 0)
            S = _state_block(h0, 1 + offs_k, k_ok, offs_v, v_ok, s0f, s0v)
            S2 = _state_block(h0, quad_rows, quad_ok, offs_v, v_ok, s0f, s0v)
        else:
            S = _state_block(h0, offs_k, k_ok, offs_v, v_ok, s0f, s0v)

    for t0 in range(0, N, BT):
        q = _rows(q_base, t0, offs_t, offs_k, k_ok, N, sqn, sqd)  # [BT, BK]
        k = _rows(k_base, t0, offs_t, offs_k, k_ok, N, skn, skd)  # [BT, BK]
        v = _rows(v_base, t0, offs_t, offs_v, v_ok, N, svn, svd).to(tl.float32)  # [BT, BV]
        beta = tl.full([BT], 1.0, dtype=tl.float32)
        if HAS_BETA:
            beta = _token_values(BETA + b * sbb + h * sbh, t0, offs_t, N, sbn)

        # intra-chunk scores P [BT, BT] (masked, decayed, times beta_j)
        if DECAY == 2:
            Gc, G_last = _cumulative_channels(_rows(g_base, t0, offs_t, offs_k, k_ok, N, sgn, sgd).to(tl.float32))
            if DIAG >= 3:  # one reference a chunk where the span allows (qg, kg: the inter-chunk tiles)
                p, qg, kg = _channel_chunk(q, k, Gc, G_last, q_base, k_base, g_base, t0, N, DK, sqn, sqd, skn, skd,
                                           sgn, sgd, BK, KB, MMA, IEEE, DIAG % 2 == 0)
                p = p * scale
            else:
                p = _channel_scores(q, k, Gc, q_base, k_base, g_base, t0, N, DK, sqn, sqd, skn, skd, sgn, sgd,
                                    BK, KB, MMA, IEEE, GL + (b * N * H + h) * DK, H * DK, DIAG) * scale
        else:
            s = _dot(q.to(MMA), tl.trans(k.to(MMA)), IEEE) * scale
            if FEATURE == 1:
                s = 1.0 + s + 0.5 * s * s
            if DECAY == 1:
                Gc, G_last = _cumulative(_token_values(g_base, t0, offs_t, N, sgn))
                s = s * _pair_decay(Gc, causal)
            p = tl.where(causal, s, 0.0)
        p = p * beta[None, :]
        o = _dot(p.to(MMA), v.to(MMA), IEEE)

        # inter-chunk: the state at the chunk's start, seen by each row (decayed to it)
        qf = q.to(tl.float32)
        if FEATURE == 1:
            inter = S0[None, :] + _dot((qf * scale).to(MMA), S.to(MMA), IEEE) + _dot(
                (_quadratic(qf, BT, BK) * (scale * scale * SQRT_HALF)).to(MMA), S2.to(MMA), IEEE)
        elif DECAY == 2:
            if DIAG >= 3:
                inter = _dot(qg.to(MMA), S.to(MMA), IEEE) * scale
            else:
                inter = _dot((qf * tl.exp(Gc)).to(MMA), S.to(MMA), IEEE) * scale
        else:
            inter = _dot(q.to(MMA), S.to(MMA), IEEE) * scale
        if DECAY == 1:
            inter = inter * tl.exp(Gc)[:, None]
        o += inter

        if STORE_OLIN:
            _store_rows(OLIN + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod, o)
        z = o
        if HAS_Z:
            z = _rows(Z + b * szb + h * szh, t0, offs_t, offs_v, v_ok, N, szn, szd).to(tl.float32)
        _store_rows(O + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod, _gate(o, v, d_row, z, HAS_D, HAS_Z))

        # the state at the chunk's end
        kf = k.to(tl.float32)
        if DECAY == 1:
            w = tl.exp(G_last - Gc) * beta
            S = S * tl.exp(G_last)
        elif DECAY == 2:
            w = beta
            if DIAG >= 3:
                kf = kg
            else:
                kf = kf * tl.exp(G_last[None, :] - Gc)
            S = S * tl.exp(G_last)[:, None]
        else:
            w = beta
        if FEATURE == 1:
            if DECAY == 1:
                S0 = S0 * tl.exp(G_last)
                S2 = S2 * tl.exp(G_last)
            S0 += tl.sum(w[:, None] * v, 0)
            k2 = _quadratic(kf, BT, BK) * (SQRT_HALF * w[:, None])
            S2 += _dot(tl.trans(k2.to(MMA)), v.to(MMA), IEEE)
        S += _dot(tl.trans((kf * w[:, None]).to(MMA)), v.to(MMA), IEEE)

    if STORE_HT:
        ht = HT + b * stb + h * sth
        if FEATURE == 1:
            _store_state_block(ht, offs_k * 0, offs_k == 0, offs_v, v_ok, stf, stv,
                               tl.where((offs_k == 0)[:, None], S0[None, :], 0.0))
            _store_state_block(ht, 1 + offs_k, k_ok, offs_v, v_ok, stf, stv, S)
            _store_state_block(ht, quad_rows, quad_ok, offs_v, v_ok, stf, stv, S2)
        else:
            _store_state_block(ht, offs_k, k_ok, offs_v, v_ok, stf, stv, S)


# --------------------------------------------------------------------------------------------
# backward
#
# With dS_t the gradient of the state after token t, the recurrence's adjoint runs backwards:
# dS_{t-1} = diag(exp(g_t)) dS_t + scale phi_q(q_t) do_t^T (the output at t reads S_t), from dS_N =
# the final state's gradient. Chunk by chunk that is the forward's form transposed: the dK/dV kernel
# walks the chunks from the last with dS in registers, the dQ kernel from the first with S. dk and dv
# come out without each token's own beta (dk_hat, dv_hat: the contribution beta_t phi(k_t) v_t^T is
# linear in beta_t, so d beta_t = v_t . dv_hat_t and dv = beta dv_hat, dk = beta dk_hat: launch.py).


@triton.jit
def la_bwd_dq_kernel(Q, K, V, G, GL, BETA, H0, DO, DQ, R,
                     sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd,
                     sgb, sgn, sgh, sgd, sbb, sbn, sbh, s_ob, s_on, s_oh, s_od, s_qb, s_qn, s_qh, s_qd,
                     s0b, s0h, s0f, s0v,
                     N, H, GROUP, DK, DV, scale, KBLOCKS,
                     BT: tl.constexpr, BKQ: tl.constexpr, BVF: tl.constexpr,
                     DECAY: tl.constexpr, FEATURE: tl.constexpr, HAS_BETA: tl.constexpr, HAS_H0: tl.constexpr,
                     STRICT: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr, DIAG: tl.constexpr = 2,
                     DG_PART=0, s_gp=0, EPILOGUE: tl.constexpr = False, SYM: tl.constexpr = False):
    """Program (batch * head, block of BKQ key channels): dq of every token in those channels (per v
    head h: the caller sums a q head's group), by a forward sweep that rebuilds the state (BKQ, Dv).
    EPILOGUE (STRICT with a scalar decay, on the split path: the combine kernel's work done here): dq
    comes with its diagonal beta_t r_t k_t added back (r from this program's do and v rows), and
    DG_PART[key block] (B, N, H) float32 (parts s_gp apart) gets the decay gradient's query side
    q_t . dq_t without the diagonal over these channels; R is not written.
    STRICT: without the diagonal (token t against itself), and R (B, N, H) float32 gets its factor
    r_t = scale do_t . v_t (the caller adds beta_t r_t k_t: the decay's gradient then never carries the
    diagonal's rounding, launch.decay_grad).
    Grid: (B * H * KBLOCKS,), a head's blocks consecutive; Based: one block of 16. Every value column at
    once (BVF >= Dv).
    SYM (Based, no initial state: S2 then stays symmetric, S2[a * 16 + b] = S2[b * 16 + a], each update being
    vec(k k^T)'s): q's quadratic term 2 M q by one reduction instead of (M + M^T) q's two."""
    bh = tl.program_id(0) // KBLOCKS
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    offs_t = tl.arange(0, BT)
    causal = offs_t[:, None] >= offs_t[None, :]
    offs_kq = (tl.program_id(0) % KBLOCKS) * BKQ + tl.arange(0, BKQ)
    kq_ok = offs_kq < DK
    offs_vf = tl.arange(0, BVF)
    vf_ok = offs_vf < DV
    q_base = Q + b * sqb + hk * sqh
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + h * svh
    g_base = G + b * sgb + h * sgh
    do_base = DO + b * s_ob + h * s_oh
    inside = (offs_t[:, None] > offs_t[None, :]) if STRICT else causal  # the intra-chunk terms taken
    first_block = (tl.program_id(0) % KBLOCKS) == 0

    S = tl.zeros([BKQ, BVF], dtype=tl.float32)  # Based: S1; S0 is not needed (phi_q's 1 is constant)
    if FEATURE == 1:
        S2 = tl.zeros([BKQ * BKQ, BVF], dtype=tl.float32)
        quad_rows, quad_ok = _based_rows(DK, BKQ)
    if HAS_H0:
        h0 = H0 + b * s0b + h * s0h
        if FEATURE == 1:
            S = _state_block(h0, 1 + offs_kq, kq_ok, offs_vf, vf_ok, s0f, s0v)
            S2 = _state_block(h0, quad_rows, quad_ok, offs_vf, vf_ok, s0f, s0v)
        else:
            S = _state_block(h0, offs_kq, kq_ok, offs_vf, vf_ok, s0f, s0v)

    for t0 in range(0, N, BT):
        do = _rows(do_base, t0, offs_t, offs_vf, vf_ok, N, s_on, s_od)  # [BT, BVF]
        v = _rows(v_base, t0, offs_t, offs_vf, vf_ok, N, svn, svd)  # [BT, BVF]
        kq = _rows(k_base, t0, offs_t, offs_kq, kq_ok, N, skn, skd)  # [BT, BKQ]
        beta = tl.full([BT], 1.0, dtype=tl.float32)
        if HAS_BETA:
            beta = _token_values(BETA + b * sbb + h * sbh, t0, offs_t, N, sbn)
        dp = _dot(do.to(MMA), tl.trans(v.to(MMA)), IEEE)  # [BT, BT]: do_i . v_j
        if STRICT and not EPILOGUE:
            rows_ok = (t0 + offs_t < N) & first_block
            r = tl.sum(do.to(tl.float32) * v.to(tl.float32), 1) * scale
            tl.store(R + ((b * N + t0 + offs_t) * H + h), r, mask=rows_ok)
        if DECAY == 2:
            Gq, Gq_last = _cumulative_channels(_rows(g_base, t0, offs_t, offs_kq, kq_ok, N, sgn, sgd).to(tl.float32))
            a = tl.where(inside, dp * beta[None, :], 0.0)
            if DIAG == 2:
                gl_base = GL + (b * N * H + h) * DK
                gl = _rows(gl_base, t0, offs_t, offs_kq, kq_ok, N, H * DK, 1)
                dq = _offdiagonal_dq(a, kq, Gq, MMA, IEEE) + _diagonal_dq(a, gl, k_base, gl_base, t0, offs_kq, kq_ok,
                                                                           N, skn, skd, H * DK)
            elif DIAG == 1:
                dq = _channel_dq_loop(a, kq, Gq, MMA, IEEE)
            elif DIAG >= 5:  # one reference a chunk (6: split operands)
                dq = _channel_dq_factored(a, kq, Gq, MMA, IEEE, DIAG == 6)
            else:
                dq = _channel_dq(a, kq, Gq, MMA, IEEE)
            dq = (dq + _dot(do.to(MMA), tl.trans(S.to(MMA)), IEEE) * tl.exp(Gq)) * scale
        else:
            a = dp * beta[None, :] * scale
            if DECAY == 1:
                Gc, G_last = _cumulative(_token_values(g_base, t0, offs_t, N, sgn))
                a = a * _pair_decay(Gc, causal)
            if FEATURE == 1:
                q = _rows(q_base, t0, offs_t, offs_kq, kq_ok, N, sqn, sqd)
                a = a * (1.0 + _dot(q.to(MMA), tl.trans(kq.to(MMA)), IEEE) * scale)
            a = tl.where(inside, a, 0.0)
            dq = _dot(a.to(MMA), kq.to(MMA), IEEE)
            inter = _dot(do.to(MMA), tl.trans(S.to(MMA)), IEEE) * scale
            if FEATURE == 1:
                # d/dq of c q^T M q with M[a, b] = sum_v S2[a * 16 + b, v] do_v: c (M + M^T) q
                m = tl.reshape(_dot(do.to(MMA), tl.trans(S2.to(MMA)), IEEE), [BT, BKQ, BKQ])
                qf = q.to(tl.float32)
                if SYM:  # (M's column sums: sm_90a 4 SHFL against 40, the other axis's row sums 36)
                    inter += (2.0 * scale * scale * SQRT_HALF) * tl.sum(m * qf[:, :, None], 1)
                else:
                    inter += (scale * scale * SQRT_HALF) * (tl.sum(m * qf[:, None, :], 2) +
                                                            tl.sum(m * qf[:, :, None], 1))
            if DECAY == 1:
                inter = inter * tl.exp(Gc)[:, None]
            dq += inter
        if EPILOGUE:
            qe = _rows(q_base, t0, offs_t, offs_kq, kq_ok, N, sqn, sqd).to(tl.float32)
            if DECAY == 2:  # per channel: DG_PART (B, N, H, Dk) float32 contiguous gets q_t * dq_t
                _store_rows(DG_PART + (b * N * H + h) * DK, t0, offs_t, offs_kq, kq_ok, N, H * DK, 1, qe * dq)
            else:
                tokens = (b * N + t0 + offs_t) * H + h
                kblock = (tl.program_id(0) % KBLOCKS).to(tl.int64)
                tl.store(DG_PART + kblock * s_gp + tokens, tl.sum(qe * dq, 1), mask=t0 + offs_t < N)
            r = tl.sum(do.to(tl.float32) * v.to(tl.float32), 1) * scale
            dq += (beta * r)[:, None] * kq.to(tl.float32)
        _store_rows(DQ + b * s_qb + h * s_qh, t0, offs_t, offs_kq, kq_ok, N, s_qn, s_qd, dq)

        # the state at the chunk's end (the forward's update, on these channels)
        kf = kq.to(tl.float32)
        if DECAY == 1:
            w = tl.exp(G_last - Gc) * beta
            S = S * tl.exp(G_last)
            if FEATURE == 1:
                S2 = S2 * tl.exp(G_last)
        elif DECAY == 2:
            w = beta
            kf = kf * tl.exp(Gq_last[None, :] - Gq)
            S = S * tl.exp(Gq_last)[:, None]
        else:
            w = beta
        if FEATURE == 1:
            k2 = _quadratic(kf, BT, BKQ) * (SQRT_HALF * w[:, None])
            S2 += _dot(tl.trans(k2.to(MMA)), v.to(MMA), IEEE)
        S += _dot(tl.trans((kf * w[:, None]).to(MMA)), v.to(MMA), IEEE)


@triton.jit
def la_bwd_dkv_kernel(Q, K, V, G, GL, BETA, DO, DHT, DK_PART, DV_PART, DH0,
                      sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd,
                      sgb, sgn, sgh, sgd, sbb, sbn, sbh, s_ob, s_on, s_oh, s_od,
                      stb, sth, stf, stv, s_hb, s_hh, s_hf, s_hv, s_kp, s_vp,
                      N, H, GROUP, DK, DV, scale, VBLOCKS, KBLOCKS,
                      BT: tl.constexpr, BK: tl.constexpr, BKB: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
                      DECAY: tl.constexpr, FEATURE: tl.constexpr, HAS_BETA: tl.constexpr, HAS_DHT: tl.constexpr,
                      STORE_DH0: tl.constexpr, STRICT: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr,
                      DIAG: tl.constexpr = 2, PART: tl.constexpr = 0, DG_PART=0, s_gp=0,
                      EPILOGUE: tl.constexpr = False, DGQ=0, HT=0, s_ub=0, s_uh=0, s_uf=0, s_uv=0,
                      HAS_HT: tl.constexpr = False, SYM: tl.constexpr = False):
    """Program (batch * head, value block, key-channel block): dk_hat and dv_hat of every token, by a
    reverse sweep with dS (BKB, BV) in registers; dh0 (the gradient of the initial state) at the end.

    dk_hat sums over value blocks and dv_hat over key blocks: each program writes its part, to
    DK_PART[value block] (B, N, H, Dk) and DV_PART[key block] (B, N, H, Dv), float32 (parts s_kp, s_vp
    apart, each contiguous); the intra-chunk term of dv_hat is the first key block's. DHT (the final
    state's gradient) and DH0: (B, H, F, Dv), any strides (stb... and s_hb...). Grid: (B * H * VBLOCKS
    * KBLOCKS,), a head's blocks consecutive (key blocks fastest); BKB = BK but for per-channel decay.
    STRICT: dk_hat without the diagonal (as la_bwd_dq_kernel's dq).

    PART (the split backward, launch.backward_calls): 0 writes dk_hat and dv_hat; 1 dk_hat only, 2 dv_hat
    only. Both walk the same dS recurrence; PART 1 runs with every value column in a program (VBLOCKS 1,
    BV >= Dv) and PART 2 with every key channel (KBLOCKS 1, BKB = BK), so each output comes whole from
    one program: no partial sums, and the kernels store it in the output's dtype (the caller's bf16).
    EPILOGUE (split, STRICT with a scalar decay: the combine kernel's work done here): PART 1 stores dk
    itself, (dk_hat + r_t q_t) beta_t with the diagonal's r_t from its do and v rows, and DG_PART[key
    block] gets the decay gradient's key side k_t . dk_t without the diagonal over its channels; PART 2
    stores dv = beta_t dv_hat and DG_PART[value block] the part of d beta_t = v_t . dv_hat_t over its
    columns ((B, N, H) float32 parts s_gp apart).
    EPILOGUE with per-channel decay (PART 1, no beta; kernels_backward_gla.py): the log decay's gradient
    whole. DGQ (B, N, H, Dk) float32 holds the dQ kernel's q_t * dq_t (without the diagonal); this program
    takes dG_t = DGQ_t - k_t * dk_t on its channels, its reverse cumulative sum over the sequence (the walk
    runs backwards: a carry [BKB] between chunks, starting from the last token's <dS_N, S_N> = sum_v
    DHT * HT where HAS_HT), zero where the floor clamped g, into DG_PART (B, N, H, Dk) float32 contiguous;
    dk = dk_hat + r_t q_t stored whole.
    SYM (Based, no final state's gradient: dS2 then stays symmetric, each step adding vec(q q^T)'s): k's quadratic
    term 2 N^T k by one reduction instead of (N + N^T) k's two."""
    bh = tl.program_id(0) // (VBLOCKS * KBLOCKS)
    vblock = (tl.program_id(0) // KBLOCKS) % VBLOCKS
    kblock = tl.program_id(0) % KBLOCKS
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    offs_t = tl.arange(0, BT)
    causal = offs_t[:, None] >= offs_t[None, :]
    offs_k = tl.arange(0, BK)
    k_ok = offs_k < DK
    offs_kb = kblock * BKB + tl.arange(0, BKB)
    kb_ok = offs_kb < DK
    offs_v = vblock * BV + tl.arange(0, BV)
    v_ok = offs_v < DV
    q_base = Q + b * sqb + hk * sqh
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + h * svh
    g_base = G + b * sgb + h * sgh
    do_base = DO + b * s_ob + h * s_oh
    first_block = (kblock == 0).to(tl.float32)
    inside = (offs_t[:, None] > offs_t[None, :]) if STRICT else causal  # dk's intra-chunk terms

    dS = tl.zeros([BKB, BV], dtype=tl.float32)  # Based: dS1
    if FEATURE == 1:
        dS0 = tl.zeros([BV], dtype=tl.float32)
        dS2 = tl.zeros([BKB * BKB, BV], dtype=tl.float32)
        quad_rows, quad_ok = _based_rows(DK, BKB)
    if HAS_DHT:
        dht = DHT + b * stb + h * sth
        if FEATURE == 1:
            dS0 = tl.sum(_state_block(dht, offs_kb * 0, offs_kb == 0, offs_v, v_ok, stf, stv), 0)
            dS = _state_block(dht, 1 + offs_kb, kb_ok, offs_v, v_ok, stf, stv)
            dS2 = _state_block(dht, quad_rows, quad_ok, offs_v, v_ok, stf, stv)
        else:
            dS = _state_block(dht, offs_kb, kb_ok, offs_v, v_ok, stf, stv)
    if EPILOGUE and (DECAY == 2) and (PART == 1):
        dg_carry = tl.zeros([BKB], dtype=tl.float32)  # sum over the later tokens of dG (this program's channels)
        if HAS_HT:  # the final state's term: each factor of S_N counts +1 towards the last token's dG
            dg_carry = tl.sum(dS * _state_block(HT + b * s_ub + h * s_uh, offs_kb, kb_ok, offs_v, v_ok, s_uf, s_uv), 1)

    chunks = tl.cdiv(N, BT)
    for i in range(0, chunks):
        t0 = (chunks - 1 - i) * BT
        v = _rows(v_base, t0, offs_t, offs_v, v_ok, N, svn, svd)  # [BT, BV]
        do = _rows(do_base, t0, offs_t, offs_v, v_ok, N, s_on, s_od)  # [BT, BV]
        qb = _rows(q_base, t0, offs_t, offs_kb, kb_ok, N, sqn, sqd)  # [BT, BKB]
        kb = _rows(k_base, t0, offs_t, offs_kb, kb_ok, N, skn, skd)  # [BT, BKB]
        beta = tl.full([BT], 1.0, dtype=tl.float32)
        if HAS_BETA:
            beta = _token_values(BETA + b * sbb + h * sbh, t0, offs_t, N, sbn)

        # the intra-chunk scores over every channel, without beta: p [BT, BT] (dv's intra-chunk term)
        if DECAY == 2:
            if PART != 1:
                p = tl.zeros([BT, BT], dtype=tl.float32)
                if kblock == 0:  # dv's intra-chunk term is the first key block's: the others skip the scores
                    q = _rows(q_base, t0, offs_t, offs_k, k_ok, N, sqn, sqd)
                    k = _rows(k_base, t0, offs_t, offs_k, k_ok, N, skn, skd)
                    g_chunk = _rows(g_base, t0, offs_t, offs_k, k_ok, N, sgn, sgd).to(tl.float32)
                    Gc, Gc_last = _cumulative_channels(g_chunk)
                    if DIAG >= 5:  # the forward's factored scores (diag 3 / 4)
                        p, _, _ = _channel_chunk(q, k, Gc, Gc_last, q_base, k_base, g_base, t0, N, DK, sqn, sqd, skn,
                                                 skd, sgn, sgd, BK, KB, MMA, IEEE, DIAG == 6)
                        p = p * scale
                    else:
                        p = _channel_scores(q, k, Gc, q_base, k_base, g_base, t0, N, DK, sqn, sqd, skn, skd, sgn,
                                            sgd, BK, KB, MMA, IEEE, GL + (b * N * H + h) * DK, H * DK, DIAG) * scale
        else:
            if (PART != 1) | (FEATURE == 1):  # s: dv's scores, and Based's dk factor (1 + s)
                if BKB == BK:
                    s = _dot(qb.to(MMA), tl.trans(kb.to(MMA)), IEEE) * scale
                else:
                    q = _rows(q_base, t0, offs_t, offs_k, k_ok, N, sqn, sqd)
                    k = _rows(k_base, t0, offs_t, offs_k, k_ok, N, skn, skd)
                    s = _dot(q.to(MMA), tl.trans(k.to(MMA)), IEEE) * scale
            if DECAY == 1:
                Gc, G_last = _cumulative(_token_values(g_base, t0, offs_t, N, sgn))
                decay = _pair_decay(Gc, causal)
                w = tl.exp(G_last - Gc)[:, None]
            if PART != 1:
                p = s
                if FEATURE == 1:
                    p = 1.0 + s + 0.5 * s * s
                if DECAY == 1:
                    p = p * decay
                p = tl.where(causal, p, 0.0)
        if PART != 1:
            dv = _dot(tl.trans(p.to(MMA)), do.to(MMA), IEEE) * first_block  # [BT, BV]
        if PART != 2:
            dp = _dot(do.to(MMA), tl.trans(v.to(MMA)), IEEE)  # [BT, BT]: do_i . v_j over this value block
        kbf = kb.to(tl.float32)
        if DECAY == 2:
            Gb, Gb_last = _cumulative_channels(_rows(g_base, t0, offs_t, offs_kb, kb_ok, N, sgn, sgd).to(tl.float32))
            w2 = tl.exp(Gb_last[None, :] - Gb)  # [BT, BKB]
            if PART != 2:
                if DIAG == 2:
                    gl_base = GL + (b * N * H + h) * DK
                    gl = _rows(gl_base, t0, offs_t, offs_kb, kb_ok, N, H * DK, 1)
                    a = tl.where(inside, dp, 0.0)
                    dk = (_offdiagonal_dk(a, qb, Gb, MMA, IEEE) + _diagonal_dk(a, gl, q_base, gl_base, t0, offs_kb,
                                                                              kb_ok, N, sqn, sqd, H * DK)) * scale
                elif DIAG == 1:
                    dk = _channel_dk_loop(tl.where(inside, dp, 0.0), qb, Gb, MMA, IEEE) * scale
                elif DIAG >= 5:
                    dk = _channel_dk_factored(tl.where(inside, dp, 0.0), qb, Gb, MMA, IEEE, DIAG == 6) * scale
                else:
                    dk = _channel_dk(tl.where(inside, dp, 0.0), qb, Gb, MMA, IEEE) * scale
                dk += _dot(v.to(MMA), tl.trans(dS.to(MMA)), IEEE) * w2
            if PART != 1:
                dv += _dot((kbf * w2).to(MMA), dS.to(MMA), IEEE)
        else:
            if PART != 2:
                a = dp * scale
                if DECAY == 1:
                    a = a * decay
                if FEATURE == 1:
                    a = a * (1.0 + s)
                a = tl.where(inside, a, 0.0)
                dk = _dot(tl.trans(a.to(MMA)), qb.to(MMA), IEEE)  # [BT, BKB]
                dk_inter = _dot(v.to(MMA), tl.trans(dS.to(MMA)), IEEE)
                if FEATURE == 1:
                    # d/dk of (vec(k k^T) / sqrt(2)) . (dS2 v): (N + N^T) k / sqrt(2), N[a, b] = (dS2 v)[a * 16 + b]
                    nmat = tl.reshape(_dot(v.to(MMA), tl.trans(dS2.to(MMA)), IEEE), [BT, BKB, BKB])
                    if SYM:  # (N's column sums: sm_90a 26 SHFL against 62, the other axis's 58)
                        dk_inter += (2.0 * SQRT_HALF) * tl.sum(nmat * kbf[:, :, None], 1)
                    else:
                        dk_inter += SQRT_HALF * (tl.sum(nmat * kbf[:, None, :], 2) + tl.sum(nmat * kbf[:, :, None], 1))
                if DECAY == 1:
                    dk_inter = dk_inter * w
                dk += dk_inter
            if PART != 1:
                if FEATURE == 1:
                    dv_inter = dS0[None, :] + _dot(kb.to(MMA), dS.to(MMA), IEEE) + _dot(
                        (_quadratic(kbf, BT, BKB) * SQRT_HALF).to(MMA), dS2.to(MMA), IEEE)
                else:
                    dv_inter = _dot(kb.to(MMA), dS.to(MMA), IEEE)
                if DECAY == 1:
                    dv_inter = dv_inter * w
                dv += dv_inter
        if EPILOGUE and (DECAY == 2):
            if PART == 1:  # dg whole (see the docstring), then dk with its diagonal r_t q_t
                gl_rows = (b * N * H + h) * DK
                dG = _rows(DGQ + gl_rows, t0, offs_t, offs_kb, kb_ok, N, H * DK, 1) - kbf * dk
                dg = tl.cumsum(dG, 0, reverse=True) + dg_carry[None, :]
                dg_carry += tl.sum(dG, 0)
                clamped = _rows(g_base, t0, offs_t, offs_kb, kb_ok, N, sgn, sgd) < LOG_DECAY_FLOOR  # again: L1, not
                _store_rows(DG_PART + gl_rows, t0, offs_t, offs_kb, kb_ok, N, H * DK, 1,  # a live tile
                            tl.where(clamped, 0.0, dg))
                r = tl.sum(do.to(tl.float32) * v.to(tl.float32), 1) * scale
                dk += r[:, None] * qb.to(tl.float32)
        elif EPILOGUE:
            tokens = (b * N + t0 + offs_t) * H + h
            rows_ok = t0 + offs_t < N
            if PART == 1:
                dk_beta = dk * beta[:, None]
                tl.store(DG_PART + kblock.to(tl.int64) * s_gp + tokens, tl.sum(kbf * dk_beta, 1), mask=rows_ok)
                r = tl.sum(do.to(tl.float32) * v.to(tl.float32), 1) * scale
                dk = dk_beta + (r * beta)[:, None] * qb.to(tl.float32)
            if PART == 2:
                tl.store(DG_PART + vblock.to(tl.int64) * s_gp + tokens, tl.sum(v.to(tl.float32) * dv, 1),
                         mask=rows_ok)
                dv = dv * beta[:, None]
        bh_rows = (b * N * H + h)  # (B, N, H, D) contiguous parts: row t of head (b, h) at (b N + t) H + h
        if PART != 2:
            _store_rows(DK_PART + vblock.to(tl.int64) * s_kp + bh_rows * DK, t0, offs_t, offs_kb, kb_ok, N,
                        H * DK, 1, dk)
        if PART != 1:
            _store_rows(DV_PART + kblock.to(tl.int64) * s_vp + bh_rows * DV, t0, offs_t, offs_v, v_ok, N, H * DV, 1,
                        dv)

        # dS at the chunk's start
        qbf = qb.to(tl.float32)
        if DECAY == 1:
            eg = tl.exp(Gc)[:, None]
            qbf = qbf * eg
            dS = dS * tl.exp(G_last)
            if FEATURE == 1:
                dS0 = dS0 * tl.exp(G_last)
                dS2 = dS2 * tl.exp(G_last)
        elif DECAY == 2:
            qbf = qbf * tl.exp(Gb)
            dS = dS * tl.exp(Gb_last)[:, None]
        if FEATURE == 1:
            dof = do.to(tl.float32)
            if DECAY == 1:
                dS0 += tl.sum(eg * dof, 0)
            else:
                dS0 += tl.sum(dof, 0)
            q2 = _quadratic(qb.to(tl.float32), BT, BKB) * (scale * scale * SQRT_HALF)
            if DECAY == 1:
                q2 = q2 * eg
            dS2 += _dot(tl.trans(q2.to(MMA)), do.to(MMA), IEEE)
        dS += _dot(tl.trans((qbf * scale).to(MMA)), do.to(MMA), IEEE)

    if STORE_DH0:
        dh0 = DH0 + b * s_hb + h * s_hh
        if FEATURE == 1:
            _store_state_block(dh0, offs_kb * 0, offs_kb == 0, offs_v, v_ok, s_hf, s_hv,
                               tl.where((offs_kb == 0)[:, None], dS0[None, :], 0.0))
            _store_state_block(dh0, 1 + offs_kb, kb_ok, offs_v, v_ok, s_hf, s_hv, dS)
            _store_state_block(dh0, quad_rows, quad_ok, offs_v, v_ok, s_hf, s_hv, dS2)
        else:
            _store_state_block(dh0, offs_kb, kb_ok, offs_v, v_ok, s_hf, s_hv, dS)


# --------------------------------------------------------------------------------------------
# decode: one token against a carried state, updated in place


@triton.jit
def la_step_kernel(Q, K, V, G, BETA, DSKIP, Z, STATE, O,
                   sqb, sqh, sqd, skb, skh, skd, svb, svh, svd, sgb, sgh, sgd, sbb, sbh,
                   szb, szh, szd, sob, soh, sod, ssb, ssh, ssf, ssv, sdh, sdv,
                   H, GROUP, DK, DV, scale, VBLOCKS,
                   BK: tl.constexpr, BV: tl.constexpr, DECAY: tl.constexpr, FEATURE: tl.constexpr,
                   HAS_BETA: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """Program (batch * head, value block): S <- diag(exp(g)) S + beta phi(k) v^T, then o = scale
    phi_q(q)^T S (Based: phi's pieces as in the forward), (o + D v) * silu(z); the state (B, H, F, Dv),
    any strides and float dtype, read and written in place (float32 math). q, k (B, Hqk, Dk); v, o, z
    (B, H, Dv); g (B, H) or (B, H, Dk); beta (B, H). Grid: (B * H * VBLOCKS,).

    exp(g) is taken as it is here (no floor: there is no cumulative sum to keep finite), so g = -inf
    gives exactly 0 (a reset)."""
    bh = tl.program_id(0) // VBLOCKS
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    offs_k = tl.arange(0, BK)
    k_ok = offs_k < DK
    offs_v = (tl.program_id(0) % VBLOCKS) * BV + tl.arange(0, BV)
    v_ok = offs_v < DV
    q = tl.load(Q + b * sqb + hk * sqh + offs_k * sqd, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(K + b * skb + hk * skh + offs_k * skd, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(V + b * svb + h * svh + offs_v * svd, mask=v_ok, other=0.0).to(tl.float32)
    if HAS_BETA:
        v_in = v * tl.load(BETA + b * sbb + h * sbh).to(tl.float32)  # beta on the token's contribution
    else:
        v_in = v
    state = STATE + b * ssb + h * ssh
    if DECAY == 1:
        factor = tl.exp(tl.load(G + b * sgb + h * sgh).to(tl.float32))
    elif DECAY == 2:
        factor = tl.exp(tl.load(G + b * sgb + h * sgh + offs_k * sgd, mask=k_ok, other=0.0).to(tl.float32))[:, None]
    else:
        factor = 1.0
    if FEATURE == 1:
        quad_rows, quad_ok = _based_rows(DK, BK)
        S0 = tl.sum(_state_block(state, offs_k * 0, offs_k == 0, offs_v, v_ok, ssf, ssv), 0)
        S1 = _state_block(state, 1 + offs_k, k_ok, offs_v, v_ok, ssf, ssv)
        S2 = _state_block(state, quad_rows, quad_ok, offs_v, v_ok, ssf, ssv)
        k2 = tl.reshape(k[:, None] * k[None, :], [BK * BK]) * SQRT_HALF
        q2 = tl.reshape(q[:, None] * q[None, :], [BK * BK]) * (scale * scale * SQRT_HALF)
        S0 = S0 * factor + v_in
        S1 = S1 * factor + k[:, None] * v_in[None, :]
        S2 = S2 * factor + k2[:, None] * v_in[None, :]
        o = S0 + tl.sum((q * scale)[:, None] * S1, 0) + tl.sum(q2[:, None] * S2, 0)
        _store_state_block(state, offs_k * 0, offs_k == 0, offs_v, v_ok, ssf, ssv,
                           tl.where((offs_k == 0)[:, None], S0[None, :], 0.0))
        _store_state_block(state, 1 + offs_k, k_ok, offs_v, v_ok, ssf, ssv, S1)
        _store_state_block(state, quad_rows, quad_ok, offs_v, v_ok, ssf, ssv, S2)
    else:
        S = _state_block(state, offs_k, k_ok, offs_v, v_ok, ssf, ssv)
        S = S * factor + k[:, None] * v_in[None, :]
        o = tl.sum(q[:, None] * S, 0) * scale
        _store_state_block(state, offs_k, k_ok, offs_v, v_ok, ssf, ssv, S)
    d_row = tl.zeros([BV], dtype=tl.float32)
    if HAS_D:
        d_row = tl.load(DSKIP + h * sdh + offs_v * sdv, mask=v_ok, other=0.0).to(tl.float32)
        o = o + d_row * v
    if HAS_Z:
        z = tl.load(Z + b * szb + h * szh + offs_v * szd, mask=v_ok, other=0.0).to(tl.float32)
        o = o * z * tl.sigmoid(z)
    tl.store(O + b * sob + h * soh + offs_v * sod, o.to(O.dtype.element_ty), mask=v_ok)

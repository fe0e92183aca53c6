"""The chunked forward with the state held transposed: S^T [BV, BK] (value rows, key columns), for
phi(x) = x with no decay or a scalar one (Mamba-2's SSD form included: beta, D, z, grouped q/k).

Why transposed. In kernels_tl.la_fwd_kernel the state S [BK, BV] is the B operand of the inter-chunk
product Q S, and a tensor-core dot takes its B operand from shared memory: every chunk S goes from
registers to shared memory and back before the next chunk can start, on the one serial path of the
walk (S_c -> Q S_c and S_{c+1}). Held as S^T it is the A operand instead, which wgmma takes from
registers (as flash attention's P in P V), so the serial path stays in registers:

    inter^T [BV, BT] = S^T [BV, BK] @ Q^T [BK, BT]                       (S^T in registers: A)
    S^T     <- exp(G_last) S^T + V^T [BV, BT] @ (K exp(G_last - G_j) beta_j) [BT, BK]

and o = mask(Q K^T decay beta) V + exp(G_i) scale inter (the transpose of inter^T costs one layout
conversion, off the serial path). Layout, strides, the decay's stability and every argument are
la_fwd_kernel's (kernels_tl.py's docstring); this kernel is a drop-in for those cases (launch.py picks
it by the plan's ``transposed`` flag).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecore.ops.linear_attention.kernels_tl import (_cumulative, _dot, _gate, _pair_decay, _rows, _state_block,
                                                      _store_rows, _store_state_block, _token_values)
from tilecore.tiles.launch import cdiv, next_power_of_2


@triton.jit
def la_fwd_transposed_kernel(Q, K, V, G, BETA, DSKIP, Z, H0, O, OLIN, HT,
                             sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd,
                             sgb, sgn, sgh, sgd, sbb, sbn, sbh, szb, szn, szh, szd, sob, son, soh, sod,
                             s0b, s0h, s0f, s0v, stb, sth, stf, stv, sdh, sdv,
                             N, H, GROUP, DK, DV, scale, VBLOCKS,
                             BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
                             DECAY: tl.constexpr, FEATURE: tl.constexpr, HAS_BETA: tl.constexpr,
                             HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_H0: tl.constexpr,
                             STORE_HT: tl.constexpr, STORE_OLIN: tl.constexpr, MMA: tl.constexpr,
                             IEEE: tl.constexpr):
    """Program (batch * head, value block), as la_fwd_kernel's (same arguments; FEATURE must be 0 and
    DECAY 0 or 1). Grid: (B * H * VBLOCKS,), a head's value blocks consecutive."""
    bh = tl.program_id(0) // VBLOCKS
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

    ST = tl.zeros([BV, BK], dtype=tl.float32)  # the head's state, transposed: S^T [BV, BK]
    if HAS_H0:
        ST = tl.trans(_state_block(H0 + b * s0b + h * s0h, offs_k, k_ok, offs_v, v_ok, s0f, s0v))

    for t0 in range(0, N, BT):
        q = _rows(q_base, t0, offs_t, offs_k, k_ok, N, sqn, sqd)  # [BT, BK]
        k = _rows(k_base, t0, offs_t, offs_k, k_ok, N, skn, skd)  # [BT, BK]
        v = _rows(v_base, t0, offs_t, offs_v, v_ok, N, svn, svd)  # [BT, BV]
        beta = tl.full([BT], 1.0, dtype=tl.float32)
        if HAS_BETA:
            beta = _token_values(BETA + b * sbb + h * sbh, t0, offs_t, N, sbn)

        # intra-chunk: P [BT, BT] masked, decayed, times beta_j; o = P V
        s = _dot(q.to(MMA), tl.trans(k.to(MMA)), IEEE) * scale
        if DECAY == 1:
            Gc, G_last = _cumulative(_token_values(g_base, t0, offs_t, N, sgn))
            s = s * _pair_decay(Gc, causal)
        p = tl.where(causal, s, 0.0) * beta[None, :]
        o = _dot(p.to(MMA), v.to(MMA), IEEE)

        # inter-chunk, transposed: (S^T Q^T)^T, S^T the A operand (registers)
        inter = tl.trans(_dot(ST.to(MMA), tl.trans(q.to(MMA)), IEEE)) * scale
        if DECAY == 1:
            inter = inter * tl.exp(Gc)[:, None]
        o += inter

        if STORE_OLIN:
            _store_rows(OLIN + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod, o)
        z = o
        if HAS_Z:
            z = _rows(Z + b * szb + h * szh, t0, offs_t, offs_v, v_ok, N, szn, szd).to(tl.float32)
        _store_rows(O + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod,
                    _gate(o, v.to(tl.float32), d_row, z, HAS_D, HAS_Z))

        # the state at the chunk's end: S^T <- exp(G_last) S^T + V^T (K w)
        w = beta
        if DECAY == 1:
            w = tl.exp(G_last - Gc) * beta
            ST = ST * tl.exp(G_last)
        kw = (k.to(tl.float32) * w[:, None]).to(MMA)
        ST += _dot(tl.trans(v.to(MMA)), kw, IEEE)

    if STORE_HT:
        _store_state_block(HT + b * stb + h * sth, offs_k, k_ok, offs_v, v_ok, stf, stv, tl.trans(ST))


@triton.jit
def chunk_heads_kernel(G, BETA, GOUT, BOUT, N, H, N_PAD, sgb, sgn, sgh, sbb, sbn, sbh, floor,
                       BT: tl.constexpr, BH: tl.constexpr, HAS_G: tl.constexpr, HAS_BETA: tl.constexpr):
    """The Gluon forward's G_STAGE inputs in one pass (gluon_forward.chunk_cumulative_heads and chunk_heads
    are its torch references). Program (chunk, batch) reads the chunk's [BT, H] tile of the log decay g
    (B, N, H) (any strides), clamps it at ``floor`` (NaN kept), scales it to log2 units and sums it down
    the chunk's tokens (inclusive), storing it head-major into GOUT (B, H, N_PAD) float32; tokens past N
    count g = 0, so they carry the chunk's last real token's sum (what the kernel's last row must hold).
    beta (B, N, H) goes to BOUT (B, H, N_PAD) float32 the same way, unsummed, 0 past N."""
    c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    t = c * BT + tl.arange(0, BT)  # [BT] tokens
    h = tl.arange(0, BH)  # [BH] heads
    t64 = t.to(tl.int64)
    h64 = h.to(tl.int64)
    inside = (t[:, None] < N) & (h[None, :] < H)  # [BT, BH]
    out = b * H * N_PAD + h64[None, :] * N_PAD + t64[:, None]  # [BT, BH] offsets into (B, H, N_PAD)
    head_ok = (h[None, :] < H) & (t[:, None] < N_PAD)
    if HAS_G:
        g = tl.load(G + b * sgb + t64[:, None] * sgn + h64[None, :] * sgh, mask=inside, other=0.0).to(tl.float32)
        g = tl.where(g < floor, floor, g) * 1.4426950408889634  # NaN stays NaN
        tl.store(GOUT + out, tl.cumsum(g, axis=0), mask=head_ok)
    if HAS_BETA:
        beta = tl.load(BETA + b * sbb + t64[:, None] * sbn + h64[None, :] * sbh, mask=inside, other=0.0)
        tl.store(BOUT + out, beta.to(tl.float32), mask=head_ok)


@triton.jit
def chunk_scores_kernel(Q, K, CB, N, HQK, N_PAD, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                        BT: tl.constexpr, DK: tl.constexpr):
    """Mamba-2's C B^T once a q/k head: program (chunk, batch * q/k head) stores the chunk's [BT, BT] scores
    K Q^T (row j a key token, column i a query token; float32 accumulation) at rows c BT .. c BT + BT - 1 of
    CB (B, HQK, N_PAD, BT) in CB's dtype, zeros where a token is past N. The Gluon forward's Mamba-2 step
    (gluon_forward.compute_transposed) reads them from its stage instead of making them in each consumer."""
    c = tl.program_id(0)
    bg = tl.program_id(1)
    b = (bg // HQK).to(tl.int64)
    g = (bg % HQK).to(tl.int64)
    t = c * BT + tl.arange(0, BT)
    d = tl.arange(0, DK)
    t64 = t.to(tl.int64)
    ok = (t < N)[:, None]
    k = tl.load(K + b * skb + g * skh + t64[:, None] * skn + d[None, :] * skd, mask=ok, other=0.0)
    q = tl.load(Q + b * sqb + g * sqh + t64[:, None] * sqn + d[None, :] * sqd, mask=ok, other=0.0)
    s = tl.dot(k, tl.trans(q))
    i = tl.arange(0, BT)
    tl.store(CB + (bg.to(tl.int64) * N_PAD + t64[:, None]) * BT + i[None, :], s.to(CB.dtype.element_ty))


def chunk_scores(q: torch.Tensor, k: torch.Tensor, chunk: int, out_dtype=torch.float32, out=None) -> torch.Tensor:
    """chunk_scores_kernel's CB (B, Hqk, N_pad, chunk) of q, k (B, N, Hqk, Dk) (any strides); ``out``: a contiguous
    buffer of that shape and ``out_dtype`` to write."""
    B, N, Hqk, Dk = q.shape
    n_pad = cdiv(N, chunk) * chunk
    cb = torch.empty(B, Hqk, n_pad, chunk, dtype=out_dtype, device=q.device) if out is None else out
    chunk_scores_kernel[(n_pad // chunk, B * Hqk)](q, k, cb, N, Hqk, n_pad, *q.stride(), *k.stride(), BT=chunk,
                                                   DK=Dk, num_warps=4)
    return cb


# --------------------------------------------------------------------------------------------
# Hedgehog's feature map in one pass: [softmax(x W_h), softmax(-x W_h)] for a block of tokens of one
# head, read once in the input's dtype and written once in it, in place of torch's map (a float32 einsum, two
# softmaxes, a concatenation, a cast: ~6 passes over (.., Hqk, F) float32 tensors, most of Hedgehog's forward there).
# configs.HEDGEHOG_FUSED_MAP (on; its figures: notes/linear_attention, decisions 67 and 90)


@triton.jit
def dot_tf32x2(a, b, acc):
    """acc + a @ b to float32's accuracy where a is exact in tf32 (a 16-bit input's values, widened): b as its tf32
    head (the low 13 mantissa bits cleared, as the tensor cores read a float32) plus the rest, two tf32 tensor-core
    products; tf32x3's third (a's rest times b's head) is zero there. The map kernels' PREC "tf32x2"."""
    b_hi = (b.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    acc = tl.dot(a, b_hi, acc, input_precision="tf32")
    return tl.dot(a, b - b_hi, acc, input_precision="tf32")


@triton.jit
def hedgehog_map_kernel(X, W, OUT, R, sxr, sxh, sxd, swh, swd, swf, sor, soh, sof,
                        DK: tl.constexpr, F: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, BF: tl.constexpr,
                        PREC: tl.constexpr = "ieee"):
    """Program (block of BR tokens, head h): OUT[r, h, :F] = softmax(x_r W_h), OUT[r, h, F:] = softmax(-x_r W_h),
    x (R, Hqk, DK) and OUT (R, Hqk, 2F) any strides (64-bit row offsets), W (Hqk, DK, F); float32 math (an IEEE
    dot, as torch's float32 einsum; PREC "tf32x2": dot_tf32x2, for x in 16 bits), the result in OUT's dtype. Grid:
    (cdiv(R, BR), Hqk)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    h = tl.program_id(1).to(tl.int64)
    r_ok = rows < R
    d = tl.arange(0, BD)
    f = tl.arange(0, BF)
    d_ok, f_ok = d < DK, f < F
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * sxr + h * sxh + d[None, :] * sxd, mask=r_ok[:, None] & d_ok[None, :],
                other=0.0).to(tl.float32)
    w = tl.load(W + h * swh + d[:, None] * swd + f[None, :] * swf, mask=d_ok[:, None] & f_ok[None, :],
                other=0.0).to(tl.float32)
    if PREC == "tf32x2":
        proj = dot_tf32x2(x, w, tl.zeros([BR, BF], dtype=tl.float32))
    else:
        proj = tl.dot(x, w, input_precision=PREC)
    pos = tl.where(f_ok[None, :], proj, float("-inf"))
    neg = tl.where(f_ok[None, :], -proj, float("-inf"))
    pos = tl.exp(pos - tl.max(pos, 1)[:, None])
    neg = tl.exp(neg - tl.max(neg, 1)[:, None])
    pos = pos / tl.sum(pos, 1)[:, None]
    neg = neg / tl.sum(neg, 1)[:, None]
    out = OUT + rows64[:, None] * sor + h * soh + f[None, :] * sof
    mask = r_ok[:, None] & f_ok[None, :]
    tl.store(out, pos.to(OUT.dtype.element_ty), mask=mask)
    tl.store(out + F * sof, neg.to(OUT.dtype.element_ty), mask=mask)


def map_precision(precision: str, x) -> str:
    """The map kernels' PREC for ``precision``: "tf32x2" (dot_tf32x2: tf32x3's accuracy in two products where x is
    one operand) in place of "tf32x3" for 16-bit x where configs.HEDGEHOG_MAP_EXACT_X says, else ``precision``."""
    from tilecore.ops.linear_attention import configs

    return "tf32x2" if precision == "tf32x3" and x.element_size() == 2 and configs.HEDGEHOG_MAP_EXACT_X else precision


def hedgehog_map_fused(x, weight, out_dtype=None, precision: str = "ieee", rows: int = 64, warps: int = 4,
                       launch=None):
    """op.hedgehog_map by hedgehog_map_kernel: x (..., Hqk, Dk), weight (Hqk, Dk, F) -> (..., Hqk, 2F) in x's dtype
    (or ``out_dtype``: Triton's interpreter truncates float32 to bf16, so its tests take float32 and round by torch).
    ``precision``: the projection's dot, "ieee" (float32 FMAs) or "tf32x3" (three tf32 tensor-core products: float32's
    accuracy but for the lo x lo term; sm_90a at Dk 64, F 32 106 registers against ieee's 64, Dk 128, F 64 186 / 0
    spilled; map_precision may take "tf32x2" for it). No gradient (op._HedgehogMap pairs it with
    hedgehog_map_backward). ``launch(grid, args, options)``: the launch (None: ``hedgehog_map_kernel[grid]``; op.py
    hands a CachedLaunch's keyed run)."""
    Hqk, Dk = x.shape[-2], x.shape[-1]
    F = weight.shape[-1]
    x3 = x.reshape(-1, Hqk, Dk)
    out = torch.empty(*x.shape[:-1], 2 * F, dtype=out_dtype or x.dtype, device=x.device)
    o3 = out.view(-1, Hqk, 2 * F)
    R = x3.shape[0]
    if R == 0:
        return out
    bd, bf = max(16, next_power_of_2(Dk)), max(16, next_power_of_2(F))  # (host ints: not triton's, ~2 us a call)
    grid, args = (cdiv(R, rows), Hqk), (x3, weight, o3, R, *x3.stride(), *weight.stride(), *o3.stride())
    options = dict(DK=Dk, F=F, BR=rows, BD=bd, BF=bf, PREC=map_precision(precision, x), num_warps=warps)
    if launch is None:
        hedgehog_map_kernel[grid](*args, **options)
    else:
        launch(grid, args, options)
    return out


# The map's backward in one pass: the autograd path's torch map (float32 einsum, two softmaxes, the
# concatenation and the cast, each with its backward) took most of Hedgehog's 11.3 ms backward on the H100
# (the kernels' backward on the features is ~1-2 ms). The forward is recomputed from x (nothing but x and W saved).


@triton.jit
def hedgehog_map_bwd_kernel(X, W, DOUT, DX, DWP, R, ROWS_PER, sxr, sxh, sxd, swh, swd, swf, sdr, sdh, sdf,
                            sgr, sgh, sgd, DK: tl.constexpr, F: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
                            BF: tl.constexpr, PREC: tl.constexpr = "ieee"):
    """Program (p, head h) takes rows [p ROWS_PER, (p + 1) ROWS_PER) of x (R, Hqk, DK) in blocks of BR: with
    proj = x W_h (float32, an IEEE dot), a = softmax(proj), b = softmax(-proj) and the output's gradient (da, db)
    (DOUT (R, Hqk, 2F): da its first F columns), dproj = a (da - <a, da>) - b (db - <b, db>); DX (R, Hqk, DK) gets
    dproj W_h^T in its dtype, and DWP[p, h] (P, Hqk, BD, BF) float32 the program's sum of x^T dproj (summed over p by
    the caller: deterministic). Any strides of x, DOUT, DX (64-bit row offsets). Grid: (P, Hqk)."""
    p = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BD)
    f = tl.arange(0, BF)
    d_ok, f_ok = d < DK, f < F
    w = tl.load(W + h * swh + d[:, None] * swd + f[None, :] * swf, mask=d_ok[:, None] & f_ok[None, :],
                other=0.0).to(tl.float32)
    dw = tl.zeros([BD, BF], dtype=tl.float32)
    start = p * ROWS_PER
    for r0 in range(start, tl.minimum(start + ROWS_PER, R), BR):
        rows = r0 + tl.arange(0, BR)
        r_ok = (rows < R) & (rows < start + ROWS_PER)
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * sxr + h * sxh + d[None, :] * sxd, mask=r_ok[:, None] & d_ok[None, :],
                    other=0.0).to(tl.float32)
        if PREC == "tf32x2":  # (x exact in tf32: two products; dx's operands are not, so tf32x3 there)
            proj = dot_tf32x2(x, w, tl.zeros([BR, BF], dtype=tl.float32))
        else:
            proj = tl.dot(x, w, input_precision=PREC)
        pos = tl.where(f_ok[None, :], proj, float("-inf"))
        neg = tl.where(f_ok[None, :], -proj, float("-inf"))
        pos = tl.exp(pos - tl.max(pos, 1)[:, None])
        neg = tl.exp(neg - tl.max(neg, 1)[:, None])
        pos = pos / tl.sum(pos, 1)[:, None]
        neg = neg / tl.sum(neg, 1)[:, None]
        mask = r_ok[:, None] & f_ok[None, :]
        dout = DOUT + rows64[:, None] * sdr + h * sdh + f[None, :] * sdf
        da = tl.load(dout, mask=mask, other=0.0).to(tl.float32)
        db = tl.load(dout + F * sdf, mask=mask, other=0.0).to(tl.float32)
        dproj = pos * (da - tl.sum(pos * da, 1)[:, None]) - neg * (db - tl.sum(neg * db, 1)[:, None])
        dproj = tl.where(mask, dproj, 0.0)
        dx = tl.dot(dproj, tl.trans(w), input_precision="tf32x3" if PREC == "tf32x2" else PREC)
        tl.store(DX + rows64[:, None] * sgr + h * sgh + d[None, :] * sgd, dx.to(DX.dtype.element_ty),
                 mask=r_ok[:, None] & d_ok[None, :])
        if PREC == "tf32x2":
            dw = dot_tf32x2(tl.trans(x), dproj, dw)
        else:
            dw += tl.dot(tl.trans(x), dproj, input_precision=PREC)
    H = tl.num_programs(1)
    tl.store(DWP + ((p * H + h) * BD + d[:, None]) * BF + f[None, :], dw)


def hedgehog_map_backward(x, weight, dout, programs: int | None = None, dx_dtype=None, rows: int = 32,
                          warps: int = 4, precision: str = "ieee", launch=None):
    """(dx, dW) of hedgehog_map_fused's output against ``dout`` (..., Hqk, 2F) by hedgehog_map_bwd_kernel: dx in x's
    dtype (or ``dx_dtype``: the interpreter's bf16 rounding, as hedgehog_map_fused's out_dtype), dW (Hqk, Dk, F)
    float32. ``programs``: row ranges a head (default: ~512 programs over the heads, ~4 an SM of an H100, at most one
    a block of rows; each writes one [Dk, F] float32 partial of dW). ``rows`` a block, ``warps``: 32 / 4 compile for
    sm_90a at Dk 64, F 32 in 118 registers, 0 spilled (64 / 4: 255 and 388 B spilled; 64 / 8: 181, 0); with
    ``precision`` "tf32x3" (the three dots on tensor cores) 165 registers, 0 spilled (map_precision may take "tf32x2"
    for it). ``launch``: as hedgehog_map_fused's."""
    Hqk, Dk = x.shape[-2], x.shape[-1]
    F = weight.shape[-1]
    x3 = x.reshape(-1, Hqk, Dk)
    d3 = dout.reshape(-1, Hqk, 2 * F)
    R = x3.shape[0]
    dx = torch.empty(*x.shape, dtype=dx_dtype or x.dtype, device=x.device)
    g3 = dx.view(-1, Hqk, Dk)
    BR = rows
    bd, bf = max(16, next_power_of_2(Dk)), max(16, next_power_of_2(F))
    if R == 0:
        return dx, torch.zeros(Hqk, Dk, F, dtype=torch.float32, device=x.device)
    P = programs or max(1, min(cdiv(R, BR), cdiv(512, Hqk)))
    rows_per = cdiv(cdiv(R, P), BR) * BR
    P = cdiv(R, rows_per)
    dwp = torch.empty(P, Hqk, bd, bf, dtype=torch.float32, device=x.device)
    args = (x3, weight, d3, g3, dwp, R, rows_per, *x3.stride(), *weight.stride(), *d3.stride(), *g3.stride())
    options = dict(DK=Dk, F=F, BR=BR, BD=bd, BF=bf, PREC=map_precision(precision, x), num_warps=warps)
    if launch is None:
        hedgehog_map_bwd_kernel[(P, Hqk)](*args, **options)
    else:
        launch((P, Hqk), args, options)
    return dx, dwp.sum(0)[:, :Dk, :F]

"""The backward's combine pass as one kernel (was torch passes in launch.backward_combine): the dK/dV
kernel's partial sums, the diagonal's factor r added back, beta's and the log decay's gradients (the
reverse cumulative sum along the sequence included), one read of each buffer and one write of each
gradient.

Layout as kernels_tl.py's: q, k (B, N, Hqk, Dk) (head h reads h // GROUP), v (B, N, H, Dv), log decay
g (B, N, H) or (B, N, H, Dk), beta (B, N, H), states (B, H, Dk, Dv), any strides. The kernels' buffers
are contiguous float32: DQ (B, N, H, Dk) (per v head), DK_PART (NV, B, N, H, Dk), DV_PART (NK, B, N,
H, Dv), R (B, N, H). Outputs contiguous float32: dq, dk (B, N, H, Dk) per v head (the caller sums a q
head's group), dv (B, N, H, Dv), dg like g, dbeta (B, N, H).

The log decay's gradient (launch.decay_grad says why): dG_t = q_t . dq_t - k_t . dk_t (per channel,
or summed over them for a scalar decay) with dq and dk without the diagonal, plus <dS_N, S_N> at the
last token, and dg_t = sum_{s >= t} dG_s: a program walks its head's tokens from the last, a block of
BT at a time, with the sum so far carried; 0 where the floor clamped g.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.ops.linear_attention.kernels_tl import LOG_DECAY_FLOOR


@triton.jit
def la_bwd_combine_kernel(Q, K, V, G, BETA, HT, DHT, DQ, DK_PART, DV_PART, R,
                          DQ_OUT, DK_OUT, DV_OUT, DG, DBETA,
                          sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd,
                          sgb, sgn, sgh, sgd, sbb, sbn, sbh, stb, sth, stf, stv, s_hb, s_hh, s_hf, s_hv, s_kp, s_vp,
                          N, H, GROUP, DK, DV, NV, NK,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          DECAY: tl.constexpr, STRICT: tl.constexpr, HAS_BETA: tl.constexpr,
                          HAS_DHT: tl.constexpr, KBLOCKS=1, VBLOCKS=1):
    """Program (batch * head, part): part 0 walks the head's tokens from the last and writes dk, and
    where STRICT (dq and dk came without the diagonal) dq and dg; part 1 writes dv and dbeta (any order).
    Without STRICT, dq is the kernels' DQ as it is (not read here). Every channel of the head in one block (BK >= Dk, BV >=
    Dv). Grid: (B * H * 2,).
    KBLOCKS, VBLOCKS (per-channel decay or none: no sum over channels; kernels_backward_gla's split path): part 0 by
    KBLOCKS programs of BK key channels, part 1 by VBLOCKS programs of BV value columns (0: none, dv needing no
    combine); grid (B * H * (KBLOCKS + VBLOCKS),), a head's part-0 blocks first."""
    per = KBLOCKS + VBLOCKS
    bh = tl.program_id(0) // per
    j = tl.program_id(0) % per
    part = (j >= KBLOCKS).to(tl.int32)
    kblock = tl.minimum(j, KBLOCKS - 1)
    vblock = tl.maximum(j - KBLOCKS, 0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    offs_t = tl.arange(0, BT)
    row = (b * N * H + h)  # row t of head (b, h) in a contiguous (B, N, H, .) buffer: (b N + t) H + h
    nblocks = tl.cdiv(N, BT)
    if part == 0:
        offs_k = kblock * BK + tl.arange(0, BK)
        k_ok = offs_k < DK
        carry_c = tl.zeros([BK], dtype=tl.float32)  # per channel (DECAY == 2)
        carry_s = tl.sum(carry_c, 0)  # scalar decay
        if DECAY != 0:
            last = tl.zeros([BK], dtype=tl.float32)  # <dS_N, S_N> per key channel
            if HAS_DHT:
                for v0 in range(0, DV, BV):
                    offs_v = v0 + tl.arange(0, BV)
                    ok = k_ok[:, None] & (offs_v < DV)[None, :]
                    ht = tl.load(HT + b * stb + h * sth + offs_k[:, None] * stf + offs_v[None, :] * stv, mask=ok,
                                 other=0.0)
                    dht = tl.load(DHT + b * s_hb + h * s_hh + offs_k[:, None] * s_hf + offs_v[None, :] * s_hv,
                                  mask=ok, other=0.0)
                    last += tl.sum(ht.to(tl.float32) * dht.to(tl.float32), 1)
        for i in range(0, nblocks):
            t = (nblocks - 1 - i) * BT + offs_t
            t_ok = t < N
            ok = t_ok[:, None] & k_ok[None, :]
            rows = (row + t.to(tl.int64) * H)[:, None] * DK + offs_k[None, :]
            dk = tl.zeros([BT, BK], dtype=tl.float32)
            for p in range(0, NV):
                dk += tl.load(DK_PART + tl.cast(p, tl.int64) * s_kp + rows, mask=ok, other=0.0)
            beta = tl.full([BT], 1.0, dtype=tl.float32)
            if HAS_BETA:
                beta = tl.load(BETA + b * sbb + h * sbh + t.to(tl.int64) * sbn, mask=t_ok, other=0.0).to(tl.float32)
            if STRICT:
                q = tl.load(Q + b * sqb + hk * sqh + t.to(tl.int64)[:, None] * sqn + offs_k[None, :] * sqd, mask=ok,
                            other=0.0).to(tl.float32)
                k = tl.load(K + b * skb + hk * skh + t.to(tl.int64)[:, None] * skn + offs_k[None, :] * skd, mask=ok,
                            other=0.0).to(tl.float32)
                dq = tl.load(DQ + rows, mask=ok, other=0.0)
                dG = q * dq - k * (dk * beta[:, None])  # [BT, BK]: without the diagonal
                r = tl.load(R + row + t.to(tl.int64) * H, mask=t_ok, other=0.0)
                dq += (beta * r)[:, None] * k  # the diagonal: beta_t r_t k_t, r_t q_t
                dk += r[:, None] * q
                tl.store(DQ_OUT + rows, dq, mask=ok)
                if DECAY == 2:
                    dG = tl.where((t == N - 1)[:, None], dG + last[None, :], dG)
                    dg = tl.cumsum(dG, 0, reverse=True) + carry_c[None, :]
                    carry_c += tl.sum(dG, 0)
                    gp = G + b * sgb + h * sgh + t.to(tl.int64)[:, None] * sgn + offs_k[None, :] * sgd
                    g = tl.load(gp, mask=ok, other=0.0)
                    dg = tl.where(g < LOG_DECAY_FLOOR, 0.0, dg)
                    tl.store(DG + rows, dg, mask=ok)
                else:
                    dGs = tl.sum(dG, 1) + tl.where(t == N - 1, tl.sum(last, 0), 0.0)  # [BT]
                    dg = tl.cumsum(dGs, 0, reverse=True) + carry_s
                    carry_s += tl.sum(dGs, 0)
                    g = tl.load(G + b * sgb + h * sgh + t.to(tl.int64) * sgn, mask=t_ok, other=0.0)
                    dg = tl.where(g < LOG_DECAY_FLOOR, 0.0, dg)
                    tl.store(DG + row + t.to(tl.int64) * H, dg, mask=t_ok)
            tl.store(DK_OUT + rows, dk * beta[:, None], mask=ok)
    else:
        offs_v = vblock * BV + tl.arange(0, BV)
        v_ok = offs_v < DV
        for i in range(0, nblocks):
            t = i * BT + offs_t
            t_ok = t < N
            ok = t_ok[:, None] & v_ok[None, :]
            rows = (row + t.to(tl.int64) * H)[:, None] * DV + offs_v[None, :]
            dv = tl.zeros([BT, BV], dtype=tl.float32)
            for p in range(0, NK):
                dv += tl.load(DV_PART + tl.cast(p, tl.int64) * s_vp + rows, mask=ok, other=0.0)
            if HAS_BETA:
                beta = tl.load(BETA + b * sbb + h * sbh + t.to(tl.int64) * sbn, mask=t_ok, other=0.0).to(tl.float32)
                v = tl.load(V + b * svb + h * svh + t.to(tl.int64)[:, None] * svn + offs_v[None, :] * svd, mask=ok,
                            other=0.0).to(tl.float32)
                tl.store(DBETA + row + t.to(tl.int64) * H, tl.sum(v * dv, 1), mask=t_ok)
                dv = dv * beta[:, None]
            tl.store(DV_OUT + rows, dv, mask=ok)

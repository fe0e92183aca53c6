"""Where the chunked forward's time goes: a stripped copy of the scalar-decay forward (phi(x) = x,
contiguous (B, N, H, D) tensors, Dk = BK, Dv a multiple of BV) whose MODE keeps only part of the work.

    MODE 0: loads of q, k, v, g and the store of o (the walk's streaming floor)
    MODE 1: + the intra-chunk part (Q K^T, decay, P V), no state
    MODE 2: + the inter-chunk product exp(G) (Q S) with S fixed (read once from S0)
    MODE 3: + the state update S <- exp(G_last) S + (K exp(G_last - G))^T V (the whole forward)

Used by gpu_forward.py (probe phase); never by the library.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def probe_fwd_kernel(Q, K, V, G, O, S0, N, H, scale, VBLOCKS, s_qn, s_vn,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DV: tl.constexpr, MODE: tl.constexpr):
    # program (batch * head, value block); q, k [B, N, H, BK], v, o [B, N, H, DV], g [B, N, H], S0 [BK, DV]
    bh = tl.program_id(0) // VBLOCKS
    vblock = tl.program_id(0) % VBLOCKS
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = vblock * BV + tl.arange(0, BV)
    causal = offs_t[:, None] >= offs_t[None, :]
    q_base = Q + b * N * s_qn + h * BK
    k_base = K + b * N * s_qn + h * BK
    v_base = V + b * N * s_vn + h * DV
    o_base = O + b * N * s_vn + h * DV
    g_base = G + b * N * H + h
    S = tl.load(S0 + offs_k[:, None] * DV + offs_v[None, :])  # [BK, BV] float32
    for t0 in range(0, N, BT):
        rows = t0 + offs_t
        ok = (rows < N)[:, None]
        rows64 = rows.to(tl.int64)
        q = tl.load(q_base + rows64[:, None] * s_qn + offs_k[None, :], mask=ok, other=0.0)  # [BT, BK]
        k = tl.load(k_base + rows64[:, None] * s_qn + offs_k[None, :], mask=ok, other=0.0)  # [BT, BK]
        v = tl.load(v_base + rows64[:, None] * s_vn + offs_v[None, :], mask=ok, other=0.0)  # [BT, BV]
        g = tl.load(g_base + rows64 * H, mask=rows < N, other=0.0)  # [BT]
        Gc = tl.cumsum(g, 0)
        G_last = tl.sum(tl.where(offs_t == BT - 1, Gc, 0.0), 0)
        if MODE == 0:
            o = v.to(tl.float32) + 1e-30 * (tl.sum(q.to(tl.float32), 1) + tl.sum(k.to(tl.float32), 1) + Gc)[:, None]
        else:
            s = tl.dot(q, tl.trans(k)) * scale
            s = s * tl.exp(tl.where(causal, Gc[:, None] - Gc[None, :], float("-inf")))
            p = tl.where(causal, s, 0.0)
            o = tl.dot(p.to(v.dtype), v)
            if MODE >= 2:
                o += tl.dot(q, S.to(q.dtype)) * (scale * tl.exp(Gc))[:, None]
            if MODE == 3:
                w = tl.exp(G_last - Gc)
                S = S * tl.exp(G_last) + tl.dot(tl.trans((k.to(tl.float32) * w[:, None]).to(v.dtype)), v)
        tl.store(o_base + rows64[:, None] * s_vn + offs_v[None, :], o.to(O.dtype.element_ty), mask=ok)


def probe_forward(q, k, v, g, s0, mode: int, BT: int, BV: int, num_warps: int, num_stages: int):
    """o of the probe (see the module's docstring) for contiguous q, k (B, N, H, Dk), v (B, N, H, Dv),
    g (B, N, H) float32, s0 (Dk, Dv) float32."""
    import torch

    B, N, H, Dk = q.shape
    Dv = v.shape[-1]
    o = torch.empty_like(v)
    vblocks = Dv // BV
    probe_fwd_kernel[(B * H * vblocks,)](q, k, v, g, o, s0, N, H, Dk ** -0.5, vblocks, H * Dk, H * Dv,
                                         BT=BT, BK=Dk, BV=BV, DV=Dv, MODE=mode, num_warps=num_warps,
                                         num_stages=num_stages)
    return o

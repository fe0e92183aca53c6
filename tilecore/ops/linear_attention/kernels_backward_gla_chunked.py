"""GLA's backward in the chunk-parallel form (issue 33): two state walks that do nothing else, then
every chunk's gradients at once, as flash-linear-attention's chunk_gla structures it (its code not used).

Per-channel log decay g (B, N, H, Dk), phi(x) = x, no beta, q/k heads = v heads. Chunks of BT tokens; G the
chunk's inclusive cumulative log decay (clamped at the -100 floor, counted from the chunk's start), G_last its
last row; S_c the state entering chunk c, dS_c the gradient of the state leaving it (dS_{NT-1} = dht).

    states   (B H x value blocks, a forward walk):  HS[c] = S_c;  S <- e^G_last S + (k e^(G_last - G))^T v
    dstates  (B H x value blocks, a reverse walk):  DHS[c] = dS_c;  dS <- e^G_last dS + scale (q e^G)^T do;
             dh0 = the last dS
    dqk      (B H x chunks x key blocks):  a = strict(do v^T);  dq = scale (intra(a, k) + (do S_c^T) e^G);
             dk = scale intra^T(a, q) + (v dS_c^T) e^(G_last - G);  dG = q dq - k dk (per channel, without
             the diagonal) -> its reverse cumulative sum within the chunk into DG and its chunk total into TOT;
             then the diagonal r_t = scale do_t . v_t: dq += r k, dk += r q, stored in the inputs' dtypes
    dv       (B H x chunks x value blocks):  dv = scale P^T do + (k e^(G_last - G)) dS_c, P the causal
             intra-chunk scores over every channel, by key blocks of KD
    dg       (B H x key blocks, a reverse walk over chunks):  dg = DG + the later chunks' totals (+ the final
             state's sum_v dht * ht), zero where the floor clamped g
    (dg_fused: none; the dqk kernel stores dg = its chunk's reverse sum + sum_v S_(c+1) dS_c, the
             decay gradient at the next chunk's first token, which sums every later token's part; S_NT = ht)

The intra-chunk terms take one reference a key block (kernels_tl._channel_dq_factored / _channel_dk_factored, and
the scores the same way), the sub-chunk form where the block's span of G is too wide (the forward's rule). The
states are stored in the dot operand dtype (bf16 / fp16: the walk kernels round S to it for their dots anyway),
(B, H, NT, Dk, Dv) each: 537 MB apiece at B16 H16 N4096 d128 bf16. No walk holds more than its state, so no
program carries a chunk's temporaries next to a [64, 128] float32 state (the split kernels' spills: 0.2-2.3 KB).

On (configs_gla_bwd.GLA_BWD_PATH "chunked"; FLA's issue 640: checked on the H100 against float64);
the first blocks (configs_gla_bwd.CHUNKED: chunk 64, key blocks 32, the dqk value loop, dg from the dqk kernel)
6.07 ms at B16 H16 N4096 d128 bf16; then (the value loop at 3 stages, dg's later part from S_c (SUFFIX 3), r from
do v^T's diagonal (LEAN), dG's reverse sum as dots (DOTSCAN), the walks by key blocks of 64): dqk 2.87 ms against 3.24,
the walks 0.70 + 0.69 against 0.84 + 0.83 (notes/linear_attention/README.md, decisions 70-77); then the value
loop by blocks of 64, 5.315 ms composed (decision 78), and the dqk / dv forms behind CHUNKED switches."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tilecore import dispatch
from tilecore.ops.linear_attention import configs_gla_bwd
from tilecore.ops.linear_attention.kernels_tl import (LOG_DECAY_FLOOR, _channel_dk_factored, _channel_dk_loop,
                                                      _channel_dq_factored, _channel_dq_loop,
                                                      _channel_scores_in_registers, _cumulative_channels, _dot,
                                                      _factor_span, _rows, _split_dot, _store_rows)
from tilecore.ops.linear_attention.plan import Plan


@triton.jit
def _state_ptrs(base, bh, c, NT, offs_k, offs_v, DK, DV):
    """[BK, BV] pointers into a (B H, NT, Dk, Dv) contiguous state buffer at chunk c (64-bit offsets)."""
    row = (bh.to(tl.int64) * NT + c) * DK + offs_k.to(tl.int64)
    return base + row[:, None] * DV + offs_v[None, :]


@triton.jit
def gla_states_kernel(K, V, G, H0, HS, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd,
                      s0b, s0h, s0f, s0v, N, H, DK, DV, NT,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                      MMA: tl.constexpr, IEEE: tl.constexpr, NVB: tl.constexpr = 0):
    """Program (batch * head, value block): HS[c] = the state entering chunk c (its BV columns), every chunk.
    Grid (B * H, cdiv(DV, BV)). NVB: the state's rows by key blocks of BK too (each row of S walks on its
    own: its channel's decay, k's column): axis 1 is (key block, value block), NVB value blocks; grid (B * H,
    cdiv(DK, BK) * NVB); 0: one key block (BK >= DK)."""
    vblock, kblock = _walk_blocks(NVB)
    _states_walk(K, V, G, H0, HS, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd, s0b, s0h, s0f, s0v,
                 N, H, DK, DV, NT, tl.program_id(0), vblock, BT, BK, BV, HAS_H0, MMA, IEEE, kblock)


@triton.jit
def _walk_blocks(NVB: tl.constexpr):
    """A walk program's (value block, key block) from axis 1 (gla_states_kernel's NVB)."""
    if NVB == 0:
        vblock = tl.program_id(1)
        kblock = 0
    else:
        vblock = tl.program_id(1) % NVB
        kblock = tl.program_id(1) // NVB
    return vblock, kblock


@triton.jit
def _walk_setup(INIT, s0b, s0h, s0f, s0v, H, DK, DV, bh, vblock, BT: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, HAS_INIT: tl.constexpr, kblock=0):
    """Both walks' blocks: (b, h, offs_t, offs_k, k_ok, offs_v, v_ok, the starting state [BK, BV] float32: INIT's
    (B, H, Dk, Dv) block where HAS_INIT, else zeros)."""
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_t = tl.arange(0, BT)
    offs_k = kblock * BK + tl.arange(0, BK)
    k_ok = offs_k < DK
    offs_v = vblock * BV + tl.arange(0, BV)
    v_ok = offs_v < DV
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_INIT:
        ptrs = INIT + b * s0b + h * s0h + offs_k.to(tl.int64)[:, None] * s0f + offs_v[None, :] * s0v
        S = tl.load(ptrs, mask=k_ok[:, None] & v_ok[None, :], other=0.0)
    return b, h, offs_t, offs_k, k_ok, offs_v, v_ok, S


@triton.jit
def _walk_chunk(X, Y, G, sxb, sxn, sxh, sxd, syb, syn, syh, syd, sgb, sgn, sgh, sgd, b, h, t0, offs_t, offs_k, k_ok,
                offs_v, v_ok, N):
    """A walk's chunk at t0: x [BT, BK] (k or q) float32, y [BT, BV] (v or do) as stored, and G, G_last of g."""
    x = _rows(X + b * sxb + h * sxh, t0, offs_t, offs_k, k_ok, N, sxn, sxd).to(tl.float32)
    y = _rows(Y + b * syb + h * syh, t0, offs_t, offs_v, v_ok, N, syn, syd)
    Gc, G_last = _cumulative_channels(_rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd)
                                      .to(tl.float32))
    return x, y, Gc, G_last


@triton.jit
def _states_walk(K, V, G, H0, HS, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd, s0b, s0h, s0f, s0v,
                 N, H, DK, DV, NT, bh, vblock, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 HAS_H0: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr, kblock=0):
    b, h, offs_t, offs_k, k_ok, offs_v, v_ok, S = _walk_setup(H0, s0b, s0h, s0f, s0v, H, DK, DV, bh, vblock, BT, BK,
                                                              BV, HAS_H0, kblock)
    for c in range(0, NT):
        t0 = c * BT
        tl.store(_state_ptrs(HS, bh, c, NT, offs_k, offs_v, DK, DV), S.to(HS.dtype.element_ty),
                 mask=k_ok[:, None] & v_ok[None, :])
        k, v, Gc, G_last = _walk_chunk(K, V, G, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd, b, h, t0,
                                       offs_t, offs_k, k_ok, offs_v, v_ok, N)
        S = S * tl.exp(G_last)[:, None] + _dot(tl.trans((k * tl.exp(G_last[None, :] - Gc)).to(MMA)), v.to(MMA), IEEE)


@triton.jit
def gla_dstates_kernel(Q, G, DO, DHT, DH0, DHS, sqb, sqn, sqh, sqd, sgb, sgn, sgh, sgd, sob, son, soh, sod,
                       stb, sth, stf, stv, s0b, s0h, s0f, s0v, N, H, DK, DV, NT, scale,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr,
                       STORE_DH0: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr, NVB: tl.constexpr = 0):
    """Program (batch * head, value block): DHS[c] = the gradient of the state leaving chunk c, every chunk, by a
    reverse walk from DHT; DH0 (float32) the initial state's. Grid (B * H, cdiv(DV, BV)); NVB as gla_states_kernel's
    (the rows of dS walk apart too)."""
    vblock, kblock = _walk_blocks(NVB)
    _dstates_walk(Q, G, DO, DHT, DH0, DHS, sqb, sqn, sqh, sqd, sgb, sgn, sgh, sgd, sob, son, soh, sod,
                  stb, sth, stf, stv, s0b, s0h, s0f, s0v, N, H, DK, DV, NT, scale, tl.program_id(0), vblock,
                  BT, BK, BV, HAS_DHT, STORE_DH0, MMA, IEEE, kblock)


@triton.jit
def _dstates_walk(Q, G, DO, DHT, DH0, DHS, sqb, sqn, sqh, sqd, sgb, sgn, sgh, sgd, sob, son, soh, sod,
                  stb, sth, stf, stv, s0b, s0h, s0f, s0v, N, H, DK, DV, NT, scale, bh, vblock,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr,
                  STORE_DH0: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr, kblock=0):
    b, h, offs_t, offs_k, k_ok, offs_v, v_ok, dS = _walk_setup(DHT, stb, sth, stf, stv, H, DK, DV, bh, vblock, BT, BK,
                                                               BV, HAS_DHT, kblock)
    for i in range(0, NT):
        c = NT - 1 - i
        t0 = c * BT
        tl.store(_state_ptrs(DHS, bh, c, NT, offs_k, offs_v, DK, DV), dS.to(DHS.dtype.element_ty),
                 mask=k_ok[:, None] & v_ok[None, :])
        q, do, Gc, G_last = _walk_chunk(Q, DO, G, sqb, sqn, sqh, sqd, sob, son, soh, sod, sgb, sgn, sgh, sgd, b, h, t0,
                                        offs_t, offs_k, k_ok, offs_v, v_ok, N)
        dS = dS * tl.exp(G_last)[:, None] + _dot(tl.trans((q * (tl.exp(Gc) * scale)).to(MMA)), do.to(MMA), IEEE)
    if STORE_DH0:
        ptrs = DH0 + b * s0b + h * s0h + offs_k.to(tl.int64)[:, None] * s0f + offs_v[None, :] * s0v
        tl.store(ptrs, dS, mask=k_ok[:, None] & v_ok[None, :])


@triton.jit
def gla_walks_kernel(Q, K, V, G, DO, H0, DHT, DH0, HS, DHS, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                     svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, s0b, s0h, s0f, s0v,
                     stb, sth, stf, stv, sdb, sdh, sdf, sdv, N, H, DK, DV, NT, scale,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                     HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr):
    """Both walks in one launch (each alone keeps B H x value-block programs, 512 at B16 H16 Dv 128: one launch puts
    twice as many on the SMs at once): axis 2 is 0 for the states walk, 1 for the state gradients'. Grid (B * H,
    cdiv(DV, BV), 2)."""
    if tl.program_id(2) == 0:
        _states_walk(K, V, G, H0, HS, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd, s0b, s0h, s0f, s0v,
                     N, H, DK, DV, NT, tl.program_id(0), tl.program_id(1), BT, BK, BV, HAS_H0, MMA, IEEE)
    else:
        _dstates_walk(Q, G, DO, DHT, DH0, DHS, sqb, sqn, sqh, sqd, sgb, sgn, sgh, sgd, sob, son, soh, sod,
                      stb, sth, stf, stv, sdb, sdh, sdf, sdv, N, H, DK, DV, NT, scale, tl.program_id(0),
                      tl.program_id(1), BT, BK, BV, HAS_DHT, STORE_DH0, MMA, IEEE)


@triton.jit
def _dq_intra(a, kq, G, MMA: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, INTRA: tl.constexpr):
    """sum_j a_ij k_jd e^(G_id - G_jd): INTRA 0 by the block's span (kernels_tl._channel_dq_factored), 1 factored
    (the caller knows the span allows it), 2 the sub-chunk form (kernels_tl._channel_dq_loop)."""
    if INTRA == 0:
        dq = _channel_dq_factored(a, kq, G, MMA, IEEE, SPLIT)
    elif INTRA == 1:
        mid = 0.5 * (tl.max(G, 0) + tl.min(G, 0))
        dq = tl.exp(G - mid[None, :]) * _split_dot(a, kq.to(tl.float32) * tl.exp(mid[None, :] - G), MMA, IEEE, SPLIT)
    else:
        dq = _channel_dq_loop(a, kq, G, MMA, IEEE)
    return dq


@triton.jit
def _dk_intra(a, qb, G, MMA: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, INTRA: tl.constexpr):
    """sum_i a_ij q_id e^(G_id - G_jd), as _dq_intra."""
    if INTRA == 0:
        dk = _channel_dk_factored(a, qb, G, MMA, IEEE, SPLIT)
    elif INTRA == 1:
        mid = 0.5 * (tl.max(G, 0) + tl.min(G, 0))
        dk = tl.exp(mid[None, :] - G) * _split_dot(tl.trans(a), qb.to(tl.float32) * tl.exp(G - mid[None, :]), MMA,
                                                    IEEE, SPLIT)
    else:
        dk = _channel_dk_loop(a, qb, G, MMA, IEEE)
    return dk


@triton.jit
def _scan_dot(M, x, PIECES: tl.constexpr):
    """M @ x for a 0/1 float32 M [BT, BT] (a triangle of ones: a cumulative sum) and float32 x [BT, C]: PIECES 3 on
    bf16 tensor cores, x as three bf16 pieces (hi, mid, lo: 24 bits of its mantissa), M exact in bf16, float32 sums
    (the GPU); else one float32 dot (ieee; the interpreter, whose bf16 dot is wrong)."""
    if PIECES != 3:
        return _dot(M, x, True)
    Mh = M.to(tl.bfloat16)
    hi = x.to(tl.bfloat16)
    r1 = x - hi.to(tl.float32)
    mid = r1.to(tl.bfloat16)
    lo = (r1 - mid.to(tl.float32)).to(tl.bfloat16)
    return tl.dot(Mh, lo, tl.dot(Mh, mid, tl.dot(Mh, hi)))


@triton.jit
def _state_term(x, s, MMA: tl.constexpr, IEEE: tl.constexpr, VB: tl.constexpr):
    """x s^T [BT, BKB] float32 from x [BT, BVF] and a state's s [BKB, BVF] (VB 0); else s itself, the value loop's
    sum of it."""
    if VB == 0:
        out = _dot(x.to(MMA), tl.trans(s), IEEE)
    else:
        out = s
    return out


@triton.jit
def _dqk_value_loop(V, DO, HS, DHS, svb, svn, svh, svd, sob, son, soh, sod, b, h, bh, c, t0, offs_t, offs_k, k_ok, N,
                    DK, DV, NT, BT: tl.constexpr, BKB: tl.constexpr, BVF: tl.constexpr, VB: tl.constexpr,
                    MMA: tl.constexpr, IEEE: tl.constexpr, PART: tl.constexpr, HT=0, SUFFIX: tl.constexpr = 0,
                    START: tl.constexpr = 0, a=None, r=None, dqs=None, dks=None, sfx=None, LEAN: tl.constexpr = False,
                    DYN: tl.constexpr = False):
    """The dqk program's sums over value columns by blocks of VB: (do v^T [BT, BT] unmasked, do . v [BT] unscaled,
    do S_c^T and v dS_c^T [BT, BKB]; float32; the state terms only where PART needs them, zeros else; and with
    SUFFIX, sum_v S_(c+1) dS_c [BKB] float32: the decay gradient's part from every later token (see
    gla_dqk_kernel), S_NT the final state HT ((B H, Dk, Dv) float32 contiguous; SUFFIX 2: none, zeros)).
    START (EARLY's): the value columns from START on, added to the sums a, r, dqs, dks, sfx given (the
    caller's, of the columns before START); 0: from zeros. LEAN: no do . v (r stays as given: the caller
    takes it from a's diagonal). DYN (CHUNKED dqk_dyn): the loop's bound is Dv at run time, not the
    constexpr BVF, so one value block stays a loop (one trip through Triton's cp.async pipeline) and is not folded into
    straight-line code (the build the H100 got wrong at d 64, decision 84); at any Dv the same code as at d 128."""
    if START == 0:
        a = tl.zeros([BT, BT], dtype=tl.float32)
        r = tl.zeros([BT], dtype=tl.float32)
        dqs = tl.zeros([BT, BKB], dtype=tl.float32)
        dks = tl.zeros([BT, BKB], dtype=tl.float32)
        sfx = tl.zeros([BKB], dtype=tl.float32)
    if DYN:
        stop = DV
    else:
        stop = BVF
    for v0 in range(START, stop, VB):
        offs_v = v0 + tl.arange(0, VB)
        v_ok = offs_v < DV
        v = _rows(V + b * svb + h * svh, t0, offs_t, offs_v, v_ok, N, svn, svd)  # [BT, VB]
        do = _rows(DO + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod)
        a += _dot(do.to(MMA), tl.trans(v.to(MMA)), IEEE)
        if not LEAN:
            r += tl.sum(do.to(tl.float32) * v.to(tl.float32), 1)
        ok = k_ok[:, None] & v_ok[None, :]
        if PART != 2:
            hs = tl.load(_state_ptrs(HS, bh, c, NT, offs_k, offs_v, DK, DV), mask=ok, other=0.0)  # [BKB, VB]
            dqs += _dot(do.to(MMA), tl.trans(hs), IEEE)
        if PART != 1:
            dhs = tl.load(_state_ptrs(DHS, bh, c, NT, offs_k, offs_v, DK, DV), mask=ok, other=0.0)
            dks += _dot(v.to(MMA), tl.trans(dhs), IEEE)
            if SUFFIX == 3:  # <S_c, dS_c> per channel (the chunk's own part is added by the caller)
                sfx += tl.sum(hs.to(tl.float32) * dhs.to(tl.float32), 1)
            elif SUFFIX != 0:
                nxt = tl.load(_state_ptrs(HS, bh, c + 1, NT, offs_k, offs_v, DK, DV), mask=ok & (c + 1 < NT),
                              other=0.0).to(tl.float32)
                if SUFFIX == 1:  # the last chunk's: the final state
                    nxt += tl.load(_state_ptrs(HT, bh, 0, 1, offs_k, offs_v, DK, DV), mask=ok & (c + 1 >= NT),
                                   other=0.0)
                sfx += tl.sum(nxt * dhs.to(tl.float32), 1)
    return a, r, dqs, dks, sfx


@triton.jit
def gla_dqk_kernel(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, TOT,
                   sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd,
                   sob, son, soh, sod, N, H, DK, DV, NT, scale, KBLOCKS,
                   BT: tl.constexpr, BKB: tl.constexpr, BVF: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr,
                   SPLIT: tl.constexpr, PART: tl.constexpr = 0, WIDE: tl.constexpr = 0, FLAG=0,
                   AT: tl.constexpr = False, VB: tl.constexpr = 0, GROUP: tl.constexpr = 1,
                   SUFFIX: tl.constexpr = 0, EARLY: tl.constexpr = False, LEAN: tl.constexpr = False,
                   DOTSCAN: tl.constexpr = 0, FORM: tl.constexpr = 0,
                   DYN: tl.constexpr = False):
    """Program (batch * head, chunk, key block of BKB channels): dq, dk (the inputs' dtypes, DQ and DK_OUT (B, N, H,
    Dk) contiguous), the decay gradient's within-chunk reverse sum DG (B, N, H, Dk) float32 and its chunk total
    TOT (B H, NT, Dk) float32. Every value column at once (BVF >= Dv). Grid (B * H * NT * KBLOCKS,), key blocks
    fastest (a chunk's v and do from L2 for the second).
    PART (fewer live tiles a program, as two launches): 1 stores dq and q * dq (without the diagonal) into DG; 2
    (after 1) stores dk, DG's reverse sum of DG - k * dk and TOT; 0 both at once.
    WIDE (the sub-chunk fallback in a launch of its own, so the common launch carries none of its registers; PART
    0): 1 computes the blocks whose span of G allows the factored form and writes FLAG[program] (int8) 1 for the
    others, 2 (after 1) computes the flagged ones; 0 both in one program.
    AT (with WIDE 1's factored form): dk's intra-chunk term as (v do^T, masked) @ (q e^(G - m)), a second score dot,
    instead of a^T from registers: on the H100 chunk 64 with key blocks of 32 gave dk 3.6e3x
    the rounding floor (dq, from a itself, right), as the unsplit walk kernels' diag 6 at key blocks of 16 did
    (decision 44); the suspect is the dot on a register tile transposed (not diagnosed: no GPU here).
    VB: 0 every value column at once (v, do [BT, BVF], S_c and dS_c [BKB, BVF] live together: 255
    registers at chunk 32, key blocks 64, 4 warps); else a loop over value blocks of VB that sums do v^T, the
    diagonal's do . v and the state terms do S_c^T, v dS_c^T (float32 [BT, BT], [BT], [BT, BKB] x 2), so only one
    value block's tiles are live at a time (not with AT).
    GROUP (WIDE 2): programs of the first launch a program of the fallback's launch reads the flags of (FLAG padded
    with zeros to a multiple of it): fewer programs that only read a zero flag (0.12 ms of 65536 at B16 H16 N4096
    chunk 32).
    SUFFIX (with VB, PART 0): dg stored whole into DG, no TOT and no dg kernel after: the part of dg_t from
    the tokens after t's chunk c is sum_v S_(c+1) dS_c per channel (the decay gradient at chunk c + 1's first token:
    S_c leaves chunk c into e^(g_t) S_c + k v^T, and dS_c is the gradient that flows back into it), summed in the
    value loop from HS[c + 1] (HS[NT]: the final state, passed in TOT as (B H, Dk, Dv) float32 contiguous; SUFFIX 2:
    no final state, its part 0) and dS_c. SUFFIX 3: the same sum without HS[c + 1]'s load: S_(c+1) =
    e^G_last S_c + (k e^(G_last - G))^T v, so sum_v S_(c+1) dS_c = e^G_last <S_c, dS_c> + sum_t k e^(G_last - G)
    (v dS_c^T): the first from the tiles the loop loads anyway, the second from dk's state term (HT / TOT unused; the
    last chunk's dS is dht, or 0 without one, so no final state is read). EARLY (with SUFFIX 3): the first value block's v, do, S_c, dS_c loaded
    before the span test too, so every load of the program's first step is in flight at once (the loop from the
    second block). LEAN (with VB): the diagonal's r_t = do_t . v_t from do v^T's diagonal (a's, before
    its mask) instead of a product and a row sum of v and do each value block (their tiles then stay in shared memory
    for the dots alone). DOTSCAN (with SUFFIX; 3 the GPU's three bf16 pieces, 1 one float32 dot for the
    interpreter): dG's reverse sum within the chunk as a dot with a triangle of ones (_scan_dot), not tl.cumsum's
    shuffles (sm_90a: the kernel's two scans were ~700 of its ~3400
    instructions, 288 of its 368 shuffles; G's forward sum as such a dot made ptxas serialize every wgmma, C7514).
    FORM (WIDE 1 with VB, SUFFIX 3, LEAN and DOTSCAN): _dqk_s33_program's bits.
    DYN (with VB): the value loop bounded by Dv at run time (_dqk_value_loop's), in both launches."""
    pid = tl.program_id(0)
    if WIDE == 2:
        if GROUP == 1:
            if tl.load(FLAG + pid) != 0:
                _dqk_program(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, TOT, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                             svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, N, H, DK, DV, NT, scale,
                             KBLOCKS, pid, FLAG, BT, BKB, BVF, MMA, IEEE, SPLIT, PART, 2, AT, VB, SUFFIX,
                             EARLY, LEAN, DOTSCAN, DYN)
        else:
            for i in range(0, GROUP):
                p = pid * GROUP + i
                if tl.load(FLAG + p) != 0:
                    _dqk_program(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, TOT, sqb, sqn, sqh, sqd, skb, skn, skh,
                                 skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, N, H, DK, DV, NT,
                                 scale, KBLOCKS, p, FLAG, BT, BKB, BVF, MMA, IEEE, SPLIT, PART, 2, AT, VB, SUFFIX,
                                 EARLY, LEAN, DOTSCAN, DYN)
    elif FORM != 0:  # WIDE 1, VB, SUFFIX 3, LEAN
        _dqk_s33_program(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                         svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, N, H, DK, DV, NT, scale, KBLOCKS,
                         pid, FLAG, BT, BKB, BVF, MMA, IEEE, SPLIT, VB, DOTSCAN, FORM, DYN)
    else:
        _dqk_program(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, TOT, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                     svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, N, H, DK, DV, NT, scale, KBLOCKS,
                     pid, FLAG, BT, BKB, BVF, MMA, IEEE, SPLIT, PART, WIDE, AT, VB, SUFFIX, EARLY,
                     LEAN, DOTSCAN, DYN)


@triton.jit
def _dqk_program(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, TOT, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                 svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, N, H, DK, DV, NT, scale, KBLOCKS,
                 pid, FLAG, BT: tl.constexpr, BKB: tl.constexpr, BVF: tl.constexpr, MMA: tl.constexpr,
                 IEEE: tl.constexpr, SPLIT: tl.constexpr, PART: tl.constexpr, INTRA: tl.constexpr,
                 AT: tl.constexpr = False, VB: tl.constexpr = 0, SUFFIX: tl.constexpr = 0,
                 EARLY: tl.constexpr = False, LEAN: tl.constexpr = False, DOTSCAN: tl.constexpr = 0,
                 DYN: tl.constexpr = False):
    """gla_dqk_kernel's program ``pid`` with the intra-chunk terms by INTRA (_dq_intra's; 1 also writes FLAG and
    computes only where the span allows); VB and SUFFIX gla_dqk_kernel's (SUFFIX: TOT is the final state)."""
    kblock = pid % KBLOCKS
    c = (pid // KBLOCKS) % NT
    bh = pid // (KBLOCKS * NT)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    t0 = c * BT
    offs_t = tl.arange(0, BT)
    offs_k = kblock * BKB + tl.arange(0, BKB)
    k_ok = offs_k < DK
    Gc, G_last = _cumulative_channels(_rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd)
                                      .to(tl.float32))
    if SUFFIX == 3:  # q and k loads issued before the span test (in flight under its scan)
        q = _rows(Q + b * sqb + h * sqh, t0, offs_t, offs_k, k_ok, N, sqn, sqd)  # [BT, BKB]
        k = _rows(K + b * skb + h * skh, t0, offs_t, offs_k, k_ok, N, skn, skd)
        if EARLY:  # and the first value block's v, do, S_c, dS_c (the value loop starts at the second)
            offs_e = tl.arange(0, VB)
            e_ok = offs_e < DV
            v_e = _rows(V + b * svb + h * svh, t0, offs_t, offs_e, e_ok, N, svn, svd)  # [BT, VB]
            do_e = _rows(DO + b * sob + h * soh, t0, offs_t, offs_e, e_ok, N, son, sod)
            hs_e = tl.load(_state_ptrs(HS, bh, c, NT, offs_k, offs_e, DK, DV), mask=k_ok[:, None] & e_ok[None, :],
                           other=0.0)  # [BKB, VB]
            dhs_e = tl.load(_state_ptrs(DHS, bh, c, NT, offs_k, offs_e, DK, DV), mask=k_ok[:, None] & e_ok[None, :],
                            other=0.0)
    go = True
    if INTRA == 1:  # NaN spans go to the fallback too
        go = tl.max(tl.max(Gc, 0) - tl.min(Gc, 0), 0) <= _factor_span(MMA)
        tl.store(FLAG + pid, tl.where(go, 0, 1).to(tl.int8))
    if go:
        if VB == 0:
            offs_v = tl.arange(0, BVF)
            v_ok = offs_v < DV
        if SUFFIX != 3:
            q = _rows(Q + b * sqb + h * sqh, t0, offs_t, offs_k, k_ok, N, sqn, sqd)  # [BT, BKB]
            k = _rows(K + b * skb + h * skh, t0, offs_t, offs_k, k_ok, N, skn, skd)
        if VB == 0:
            v = _rows(V + b * svb + h * svh, t0, offs_t, offs_v, v_ok, N, svn, svd)  # [BT, BVF]
            do = _rows(DO + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod)
            # the intra-chunk terms without the diagonal (strictly lower: its factor r comes apart, launch.decay_grad)
            a = tl.where(offs_t[:, None] > offs_t[None, :], _dot(do.to(MMA), tl.trans(v.to(MMA)), IEEE), 0.0)
        elif EARLY:  # the first value block's sums from the tiles loaded before the span test, then the loop
            a, r, hs, dhs, sfx = _dqk_value_loop(
                V, DO, HS, DHS, svb, svn, svh, svd, sob, son, soh, sod, b, h, bh, c, t0, offs_t, offs_k, k_ok, N, DK,
                DV, NT, BT, BKB, BVF, VB, MMA, IEEE, PART, TOT, SUFFIX, VB,
                _dot(do_e.to(MMA), tl.trans(v_e.to(MMA)), IEEE),
                tl.zeros([BT], dtype=tl.float32) if LEAN else tl.sum(do_e.to(tl.float32) * v_e.to(tl.float32), 1),
                _dot(do_e.to(MMA), tl.trans(hs_e), IEEE), _dot(v_e.to(MMA), tl.trans(dhs_e), IEEE),
                tl.sum(hs_e.to(tl.float32) * dhs_e.to(tl.float32), 1), LEAN, DYN)
            if LEAN:  # the diagonal r_t = do_t . v_t from a = do v^T (float32 sums of the same products)
                r = tl.sum(tl.where(offs_t[:, None] == offs_t[None, :], a, 0.0), 1)
            a = tl.where(offs_t[:, None] > offs_t[None, :], a, 0.0)
            r = r * scale
            v = None
            do = None
        else:  # hs, dhs: the state terms do S_c^T, v dS_c^T themselves
            if LEAN:
                a, r, hs, dhs, sfx = _dqk_value_loop(
                    V, DO, HS, DHS, svb, svn, svh, svd, sob, son, soh, sod, b, h, bh, c, t0, offs_t, offs_k, k_ok, N, DK,
                    DV, NT, BT, BKB, BVF, VB, MMA, IEEE, PART, TOT, SUFFIX, 0, None, None, None, None, None, True,
                    DYN)
                r = tl.sum(tl.where(offs_t[:, None] == offs_t[None, :], a, 0.0), 1)
            else:
                a, r, hs, dhs, sfx = _dqk_value_loop(V, DO, HS, DHS, svb, svn, svh, svd, sob, son, soh, sod, b, h, bh,
                                                     c, t0, offs_t, offs_k, k_ok, N, DK, DV, NT, BT, BKB, BVF, VB, MMA,
                                                     IEEE, PART, TOT, SUFFIX, DYN=DYN)
            a = tl.where(offs_t[:, None] > offs_t[None, :], a, 0.0)
            r = r * scale
            v = None
            do = None
        qf = q.to(tl.float32)
        kf = k.to(tl.float32)
        rows = (b * N * H + h) * DK
        if VB == 0:
            r = tl.sum(do.to(tl.float32) * v.to(tl.float32), 1) * scale  # the diagonal: token t against itself
        if PART != 2:
            if VB == 0:
                hs = tl.load(_state_ptrs(HS, bh, c, NT, offs_k, offs_v, DK, DV), mask=k_ok[:, None] & v_ok[None, :],
                             other=0.0)
            dq = (_dq_intra(a, k, Gc, MMA, IEEE, SPLIT, INTRA) + _state_term(do, hs, MMA, IEEE, VB)
                  * tl.exp(Gc)) * scale
            _store_rows(DQ + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dq + r[:, None] * kf)
            dG = qf * dq  # rows past N: 0 (q, k, do, v loaded as 0)
            if PART == 1:
                _store_rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dG)
        else:
            dG = _rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1)
        if PART != 1:
            if VB == 0:
                dhs = tl.load(_state_ptrs(DHS, bh, c, NT, offs_k, offs_v, DK, DV), mask=k_ok[:, None] & v_ok[None, :],
                              other=0.0)
            if AT and INTRA == 1:  # a^T by its own dot (v do^T), not a register transpose of a (see the docstring)
                at = tl.where(offs_t[:, None] < offs_t[None, :], _dot(v.to(MMA), tl.trans(do.to(MMA)), IEEE), 0.0)
                mid = 0.5 * (tl.max(Gc, 0) + tl.min(Gc, 0))
                dk_intra = tl.exp(mid[None, :] - Gc) * _split_dot(at, qf * tl.exp(Gc - mid[None, :]), MMA, IEEE, SPLIT)
            else:
                dk_intra = _dk_intra(a, q, Gc, MMA, IEEE, SPLIT, INTRA)
            dk_state = _state_term(v, dhs, MMA, IEEE, VB) * tl.exp(G_last[None, :] - Gc)
            dk = dk_intra * scale + dk_state
            if SUFFIX == 3:  # sum_v S_(c+1) dS_c = e^G_last <S_c, dS_c> + sum_t k e^(G_last - G) (v dS_c^T)
                sfx = tl.exp(G_last) * sfx + tl.sum(kf * dk_state, 0)
            _store_rows(DK_OUT + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dk + r[:, None] * qf)
            dG -= kf * dk
            if SUFFIX == 0:
                _store_rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, tl.cumsum(dG, 0, reverse=True))
                tl.store(TOT + (bh.to(tl.int64) * NT + c) * DK + offs_k, tl.sum(dG, 0), mask=k_ok)
            else:  # dg whole: the chunk's reverse sum + every later token's part, 0 where the floor clamped g
                clamped = _rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd) < LOG_DECAY_FLOOR
                if DOTSCAN:  # the reverse sum as a dot with the upper-triangular ones
                    dGs = _scan_dot((offs_t[:, None] <= offs_t[None, :]).to(tl.float32), dG, DOTSCAN)
                else:
                    dGs = tl.cumsum(dG, 0, reverse=True)
                _store_rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1,
                            tl.where(clamped, 0.0, dGs + sfx[None, :]))


@triton.jit
def _max_min_sum(a1, b1, c1, a2, b2, c2):
    return tl.maximum(a1, a2), tl.minimum(b1, b2), c1 + c2


@triton.jit
def _scan_span_last(g, offs_t, BT: tl.constexpr):
    """G, the scan over the chunk's tokens of its log decays clamped at LOG_DECAY_FLOOR [BT, BK], and by ONE three-way
    reduction over tokens its span (hi: max, lo: min) and G_last (the last row) [BK] (the dqk kernel's FORM 1, the dv
    kernel's DVFORM 1)."""
    Gc = tl.cumsum(tl.where(g < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g), 0)
    hi, lo, G_last = tl.reduce((Gc, Gc, tl.where((offs_t == BT - 1)[:, None], Gc, 0.0)), 0, _max_min_sum)
    return Gc, hi, lo, G_last


@triton.jit
def _dqk_s33_program(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, sqb, sqn, sqh, sqd, skb, skn, skh, skd,
                     svb, svn, svh, svd, sgb, sgn, sgh, sgd, sob, son, soh, sod, N, H, DK, DV, NT, scale, KBLOCKS,
                     pid, FLAG, BT: tl.constexpr, BKB: tl.constexpr, BVF: tl.constexpr, MMA: tl.constexpr,
                     IEEE: tl.constexpr, SPLIT: tl.constexpr, VB: tl.constexpr, DOTSCAN: tl.constexpr,
                     FORM: tl.constexpr, DYN: tl.constexpr = False):
    """FORM's variant of the common launch (WIDE 1 with VB, SUFFIX 3, LEAN; DOTSCAN or tl.cumsum for dG's reverse
    sum),
    FORM bits: 1 G's span, its middle and G_last by ONE three-way reduction over tokens (max, min, the last row's
    sum) instead of three, and two tiles of exps, e^(G - m) and e^(m - G), for the four factors (e^G = e^(G - m)
    e^(m / 2) e^(m / 2), e^(G_last - G) = e^(m - G) e^(G_last - m): no factor leaves float32 where the span is <=
    _factor_span); 2 no branch on the span: the value loop issued before g's scan (g's load and scan under the loop's
    loads), every block computed (a flagged block's outputs, wrong or not finite, are written again by the fallback's
    launch after this one). DYN: gla_dqk_kernel's."""
    kblock = pid % KBLOCKS
    c = (pid // KBLOCKS) % NT
    bh = pid // (KBLOCKS * NT)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    t0 = c * BT
    offs_t = tl.arange(0, BT)
    offs_k = kblock * BKB + tl.arange(0, BKB)
    k_ok = offs_k < DK
    g = _rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd).to(tl.float32)
    q = _rows(Q + b * sqb + h * sqh, t0, offs_t, offs_k, k_ok, N, sqn, sqd)  # [BT, BKB]
    k = _rows(K + b * skb + h * skh, t0, offs_t, offs_k, k_ok, N, skn, skd)
    if FORM & 2:
        a, r, hs, dhs, sfx = _dqk_value_loop(
            V, DO, HS, DHS, svb, svn, svh, svd, sob, son, soh, sod, b, h, bh, c, t0, offs_t, offs_k, k_ok, N, DK,
            DV, NT, BT, BKB, BVF, VB, MMA, IEEE, 0, 0, 3, 0, None, None, None, None, None, True, DYN)
    if FORM & 1:
        Gc, hi, lo, G_last = _scan_span_last(g, offs_t, BT)
    else:
        Gc, G_last = _cumulative_channels(g)
        hi = tl.max(Gc, 0)
        lo = tl.min(Gc, 0)
    mid = 0.5 * (hi + lo)
    go = tl.max(hi - lo, 0) <= _factor_span(MMA)  # NaN spans go to the fallback too
    tl.store(FLAG + pid, tl.where(go, 0, 1).to(tl.int8))
    if FORM & 2:
        run = True
    else:
        run = go
    if run:
        if (FORM & 2) == 0:
            a, r, hs, dhs, sfx = _dqk_value_loop(
                V, DO, HS, DHS, svb, svn, svh, svd, sob, son, soh, sod, b, h, bh, c, t0, offs_t, offs_k, k_ok, N, DK,
                DV, NT, BT, BKB, BVF, VB, MMA, IEEE, 0, 0, 3, 0, None, None, None, None, None, True, DYN)
        r = tl.sum(tl.where(offs_t[:, None] == offs_t[None, :], a, 0.0), 1) * scale
        a = tl.where(offs_t[:, None] > offs_t[None, :], a, 0.0)
        qf = q.to(tl.float32)
        kf = k.to(tl.float32)
        rows = (b * N * H + h) * DK
        if FORM & 1:
            E = tl.exp(Gc - mid[None, :])
            Ei = tl.exp(mid[None, :] - Gc)
            half = tl.exp(0.5 * mid)[None, :]
            dq = (E * _split_dot(a, kf * Ei, MMA, IEEE, SPLIT) + hs * ((E * half) * half)) * scale
            dk_state = dhs * (Ei * tl.exp(G_last - mid)[None, :])
            dk = Ei * _split_dot(tl.trans(a), qf * E, MMA, IEEE, SPLIT) * scale + dk_state
        else:
            dq = (tl.exp(Gc - mid[None, :]) * _split_dot(a, kf * tl.exp(mid[None, :] - Gc), MMA, IEEE, SPLIT)
                  + hs * tl.exp(Gc)) * scale
            dk_state = dhs * tl.exp(G_last[None, :] - Gc)
            dk = (tl.exp(mid[None, :] - Gc) * _split_dot(tl.trans(a), qf * tl.exp(Gc - mid[None, :]), MMA, IEEE,
                                                          SPLIT)) * scale + dk_state
        _store_rows(DQ + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dq + r[:, None] * kf)
        sfx = tl.exp(G_last) * sfx + tl.sum(kf * dk_state, 0)
        _store_rows(DK_OUT + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dk + r[:, None] * qf)
        dG = qf * dq - kf * dk
        if DOTSCAN:
            dGs = _scan_dot((offs_t[:, None] <= offs_t[None, :]).to(tl.float32), dG, DOTSCAN)
        else:
            dGs = tl.cumsum(dG, 0, reverse=True)
        clamped = _rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd) < LOG_DECAY_FLOOR
        _store_rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, tl.where(clamped, 0.0, dGs + sfx[None, :]))


@triton.jit
def gla_dqk_flat_kernel(Q, K, V, G, DO, HS, DHS, DQ, DK_OUT, DG, FLAG, N, H, DK, DV, NT, scale, KBLOCKS, GROUPS,
                        BT: tl.constexpr, BKB: tl.constexpr, BVF: tl.constexpr, CPP: tl.constexpr,
                        MMA: tl.constexpr, IEEE: tl.constexpr, DOTSCAN: tl.constexpr):
    """The dqk kernel's common launch (gla_dqk_kernel WIDE 1 with dqk_form 3's math) with CPP consecutive chunks a
    program through ONE loop over them, each trip a whole chunk, every load by a tensor descriptor (TMA on the GPU):
    Q, K, V, G, DO on their (B N, H D) views with blocks [BT, BKB] / [BT, BVF], HS, DHS on (B H NT Dk, Dv) with blocks
    [BKB, BVF] (the launcher's conditions: Dv = BVF, BKB divides Dk, N a multiple of BT, so a chunk's rows never cross
    into the next batch). Triton's pipeliner (num_stages) issues the copies of a later chunk into shared memory; with
    one copy a chunk ahead (3 stages) the copies run under the current chunk's chain. A trip: do v^T, do S_c^T,
    v dS_c^T from zero accumulators (none carried from trip to trip: resetting a carried wgmma accumulator makes ptxas
    serialize the wgmma, C7515), <S_c, dS_c>, then the chain (_dqk_flat_chunk). Pointer loads instead spill more (the
    loop-invariant column offsets of their pointer tiles, hoisted out of the loop, stay live through the chain).
    Program (batch * head, group of CPP chunks, key block); grid (B * H * GROUPS * KBLOCKS,), GROUPS = cdiv(NT, CPP),
    key blocks fastest. FLAG[(bh NT + c) KBLOCKS + key block] is gla_dqk_kernel's (the fallback's launch reads it).
    The trip count is a run-time value (no one-trip loop folded into straight-line code, decision 84)."""
    pid = tl.program_id(0)
    kblock = pid % KBLOCKS
    grp = (pid // KBLOCKS) % GROUPS
    bh = pid // (KBLOCKS * GROUPS)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_t = tl.arange(0, BT)
    offs_k = kblock * BKB + tl.arange(0, BKB)
    k_ok = offs_k < DK
    c_first = grp * CPP
    for c in range(c_first, tl.minimum(NT, c_first + CPP)):
        t0 = c * BT
        row = (bh // H) * N + t0
        col = (bh % H) * DK + kblock * BKB
        v = V.load([row, (bh % H) * DV])  # [BT, BVF]
        do = DO.load([row, (bh % H) * DV])
        srow = (bh * NT + c) * DK + kblock * BKB
        hs = HS.load([srow, 0])  # [BKB, BVF]
        dhs = DHS.load([srow, 0])
        g = G.load([row, col]).to(tl.float32)  # [BT, BKB]
        q = Q.load([row, col])
        k = K.load([row, col])
        a = _dot(do.to(MMA), tl.trans(v.to(MMA)), IEEE)
        dqs = _dot(do.to(MMA), tl.trans(hs), IEEE)
        dks = _dot(v.to(MMA), tl.trans(dhs), IEEE)
        sfx = tl.sum(hs.to(tl.float32) * dhs.to(tl.float32), 1)
        _dqk_flat_chunk(a, dqs, dks, sfx, g, q, k, DQ, DK_OUT, DG, FLAG + (bh * NT + c) * KBLOCKS + kblock,
                        b, h, t0, offs_t, offs_k, k_ok, N, H, DK, scale, BT, MMA, IEEE, False, DOTSCAN)


@triton.jit
def _dqk_flat_chunk(a, dqs, dks, sfx, g, q, k, DQ, DK_OUT, DG, flag, b, h, t0, offs_t, offs_k, k_ok, N, H, DK, scale,
                    BT: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr,
                    DOTSCAN: tl.constexpr):
    """One chunk's chain in gla_dqk_flat_kernel from the value sums a = do v^T (unmasked), dqs = do S_c^T, dks =
    v dS_c^T, sfx = <S_c, dS_c> and its g, q, k [BT, BKB]: dqk_form 3's math (_dqk_s33_program FORM 3). With m the
    middle of the chunk's span of G per channel, E = e^(G - m), Ei = e^(m - G):
        dq = scale (E (a k Ei) + dqs e^G) + r k,    dk = scale Ei (a^T q E) + dks e^(G_last - G) + r q
    (a strictly lower, r_t = scale do_t . v_t from a's diagonal), dg = the reverse sum of q dq - k dk within the chunk
    + e^G_last sfx + sum_t k dks e^(G_last - G) (every later token's part), 0 where the floor clamped g; the flag 1
    where the span is past _factor_span (the fallback's launch writes that block again)."""
    Gc, hi, lo, G_last = _scan_span_last(g, offs_t, BT)
    mid = 0.5 * (hi + lo)
    go = tl.max(hi - lo, 0) <= _factor_span(MMA)  # NaN spans go to the fallback too
    tl.store(flag, tl.where(go, 0, 1).to(tl.int8))
    r = tl.sum(tl.where(offs_t[:, None] == offs_t[None, :], a, 0.0), 1) * scale
    a = tl.where(offs_t[:, None] > offs_t[None, :], a, 0.0)
    qf = q.to(tl.float32)
    kf = k.to(tl.float32)
    rows = (b * N * H + h) * DK
    E = tl.exp(Gc - mid[None, :])
    Ei = tl.exp(mid[None, :] - Gc)
    half = tl.exp(0.5 * mid)[None, :]
    dq = (E * _split_dot(a, kf * Ei, MMA, IEEE, SPLIT) + dqs * ((E * half) * half)) * scale
    dk_state = dks * (Ei * tl.exp(G_last - mid)[None, :])
    dk = Ei * _split_dot(tl.trans(a), qf * E, MMA, IEEE, SPLIT) * scale + dk_state
    _store_rows(DQ + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dq + r[:, None] * kf)
    sfx = tl.exp(G_last) * sfx + tl.sum(kf * dk_state, 0)
    _store_rows(DK_OUT + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, dk + r[:, None] * qf)
    dG = qf * dq - kf * dk
    if DOTSCAN:
        dGs = _scan_dot((offs_t[:, None] <= offs_t[None, :]).to(tl.float32), dG, DOTSCAN)
    else:
        dGs = tl.cumsum(dG, 0, reverse=True)
    _store_rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1,
                tl.where(g < LOG_DECAY_FLOOR, 0.0, dGs + sfx[None, :]))


@triton.jit
def _channel_block_scores(q, k, G, MMA: tl.constexpr, IEEE: tl.constexpr, INTRA: tl.constexpr = 0):
    """One key block's part of the causal intra-chunk scores, sum over its channels d of q_id k_jd e^(G_id - G_jd)
    (j <= i; not scaled): one dot about the middle of the block's span where it is <= _factor_span, else the
    sub-chunk form (kernels_tl._channel_chunk's rule, per block); INTRA 1: the dot (the caller knows the span
    allows it). [BT, BT] float32."""
    BT: tl.constexpr = q.shape[0]
    qf = q.to(tl.float32)
    kf = k.to(tl.float32)
    hi = tl.max(G, 0)
    lo = tl.min(G, 0)
    offs_t = tl.arange(0, BT)
    narrow = True
    if INTRA == 0:
        narrow = tl.max(hi - lo, 0) <= _factor_span(MMA)
    if narrow:
        mid = 0.5 * (hi + lo)
        s = _dot((qf * tl.exp(G - mid[None, :])).to(MMA), tl.trans((kf * tl.exp(mid[None, :] - G)).to(MMA)), IEEE)
        p = tl.where(offs_t[:, None] >= offs_t[None, :], s, 0.0)
    else:
        p = _channel_scores_in_registers(qf, kf, G, MMA, IEEE)
    return p


@triton.jit
def gla_dv_kernel(Q, K, G, DO, DHS, DV_OUT, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd,
                  sob, son, soh, sod, N, H, DK, DV, NT, scale, VBLOCKS,
                  BT: tl.constexpr, BK: tl.constexpr, KD: tl.constexpr, BV: tl.constexpr, MMA: tl.constexpr,
                  IEEE: tl.constexpr, WIDE: tl.constexpr = 0, FLAG=0, KBLOCKS=1, KBP: tl.constexpr = 1,
                  DVFORM: tl.constexpr = 0):
    """Program (batch * head, chunk, value block): dv (v's dtype, DV_OUT (B, N, H, Dv) contiguous), the key
    channels by blocks of KD (scores and the state term summed over them). Grid (B * H * NT * VBLOCKS,).
    WIDE (with the dqk kernel's wide launches, whose FLAG marks each (chunk, key block) whose span needs the sub-chunk
    form; KBLOCKS of them a chunk, KBP their power of two): 1 computes the chunks none of whose blocks is marked, by
    the factored scores alone (no fallback's registers); 2 (after) the others, as WIDE 0 does. A KD block inside
    unmarked key blocks has a span within theirs, so the dot is safe whatever KD and the dqk key block are.
    DVFORM (WIDE 1's factored blocks): 1 each key block's span middle and G_last by one three-way
    reduction over tokens (not three) and two exp tiles (e^(G_last - G) = e^(m - G) e^(G_last - m)), not three;
    bit 4 (with 1): no branch on the flags (every chunk computed, its loads issued at once; a marked chunk's dv, wrong or
    not finite, written again by the WIDE 2 launch after); bit 16 (with 1): the scores made transposed, P^T, the
    register operand of P^T do as they come (no transposition of the [BT, BT] tile); bit 32: each key block's dS_c rows
    loaded with its q, k, g (one global round trip a key block fewer on the program's chain)."""
    pid = tl.program_id(0)
    c = (pid // VBLOCKS) % NT
    bh = pid // (VBLOCKS * NT)
    if WIDE == 0:
        _dv_program(Q, K, G, DO, DHS, DV_OUT, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd,
                    sob, son, soh, sod, N, H, DK, DV, NT, scale, VBLOCKS, pid, BT, BK, KD, BV, MMA, IEEE, 0)
    elif WIDE == 1 and (DVFORM & 4) != 0:  # every chunk (a marked one's dv written again by the WIDE 2 launch)
        _dv_program(Q, K, G, DO, DHS, DV_OUT, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd,
                    sob, son, soh, sod, N, H, DK, DV, NT, scale, VBLOCKS, pid, BT, BK, KD, BV, MMA, IEEE, 1,
                    DVFORM)
    else:
        kb = tl.arange(0, KBP)
        marked = tl.max(tl.load(FLAG + (bh.to(tl.int64) * NT + c) * KBLOCKS + kb, mask=kb < KBLOCKS, other=0), 0)
        if WIDE == 1:
            if marked == 0:
                _dv_program(Q, K, G, DO, DHS, DV_OUT, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd,
                            sob, son, soh, sod, N, H, DK, DV, NT, scale, VBLOCKS, pid, BT, BK, KD, BV, MMA, IEEE, 1,
                            DVFORM)
        else:
            if marked != 0:
                _dv_program(Q, K, G, DO, DHS, DV_OUT, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd,
                            sob, son, soh, sod, N, H, DK, DV, NT, scale, VBLOCKS, pid, BT, BK, KD, BV, MMA, IEEE, 0)


@triton.jit
def _dv_key_block(Q, K, G, DHS, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd, N, DK, DV, NT, b, h, bh, c,
                  t0, offs_t, offs_v, v_ok, c0, p, dv, KD: tl.constexpr, MMA: tl.constexpr, IEEE: tl.constexpr,
                  INTRA: tl.constexpr, DVFORM: tl.constexpr = 0):
    """_dv_program's key channels c0 .. c0 + KD: (p + their scores, dv + their state term); DVFORM gla_dv_kernel's
    (with INTRA 1)."""
    offs_k = c0 + tl.arange(0, KD)
    k_ok = offs_k < DK
    if DVFORM & 32:  # dS_c's rows in flight with q, k, g (not a global round trip of their own after the scores)
        dhs = tl.load(_state_ptrs(DHS, bh, c, NT, offs_k, offs_v, DK, DV), mask=k_ok[:, None] & v_ok[None, :],
                      other=0.0)
    q = _rows(Q + b * sqb + h * sqh, t0, offs_t, offs_k, k_ok, N, sqn, sqd)  # [BT, KD]
    k = _rows(K + b * skb + h * skh, t0, offs_t, offs_k, k_ok, N, skn, skd)
    if DVFORM and INTRA == 1:  # the span allows the factored form (the dqk kernel's flags said so)
        BT: tl.constexpr = q.shape[0]
        g = _rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd).to(tl.float32)
        Gc, hi, lo, G_last = _scan_span_last(g, offs_t, BT)
        mid = 0.5 * (hi + lo)
        kf = k.to(tl.float32)
        Ei = tl.exp(mid[None, :] - Gc)
        ks = kf * Ei
        if DVFORM & 16:  # P^T (k e^(m - G)) (q e^(G - m))^T: the operand of P^T do as it comes
            s = _dot(ks.to(MMA), tl.trans((q.to(tl.float32) * tl.exp(Gc - mid[None, :])).to(MMA)), IEEE)
            p += tl.where(offs_t[:, None] <= offs_t[None, :], s, 0.0)
        else:
            s = _dot((q.to(tl.float32) * tl.exp(Gc - mid[None, :])).to(MMA), tl.trans(ks.to(MMA)), IEEE)
            p += tl.where(offs_t[:, None] >= offs_t[None, :], s, 0.0)
        kg = ks * tl.exp(G_last - mid)[None, :]
    else:
        Gc, G_last = _cumulative_channels(_rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd)
                                          .to(tl.float32))
        p += _channel_block_scores(q, k, Gc, MMA, IEEE, INTRA)
        kg = k.to(tl.float32) * tl.exp(G_last[None, :] - Gc)
    if (DVFORM & 32) == 0:
        dhs = tl.load(_state_ptrs(DHS, bh, c, NT, offs_k, offs_v, DK, DV), mask=k_ok[:, None] & v_ok[None, :],
                      other=0.0)
    dv += _dot(kg.to(MMA), dhs, IEEE)
    return p, dv


@triton.jit
def _dv_program(Q, K, G, DO, DHS, DV_OUT, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd,
                sob, son, soh, sod, N, H, DK, DV, NT, scale, VBLOCKS, pid,
                BT: tl.constexpr, BK: tl.constexpr, KD: tl.constexpr, BV: tl.constexpr, MMA: tl.constexpr,
                IEEE: tl.constexpr, INTRA: tl.constexpr, DVFORM: tl.constexpr = 0):
    """gla_dv_kernel's program ``pid``, the scores by _channel_block_scores' INTRA, its key blocks unrolled."""
    vblock = pid % VBLOCKS
    c = (pid // VBLOCKS) % NT
    bh = pid // (VBLOCKS * NT)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    t0 = c * BT
    offs_t = tl.arange(0, BT)
    offs_v = vblock * BV + tl.arange(0, BV)
    v_ok = offs_v < DV
    do = _rows(DO + b * sob + h * soh, t0, offs_t, offs_v, v_ok, N, son, sod)  # [BT, BV]
    p = tl.zeros([BT, BT], dtype=tl.float32)
    dv = tl.zeros([BT, BV], dtype=tl.float32)
    for c0 in tl.static_range(0, BK, KD):
        p, dv = _dv_key_block(Q, K, G, DHS, sqb, sqn, sqh, sqd, skb, skn, skh, skd, sgb, sgn, sgh, sgd, N, DK, DV,
                              NT, b, h, bh, c, t0, offs_t, offs_v, v_ok, c0, p, dv, KD, MMA, IEEE, INTRA,
                              DVFORM)
    if DVFORM & 16:  # (p is P^T)
        dv += _dot((p * scale).to(MMA), do.to(MMA), IEEE)
    else:
        dv += _dot(tl.trans((p * scale).to(MMA)), do.to(MMA), IEEE)
    _store_rows(DV_OUT + (b * N * H + h) * DV, t0, offs_t, offs_v, v_ok, N, H * DV, 1, dv)


@triton.jit
def gla_dv_flat_kernel(Q, K, G, DO, DHS, DV_OUT, N, H, DK, DV, NT, scale, VBLOCKS, GROUPS,
                       BT: tl.constexpr, BK: tl.constexpr, KD: tl.constexpr, BV: tl.constexpr, CPP: tl.constexpr,
                       MMA: tl.constexpr, IEEE: tl.constexpr):
    """The dv kernel's common launch (gla_dv_kernel WIDE 1 with DVFORM 5's math: every chunk by the factored scores,
    a flagged chunk's dv written again by the WIDE 2 launch after) with CPP consecutive chunks a program through one
    loop, every load and dv's store by a tensor descriptor (TMA on the GPU: no pointer tiles, no per-element 64-bit
    addresses): Q, K, G on their (B N, H Dk) views with blocks [BT, KD], DO and DV_OUT on (B N, H Dv) with [BT, BV],
    DHS on (B H NT Dk, Dv) with [KD, BV] (the launcher's conditions: Dk = BK a multiple of KD, BV divides Dv, N a
    multiple of BT). The scores are made transposed, P^T = (k e^(m - G)) (q e^(G - m))^T summed over the key blocks
    (j <= i kept), so the last product P^T do takes them as its register A operand with no transposition of the
    [BT, BT] tile. Program (batch * head, group of CPP chunks, value block); grid (B H GROUPS VBLOCKS,), value blocks
    fastest; the trip count a run-time value."""
    pid = tl.program_id(0)
    vblock = pid % VBLOCKS
    grp = (pid // VBLOCKS) % GROUPS
    bh = pid // (VBLOCKS * GROUPS)
    h = bh % H
    offs_t = tl.arange(0, BT)
    vcol = h * DV + vblock * BV
    c_first = grp * CPP
    for c in range(c_first, tl.minimum(NT, c_first + CPP)):
        row = (bh // H) * N + c * BT
        srow = (bh * NT + c) * DK
        pt = tl.zeros([BT, BT], dtype=tl.float32)
        dv = tl.zeros([BT, BV], dtype=tl.float32)
        for c0 in tl.static_range(0, BK, KD):
            g = G.load([row, h * DK + c0]).to(tl.float32)  # [BT, KD]
            Gc, hi, lo, G_last = _scan_span_last(g, offs_t, BT)
            mid = 0.5 * (hi + lo)
            ks = K.load([row, h * DK + c0]).to(tl.float32) * tl.exp(mid[None, :] - Gc)
            qs = Q.load([row, h * DK + c0]).to(tl.float32) * tl.exp(Gc - mid[None, :])
            pt += _dot(ks.to(MMA), tl.trans(qs.to(MMA)), IEEE)
            dhs = DHS.load([srow + c0, vblock * BV])  # [KD, BV]
            # the state term with e^(G_last - G) = e^(m - G) e^(G_last - m)
            dv += _dot((ks * tl.exp(G_last - mid)[None, :]).to(MMA), dhs, IEEE)
        pt = tl.where(offs_t[:, None] <= offs_t[None, :], pt * scale, 0.0)
        dv += _dot(pt.to(MMA), DO.load([row, vcol]).to(MMA), IEEE)
        DV_OUT.store([row, vcol], dv.to(DV_OUT.dtype))


@triton.jit
def gla_dg_kernel(G, DG, TOT, HT, DHT, sgb, sgn, sgh, sgd, sub, suh, suf, suv, stb, sth, stf, stv, N, H, DK, DV, NT,
                  BT: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr, HAS_HT: tl.constexpr):
    """Program (batch * head, key block): dg = DG (each chunk's own reverse sum) + the later chunks' totals, from
    the final state's sum_v DHT * HT, zero where the floor clamped g; in place in DG. Grid (B * H, cdiv(DK, BK))."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_t = tl.arange(0, BT)
    offs_k = tl.program_id(1) * BK + tl.arange(0, BK)
    k_ok = offs_k < DK
    carry = tl.zeros([BK], dtype=tl.float32)
    if HAS_HT:
        offs_v = tl.arange(0, BVF)
        ok = k_ok[:, None] & (offs_v < DV)[None, :]
        ht = tl.load(HT + b * sub + h * suh + offs_k.to(tl.int64)[:, None] * suf + offs_v[None, :] * suv, mask=ok,
                     other=0.0)
        dht = tl.load(DHT + b * stb + h * sth + offs_k.to(tl.int64)[:, None] * stf + offs_v[None, :] * stv, mask=ok,
                      other=0.0)
        carry = tl.sum(ht * dht, 1)
    rows = (b * N * H + h) * DK
    for i in range(0, NT):
        c = NT - 1 - i
        t0 = c * BT
        local = _rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1)
        clamped = _rows(G + b * sgb + h * sgh, t0, offs_t, offs_k, k_ok, N, sgn, sgd) < LOG_DECAY_FLOOR
        _store_rows(DG + rows, t0, offs_t, offs_k, k_ok, N, H * DK, 1, tl.where(clamped, 0.0, local + carry[None, :]))
        carry += tl.load(TOT + (bh.to(tl.int64) * NT + c) * DK + offs_k, mask=k_ok, other=0.0)


def _block(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def gradient_buffers(out: dict | None, upcast: bool, q, k, v, h0, name: str):
    """The backward's (dq, dk, dv, dg, dh0): the caller's ``out`` buffers (dq / dk / dv only where the kernels write
    the inputs' dtypes, not on the interpreter's float32 upcast), else new ones; checked: contiguous (B, N, H, D),
    dg and dh0 float32, dh0 contiguous (B, H, Dk, Dv)."""
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    dev, f32 = v.device, torch.float32
    direct = out is not None and not upcast
    dq = out["dq"] if direct else torch.empty(B, N, H, Dk, dtype=q.dtype, device=dev)
    dk = out["dk"] if direct else torch.empty(B, N, H, Dk, dtype=k.dtype, device=dev)
    dv = out["dv"] if direct else torch.empty(B, N, H, Dv, dtype=v.dtype, device=dev)
    dg = out["dg"] if out is not None else torch.empty(B, N, H, Dk, dtype=f32, device=dev)
    dh0 = None
    if h0 is not None:
        dh0 = out["dh0"] if out is not None else torch.empty(B, H, Dk, Dv, dtype=f32, device=dev)
    for t, shape in ((dq, (B, N, H, Dk)), (dk, (B, N, H, Dk)), (dv, (B, N, H, Dv)), (dg, (B, N, H, Dk))):
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name}: output buffers must be contiguous {shape}, got {tuple(t.shape)}")
    if dg.dtype != f32 or (dh0 is not None and (dh0.dtype != f32 or not dh0.is_contiguous())):
        raise ValueError(f"{name}: dg and dh0 are float32 (dh0 contiguous (B, H, Dk, Dv))")
    return dq, dk, dv, dg, dh0


def _desc(t, rows: int, cols: int) -> TensorDescriptor:
    """A tensor descriptor of blocks [rows, cols] over t's 2-D view: (B, N, H, D) as (B N, H D), a state buffer (B, H,
    NT, Dk, Dv) as (B H NT Dk, Dv) (the views _tma_views accepts)."""
    t = t.view(-1, t.shape[-1]) if t.dim() == 5 else t.view(t.shape[0] * t.shape[1], -1)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, cols])


def _tma_views(tensors) -> bool:
    """Every tensor can back a TMA descriptor on its 2-D view (q, k, v, g, do (B, N, H, D) as (B N, H D): heads
    consecutive in a token's row, tokens in a batch's; states (B, H, NT, Dk, Dv) contiguous), its base and row stride
    16-byte aligned."""
    for t in tensors:
        if t.dim() == 5:
            ok = t.is_contiguous()
        else:
            B, N, H, D = t.shape
            ok = t.stride(3) == 1 and t.stride(2) == D and t.stride(0) == N * t.stride(1)
        if not ok or t.data_ptr() % 16 or (t.stride(-2) * t.element_size()) % 16:
            return False
    return True


def backward(plan: Plan, do, q, k, v, g, h0, ht, dht, scale: float, out: dict | None = None, steps: list | None = None,
             **overrides):
    """(dq, dk, dv, dg, None, dh0), as kernels_backward_gla.backward (the same contract: dq, dk, dv in the inputs'
    dtypes, dg and dh0 float32; ``out`` buffers to write). ``plan``: a tl plan (its MMA dtype and the
    interpreter's upcast); blocks from configs_gla_bwd.CHUNKED (CHUNKED_OTHER_DIMS's keys from there where (Dk, Dv) is
    not CHUNKED_CHECKED_DIMS), ``overrides`` any of its keys. ``steps``: a list that
    gets the launches, (name, kernel, grid, arguments, options) each, in order, instead of running them (the
    caller times or compiles them; the outputs are then not written)."""
    cfg = dict(configs_gla_bwd.CHUNKED)
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise ValueError(f"gla chunked backward: unknown overrides {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update(overrides)
    if (q.shape[3], v.shape[3]) not in configs_gla_bwd.CHUNKED_CHECKED_DIMS:  # CHUNKED's values: GPU-checked there
        cfg.update({key: x for key, x in configs_gla_bwd.CHUNKED_OTHER_DIMS.items() if key not in overrides})
    flat_dims = configs_gla_bwd.CHUNKED_FLAT_DIMS.get((q.shape[3], v.shape[3]), {})  # the flat launch where checked
    cfg.update({key: x for key, x in flat_dims.items() if key not in overrides})
    mma, ieee, upcast = plan.config["MMA"], plan.config["IEEE"], plan.config["upcast"]
    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    dev, f32 = v.device, torch.float32
    dtypes = (q.dtype, k.dtype, v.dtype)
    if upcast:  # the interpreter: bf16 on its float32 upcast, rounded once at the end
        q, k, v, do = q.float(), k.float(), v.float(), do.float()
    elif do.dtype != v.dtype and v.dtype != f32:
        do = do.to(v.dtype)
    direct = out is not None and not upcast  # the kernels wrote the caller's buffers
    dq, dk, dv, dg, dh0 = gradient_buffers(out, upcast, q, k, v, h0, "gla chunked backward")
    BT = cfg["BT"]
    NT = -(-N // BT)
    has_dht = dht is not None
    has_ht = has_dht and ht is not None
    if B * H > 0 and N > 0:
        BK, BVF = _block(Dk), _block(Dv)
        state_dtype = torch.float32 if mma == tl.float32 else q.dtype  # the dots' operand dtype
        hs = torch.empty(B, H, NT, Dk, Dv, dtype=state_dtype, device=dev)
        dhs = torch.empty_like(hs)
        tot = torch.empty(B, H, NT, Dk, dtype=f32, device=dev)
        BV = min(BVF, cfg["BV"])
        vblocks = -(-Dv // BV)
        dv_BV = min(BVF, cfg["dv_BV"] or cfg["BV"])  # the dv kernel's value block (its scores made once a block)
        dv_blocks = -(-Dv // dv_BV)
        BKB = min(BK, cfg["BKB"])
        kblocks = -(-Dk // BKB)
        KD = min(BK, cfg["KD"])
        dqk_VB = min(BVF, cfg["dqk_VB"]) if cfg["dqk_VB"] else 0  # the dqk kernel's value loop (0: none)
        if dqk_VB and cfg["dk_at"]:
            raise ValueError("gla chunked backward: dk_at needs dqk_VB None (v and do whole)")
        fused = cfg["dg_fused"]  # dg whole from the dqk kernel (the later tokens' part from S_(c+1) dS_c), no dg kernel
        if fused and (not dqk_VB or cfg["dqk_apart"]):
            raise ValueError("gla chunked backward: dg_fused needs dqk_VB and not dqk_apart")
        suffix = (3 if cfg["dg_local"] else 1 if has_ht else 2) if fused else 0
        # the dqk forms where they apply: lean with the value loop, dotscan where the kernel stores dg whole,
        # early with dg_local's form (else the kernel is the one without them)
        lean = bool(cfg["dqk_lean"] and dqk_VB)
        dotscan = bool(cfg["dqk_dotscan"] and suffix)
        early = bool(cfg["dqk_early"] and suffix == 3)
        # dqk_form's common launch where it applies (the value loop with lean, dg_local, the fallback apart)
        form = cfg["dqk_form"] if (lean and suffix == 3 and cfg["wide_apart"] and not early
                                   and not cfg["dqk_apart"]) else 0
        tot_or = (ht.float().contiguous() if has_ht else tot) if fused else tot  # SUFFIX 1: the final state
        z4 = (0, 0, 0, 0)
        g_strides = g.stride()
        calls = []  # (name, kernel, grid, arguments, options), in order: each reads what the ones before wrote
        walk_BK = min(BK, cfg["walk_BK"] or BK)  # the walks' key block: their states' rows apart
        walk_kblocks = -(-Dk // walk_BK)
        walk_opts = dict(BT=BT, BK=walk_BK, BV=BV, MMA=mma, IEEE=ieee, num_warps=cfg["walk_warps"],
                         num_stages=cfg["walk_stages"], **({"NVB": vblocks} if walk_kblocks > 1 else {}),
                         **({"maxnreg": cfg["walk_maxnreg"]} if cfg["walk_maxnreg"] else {}))
        if walk_kblocks > 1 and cfg["walks_fused"]:
            raise ValueError("gla chunked backward: walk_BK below the key dim needs walks_fused False")
        h0_or = h0 if h0 is not None else hs
        programs = B * H * NT * kblocks
        group = cfg["wide_group"] or 1  # the fallback launch's programs read this many flags each
        flag = tot
        if cfg["wide_apart"]:
            flag = (torch.zeros(-(-programs // group) * group, dtype=torch.int8, device=dev) if group > 1 else
                    torch.empty(programs, dtype=torch.int8, device=dev))
        dht_or, dh0_or = dht if has_dht else dhs, dh0 if dh0 is not None else dhs
        if cfg["walks_fused"]:
            calls.append(("walks", gla_walks_kernel, (B * H, vblocks, 2), (
                q, k, v, g, do, h0_or, dht_or, dh0_or, hs, dhs, *q.stride(), *k.stride(), *v.stride(), *g_strides,
                *do.stride(), *(h0.stride() if h0 is not None else z4), *(dht.stride() if has_dht else z4),
                *(dh0.stride() if dh0 is not None else z4), N, H, Dk, Dv, NT, scale),
                dict(walk_opts, HAS_H0=h0 is not None, HAS_DHT=has_dht, STORE_DH0=dh0 is not None)))
        else:
            calls.append(("states", gla_states_kernel, (B * H, vblocks * walk_kblocks), (
                k, v, g, h0_or, hs, *k.stride(), *v.stride(), *g_strides, *(h0.stride() if h0 is not None else z4),
                N, H, Dk, Dv, NT), dict(walk_opts, HAS_H0=h0 is not None)))
            calls.append(("dstates", gla_dstates_kernel, (B * H, vblocks * walk_kblocks), (
                q, g, do, dht_or, dh0_or, dhs, *q.stride(), *g_strides, *do.stride(),
                *(dht.stride() if has_dht else z4), *(dh0.stride() if dh0 is not None else z4), N, H, Dk, Dv, NT,
                scale), dict(walk_opts, HAS_DHT=has_dht, STORE_DH0=dh0 is not None)))
        # (PART, WIDE) launches: dq and dk apart, or the fallback apart (a flag a program between the two)
        dqk = [(1, 0), (2, 0)] if cfg["dqk_apart"] else [(0, 1), (0, 2)] if cfg["wide_apart"] else [(0, 0)]
        # dqk_flat where dqk_form 3's common launch runs (the value loop, lean, dg_local, the fallback apart) and the
        # descriptors can: Dv = BVF, BKB divides Dk, N a multiple of the chunk, every view TMA-aligned (_tma_views), on
        # Hopper (where the H100 checked it) or in the interpreter
        flat = cfg["dqk_flat"] if (form == 3 and not cfg["split"] and Dv == BVF and Dk % BKB == 0
                                   and N % BT == 0 and (dispatch.is_hopper(dev) or dispatch.interpreted(dev))
                                   and _tma_views((q, k, v, g, do, hs, dhs))) else 0
        # dqk_gluon (stages): the common launch by the Gluon kernel on the tiles template (gluon_gla_bwd: the next
        # tile's TMA loads under this tile's chain), where the flat launch's conditions hold and its own (fits)
        gluon_stages = 0
        if cfg["dqk_gluon"] and flat and not dispatch.interpreted(dev) and dispatch.gluon_ok(dev):
            from tilecore.ops.linear_attention import gluon_gla_bwd

            if gluon_gla_bwd.fits(q, k, v, g, do, hs, dhs, N, BT, BKB) is None:
                gluon_stages = cfg["dqk_gluon"]
        # its FORM 2 (sums over tokens by bf16 dots; every other FORM bit is FORM 2's) with bf16 inputs only; it sets the
        # flags it raises, so they start at zero
        gluon_form = cfg["dqk_gluon_form"] if q.dtype == torch.bfloat16 else 0
        if not gluon_form & 2 and not cfg["dqk_gluon_scan"]:  # (the scans where they lost to the flat launch)
            gluon_stages = 0
        if gluon_stages and gluon_form & 2 and group == 1:
            flag.zero_()
        for part, wide in dqk:
            if gluon_stages and wide == 1:
                grid, gargs, warps = gluon_gla_bwd.launch_args(q, k, v, g, do, hs, dhs, dq, dk, dg, flag, scale,
                                                               stages=gluon_stages,
                                                               span=8.0 if mma == tl.float16 else 64.0,
                                                               form=gluon_form, bkb=BKB)
                calls.append(("dqk0w", gluon_gla_bwd.gla_dqk_gluon_kernel, grid, (), dict(gargs, num_warps=warps)))
                continue
            if flat and wide == 1:  # the common launch by `flat` chunks a program, its loads by descriptors
                groups = -(-NT // flat)
                calls.append(("dqk0w", gla_dqk_flat_kernel, (B * H * groups * kblocks,), (
                    _desc(q, BT, BKB), _desc(k, BT, BKB), _desc(v, BT, BVF), _desc(g, BT, BKB), _desc(do, BT, BVF),
                    _desc(hs, BKB, BVF), _desc(dhs, BKB, BVF), dq, dk, dg, flag, N, H, Dk, Dv, NT, scale, kblocks,
                    groups), dict(BT=BT, BKB=BKB, BVF=BVF, CPP=flat, MMA=mma, IEEE=ieee,
                                  DOTSCAN=1 if dispatch.interpreted(dev) else 3, num_warps=cfg["dqk_warps"],
                                  num_stages=cfg["dqk_flat_stages"] or cfg["dqk_stages"] or cfg["stages"],
                                  **({"maxnreg": cfg["dqk_maxnreg"]} if cfg["dqk_maxnreg"] else {}))))
                continue
            grid = (-(-programs // group),) if wide == 2 else (programs,)
            calls.append((f"dqk{part}{'w' * wide}", gla_dqk_kernel, grid, (
                q, k, v, g, do, hs, dhs, dq, dk, dg, tot_or, *q.stride(), *k.stride(), *v.stride(), *g_strides,
                *do.stride(), N, H, Dk, Dv, NT, scale, kblocks),
                dict(BT=BT, BKB=BKB, BVF=BVF, MMA=mma, IEEE=ieee, SPLIT=cfg["split"], PART=part, WIDE=wide, FLAG=flag,
                     AT=cfg["dk_at"], num_warps=cfg["dqk_warps"], num_stages=cfg["dqk_stages"] or cfg["stages"],
                     **({"VB": dqk_VB} if dqk_VB else {}), **({"GROUP": group} if wide == 2 and group > 1 else {}),
                     **({"SUFFIX": suffix} if suffix else {}), **({"EARLY": True} if early else {}),
                     **({"LEAN": True} if lean else {}),
                     **({"DOTSCAN": 1 if dispatch.interpreted(dev) else 3} if dotscan else {}),
                     **({"FORM": form} if form and wide == 1 else {}),
                     **({"maxnreg": cfg["dqk_maxnreg"]} if cfg["dqk_maxnreg"] and wide != 2 else {}),
                     **({"DYN": True} if cfg["dqk_dyn"] and dqk_VB else {}))))
        # dv_flat: the dv kernel's common launch (every chunk by the factored scores, dv_form 5) by chunks a program,
        # its loads and store by descriptors, where the views allow it (as dqk_flat's, and Dk = BK a multiple of KD)
        dv_flat = cfg["dv_flat"] if (cfg["wide_apart"] and cfg["dv_wide_apart"] and cfg["dv_form"] & 5 == 5
                                     and Dv == BVF and Dv % dv_BV == 0 and Dk == BK and Dk % KD == 0
                                     and N % BT == 0 and (dispatch.is_hopper(dev) or dispatch.interpreted(dev))
                                     and _tma_views((q, k, g, do, dhs, dv))) else 0
        # with the dqk kernel's flags: the dv kernel's fallback in a launch of its own too
        for wide in ((1, 2) if cfg["wide_apart"] and cfg["dv_wide_apart"] else (0,)):
            if dv_flat and wide == 1:
                groups = -(-NT // dv_flat)
                calls.append(("dvw", gla_dv_flat_kernel, (B * H * groups * dv_blocks,), (
                    _desc(q, BT, KD), _desc(k, BT, KD), _desc(g, BT, KD), _desc(do, BT, dv_BV), _desc(dhs, KD, dv_BV),
                    _desc(dv, BT, dv_BV), N, H, Dk, Dv, NT, scale, dv_blocks, groups),
                    dict(BT=BT, BK=BK, KD=KD, BV=dv_BV, CPP=dv_flat, MMA=mma, IEEE=ieee, num_warps=cfg["dv_warps"],
                         num_stages=cfg["dv_flat_stages"] or cfg["stages"])))
                continue
            calls.append((f"dv{'w' * wide}", gla_dv_kernel, (B * H * NT * dv_blocks,), (
                q, k, g, do, dhs, dv, *q.stride(), *k.stride(), *g_strides, *do.stride(), N, H, Dk, Dv, NT, scale,
                dv_blocks), dict(BT=BT, BK=BK, KD=KD, BV=dv_BV, MMA=mma, IEEE=ieee, WIDE=wide, FLAG=flag,
                                 KBLOCKS=kblocks, KBP=max(2, triton.next_power_of_2(kblocks)),
                                 num_warps=cfg["dv_warps"], num_stages=cfg["stages"],
                                 **({"maxnreg": cfg["dv_maxnreg"]} if cfg["dv_maxnreg"] and wide != 2 else {}),
                                 **({"DVFORM": cfg["dv_form"]} if cfg["dv_form"] and wide == 1 else {}))))
        bk_dg = min(BK, cfg["BK_DG"])
        if not fused:
            calls.append(("dg", gla_dg_kernel, (B * H, -(-Dk // bk_dg)), (
                g, dg, tot, ht if has_ht else dg, dht if has_ht else dg, *g_strides, *(ht.stride() if has_ht else z4),
                *(dht.stride() if has_ht else z4), N, H, Dk, Dv, NT), dict(BT=BT, BK=bk_dg, BVF=BVF, HAS_HT=has_ht,
                                                                              num_warps=4)))
        if steps is not None:  # the caller launches (or compiles) them
            steps.extend(calls)
        else:
            with dispatch.on_device(dev):
                for _, kernel, grid, args, kw in calls:
                    kernel[grid](*args, **kw)
    elif N == 0:
        dg.zero_()
        if dh0 is not None:
            dh0.copy_(dht if has_dht else torch.zeros_like(dh0))
    if not direct:
        dq, dk, dv = dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
        if out is not None:
            for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
                out[name].copy_(t)
            dq, dk, dv = out["dq"], out["dk"], out["dv"]
    return dq, dk, dv, dg, None, dh0

"""The chunked linear-attention forward for Hopper on the tiles template (tilecore/tiles/gluon/pipeline.py):
phi(x) = x with no decay or a scalar log decay, Mamba-2's beta (dt), D and z, grouped q/k heads.

The template's parts:

* a tile is two units of (head, BV = 64 value columns) of one batch row that read the same q/k head
  (one head's two value blocks at Dv = 128; two heads of one q/k group at Dv = 64, Mamba-2's);
  ``setup`` gives its cdiv(N, BT) steps, one chunk of BT = 64 tokens each;
* a stage is the chunk's q and k [BT, Dk] and each unit's v [BT, BV], TMA-loaded by the 1-warp producer
  through 4-D descriptors of (B, H, N, D) views (tokens past N arrive as zeros);
* consumer c (a warpgroup) owns unit c: its state S [Dk, BV] float32 lives in registers as a wgmma
  accumulator for the whole walk. Each step (chunk):

      P      = mask(Q K^T * exp(G_i - G_j) * beta_j) * scale           wgmma, Q and K from shared memory
      o      = P V + exp(G_i) scale (Q S)                              P from registers; S as bf16 in
                                                                       shared memory (the B operand)
      S     <- exp(G_last) S + K^T (exp(G_last - G_j) beta_j V_j)      K^T from shared memory (transposed)
      o      = (o + D v) * silu(z), TMA-stored (rows past N clipped)

The cumulative decay G counts from the chunk's start as in kernels_tl.py (every exponent a difference
<= 0, log decays clamped at -100); the host sums it (``chunk_cumulative``: a torch cumsum over
(B, N, H) float32, 1/32 of q's bytes at Dk 128), so the consumers hold no [BT, BT] reductions.
Rounding: P, S and exp(G_last - G_j) beta_j V_j go to the tensor cores in the input dtype, as in
la_fwd_kernel; with beta (Mamba-2), beta_j V_j too (la_fwd_kernel keeps beta in float32 on P's columns:
here that column factor spilled 1 KB of registers), as mamba_ssm rounds x dt.

launch_args builds the descriptors and checks the fit (``fits``); the tl kernels (kernels_tl.py,
kernels_forward.py) are this kernel's twins for other GPUs and the interpreter.
"""
import math

import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import (Layout, join_n, ring, run, split_n, stage_struct, store_block, struct, wgmma_layout,
                                  wgmma_lhs_layout)
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait

LOG_DECAY_FLOOR_HOST = -100.0  # kernels_tl.LOG_DECAY_FLOOR's (a float for torch: a constexpr is no number)
BT_GLUON = 64  # tokens a chunk (a wgmma's M)
BV_GLUON = 64  # value columns a consumer
LOG2E = 1.4426950408889634
# FACTORED's largest span of a chunk's G (log2 units): 2^+-60 factors, whose products stay in float32's
# normal range (2^+-126)
FACTOR_SPAN = gl.constexpr(120.0)
# timing probes (the kernel's PROBE; experiments/linear_attention/gpu_forward.py --set s30): each bit leaves a
# part of a chunk's work out, so the time it saves says what binds. Outputs are wrong; never in a real launch.
# The plain (not OVERLAP) walk only.
PROBE_NO_INTRA = gl.constexpr(1)  # no Q K^T and no P V wgmma (P made from zeros)
PROBE_NO_UPDATE = gl.constexpr(2)  # no state-update wgmma (S only decays)
PROBE_NO_STORE = gl.constexpr(4)  # o made, not stored
PROBE_NO_INTER = gl.constexpr(8)  # no Q S_old wgmma
PROBE_NO_DECAY_FACTORS = gl.constexpr(16)  # no [BT, BT] decay factors on the scores (no exps)
PROBE_NO_EPILOGUE = gl.constexpr(32)  # no Mamba-2 epilogue (D v, the gate z: z still loaded by the stage)


@stage_struct
class Chunk:
    q: object  # [1, 1, BT, BK]
    k: object  # [1, 1, BT, BK]
    va: object  # [1, 1, BT, BV]: unit 0's values
    vb: object  # [1, 1, BT, BV]: unit 1's


@stage_struct
class ChunkZ:
    """A stage with Mamba-2's gate z TMA-loaded beside v (Z_STAGE)."""
    q: object
    k: object
    va: object
    vb: object
    za: object  # [1, 1, BT, BV]: unit 0's z
    zb: object  # unit 1's


@stage_struct
class ChunkG:
    """A stage with each unit's cumulative log decay TMA-loaded beside v (G_STAGE)."""
    q: object
    k: object
    va: object
    vb: object
    ga: object  # [1, 1, BT] float32: unit 0's G (log2 units, from chunk_cumulative_heads)
    gb: object  # unit 1's


@stage_struct
class ChunkGZ:
    """G_STAGE and Z_STAGE together."""
    q: object
    k: object
    va: object
    vb: object
    za: object
    zb: object
    ga: object
    gb: object


@stage_struct
class ChunkGB:
    """G_STAGE with beta (Mamba-2's dt): beta head-major through the stage too."""
    q: object
    k: object
    va: object
    vb: object
    ga: object
    gb: object
    ba: object  # [1, 1, BT] float32: unit 0's beta
    bb: object  # unit 1's


@stage_struct
class ChunkGBZ:
    """G_STAGE with beta, and Z_STAGE."""
    q: object
    k: object
    va: object
    vb: object
    za: object
    zb: object
    ga: object
    gb: object
    ba: object
    bb: object


@struct
class Units:
    b: object  # batch row
    u0: object  # the first unit: (head, value block) = (u0 // VB, u0 % VB)


@struct
class Walk:
    S: object  # [BK, BV] float32: the unit's state, a wgmma accumulator
    # PREFETCH: this chunk's per-token factors, loaded during the previous chunk (else 0)
    G_r: object  # [BT] the cumulative log decay by row
    G_last: object  # the chunk's last token's
    beta_r: object  # [BT] beta by row


@struct
class LinearAttentionForward:
    q_desc: object
    k_desc: object
    v_desc: object
    o_desc: object
    z_desc: object  # Z_STAGE with z: z's TMA descriptor (else unused)
    g_desc: object  # G_STAGE with a decay: the head-major G's TMA descriptor (else unused)
    b_desc: object  # G_STAGE with beta: the head-major beta's (else unused)
    G: object
    BETA: object
    DSKIP: object
    Z: object
    H0: object
    HT: object
    sgb: object
    sgn: object
    sgh: object
    sbb: object
    sbn: object
    sbh: object
    szb: object
    szn: object
    szh: object
    sdh: object
    s0b: object
    s0h: object
    s0f: object
    s0v: object
    stb: object
    sth: object
    stf: object
    stv: object
    N: object
    H: object
    VB: object
    GROUP: object
    scale: object
    state_smem: object  # [2, BK, BV]: each consumer's S in the input dtype (the B operand of Q S)
    wv_smem: object  # [2, BT, BV] (OVERLAP: [4, ..]): each consumer's weighted values (B operands of K^T V, P V)
    bv_smem: object  # LEAN with EARLY_WV and beta: [2, BT, BV], each consumer's beta V in an allocation of its own (the
    # barrier analysis then puts no bar.sync between its stores and wv's); else wv_smem (unused)
    BT: gl.constexpr
    BK: gl.constexpr
    BV: gl.constexpr
    DECAY: gl.constexpr
    HAS_BETA: gl.constexpr
    HAS_D: gl.constexpr
    HAS_Z: gl.constexpr
    HAS_H0: gl.constexpr
    STORE_HT: gl.constexpr
    PREFETCH: gl.constexpr  # G and beta a chunk ahead (registers)
    Z_STAGE: gl.constexpr  # z through the stage (TMA), silu by an approximate division
    OVERLAP: gl.constexpr  # Q K^T, Q S and the state update issued together (async wgmma)
    G_STAGE: gl.constexpr  # G (head-major, log2 units) through the stage (TMA): no global load on the walk
    FACTORED: gl.constexpr  # (with G_STAGE) exp2(G_i - G_j) as a row times a column factor where the chunk's
    # range of G allows it (no [BT, BT] exps); the elementwise exps where it does not
    EARLY_WV: gl.constexpr  # the state update's weighted values stored with the old state (one barrier pair)
    ASYNC_UPDATE: gl.constexpr  # (with EARLY_WV) Q S_old and the state update issued async after Q K^T, under P
    SILU_TANH: gl.constexpr  # (Z_STAGE) the gate's sigmoid as 0.5 + 0.5 tanh(z / 2): one SFU op, not ex2 and rcp
    EXP2_FMA: gl.constexpr  # (G_STAGE) the [BT, BT] decay exps' right half (1) or quarter (2) by exp2_fma (FMA and
    # integer pipes) beside the SFU's ex2 for the rest
    PROBE: gl.constexpr  # timing probes only (wrong outputs; 0 in every real launch): PROBE_* bits leave work out
    D_EARLY: gl.constexpr  # (EARLY_WV, D) D v made from the chunk's first v load, added with Q S's row scale: no
    # second v load and conversion in the epilogue
    LEAN: gl.constexpr  # (G_STAGE, not FACTORED / EXP2_FMA) one causal select on P (the exps take the unmasked
    # difference: +inf above the diagonal, selected away), and with beta the scale on beta V's rows, not on P; with
    # EARLY_WV and beta, beta V in bv_smem (no barrier between its stores and wv's)
    UPDATE_LATE: gl.constexpr  # (EARLY_WV) P V and the state update issued async together; o's epilogue and
    # store run while the update does, its wait at the chunk's end
    Q_REG: gl.constexpr  # q loaded into registers once a chunk, the A operand of Q K^T and Q S (not read twice
    # from shared memory by the wgmmas)
    BETA_LOG: gl.constexpr  # (LEAN with beta and EARLY_WV) the stage's beta holds Gb = G - log2(beta scale) (the host's
    # ``beta_log``): P's column factor 2^(G_i - Gb_j) carries beta and the scale, the update's 2^(G_last - Gb_j) / scale
    # beta: no beta V (P V reads v from the stage)
    SL: gl.constexpr  # [BT, BT] scores and [BT, BV] outputs (BT == BV): one wgmma layout
    STL: gl.constexpr  # [BK, BV] state
    PL: gl.constexpr  # P as the register operand of P V

    @gluon.jit
    def setup(self, tile_id):
        units = self.H * self.VB // 2
        return Units(tile_id // units, (tile_id % units) * 2), gl.cdiv(self.N, self.BT)

    @gluon.jit
    def unit(self, tile, c: gl.constexpr):
        """(head, first value column) of the tile's unit c."""
        u = tile.u0 + c
        return u // self.VB, (u % self.VB) * self.BV

    @gluon.jit
    def load(self, stage, bar, tile, step):
        h0, c0 = self.unit(tile, 0)
        h1, c1 = self.unit(tile, 1)
        t0 = step * self.BT
        tma.async_copy_global_to_shared(self.q_desc, [tile.b, h0 // self.GROUP, t0, 0], bar, stage.q)
        tma.async_copy_global_to_shared(self.k_desc, [tile.b, h0 // self.GROUP, t0, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h0, t0, c0], bar, stage.va)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h1, t0, c1], bar, stage.vb)
        if self.Z_STAGE and self.HAS_Z:
            tma.async_copy_global_to_shared(self.z_desc, [tile.b, h0, t0, c0], bar, stage.za)
            tma.async_copy_global_to_shared(self.z_desc, [tile.b, h1, t0, c1], bar, stage.zb)
        if self.G_STAGE and self.DECAY:
            tma.async_copy_global_to_shared(self.g_desc, [tile.b, h0, t0], bar, stage.ga)
            tma.async_copy_global_to_shared(self.g_desc, [tile.b, h1, t0], bar, stage.gb)
            if self.HAS_BETA:
                tma.async_copy_global_to_shared(self.b_desc, [tile.b, h0, t0], bar, stage.ba)
                tma.async_copy_global_to_shared(self.b_desc, [tile.b, h1, t0], bar, stage.bb)

    @gluon.jit
    def start(self, ctx, tile, prev):
        S = gl.zeros([self.BK, self.BV], gl.float32, self.STL)
        if self.HAS_H0:
            h, col = self.unit(tile, ctx.index)
            S = gl.load(self.state_ptrs(self.H0, tile.b, h, col, self.s0b, self.s0h, self.s0f, self.s0v))
        walk = Walk(S, 0, 0, 0)
        if self.PREFETCH:
            G_r, G_last, beta_r = self.chunk_factors(tile, ctx.index, 0)
            walk = Walk(S, G_r, G_last, beta_r)
        return walk

    @gluon.jit
    def chunk_factors(self, tile, c: gl.constexpr, step):
        """(G by row, G of the last token, beta by row) of chunk ``step`` of unit c (0 where absent; rows
        past N 0; a step past the walk reads nothing)."""
        h, col = self.unit(tile, c)
        t0 = step * self.BT
        offs_r = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        row_ok = t0 + offs_r < self.N
        G_r = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.SL))
        beta_r = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.SL))
        G_last = 0.0
        if self.DECAY:
            g_base = self.G + tile.b.to(gl.int64) * self.sgb + h.to(gl.int64) * self.sgh + t0.to(gl.int64) * self.sgn
            G_r = gl.load(g_base + offs_r * self.sgn, mask=row_ok, other=0.0)
            last = gl.maximum(gl.minimum(self.BT, self.N - t0) - 1, 0)
            G_last = gl.load(g_base + last * self.sgn, mask=t0 < self.N, other=0.0)
        if self.HAS_BETA:
            b_base = self.BETA + tile.b.to(gl.int64) * self.sbb + h.to(gl.int64) * self.sbh + t0.to(gl.int64) * self.sbn
            beta_r = gl.load(b_base + offs_r * self.sbn, mask=row_ok, other=0.0)
        return G_r, G_last, beta_r

    @gluon.jit
    def state_ptrs(self, base, b, h, col, sb, sh, sf, sv):
        rows = gl.arange(0, self.BK, layout=gl.SliceLayout(1, self.STL))
        cols = col + gl.arange(0, self.BV, layout=gl.SliceLayout(0, self.STL))
        return (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(rows.to(gl.int64) * sf, 1)
                + gl.expand_dims(cols.to(gl.int64) * sv, 0))

    @gluon.jit
    def decay_factors(self, G_r, G_c, causal):
        """[BT, BT] 2^(G_i - G_j) on and below the diagonal (G in log2 units; above it anything finite or
        not: the caller masks P there). FACTORED: where the chunk's G spans at most FACTOR_SPAN, the outer
        product of 2^(G_i - m) and 2^(m - G_j) about the middle m of that span (each factor within
        2^+-FACTOR_SPAN/2, so neither overflows nor leaves float32's normal range: a few ulp, as the exp2)
        and 18 exps a thread instead of 32; strong decays or a reset in the chunk: the elementwise exp2 of
        the masked difference (a NaN in G: the same rows and columns NaN either way)."""
        if self.LEAN:  # (the caller's select takes the entries above the diagonal: +inf there is never used)
            f = gl.exp2(gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0))
        elif self.FACTORED:
            hi = gl.max(G_c, axis=0)
            lo = gl.min(G_c, axis=0)
            if hi - lo <= FACTOR_SPAN:
                mid = 0.5 * (hi + lo)
                f = gl.expand_dims(gl.exp2(G_r - mid), 1) * gl.expand_dims(gl.exp2(mid - G_c), 0)
            else:
                f = self.exp2_shared(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
        else:
            f = self.exp2_shared(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
        return f

    @gluon.jit
    def exp2_shared(self, d):
        """2^d of a [BT, BT] tile: by the SFU's ex2, or (EXP2_FMA) part of it by exp2_fma on the FMA pipe, so
        both pipes share the chunk's 32 exps a thread (split_n: no data moves between threads)."""
        if self.EXP2_FMA == 0:
            f = gl.exp2(d)
        else:
            d_lo, d_hi = split_n(d)
            if self.EXP2_FMA == 1:
                f = join_n(gl.exp2(d_lo), exp2_fma(d_hi))
            else:
                d_hl, d_hh = split_n(d_hi)
                hi = gl.convert_layout(join_n(gl.exp2(d_hl), exp2_fma(d_hh)), d_lo.type.layout)
                f = join_n(gl.exp2(d_lo), hi)
            f = gl.convert_layout(f, self.SL)  # (join_n's linear layout is SL's: nothing moves)
        return f

    @gluon.jit
    def compute(self, ctx, walk, stage, tile, step):
        """One chunk. Ordered so that few [BT, BT] / [BT, BV] tiles are live beside S: the state goes to
        shared memory and is updated first (S's old value is then read there), the scores next, o last."""
        c: gl.constexpr = ctx.index
        h, col = self.unit(tile, c)
        b64 = tile.b.to(gl.int64)
        h64 = h.to(gl.int64)
        q = stage.q.reshape([self.BT, self.BK])
        k = stage.k.reshape([self.BT, self.BK])
        if c == 0:
            v = stage.va.reshape([self.BT, self.BV])
        else:
            v = stage.vb.reshape([self.BT, self.BV])
        dtype: gl.constexpr = self.q_desc.dtype
        t0 = step * self.BT
        rows = t0 + gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        cols = t0 + gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
        row_ok = rows < self.N
        col_ok = cols < self.N

        # per-token factors: G (the chunk's cumulative log decay, from the host), beta
        # (64-bit bases at the chunk's first token, 32-bit offsets within it)
        g_base = self.G + b64 * self.sgb + h64 * self.sgh + t0.to(gl.int64) * self.sgn
        b_base = self.BETA + b64 * self.sbb + h64 * self.sbh + t0.to(gl.int64) * self.sbn
        offs_r = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        offs_c = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
        w_rows = gl.where(row_ok, 1.0, 0.0)  # each token's weight in the state update
        S_decay = 1.0
        if self.G_STAGE:
            # G (log2 units) by row and by column from the stage (the TMA brought it with q, k, v: nothing to
            # wait for on the walk); the chunk's last token's from the column copy (the host pads G past N
            # with the last token's, so row BT - 1 is it)
            if self.DECAY:
                if c == 0:
                    g_smem = stage.ga.reshape([self.BT])
                else:
                    g_smem = stage.gb.reshape([self.BT])
                G_r = g_smem.load(gl.SliceLayout(1, self.SL))
                G_c = g_smem.load(gl.SliceLayout(0, self.SL))
                G_last = gl.sum(gl.where(offs_c == self.BT - 1, G_c, 0.0), axis=0)
                if self.HAS_BETA:  # (0 past N: the host's pad; BETA_LOG: Gb, +inf past N)
                    if c == 0:
                        b_smem = stage.ba.reshape([self.BT])
                    else:
                        b_smem = stage.bb.reshape([self.BT])
                    beta_r = b_smem.load(gl.SliceLayout(1, self.SL))
                    if self.BETA_LOG:
                        Gb_c = b_smem.load(gl.SliceLayout(0, self.SL))
            elif self.HAS_BETA:
                beta_r = gl.load(b_base + offs_r * self.sbn, mask=row_ok, other=0.0)
        elif self.PREFETCH:
            # the next chunk's factors now (their latency under this chunk's work); this chunk's came
            # with the walk. G by column reads what the last chunk's prefetch brought into L1
            nxt_G_r, nxt_G_last, nxt_beta_r = self.chunk_factors(tile, c, step + 1)
            G_r, G_last, beta_r = walk.G_r, walk.G_last, walk.beta_r
            if self.DECAY:
                G_c = gl.load(g_base + offs_c * self.sgn, mask=col_ok, other=0.0)
        else:
            if self.DECAY:
                G_r = gl.load(g_base + offs_r * self.sgn, mask=row_ok, other=0.0)
                G_c = gl.load(g_base + offs_c * self.sgn, mask=col_ok, other=0.0)
                G_last = gl.load(g_base + (gl.minimum(self.BT, self.N - t0) - 1) * self.sgn)
            if self.HAS_BETA:
                beta_r = gl.load(b_base + offs_r * self.sbn, mask=row_ok, other=0.0)
        if self.DECAY:
            if self.BETA_LOG:  # beta_r holds Gb = G - log2(beta scale): 2^(G_last - Gb) / scale = 2^(G_last - G) beta
                w_rows = w_rows * gl.exp2(G_last - beta_r) * (1.0 / self.scale)
                S_decay = gl.exp2(G_last)
            elif self.G_STAGE:
                w_rows = w_rows * gl.exp2(G_last - G_r)
                S_decay = gl.exp2(G_last)
            else:
                w_rows = w_rows * gl.exp(G_last - G_r)
                S_decay = gl.exp(G_last)
        if self.HAS_BETA and not self.BETA_LOG:
            w_rows = w_rows * beta_r

        S_smem = self.state_smem.index(c)
        causal = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        row_scale = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.SL)) + self.scale
        if self.OVERLAP:
            # every operand to shared memory first (the old S; beta V and the state update's weighted V in
            # buffers of their own), then Q K^T, Q S_old and the state update issued together; P is made
            # while Q S and the update run, P V chained after Q S
            wv = self.wv_smem.index(2 * c)  # the state update's exp(G_last - G_j) beta_j V_j
            bv = self.wv_smem.index(2 * c + 1)  # beta_j V_j (P V's B operand, with beta)
            gl.thread_barrier()  # the previous step's wgmmas have read the buffers
            S_smem.store(walk.S.to(dtype))
            v_f = v.load(self.SL).to(gl.float32)
            wv.store((v_f * gl.expand_dims(w_rows, 1)).to(dtype))
            if self.HAS_BETA:
                bv.store((v_f * gl.expand_dims(beta_r, 1)).to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            s_tok = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL),
                                  use_acc=False, is_async=True)
            o_tok = warpgroup_mma(q, S_smem, gl.zeros([self.BT, self.BV], gl.float32, self.SL), use_acc=False,
                                  is_async=True)
            S_tok = warpgroup_mma(k.permute((1, 0)), wv, walk.S * S_decay, is_async=True)
            s = warpgroup_mma_wait(2, deps=(s_tok,))
            if self.DECAY:
                if self.G_STAGE:
                    s = s * self.decay_factors(G_r, G_c, causal)
                    row_scale = row_scale * gl.exp2(G_r)
                else:
                    s = s * gl.exp(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
                    row_scale = row_scale * gl.exp(G_r)
            p = gl.convert_layout(gl.where(causal, s * self.scale, 0.0).to(dtype), self.PL)
            o = warpgroup_mma_wait(1, deps=(o_tok,)) * gl.expand_dims(row_scale, 1)
            if self.HAS_BETA:
                o_tok = warpgroup_mma(p, bv, o, is_async=True)
            else:
                o_tok = warpgroup_mma(p, v, o, is_async=True)
            o, S = warpgroup_mma_wait(0, deps=(o_tok, S_tok))
        else:
            # the old state to shared memory (the B operand of Q S); with beta, beta_j V_j as P V's B operand
            # (beta on V's rows, not P's columns: one [BT, BV] product, and the scores keep no column factor
            # but the decay's, which spilled 1 KB at Mamba-2's shape)
            # EARLY_WV: the state update's weighted values stored here too (beta V, with beta, in a buffer of
            # its own), so one barrier pair a chunk serves every shared-memory operand
            SPLIT_BV: gl.constexpr = self.LEAN and self.EARLY_WV and self.HAS_BETA and not self.BETA_LOG  # (bv_smem)
            RING4: gl.constexpr = self.EARLY_WV and self.HAS_BETA and not SPLIT_BV and not self.BETA_LOG
            wv = self.wv_smem.index(2 * c if RING4 else c)  # ([4, ..] only then)
            # LEAN with beta: P V's beta V carries the scale (P none): a factor on BT rows, not BT x BT entries
            if self.HAS_BETA:
                beta_pv = beta_r
                if self.LEAN:
                    beta_pv = beta_r * self.scale
            q_a = q  # Q_REG: q in registers (the A operand of Q K^T and Q S), else the shared-memory tile
            if self.Q_REG:
                q_a = q.load(self.PL)
            gl.thread_barrier()  # the previous step's wgmmas have read both buffers
            S_smem.store(walk.S.to(dtype))
            if self.EARLY_WV:
                v_f = v.load(self.SL).to(gl.float32)
                wv.store((v_f * gl.expand_dims(w_rows, 1)).to(dtype))
                if self.HAS_BETA and not self.BETA_LOG:
                    if SPLIT_BV:
                        bv = self.bv_smem.index(c)
                    else:
                        bv = self.wv_smem.index(2 * c + 1)
                    bv.store((v_f * gl.expand_dims(beta_pv, 1)).to(dtype))
                if self.D_EARLY:  # D v now, from this load (added to o with Q S's row scale)
                    d_row = gl.load(self.DSKIP + (h64 * self.sdh + col) + gl.arange(0, self.BV,
                                                                                   layout=gl.SliceLayout(0, self.SL)))
                    dv = gl.expand_dims(d_row, 0) * v_f
            elif self.HAS_BETA:
                wv.store((v.load(self.SL).to(gl.float32) * gl.expand_dims(beta_pv, 1)).to(dtype))
            fence_async_shared()
            gl.thread_barrier()

            # intra-chunk scores P = mask(Q K^T exp(G_i - G_j)) scale
            if self.PROBE & PROBE_NO_INTRA:
                s = gl.zeros([self.BT, self.BT], gl.float32, self.SL) + gl.expand_dims(w_rows, 1)
            else:
                s = warpgroup_mma(q_a, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL),
                                  use_acc=False)
            if self.ASYNC_UPDATE:
                # Q S_old and the state update (their operands in shared memory since the chunk's one barrier
                # pair: EARLY_WV) on the tensor cores while P is made
                o_tok = warpgroup_mma(q_a, S_smem, gl.zeros([self.BT, self.BV], gl.float32, self.SL), use_acc=False,
                                      is_async=True)
                S_tok = warpgroup_mma(k.permute((1, 0)), wv, walk.S * S_decay, is_async=True)
            if self.DECAY and (self.PROBE & PROBE_NO_DECAY_FACTORS) == 0:
                if self.BETA_LOG:  # beta_j and the scale in the column's exponent (+inf above the diagonal: selected)
                    s = s * gl.exp2(gl.expand_dims(G_r, 1) - gl.expand_dims(Gb_c, 0))
                    row_scale = row_scale * gl.exp2(G_r)
                elif self.G_STAGE:
                    s = s * self.decay_factors(G_r, G_c, causal)
                    row_scale = row_scale * gl.exp2(G_r)
                else:
                    s = s * gl.exp(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
                    row_scale = row_scale * gl.exp(G_r)
            if self.LEAN and self.HAS_BETA:  # (the scale is on beta V's rows, or BETA_LOG's exponent)
                p_f = gl.where(causal, s, 0.0)
            else:
                p_f = gl.where(causal, s * self.scale, 0.0)
            p = gl.convert_layout(p_f.to(dtype), self.PL)

            # o = exp(G_i) scale (Q S_old) + P (beta V)
            if self.ASYNC_UPDATE:
                o = warpgroup_mma_wait(1, deps=(o_tok,))
            elif self.PROBE & PROBE_NO_INTER:
                o = gl.zeros([self.BT, self.BV], gl.float32, self.SL) + gl.expand_dims(row_scale, 1)
            else:
                o = warpgroup_mma(q_a, S_smem, gl.zeros([self.BT, self.BV], gl.float32, self.SL), use_acc=False)
            if self.UPDATE_LATE:
                # P V and the state update in flight together; o's wait leaves the update running under the
                # epilogue (wgmma groups retire in order: the update's wait is the chunk's last)
                if self.D_EARLY:
                    o = o * gl.expand_dims(row_scale, 1) + dv
                else:
                    o = o * gl.expand_dims(row_scale, 1)
                if self.HAS_BETA and not self.BETA_LOG:
                    o_tok = warpgroup_mma(p, bv, o, is_async=True)
                else:
                    o_tok = warpgroup_mma(p, v, o, is_async=True)
                S_tok = warpgroup_mma(k.permute((1, 0)), wv, walk.S * S_decay, is_async=True)
                o = warpgroup_mma_wait(1, deps=(o_tok,))
            elif self.PROBE & PROBE_NO_INTRA:
                o = o * gl.expand_dims(row_scale, 1) + p_f  # (P's elementwise work kept: BT == BV)
            elif self.D_EARLY:
                if self.HAS_BETA and not self.BETA_LOG:
                    o = warpgroup_mma(p, bv, o * gl.expand_dims(row_scale, 1) + dv)
                else:
                    o = warpgroup_mma(p, v, o * gl.expand_dims(row_scale, 1) + dv)
            elif self.HAS_BETA and not self.BETA_LOG:
                if self.EARLY_WV:
                    o = warpgroup_mma(p, bv, o * gl.expand_dims(row_scale, 1))
                else:
                    o = warpgroup_mma(p, wv, o * gl.expand_dims(row_scale, 1))
            else:
                o = warpgroup_mma(p, v, o * gl.expand_dims(row_scale, 1))

            # S <- exp(G_last) S + K^T (exp(G_last - G_j) beta_j V_j)
            if not self.EARLY_WV:
                gl.thread_barrier()  # P V has read wv
                wv.store((v.load(self.SL).to(gl.float32) * gl.expand_dims(w_rows, 1)).to(dtype))
                fence_async_shared()
                gl.thread_barrier()
            if self.UPDATE_LATE:
                S = walk.S  # (the update's result: at the chunk's end, below)
            elif self.ASYNC_UPDATE:
                S = warpgroup_mma_wait(0, deps=(S_tok,))  # (P V's wait retired it: wgmma groups end in order)
            elif self.PROBE & PROBE_NO_UPDATE:
                S = walk.S * S_decay
            else:
                S = warpgroup_mma(k.permute((1, 0)), wv, walk.S * S_decay)

        # Mamba-2's epilogue and the store (rows past N clipped by TMA)
        offs_v = gl.arange(0, self.BV, layout=gl.SliceLayout(0, self.SL))
        if self.HAS_D and not self.D_EARLY and (self.PROBE & PROBE_NO_EPILOGUE) == 0:
            d_row = gl.load(self.DSKIP + (h64 * self.sdh + col) + offs_v)
            o = o + gl.expand_dims(d_row, 0) * v.load(self.SL).to(gl.float32)
        if self.HAS_Z and (self.PROBE & PROBE_NO_EPILOGUE) == 0:
            if self.Z_STAGE:  # z came with the stage
                if c == 0:
                    z = stage.za.reshape([self.BT, self.BV]).load(self.SL).to(gl.float32)
                else:
                    z = stage.zb.reshape([self.BT, self.BV]).load(self.SL).to(gl.float32)
            else:
                z_base = self.Z + b64 * self.szb + h64 * self.szh + t0.to(gl.int64) * self.szn + col
                z_offs = gl.expand_dims(offs_r * self.szn, 1) + gl.expand_dims(offs_v, 0)
                z = gl.load(z_base + z_offs, mask=gl.expand_dims(row_ok, 1), other=0.0).to(gl.float32)
            if self.Z_STAGE and self.SILU_TANH:  # sigmoid(z) = (1 + tanh(z / 2)) / 2: one tanh.approx (2^-11)
                z_half = 0.5 * z
                o = o * (z_half + z_half * tanh_approx(z_half))
            elif self.Z_STAGE:  # silu by an approximate division (div.full: 2 ulp of float32, then rounded to bf16)
                o = gl.fdiv(o * z, 1.0 + gl.exp2(-z * 1.4426950408889634), ieee_rounding=False)
            else:
                o = o * z / (1.0 + gl.exp(-z))
        if self.PROBE & PROBE_NO_STORE:
            if t0 < 0:  # never: o is made but not stored
                store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])
        else:
            store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])
        if self.UPDATE_LATE:
            S = warpgroup_mma_wait(0, deps=(S_tok,))
        walk = Walk(S, 0, 0, 0)
        if self.PREFETCH:
            walk = Walk(S, nxt_G_r, nxt_G_last, nxt_beta_r)
        return walk

    @gluon.jit
    def wait(self, ctx, walk):
        return walk

    @gluon.jit
    def finish(self, ctx, walk, tile):
        if self.STORE_HT:
            h, col = self.unit(tile, ctx.index)
            gl.store(self.state_ptrs(self.HT, tile.b, h, col, self.stb, self.sth, self.stf, self.stv), walk.S)


@gluon.jit
def la_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_desc, z_desc, g_desc, b_desc, G, BETA, DSKIP, Z, H0, HT,
                        sgb, sgn, sgh, sbb, sbn, sbh, szb, szn, szh, sdh, s0b, s0h, s0f, s0v, stb, sth, stf, stv,
                        N, H, VB, GROUP, scale, num_tiles,
                        STAGES: gl.constexpr, DECAY: gl.constexpr, HAS_BETA: gl.constexpr, HAS_D: gl.constexpr,
                        HAS_Z: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr,
                        PREFETCH: gl.constexpr = False, OVERLAP: gl.constexpr = False, Z_STAGE: gl.constexpr = False,
                        G_STAGE: gl.constexpr = False, FACTORED: gl.constexpr = False,
                        EARLY_WV: gl.constexpr = False, ASYNC_UPDATE: gl.constexpr = False,
                        SILU_TANH: gl.constexpr = False, EXP2_FMA: gl.constexpr = 0, PROBE: gl.constexpr = 0,
                        D_EARLY: gl.constexpr = False, LEAN: gl.constexpr = False, UPDATE_LATE: gl.constexpr = False,
                        Q_REG: gl.constexpr = False, BETA_LOG: gl.constexpr = False):
    """o (and the final states) of every unit of (batch, head, 64 value columns); a persistent grid, two
    consumer warpgroups (num_warps = 4) and a producer warp. PREFETCH: each chunk's decay and beta loaded
    a chunk ahead. Z_STAGE: z TMA-loaded with the stage (off the walk's serial path). OVERLAP: the chunk's
    three independent wgmmas in flight together. G_STAGE: G (head-major, log2 units: chunk_cumulative_heads)
    TMA-loaded with the stage, and with beta (chunk_heads) beta too. FACTORED (with G_STAGE): the intra-chunk
    decay as row times column factors where the chunk's span of G allows. EARLY_WV: the state update's weighted values stored beside the old
    state at the chunk's start (one barrier pair a chunk fewer; not with OVERLAP). ASYNC_UPDATE (with
    EARLY_WV): Q S_old and the state update issued async right after Q K^T, so they run while P is made.
    SILU_TANH (with Z_STAGE): the gate's sigmoid by one tanh.approx.f32. EXP2_FMA (with G_STAGE): 1 (2): half (a
    quarter) of the [BT, BT] decay exps by exp2_fma on the FMA pipe. Step variants (not with OVERLAP, PROBE): D_EARLY
    (with EARLY_WV and D) D v from the chunk's first v load, added with Q S's row scale; LEAN (with G_STAGE, not
    FACTORED / EXP2_FMA) one causal select on P and, with beta, the scale on beta V; UPDATE_LATE (with EARLY_WV, not
    ASYNC_UPDATE) P V and the update async, the update's wait after o's store; Q_REG q as the register operand."""
    BT: gl.constexpr = q_desc.block_type.shape[2]
    BK: gl.constexpr = q_desc.block_type.shape[3]
    BV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(BT == BV, "the scores' and the outputs' layouts are one: BT == BV")
    SL: gl.constexpr = wgmma_layout(BT, BV, gl.num_warps())
    STL: gl.constexpr = wgmma_layout(BK, BV, gl.num_warps())
    PL: gl.constexpr = wgmma_lhs_layout(BT, BV, gl.num_warps())
    operand_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    state_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BK, BV], operand_layout)
    LEAN_ON: gl.constexpr = LEAN and G_STAGE and DECAY and not FACTORED and EXP2_FMA == 0 and not OVERLAP
    BETA_LOG_ON: gl.constexpr = BETA_LOG and LEAN_ON and HAS_BETA and EARLY_WV
    SPLIT_BV: gl.constexpr = LEAN_ON and EARLY_WV and HAS_BETA and not BETA_LOG_ON  # (beta V's own allocation)
    RING4: gl.constexpr = OVERLAP or (EARLY_WV and HAS_BETA and not SPLIT_BV and not BETA_LOG_ON)
    wv_smem = gl.allocate_shared_memory(q_desc.dtype, [4 if RING4 else 2, BT, BV], operand_layout)
    bv_smem = wv_smem
    if SPLIT_BV:
        bv_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BT, BV], operand_layout)
    gl.static_assert(not (G_STAGE and PREFETCH), "G_STAGE replaces PREFETCH's G loads")
    op = LinearAttentionForward(q_desc, k_desc, v_desc, o_desc, z_desc, g_desc, b_desc, G, BETA, DSKIP, Z, H0, HT,
                                sgb, sgn, sgh, sbb, sbn, sbh, szb, szn, szh, sdh, s0b, s0h, s0f, s0v, stb, sth, stf,
                                stv, N, H, VB, GROUP, scale, state_smem, wv_smem, bv_smem, BT, BK, BV, DECAY, HAS_BETA,
                                HAS_D, HAS_Z, HAS_H0, STORE_HT, PREFETCH, Z_STAGE, OVERLAP, G_STAGE and DECAY,
                                FACTORED and G_STAGE and DECAY, EARLY_WV and not OVERLAP,
                                ASYNC_UPDATE and EARLY_WV and not OVERLAP, SILU_TANH and Z_STAGE,
                                EXP2_FMA if G_STAGE and DECAY else 0, PROBE,
                                D_EARLY and EARLY_WV and DECAY and HAS_D and not OVERLAP and PROBE == 0,
                                LEAN_ON,
                                UPDATE_LATE and EARLY_WV and DECAY and not ASYNC_UPDATE and not OVERLAP and PROBE == 0,
                                Q_REG and not OVERLAP and (PROBE & PROBE_NO_INTRA) == 0, BETA_LOG_ON, SL, STL, PL)
    if G_STAGE and DECAY and HAS_BETA and Z_STAGE and HAS_Z:
        stages = ChunkGBZ(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                          ring(z_desc, STAGES), ring(z_desc, STAGES), ring(g_desc, STAGES), ring(g_desc, STAGES),
                          ring(b_desc, STAGES), ring(b_desc, STAGES))
    elif G_STAGE and DECAY and HAS_BETA:
        stages = ChunkGB(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                         ring(g_desc, STAGES), ring(g_desc, STAGES), ring(b_desc, STAGES), ring(b_desc, STAGES))
    elif G_STAGE and DECAY and Z_STAGE and HAS_Z:
        stages = ChunkGZ(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                         ring(z_desc, STAGES), ring(z_desc, STAGES), ring(g_desc, STAGES), ring(g_desc, STAGES))
    elif G_STAGE and DECAY:
        stages = ChunkG(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                        ring(g_desc, STAGES), ring(g_desc, STAGES))
    elif Z_STAGE and HAS_Z:
        stages = ChunkZ(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                        ring(z_desc, STAGES), ring(z_desc, STAGES))
    else:
        stages = Chunk(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES))
    # a tensor even where the launch specialized num_tiles == 1 to a constant (the template's _Pipeline holds a
    # tensor: B1 with two units compiled to a CompilationError, H100 run 7)
    num_tiles = gl.program_id(0) * 0 + num_tiles
    run(op, Layout(o_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0), stages, num_tiles)


EXP2_MAGIC = gl.constexpr(12582912.0)  # 1.5 * 2^23: x + it rounds x to an integer held in the low mantissa bits
EXP2_MAGIC_BITS = gl.constexpr(0x4B400000)  # its bits
# 2^f on [-0.5, 0.5], degree 3, fitted to the relative error (< 7.5e-5, under bf16's 2^-9; P is rounded to the
# input dtype after the decay)
EXP2_C0 = gl.constexpr(0.9999280709452044)
EXP2_C1 = gl.constexpr(0.6932609990867893)
EXP2_C2 = gl.constexpr(0.24261117040784735)
EXP2_C3 = gl.constexpr(0.05517161971787593)


@gluon.jit
def exp2_fma(x):
    """2^x without the SFU (FlashAttention-4's idea: the FMA pipe takes part of the exps): x clamped at -125
    (the callers' exponents are <= 0 and what lies below 2^-125 is nothing beside the other terms: -inf, a
    masked entry, gives ~2^-125, masked after), split into the nearest integer n (the 1.5 * 2^23 rounding) and
    f = x - n in [-0.5, 0.5], 2^f by a cubic, n added to the exponent bits. NaN stays NaN."""
    xc = gl.maximum(x, -125.0)
    t = xc + EXP2_MAGIC
    f = xc - (t - EXP2_MAGIC)
    p = ((EXP2_C3 * f + EXP2_C2) * f + EXP2_C1) * f + EXP2_C0
    n = t.to(gl.int32, bitcast=True) - EXP2_MAGIC_BITS
    r = (p.to(gl.int32, bitcast=True) + (n << 23)).to(gl.float32, bitcast=True)
    return gl.where(x == x, r, x)


@gluon.jit
def tanh_approx(x):
    """tanh(x) by the SFU's tanh.approx.f32 (sm_75+): one instruction, relative error ~2^-11."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


# --------------------------------------------------------------------------------------------
# host side


def _head_major(t: torch.Tensor):
    """(shape, strides) of a (B, N, H, D) tensor as the (B, H, N, D) view the descriptors take."""
    B, N, H, D = t.shape
    return [B, H, N, D], [t.stride(0), t.stride(2), t.stride(1), t.stride(3)]


def fits(q, k, v, g, feature: int, h0=None) -> str | None:
    """None where this kernel takes these inputs, else why not (the tl kernels run them)."""
    if feature != 0:
        return "a feature map"
    if g is not None and g.dim() != 3:
        return "a per-channel decay"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "not bf16/fp16"
    Dk, Dv = q.shape[-1], v.shape[-1]
    if Dk not in (64, 128) or Dv % BV_GLUON:
        return f"Dk {Dk} (takes 64, 128) or Dv {Dv} (a multiple of {BV_GLUON})"
    VB = Dv // BV_GLUON
    H, Hqk = v.shape[2], q.shape[2]
    if VB % 2 and (H // Hqk) % 2:
        return "a tile's two units would read different q/k heads"
    if q.device.type != "cuda" or v.numel() == 0:
        return "not a CUDA tensor, or empty"
    for t in (q, k, v):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return "strides or alignment TMA does not take"
    return None


def chunk_cumulative(g: torch.Tensor, chunk: int) -> torch.Tensor:
    """The log decay g (B, N, H) clamped at the floor (NaN kept) and summed within each chunk of
    ``chunk`` tokens, inclusive, from the chunk's start: what the kernel reads as G (float32)."""
    B, N, H = g.shape
    pad = (-N) % chunk
    g = g.float().clamp_min(LOG_DECAY_FLOOR_HOST)  # one pass (a new tensor: the pad and view below take it)
    if pad:  # only a partial last chunk needs the copy
        g = torch.nn.functional.pad(g, (0, 0, 0, pad))
    return g.reshape(B, (N + pad) // chunk, chunk, H).cumsum(2).view(B, N + pad, H)[:, :N]


def chunk_cumulative_heads(g: torch.Tensor, chunk: int) -> torch.Tensor:
    """G_STAGE's G: the log decay g (B, N, H) clamped at the floor (NaN kept), summed within each chunk of
    ``chunk`` tokens from its start, in log2 units, head-major and padded to whole chunks: (B, H, N_pad)
    float32, contiguous (TMA boxes of one chunk). The pad's g is 0, so a chunk's last row holds its last
    real token's G (what the state update decays by)."""
    B, N, H = g.shape
    pad = (-N) % chunk
    g = g.float().clamp_min(LOG_DECAY_FLOOR_HOST).mul_(LOG2E)
    g = torch.nn.functional.pad(g.transpose(1, 2), (0, pad)).contiguous()  # (B, H, N_pad)
    return g.view(B, H, (N + pad) // chunk, chunk).cumsum(-1).view(B, H, N + pad)


def chunk_heads(beta: torch.Tensor, chunk: int) -> torch.Tensor:
    """G_STAGE's beta: (B, N, H) as float32 (B, H, N_pad), contiguous, 0 past N."""
    B, N, H = beta.shape
    return torch.nn.functional.pad(beta.float().transpose(1, 2), (0, (-N) % chunk)).contiguous()


def decay_factors_reference(G: torch.Tensor, factored: bool = True) -> torch.Tensor:
    """The kernel's decay_factors in torch float32 for one chunk's G [BT] (log2 units): [BT, BT] 2^(G_i - G_j)
    on and below the diagonal (0 above), by the row and column factors about the span's middle where the
    span is at most FACTOR_SPAN (and ``factored``), else elementwise."""
    G = G.float()
    causal = torch.ones(len(G), len(G), dtype=torch.bool, device=G.device).tril()
    hi, lo = G.nan_to_num(nan=-float("inf")).max(), G.nan_to_num(nan=float("inf")).min()  # fmax/fmin skip NaN
    if factored and hi - lo <= FACTOR_SPAN.value:
        mid = 0.5 * (hi + lo)
        f = torch.exp2(G - mid)[:, None] * torch.exp2(mid - G)[None, :]
    else:
        f = torch.exp2((G[:, None] - G[None, :]).masked_fill(~causal, -float("inf")))
    return torch.where(causal, f, 0.0)


def chunk_heads_prep(g: torch.Tensor, beta: torch.Tensor | None, chunk: int):
    """(chunk_cumulative_heads(g), chunk_heads(beta) or None) by one pass of kernels_forward.chunk_heads_kernel
    (the torch forms take four or five)."""
    import triton

    from tilecore.ops.linear_attention.kernels_forward import chunk_heads_kernel

    B, N, H = g.shape
    n_pad = triton.cdiv(N, chunk) * chunk
    G = torch.empty(B, H, n_pad, dtype=torch.float32, device=g.device)
    beta_h = torch.empty_like(G) if beta is not None else None
    sb = beta.stride() if beta is not None else (0, 0, 0)
    chunk_heads_kernel[(n_pad // chunk, B)](g, beta if beta is not None else g, G, beta_h if beta is not None else G,
                                            N, H, n_pad, *g.stride(), *sb, LOG_DECAY_FLOOR_HOST, BT=chunk,
                                            BH=triton.next_power_of_2(H), HAS_G=True, HAS_BETA=beta is not None,
                                            num_warps=4)
    return G, beta_h


def launch_args(q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float, stages: int = 3, prefetch: bool = False,
                overlap: bool = False, z_stage: bool = False, operand=None, g_stage: bool = False,
                factored: bool = False, early_wv: bool = False, async_update: bool = False, silu_tanh: bool = False,
                probe: int = 0, exp2_fma: int = 0, d_early: bool = False, lean: bool = False,
                update_late: bool = False, q_reg: bool = False, beta_log: bool = False):
    """(grid, arguments by name, num_warps) of la_fwd_gluon_kernel; o a contiguous (B, N, H, Dv) output;
    prefetch, overlap, z_stage, g_stage, factored, early_wv, async_update: the kernel's PREFETCH, OVERLAP,
    Z_STAGE (z must then be TMA-able: ``tma_ok``), G_STAGE, FACTORED, EARLY_WV and ASYNC_UPDATE; g:
    ``chunk_cumulative``'s G, or with g_stage ``chunk_cumulative_heads``'s (and beta ``chunk_heads``'s).
    ``operand(t, block, shape, strides)`` makes the descriptors (default gluon_descriptor;
    tiles.launch.TmaOperand for a CachedLaunch)."""
    from tilecore.tiles.launch import gluon_descriptor

    gluon_descriptor = operand or gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    B, N, H, Dv = v.shape
    Dk = q.shape[-1]
    BT, BV = BT_GLUON, BV_GLUON
    VB = Dv // BV
    descs = [gluon_descriptor(t, [1, 1, BT, blk], *_head_major(t)) for t, blk in ((q, Dk), (k, Dk), (v, BV), (o, BV))]
    dummy = torch.empty(1, dtype=torch.float32, device=v.device)
    st = lambda t, n: tuple(t.stride()) if t is not None else (0,) * n  # noqa: E731
    num_tiles = B * H * VB // 2
    z_desc = gluon_descriptor(z, [1, 1, BT, BV], *_head_major(z)) if z_stage and z is not None else descs[3]
    g_stage = g_stage and g is not None
    g_desc = descs[3]
    if g_stage:
        if g.dim() != 3 or tuple(g.shape[:2]) != (B, H) or g.shape[2] % BT or not g.is_contiguous():
            raise ValueError(f"g_stage takes chunk_cumulative_heads's (B, H, N_pad) G, got {tuple(g.shape)}")
        g_desc = gluon_descriptor(g, [1, 1, BT], list(g.shape), list(g.stride()))
    b_desc = descs[3]
    if g_stage and beta is not None:
        if tuple(beta.shape) != tuple(g.shape) or not beta.is_contiguous():
            raise ValueError(f"g_stage takes chunk_heads's (B, H, N_pad) beta, got {tuple(beta.shape)}")
        b_desc = gluon_descriptor(beta, [1, 1, BT], list(beta.shape), list(beta.stride()))
    args = dict(q_desc=descs[0], k_desc=descs[1], v_desc=descs[2], o_desc=descs[3], z_desc=z_desc, g_desc=g_desc,
                b_desc=b_desc, G=g if g is not None and not g_stage else dummy,
                BETA=beta if beta is not None and not g_stage else dummy,
                DSKIP=d_skip if d_skip is not None else dummy, Z=z if z is not None else v,
                H0=h0 if h0 is not None else dummy, HT=ht if ht is not None else dummy)
    sg, sbt = st(None if g_stage else g, 3), st(None if g_stage else beta, 3)  # (G_STAGE: by TMA)
    sz, s0, sht = st(z, 4), st(h0, 4), st(ht, 4)
    args.update(sgb=sg[0], sgn=sg[1], sgh=sg[2], sbb=sbt[0], sbn=sbt[1], sbh=sbt[2], szb=sz[0], szn=sz[1],
                szh=sz[2], sdh=st(d_skip, 2)[0], s0b=s0[0], s0h=s0[1], s0f=s0[2], s0v=s0[3], stb=sht[0], sth=sht[1],
                stf=sht[2], stv=sht[3], N=N, H=H, VB=VB, GROUP=H // q.shape[2], scale=scale, num_tiles=num_tiles,
                STAGES=stages, DECAY=g is not None, HAS_BETA=beta is not None, HAS_D=d_skip is not None,
                HAS_Z=z is not None, HAS_H0=h0 is not None, STORE_HT=ht is not None, PREFETCH=prefetch,
                OVERLAP=overlap, Z_STAGE=z_stage, G_STAGE=g_stage, FACTORED=factored and g_stage, EARLY_WV=early_wv,
                ASYNC_UPDATE=async_update and early_wv)
    if silu_tanh and z_stage and z is not None:  # (absent otherwise: the launches' keys as before)
        args["SILU_TANH"] = True
    if exp2_fma and g_stage:
        args["EXP2_FMA"] = exp2_fma
    if probe:  # (timing probes only: the kernel's PROBE)
        args["PROBE"] = probe
    # the step variants (configs.GLUON_S32; absent where off: the launches' keys as before; the kernel ignores them
    # where they do not apply)
    for name, on in (("D_EARLY", d_early), ("LEAN", lean), ("UPDATE_LATE", update_late), ("Q_REG", q_reg),
                     ("BETA_LOG", beta_log)):  # (BETA_LOG: beta must be beta_log's Gb)
        if on:
            args[name] = True
    return (persistent_programs(num_tiles, v.device),), args, 4


def tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA takes t's strides and alignment (unit last stride, 16-byte aligned base and strides)."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0
                                                                 for s in t.stride()[:-1])


def variant(g, beta, z, prefetch: bool | None = None, g_stage: bool | None = None, factored: bool | None = None,
            early_wv: bool | None = None, async_update: bool | None = None) -> dict:
    """The kernel's PREFETCH, G_STAGE, FACTORED, EARLY_WV and ASYNC_UPDATE for these inputs (launch_args's
    prefetch, g_stage, factored, early_wv, async_update): the given ones, else configs' (GLUON_PREFETCH where
    z is given; the others by whether beta is given: Mamba-2 or not). G_STAGE takes PREFETCH's place; all but PREFETCH need a decay."""
    from tilecore.ops.linear_attention import configs

    mamba = beta is not None
    g_stage = (mamba in configs.GLUON_G_STAGE if g_stage is None else g_stage) and g is not None
    factored = (mamba in configs.GLUON_FACTORED if factored is None else factored) and g_stage
    early_wv = (mamba in configs.GLUON_EARLY_WV if early_wv is None else early_wv) and g is not None
    async_update = (mamba in configs.GLUON_ASYNC_UPDATE if async_update is None else async_update) and early_wv
    prefetch = (configs.GLUON_PREFETCH and z is not None if prefetch is None else prefetch) and not g_stage
    return dict(prefetch=prefetch, g_stage=g_stage, factored=factored, early_wv=early_wv, async_update=async_update)


def s32_flags(mamba: bool) -> dict:
    """launch_args's step-variant keywords (d_early, lean, update_late, q_reg) from configs.GLUON_S32 (by whether beta
    is given: Mamba-2 or not); off where configs names none."""
    from tilecore.ops.linear_attention import configs

    on = configs.GLUON_S32.get(mamba, ())
    return {name: name in on for name in ("d_early", "lean", "update_late", "q_reg", "beta_log")}


def beta_log(G: torch.Tensor, beta: torch.Tensor, scale: float) -> torch.Tensor:
    """BETA_LOG's Gb = G - log2(beta scale) from G_STAGE's head-major G and beta (chunk_heads_prep): beta (>= 0:
    Mamba-2's dt) and the scale move into the exponents (P's column factor 2^(G_i - Gb_j) = 2^(G_i - G_j) beta_j
    scale); +inf where beta is 0 (the pad past N, a token that adds nothing). The scale must be > 0."""
    return G - torch.log2(beta) - math.log2(scale)


def prepare_decay(g, beta, g_stage: bool):
    """(G, beta) as the kernel reads them: with G_STAGE head-major by chunk_heads_prep, else
    chunk_cumulative's G and beta as given (either may be None)."""
    if g_stage:
        G, beta_h = chunk_heads_prep(g, beta, BT_GLUON)
        return G, beta_h
    return (chunk_cumulative(g, BT_GLUON) if g is not None else None), beta


def forward(q, k, v, g, beta, d_skip, z, h0, scale: float, final_state: bool, stages: int = 3,
            prefetch: bool | None = None, overlap: bool | None = None, z_stage: bool | None = None,
            g_stage: bool | None = None, factored: bool | None = None, early_wv: bool | None = None,
            async_update: bool | None = None, operand=None, launch=None, silu_tanh: bool | None = None,
            exp2_fma: int | None = None, s32: dict | None = None, beta_nonneg: bool = False):
    """(o, final state or None) by the Gluon kernel (``fits`` must have said None). z and D's value
    columns must be contiguous (stride 1), as Mamba-2's are. prefetch, overlap, z_stage, g_stage, factored,
    early_wv: the kernel's PREFETCH, OVERLAP, Z_STAGE, G_STAGE, FACTORED and EARLY_WV (None:
    configs.GLUON_PREFETCH (where z is given: Mamba-2), configs.GLUON_OVERLAP, configs.GLUON_Z_STAGE, and
    configs.GLUON_G_STAGE, GLUON_FACTORED, GLUON_EARLY_WV by whether beta is given: Mamba-2 or not).
    G_STAGE takes PREFETCH's place. ``operand``: launch_args's (the descriptors' maker); ``launch(grid, args,
    num_warps)``: the launch (default: the kernel's own; the op's keyed path passes a CachedLaunch's).
    silu_tanh: the kernel's SILU_TANH with Z_STAGE (None: configs.GLUON_SILU_TANH); exp2_fma: its EXP2_FMA with
    G_STAGE (None: configs.GLUON_EXP2_FMA, by whether beta is given). s32: launch_args's d_early, lean, update_late,
    q_reg, beta_log (None: ``s32_flags``: configs.GLUON_S32 by whether beta is given; beta_log only with lean,
    G_STAGE, EARLY_WV, beta and a positive scale, and where the caller says beta >= 0 (``beta_nonneg``: Mamba-2's dt
    with dt_limit's lower end >= 0, its default): beta then goes to the kernel as ``beta_log``'s Gb)."""
    from tilecore.ops.linear_attention import configs

    flags = variant(g, beta, z, prefetch=prefetch, g_stage=g_stage, factored=factored, early_wv=early_wv,
                    async_update=async_update)
    prefetch, g_stage, factored, early_wv = flags["prefetch"], flags["g_stage"], flags["factored"], flags["early_wv"]
    overlap = configs.GLUON_OVERLAP if overlap is None else overlap
    z_stage = configs.GLUON_Z_STAGE if z_stage is None else z_stage
    B, N, H, Dv = v.shape
    o = torch.empty(B, N, H, Dv, dtype=v.dtype, device=v.device)
    ht = torch.empty(B, H, q.shape[-1], Dv, dtype=torch.float32, device=v.device) if final_state else None
    g, beta = prepare_decay(g, beta, g_stage)
    s32 = dict(s32_flags(beta is not None) if s32 is None else s32)
    s32["beta_log"] = bool(s32.get("beta_log")) and s32.get("lean", False) and g_stage and beta is not None \
        and early_wv and scale > 0 and beta_nonneg  # (a negative beta has no log: the launches that know pass it)
    if s32["beta_log"]:
        beta = beta_log(g, beta, scale)
    if d_skip is not None:
        d_skip = d_skip.float().contiguous()
    if z is not None and (z.stride(-1) != 1 or (z_stage and not tma_ok(z))):
        z = z.contiguous()
    grid, args, warps = launch_args(q, k, v, g, beta, d_skip, z, h0, o, ht, scale, stages, prefetch, overlap, z_stage,
                                    operand=operand, g_stage=g_stage, factored=factored, early_wv=early_wv,
                                    async_update=flags["async_update"],
                                    silu_tanh=configs.GLUON_SILU_TANH if silu_tanh is None else silu_tanh,
                                    exp2_fma=configs.GLUON_EXP2_FMA.get(beta is not None, 0) if exp2_fma is None
                                    else exp2_fma, **s32)
    if launch is None:
        la_fwd_gluon_kernel[grid](**args, num_warps=warps)
    else:
        launch(grid, args, warps)
    return o, ht


# --------------------------------------------------------------------------------------------
# compile report (no GPU): compile_report(CASE, prefetch, stages) compiles the kernel for sm_90a and returns its
# resources and Hopper instructions; CASE: linear, decay (scalar decay, initial and final states), mamba2 (beta,
# D, z, 80 heads on one q/k head); stages: configs.GLUON_STAGES's 2 (with Z_STAGE's z stages 3 pass 227 KiB). TRITON_INTERPRET must be unset (tests/linear_attention/test_forward_gluon_compile.py
# runs it in a fresh process).

COMPILE_CASES = {  # (Hqk, H, Dk, Dv, decay, Mamba-2's terms, states)
    "linear": (16, 16, 128, 128, False, False, False),
    "decay": (16, 16, 128, 128, True, False, True),
    "mamba2": (1, 80, 128, 64, True, True, False),
}


def compile_report(case: str, prefetch: bool = False, stages: int = 2, overlap: bool = False,
                   z_stage: bool = False, g_stage: bool = False, factored: bool = False, early_wv: bool = False,
                   async_update: bool = False, compiled_out: list | None = None, probe: int = 0,
                   silu_tanh: bool = False, exp2_fma: int = 0, **s32) -> dict:
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    Hqk, H, Dk, Dv, decay, mamba, states = COMPILE_CASES[case]
    B, N, bf = 2, 4096, torch.bfloat16
    q = torch.empty(B, N, Hqk, Dk, dtype=bf)
    v = torch.empty(B, N, H, Dv, dtype=bf)
    f32 = lambda *shape: torch.empty(*shape, dtype=torch.float32)  # noqa: E731
    h0 = f32(B, H, Dk, Dv) if states else None
    g = (f32(B, H, N) if g_stage else f32(B, N, H)) if decay else None
    grid, args, warps = launch_args(q, q, v, g, (f32(B, H, N) if g_stage else f32(B, N, H)) if mamba else None,
                                    f32(H, Dv) if mamba else None, torch.empty_like(v) if mamba else None, h0,
                                    torch.empty_like(v), f32(B, H, Dk, Dv) if states else None, 1.0,
                                    stages=stages, prefetch=prefetch, overlap=overlap, z_stage=z_stage, g_stage=g_stage,
                                    factored=factored, early_wv=early_wv, async_update=async_update, probe=probe,
                                    silu_tanh=silu_tanh, exp2_fma=exp2_fma, **s32)
    compiled = compile_kernel(la_fwd_gluon_kernel, args, num_warps=warps)
    if compiled_out is not None:
        compiled_out.append(compiled)
    r = resources(compiled)
    return dict(case=case, prefetch=prefetch, overlap=overlap, z_stage=z_stage, g_stage=g_stage, factored=factored,
                early_wv=early_wv, async_update=async_update,
                spill_bytes=r.spill_stores, registers=r.registers, shared=r.shared, threads=r.threads,
                wgmma_serialized=r.wgmma_serialized, **has_hopper_instructions(compiled.asm["ptx"]))

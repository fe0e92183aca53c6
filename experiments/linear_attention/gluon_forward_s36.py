"""A copy of tilecore/ops/linear_attention/gluon_forward.py as it stood before session 37 (commit 22cfa535): the
baseline of gpu_mamba_s37.py's same-run A/B (issue 30's "no speed lost" without beta: the same PTX but the parameter
list; with beta the former Mamba-2 step, S through shared memory, that the transposed step replaced: notes
decisions 143-150). Launched with the flags configs then shipped (Z_STAGE, G_STAGE, SILU_TANH; EARLY_WV and LEAN with
beta) through ``launch_args``; its ``variant`` and ``forward`` read configs' removed switches and are not called.

The chunked linear-attention forward for Hopper on the tiles template (tilecore/tiles/gluon/pipeline.py):
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
<= 0, log decays clamped at -100); the host sums it, so the consumers hold no [BT, BT] reductions: as shipped
(G_STAGE) head-major in log2 units by one pass (``chunk_heads_prep``; beta likewise), TMA-loaded with the stage;
without G_STAGE ``chunk_cumulative``'s (B, N, H) sums, loaded by pointers. With beta, configs turn on EARLY_WV (the
update's weighted values stored with the old state: one barrier pair a chunk) and LEAN (one causal select on P, the
scale on beta V's rows); with z, Z_STAGE (z through the stage) and SILU_TANH (the gate's sigmoid by one tanh).
Rounding: P, S and exp(G_last - G_j) beta_j V_j go to the tensor cores in the input dtype, as in
la_fwd_kernel; with beta (Mamba-2), beta_j V_j too (la_fwd_kernel keeps beta in float32 on P's columns:
here that column factor spilled 1 KB of registers), as mamba_ssm rounds x dt.

launch_args builds the descriptors and checks the fit (``fits``); the tl kernels (kernels_tl.py,
kernels_forward.py) are this kernel's twins for other GPUs and the interpreter.
"""
import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import Layout, ring, run, stage_struct, store_block, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma

LOG_DECAY_FLOOR_HOST = -100.0  # kernels_tl.LOG_DECAY_FLOOR's (a float for torch: a constexpr is no number)
BT_GLUON = 64  # tokens a chunk (a wgmma's M)
BV_GLUON = 64  # value columns a consumer
LOG2E = 1.4426950408889634


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
    wv_smem: object  # [2, BT, BV] (EARLY_WV with beta, not LEAN: [4, ..]): each consumer's weighted values (B operands
    # of K^T V, P V)
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
    Z_STAGE: gl.constexpr  # z through the stage (TMA), silu by an approximate division
    G_STAGE: gl.constexpr  # G (head-major, log2 units) through the stage (TMA): no global load on the walk
    EARLY_WV: gl.constexpr  # the state update's weighted values stored with the old state (one barrier pair)
    SILU_TANH: gl.constexpr  # (Z_STAGE) the gate's sigmoid as 0.5 + 0.5 tanh(z / 2): one SFU op, not ex2 and rcp
    LEAN: gl.constexpr  # (G_STAGE) one causal select on P (the exps take the unmasked difference: +inf above the
    # diagonal, selected away), and with beta the scale on beta V's rows, not on P; with EARLY_WV and beta, beta V in
    # bv_smem (no barrier between its stores and wv's)
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
        return Walk(S)

    @gluon.jit
    def state_ptrs(self, base, b, h, col, sb, sh, sf, sv):
        rows = gl.arange(0, self.BK, layout=gl.SliceLayout(1, self.STL))
        cols = col + gl.arange(0, self.BV, layout=gl.SliceLayout(0, self.STL))
        return (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(rows.to(gl.int64) * sf, 1)
                + gl.expand_dims(cols.to(gl.int64) * sv, 0))

    @gluon.jit
    def decay_factors(self, G_r, G_c, causal):
        """[BT, BT] 2^(G_i - G_j) on and below the diagonal (G in log2 units; above it anything finite or
        not: the caller masks P there). LEAN: the unmasked difference (+inf above the diagonal where decays are
        strong, taken away by the caller's one select); else the exps of the masked difference (0 above)."""
        if self.LEAN:  # (the caller's select takes the entries above the diagonal: +inf there is never used)
            f = gl.exp2(gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0))
        else:
            f = gl.exp2(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
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
                if self.HAS_BETA:  # (0 past N: the host's pad)
                    if c == 0:
                        b_smem = stage.ba.reshape([self.BT])
                    else:
                        b_smem = stage.bb.reshape([self.BT])
                    beta_r = b_smem.load(gl.SliceLayout(1, self.SL))
            elif self.HAS_BETA:
                beta_r = gl.load(b_base + offs_r * self.sbn, mask=row_ok, other=0.0)
        else:
            if self.DECAY:
                G_r = gl.load(g_base + offs_r * self.sgn, mask=row_ok, other=0.0)
                G_c = gl.load(g_base + offs_c * self.sgn, mask=col_ok, other=0.0)
                G_last = gl.load(g_base + (gl.minimum(self.BT, self.N - t0) - 1) * self.sgn)
            if self.HAS_BETA:
                beta_r = gl.load(b_base + offs_r * self.sbn, mask=row_ok, other=0.0)
        if self.DECAY:
            if self.G_STAGE:
                w_rows = w_rows * gl.exp2(G_last - G_r)
                S_decay = gl.exp2(G_last)
            else:
                w_rows = w_rows * gl.exp(G_last - G_r)
                S_decay = gl.exp(G_last)
        if self.HAS_BETA:
            w_rows = w_rows * beta_r

        S_smem = self.state_smem.index(c)
        causal = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        row_scale = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.SL)) + self.scale
        # the old state to shared memory (the B operand of Q S); with beta, beta_j V_j as P V's B operand
        # (beta on V's rows, not P's columns: one [BT, BV] product, and the scores keep no column factor
        # but the decay's, which spilled 1 KB at Mamba-2's shape)
        # EARLY_WV: the state update's weighted values stored here too (beta V, with beta, in a buffer of
        # its own), so one barrier pair a chunk serves every shared-memory operand
        SPLIT_BV: gl.constexpr = self.LEAN and self.EARLY_WV and self.HAS_BETA  # (bv_smem)
        RING4: gl.constexpr = self.EARLY_WV and self.HAS_BETA and not SPLIT_BV
        wv = self.wv_smem.index(2 * c if RING4 else c)  # ([4, ..] only then)
        # LEAN with beta: P V's beta V carries the scale (P none): a factor on BT rows, not BT x BT entries
        if self.HAS_BETA:
            beta_pv = beta_r
            if self.LEAN:
                beta_pv = beta_r * self.scale
        gl.thread_barrier()  # the previous step's wgmmas have read both buffers
        S_smem.store(walk.S.to(dtype))
        if self.EARLY_WV:
            v_f = v.load(self.SL).to(gl.float32)
            wv.store((v_f * gl.expand_dims(w_rows, 1)).to(dtype))
            if self.HAS_BETA:
                if SPLIT_BV:
                    bv = self.bv_smem.index(c)
                else:
                    bv = self.wv_smem.index(2 * c + 1)
                bv.store((v_f * gl.expand_dims(beta_pv, 1)).to(dtype))
        elif self.HAS_BETA:
            wv.store((v.load(self.SL).to(gl.float32) * gl.expand_dims(beta_pv, 1)).to(dtype))
        fence_async_shared()
        gl.thread_barrier()

        # intra-chunk scores P = mask(Q K^T exp(G_i - G_j)) scale
        s = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL), use_acc=False)
        if self.DECAY:
            if self.G_STAGE:
                s = s * self.decay_factors(G_r, G_c, causal)
                row_scale = row_scale * gl.exp2(G_r)
            else:
                s = s * gl.exp(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
                row_scale = row_scale * gl.exp(G_r)
        if self.LEAN and self.HAS_BETA:  # (the scale is on beta V's rows)
            p_f = gl.where(causal, s, 0.0)
        else:
            p_f = gl.where(causal, s * self.scale, 0.0)
        p = gl.convert_layout(p_f.to(dtype), self.PL)

        # o = exp(G_i) scale (Q S_old) + P (beta V)
        o = warpgroup_mma(q, S_smem, gl.zeros([self.BT, self.BV], gl.float32, self.SL), use_acc=False)
        if self.HAS_BETA:
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
        S = warpgroup_mma(k.permute((1, 0)), wv, walk.S * S_decay)

        # Mamba-2's epilogue and the store (rows past N clipped by TMA)
        offs_v = gl.arange(0, self.BV, layout=gl.SliceLayout(0, self.SL))
        if self.HAS_D:
            d_row = gl.load(self.DSKIP + (h64 * self.sdh + col) + offs_v)
            o = o + gl.expand_dims(d_row, 0) * v.load(self.SL).to(gl.float32)
        if self.HAS_Z:
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
        store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])
        return Walk(S)

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
                        Z_STAGE: gl.constexpr = False, G_STAGE: gl.constexpr = False, EARLY_WV: gl.constexpr = False,
                        SILU_TANH: gl.constexpr = False, LEAN: gl.constexpr = False):
    """o (and the final states) of every unit of (batch, head, 64 value columns); a persistent grid, two
    consumer warpgroups (num_warps = 4) and a producer warp. Z_STAGE: z TMA-loaded with the stage (off the walk's
    serial path). G_STAGE: G (head-major, log2 units: chunk_cumulative_heads) TMA-loaded with the stage, and with
    beta (chunk_heads) beta too. EARLY_WV: the state update's weighted values stored beside the old state at the
    chunk's start (one barrier pair a chunk fewer). SILU_TANH (with Z_STAGE): the gate's sigmoid by one
    tanh.approx.f32. LEAN (with G_STAGE): one causal select on P and, with beta, the scale on beta V."""
    BT: gl.constexpr = q_desc.block_type.shape[2]
    BK: gl.constexpr = q_desc.block_type.shape[3]
    BV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(BT == BV, "the scores' and the outputs' layouts are one: BT == BV")
    SL: gl.constexpr = wgmma_layout(BT, BV, gl.num_warps())
    STL: gl.constexpr = wgmma_layout(BK, BV, gl.num_warps())
    PL: gl.constexpr = wgmma_lhs_layout(BT, BV, gl.num_warps())
    operand_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    state_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BK, BV], operand_layout)
    LEAN_ON: gl.constexpr = LEAN and G_STAGE and DECAY
    SPLIT_BV: gl.constexpr = LEAN_ON and EARLY_WV and HAS_BETA  # (beta V's own allocation)
    RING4: gl.constexpr = EARLY_WV and HAS_BETA and not SPLIT_BV
    wv_smem = gl.allocate_shared_memory(q_desc.dtype, [4 if RING4 else 2, BT, BV], operand_layout)
    bv_smem = wv_smem
    if SPLIT_BV:
        bv_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BT, BV], operand_layout)
    op = LinearAttentionForward(q_desc, k_desc, v_desc, o_desc, z_desc, g_desc, b_desc, G, BETA, DSKIP, Z, H0, HT,
                                sgb, sgn, sgh, sbb, sbn, sbh, szb, szn, szh, sdh, s0b, s0h, s0f, s0v, stb, sth, stf,
                                stv, N, H, VB, GROUP, scale, state_smem, wv_smem, bv_smem, BT, BK, BV, DECAY, HAS_BETA,
                                HAS_D, HAS_Z, HAS_H0, STORE_HT, Z_STAGE, G_STAGE and DECAY, EARLY_WV,
                                SILU_TANH and Z_STAGE, LEAN_ON, SL, STL, PL)
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
    # tensor: B1 with two units compiled to a CompilationError on the H100)
    num_tiles = gl.program_id(0) * 0 + num_tiles
    run(op, Layout(o_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0), stages, num_tiles)


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


def launch_args(q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float, stages: int = 3, *, z_stage: bool = False,
                operand=None, g_stage: bool = False, early_wv: bool = False, silu_tanh: bool = False,
                lean: bool = False):
    """(grid, arguments by name, num_warps) of la_fwd_gluon_kernel; o a contiguous (B, N, H, Dv) output;
    z_stage, g_stage, early_wv, silu_tanh, lean: the kernel's Z_STAGE (z must then be TMA-able: ``tma_ok``),
    G_STAGE, EARLY_WV, SILU_TANH and LEAN (``variant`` gives configs'); g:
    ``chunk_cumulative``'s G, or with g_stage ``chunk_cumulative_heads``'s (and beta ``chunk_heads``'s).
    ``operand(t, block, shape, strides)`` makes the descriptors (default gluon_descriptor; tiles.launch.TmaOperand
    for a CachedLaunch)."""
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
                HAS_Z=z is not None, HAS_H0=h0 is not None, STORE_HT=ht is not None, Z_STAGE=z_stage,
                G_STAGE=g_stage, EARLY_WV=early_wv)
    if silu_tanh and z_stage and z is not None:  # (absent otherwise: the launches' keys as before)
        args["SILU_TANH"] = True
    if lean:  # (absent where off; the kernel ignores it without G_STAGE)
        args["LEAN"] = True
    return (persistent_programs(num_tiles, v.device),), args, 4


def tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA takes t's strides and alignment (unit last stride, 16-byte aligned base and strides)."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0
                                                                 for s in t.stride()[:-1])


def variant(g, beta, z, g_stage: bool | None = None, early_wv: bool | None = None, lean: bool | None = None) -> dict:
    """The kernel's G_STAGE, EARLY_WV and LEAN for these inputs (launch_args's g_stage, early_wv, lean): the given
    ones, else configs' GLUON_G_STAGE, GLUON_EARLY_WV and GLUON_LEAN by whether beta is given (Mamba-2 or not). All
    three need a decay (LEAN G_STAGE too)."""
    from tilecore.ops.linear_attention import configs

    mamba = beta is not None
    g_stage = (mamba in configs.GLUON_G_STAGE if g_stage is None else g_stage) and g is not None
    early_wv = (mamba in configs.GLUON_EARLY_WV if early_wv is None else early_wv) and g is not None
    lean = (mamba in configs.GLUON_LEAN if lean is None else lean) and g_stage
    return dict(g_stage=g_stage, early_wv=early_wv, lean=lean)


def prepare_decay(g, beta, g_stage: bool):
    """(G, beta) as the kernel reads them: with G_STAGE head-major by chunk_heads_prep, else
    chunk_cumulative's G and beta as given (either may be None)."""
    if g_stage:
        G, beta_h = chunk_heads_prep(g, beta, BT_GLUON)
        return G, beta_h
    return (chunk_cumulative(g, BT_GLUON) if g is not None else None), beta


def forward(q, k, v, g, beta, d_skip, z, h0, scale: float, final_state: bool, stages: int = 3, *,
            z_stage: bool | None = None, g_stage: bool | None = None, early_wv: bool | None = None,
            lean: bool | None = None, silu_tanh: bool | None = None, operand=None, launch=None):
    """(o, final state or None) by the Gluon kernel (``fits`` must have said None). z and D's value
    columns must be contiguous (stride 1), as Mamba-2's are. z_stage, g_stage, early_wv, lean, silu_tanh: the
    kernel's Z_STAGE, G_STAGE, EARLY_WV, LEAN and SILU_TANH (None: configs.GLUON_Z_STAGE, ``variant``'s (configs by
    whether beta is given), configs.GLUON_SILU_TANH). ``operand``: launch_args's (the
    descriptors' maker); ``launch(grid, args, num_warps)``: the launch (default: the kernel's own; the op's keyed path
    passes a CachedLaunch's)."""
    from tilecore.ops.linear_attention import configs

    flags = variant(g, beta, z, g_stage=g_stage, early_wv=early_wv, lean=lean)
    z_stage = configs.GLUON_Z_STAGE if z_stage is None else z_stage
    B, N, H, Dv = v.shape
    o = torch.empty(B, N, H, Dv, dtype=v.dtype, device=v.device)
    ht = torch.empty(B, H, q.shape[-1], Dv, dtype=torch.float32, device=v.device) if final_state else None
    g, beta = prepare_decay(g, beta, flags["g_stage"])
    if d_skip is not None:
        d_skip = d_skip.float().contiguous()
    if z is not None and (z.stride(-1) != 1 or (z_stage and not tma_ok(z))):
        z = z.contiguous()
    grid, args, warps = launch_args(q, k, v, g, beta, d_skip, z, h0, o, ht, scale, stages, z_stage=z_stage,
                                    operand=operand, silu_tanh=configs.GLUON_SILU_TANH if silu_tanh is None
                                    else silu_tanh, **flags)
    if launch is None:
        la_fwd_gluon_kernel[grid](**args, num_warps=warps)
    else:
        launch(grid, args, warps)
    return o, ht


# --------------------------------------------------------------------------------------------
# compile report (no GPU): compile_report(CASE, stages, ...flags) compiles the kernel for sm_90a and returns its
# resources and Hopper instructions; CASE: linear, decay (scalar decay, initial and final states), mamba2 (beta,
# D, z, 80 heads on one q/k head); stages: configs.GLUON_STAGES's 2 (with Z_STAGE's z stages 3 pass 227 KiB).
# TRITON_INTERPRET must be unset (tests/linear_attention/test_forward_gluon_compile.py runs it in a fresh process).

COMPILE_CASES = {  # (Hqk, H, Dk, Dv, decay, Mamba-2's terms, states)
    "linear": (16, 16, 128, 128, False, False, False),
    "decay": (16, 16, 128, 128, True, False, True),
    "mamba2": (1, 80, 128, 64, True, True, False),
}


def compile_report(case: str, stages: int = 2, z_stage: bool = False, g_stage: bool = False, early_wv: bool = False,
                   compiled_out: list | None = None, silu_tanh: bool = False,
                   lean: bool = False) -> dict:
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
                                    torch.empty_like(v), f32(B, H, Dk, Dv) if states else None, 1.0, stages,
                                    z_stage=z_stage, g_stage=g_stage, early_wv=early_wv,
                                    silu_tanh=silu_tanh, lean=lean)
    compiled = compile_kernel(la_fwd_gluon_kernel, args, num_warps=warps)
    if compiled_out is not None:
        compiled_out.append(compiled)
    r = resources(compiled)
    return dict(case=case, z_stage=z_stage, g_stage=g_stage, early_wv=early_wv, lean=lean,
                spill_bytes=r.spill_stores, registers=r.registers, shared=r.shared, threads=r.threads,
                wgmma_serialized=r.wgmma_serialized, **has_hopper_instructions(compiled.asm["ptx"]))

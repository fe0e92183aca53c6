"""The chunked linear-attention forward for Hopper on the tiles template (tilecore/tiles/gluon/pipeline.py):
phi(x) = x with no decay or a scalar log decay, Mamba-2's beta (dt), D and z, grouped q/k heads.

The template's parts:

* a tile is two units of (head, BV = 64 value columns) of one batch row that read the same q/k head
  (one head's two value blocks at Dv = 128; two heads of one q/k group at Dv = 64, Mamba-2's);
  ``setup`` gives its cdiv(N, BT) steps, one chunk of BT = 64 tokens each;
* a stage is the chunk's q and k [BT, Dk] and each unit's v [BT, BV], TMA-loaded by the 1-warp producer
  through 4-D descriptors of (B, H, N, D) views (tokens past N arrive as zeros);
* consumer c (a warpgroup) owns unit c: its state lives in registers as a wgmma accumulator for the whole walk.
  Without beta (linear attention, a scalar decay: ``compute``) S [Dk, BV] float32, each step (chunk)

      P      = mask(Q K^T * 2^(G_i - G_j)) * scale                     wgmma, Q and K from shared memory
      o      = P V + 2^(G_i) scale (Q S)                               P from registers; S as bf16 in
                                                                       shared memory (the B operand)
      S     <- 2^(G_last) S + K^T (2^(G_last - G_j) V_j)               K^T from shared memory (transposed)

  With beta (Mamba-2: beta = dt, D, z; ``compute_transposed``) S^T [BV, Dk], each step transposed: P^T = mask(K Q^T
  2^(G_i - G_j)) beta_j scale through shared memory, o^T = (S^T Q^T) scale 2^(G_i) + V^T P^T with S^T the register
  operand, S^T <- 2^(G_last) S^T + (V^T diag(2^(G_last - G_j) beta_j)) K, and o = (o + D v) * silu(z), TMA-stored
  (rows past N clipped). K Q^T (C B^T, one for every head of a q/k group) is made once a q/k head before the kernel
  (kernels_forward.chunk_scores, in the input dtype) and TMA-loaded with the stage. The state never goes through
  shared memory, and the ALU's work runs under the wgmmas.

The cumulative decay G counts from the chunk's start as in kernels_tl.py (every exponent a difference
<= 0, log decays clamped at -100); the host sums it, so the consumers hold no [BT, BT] reductions: head-major in log2
units by one pass (``chunk_heads_prep``; beta likewise), TMA-loaded with the stage, as z is (the gate's sigmoid by one
tanh.approx). The kernel takes beta only with a decay, D and z only with beta (``fits``). Without beta the exps take
the masked difference; with beta the unmasked one (+inf above the diagonal where decays are strong, taken away by one
select). Rounding: P (P^T), S (S^T) and the update's weighted values go to the tensor cores in the input dtype, as in
la_fwd_kernel; with beta, beta_j scale rides on P^T's rows (la_fwd_kernel keeps beta in float32 on P's columns).

launch_args builds the descriptors and checks the fit (``fits``); the tl kernels (kernels_tl.py,
kernels_forward.py) are this kernel's twins for other GPUs and the interpreter.
"""
import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import Layout, ring, run, stage_struct, store_block, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait

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
class ChunkG:
    """A stage with each unit's cumulative log decay TMA-loaded beside v."""
    q: object
    k: object
    va: object
    vb: object
    ga: object  # [1, 1, BT] float32: unit 0's G (log2 units, from chunk_heads_prep)
    gb: object  # unit 1's


@stage_struct
class ChunkGB:
    """With beta (Mamba-2's dt): beta head-major through the stage too, and the chunk's scores K Q^T
    (kernels_forward.chunk_scores: C B^T once a q/k head)."""
    q: object
    k: object
    va: object
    vb: object
    ga: object
    gb: object
    ba: object  # [1, 1, BT] float32: unit 0's beta
    bb: object  # unit 1's
    cb: object  # [1, 1, BT, BT]: the chunk's K Q^T in the input's dtype (row j a key, column i a query)


@stage_struct
class ChunkGBZ:
    """With beta, the scores and Mamba-2's gate z."""
    q: object
    k: object
    va: object
    vb: object
    za: object  # [1, 1, BT, BV]: unit 0's z
    zb: object  # unit 1's
    ga: object
    gb: object
    ba: object
    bb: object
    cb: object


@struct
class Units:
    b: object  # batch row
    u0: object  # the first unit: (head, value block) = (u0 // VB, u0 % VB)


@gluon.jit
def pair_setup(tile_id, H, VB, N, BT: gl.constexpr):
    """A tile of two units (head, value block) of one batch row (``Units``) and its cdiv(N, BT) steps."""
    units = H * VB // 2
    return Units(tile_id // units, (tile_id % units) * 2), gl.cdiv(N, BT)


@gluon.jit
def pair_unit(tile, c: gl.constexpr, VB, BV: gl.constexpr):
    """(head, first value column) of the tile's unit c."""
    u = tile.u0 + c
    return u // VB, (u % VB) * BV


@struct
class Walk:
    S: object  # [BK, BV] float32: the unit's state, a wgmma accumulator (with beta: S^T [BV, BK])


@struct
class LinearAttentionForward:
    q_desc: object
    k_desc: object
    v_desc: object
    o_desc: object
    z_desc: object  # with z: z's TMA descriptor (else unused)
    g_desc: object  # with a decay: the head-major G's TMA descriptor (else unused)
    b_desc: object  # with beta: the head-major beta's (else unused)
    cb_desc: object  # with beta: the chunks' scores' (kernels_forward.chunk_scores; else unused)
    DSKIP: object
    H0: object
    HT: object
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
    state_smem: object  # [2, BK, BV]: each consumer's S in the input dtype (the B operand of Q S); with beta its P^T
    # [2, BT, BT] (the B operand of V^T P^T)
    wv_smem: object  # [2, BT, BV]: each consumer's weighted values (the B operand of K^T V); with beta [2 BT] float32,
    # each consumer's update weights by token
    ev_smem: object  # with beta: [2 BT] float32, each consumer's factors of o by token (else wv_smem, unused)
    BT: gl.constexpr
    BK: gl.constexpr
    BV: gl.constexpr
    DECAY: gl.constexpr
    HAS_BETA: gl.constexpr
    HAS_D: gl.constexpr
    HAS_Z: gl.constexpr
    HAS_H0: gl.constexpr
    STORE_HT: gl.constexpr
    SL: gl.constexpr  # [BT, BT] scores and [BT, BV] outputs (BT == BV): one wgmma layout
    STL: gl.constexpr  # [BK, BV] state (with beta: S^T [BV, BK])
    PL: gl.constexpr  # P as the register operand of P V (with beta: wV^T, of the update)
    SPL: gl.constexpr  # with beta: S^T [BV, BK] as the register operand of S^T Q^T (else None)

    @gluon.jit
    def setup(self, tile_id):
        return pair_setup(tile_id, self.H, self.VB, self.N, self.BT)

    @gluon.jit
    def unit(self, tile, c: gl.constexpr):
        return pair_unit(tile, c, self.VB, self.BV)

    @gluon.jit
    def load(self, stage, bar, tile, step):
        h0, c0 = self.unit(tile, 0)
        h1, c1 = self.unit(tile, 1)
        t0 = step * self.BT
        tma.async_copy_global_to_shared(self.q_desc, [tile.b, h0 // self.GROUP, t0, 0], bar, stage.q)
        tma.async_copy_global_to_shared(self.k_desc, [tile.b, h0 // self.GROUP, t0, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h0, t0, c0], bar, stage.va)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h1, t0, c1], bar, stage.vb)
        if self.HAS_Z:
            tma.async_copy_global_to_shared(self.z_desc, [tile.b, h0, t0, c0], bar, stage.za)
            tma.async_copy_global_to_shared(self.z_desc, [tile.b, h1, t0, c1], bar, stage.zb)
        if self.DECAY:
            tma.async_copy_global_to_shared(self.g_desc, [tile.b, h0, t0], bar, stage.ga)
            tma.async_copy_global_to_shared(self.g_desc, [tile.b, h1, t0], bar, stage.gb)
            if self.HAS_BETA:
                tma.async_copy_global_to_shared(self.b_desc, [tile.b, h0, t0], bar, stage.ba)
                tma.async_copy_global_to_shared(self.b_desc, [tile.b, h1, t0], bar, stage.bb)
                tma.async_copy_global_to_shared(self.cb_desc, [tile.b, h0 // self.GROUP, t0, 0], bar, stage.cb)

    @gluon.jit
    def start(self, ctx, tile, prev):
        if self.HAS_BETA:
            S = gl.zeros([self.BV, self.BK], gl.float32, self.STL)
        else:
            S = gl.zeros([self.BK, self.BV], gl.float32, self.STL)
        if self.HAS_H0:
            h, col = self.unit(tile, ctx.index)
            S = gl.load(self.state_ptrs(self.H0, tile.b, h, col, self.s0b, self.s0h, self.s0f, self.s0v))
        return Walk(S)

    @gluon.jit
    def state_ptrs(self, base, b, h, col, sb, sh, sf, sv):
        if self.HAS_BETA:  # S^T: a row a value column, a column a feature
            vals = col + gl.arange(0, self.BV, layout=gl.SliceLayout(1, self.STL))
            feats = gl.arange(0, self.BK, layout=gl.SliceLayout(0, self.STL))
            ptrs = (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(vals.to(gl.int64) * sv, 1)
                    + gl.expand_dims(feats.to(gl.int64) * sf, 0))
        else:
            rows = gl.arange(0, self.BK, layout=gl.SliceLayout(1, self.STL))
            cols = col + gl.arange(0, self.BV, layout=gl.SliceLayout(0, self.STL))
            ptrs = (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(rows.to(gl.int64) * sf, 1)
                    + gl.expand_dims(cols.to(gl.int64) * sv, 0))
        return ptrs

    @gluon.jit
    def decay_factors(self, G_r, G_c, causal):
        """[BT, BT] 2^(G_i - G_j) on and below the diagonal, 0 above (G in log2 units): the exps of the masked
        difference."""
        f = gl.exp2(gl.where(causal, gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0), float("-inf")))
        return f

    @gluon.jit
    def compute(self, ctx, walk, stage, tile, step):
        """One chunk; with beta Mamba-2's (``compute_transposed``). Ordered so that few [BT, BT] / [BT, BV] tiles are
        live beside S: the state goes to shared memory and is updated first (S's old value is then read there), the
        scores next, o last."""
        if self.HAS_BETA:
            walk = self.compute_transposed(ctx, walk, stage, tile, step)
        else:
            c: gl.constexpr = ctx.index
            h, col = self.unit(tile, c)
            q = stage.q.reshape([self.BT, self.BK])
            k = stage.k.reshape([self.BT, self.BK])
            v = ctx.own(stage.va, stage.vb).reshape([self.BT, self.BV])
            dtype: gl.constexpr = self.q_desc.dtype
            t0 = step * self.BT
            rows = t0 + gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
            cols = t0 + gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
            row_ok = rows < self.N

            # G (the chunk's cumulative log decay in log2 units, by row and by column) from the stage: the TMA
            # brought it with q, k, v, nothing to wait for on the walk
            offs_c = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
            w_rows = gl.where(row_ok, 1.0, 0.0)  # each token's weight in the state update
            S_decay = 1.0
            if self.DECAY:
                if c == 0:
                    g_smem = stage.ga.reshape([self.BT])
                else:
                    g_smem = stage.gb.reshape([self.BT])
                G_r = g_smem.load(gl.SliceLayout(1, self.SL))
                G_c = g_smem.load(gl.SliceLayout(0, self.SL))
                # the chunk's last token's G from the column copy (the host pads G past N with the last token's, so
                # row BT - 1 is it)
                G_last = gl.sum(gl.where(offs_c == self.BT - 1, G_c, 0.0), axis=0)
                w_rows = w_rows * gl.exp2(G_last - G_r)
                S_decay = gl.exp2(G_last)

            S_smem = self.state_smem.index(c)
            causal = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
            row_scale = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.SL)) + self.scale
            # the old state to shared memory (the B operand of Q S)
            wv = self.wv_smem.index(c)
            gl.thread_barrier()  # the previous step's wgmmas have read both buffers
            S_smem.store(walk.S.to(dtype))
            fence_async_shared()
            gl.thread_barrier()

            # intra-chunk scores P = mask(Q K^T exp(G_i - G_j)) scale
            s = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL), use_acc=False)
            if self.DECAY:
                s = s * self.decay_factors(G_r, G_c, causal)
                row_scale = row_scale * gl.exp2(G_r)
            p_f = gl.where(causal, s * self.scale, 0.0)
            p = gl.convert_layout(p_f.to(dtype), self.PL)

            # o = exp(G_i) scale (Q S_old) + P V
            o = warpgroup_mma(q, S_smem, gl.zeros([self.BT, self.BV], gl.float32, self.SL), use_acc=False)
            o = warpgroup_mma(p, v, o * gl.expand_dims(row_scale, 1))

            # S <- exp(G_last) S + K^T (exp(G_last - G_j) V_j)
            gl.thread_barrier()  # (the warpgroup past P V before wv is rewritten)
            wv.store((v.load(self.SL).to(gl.float32) * gl.expand_dims(w_rows, 1)).to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            S = warpgroup_mma(k.permute((1, 0)), wv, walk.S * S_decay)
            store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])  # (rows past N clipped by TMA)
            walk = Walk(S)
        return walk

    @gluon.jit
    def compute_transposed(self, ctx, walk, stage, tile, step):
        """Mamba-2's chunk (beta, a decay, D and z) on the transposed state S^T [BV, BK]:
        everything a step computes, transposed,

            P^T  = mask(K Q^T * 2^(G_i - G_j)) * beta_j scale           rows j (keys), columns i (queries)
            o^T  = (S^T Q^T) * scale 2^(G_i) + V^T P^T                  S^T from registers, P^T from shared memory
            S^T <- 2^(G_last) S^T + (V^T diag(2^(G_last - G_j) beta_j)) K   wV^T from registers

        so the state never goes through shared memory (S^T is the register A operand of S^T Q^T, and the update's
        accumulator; its wV^T a register operand too, and v^T P V's, read once a step), and the ALU's work runs under
        the tensor cores': K Q^T comes from the stage (kernels_forward.chunk_scores), so S^T Q^T runs alone with the
        decay's exps and P^T under it, then P V and the update, and the epilogue (D v, the gate's tanh, the store)
        under the update. The register operands are made, and S^T Q^T's
        accumulator scaled, with no wgmma running (ptxas serializes a kernel whose wgmma inputs are written while one
        runs: C7513). The tokens are o^T's and P^T's columns, where a per-token factor would cost 16 registers and 16
        exps a thread: the update's weights and o's factor are made one exp a thread in a 1-D layout and read back in
        the columns' layout from shared memory after S^T Q^T's wait. A step has five bar.syncs (each a warpgroup's
        named barrier): P^T's, which also hands over those factors, tma.store_wait's (the o^T buffer's previous store
        has read it), o^T's before its TMA store, and Triton's before the ring's wait and the stage's release."""
        c: gl.constexpr = ctx.index
        h, col = self.unit(tile, c)
        q = stage.q.reshape([self.BT, self.BK])
        k = stage.k.reshape([self.BT, self.BK])
        if c == 0:
            v = stage.va.reshape([self.BT, self.BV])
            g_smem = stage.ga.reshape([self.BT])
            b_smem = stage.ba.reshape([self.BT])
        else:
            v = stage.vb.reshape([self.BT, self.BV])
            g_smem = stage.gb.reshape([self.BT])
            b_smem = stage.bb.reshape([self.BT])
        dtype: gl.constexpr = self.q_desc.dtype
        t0 = step * self.BT
        offs_j = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))  # P^T's rows: keys
        offs_i = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))  # P^T's and o^T's columns: tokens
        G_j = g_smem.load(gl.SliceLayout(1, self.SL))
        G_i = g_smem.load(gl.SliceLayout(0, self.SL))
        G_last = gl.sum(gl.where(offs_i == self.BT - 1, G_i, 0.0), axis=0)  # (the host pads G past N with it)
        beta_j = b_smem.load(gl.SliceLayout(1, self.SL))  # (0 past N: the host's pad)
        # the update's weights by token (wV^T's columns, 0 past N) and o's factors: one exp a thread each, read back
        # in the columns' layout (a column vector takes 16 registers a thread: G's by column is loaded where used)
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        G1 = g_smem.load(L1)
        offs1 = gl.arange(0, self.BT, layout=L1)
        w_smem = self.wv_smem.slice(c * self.BT, self.BT)
        e_smem = self.ev_smem.slice(c * self.BT, self.BT)
        w_smem.store(gl.where(t0 + offs1 < self.N, gl.exp2(G_last - G1), 0.0) * b_smem.load(L1))
        e_smem.store(gl.exp2(G1) * self.scale)
        # S^T Q^T's register operand, made before any wgmma runs: S^T in the input dtype
        vT16 = v.permute((1, 0)).load(self.SL)  # (read once: P V's and the update's register operands, D v's)
        S_op = gl.convert_layout(walk.S.to(dtype), self.SPL)
        S_acc = walk.S * gl.exp2(G_last)
        qT = q.permute((1, 0))
        p_smem = self.state_smem.index(c)  # (with beta: [2, BT, BT], each consumer's P^T)
        causal = gl.expand_dims(offs_j, 1) <= gl.expand_dims(offs_i, 0)
        # S^T Q^T alone on the tensor cores; under it the chunk's scores K Q^T from the stage (made once a q/k head
        # by kernels_forward.chunk_scores: no consumer runs their SS wgmma, 32 KB of shared-memory reads a step),
        # the decay's factors (unmasked, +inf above the diagonal where decays are strong: one select takes them
        # away) and P^T, stored
        qs_tok = warpgroup_mma(S_op, qT, gl.zeros([self.BV, self.BT], gl.float32, self.SL), use_acc=False,
                               is_async=True)
        s = stage.cb.reshape([self.BT, self.BT]).load(self.SL).to(gl.float32)
        f = gl.exp2(gl.expand_dims(g_smem.load(gl.SliceLayout(0, self.SL)), 0) - gl.expand_dims(G_j, 1))
        pT = gl.where(causal, s * f * gl.expand_dims(beta_j * self.scale, 1), 0.0)
        p_smem.store(pT.to(dtype))
        # one barrier for two hand-offs: P^T (V^T P^T's operand) and the factors (stored as the step began)
        fence_async_shared()
        gl.thread_barrier()
        o = warpgroup_mma_wait(0, deps=(qs_tok,))
        # the update's register operand wV^T [BV, BT], made with no wgmma running
        w_i = w_smem.load(gl.SliceLayout(0, self.SL))
        wvT = gl.convert_layout((vT16.to(gl.float32) * gl.expand_dims(w_i, 0)).to(dtype), self.PL)
        # o^T = (S^T Q^T) scale 2^(G_i) + V^T P^T (scaled with no wgmma running), then the update
        o = o * gl.expand_dims(e_smem.load(gl.SliceLayout(0, self.SL)), 0)
        o_tok = warpgroup_mma(gl.convert_layout(vT16, self.PL), p_smem, o, is_async=True)
        S_tok = warpgroup_mma(wvT, k, S_acc, is_async=True)
        # the epilogue (D v, the gate's tanh, the store) under the update
        o = warpgroup_mma_wait(1, deps=(o_tok,))
        if self.HAS_D:
            offs_v = gl.arange(0, self.BV, layout=gl.SliceLayout(1, self.SL))
            d_col = gl.load(self.DSKIP + (h.to(gl.int64) * self.sdh + col) + offs_v)
            o = o + gl.expand_dims(d_col, 1) * vT16.to(gl.float32)
        if self.HAS_Z:
            if c == 0:
                zT = stage.za.reshape([self.BT, self.BV]).permute((1, 0)).load(self.SL).to(gl.float32)
            else:
                zT = stage.zb.reshape([self.BT, self.BV]).permute((1, 0)).load(self.SL).to(gl.float32)
            z_half = 0.5 * zT
            o = o * (z_half + z_half * tanh_approx(z_half))
        # o^T to the output's block through shared memory (a transposed view), one TMA store
        tma.store_wait(0)
        ctx.out.reshape([self.BT, self.BV]).permute((1, 0)).store(o.to(self.o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(self.o_desc, [tile.b, h, t0, col], ctx.out)
        S = warpgroup_mma_wait(0, deps=(S_tok,))
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
def la_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_desc, z_desc, g_desc, b_desc, DSKIP, H0, HT,
                        sdh, s0b, s0h, s0f, s0v, stb, sth, stf, stv, N, H, VB, GROUP, scale, num_tiles, cb_desc,
                        STAGES: gl.constexpr, DECAY: gl.constexpr, HAS_BETA: gl.constexpr, HAS_D: gl.constexpr,
                        HAS_Z: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """o (and the final states) of every unit of (batch, head, 64 value columns); a persistent grid, two
    consumer warpgroups (num_warps = 4) and a producer warp. G (head-major, log2 units: chunk_heads_prep), beta
    (chunk_heads_prep; only with a decay) and z TMA-loaded with the stage; with beta Mamba-2's step on the transposed
    state (``compute_transposed``)."""
    gl.static_assert(DECAY or not HAS_BETA, "beta comes with a decay (Mamba-2's dt)")
    gl.static_assert(HAS_BETA or not (HAS_Z or HAS_D), "D and z come with beta (Mamba-2's)")
    BT: gl.constexpr = q_desc.block_type.shape[2]
    BK: gl.constexpr = q_desc.block_type.shape[3]
    BV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(BT == BV, "the scores' and the outputs' layouts are one: BT == BV")
    SL: gl.constexpr = wgmma_layout(BT, BV, gl.num_warps())
    operand_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    if HAS_BETA:  # S^T [BV, BK]; each consumer's P^T [BT, BT] and its factors by token (the update's, o's)
        p_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BT, BT], operand_layout)
        w_smem = gl.allocate_shared_memory(gl.float32, [2 * BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        e_smem = gl.allocate_shared_memory(gl.float32, [2 * BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        op = LinearAttentionForward(q_desc, k_desc, v_desc, o_desc, z_desc, g_desc, b_desc, cb_desc, DSKIP, H0, HT,
                                    sdh, s0b, s0h, s0f, s0v, stb, sth, stf, stv, N, H, VB, GROUP, scale, p_smem,
                                    w_smem, e_smem, BT, BK, BV, DECAY, HAS_BETA, HAS_D, HAS_Z, HAS_H0, STORE_HT, SL,
                                    wgmma_layout(BV, BK, gl.num_warps()), wgmma_lhs_layout(BV, BK, gl.num_warps()),
                                    wgmma_lhs_layout(BV, BT, gl.num_warps()))
    else:
        state_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BK, BV], operand_layout)
        wv_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BT, BV], operand_layout)
        op = LinearAttentionForward(q_desc, k_desc, v_desc, o_desc, z_desc, g_desc, b_desc, cb_desc, DSKIP, H0, HT,
                                    sdh, s0b, s0h, s0f, s0v, stb, sth, stf, stv, N, H, VB, GROUP, scale, state_smem,
                                    wv_smem, wv_smem, BT, BK, BV, DECAY, HAS_BETA, HAS_D, HAS_Z, HAS_H0, STORE_HT, SL,
                                    wgmma_layout(BK, BV, gl.num_warps()), wgmma_lhs_layout(BT, BV, gl.num_warps()),
                                    None)
    if HAS_BETA and HAS_Z:
        stages = ChunkGBZ(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                          ring(z_desc, STAGES), ring(z_desc, STAGES), ring(g_desc, STAGES), ring(g_desc, STAGES),
                          ring(b_desc, STAGES), ring(b_desc, STAGES), ring(cb_desc, STAGES))
    elif HAS_BETA:
        stages = ChunkGB(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                         ring(g_desc, STAGES), ring(g_desc, STAGES), ring(b_desc, STAGES), ring(b_desc, STAGES),
                         ring(cb_desc, STAGES))
    elif DECAY:
        stages = ChunkG(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES),
                        ring(g_desc, STAGES), ring(g_desc, STAGES))
    else:
        stages = Chunk(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES), ring(v_desc, STAGES))
    # a tensor even where the launch specialized num_tiles == 1 to a constant (the template's _Pipeline holds a
    # tensor: B1 with two units compiled to a CompilationError on the H100)
    num_tiles = gl.program_id(0) * 0 + num_tiles
    if HAS_BETA:  # (the scores' 32 registers beside S^T Q^T's operands: 240 a consumer thread)
        run(op, Layout(o_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0), stages,
            num_tiles)
    else:
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


def fits(q, k, v, g, feature: int, beta=None, z=None, d_skip=None) -> str | None:
    """None where this kernel takes these inputs, else why not (the tl kernels run them)."""
    if feature != 0:
        return "a feature map"
    if g is not None and g.dim() != 3:
        return "a per-channel decay"
    if beta is not None and g is None:
        return "beta without a decay (the kernel's beta is Mamba-2's dt, with its decay)"
    if (z is not None or d_skip is not None) and beta is None:
        return "D or a gate z without beta (the kernel's are Mamba-2's, with its dt)"
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


def chunk_cumulative_heads(g: torch.Tensor, chunk: int) -> torch.Tensor:
    """chunk_heads_prep's G in torch (its reference): the log decay g (B, N, H) clamped at the floor (NaN kept), summed within each chunk of
    ``chunk`` tokens from its start, in log2 units, head-major and padded to whole chunks: (B, H, N_pad)
    float32, contiguous (TMA boxes of one chunk). The pad's g is 0, so a chunk's last row holds its last
    real token's G (what the state update decays by)."""
    B, N, H = g.shape
    pad = (-N) % chunk
    g = g.float().clamp_min(LOG_DECAY_FLOOR_HOST).mul_(LOG2E)
    g = torch.nn.functional.pad(g.transpose(1, 2), (0, pad)).contiguous()  # (B, H, N_pad)
    return g.view(B, H, (N + pad) // chunk, chunk).cumsum(-1).view(B, H, N + pad)


def chunk_heads(beta: torch.Tensor, chunk: int) -> torch.Tensor:
    """chunk_heads_prep's beta in torch (its reference): (B, N, H) as float32 (B, H, N_pad), contiguous, 0 past N."""
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


def launch_args(q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float, stages: int = 3, *, operand=None, cb=None):
    """(grid, arguments by name, num_warps) of la_fwd_gluon_kernel; o a contiguous (B, N, H, Dv) output; g and
    beta as ``chunk_heads_prep`` gives them ((B, H, N_pad) float32, head-major), z TMA-able (``tma_ok``).
    ``operand(t, block, shape, strides)`` makes the descriptors (default gluon_descriptor; tiles.launch.TmaOperand
    for a CachedLaunch). With beta ``cb`` is kernels_forward.chunk_scores(q, k, BT_GLUON, q.dtype)."""
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
    z_desc = gluon_descriptor(z, [1, 1, BT, BV], *_head_major(z)) if z is not None else descs[3]
    g_desc = descs[3]
    if g is not None:
        if g.dim() != 3 or tuple(g.shape[:2]) != (B, H) or g.shape[2] % BT or not g.is_contiguous():
            raise ValueError(f"launch_args takes chunk_heads_prep's (B, H, N_pad) G, got {tuple(g.shape)}")
        g_desc = gluon_descriptor(g, [1, 1, BT], list(g.shape), list(g.stride()))
    b_desc = descs[3]
    if beta is not None:
        if g is None or tuple(beta.shape) != tuple(g.shape) or not beta.is_contiguous():
            raise ValueError(f"launch_args takes chunk_heads_prep's (B, H, N_pad) beta with its G, got "
                             f"{tuple(beta.shape)}")
        b_desc = gluon_descriptor(beta, [1, 1, BT], list(beta.shape), list(beta.stride()))
    cb_desc = descs[3]
    if beta is not None:
        if (cb is None or tuple(cb.shape) != (B, q.shape[2], g.shape[2], BT) or cb.dtype != q.dtype
                or not cb.is_contiguous()):
            raise ValueError(f"launch_args takes chunk_scores's (B, Hqk, N_pad, {BT}) scores in q's dtype with beta")
        cb_desc = gluon_descriptor(cb, [1, 1, BT, BT], list(cb.shape), list(cb.stride()))
    args = dict(q_desc=descs[0], k_desc=descs[1], v_desc=descs[2], o_desc=descs[3], z_desc=z_desc, g_desc=g_desc,
                b_desc=b_desc, DSKIP=d_skip if d_skip is not None else dummy,
                H0=h0 if h0 is not None else dummy, HT=ht if ht is not None else dummy)
    s0, sht = st(h0, 4), st(ht, 4)
    args.update(sdh=st(d_skip, 2)[0], s0b=s0[0], s0h=s0[1], s0f=s0[2], s0v=s0[3], stb=sht[0], sth=sht[1], stf=sht[2],
                stv=sht[3], N=N, H=H, VB=VB, GROUP=H // q.shape[2], scale=scale, num_tiles=num_tiles, STAGES=stages,
                DECAY=g is not None, HAS_BETA=beta is not None, HAS_D=d_skip is not None, HAS_Z=z is not None,
                HAS_H0=h0 is not None, STORE_HT=ht is not None, cb_desc=cb_desc)
    return (persistent_programs(num_tiles, v.device),), args, 4


def empty_state(B: int, H: int, F: int, Dv: int, device, mamba: bool) -> torch.Tensor:
    """A (B, H, F, Dv) float32 final state as every forward path returns it (the custom op's fake too): contiguous,
    but with beta (Mamba-2) laid out (B, H, Dv, F), mamba_ssm's (b, h, p, s), as the transposed view. There the
    transposed step stores S^T's rows with the feature stride 1 (a constant: its offsets are immediates); with a
    stride read at run time the 64 feature offsets a thread of each state are loop-invariant, hoisted out of the
    persistent tile loop and spilled (2.2 KB a thread with h0 and ht, notes decision 170). mamba2_chunk_scan's
    (b, h, p, s) final states are then its transposed view, with no copy."""
    if mamba:
        return torch.empty(B, H, Dv, F, dtype=torch.float32, device=device).transpose(-1, -2)
    return torch.empty(B, H, F, Dv, dtype=torch.float32, device=device)


def tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA takes t's strides and alignment (unit last stride, 16-byte aligned base and strides)."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0
                                                                 for s in t.stride()[:-1])


def prepare_decay(g, beta):
    """(G, beta) as the kernel reads them (chunk_heads_prep's; None where not given)."""
    if g is None:
        return None, None
    return chunk_heads_prep(g, beta, BT_GLUON)


def forward(q, k, v, g, beta, d_skip, z, h0, scale: float, final_state: bool, stages: int = 3, *, operand=None,
            launch=None):
    """(o, final state or None) by the Gluon kernel (``fits`` must have said None). z and D's value
    columns must be contiguous (stride 1), as Mamba-2's are. ``operand``: launch_args's (the descriptors' maker);
    ``launch(grid, args, num_warps)``: the launch (default: the kernel's own; the op's keyed path passes a
    CachedLaunch's)."""
    B, N, H, Dv = v.shape
    o = torch.empty(B, N, H, Dv, dtype=v.dtype, device=v.device)
    ht = empty_state(B, H, q.shape[-1], Dv, v.device, beta is not None) if final_state else None
    cb = None
    if beta is not None:  # Mamba-2's step reads each chunk's K Q^T, made once a q/k head
        from tilecore.ops.linear_attention.kernels_forward import chunk_scores

        cb = chunk_scores(q, k, BT_GLUON, q.dtype)
    g, beta = prepare_decay(g, beta)
    if d_skip is not None:
        d_skip = d_skip.float().contiguous()
    if z is not None and not tma_ok(z):
        z = z.contiguous()
    grid, args, warps = launch_args(q, k, v, g, beta, d_skip, z, h0, o, ht, scale, stages, operand=operand, cb=cb)
    if launch is None:
        la_fwd_gluon_kernel[grid](**args, num_warps=warps)
    else:
        launch(grid, args, warps)
    return o, ht


# --------------------------------------------------------------------------------------------
# compile report (no GPU): compile_report(CASE, stages) compiles the kernel as the shipped launches build it for
# sm_90a and returns its resources and Hopper instructions; CASE: linear, decay (scalar decay, initial and final
# states), mamba2 (beta, D, z, 80 heads on one q/k head), mamba2_states (with h0 and ht in the op's (b, h, p, s)
# layout, empty_state's); stages: configs.GLUON_STAGES's 2. TRITON_INTERPRET must be
# unset (tests/linear_attention/test_forward_gluon_compile.py runs it in a fresh process).

COMPILE_CASES = {  # (Hqk, H, Dk, Dv, decay, Mamba-2's terms, states)
    "linear": (16, 16, 128, 128, False, False, False),
    "decay": (16, 16, 128, 128, True, False, True),
    "mamba2": (1, 80, 128, 64, True, True, False),
    "mamba2_states": (1, 80, 128, 64, True, True, True),
}


def compile_report(case: str, stages: int = 2, compiled_out: list | None = None) -> dict:
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    Hqk, H, Dk, Dv, decay, mamba, states = COMPILE_CASES[case]
    B, N, bf = 2, 4096, torch.bfloat16
    q = torch.empty(B, N, Hqk, Dk, dtype=bf)
    v = torch.empty(B, N, H, Dv, dtype=bf)
    f32 = lambda *shape: torch.empty(*shape, dtype=torch.float32)  # noqa: E731
    # the states as the op passes them: with beta in Mamba-2's (b, h, p, s) layout (empty_state)
    h0, ht = ((empty_state(B, H, Dk, Dv, "cpu", mamba), empty_state(B, H, Dk, Dv, "cpu", mamba)) if states
              else (None, None))
    cb = torch.empty(B, Hqk, N, BT_GLUON, dtype=bf) if mamba else None
    grid, args, warps = launch_args(q, q, v, f32(B, H, N) if decay else None, f32(B, H, N) if mamba else None,
                                    f32(H, Dv) if mamba else None, torch.empty_like(v) if mamba else None, h0,
                                    torch.empty_like(v), ht, 1.0, stages, cb=cb)
    compiled = compile_kernel(la_fwd_gluon_kernel, args, num_warps=warps)
    if compiled_out is not None:
        compiled_out.append(compiled)
    r = resources(compiled)
    return dict(case=case, spill_bytes=r.spill_stores, registers=r.registers, shared=r.shared, threads=r.threads,
                wgmma_serialized=r.wgmma_serialized, **has_hopper_instructions(compiled.asm["ptx"]))

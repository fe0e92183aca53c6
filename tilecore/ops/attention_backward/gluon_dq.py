"""Attention's dQ on Hopper, its own kernel on the tiles template: the forward's shape (a tile is 2
BLOCK_M query rows of one (batch, head), the ring streams its K and V blocks, two consumer
warpgroups of BLOCK_M rows each), with the backward's math. Per step, consumer c with its rows'
Q_c, dO_c, lse and delta (delta = rowsum(O * dO) - dlse, from the backward's preprocess):

    S   = Q_c K^T,   dP = dO_c V^T              wgmma, operands in shared memory
    P   = exp2(S * scale log2 e - lse log2 e)    (the forward's probabilities, recomputed)
    dS  = P * (dP - delta)
    dQ += dS K                                   wgmma, dS as the register operand

and dQ * scale is stored once per tile (a plain TMA store, unlike the fused dQ of gluon_backward.py,
whose float32 partials every key block adds). With the dK/dV kernel run without its dQ, that is the
backward in seven matmuls per block, the tl kernels' split (kernels_tl.attn_bwd_dq is its twin).

Masks and empty rows as in the forward: keys past Nk and, causal, after a query's diagonal are
masked (a consumer skips the tile's key blocks past its own diagonal); query rows past N arrive as
zeros and rows with no key (lse = -inf) read lse = +inf, so their p, and dQ, are 0.
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.ops.attention.gluon_kernels import (KV, head_of, query_tile, tanh_approx, tanh_from_exp2,
                                                  window_mask_scores, window_needs_mask)
from tilecore.tiles.gluon import (LOG2E, Layout, TileOperand, mask_scores, needs_mask, ring, run, store_block,
                                  struct, wgmma_layout)


@struct
class Gradient:
    """A consumer's dQ accumulator, its rows' lse (times log2 e) and delta, first row, and the tile's
    steps that are its own: [own_first, n_own) (own_first 0 but with a window)."""
    dq: object
    lse2: object
    delta: object
    first: object
    n_own: object
    own_first: object


@struct
class AttentionDQ:
    q_desc: object  # both consumers' rows
    k_desc: object
    v_desc: object
    do_desc: object
    dq_desc: object  # one consumer's rows
    lse: object
    delta: object
    H: object
    N: object
    Nk: object
    GROUP: object
    scale: object
    scale_log2e: object
    num_bh: object
    head_group: object
    left: object  # WINDOW: keys seen before and after a query's position (max(N, Nk): unbounded)
    right: object
    tanh_scale: object  # SOFTCAP: scale / cap (scale_log2e is then cap log2(e))
    CAUSAL: gl.constexpr
    BM: gl.constexpr
    BN: gl.constexpr
    D: gl.constexpr
    WINDOW: gl.constexpr  # as the forward's (query_tile: a tile's steps from its first_block)
    SOFTCAP: gl.constexpr  # 0: none; 1: tanh from exp2; 2: tanh.approx.f32; 3: 2 with dS = P (y - y tanh^2) (fixed)

    @gluon.jit
    def head(self, bh):
        return head_of(bh, self.H, self.GROUP)

    @gluon.jit
    def lengths(self, tile):
        """(N, Nk) of the tile's problem (the varlen kernel's: its sequence's)."""
        return self.N, self.Nk

    @gluon.jit
    def before_products(self, ctx, stage, tile, step):
        """Called before a step's products (the varlen kernel zeroes the next sequence's K / V rows there)."""
        pass

    @gluon.jit
    def setup(self, tile_id):
        rows = query_tile(self, tile_id, 2 * self.BM)
        return rows, rows.n_blocks

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """Step ``step``'s K and V blocks (rows past Nk arrive as zeros)."""
        b, h, hk = self.head(tile.bh)
        key = (tile.first_block + step) * self.BN if self.WINDOW else step * self.BN
        tma.async_copy_global_to_shared(self.k_desc, [b, hk, key, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.v_desc, [b, hk, key, 0], bar, stage.v)

    @gluon.jit
    def load_tile(self, bufs, bar, tile, consumer):
        """Both consumers' query rows of Q and of dO (rows past N: zeros)."""
        b, h, hk = self.head(tile.bh)
        tma.async_copy_global_to_shared(self.q_desc, [b, h, tile.first, 0], bar, bufs.index(0))
        tma.async_copy_global_to_shared(self.do_desc, [b, h, tile.first, 0], bar, bufs.index(1))

    @gluon.jit
    def start(self, ctx, tile, prev):
        """dQ = 0, this consumer's rows' lse (+inf where a row must get p = 0) and delta, its first
        row, and its key blocks (causal: those up to its own rows' diagonal)."""
        s_layout: gl.constexpr = wgmma_layout(self.BM, self.BN, gl.num_warps())
        first = tile.first + ctx.index * self.BM
        rows = first + gl.arange(0, self.BM, layout=gl.SliceLayout(1, s_layout))
        ok = rows < self.N
        offs = tile.bh.to(gl.int64) * self.N + rows
        lse = gl.load(self.lse + offs, mask=ok, other=float("inf"))
        lse = gl.where(lse == float("-inf"), float("inf"), lse)
        delta = gl.load(self.delta + offs, mask=ok, other=0.0)
        n_own = tile.n_blocks
        own_first = n_own * 0
        if self.CAUSAL:
            own_hi = gl.maximum(gl.minimum(self.Nk, first + self.BM + (self.Nk - self.N)), 0)
            n_own = gl.minimum(gl.cdiv(own_hi, self.BN), tile.n_blocks)
        if self.WINDOW:  # this consumer's rows' key blocks, as steps of the tile's (from its first_block)
            shift = self.Nk - self.N
            own_first = gl.maximum(first + shift - self.left, 0) // self.BN - tile.first_block
            own_hi = gl.maximum(gl.minimum(self.Nk, gl.minimum(first + self.BM, self.N) - 1 + shift + self.right + 1), 0)
            n_own = gl.minimum(gl.cdiv(own_hi, self.BN) - tile.first_block, tile.n_blocks)
        dq = gl.zeros([self.BM, self.D], gl.float32, wgmma_layout(self.BM, self.D, gl.num_warps()))
        return Gradient(dq, lse * LOG2E, delta, first, n_own, own_first)

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        s_layout: gl.constexpr = wgmma_layout(self.BM, self.BN, gl.num_warps())
        dq = st.dq
        # causal: the tile's later key blocks are all masked for this consumer; a window: its earlier too
        if (step < st.n_own) & (step >= st.own_first):
            q = ctx.operand.index(0).reshape([2 * self.BM, self.D]).slice(ctx.index * self.BM, self.BM)
            do = ctx.operand.index(1).reshape([2 * self.BM, self.D]).slice(ctx.index * self.BM, self.BM)
            k = stage.k.reshape([self.BN, self.D])
            self.before_products(ctx, stage, tile, step)
            zeros = gl.zeros([self.BM, self.BN], gl.float32, s_layout)
            s_tok = warpgroup_mma(q, k.permute((1, 0)), zeros, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(do, stage.v.reshape([self.BN, self.D]).permute((1, 0)), zeros, use_acc=False,
                                   is_async=True)
            if self.SOFTCAP:  # both first: the cap's derivative is not kept across dP's wgmma (backward's)
                s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
                ds = self.ds_operand(s, dp, st, tile, step)
            else:
                s = warpgroup_mma_wait(1, deps=(s_tok,))  # dP may still run
                ds = self.ds_operand(s, dp_tok, st, tile, step)
            dq = warpgroup_mma(ds, k, dq)
        return st.replace(dq=dq)

    @gluon.jit
    def ds_operand(self, s, dp, st, tile, step):
        """dS = P (dP - delta) of the step's scores ``s`` (waited for; capped and masked here), as the
        register operand of dQ += dS K. ``dp``: dP, or without a softcap its wgmma, waited for once P is
        made (its wgmma runs under the softmax)."""
        s_layout: gl.constexpr = wgmma_layout(self.BM, self.BN, gl.num_warps())
        start_n = (tile.first_block + step) * self.BN if self.WINDOW else step * self.BN
        N, Nk = self.lengths(tile)
        if self.SOFTCAP >= 2:
            s = tanh_approx(s * self.tanh_scale)
        elif self.SOFTCAP:
            s = tanh_from_exp2(s * self.tanh_scale)
        if self.SOFTCAP == 3:  # the cap's derivative into y = dP - delta first: y - y tanh^2 of the unmasked tanh
            y = dp - gl.expand_dims(st.delta, 1)
            y = y - y * (s * s)
        if self.WINDOW:
            if window_needs_mask(st.first, start_n, self.BM, self.BN, N, Nk, self.left, self.right):
                s = window_mask_scores(s, s_layout, st.first, start_n, N, Nk, self.left, self.right)
                if self.SOFTCAP == 3:  # a masked key's dS is 0, whatever its score (NaN in a row with no key)
                    y = gl.where(s == float("-inf"), 0.0, y)
        elif needs_mask(st.first, start_n, self.BN, N, Nk, self.CAUSAL):
            s = mask_scores(s, s_layout, st.first, start_n, N, Nk, self.CAUSAL, KEY_AXIS=1)
            if self.SOFTCAP == 3:
                y = gl.where(s == float("-inf"), 0.0, y)
        p = gl.exp2(s * self.scale_log2e - gl.expand_dims(st.lse2, 1))
        if self.SOFTCAP == 3:
            ds = p * y
        else:
            if not self.SOFTCAP:
                dp = warpgroup_mma_wait(0, deps=(dp,))
            ds = p * (dp - gl.expand_dims(st.delta, 1))
            if self.SOFTCAP:  # the cap's derivative 1 - tanh^2, 0 where masked (tanh -inf: min(inf, 1))
                ds = ds * (1.0 - gl.minimum(s * s, 1.0))
        # written with no wgmma running (else ptxas serializes every wgmma: C7513)
        ds_layout: gl.constexpr = gl.DotOperandLayout(
            operand_index=0, parent=wgmma_layout(self.BM, self.D, gl.num_warps()), k_width=2)
        return gl.convert_layout(ds.to(self.k_desc.dtype), ds_layout)

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def finish(self, ctx, st, tile):
        """dQ * scale of this consumer's rows (rows past N clipped by the TMA store)."""
        b, h, hk = self.head(tile.bh)
        store_block(st.dq, self.dq_desc, ctx.out, [b, h, st.first, 0], self.scale)


@gluon.jit
def attention_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, qdo_desc, lse_ptr, delta_ptr, H, N, Nk, GROUP,
                        scale, scale_log2e, num_bh, head_group, schedule, left, right, tanh_scale,
                        CAUSAL: gl.constexpr, STAGES: gl.constexpr, WINDOW: gl.constexpr = False,
                        SOFTCAP: gl.constexpr = 0):
    """dQ of attention for every (2 query blocks, batch * head); a persistent grid of two consumer
    warpgroups of 4 warps and a producer warp. q_desc/do_desc: the rows of both consumers (their
    boxes), qdo_desc the same box (the tile operand's shape), dq_desc one consumer's rows. WINDOW
    (not with CAUSAL: folded in) and SOFTCAP as the forward's: left, right, tanh_scale = scale / cap
    with scale_log2e = cap log2(e)."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    BM: gl.constexpr = dq_desc.block_type.shape[2]
    gl.static_assert(q_desc.block_type.shape[2] == 2 * BM, "a tile is both consumers' query rows")
    op = AttentionDQ(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, H, N, Nk, GROUP, scale,
                     scale_log2e, num_bh, head_group, left, right, tanh_scale, CAUSAL, BM, k_desc.block_type.shape[2],
                     k_desc.block_type.shape[3], WINDOW, SOFTCAP)
    layout = Layout(dq_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0, schedule=schedule,
                    tile_operand=TileOperand(qdo_desc, COUNT=2, SHARED=True))
    run(op, layout, KV(ring(k_desc, STAGES), ring(v_desc, STAGES)), gl.cdiv(N, 2 * BM) * num_bh)

"""Attention backward on Hopper, in one kernel: a layout and callbacks on the tiles template
(:mod:`tilecore.tiles.gluon.pipeline`).

A tile is 2 BLOCK_N keys of one (batch, kv head). Its K and V blocks are the template's shared
per-tile operands; each of the two consumer warpgroups owns BLOCK_N of the keys and keeps their dK
and dV in registers for the whole tile. The ring streams (Q, dO) blocks of BLOCK_M queries, for
every q head of the kv head's group (grouped-query attention sums there, without atomics). Per step
consumer c, with keys K_c and values V_c:

    S^T  = K_c Q^T,  dP^T = V_c dO^T        wgmma, operands in shared memory
    P^T  = exp2(S^T * scale log2 e - lse log2 e)   (recomputed with the forward's lse)
    dS^T = P^T * (dP^T - delta)             delta = rowsum(O * dO) - dlse, from a preprocess
    dV_c += P^T dO,  dK_c += dS^T Q         wgmma with P^T and dS^T as register operands

With DQ > 0 both consumers also write dS^T to shared memory (a double buffer, two mbarriers:
both halves written; both readers done) and each computes half of dQ's columns (of the step itself,
or of the previous step: see ``_compute``),

    dQ[:, half c] += scale * dS K[:, half c]  wgmma of dS from shared memory (a transposed view),

added to a float32 dQ by TMA reductions: five matmuls per step, none recomputed (FlashAttention-3's
scheme). With DQ = 0 a separate kernel computes dQ (seven matmuls in all).

The step's rows' lse and delta arrive with its Q and dO, by TMA into the stage's side buffer (the
stage's third buffer), from a (B * H, 2, N) view of a row-padded buffer that the preprocess writes
(lse with -inf made +inf, so that a row with no key gets p = 0, and delta): read from shared memory
straight into S^T's columns (loaded by pointer they cost three partition barriers a step:
notes/attention).

Masks: keys past Nk (only the last key block) and, when causal, keys after a query's diagonal
(only blocks crossing it). Query rows past N arrive as zeros, Q, dO, lse and delta alike: their p
is exp(0) = 1 but meets zero dO and zero dP, so they add nothing. Rows with no key at all (lse =
-inf, read as +inf) give p = 0 and zero gradients.
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import (Helper, Layout, TileOperand, mask_scores, needs_mask, ring, run, stage_struct,
                                  store_block, struct, tma_reduce_add, wgmma_layout)
from tilecore.tiles.schedule import head_grouped_tile
from tilecore.ops.attention.gluon_kernels import tanh_approx, tanh_from_exp2, window_mask_scores, window_needs_mask

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@stage_struct
class QStage:
    """One stage: a block of query rows' Q, their lse and delta (the side buffer), their dO."""
    q: object
    stats: object
    do: object


@struct
class KeyTile:
    """A tile: its first key, batch * kv head, first query block, query blocks per q head, where its
    walk starts (step_rows), batch, kv head, the q head its walk starts at, 1 / group size, and
    whether it walks up (causal pairs of grouped heads)."""
    start_n: object
    bhk: object
    first_mb: object
    per_head: object
    shift: object
    b: object
    hk: object
    head0: object
    inv_group: object
    upward: object


@struct
class Grads:
    """A consumer's dK and dV accumulators, and (KV_REGS) its K and V rows as register operands."""
    dk: object
    dv: object
    k_regs: object
    v_regs: object


@gluon.constexpr_function
def operand_layout(rows, cols, num_warps):
    """A [rows, k] register tile as the left operand of a wgmma with a [rows, cols] result."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(rows, cols, num_warps), k_width=2)


@gluon.jit
def stat_columns(stats_smem, which: gl.constexpr, st_layout: gl.constexpr):
    """Row statistic ``which`` (0: lse, 1: delta) of the step's rows, from the stage's side buffer,
    as the columns of S^T (in ``st_layout``)."""
    BM: gl.constexpr = stats_smem.shape[2]
    # the unswizzled TMA box is row-major (lse's BM rows, then delta's): the same bytes as a flat vector
    flat = stats_smem._reinterpret(gl.float32, [2 * BM], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    return flat.slice(which * BM, BM).load(gl.SliceLayout(0, st_layout))


@struct
class AttentionBackward:
    q_desc: object
    k_desc: object  # both consumers' keys
    v_desc: object
    do_desc: object
    dk_desc: object  # one consumer's keys
    dv_desc: object
    stats_desc: object
    dq_desc: object  # float32 dQ, added to by TMA reductions
    H: object
    N: object
    Nk: object
    GROUP: object  # q heads per kv head
    scale: object
    scale_log2e: object
    num_bhk: object
    head_group: object
    ds_smem: object  # dS^T of a step, both consumers' halves, double-buffered
    ds_full: object  # both halves written
    ds_free: object  # every reader done
    dq_staging: object  # dQ pieces on their way to TMA reductions
    left: object  # WINDOW: keys seen before and after a query's position (max(N, Nk): unbounded)
    right: object
    tanh_scale: object  # SOFTCAP: scale / cap (scale_log2e is then cap log2(e))
    CAUSAL: gl.constexpr
    BM: gl.constexpr
    BN: gl.constexpr  # one consumer's keys
    D: gl.constexpr
    DQ: gl.constexpr  # where dQ comes from: see compute
    KV_REGS: gl.constexpr
    WINDOW: gl.constexpr
    # 0: none; 1: tanh from exp2; 2: tanh.approx.f32 (1 and 2: the cap's derivative in float16, varlen's kernel and the
    # exact tanh); 3: tanh.approx.f32, dP^T's accumulator from -delta, y (1 - tanh^2) before P, dS = P y (the fixed
    # kernel's: compute)
    SOFTCAP: gl.constexpr
    # without a softcap: dP^T's accumulator from -delta too (SOFTCAP 3 has it always), so dS = P (dP - delta) is
    # one multiply and delta's registers die before the products
    DP_FROM_DELTA: gl.constexpr

    @gluon.jit
    def kv_head(self, bhk):
        """(batch, kv head) of the flat index bhk = batch * Hkv + kv head."""
        hkv = self.H // self.GROUP
        return bhk // hkv, bhk % hkv

    @gluon.jit
    def tile_kv_head(self, tile):
        """(batch, kv head) of a tile: with grouped heads from the tile (divided once, in setup); with
        one q head a kv head (GROUP specialized to 1) divided where used, as measured before."""
        if self.GROUP == 1:
            b, hk = self.kv_head(tile.bhk)
        else:
            b = tile.b
            hk = tile.hk
        return b, hk

    @gluon.jit
    def setup(self, tile_id):
        """The tile and its steps: every query block that sees one of its keys, for each q head of the
        group. With grouped heads whatever needs a division by a run-time value is here, once a tile
        (ptxas had recomputed them in the consumers' step loop, ~170 instructions a step). Order: kv
        heads in L2 groups, key block by key block across a group's heads; causal, the first key
        blocks see the most queries, so the heaviest tiles come first."""
        TILE_N: gl.constexpr = 2 * self.BN  # both consumers' keys
        n_blocks = gl.cdiv(self.Nk, TILE_N)
        bhk, key_block = head_grouped_tile(tile_id, n_blocks, self.num_bhk, self.head_group)
        start_n = key_block * TILE_N
        first_mb = 0
        if self.CAUSAL:  # query i sees keys j <= i + Nk - N: the first query that sees key start_n
            first_mb = gl.maximum(start_n - (self.Nk - self.N), 0) // self.BM
        if self.WINDOW:
            # query i sees keys i' - left .. i' + right, i' = i + Nk - N: the query blocks from the first
            # that sees key start_n to the last that sees the tile's last key (none: 0 steps, dK = dV = 0)
            first_mb = gl.maximum(start_n - (self.Nk - self.N) - self.right, 0) // self.BM
            last_key = gl.minimum(start_n + TILE_N, self.Nk) - 1
            last_row = gl.minimum(self.N - 1, last_key - (self.Nk - self.N) + self.left)
            per_head = gl.maximum(gl.cdiv(gl.maximum(last_row + 1, 0), self.BM) - first_mb, 0)
        else:
            per_head = gl.maximum(gl.cdiv(self.N, self.BM) - first_mb, 0)
        shift = key_block % gl.maximum(per_head, 1)  # where this tile's walk starts (step_rows)
        b = bhk
        hk = bhk  # unused with one q head a kv head: tile_kv_head divides where used
        if self.GROUP != 1:
            b, hk = self.kv_head(bhk)
        # with grouped heads, causal: the later key block of a pair (plan.paired_table) walks up
        upward = self.CAUSAL and 2 * key_block > n_blocks - 1
        tile = KeyTile(start_n, bhk, first_mb, per_head, shift, b, hk, key_block % self.GROUP, 1.0 / self.GROUP,
                       upward)
        return tile, per_head * self.GROUP

    @gluon.jit
    def step_rows(self, tile, step):
        """The step's (q head, first query row).

        One q head a kv head (GROUP specialized to 1): the tiles of the head walk its query blocks
        from different starting blocks (the key block's index, wrapping around), so that their dQ
        reductions, running at the same time, add to different rows.

        Grouped heads: every tile walks the query blocks from the last down, and at each block the
        group's q heads (starting at the key block's index, wrapping around). The tiles of a kv head,
        running at the same time, are then at the same query block: between them they use the
        group's rows of a few blocks, which L2 keeps while every tile reads them. Causal, a program
        runs key blocks in pairs, a heavy one and then a light one (plan.paired_table): the light one
        walks up from its diagonal, so that the second walks of a kv head's programs also meet.
        step // G comes from a float32 reciprocal with one correction each way, exact for steps
        below 2^24 (plan.steps_exact): an integer division by a run-time value is ~25 instructions."""
        b, hk = self.tile_kv_head(tile)
        if self.GROUP == 1:
            head = step * 0
            walked = step + tile.shift
            block = tile.first_mb + gl.where(walked >= tile.per_head, walked - tile.per_head, walked)
        else:
            group = self.GROUP
            walked = (step.to(gl.float32) * tile.inv_group).to(gl.int32)  # step // group, or one off
            head = step - walked * group
            walked = gl.where(head >= group, walked + 1, gl.where(head < 0, walked - 1, walked))
            head = step - walked * group + tile.head0
            head = gl.where(head >= group, head - group, head)
            block = tile.first_mb + gl.where(tile.upward, walked, tile.per_head - 1 - walked)
        return hk * self.GROUP + head, block * self.BM

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """The step's Q and dO blocks and its rows' lse and delta (rows past N arrive as zeros)."""
        b, hk = self.tile_kv_head(tile)
        h, start_m = self.step_rows(tile, step)
        tma.async_copy_global_to_shared(self.q_desc, [b, h, start_m, 0], bar, stage.q)
        tma.async_copy_global_to_shared(self.do_desc, [b, h, start_m, 0], bar, stage.do)
        tma.async_copy_global_to_shared(self.stats_desc, [b * self.H + h, 0, start_m], bar, stage.stats)

    @gluon.jit
    def load_tile(self, kv_smem, bar, tile, consumer):
        """The tile's K and V blocks (rows past Nk arrive as zeros)."""
        b, hk = self.tile_kv_head(tile)
        tma.async_copy_global_to_shared(self.k_desc, [b, hk, tile.start_n, 0], bar, kv_smem.index(0))
        tma.async_copy_global_to_shared(self.v_desc, [b, hk, tile.start_n, 0], bar, kv_smem.index(1))

    @gluon.jit
    def start(self, ctx, tile, prev):
        acc_layout: gl.constexpr = wgmma_layout(self.BN, self.D, gl.num_warps())
        dk = gl.zeros([self.BN, self.D], gl.float32, acc_layout)
        dv = gl.zeros([self.BN, self.D], gl.float32, acc_layout)
        if self.KV_REGS:  # this consumer's K and V rows as register operands for the whole tile
            a_layout: gl.constexpr = operand_layout(self.BN, self.BM, gl.num_warps())
            k_c = ctx.operand.index(0).reshape([2 * self.BN, self.D]).slice(ctx.index * self.BN, self.BN).load(a_layout)
            v_c = ctx.operand.index(1).reshape([2 * self.BN, self.D]).slice(ctx.index * self.BN, self.BN).load(a_layout)
            return Grads(dk, dv, k_c, v_c)
        else:
            return Grads(dk, dv, 0, 0)

    @gluon.jit
    def before_products(self, ctx, stage, tile, start_m):
        """Called before a step's products (the varlen kernel's ZERO_TAIL zeroes the next sequence's rows)."""
        pass

    @gluon.jit
    def step_ds(self, ds_t, start_m, tile):
        """The step's dS^T as the dK and dQ products take it (the varlen kernel's ZERO_TAIL zeroes the next
        sequence's queries' columns)."""
        return ds_t

    @gluon.jit
    def masked_with(self, t_t, y_t, start_n, start_m, tile):
        """The capped scores t_t masked as probabilities masks them (-inf), and y_t 0 where they are masked (a masked
        key's dS is 0 whatever its score was: a NaN one included), on the blocks that need a mask only."""
        st_layout: gl.constexpr = t_t.type.layout
        if self.WINDOW:
            if window_needs_mask(start_m, start_n, self.BM, t_t.shape[0], self.N, self.Nk, self.left, self.right):
                t_t = window_mask_scores(t_t, st_layout, start_m, start_n, self.N, self.Nk, self.left, self.right,
                                         KEY_AXIS=0)
                y_t = gl.where(t_t == float("-inf"), 0.0, y_t)
        elif needs_mask(start_m, start_n, t_t.shape[0], self.N, self.Nk, self.CAUSAL):
            t_t = mask_scores(t_t, st_layout, start_m, start_n, self.N, self.Nk, self.CAUSAL, KEY_AXIS=0)
            y_t = gl.where(t_t == float("-inf"), 0.0, y_t)
        return t_t, y_t

    @gluon.jit
    def probabilities(self, s_t, lse, start_n, start_m, tile):
        """P^T (keys x queries) from the scores S^T (keys from start_n, queries from start_m) and the
        rows' lse as its columns (natural log; +inf for rows that must get p = 0), and (SOFTCAP 1, 2) the
        cap's derivative 1 - tanh^2 of the masked scores in float16, dS's factor (1.0 without a softcap).
        (``tile``: the varlen kernel's masks read its sequence's lengths there.)"""
        st_layout: gl.constexpr = s_t.type.layout
        if self.SOFTCAP:  # S^T becomes tanh(S^T scale / cap), its base-2 scale cap log2(e), as in the forward
            if self.SOFTCAP >= 2:
                s_t = tanh_approx(s_t * self.tanh_scale)
            else:
                s_t = tanh_from_exp2(s_t * self.tanh_scale)
        if self.WINDOW:
            if window_needs_mask(start_m, start_n, self.BM, s_t.shape[0], self.N, self.Nk, self.left, self.right):
                s_t = window_mask_scores(s_t, st_layout, start_m, start_n, self.N, self.Nk, self.left, self.right,
                                         KEY_AXIS=0)
        elif needs_mask(start_m, start_n, s_t.shape[0], self.N, self.Nk, self.CAUSAL):
            s_t = mask_scores(s_t, st_layout, start_m, start_n, self.N, self.Nk, self.CAUSAL, KEY_AXIS=0)
        p_t = gl.exp2(s_t * self.scale_log2e - gl.expand_dims(lse * LOG2E, 0))
        dtanh = 1.0
        if self.SOFTCAP:  # from the masked tanh: -inf gives min(inf, 1): a factor 0, not NaN
            # float16 (as measured on the H100; float32 compiles to 12 B fewer spills and no f16 round
            # trip, unmeasured)
            dtanh = (1.0 - gl.minimum(s_t * s_t, 1.0)).to(gl.float16)
        return p_t, dtanh

    @gluon.jit
    def issue_dq(self, ctx, step):
        """Issue this consumer's half of dQ = dS K for ring step ``step`` once both halves of its dS
        are in shared memory (buffer step % 2, its use step // 2). For step -1 (a program's first step
        has no previous one) the wait passes at once and the product is never added."""
        DH: gl.constexpr = self.D // 2
        buf = (step + 2) % 2
        mbarrier.wait(self.ds_full.index(buf), ((step + 2) // 2 + 1) & 1)  # (step // 2) & 1, and 1 for step -1
        return self.ds_times_k(buf, ctx.operand, ctx.index * DH, DH)

    @gluon.jit
    def ds_times_k(self, buf, kv_smem, first_col: gl.constexpr, COLS: gl.constexpr):
        """dS K[:, first_col : first_col + COLS] for the step in dS buffer ``buf``, issued (dS is read
        through a transposed view of the [keys, queries] buffer)."""
        k_cols = kv_smem.index(0).reshape([2 * self.BN, self.D]).slice(first_col, COLS, dim=1)
        return warpgroup_mma(self.ds_smem.index(buf).permute((1, 0)), k_cols,
                             gl.zeros([self.BM, COLS], gl.float32, wgmma_layout(self.BM, COLS, gl.num_warps())),
                             use_acc=False, is_async=True)

    @gluon.jit
    def reduce_dq(self, staging, dq, coord, PENDING: gl.constexpr):
        """Add scale * dq to the float32 dQ at ``coord`` through ``staging`` with one TMA reduction
        (rows past N are dropped), once at most PENDING of this partition's reductions still read
        their buffers (so this buffer's last one has read it)."""
        tma.store_wait(PENDING)
        staging.reshape(dq.shape).store(dq * self.scale)
        fence_async_shared()
        gl.thread_barrier()
        tma_reduce_add(self.dq_desc, coord, staging)

    @gluon.jit
    def add_dq(self, ctx, tile, step, dq):
        """Add scale * dq (this consumer's half of the columns of the step's rows) to the float32 dQ,
        through this consumer's staging buffer."""
        b, hk = self.tile_kv_head(tile)
        h, start_m = self.step_rows(tile, step)
        self.reduce_dq(self.dq_staging.index(ctx.index), dq, [b, h, start_m, ctx.index * (self.D // 2)], 0)

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """One step; where dQ comes from is DQ:
        0: not here (a dq kernel after this one);
        1 (fused): this step's dQ, once both consumers wrote their dS, then added;
        3 (lagged): the previous step's dQ, issued with this step's dV and dK, after the softmax, when
           S^T and dP^T no longer hold registers: no consumer waits for the other's dS of the same
           step, and dQ is staged and added under dV and dK. A tile's first step multiplies a stale
           buffer (never added) and its last step also takes its own dQ;
        4 (warpgroup): not in the consumers: they write dS^T as for 1 and 3 and go on; the helper
           partition (``help``) computes and adds each step's dQ.
        (The dQ schemes tried and dropped are in notes/attention's decision log.)"""
        return self.step_with(self, ctx, st, stage, tile, step)

    @gluon.jit
    def step_with(self, op, ctx, st, stage, tile, step):
        """compute's step, whose rows, masks and dQ destination are ``op``'s (step_rows, before_products,
        probabilities, masked_with, step_ds, add_dq): this struct's own, or those of a kernel that holds it as a
        member and walks other tiles (the varlen backward); the step's sizes, modes and buffers are this struct's."""
        BM: gl.constexpr = self.BM
        BN: gl.constexpr = self.BN
        D: gl.constexpr = self.D
        MODE: gl.constexpr = self.DQ
        c: gl.constexpr = ctx.index  # this consumer: keys [c BN, (c + 1) BN) of the tile
        i = ctx.ring_step
        st_layout: gl.constexpr = wgmma_layout(BN, BM, gl.num_warps())
        dk = st.dk
        dv = st.dv
        h, start_m = op.step_rows(tile, step)
        start_n = tile.start_n + c * BN
        q = stage.q.reshape([BM, D])
        do = stage.do.reshape([BM, D])
        op.before_products(ctx, stage, tile, start_m)
        if self.KV_REGS:
            k_c = st.k_regs
            v_c = st.v_regs
        else:
            k_c = ctx.operand.index(0).reshape([2 * BN, D]).slice(c * BN, BN)
            v_c = ctx.operand.index(1).reshape([2 * BN, D]).slice(c * BN, BN)

        zeros = gl.zeros([BN, BM], gl.float32, st_layout)
        FROM_DELTA: gl.constexpr = self.SOFTCAP == 3 or (self.SOFTCAP == 0 and self.DP_FROM_DELTA)
        if FROM_DELTA:  # dP^T's accumulator starts at -delta: the product is dP - delta and delta's registers
            # are free before the products, where S^T, dP^T, dK and dV hold 192 (D128 fused: 632 -> 476 B spilled)
            minus_delta = zeros - gl.expand_dims(stat_columns(stage.stats, 1, st_layout), 0)
        s_tok = warpgroup_mma(k_c, q.permute((1, 0)), zeros, use_acc=False, is_async=True)
        if FROM_DELTA:
            dp_tok = warpgroup_mma(v_c, do.permute((1, 0)), minus_delta, use_acc=True, is_async=True)
        else:
            dp_tok = warpgroup_mma(v_c, do.permute((1, 0)), zeros, use_acc=False, is_async=True)
        if self.SOFTCAP == 3:  # the cap's derivative into y = dP - delta before P: y (1 - tanh^2) of the unmasked tanh
            # (finite: no min), zeroed where masked (masked_with), then dS = P y by one multiply; tanh's registers die into
            # P and lse is read only then (D128 causal fused: 476 -> 144 B spilled, 3440 -> 3320 SASS; notes/attention)
            s_t, y_t = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            t_t = tanh_approx(s_t * self.tanh_scale)
            y_t = y_t - y_t * (t_t * t_t)
            t_t, y_t = op.masked_with(t_t, y_t, start_n, start_m, tile)
            p_t = gl.exp2(t_t * self.scale_log2e - gl.expand_dims(stat_columns(stage.stats, 0, st_layout) * LOG2E, 0))
            ds_t = p_t * y_t
        else:
            lse_cols = stat_columns(stage.stats, 0, st_layout)
            if self.SOFTCAP:
                # both products first, then the softmax: the cap's derivative (float16, 16 registers a
                # thread) kept across dP's wgmma spilled more at D128 (924 bytes against 632)
                s_t, dp_t = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
                p_t, dtanh = op.probabilities(s_t, lse_cols, start_n, start_m, tile)
                delta_cols = stat_columns(stage.stats, 1, st_layout)
                # dS of the capped scores times the cap's derivative 1 - tanh^2 (0 where masked: p = 0 there)
                ds_t = p_t * (dp_t - gl.expand_dims(delta_cols, 0)) * dtanh.to(gl.float32)
            elif FROM_DELTA:
                s_t = warpgroup_mma_wait(1, deps=(s_tok,))
                p_t, dtanh = op.probabilities(s_t, lse_cols, start_n, start_m, tile)
                ds_t = p_t * warpgroup_mma_wait(0, deps=(dp_tok,))
            else:
                s_t = warpgroup_mma_wait(1, deps=(s_tok,))
                p_t, dtanh = op.probabilities(s_t, lse_cols, start_n, start_m, tile)
                delta_cols = stat_columns(stage.stats, 1, st_layout)
                dp_t = warpgroup_mma_wait(0, deps=(dp_tok,))
                ds_t = p_t * (dp_t - gl.expand_dims(delta_cols, 0))
        ds_t = op.step_ds(ds_t, start_m, tile)
        # both register operands are written with no wgmma running: ptxas serializes every wgmma of a
        # kernel that writes a wgmma's input registers while another runs (its warning C7513)
        ds_t = ds_t.to(stage.q.dtype)
        p_op = gl.convert_layout(p_t.to(stage.q.dtype), operand_layout(BN, D, gl.num_warps()))
        ds_op = gl.convert_layout(ds_t, operand_layout(BN, D, gl.num_warps()))
        if MODE != 0:
            mbarrier.wait(self.ds_free.index(i % 2), ((i // 2) & 1) ^ 1)  # both read this buffer two steps ago
        if MODE == 3:
            dq_tok = self.issue_dq(ctx, i - 1)  # read when dV and dK are issued: complete first
        dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)
        if MODE != 1:
            dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)
        if MODE != 0:
            self.ds_smem.index(i % 2).slice(c * BN, BN).store(ds_t)
            fence_async_shared()
            mbarrier.arrive(self.ds_full.index(i % 2))
        # dV and dK complete within the step: left running into the next one, their accumulators are
        # moved (the template's loop) under a running wgmma, and ptxas serializes every wgmma (C7515)
        if MODE == 0 or MODE == 4:
            dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
        elif MODE == 1:
            # dK is issued after dQ so that dQ's staging and reduction run under it (wgmma groups
            # complete in order): D128 +1-5% (notes/attention's decision log, b13)
            dq_tok = self.issue_dq(ctx, i)
            dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)
            dq, dv = warpgroup_mma_wait(1, deps=(dq_tok, dv_tok))
            mbarrier.arrive(self.ds_free.index(i % 2))
            op.add_dq(ctx, tile, step, dq)
            dk = warpgroup_mma_wait(0, deps=(dk_tok,))
        else:  # 3 (lagged)
            dq = warpgroup_mma_wait(2, deps=(dq_tok,))  # dV and dK still run
            mbarrier.arrive(self.ds_free.index((i + 1) % 2), pred=i > 0)  # this consumer has read step i - 1's dS
            if step > 0:
                op.add_dq(ctx, tile, step - 1, dq)  # while this step's dV and dK run
            if step == tile.per_head * self.GROUP - 1:  # the tile's last step: its own dQ now
                dq_tok = self.issue_dq(ctx, i)
                dq, dv, dk = warpgroup_mma_wait(0, deps=(dq_tok, dv_tok, dk_tok))
                op.add_dq(ctx, tile, step, dq)
            else:
                dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
        return st.replace(dk=dk, dv=dv)

    @gluon.jit
    def help(self, ctx, tile, step):
        """DQ mode 4, the helper warpgroup's step: once both consumers wrote the step's dS, dQ = dS K
        in column pieces of dq_desc's box width, each product staged in a buffer of its own and added
        by a TMA reduction while the next one runs; the dS let go once the last piece is read."""
        i = ctx.ring_step
        PIECE: gl.constexpr = self.dq_desc.block_type.shape[3]
        PIECES: gl.constexpr = self.D // PIECE
        mbarrier.wait(self.ds_full.index(i % 2), (i // 2) & 1)
        dq = self.ds_times_k(i % 2, ctx.operand, 0, PIECE)
        b, hk = self.tile_kv_head(tile)
        h, start_m = self.step_rows(tile, step)
        for p in gl.static_range(PIECES):
            if p > 0:
                dq = self.ds_times_k(i % 2, ctx.operand, p * PIECE, PIECE)
            dq = warpgroup_mma_wait(0, deps=(dq,))
            if p == PIECES - 1:
                mbarrier.arrive(self.ds_free.index(i % 2))  # dS read: the consumers may write the buffer again
            # the pieces' reductions go out in order: the last step's of this buffer is PIECES back
            self.reduce_dq(self.dq_staging.index(p), dq, [b, h, start_m, p * PIECE], PIECES - 1)

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def finish(self, ctx, st, tile):
        """dV, then dK (times the scale), through this consumer's epilogue buffer; rows past Nk are
        clipped by the TMA stores."""
        b, hk = self.tile_kv_head(tile)
        start_n = tile.start_n + ctx.index * self.BN
        store_block(st.dv, self.dv_desc, ctx.out, [b, hk, start_n, 0])
        store_block(st.dk, self.dk_desc, ctx.out, [b, hk, start_n, 0], self.scale)


@gluon.constexpr_function
def ds_layout(dtype):
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=dtype.primitive_bitwidth, rank=2)


@gluon.jit
def attention_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP,
                         scale, scale_log2e, num_bhk, head_group, schedule, left, right, tanh_scale,
                         CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ: gl.constexpr, KV_REGS: gl.constexpr = False,
                         WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = 0, DP_FROM_DELTA: gl.constexpr = False):
    """dK and dV (and with DQ 1, 3 or 4, dQ added to dq_desc's float32 tensor: see compute) for every
    (key block, batch * kv head); a persistent grid of 2 consumer warpgroups of 4 warps and a
    producer warp. Each program takes its tiles from ``schedule`` (a balanced table) or round-robin
    (None). ``WINDOW`` (not with CAUSAL, which the launcher folds into the window)
    and ``SOFTCAP`` as the forward's (gluon_kernels.py): left, right, and tanh_scale = scale / cap
    with scale_log2e = cap log2(e)."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    BM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = dk_desc.block_type.shape[2]  # one consumer's keys; k_desc's block holds both
    D: gl.constexpr = q_desc.block_type.shape[3]
    gl.static_assert(k_desc.block_type.shape[2] == 2 * BN, "K and V blocks hold both consumers' keys")
    # with the dQ warpgroup (D = 64 only) four warpgroups share 512 registers a thread: consumers 200,
    # helper 88, producer 24; D = 128's consumers need 224, too many for it (notes/attention, b18)
    gl.static_assert(DQ != 4 or D == 64, "the dQ warpgroup (DQ 4) fits D = 64")
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 2 * BN, BM], ds_layout(q_desc.dtype))
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(ds_full.index(j), count=2)
        mbarrier.init(ds_free.index(j), count=1 if DQ == 4 else 2)
    if DQ == 4:  # the dQ warpgroup's column pieces on their way to TMA reductions
        dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [D // dq_desc.block_type.shape[3]] +
                                               dq_desc.block_type.shape, dq_desc.layout)
    elif DQ > 0:  # each consumer's dQ half on its way to a TMA reduction
        dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape, dq_desc.layout)
    else:
        dq_staging = ds_smem  # unused
    op = AttentionBackward(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP,
                           scale, scale_log2e, num_bhk, head_group, ds_smem, ds_full, ds_free, dq_staging, left, right,
                           tanh_scale, CAUSAL, BM, BN, D, DQ, KV_REGS, WINDOW, SOFTCAP, DP_FROM_DELTA)
    layout = Layout(dk_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=200 if DQ == 4 else 240, PRODUCER_REGS=24,
                    LATE_RELEASE=0, tile_operand=TileOperand(k_desc, COUNT=2, SHARED=True), schedule=schedule,
                    helper=Helper(4, 88) if DQ == 4 else None)
    stages = QStage(ring(q_desc, STAGES), ring(stats_desc, STAGES), ring(do_desc, STAGES))
    run(op, layout, stages, gl.cdiv(Nk, 2 * BN) * num_bhk)
    for j in gl.static_range(2):
        mbarrier.invalidate(ds_full.index(j))
        mbarrier.invalidate(ds_free.index(j))

"""Attention forward on Hopper: a layout and callbacks on the tiles template
(:mod:`tilecore.tiles.gluon.pipeline`).

A tile is CONSUMERS x BLOCK_M query rows of one (batch, head); each consumer warpgroup takes BLOCK_M
of them, and its steps walk the key blocks. Per step the producer warp TMA-loads a K and a V block
into one stage (4-D descriptors over (B, Hkv, Nk, D): rows past Nk arrive as zeros and never come
from the next head); each consumer's Q block is the tile operand, loaded while the previous tile
runs (``Q_BUFFERS`` = 2). FlashAttention-3's intra-warpgroup overlap: step j issues

    S_j = Q K_j^T  and  O += P_{j-1} V_{j-1}      (two wgmma, together)
    m, l, P_j = online softmax(S_j)               (registers, base 2, while P V runs)
    O *= alpha                                    (once both are done)

so a tile has one more step than key blocks (the last P V). Masks are applied only to blocks that
need them. The running max starts at -inf (the online-softmax update shifts by 0 while it is -inf, so
fully masked blocks give p = 0, never NaN, and finite scores however negative are kept); rows with no
key end with l = 0 and get O = 0 and lse = -inf. NaN and inf propagate as in SDPA's math: a NaN or
+inf score makes its row's l NaN, so its O and lse are NaN ("no key" is l == 0, which a NaN fails).
The epilogue divides by l, writes lse, and TMA-stores O.

``WINDOW`` (a sliding window, flash-attn's window_size: query i, at key position i' = i + Nk - N,
sees keys i' - left .. i' + right; not with CAUSAL, which the plan folds into the window, nor with
CARRY): a tile's steps walk only the key blocks some of its rows see, from its ``first_block``;
each consumer computes only its own rows' blocks (the others' stages it passes through), and masks
only its edge blocks (``window_needs_mask``). ``SOFTCAP``: S becomes tanh(S scale / cap) before the
online softmax, whose scale is then cap log2(e): SOFTCAP 1 (True) tanh from one exp2 and one
approximate division (two more SFU operations a score besides the softmax's exp2), SOFTCAP 2 the
hardware's tanh.approx.f32 (one; relative error up to ~2^-11, invisible at bf16 / fp16 on the H100:
the launches' default, launch.gluon_softcap).

``CARRY``: a consumer's pipeline does not drain between tiles. A tile's first step issues its first S
with the previous tile's last P V (the stage holds this tile's first K block and the previous tile's
last V block), runs the softmax under it, then stores the previous tile's O. ``Q_REGS``: each
consumer's Q rows are the register operand of S = Q K^T for the whole tile.

MLA's head sizes (q/k 192, v 128; issue 35): 192 columns fit no power-of-two TMA box or shared
buffer, so Q and K come in three 64-column pieces (``QK_PIECES``, told by Q's box holding the tile's
rows): Q one set of buffers shared by the consumers, K three buffers a stage (``KVPieces``), S the
sum of three wgmma chained on one accumulator; O (v's 128 columns) is stored in two halves through
halved epilogue buffers (224 KiB of shared memory in all). Not with CARRY or Q_REGS.
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import (LOG2E, Layout, TileOperand, as_column, mask_scores, needs_mask,
                                  online_softmax_result, online_softmax_start, online_softmax_update, opaque_int, ring,
                                  run, split_n, stage_struct, store_block, store_rows, struct, wgmma_layout,
                                  wgmma_lhs_layout)
from tilecore.tiles.schedule import head_grouped_tile


@stage_struct
class KV:
    """One stage: a block of keys and a block of values."""
    k: object  # [1, 1, BN, D]
    v: object


@stage_struct
class KVPieces:
    """One stage with K in three column pieces (MLA's D 192 = 3 x 64: no power-of-two TMA box or
    shared buffer holds 192 columns)."""
    k0: object  # [1, 1, BN, 64]
    k1: object
    k2: object
    v: object  # [1, 1, BN, DV]


@struct
class QPieces:
    """A consumer's rows of Q's three column pieces (MLA's D 192), each [BM, 64] in shared memory."""
    q0: object
    q1: object
    q2: object


@struct
class Rows:
    """Query rows of one head: the first, the flat batch * head index, the key blocks they see, and
    (WINDOW) the first of them: a tile's is a key block index (its step 0), a consumer's the step of
    its own first block, whose n_blocks is then the step its own blocks end at."""
    first: object
    bh: object
    n_blocks: object
    first_block: object


@gluon.jit
def window_needs_mask(first_query, first_key, BM: gl.constexpr, BN: gl.constexpr, N, Nk, left, right):
    """Whether a block of scores (BM queries from first_query, BN keys from first_key) has a score
    outside the window (or a key past Nk): a key past the first query's right edge, or before the
    last query's left edge."""
    shift = Nk - N
    past_right = first_key + BN - 1 > gl.minimum(first_query + shift + right, Nk - 1)
    before_left = first_key < first_query + BM - 1 + shift - left
    return past_right | before_left


@gluon.jit
def tanh_approx(x):
    """tanh(x) by the SFU's tanh.approx.f32 (sm_75+): one instruction, relative error ~2^-11."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def window_mask_scores(s, layout: gl.constexpr, first_query, first_key, N, Nk, left, right, KEY_AXIS: gl.constexpr = 1):
    """s (in ``layout``; keys along ``KEY_AXIS``: 1 for [queries, keys], 0 for the transposed [keys,
    queries] of the backward) with -inf outside the window or past Nk."""
    QUERY_AXIS: gl.constexpr = 1 - KEY_AXIS
    keys = gl.expand_dims(first_key + gl.arange(0, s.shape[KEY_AXIS], layout=gl.SliceLayout(QUERY_AXIS, layout)),
                          QUERY_AXIS)
    queries = gl.expand_dims(first_query + gl.arange(0, s.shape[QUERY_AXIS], layout=gl.SliceLayout(KEY_AXIS, layout)),
                             KEY_AXIS)
    shift = Nk - N
    ok = (keys < Nk) & (keys <= queries + (shift + right)) & (keys >= queries + (shift - left))
    return gl.where(ok, s, float("-inf"))


@gluon.jit
def tanh_from_exp2(x):
    """tanh(x) = sign(x) (1 - e) / (1 + e), e = exp2(-2 |x| log2 e) in (0, 1]: finite for any x
    (tanh(+-inf) = +-1), NaN kept; the division approximate (div.full: 2 ulp), the denominator in
    [1, 2]."""
    e = gl.exp2(gl.abs(x) * (-2.0 * LOG2E))
    t = gl.fdiv(1.0 - e, 1.0 + e)
    return gl.where(x < 0, -t, t)


@gluon.jit
def head_of(bh, H, GROUP):
    """(batch, q head, kv head) of the flat index bh = batch * H + q head."""
    return bh // H, bh % H, (bh % H) // GROUP


@gluon.jit
def query_tile(op, tile_id, TILE_M: gl.constexpr):
    """A tile of TILE_M query rows of ``op`` (its N, Nk, num_bh, head_group, BN, CAUSAL): its Rows
    (first row, batch * head, key blocks it sees). Heads go in L2 groups of head_group; causal, the
    heaviest query blocks first, counted from the last row, so a short block (N not a multiple of
    TILE_M) is the lightest; it starts at row 0 (a TMA coordinate before row 0 traps) and redoes
    the next block's first rows, bit for bit."""
    bh, mb = head_grouped_tile(tile_id, gl.cdiv(op.N, TILE_M), op.num_bh, op.head_group)
    first_block = bh * 0
    if op.CAUSAL:  # query i sees keys j <= i + Nk - N
        start_m = gl.maximum(op.N - (mb + 1) * TILE_M, 0)
        hi = gl.maximum(gl.minimum(op.Nk, start_m + TILE_M + (op.Nk - op.N)), 0)
        n_blocks = gl.cdiv(hi, op.BN)
    elif op.WINDOW:  # from the first row's left edge to the last row's right edge
        start_m = mb * TILE_M
        first_block = gl.maximum(start_m + (op.Nk - op.N) - op.left, 0) // op.BN
        last_query = gl.minimum(start_m + TILE_M, op.N) - 1
        hi = gl.maximum(gl.minimum(op.Nk, last_query + (op.Nk - op.N) + op.right + 1), 0)
        n_blocks = gl.maximum(gl.cdiv(hi, op.BN) - first_block, 0)
    else:
        start_m = mb * TILE_M
        n_blocks = gl.cdiv(op.Nk, op.BN)
    return Rows(start_m, bh, n_blocks, first_block)


@struct
class Running:
    """A consumer's online softmax: row max m and sum l (base 2), the output accumulator, the last P
    (the register operand of the next P V), its rows, the rows still pending (CARRY: the previous
    tile's, whose last P V and store come with this tile's first step) and Q (Q_REGS)."""
    m: object
    l: object
    acc: object
    p: object
    rows: object
    pending: object
    q: object


@struct
class Attention:
    """The op: its globals (descriptors, sizes, options, layouts), whose methods are the template's
    callbacks."""
    q_desc: object
    k_desc: object
    v_desc: object
    o_desc: object
    lse: object
    H: object
    N: object
    Nk: object
    GROUP: object  # q heads per kv head
    scale_log2e: object  # SOFTCAP: cap log2(e)
    num_bh: object
    head_group: object  # heads whose K and V stay in L2 together
    left: object  # WINDOW: keys seen before and after a query's position (max(N, Nk): unbounded)
    right: object
    tanh_scale: object  # SOFTCAP: scale / cap
    CAUSAL: gl.constexpr
    BM: gl.constexpr  # a consumer's query rows
    BN: gl.constexpr  # keys per step
    D: gl.constexpr  # q's and k's head dim
    DV: gl.constexpr  # v's (and O's) head dim: D but for MLA's 192 / 128
    CONSUMERS: gl.constexpr
    CARRY: gl.constexpr
    Q_REGS: gl.constexpr
    S: gl.constexpr  # the layouts of S = Q K^T [BM, BN], of O [BM, DV], and of P as P V's register operand
    O: gl.constexpr
    P: gl.constexpr
    WINDOW: gl.constexpr
    SOFTCAP: gl.constexpr
    QK_PIECES: gl.constexpr  # 1; MLA's D 192: Q and K in 3 column pieces of 64 (q_desc, k_desc: a piece's box)

    @gluon.jit
    def setup(self, tile_id):
        """The tile's rows and its steps: a step per key block and one for the last P V (carried: that
        one is the next tile's first, and a tile with no keys has one block, all masked)."""
        rows = query_tile(self, tile_id, self.BM * self.CONSUMERS)
        if self.CARRY:
            rows = rows.replace(n_blocks=gl.maximum(rows.n_blocks, 1))
            steps = rows.n_blocks
        else:
            steps = gl.where(rows.n_blocks > 0, rows.n_blocks + 1, 0)
        return rows, steps

    @gluon.jit
    def load(self, stage, bar, tile, step, prev=None):
        """Step ``step``'s K block and the V block of the step before (the first step reloads V block
        0, the last step K block n - 1, unused: a stage's byte count is fixed); carried, the first
        step's V block is the previous tile's last."""
        b, h, hk = head_of(tile.bh, self.H, self.GROUP)
        v_b, v_hk = b, hk
        k_block = gl.minimum(step, tile.n_blocks - 1)
        if self.CARRY:
            v_block = step - 1
            if step == 0:
                v_b, v_h, v_hk = head_of(prev.bh, self.H, self.GROUP)
                v_block = prev.n_blocks - 1
        else:
            v_block = gl.maximum(step - 1, 0)
        if self.WINDOW:  # steps count from the tile's first key block
            k_block += tile.first_block
            v_block += tile.first_block
        if self.QK_PIECES == 1:
            tma.async_copy_global_to_shared(self.k_desc, [b, hk, k_block * self.BN, 0], bar, stage.k)
        else:  # K's column pieces, each a buffer of the stage's k ring
            PIECE: gl.constexpr = self.D // self.QK_PIECES
            row = k_block * self.BN
            tma.async_copy_global_to_shared(self.k_desc, [b, hk, row, 0], bar, stage.k0)
            tma.async_copy_global_to_shared(self.k_desc, [b, hk, row, PIECE], bar, stage.k1)
            tma.async_copy_global_to_shared(self.k_desc, [b, hk, row, 2 * PIECE], bar, stage.k2)
        tma.async_copy_global_to_shared(self.v_desc, [v_b, v_hk, v_block * self.BN, 0], bar, stage.v)

    @gluon.jit
    def load_tile(self, q_smem, bar, tile, consumer):
        """Consumer ``consumer``'s BLOCK_M query rows (rows past N arrive as 0); in QK_PIECES column
        pieces, the tile's rows for every consumer at once (a shared tile operand)."""
        b, h, hk = head_of(tile.bh, self.H, self.GROUP)
        if self.QK_PIECES == 1:
            tma.async_copy_global_to_shared(self.q_desc, [b, h, tile.first + consumer * self.BM, 0], bar, q_smem)
        else:
            PIECE: gl.constexpr = self.D // self.QK_PIECES
            for j in gl.static_range(self.QK_PIECES):
                tma.async_copy_global_to_shared(self.q_desc, [b, h, tile.first, j * PIECE], bar, q_smem.index(j))

    @gluon.jit
    def initial(self, ctx):
        """CARRY: the state before a program's first tile (nothing pending: 0 key blocks)."""
        zero = gl.program_id(0) * 0
        return self.fresh(Rows(zero, zero, zero, zero), Rows(zero, zero, zero, zero), None)

    @gluon.jit
    def fresh(self, rows, pending, q):
        """No key seen yet: m = -inf, l = 0, O = 0 (and P = 0)."""
        m, l = online_softmax_start(self.BM, self.S)
        acc = gl.zeros([self.BM, self.DV], gl.float32, self.O)
        return Running(m, l, acc, gl.zeros([self.BM, self.BN], self.q_desc.dtype, self.P), rows, pending, q)

    @gluon.jit
    def start(self, ctx, tile, prev):
        first = tile.first + ctx.index * self.BM  # this consumer's rows
        if self.CARRY:  # the running m, l, acc, P stay the previous tile's (its last P V is still to come)
            return prev.replace(rows=Rows(first, tile.bh, tile.n_blocks, tile.first_block), pending=prev.rows)
        else:
            n_own = tile.n_blocks
            own_first = tile.first_block
            if self.CAUSAL:
                # this consumer's rows see fewer key blocks than the tile's last rows: it skips the
                # tile's later blocks (all masked for it) but for its last P V
                own_hi = gl.maximum(gl.minimum(self.Nk, first + self.BM + (self.Nk - self.N)), 0)
                n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, self.BN), 1), tile.n_blocks)
            if self.WINDOW:
                # this consumer's own steps [own_first, n_own) of the tile's: at least one (all masked
                # where its rows see no key), the stages before and after passed through
                shift = self.Nk - self.N
                own_lo = gl.maximum(first + shift - self.left, 0) // self.BN - tile.first_block
                own_hi = gl.maximum(gl.minimum(self.Nk, gl.minimum(first + self.BM, self.N) - 1 + shift + self.right + 1),
                                    0)
                own_first = gl.minimum(gl.maximum(own_lo, 0), tile.n_blocks - 1)
                n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, self.BN) - tile.first_block, own_first + 1),
                                   tile.n_blocks)
            q = None
            if self.Q_REGS:
                q = ctx.operand.reshape([self.BM, self.D]).load(wgmma_lhs_layout(self.BM, self.BN, gl.num_warps()))
            return self.fresh(Rows(first, tile.bh, n_own, own_first), None, q)

    @gluon.jit
    def softmax(self, s, m, l, first_query, first_key, N, Nk):
        """Cap the scores (SOFTCAP), mask them where needed (N queries, Nk keys: the varlen forward's are
        its sequence's), one online-softmax step. Returns (m, l, P, alpha in O's layout)."""
        if self.SOFTCAP == 2:
            s = tanh_approx(s * self.tanh_scale)
        elif self.SOFTCAP:
            s = tanh_from_exp2(s * self.tanh_scale)
        if self.WINDOW:
            if window_needs_mask(first_query, first_key, self.BM, self.BN, N, Nk, self.left, self.right):
                s = window_mask_scores(s, self.S, first_query, first_key, N, Nk, self.left, self.right)
        elif needs_mask(first_query, first_key, self.BN, N, Nk, self.CAUSAL):
            s = mask_scores(s, self.S, first_query, first_key, N, Nk, self.CAUSAL, KEY_AXIS=1)
        m, l, p, alpha = online_softmax_update(m, l, s, self.scale_log2e)
        return m, l, p, as_column(alpha, self.O)

    @gluon.jit
    def p_operand(self, p):
        """P in the inputs' dtype as the P V register operand, made with no wgmma in flight (else ptxas
        serializes every wgmma: C7513)."""
        return gl.convert_layout(p.to(self.q_desc.dtype), self.P)

    @gluon.jit
    def s_and_pv(self, q, k_t, v, st, acc, first_key):
        """S = Q K^T and acc + P V issued together, the softmax of S while P V runs.
        Returns (m, l, P in float32, alpha, acc + P V)."""
        if self.QK_PIECES == 1:
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
        else:
            s_tok = self.scores_by_pieces(q, k_t)
        o_tok = warpgroup_mma(st.p, v, acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))  # S is done; P V may still be running
        m, l, p32, alpha = self.softmax(s, st.m, st.l, st.rows.first, first_key, self.N, self.Nk)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        return m, l, p32, alpha, acc

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """Every branch ends with its wgmma complete, so the stage is free when compute returns. Carried,
        a tile's first step also finishes the previous tile (its last P V with this tile's first S and
        softmax, then its store), and the tail step (step = key blocks, the template's last call)
        finishes this one. Fresh accumulators are explicit zeros (run-time ``use_acc`` flags gave
        wrong sums on the H100, and a select of acc or zeros would move acc's registers)."""
        if self.QK_PIECES == 1:
            q = st.q if self.Q_REGS else ctx.operand.reshape([self.BM, self.D])
            k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))
        else:  # this consumer's rows of each Q piece, and the stage (scores_by_pieces reads its k0, k1, k2)
            q = QPieces(self.consumer_rows(ctx, 0), self.consumer_rows(ctx, 1), self.consumer_rows(ctx, 2))
            k_t = stage
        v = stage.v.reshape([self.BN, self.DV])
        zeros = gl.zeros([self.BM, self.DV], gl.float32, self.O)
        if self.WINDOW:  # this consumer's own steps only; the first key block is the tile's first_block
            key = (tile.first_block + step) * self.BN
            if step == st.rows.first_block:
                s = self.scores(q, k_t)
                m, l, p32, alpha = self.softmax(s, st.m, st.l, st.rows.first, opaque_int(key), self.N, self.Nk)
                st = st.replace(m=m, l=l, p=self.p_operand(p32))
            elif (step > st.rows.first_block) & (step < st.rows.n_blocks):
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, st.acc, key)
                st = st.replace(m=m, l=l, acc=acc * alpha, p=self.p_operand(p32))
            elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
                st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
        elif not self.CARRY:
            if step == 0:
                s = self.scores(q, k_t)
                m, l, p32, alpha = self.softmax(s, st.m, st.l, st.rows.first, self.first_key(step), self.N,
                                                 self.Nk)
                st = st.replace(m=m, l=l, p=self.p_operand(p32))
            elif step < st.rows.n_blocks:
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, st.acc, step * self.BN)
                st = st.replace(m=m, l=l, acc=acc * alpha, p=self.p_operand(p32))
            elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
                st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
        elif step == 0:  # the pending tile's accumulator is acc, or zeros if the P V is its only one
            fresh = self.fresh(st.rows, st.pending, None).replace(acc=st.acc, p=st.p)
            first_key = self.first_key(step)
            if st.pending.n_blocks > 1:
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, fresh, st.acc, first_key)
            else:
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, fresh, zeros, first_key)
            p = self.p_operand(p32)
            if st.pending.n_blocks > 0:  # a previous tile (not the state before a program's first)
                self.finish(ctx, st.replace(acc=acc, rows=st.pending), None)
            st = st.replace(m=m, l=l, acc=acc, p=p)
        elif step < st.rows.n_blocks:  # this tile's P V, into zeros at its second step
            if step > 1:
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, st.acc, step * self.BN)
            else:
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, zeros, step * self.BN)
            st = st.replace(m=m, l=l, acc=acc * alpha, p=self.p_operand(p32))
        else:  # the tail: this tile's last P V, then its epilogue
            if st.rows.n_blocks > 1:
                st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
            else:
                st = st.replace(acc=warpgroup_mma(st.p, v, zeros))
            self.finish(ctx, st, None)
        return st

    @gluon.jit
    def scores(self, q, k_t):
        """S = Q K^T, waited for."""
        if self.QK_PIECES == 1:
            s = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False)
        else:
            s = warpgroup_mma_wait(0, deps=(self.scores_by_pieces(q, k_t),))
        return s

    @gluon.jit
    def consumer_rows(self, ctx, piece: gl.constexpr):
        """This consumer's BM rows of Q's column piece ``piece`` (of the tile's shared buffers)."""
        PIECE: gl.constexpr = self.D // self.QK_PIECES
        rows = ctx.operand.index(piece).reshape([self.CONSUMERS * self.BM, PIECE])
        return rows.slice(ctx.index * self.BM, self.BM)

    @gluon.jit
    def scores_by_pieces(self, q, stage):
        """S = sum_j Q_j K_j^T over the three column pieces (q: QPieces; the stage's k0, k1, k2 [1, 1,
        BN, 64] in shared memory): wgmma issued one after another into one accumulator, not waited for."""
        PIECE: gl.constexpr = self.D // self.QK_PIECES
        s = warpgroup_mma(q.q0, stage.k0.reshape([self.BN, PIECE]).permute((1, 0)),
                          gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False, is_async=True)
        s = warpgroup_mma(q.q1, stage.k1.reshape([self.BN, PIECE]).permute((1, 0)), s, is_async=True)
        return warpgroup_mma(q.q2, stage.k2.reshape([self.BN, PIECE]).permute((1, 0)), s, is_async=True)

    @gluon.jit
    def first_key(self, step):
        """A tile's first key (step 0): hidden from the compiler where causal, which otherwise hoists
        the first block's mask to the tile's start at every tile (notes/attention)."""
        return opaque_int(step * self.BN) if self.CAUSAL else 0

    @gluon.jit
    def wait(self, ctx, st):
        return st.replace(acc=warpgroup_mma_wait(0, deps=(st.acc,)))

    @gluon.jit
    def finish(self, ctx, st, tile):
        """O = acc / l and lse of the state's rows: lse stored, O by a TMA store (rows past N clipped);
        where o_desc's block is half of O's columns (MLA's 192 / 128: the epilogue buffers' shared
        memory halved to fit), by two, the second once the first has read the buffer."""
        out, lse = online_softmax_result(st.m, st.l, st.acc)
        store_rows(lse, self.lse, st.rows.bh, st.rows.first, self.N)
        b, h, hk = head_of(st.rows.bh, self.H, self.GROUP)
        O_COLS: gl.constexpr = self.o_desc.block_type.shape[3]
        if O_COLS == self.DV:
            store_block(out, self.o_desc, ctx.out, [b, h, st.rows.first, 0])
        else:
            left_half, right_half = split_n(out)
            store_block(left_half, self.o_desc, ctx.out, [b, h, st.rows.first, 0])
            store_block(right_half, self.o_desc, ctx.out, [b, h, st.rows.first, O_COLS])


@gluon.jit
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh,
                         head_group, schedule, left, right, tanh_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                         CONSUMERS: gl.constexpr, Q_BUFFERS: gl.constexpr = 1, CARRY: gl.constexpr = False,
                         Q_REGS: gl.constexpr = False, WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = False):
    """O and lse of attention for every (query block, batch * head); a persistent grid. Shapes come
    from the descriptors' boxes: BM from O's, BN from K's, v's head dim from V's. Q's box of the
    whole tile's rows (CONSUMERS x BM, not BM) means MLA's q/k head dim 192, which no power-of-two
    TMA box or shared buffer holds: q_desc's and k_desc's boxes are then one 64-column piece of
    three (QK_PIECES), loaded piece by piece, and Q is one set of buffers shared by the consumers
    (no second Q buffer, no CARRY, no Q_REGS)."""
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3, "two or three consumer warpgroups")
    QK_PIECES: gl.constexpr = 3 if q_desc.block_type.shape[2] != o_desc.block_type.shape[2] else 1
    gl.static_assert(QK_PIECES == 1 or q_desc.block_type.shape[2] == CONSUMERS * o_desc.block_type.shape[2],
                     "Q's box: a consumer's rows, or (in column pieces) the tile's")
    gl.static_assert(QK_PIECES == 1 or (QK_PIECES == 3 and not (CARRY or Q_REGS)),
                     "Q and K in three column pieces (D 192), without CARRY or Q_REGS")
    gl.static_assert(not (CARRY and Q_REGS), "Q_REGS takes a pipeline that restarts at each tile")
    gl.static_assert(not (WINDOW and (CARRY or CAUSAL)), "a window restarts the pipeline at each tile, causal folded in")
    BM: gl.constexpr = o_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3] * QK_PIECES
    DV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(o_desc.block_type.shape[3] == DV or 2 * o_desc.block_type.shape[3] == DV,
                     "O's block: v's head dim, or half of it (stored in two)")
    op = Attention(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh, head_group, left,
                   right, tanh_scale, CAUSAL, BM, BN, D, DV, CONSUMERS, CARRY, Q_REGS,
                   wgmma_layout(BM, BN, gl.num_warps()), wgmma_layout(BM, DV, gl.num_warps()),
                   wgmma_lhs_layout(BM, DV, gl.num_warps()), WINDOW, SOFTCAP, QK_PIECES)
    # three consumer warpgroups (13 warps) share the register file more thinly
    if QK_PIECES == 1:
        q_operand = TileOperand(q_desc, BUFFERS=Q_BUFFERS)
        stages = KV(ring(k_desc, STAGES), ring(v_desc, STAGES))
    else:  # Q's pieces: one set of buffers of the tile's rows, shared by the consumers
        q_operand = TileOperand(q_desc, COUNT=QK_PIECES, SHARED=True)
        stages = KVPieces(ring(k_desc, STAGES), ring(k_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES))
    layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=160 if CONSUMERS == 3 else 232,
                    PRODUCER_REGS=24 if CONSUMERS == 3 else 40, LATE_RELEASE=0, CARRY=CARRY,
                    tile_operand=q_operand, schedule=schedule)
    run(op, layout, stages, gl.cdiv(N, op.BM * CONSUMERS) * num_bh)

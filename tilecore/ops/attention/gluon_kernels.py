"""Attention forward on Hopper, written as the small functions of the tiles' Gluon pipeline template
(:func:`tilecore.tiles.gluon.persistent_pipeline`, the one the GEMM uses).

A tile is BLOCK_M query rows of one (batch, head); its "K loop" walks the key blocks. Per step the
1-warp producer TMA-loads a K and a V block into one ring stage (4-D descriptors over (B, Hkv, Nk, D):
rows past Nk arrive as zeros and never come from the next head); it also loads each tile's Q block
(the template's per-tile operand) while the consumers finish the previous tile; with Q_BUFFERS = 2,
already while they run it, so a tile's first step finds its Q and K/V loaded. Per step:

    S = Q K^T                      wgmma, both operands in shared memory
    m, l, P = online softmax(S)    registers, base 2: exp2(S * scale * log2 e - m)
    O = O * alpha + P V            wgmma with P as the register operand, left running

With OVERLAP (FlashAttention-3's intra-warpgroup pipelining) step j issues Q K_j^T and P_{j-1} V_{j-1}
together and runs the softmax of block j while the tensor cores do P V. The
epilogue divides by l, writes lse, and TMA-stores O through shared memory (rows past N clipped).

Masks are applied only to blocks that need them (the last key block when Nk is not a multiple of
BLOCK_N, and blocks crossing the causal diagonal). The running max starts at a finite sentinel, so
fully masked rows give p = 0, never NaN (as in the ``tl`` kernel, kernels.py); rows with no key get
O = 0 and lse = -inf.

``g``   = (q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, B * H, heads per group)
``cfg`` = (CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, OVERLAP, CONSUMERS, PINGPONG, CARRY[, consumer index])

With CARRY (overlapped loop) the pipeline does not drain between a program's tiles (the template's
``carry0``): a tile's first step issues its first S together with the previous tile's last P V (the
stage holds this tile's first K block and the previous tile's last V block), runs the softmax under
it, then stores the previous tile's O; a program's last tile ends with a step of its last P V alone.

With CONSUMERS = 2 a tile is 2 BLOCK_M query rows: two consumer warpgroups (separate partitions of
the template, so each one's softmax can run while the other's wgmma does, as FlashAttention-3's
ping-pong arranges explicitly) take BLOCK_M rows each and share every K/V stage.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilecore.tiles.gluon import (head_grouped_tile, mask_scores, needs_mask, opaque_int, pass_turn,
                                  persistent_pipeline, wait_turn, wgmma_layout)

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
EMPTY_ROW_MAX: gl.constexpr = gl.constexpr(-1.0e30)  # far below any real scaled score, far above -inf


@gluon.jit
def _head(g, bh):
    """(batch, q head, kv head) of the flat index bh = batch * H + q head."""
    b = bh // g[5]
    h = bh % g[5]
    return b, h, h // g[8]


@gluon.jit
def _setup(g, cfg: gl.constexpr, tile_id):
    """The tile (first query row, batch * head, key blocks) and its pipeline steps: one per key
    block, plus one for the last P V when the steps overlap (OVERLAP)."""
    BM: gl.constexpr = cfg[1] * cfg[5]  # the tile's rows: every consumer's
    BN: gl.constexpr = cfg[2]
    N = g[6]
    Nk = g[7]
    m_blocks = gl.cdiv(N, BM)
    # Order: heads in groups (of g[11]) whose K and V stay in L2 together; within a group, query
    # block by query block across its heads. Causal, the heaviest blocks (the last rows see the most
    # keys) come first, so the persistent programs even out and the last wave holds the light ones.
    # Causal blocks are counted from the last row, so that where N is not a multiple of BM the short
    # block is the first, which sees the fewest keys, not the last, which sees them all; it starts at
    # row 0 (a TMA coordinate before row 0 traps on the H100), so it also redoes the first rows of the
    # next block and stores the same bits there (a row's result does not depend on its block: key
    # blocks past its diagonal add exact zeros)
    bh, mb = head_grouped_tile(tile_id, m_blocks, g[10], g[11])
    if cfg[0]:
        start_m = gl.maximum(N - (mb + 1) * BM, 0)
        hi = gl.maximum(gl.minimum(Nk, start_m + BM + (Nk - N)), 0)  # query i sees keys <= i + Nk - N
    else:
        start_m = mb * BM
        hi = Nk
    n_blocks = gl.cdiv(hi, BN)
    steps = n_blocks
    if cfg[7]:  # carried: every tile has a first step (a tile with no keys: one block, all masked)
        n_blocks = gl.maximum(n_blocks, 1)
        steps = n_blocks
    elif cfg[4]:
        steps = gl.where(n_blocks > 0, n_blocks + 1, 0)
    return (start_m, bh, n_blocks), steps


@gluon.jit
def _load(g, cfg: gl.constexpr, k_smem, v_smem, bar, tile, kk, prev=None):
    """Step kk's K and V blocks. Overlapped, step kk multiplies K block kk and V block kk - 1 (the
    first step reloads V block 0 and the last K block n - 1, which stay unused: the stage's byte
    count is fixed). Carried, the first step's V block is the previous tile's last."""
    b, h, hk = _head(g, tile[1])
    BN: gl.constexpr = cfg[2]
    v_b = b
    v_hk = hk
    if cfg[7]:
        k_block = gl.minimum(kk, tile[2] - 1)
        v_block = kk - 1
        if kk == 0:
            v_b, v_h, v_hk = _head(g, prev[1])
            v_block = prev[2] - 1
    elif cfg[4]:
        k_block = gl.minimum(kk, tile[2] - 1)
        v_block = gl.maximum(kk - 1, 0)
    else:
        k_block = kk
        v_block = kk
    tma.async_copy_global_to_shared(g[1], [b, hk, k_block * BN, 0], bar, k_smem)
    tma.async_copy_global_to_shared(g[2], [v_b, v_hk, v_block * BN, 0], bar, v_smem)


@gluon.jit
def _load_q(g, cfg: gl.constexpr, q_smem, bar, tile, consumer):
    """The producer's per-tile load: this consumer's BLOCK_M query rows (rows past N arrive as 0)."""
    b, h, hk = _head(g, tile[1])
    tma.async_copy_global_to_shared(g[0], [b, h, tile[0] + consumer * cfg[1], 0], bar, q_smem)


@gluon.jit
def _carry0(g, cfg: gl.constexpr):
    """CARRY: the state before a program's first tile (no tile pending: its key-block count is 0)."""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    o_layout: gl.constexpr = wgmma_layout(BM, D, gl.num_warps())
    zero = gl.program_id(0) * 0
    m_i = gl.full([BM], EMPTY_ROW_MAX, gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    p = gl.zeros([BM, BN], g[0].dtype, _p_layout(BM, D, gl.num_warps()))
    return m_i, l_i, acc, p, zero, zero, zero, zero, zero, zero


@gluon.jit
def _init(g, cfg: gl.constexpr, tile, q_smem, state=None):
    if cfg[7]:
        # carried: the running m, l, acc, P stay the previous tile's (its last P V is still to come);
        # the previous tile's (first row, batch * head, key blocks) ride along as the pending tile
        m_i, l_i, acc, p, start_m, n_blocks, bh, _, _, _ = state
        return m_i, l_i, acc, p, _first_row(cfg, tile), tile[2], tile[1], start_m, bh, n_blocks
    else:
        return _init_tile(g, cfg, tile, q_smem)


@gluon.jit
def _init_tile(g, cfg: gl.constexpr, tile, q_smem):
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    o_layout: gl.constexpr = wgmma_layout(BM, D, gl.num_warps())
    m_i = gl.full([BM], EMPTY_ROW_MAX, gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    p = gl.zeros([BM, BN], q_smem.dtype, _p_layout(BM, D, gl.num_warps()))
    first = _first_row(cfg, tile)
    n_own = tile[2]
    if cfg[0] and cfg[4] and cfg[5] > 1 and not cfg[6]:
        # causal: this consumer's rows see fewer key blocks than the tile's last rows do; it skips
        # the tile's later blocks (all masked for it: their p would be 0) but for its last P V
        own_hi = gl.maximum(gl.minimum(g[7], first + BM + (g[7] - g[6])), 0)
        n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, BN), 1), tile[2])
    # this consumer's first query row and key-block count ride along for the masks and the steps;
    # with Q_REGS its Q rows too, as the register operand of every step's S = Q K^T
    if cfg[8]:
        q = q_smem.reshape([BM, D]).load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        q = 0
    return m_i, l_i, acc, p, first, n_own, q


@gluon.jit
def _first_row(cfg: gl.constexpr, tile):
    """The first query row of this consumer's share of the tile (consumer cfg[-1] of cfg[5])."""
    if cfg[5] > 1:
        return tile[0] + cfg[-1] * cfg[1]
    else:
        return tile[0]


@gluon.constexpr_function
def _p_layout(block_m, head_dim, num_warps):
    """P as the register (left) operand of the P V wgmma."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(block_m, head_dim, num_warps), k_width=2)


@gluon.jit
def _softmax(g, cfg: gl.constexpr, s, m_i, l_i, start_m, start_n):
    """Mask the [BM, BN] scores s where needed and take one online-softmax step in base 2 (the
    scale, > 0, folds into the exponent's multiply-add). Returns (m, l, P in float32, alpha = the
    factor that rescales O to the new row max)."""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    o_layout: gl.constexpr = wgmma_layout(BM, D, gl.num_warps())
    if needs_mask(start_m, start_n, BN, g[6], g[7], cfg[0]):
        s = mask_scores(s, s_layout, start_m, start_n, g[6], g[7], cfg[0], KEY_AXIS=1)
    c = g[9]
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * c)
    p = gl.exp2(s * c - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return m_new, l_i, p, gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)


@gluon.jit
def _first_key(cfg: gl.constexpr, kk):
    """The first key of a tile's first block (kk = 0): 0, hidden from the compiler where causal.
    Seen as a constant, the causal mask of that block depends only on the tile: LLVM hoisted its
    comparisons to the tile's start and turned the masking branch into selects, ~600 instructions
    (a step's worth) at every tile, needed or not; hidden, the causal forward ran 5-20% faster on
    the H100 (notes/attention/README.md, session 13). Without a mask (only keys past Nk) the hoisted part
    is small, and hiding it there moved a spill into the loop of three consumers."""
    if cfg[0]:
        return opaque_int(kk * cfg[2])
    else:
        return 0


@gluon.jit
def _p_operand(g, cfg: gl.constexpr, p):
    """P in the inputs' dtype, as the register operand of the P V wgmma. Called with no wgmma in
    flight: ptxas serializes every wgmma of a kernel that defines a wgmma's input registers while
    another wgmma runs (its warning C7513), which cost the overlapped loop 20%."""
    return gl.convert_layout(p.to(g[0].dtype), _p_layout(cfg[1], cfg[3], gl.num_warps()))


@gluon.jit
def _s_and_pv(g, cfg: gl.constexpr, q, k_t, v, p, acc, m_i, l_i, start_m, start_n, turn=None):
    """One overlapped step's tensor-core work: S = Q K^T and acc + P V issued together, the softmax
    of S while P V runs. Returns (m, l, P in float32, alpha, acc + P V)."""
    s_layout: gl.constexpr = wgmma_layout(cfg[1], cfg[2], gl.num_warps())
    if cfg[6]:
        wait_turn(turn)
    s_tok = warpgroup_mma(q, k_t, gl.zeros([cfg[1], cfg[2]], gl.float32, s_layout), use_acc=False, is_async=True)
    o_tok = warpgroup_mma(p, v, acc, is_async=True)
    if cfg[6]:
        pass_turn(turn)
    s = warpgroup_mma_wait(1, deps=(s_tok,))  # S is done; P V may still be running
    m_i, l_i, p32, alpha = _softmax(g, cfg, s, m_i, l_i, start_m, start_n)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))
    return m_i, l_i, p32, alpha, acc


@gluon.jit
def _compute_carried(g, cfg: gl.constexpr, state, k_smem, v_smem, kk, q_smem, o_smem):
    """CARRY's step: the overlapped step, except that a tile's first one also finishes the previous
    tile (its last P V runs with this tile's first S and softmax; then its O is stored), and the tail
    step (kk = key blocks: only the template's last call) finishes this one. (Runtime ``use_acc``
    flags gave wrong sums on the H100: fresh accumulators are explicit zeros.)"""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    o_layout: gl.constexpr = wgmma_layout(BM, D, gl.num_warps())
    m_i, l_i, acc, p, start_m, n_blocks, bh, pend_m, pend_bh, pend_blocks = state
    q = q_smem.reshape([BM, D])
    k_t = k_smem.reshape([BN, D]).permute((1, 0))
    v = v_smem.reshape([BN, D])
    zeros = gl.zeros([BM, D], gl.float32, o_layout)
    if kk == 0:
        # the previous tile's last P V under this tile's first S and softmax; that tile's
        # accumulator is acc, or zeros if the P V is its only one (acc then holds an older tile's)
        fresh_m = gl.full([BM], EMPTY_ROW_MAX, gl.float32, gl.SliceLayout(1, s_layout))
        fresh_l = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
        first_key = _first_key(cfg, kk)
        if pend_blocks > 1:
            m_new, l_new, p32, alpha, acc = _s_and_pv(g, cfg, q, k_t, v, p, acc, fresh_m, fresh_l, start_m, first_key)
        else:
            m_new, l_new, p32, alpha, acc = _s_and_pv(g, cfg, q, k_t, v, p, zeros, fresh_m, fresh_l, start_m, first_key)
        p = _p_operand(g, cfg, p32)
        if pend_blocks > 0:  # a previous tile (not the state before a program's first)
            _epilogue(g, cfg, m_i, l_i, acc, pend_m, pend_bh, o_smem)
        m_i = m_new
        l_i = l_new
    elif kk < n_blocks:
        # this tile's P V, into zeros at its second step (acc holds the finished previous tile)
        if kk > 1:
            m_i, l_i, p32, alpha, acc = _s_and_pv(g, cfg, q, k_t, v, p, acc, m_i, l_i, start_m, kk * BN)
        else:
            m_i, l_i, p32, alpha, acc = _s_and_pv(g, cfg, q, k_t, v, p, zeros, m_i, l_i, start_m, kk * BN)
        acc = acc * alpha
        p = _p_operand(g, cfg, p32)
    else:  # the tail: this tile's last P V, then its epilogue
        if n_blocks > 1:
            acc = warpgroup_mma(p, v, acc)
        else:
            acc = warpgroup_mma(p, v, zeros)
        _epilogue(g, cfg, m_i, l_i, acc, start_m, bh, o_smem)
    return m_i, l_i, acc, p, start_m, n_blocks, bh, pend_m, pend_bh, pend_blocks


@gluon.jit
def _compute(g, cfg: gl.constexpr, state, k_smem, v_smem, kk, q_smem, turn=None):
    if cfg[7]:
        return _compute_carried(g, cfg, state, k_smem, v_smem, kk, q_smem, turn)  # turn: the epilogue buffer
    else:
        return _compute_step(g, cfg, state, k_smem, v_smem, kk, q_smem, turn)


@gluon.jit
def _compute_step(g, cfg: gl.constexpr, state, k_smem, v_smem, kk, q_smem, turn=None):
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    m_i, l_i, acc, p, start_m, n_blocks, q_regs = state
    if cfg[8]:
        q = q_regs
    else:
        q = q_smem.reshape([BM, D])
    k_t = k_smem.reshape([BN, D]).permute((1, 0))
    v = v_smem.reshape([BN, D])
    s0 = gl.zeros([BM, BN], gl.float32, s_layout)
    if cfg[4]:
        # FlashAttention-3's intra-warpgroup overlap: the softmax of block kk runs on the CUDA cores
        # while the tensor cores multiply the previous block's P V. Every branch ends with its
        # wgmma complete, so the stage is free when compute returns.
        # PINGPONG (cfg[6]): the two consumers take turns to issue their wgmma
        if kk == 0:
            if cfg[6]:
                wait_turn(turn)
            s = warpgroup_mma(q, k_t, s0, use_acc=False)
            if cfg[6]:
                pass_turn(turn)
            m_i, l_i, p32, alpha = _softmax(g, cfg, s, m_i, l_i, start_m, _first_key(cfg, kk))
            p = _p_operand(g, cfg, p32)
        elif kk < n_blocks:
            m_i, l_i, p32, alpha, acc = _s_and_pv(g, cfg, q, k_t, v, p, acc, m_i, l_i, start_m, kk * BN, turn)
            acc = acc * alpha
            p = _p_operand(g, cfg, p32)
        elif kk == n_blocks:  # the step after this consumer's last block: its P V only (later: none)
            if cfg[6]:
                wait_turn(turn)
            acc = warpgroup_mma(p, v, acc)
            if cfg[6]:
                pass_turn(turn)
    else:
        s_tok = warpgroup_mma(q, k_t, s0, use_acc=False, is_async=True)
        s, acc = warpgroup_mma_wait(0, deps=(s_tok, acc))  # also completes the previous step's P V
        m_i, l_i, p32, alpha = _softmax(g, cfg, s, m_i, l_i, start_m, kk * BN)
        p = _p_operand(g, cfg, p32)
        o_tok = warpgroup_mma(p, v, acc * alpha, is_async=True)
        acc, _ = warpgroup_mma_wait(1, deps=(o_tok, v_smem))  # left running: the next step's wait completes it
    return m_i, l_i, acc, p, start_m, n_blocks, q_regs


@gluon.jit
def _drain(g, cfg: gl.constexpr, state):
    return state[:2] + (warpgroup_mma_wait(0, deps=(state[2],)),) + state[3:]


@gluon.jit
def _finish(g, cfg: gl.constexpr, state, tile, o_smem):
    _epilogue(g, cfg, state[0], state[1], state[2], state[4], tile[1], o_smem)


@gluon.jit
def _epilogue(g, cfg: gl.constexpr, m_i, l_i, acc, start_m, bh, o_smem):
    """O = acc / l and lse of this consumer's rows from start_m of head bh: lse stored, O through
    shared memory by a TMA store (rows past N clipped)."""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    o_layout: gl.constexpr = wgmma_layout(BM, D, gl.num_warps())
    has_keys = l_i > 0.0
    l_safe = gl.where(has_keys, l_i, 1.0)
    out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), 1)
    lse = gl.where(has_keys, (m_i + gl.log2(l_safe)) / LOG2E, float("-inf"))
    rows = start_m + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    gl.store(g[4] + bh.to(gl.int64) * g[6] + rows, lse, mask=rows < g[6])
    b, h, hk = _head(g, bh)
    tma.store_wait(0)  # the previous tile's TMA store has read the buffer
    o_smem.reshape([BM, D]).store(out.to(o_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(g[3], [b, h, start_m, 0], o_smem)  # rows past N are clipped


@gluon.jit
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh,
                         head_group, schedule, CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                         CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr = False, Q_BUFFERS: gl.constexpr = 1,
                         CARRY: gl.constexpr = False, Q_REGS: gl.constexpr = False):
    """O and lse of attention for every (query block, batch * head); a persistent grid."""
    g = (q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh, head_group)
    BM: gl.constexpr = o_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    gl.static_assert(not PINGPONG or OVERLAP, "PINGPONG takes the overlapped loop")
    gl.static_assert(not CARRY or (OVERLAP and not PINGPONG), "CARRY takes the overlapped loop, without PINGPONG")
    gl.static_assert(not (CARRY and Q_REGS), "Q_REGS takes a pipeline that restarts at each tile")
    cfg: gl.constexpr = gl.constexpr((CAUSAL, BM, BN, D, OVERLAP, CONSUMERS, PINGPONG, CARRY, Q_REGS))
    num_tiles = gl.cdiv(N, BM * CONSUMERS) * num_bh
    # registers a thread: three consumer warpgroups (13 warps) share the register file more thinly
    CONSUMER_REGS: gl.constexpr = 160 if CONSUMERS == 3 else 232
    PRODUCER_REGS: gl.constexpr = 24 if CONSUMERS == 3 else 40
    persistent_pipeline(g, cfg, k_desc, v_desc, o_desc, num_tiles, _setup, _load, _init, _compute, _drain,
                        _finish, STAGES, CONSUMERS=CONSUMERS, IN_FLIGHT=0 if OVERLAP else 1, tile_desc=q_desc,
                        load_tile=_load_q, PINGPONG=PINGPONG, TILE_BUFFERS=Q_BUFFERS,
                        CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS,
                        carry0=_carry0 if CARRY else None, schedule=schedule)

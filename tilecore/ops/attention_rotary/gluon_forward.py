"""Attention forward with rotary embeddings for Hopper (issue 37): K turned by apply_rotary's pass, Q inside
the Gluon forward.

``forward(q, k, v, cos, sin, ...)`` is attention(rotary(q), rotary(k), v). K is turned by
``tilecore.apply_rotary`` (one read and write of K), then the shipped forward's op
(``gluon_kernels.Attention``, its layout, registers and configuration) runs with each consumer turning its
own Q block in shared memory once a tile, before the tile's first S:

    a' = a cos - b sin,    b' = b cos + a sin       (fp32, rounded as apply_rotary rounds: turn_pair)

(ld.shared.v4, the rows' cos and sin by 16-byte global loads, st.shared.v4 in place: every thread holds
both elements of its pairs; then a fence for wgmma and the warpgroup meets). A separate pass over Q too
(the composite) costs a second read and write; K turned in shared memory as each stage arrives (a
transform partition of the template) was slower than a stage (notes/rotary).

Conventions (as ``tilecore.apply_rotary``): q (B, H, N, D), k and v (B, Hkv, Nk, D); cos, sin
(max_seqlen, rotary_dim / 2), any float dtype; key j is at position j, query i at i + Nk - N (so
N <= Nk, max_seqlen >= Nk); the pairs are (i, i + R) (half-split, NeoX / Llama) or (2i, 2i + 1)
(interleaved, GPT-J), R = rotary_dim / 2, features past 2R pass through. Taken: D 64 and 128,
rotary_dim 32, 64 or 128 up to D; bf16 and fp16; grouped heads; causal, windows and softcaps as the shipped
forward. Not taken (plan.RotaryNotTaken, a NotImplementedError): MLA's 192 / 128 and other head dims, other
rotary_dims (the turn's tiles are R wide, a power of two). K turned inside the kernel by a side partition under
the forward's tensor-core time lost to the pass (notes/rotary).

Where configs.ROTARY_K_OVERLAP_CASES names the case, K is turned inside the same persistent launch instead
(``KTurn``): items of the schedule table, each a few ring steps of one kv head's K (TMA-loaded, read into
registers, turned, stored into the buffer the tiles' K descriptor reads), run by whole programs between their tiles and
placed ahead of the tiles of their head, so that the turn's memory traffic runs on some SMs while the others run
tensor-core-bound tiles; a tile's producer waits for its head's items (a counter per kv head) before loading Q.
"""

import torch
from triton.experimental import gluon

from tilecore import dispatch
from tilecore.ops.attention import configs as attention_configs
from tilecore.ops.attention.gluon_kernels import Attention, KV, head_of
from tilecore.ops.attention_rotary import configs
from tilecore.ops.attention_rotary.plan import RotaryNotTaken
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma
from tilecore.tiles.launch import CachedLaunch


@gluon.jit
def load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, first_pos, ROWS: gl.constexpr, R: gl.constexpr,
                layout: gl.constexpr):
    """cos and sin of rows first_pos .. first_pos + ROWS - 1, [ROWS, R] in ``layout``; rows outside [0, n_max)
    read nothing and are 0 (so their pairs turn to 0: rows TMA filled with zeros)."""
    pos = first_pos + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(0, layout)), 0)
    ok = gl.expand_dims((pos >= 0) & (pos < n_max), 1)
    cos = gl.load(cos_ptr + gl.expand_dims(pos * cos_stride, 1) + cols, mask=ok, other=0.0)
    sin = gl.load(sin_ptr + gl.expand_dims(pos * sin_stride, 1) + cols, mask=ok, other=0.0)
    return cos, sin


@gluon.jit
def turn_pair(a, b, cs, sn):
    """(a cos - b sin, b cos + a sin) in float32, rounded as apply_rotary's kernel rounds them: a's products
    fused into the sums, the partner b's rounded first (fma(a, cos, -(b sin)), fma(a, sin, b cos): the
    contraction that kernel compiles to, which a test pins), written out in PTX so that the compiler cannot
    fuse the other product (left to it, it did in a few elements of the half-split turn: 15 of 2^20 other bf16
    bits with float32 tables)."""
    lo = gl.inline_asm_elementwise("{ .reg .f32 t; mul.rn.f32 t, $3, $4; neg.f32 t, t; fma.rn.f32 $0, $1, $2, t; }",
                                   "=f,f,f,f,f", [a, cs, b, sn], dtype=gl.float32, is_pure=True, pack=1)
    hi = gl.inline_asm_elementwise("{ .reg .f32 t; mul.rn.f32 t, $3, $4; fma.rn.f32 $0, $1, $2, t; }",
                                   "=f,f,f,f,f", [a, sn, b, cs], dtype=gl.float32, is_pure=True, pack=1)
    return lo, hi


@gluon.jit
def turn_rows(buf, first_pos, cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, R: gl.constexpr,
              ROWS: gl.constexpr, INTERLEAVED: gl.constexpr = False, out_ptr=None, rows_left=0):
    """Turn the rows of ``buf`` ([rows, D] in shared memory, row r at position first_pos + r) in place:
    the pairs (i, i + R) (INTERLEAVED: (2i, 2i + 1)), i < R, by the angles of cos and sin's row of that
    position (load_angles). ROWS rows at a time, 16-byte vectors (8 features a thread: both halves'
    (i, i + R), or 4 whole pairs), the next rows' cos and sin loaded before this rows' turn. With ``out_ptr``
    the buffer is only read and the turned rows stored to global memory instead: row r at out_ptr + r D (the
    pass-through features copied), rows from ``rows_left`` on not stored; nothing waits on those stores (the
    caller fences them before it publishes them)."""
    BLOCK_ROWS: gl.constexpr = buf.shape[0]
    D: gl.constexpr = buf.shape[1]
    WIDTH: gl.constexpr = 2 * R if INTERLEAVED else R  # the features a thread row holds, 8 a thread
    COL_THREADS: gl.constexpr = WIDTH // 8 if WIDTH // 8 <= 32 else 32
    ROW_THREADS: gl.constexpr = 32 // COL_THREADS
    gl.static_assert(ROWS % (ROW_THREADS * gl.num_warps()) == 0 and BLOCK_ROWS % ROWS == 0,
                     "ROWS: a multiple of the rows the partition's threads cover, dividing the block's")
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [ROW_THREADS, COL_THREADS], [gl.num_warps(), 1], [1, 0])
    # interleaved: a thread's 8 features as 4 pairs, [rows, pairs, 2], split into a and b in registers
    pairs: gl.constexpr = gl.BlockedLayout([1, 4, 2], [ROW_THREADS, COL_THREADS, 1], [gl.num_warps(), 1, 1], [2, 1, 0])
    angle_layout: gl.constexpr = gl.SliceLayout(2, pairs) if INTERLEAVED else layout
    CHUNKS: gl.constexpr = BLOCK_ROWS // ROWS
    PASS_BLOCKS: gl.constexpr = (D - 2 * R) // WIDTH  # out_ptr: the features past 2R, WIDTH at a time
    cos, sin = load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, first_pos, ROWS, R, angle_layout)
    for c in gl.static_range(CHUNKS):
        if c + 1 < CHUNKS:  # the next rows' angles, in flight under this turn
            next_cos, next_sin = load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max,
                                             first_pos + (c + 1) * ROWS, ROWS, R, angle_layout)
        chunk = buf.slice(c * ROWS, ROWS, dim=0)
        cs = cos.to(gl.float32)
        sn = sin.to(gl.float32)
        if out_ptr is not None:
            rows = c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
            ok = gl.expand_dims(rows < rows_left, 1)
            at = out_ptr + gl.expand_dims(rows.to(gl.int64) * D, 1) + \
                gl.expand_dims(gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout)), 0)
        if INTERLEAVED:
            whole = chunk.slice(0, 2 * R, dim=1)
            x = gl.convert_layout(whole.load(layout).to(gl.float32).reshape([ROWS, R, 2]), pairs)
            a, b = gl.split(x)
            a2, b2 = turn_pair(a, b, cs, sn)
            turned = gl.convert_layout(gl.join(a2, b2).reshape([ROWS, 2 * R]), layout).to(buf.dtype)
            if out_ptr is not None:
                gl.store(at, turned, mask=ok)
            else:
                whole.store(turned)
        else:
            lo = chunk.slice(0, R, dim=1)
            hi = chunk.slice(R, R, dim=1)
            a2, b2 = turn_pair(lo.load(layout).to(gl.float32), hi.load(layout).to(gl.float32), cs, sn)
            if out_ptr is not None:
                gl.store(at, a2.to(buf.dtype), mask=ok)
                gl.store(at + R, b2.to(buf.dtype), mask=ok)
            else:
                lo.store(a2.to(buf.dtype))
                hi.store(b2.to(buf.dtype))
        if out_ptr is not None:
            for j in gl.static_range(PASS_BLOCKS):
                gl.store(at + 2 * R + j * WIDTH, chunk.slice(2 * R + j * WIDTH, WIDTH, dim=1).load(layout), mask=ok)
        if c + 1 < CHUNKS:
            cos = next_cos
            sin = next_sin


@gluon.jit
def stores_published(x):
    """This thread's generic global stores ordered before what it does next at GPU scope (fence.acq_rel.gpu: the
    release that follows a barrier covers the warpgroup's stores) and for the async proxy (the tiles' TMA loads
    of them); returns x (an int32 scalar)."""
    return gl.inline_asm_elementwise("fence.acq_rel.gpu; fence.proxy.async.global; mov.b32 $0, $1;", "=r,r", [x],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def fence_proxy_async_global(x):
    """fence.proxy.async.global once ``x`` (an int32 scalar) is known: this thread's generic-proxy accesses of
    global memory ordered with its async-proxy ones (TMA); returns x."""
    return gl.inline_asm_elementwise("fence.proxy.async.global; mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)


@struct
class KTurn:
    """K turned inside the launch (issue 37: the pass's bytes under the forward's tensor-core time): side items
    of the template's schedule table (plan.rotary_overlap_table), each ITEM_STEPS ring steps of one kv head's
    rows, 2 BN a step (the stage's K and V buffers loaded from k_raw by TMA). Consumers 0 and 1 read a buffer
    each into registers, turn it (turn_rows: apply_rotary's bits) and store it (st.global) into the (B, Hkv, Nk,
    D) buffer the tiles' K descriptor reads; the stage goes back once read (turning in place and TMA-storing held
    it until the store had read it: 1.12x slower on one SM, notes/rotary). After an item's last step every
    consumer fences its stores (GPU scope, and for the async proxy), meets its warps and adds one to its kv
    head's counter (release). A tile's producer, before its Q load (well before its
    first K load), waits until its kv head's counter reaches items_per_head x CONSUMERS (acquire), then
    fences for the async proxy (its TMA loads of K).

    No deadlock while every program is resident (the persistent grid: one program an SM, at most the SMs):
    the table deals one global sequence of items in which a head's K items come before its first tile, each
    program's in that order. The earliest unfinished item's program has finished all before it, and that item
    waits only on earlier items (a K item on nothing), so it finishes."""
    k_raw: object  # k's descriptor (B, Hkv, Nk, D), the stage's boxes
    counters: object  # int32 [B * Hkv], zero at launch: a kv head's items finished, one count a consumer
    items_per_head: object
    k_out: object  # the turned buffer (B, Hkv, Nk, D), contiguous, which the items store to
    ITEM_STEPS: gl.constexpr  # ring steps an item (2 BN rows each)
    ROWS: gl.constexpr  # rows turned at a time (turn_rows)

    @gluon.jit
    def wait_head(self, u, target):
        """The producer: until kv head u's items are all finished; then a proxy fence before its K's TMA loads."""
        done = gl.atomic_add(self.counters + u, 0, sem="acquire", scope="gpu")
        while done < target:
            done = gl.atomic_add(self.counters + u, 0, sem="acquire", scope="gpu")
        fence_proxy_async_global(done)


@struct
class RotaryAttention:
    """The rotary forward's op: attention's (``attn``, whose callbacks it passes on), each consumer's Q
    block turned at the start of its tile (K comes turned); with ``q_out`` (a descriptor of Q's shape,
    or None) the turned block also stored there (for the backward, which needs turned q)."""
    attn: object
    q_out: object
    cos: object
    sin: object
    cos_stride: object
    sin_stride: object
    n_max: object  # cos's and sin's rows
    kturn: object  # a KTurn (K turned by side items of the launch), or None (K comes turned)
    R: gl.constexpr  # pairs a row: rotary_dim / 2
    ROWS: gl.constexpr  # Q rows turned at a time (a consumer's block where its registers allow)
    INTERLEAVED: gl.constexpr  # pairs (2i, 2i + 1) (GPT-J), else (i, i + R)

    @gluon.jit
    def setup(self, tile_id):
        return self.attn.setup(tile_id)

    @gluon.jit
    def load(self, stage, bar, tile, step, prev=None):
        self.attn.load(stage, bar, tile, step, prev)

    @gluon.jit
    def load_tile(self, q_smem, bar, tile, consumer):
        if self.kturn is not None:
            if consumer == 0:  # the tile's kv head turned (its K items finished) before any of its K loads
                a = self.attn
                b, h, hk = head_of(tile.bh, a.H, a.GROUP)
                self.kturn.wait_head(b * (a.H // a.GROUP) + hk, self.kturn.items_per_head * a.CONSUMERS)
        self.attn.load_tile(q_smem, bar, tile, consumer)

    @gluon.jit
    def side_rows(self, item, step):
        """(batch, kv head, first row) of a K item's step."""
        a = self.attn
        u = item // self.kturn.items_per_head
        part = item - u * self.kturn.items_per_head
        Hkv = a.H // a.GROUP
        b = u // Hkv
        return b, u - b * Hkv, (part * self.kturn.ITEM_STEPS + step) * (2 * a.BN)

    @gluon.jit
    def side_steps(self, item):
        """A K item's steps: ITEM_STEPS, fewer where the head's rows end first."""
        a = self.attn
        part = item % self.kturn.items_per_head
        return gl.minimum(gl.cdiv(a.Nk - part * self.kturn.ITEM_STEPS * (2 * a.BN), 2 * a.BN), self.kturn.ITEM_STEPS)

    @gluon.jit
    def side_load(self, stage, bar, item, step):
        """2 BN rows of k: the stage's K buffer and its V buffer (the same box; rows past Nk arrive as 0)."""
        b, hk, row = self.side_rows(item, step)
        tma.async_copy_global_to_shared(self.kturn.k_raw, [b, hk, row, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.kturn.k_raw, [b, hk, row + self.attn.BN, 0], bar, stage.v)

    @gluon.jit
    def side(self, ctx, stage, item, step):
        """Consumer 0 turns the stage's K buffer, consumer 1 its V buffer (a third has nothing to do), in place,
        then stores it by TMA into the turned K (rows past Nk clipped) and waits for the store's read."""
        if ctx.index < 2:
            a = self.attn
            b, hk, row = self.side_rows(item, step)
            row = row + ctx.index * a.BN
            if ctx.index == 0:
                buf = stage.k
            else:
                buf = stage.v
            Hkv = a.H // a.GROUP
            out = self.kturn.k_out + ((b * Hkv + hk).to(gl.int64) * a.Nk + row) * a.D
            turn_rows(buf.reshape([a.BN, a.D]), row, self.cos, self.sin, self.cos_stride, self.sin_stride,
                      self.n_max, self.R, self.kturn.ROWS, self.INTERLEAVED, out, a.Nk - row)
            gl.thread_barrier()  # every warp has read the buffer before any thread releases the stage

    @gluon.jit
    def side_done(self, ctx, item):
        """The item's stores written and fenced, then counted on its kv head (release)."""
        u = stores_published(item // self.kturn.items_per_head)
        gl.thread_barrier()
        gl.atomic_add(self.kturn.counters + u, 1, sem="release", scope="gpu")

    @gluon.jit
    def initial(self, ctx):
        return self.attn.initial(ctx)

    @gluon.jit
    def start(self, ctx, tile, prev):
        """This consumer's Q rows turned in its buffer (query i at position i + Nk - N), made visible to
        wgmma (every thread fences its own writes, then the warpgroup meets), then attention's start."""
        a = self.attn
        first = tile.first + ctx.index * a.BM
        turn_rows(ctx.operand.reshape([a.BM, a.D]), first + (a.Nk - a.N), self.cos, self.sin, self.cos_stride,
                  self.sin_stride, self.n_max, self.R, self.ROWS, self.INTERLEAVED)
        fence_async_shared()
        gl.thread_barrier()
        if self.q_out is not None:  # the turned rows by one TMA store (q_out: (1, B * H, N, D); past N clipped)
            tma.async_copy_shared_to_global(self.q_out, [0, tile.bh, first, 0], ctx.operand)
        return a.start(ctx, tile, prev)

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        return self.attn.compute(ctx, st, stage, tile, step)

    @gluon.jit
    def wait(self, ctx, st):
        """attention's wait; with ``q_out`` also the Q store's read of the tile's buffer (the template
        hands the buffer to a later tile's load after the tile's last wait). Restarting, every wait
        (the store was issued before the first step: done by then); carried, the previous tile's
        epilogue at the first step waited for it (store_block), so only a program's first tile waits."""
        st = self.attn.wait(ctx, st)
        if self.q_out is not None:
            if not self.attn.CARRY:
                tma.store_wait(0)
            elif st.pending.n_blocks == 0:
                tma.store_wait(0)
        return st

    @gluon.jit
    def finish(self, ctx, st, tile):
        self.attn.finish(ctx, st, tile)


@gluon.jit
def attention_rotary_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, cos_ptr, sin_ptr, cos_stride, sin_stride,
                                n_max, H, N, Nk, GROUP, scale_log2e, num_bh, head_group, schedule, left, right,
                                tanh_scale, qr_desc, CAUSAL: gl.constexpr, STAGES: gl.constexpr, R: gl.constexpr,
                                CONSUMERS: gl.constexpr = 2, Q_BUFFERS: gl.constexpr = 1, CARRY: gl.constexpr = False,
                                Q_REGS: gl.constexpr = False, WINDOW: gl.constexpr = False,
                                SOFTCAP: gl.constexpr = False, TURN_ROWS: gl.constexpr = 16,
                                INTERLEAVED: gl.constexpr = False, K_ITEM_STEPS: gl.constexpr = 0,
                                K_TURN_ROWS: gl.constexpr = 64, kraw_desc=None, k_counters=None, k_items_per_head=0,
                                k_out=None):
    """attention_fwd_kernel's O and lse (its layout and registers) of rotary(Q), K (turned before), V, Q
    turned by each consumer once a tile (the module docstring), its whole block at once (one round trip for
    its angles) but with a carried tile's state live: TURN_ROWS rows at a time. ``qr_desc`` (q's boxes, or
    None): the turned Q written there too. K_ITEM_STEPS > 0: K turned inside the launch (KTurn: ``schedule``
    holds its items, ``kraw_desc`` is k, ``k_desc`` and ``k_out`` the turned buffer, ``k_counters`` zeros)."""
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3, "two or three consumer warpgroups")
    gl.static_assert(not (CARRY and Q_REGS), "Q_REGS takes a pipeline that restarts at each tile")
    gl.static_assert(not (WINDOW and (CARRY or CAUSAL)), "a window restarts the pipeline at each tile, causal folded in")
    BM: gl.constexpr = o_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    DV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(q_desc.block_type.shape[2] == BM and DV == D, "a consumer's Q rows; v's head dim q's")
    gl.static_assert(2 * R <= D and R % 16 == 0, "rotary_dim: a multiple of 32 up to D")
    attn = Attention(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh, head_group, left,
                     right, tanh_scale, CAUSAL, BM, BN, D, DV, CONSUMERS, CARRY, Q_REGS,
                     wgmma_layout(BM, BN, gl.num_warps()), wgmma_layout(BM, DV, gl.num_warps()),
                     wgmma_lhs_layout(BM, DV, gl.num_warps()), WINDOW, SOFTCAP, 1)
    ROWS: gl.constexpr = BM if not CARRY else TURN_ROWS
    kturn = None
    if K_ITEM_STEPS > 0:
        gl.static_assert(not CARRY and D == DV, "K turned in the launch: a pipeline that restarts at each tile, "
                         "V's boxes K's")
        kturn = KTurn(kraw_desc, k_counters, k_items_per_head, k_out, K_ITEM_STEPS, K_TURN_ROWS)
    op = RotaryAttention(attn, qr_desc, cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, kturn, R, ROWS, INTERLEAVED)
    layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=160 if CONSUMERS == 3 else 232,
                    PRODUCER_REGS=24 if CONSUMERS == 3 else 40, LATE_RELEASE=0, CARRY=CARRY,
                    tile_operand=TileOperand(q_desc, BUFFERS=Q_BUFFERS), schedule=schedule,
                    SIDE_ITEMS=K_ITEM_STEPS > 0)
    run(op, layout, KV(ring(k_desc, STAGES), ring(v_desc, STAGES)), gl.cdiv(N, BM * CONSUMERS) * num_bh)


# --------------------------------------------------------------------------------------------
# the launch

ROTARY_FWD = CachedLaunch(attention_rotary_fwd_kernel)


def rows_at_a_time(r: int, interleaved: bool = False) -> int:
    """Rows 4 warps turn at a time: as many as they cover with 8 features (16 bytes) a thread, of each
    half of the pairs (1024 / R rows) or of the 2R interleaved features (512 / R)."""
    return (512 if interleaved else 1024) // r

def check(q, k, v, cos, sin, interleaved: bool) -> None:
    """What forward takes, or a clear error: plan.RotaryNotTaken (a NotImplementedError) for a head dim or rotary_dim
    it does not take (attention runs the turned path's math then), ValueError for inputs attention would refuse."""
    B, H, N, D = q.shape
    Nk = k.shape[2]
    if D not in (64, 128) or k.shape[3] != D or v.shape[3] != D:
        raise RotaryNotTaken(f"the in-kernel rotary forward takes q, k and v of head dim 64 or 128; got "
                             f"{D}, {k.shape[3]}, {v.shape[3]}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"cos and sin: (max_seqlen, rotary_dim / 2) each; got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    R = cos.shape[1]
    if 2 * R > D:
        raise ValueError(f"rotary_dim (2 x cos.shape[1] = {2 * R}) exceeds the head dim {D}")
    if R not in (16, 32, 64):  # the turn's tiles are R wide (a power of two), 16-byte vectors of 8 features
        raise RotaryNotTaken(f"the in-kernel rotary forward takes rotary_dim (2 x cos.shape[1]) 32, 64 or 128; got "
                             f"{2 * R}")
    if N > Nk:
        raise ValueError(f"rotary in the kernel puts query i at position i + Nk - N: N ({N}) must not exceed Nk ({Nk})")
    if cos.shape[0] < Nk:
        raise ValueError(f"cos and sin have {cos.shape[0]} rows, fewer than the {Nk} positions of the keys")
    if cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("cos and sin: unit stride along rotary_dim / 2")


def forward(q, k, v, cos, sin, *, causal: bool, scale: float, interleaved: bool = False, window=(-1, -1),
            softcap: float = 0.0, sm_margin: int = 0, keep_turned: bool = False):
    """(out, lse) of attention(rotary(q), rotary(k), v): out (B, H, N, D) contiguous in q's dtype, lse
    (B, H, N) float32, as the shipped forward's launch (launch.outputs) gives them. Hopper with Gluon
    only (the caller routes other devices to apply_rotary and the shipped forward). ``keep_turned``:
    (out, lse, turned q, turned k), both contiguous (B, H, N, D) as the turned path's (attention_rotary.op._turn)
    for the backward: K turned into its buffer by apply_rotary's kernel, Q written by the Gluon kernel
    from the buffer it turned (a TMA store a consumer's tile)."""
    from tilecore.ops.attention.kernels_tl import mask_options, score_options
    from tilecore.ops.attention.launch import gluon_softcap, head_operand
    from tilecore.ops.attention.plan import plan_forward
    from tilecore.ops.attention_rotary.plan import rotary_overlap_schedule
    from tilecore.ops.rotary import apply_rotary
    from tilecore.ops.rotary.op import turn

    check(q, k, v, cos, sin, interleaved)
    qr = torch.empty(q.shape, dtype=q.dtype, device=q.device) if keep_turned else None
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    windowed = tuple(window) != (-1, -1)
    cfg = attention_configs.gluon_forward_config(D, N, Nk, causal and not windowed)
    k_raw = k
    by_head = keep_turned or ((D, bool(causal)) in configs.ROTARY_K_OVERLAP_CASES and not cfg.get("carry"))
    if by_head:
        k = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # turned (B, Hkv, Nk, D): in the launch, or below
    else:
        k = apply_rotary(k.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)  # (B, Nk, Hkv, D)'s view
    plan = plan_forward(q, k, v, causal, scale, path="gluon", config=cfg, window=window, softcap=softcap,
                        sm_margin=sm_margin)
    cfg = plan.config
    overlap = None
    if by_head:
        overlap = rotary_overlap_schedule(q, k_raw, cfg, causal, plan.sizes["head_group"], plan.grid[0])
        if overlap is None:  # K by apply_rotary's pass into the buffer
            turn(k_raw.transpose(1, 2), cos, sin, interleaved=interleaved, out=k.transpose(1, 2))
    out = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    block_m, block_n = cfg["block_m"], cfg["block_n"]
    masks, left, right = mask_options(causal, window, N, Nk)
    _, scale_log2e, tanh_scale = score_options(scale, softcap)
    # the keyed launch's key (plan.launch_key: q, k, v's signature) told apart where Q is stored too, and where K is
    # turned inside (its items' steps, and how the JIT specializes the items a head: 1, or a multiple of 16)
    key = plan.launch_key
    if key is not None and (qr is not None or overlap is not None):
        key = (key, qr is not None, None if overlap is None else
               (configs.ROTARY_K_OVERLAP_ITEM_STEPS, overlap[1] == 1, overlap[1] % 16 == 0))
    schedule, kraw, counters, per_head, item_steps = plan.schedule, None, None, 0, 0
    if overlap is not None:
        schedule, per_head = overlap
        kraw, item_steps = head_operand(k_raw, block_n), configs.ROTARY_K_OVERLAP_ITEM_STEPS
        counters = torch.zeros(B * Hkv, dtype=torch.int32, device=q.device)
    with dispatch.on_device(q.device):
        ROTARY_FWD.run(key, plan.grid,
                       (head_operand(q, block_m), head_operand(k, block_n), head_operand(v, block_n),
                        head_operand(out, block_m), lse, cos, sin, cos.stride(0), sin.stride(0), cos.shape[0], H, N, Nk,
                        H // Hkv, scale_log2e, B * H, plan.sizes["head_group"], schedule, left, right, tanh_scale,
                        None if qr is None else head_operand(qr.view(1, B * H, N, D), block_m)),
                       dict(**masks, SOFTCAP=gluon_softcap(softcap, cfg), STAGES=cfg["stages"], R=cos.shape[1],
                            CONSUMERS=cfg.get("consumers", 2), Q_BUFFERS=cfg.get("q_buffers", 1),
                            CARRY=cfg.get("carry", False), Q_REGS=cfg.get("q_regs", False),
                            TURN_ROWS=rows_at_a_time(cos.shape[1], interleaved), INTERLEAVED=bool(interleaved),
                            K_ITEM_STEPS=item_steps, kraw_desc=kraw, k_counters=counters, k_items_per_head=per_head,
                            k_out=None if overlap is None else k, num_warps=4))
    return (out, lse) if qr is None else (out, lse, qr, k)

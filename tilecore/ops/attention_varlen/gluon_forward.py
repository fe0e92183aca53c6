"""The packed variable-length attention forward on Hopper (``attention_varlen``'s Gluon kernel): the
fixed-length forward's pipeline (gluon_kernels.py: FlashAttention-3's S = Q K^T issued with the last
P V, the softmax under it) on the tiles template, over a device-built list of work items.

Layout: q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, D), each described by TMA as its
(heads, total, D) view (``packed_operand``): a box is ``rows`` rows of one head, at any row offset.

Work items (``work_table``, torch ops on the device: no host sync, so a call captures in a CUDA
graph): a tile is TILE_M = CONSUMERS x BLOCK_M query rows of one (sequence, q head). Sequences come
longest first (by N x Nk), each sequence's tiles head by head (a head's tiles one after another:
they read the same K and V, which stay in L2), within a head its query tiles from the last rows (the
heaviest, causal) to the first. Tiles are counted from a sequence's last row, so every tile but a
sequence's first rows' is whole; that one starts at row 0 and covers the next tile's first rows too
(a TMA box is whole), which it computes but does not store (its own rows end at ``Rows.end``); a
consumer none of whose rows are its tile's own passes every stage by. The table has
an upper bound of entries from the shapes alone (cdiv(total_q, TILE_M) + B tiles a head); entries
past the real tiles are (-1, ...): no keys, nothing stored. Programs draw tiles from a counter in
that order (``Layout.tile_counter``): greedy longest-first, so a long-tailed batch's tail is short.

Per tile: its sequence's offsets q0, k0 and lengths N, Nk come from cu_seqlens; the producer loads K
and V blocks at row k0 + j BLOCK_N and each consumer its Q block at q0 + its first row. Rows past a
sequence's end belong to the next sequence (or are zeros past the packed end): keys there are masked
in the scores (key < Nk, ``needs_mask`` / ``mask_scores`` with the sequence's local positions, the
causal diagonal bottom-right aligned per sequence), so their P is 0; queries there are computed and
never stored. The output goes by one TMA store where a consumer's rows are all its tile's own, else
by a masked register store (its own rows only): every row is stored once, and no other sequence's
rows are ever written. lse
(Hq, total_q) float32 natural log, as the tl path's. SOFTCAP as the fixed kernel's (1: tanh from
exp2, 2: tanh.approx.f32). No window (the tl kernels serve it).

A P of 0 times a neighbour's V row holding inf or NaN is NaN, so a non-finite V within BLOCK_N rows
after a sequence's end reaches that sequence's last rows (finite inputs are never affected; a
neighbour's K is harmless: its scores become -inf). ``ZERO_TAIL_V`` zeroes those V rows in shared
memory before the last P V (``zero_rows_from``): compiled, not yet run on a GPU, so off by default
(configs.VARLEN_GLUON_FORWARD_CONFIG's ``zero_tail_v``).
"""
from triton.experimental import gluon

from tilecore.ops.attention.gluon_kernels import Attention
from tilecore.tiles.gluon import (Layout, TileOperand, online_softmax_result, online_softmax_start, opaque_int, ring,
                                  run, stage_struct, store_block, struct, wgmma_layout, wgmma_lhs_layout)
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait

WORK_FIELDS = 4  # a work-table entry: sequence (-1: none), query tile from the last row, q head, unused


@stage_struct
class KV:
    """One stage: a block of keys and a block of values."""
    k: object  # [1, BN, D]
    v: object


@struct
class Rows:
    """A tile's (or a consumer's) query rows: ``first`` local to the sequence, the q head, the key
    blocks they see, the sequence's first packed query and key rows and its lengths, and ``end``:
    the tile's own rows are first .. end - 1 (rows from end on are the next tile's, or past N)."""
    first: object
    h: object
    n_blocks: object
    q0: object
    k0: object
    N: object
    Nk: object
    end: object
    first_block: object  # WINDOW: a tile's first key block (its step 0); a consumer's, the step of its first


@struct
class Running:
    """A consumer's online softmax: row max m, row sum l (base 2), the output accumulator, the last P
    (the next P V's register operand) and its rows."""
    m: object
    l: object
    acc: object
    p: object
    rows: object


@struct
class VarlenAttention:
    """The op: its globals, whose methods are the template's callbacks."""
    q_desc: object
    k_desc: object
    v_desc: object
    o_desc: object
    out: object  # O's pointer, for the masked stores of rows that end a sequence
    o_row_stride: object
    lse: object
    cu_q: object
    cu_k: object
    work: object  # (tiles, WORK_FIELDS) int32
    GROUP: object  # q heads per kv head
    total_q: object
    left: object  # WINDOW: keys seen before and after a query's position (max(total_q, total_k): unbounded)
    right: object
    scale_log2e: object  # SOFTCAP: cap log2(e)
    tanh_scale: object  # SOFTCAP: scale / cap
    CAUSAL: gl.constexpr
    BM: gl.constexpr  # a consumer's query rows
    BN: gl.constexpr  # keys a step
    D: gl.constexpr
    CONSUMERS: gl.constexpr
    S: gl.constexpr  # layouts: S = Q K^T [BM, BN], O [BM, D], P as P V's register operand
    O: gl.constexpr
    P: gl.constexpr
    SOFTCAP: gl.constexpr
    WINDOW: gl.constexpr
    ZERO_TAIL_V: gl.constexpr  # zero the next sequence's V rows in a partial last key block (zero_rows_from)

    @gluon.jit
    def setup(self, tile_id):
        """The work item's rows and steps: a step per key block it sees and one for the last P V."""
        TILE_M: gl.constexpr = self.BM * self.CONSUMERS
        entry = self.work + tile_id.to(gl.int64) * 4
        seq = gl.load(entry)
        tile = gl.load(entry + 1)
        h = gl.load(entry + 2)
        real = seq >= 0
        b = gl.maximum(seq, 0)
        q0 = gl.load(self.cu_q + b)
        k0 = gl.load(self.cu_k + b)
        N = gl.where(real, gl.load(self.cu_q + b + 1) - q0, 0)
        Nk = gl.where(real, gl.load(self.cu_k + b + 1) - k0, 0)
        first = gl.maximum(N - (tile + 1) * TILE_M, 0)  # counted from the last row
        end = N - tile * TILE_M
        first_block = 0
        if self.CAUSAL:  # query i sees keys j <= i + Nk - N
            hi = gl.maximum(gl.minimum(Nk, first + TILE_M + (Nk - N)), 0)
        elif self.WINDOW:  # from the first row's left edge to the last row's right edge
            first_block = gl.maximum(first + (Nk - N) - self.left, 0) // self.BN
            last_query = gl.minimum(first + TILE_M, N) - 1
            hi = gl.maximum(gl.minimum(Nk, last_query + (Nk - N) + self.right + 1), 0)
        else:
            hi = Nk
        n_blocks = gl.where(N > 0, gl.maximum(gl.cdiv(hi, self.BN) - first_block, 0), 0)
        steps = gl.where(n_blocks > 0, n_blocks + 1, 0)
        return Rows(first, h, n_blocks, q0, k0, N, Nk, end, first_block), steps

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """Step ``step``'s K block and the V block of the step before (the first step reloads V block
        0, the last K block n - 1, unused: a stage's byte count is fixed)."""
        hk = tile.h // self.GROUP
        k_block = gl.minimum(step, tile.n_blocks - 1) + tile.first_block
        v_block = gl.maximum(step - 1, 0) + tile.first_block
        tma.async_copy_global_to_shared(self.k_desc, [hk, tile.k0 + k_block * self.BN, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.v_desc, [hk, tile.k0 + v_block * self.BN, 0], bar, stage.v)

    @gluon.jit
    def load_tile(self, q_smem, bar, tile, consumer):
        """Consumer ``consumer``'s BLOCK_M query rows."""
        tma.async_copy_global_to_shared(self.q_desc, [tile.h, tile.q0 + tile.first + consumer * self.BM, 0], bar,
                                        q_smem)

    @gluon.jit
    def start(self, ctx, tile, prev):
        first = tile.first + ctx.index * self.BM  # this consumer's rows
        n_own = tile.n_blocks
        own_first = 0
        if self.CAUSAL:  # its rows see fewer key blocks than the tile's last: it skips the later ones
            own_hi = gl.maximum(gl.minimum(tile.Nk, first + self.BM + (tile.Nk - tile.N)), 0)
            n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, self.BN), 1), tile.n_blocks)
        if self.WINDOW:
            # its own steps [own_first, n_own) of the tile's (gluon_kernels.Attention.start's): at
            # least one (all masked where its rows see no key), the stages before and after passed by
            shift = tile.Nk - tile.N
            own_lo = gl.maximum(first + shift - self.left, 0) // self.BN - tile.first_block
            own_hi = gl.maximum(gl.minimum(tile.Nk, gl.minimum(first + self.BM, tile.N) - 1 + shift + self.right + 1),
                                0)
            own_first = gl.minimum(gl.maximum(own_lo, 0), tile.n_blocks - 1)
            n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, self.BN) - tile.first_block, own_first + 1), tile.n_blocks)
        # none of its rows the tile's own (all the next tile's, or past N): it passes every stage by
        n_own = gl.where(first < tile.end, n_own, 0)
        m, l = online_softmax_start(self.BM, self.S)
        acc = gl.zeros([self.BM, self.D], gl.float32, self.O)
        p = gl.zeros([self.BM, self.BN], self.q_desc.dtype, self.P)
        return Running(m, l, acc, p, tile.replace(first=first, n_blocks=n_own, first_block=own_first))

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """This consumer's first step: S and its softmax; then S_j with P_{j-1} V_{j-1}; the step after
        its last block: its last P V; other steps pass by. Every branch ends with its wgmma complete. The
        softmax and P's operand are the fixed forward's (``Attention.softmax`` with the sequence's N, Nk)."""
        q = ctx.operand.reshape([self.BM, self.D])
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))
        v = stage.v.reshape([self.BN, self.D])
        if self.WINDOW:
            return self.window_step(q, k_t, v, st, stage, tile, step)
        else:  # apart: the window's conditions in the plain kernel spilled 8 bytes (D128 causal)
            return self.plain_step(q, k_t, v, st, stage, tile, step)

    @gluon.jit
    def window_step(self, q, k_t, v, st, stage, tile, step):
        """``compute`` with a window: this consumer's steps [own first, n_own) of the tile's, the tile's
        first key block its step 0."""
        own_first = st.rows.first_block
        n_own = st.rows.n_blocks
        key = (tile.first_block + step) * self.BN
        if (step == own_first) & (n_own > 0):
            s = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False)
            m, l, p32, alpha = Attention.softmax(self, s, st.m, st.l, st.rows.first, opaque_int(key), st.rows.N,
                                                  st.rows.Nk)
            st = st.replace(m=m, l=l, p=Attention.p_operand(self, p32))
        elif (step > own_first) & (step < n_own):
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            o_tok = warpgroup_mma(st.p, v, st.acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))  # S is done; P V may still be running
            m, l, p32, alpha = Attention.softmax(self, s, st.m, st.l, st.rows.first, key, st.rows.N, st.rows.Nk)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            st = st.replace(m=m, l=l, acc=acc * alpha, p=Attention.p_operand(self, p32))
        elif (step == n_own) & (step > own_first):
            if self.ZERO_TAIL_V:
                if (step == tile.n_blocks) & (key > tile.Nk):  # the sequence's last key block, partial
                    self.zero_rows_from(stage.v.reshape([self.BN, self.D]), tile.Nk - (key - self.BN))
            st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
        return st

    @gluon.jit
    def plain_step(self, q, k_t, v, st, stage, tile, step):
        """``compute`` without a window: step 0, the middle steps, the last P V."""
        if (step == 0) & (st.rows.n_blocks > 0):
            # the first key hidden from the compiler where causal (gluon_kernels.Attention.first_key)
            first_key = opaque_int(step * self.BN) if self.CAUSAL else 0
            s = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False)
            m, l, p32, alpha = Attention.softmax(self, s, st.m, st.l, st.rows.first, first_key, st.rows.N, st.rows.Nk)
            st = st.replace(m=m, l=l, p=Attention.p_operand(self, p32))
        elif step < st.rows.n_blocks:
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            o_tok = warpgroup_mma(st.p, v, st.acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))  # S is done; P V may still be running
            m, l, p32, alpha = Attention.softmax(self, s, st.m, st.l, st.rows.first, step * self.BN, st.rows.N,
                                                  st.rows.Nk)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            st = st.replace(m=m, l=l, acc=acc * alpha, p=Attention.p_operand(self, p32))
        elif (step == st.rows.n_blocks) & (step > 0):
            if self.ZERO_TAIL_V:
                if (step == tile.n_blocks) & (step * self.BN > tile.Nk):  # the sequence's last key block, partial
                    self.zero_rows_from(stage.v.reshape([self.BN, self.D]), tile.Nk - (step - 1) * self.BN)
            st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
        return st

    @gluon.jit
    def zero_rows_from(self, v_smem, keep):
        """V rows from ``keep`` on (the next sequence's) set to 0 in shared memory before the last P V:
        their P is 0, but 0 times an inf or NaN there would be NaN. Both consumers may do it to the
        same stage: each writes the rows it keeps unchanged and zeros elsewhere, so whatever order
        their stores land in, every row a wgmma reads is the kept value or 0."""
        ROWS: gl.constexpr = v_smem.shape[0]
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        x = v_smem.load(layout)
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        v_smem.store(gl.where(gl.expand_dims(rows < keep, 1), x, gl.zeros_like(x)))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def wait(self, ctx, st):
        return st.replace(acc=warpgroup_mma_wait(0, deps=(st.acc,)))

    @gluon.jit
    def finish(self, ctx, st, tile):
        """O = acc / l and lse of this consumer's rows that are the tile's own (each row of a sequence is
        stored by one tile, none past it): O by one TMA store when all BLOCK_M are, else by a masked
        store; lse masked."""
        out, lse = online_softmax_result(st.m, st.l, st.acc)
        rows = st.rows
        lse_rows = rows.first + gl.arange(0, self.BM, layout=lse.type.layout)
        lse_at = self.lse + rows.h.to(gl.int64) * self.total_q + rows.q0 + lse_rows
        gl.store(lse_at, lse, mask=lse_rows < rows.end)
        if rows.first + self.BM <= rows.end:
            store_block(out, self.o_desc, ctx.out, [rows.h, rows.q0 + rows.first, 0])
        else:
            o_rows = rows.first + gl.arange(0, self.BM, layout=gl.SliceLayout(1, self.O))
            cols = gl.arange(0, self.D, layout=gl.SliceLayout(0, self.O))
            at = gl.expand_dims((rows.q0 + o_rows).to(gl.int64) * self.o_row_stride + rows.h * self.D, 1) \
                + gl.expand_dims(cols, 0)
            row_ok = gl.expand_dims(o_rows < rows.end, 1) & gl.expand_dims(cols < self.D, 0)
            gl.store(self.out + at, out.to(self.q_desc.dtype), mask=row_ok)


@gluon.jit
def attention_varlen_fwd_kernel(q_desc, k_desc, v_desc, o_desc, out_ptr, o_row_stride, lse_ptr, cu_q, cu_k, work,
                                num_tiles, GROUP, total_q, scale_log2e, tanh_scale, left, right, tile_counter,
                                CAUSAL: gl.constexpr, SOFTCAP: gl.constexpr, STAGES: gl.constexpr,
                                CONSUMERS: gl.constexpr, Q_BUFFERS: gl.constexpr = 2, WINDOW: gl.constexpr = False,
                                ZERO_TAIL_V: gl.constexpr = False):
    """O and lse of packed attention for every work item (``work_table``); a persistent grid drawing
    its tiles from ``tile_counter`` (or, None, program p takes tiles p, p + P, ...)."""
    gl.static_assert(CONSUMERS == 2, "two consumer warpgroups")
    gl.static_assert(not (WINDOW and CAUSAL), "causal folded into the window (right = 0)")
    BM: gl.constexpr = o_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = k_desc.block_type.shape[2]
    op = VarlenAttention(q_desc, k_desc, v_desc, o_desc, out_ptr, o_row_stride, lse_ptr, cu_q, cu_k, work, GROUP,
                         total_q, left, right, scale_log2e, tanh_scale, CAUSAL, BM, BN, D, CONSUMERS,
                         wgmma_layout(BM, BN, gl.num_warps()), wgmma_layout(BM, D, gl.num_warps()),
                         wgmma_lhs_layout(BM, D, gl.num_warps()), SOFTCAP, WINDOW, ZERO_TAIL_V)
    layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=232, PRODUCER_REGS=40, LATE_RELEASE=0,
                    tile_operand=TileOperand(q_desc, BUFFERS=Q_BUFFERS), tile_counter=tile_counter)
    run(op, layout, KV(ring(k_desc, STAGES), ring(v_desc, STAGES)), num_tiles)


def compiled_forward(d: int = 128, causal: bool = True, softcap: int = 0, dtype=None, cfg: dict | None = None,
                     drawn: bool | None = None, window: bool = False):
    """The kernel compiled for sm_90a without a GPU (TRITON_INTERPRET unset), with the arguments
    op.forward_gluon passes (packed (total, heads, D) tensors of 4096 rows, 16 heads)."""
    import torch

    from tilecore.ops.attention_varlen import configs
    from tilecore.tiles.compile import compile_kernel
    from tilecore.tiles.launch import TmaOperand

    dtype = dtype or torch.bfloat16
    cfg = dict(cfg or configs.VARLEN_GLUON_FORWARD_CONFIG[d])
    drawn = cfg.get("drawn", True) if drawn is None else drawn
    x = torch.empty(4096, 16, d, dtype=dtype)
    # op.packed_operand's (not imported: op imports this module at its first launch)
    desc = lambda rows: TmaOperand(x.transpose(0, 1), [1, rows, d]).descriptor()  # noqa: E731
    i32 = torch.empty(64, dtype=torch.int32)
    args = dict(q_desc=desc(cfg["block_m"]), k_desc=desc(cfg["block_n"]), v_desc=desc(cfg["block_n"]),
                o_desc=desc(cfg["block_m"]), out_ptr=x, o_row_stride=16 * d, lse_ptr=torch.empty(64),
                cu_q=i32, cu_k=i32, work=i32, num_tiles=4096, GROUP=1, total_q=4096, scale_log2e=0.1,
                tanh_scale=0.1, left=1000, right=0, tile_counter=torch.zeros(1, dtype=torch.int32) if drawn else None,
                CAUSAL=causal and not window, SOFTCAP=softcap, STAGES=cfg["stages"], CONSUMERS=cfg["consumers"],
                Q_BUFFERS=cfg["q_buffers"], WINDOW=window, ZERO_TAIL_V=cfg.get("zero_tail_v", False))
    return compile_kernel(attention_varlen_fwd_kernel, args, num_warps=4)


def report(cases=((128, True, 0, False), (128, False, 0, False), (64, True, 0, False), (128, True, 2, False),
                  (128, False, 0, True))) -> list[dict]:
    """Resources and Hopper instructions of the compiled kernel for (D, causal, SOFTCAP, WINDOW) cases."""
    from tilecore.tiles.compile import has_hopper_instructions, resources

    rows = []
    for d, causal, softcap, window in cases:
        compiled = compiled_forward(d, causal, softcap, window=window)
        rows.append(dict(D=d, causal=causal, softcap=softcap, window=window, **vars(resources(compiled)),
                         **has_hopper_instructions(compiled.asm["ptx"])))
    return rows


if __name__ == "__main__":  # python -m tilecore.ops.attention_varlen.gluon_forward [--quick] (TRITON_INTERPRET unset)
    import json
    import sys

    print(json.dumps(report(((128, True, 2, False),)) if "--quick" in sys.argv else report()))

"""The split-key (decode) forward on Hopper: a layout and callbacks on the tiles template
(:mod:`tilecore.tiles.gluon.pipeline`), the twin of ``kernels_tl.attn_fwd_split_keys`` (which serves the
interpreter, other GPUs, MLA's 576 / 512 and the paged cache).

A tile is (batch, kv head, key split, row block): the kv head's packed rows, head-major (row r is query
r % N of q head hk * GROUP + r // N), so that a tile's rows are consecutive rows of O and of the merge's
parts, both viewed as (vectors, GROUP x N, Dv): one TMA store writes them and clips the rows past
GROUP x N. Rows are padded to the wgmma's 64, or, where a kv head packs at most 16, to mma.sync's 16 (a
small decode is a chain of latencies, its last step's MMA one of them: 64 rows are 4x the work of 16,
~0.5 us of wgmma at D 128; O's and the MMA operands' layouts come from the row count). Q comes into registers by plain loads (any
strides; the tile's Q is 16 KiB against its K and V's 32-64 KiB a step). Per step the producer warp
TMA-loads a K and a V block into a stage (4-D descriptors over (B, Hkv, Nk, D): rows past Nk arrive as
zeros); the consumer warpgroup runs S = Q K^T, the mask and softcap, one online-softmax step and
O += P V, both wgmma waited for within the step (the step is short against its load).

``finish`` normalizes: with one split (MERGED) O in the inputs' dtype and lse (natural log); else the
split's float32 O and base-2 lse into the parts, which ``kernels_tl.attn_merge_splits`` combines. A row
with no key gets O = 0 and lse -inf; NaN and inf as the query-block kernels (the tile ops' softmax)."""
from triton.experimental import gluon

from tilecore.ops.attention.gluon_kernels import tanh_approx, tanh_from_exp2
from tilecore.tiles.gluon import (LOG2E, Layout, as_column, needs_mask, online_softmax_result, online_softmax_start,
                                  online_softmax_update, ring, run, stage_struct, store_block, store_rows, struct,
                                  wgmma_layout, wgmma_lhs_layout)
from tilecore.tiles.gluon.compat import gl, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.language.nvidia.ampere import mma_v2


@gluon.constexpr_function
def mma_layout(rows, cols, num_warps):
    """The accumulator layout of a [rows, cols] tile: wgmma's at 64 rows; at 16 mma.sync's (m16n8k16), the warps
    side by side along the columns."""
    if rows == 64:
        return wgmma_layout(rows, cols, num_warps)
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps], instr_shape=[16, 8])


@gluon.constexpr_function
def operand_layout(rows, cols, num_warps, index):
    """The register operand ``index`` (0: the left, 1: the right, mma.sync only) of the MMA whose accumulator is
    [rows, cols] (mma_layout); wgmma's right operand is in shared memory (None)."""
    if rows == 64:
        return wgmma_lhs_layout(rows, cols, num_warps) if index == 0 else None
    return gl.DotOperandLayout(operand_index=index, parent=mma_layout(rows, cols, num_warps), k_width=2)


@stage_struct
class KV:
    """One stage: a block of keys and the block of values of the same keys."""
    k: object  # [1, 1, BN, D]
    v: object


@struct
class Tile:
    """A tile's batch and kv head, its rows' vector in the (vectors, GROUP x N, Dv) views of O and the
    parts (split x B x Hkv + batch x Hkv + kv head), its first packed row and its first key."""
    b: object
    hk: object
    part: object
    row0: object
    first_key: object


@struct
class Running:
    """The consumer's online softmax (row max m and sum l, base 2), its accumulator and the tile's Q
    rows (the register operand of S = Q K^T)."""
    m: object
    l: object
    acc: object
    q: object


@struct
class Decode:
    """The op: its globals, whose methods are the template's callbacks."""
    q_ptr: object
    k_desc: object
    v_desc: object
    o_desc: object
    lse_ptr: object
    sqb: object
    sqh: object
    sqn: object
    sqd: object
    Hkv: object
    N: object
    Nk: object
    GROUP: object
    num_bhk: object
    splits: object
    row_blocks: object
    keys_per_split: object
    left: object  # WINDOW: keys seen before and after a query's position
    right: object
    scale_log2e: object  # SOFTCAP: cap log2(e)
    tanh_scale: object  # SOFTCAP: scale / cap
    CAUSAL: gl.constexpr
    WINDOW: gl.constexpr
    SOFTCAP: gl.constexpr  # 0; 1 tanh from exp2; 2 tanh.approx.f32
    MERGED: gl.constexpr
    BM: gl.constexpr
    BN: gl.constexpr
    D: gl.constexpr
    DV: gl.constexpr
    S: gl.constexpr  # the layouts of S [BM, BN], of O [BM, DV], of P and of Q as the MMA's register operands
    O: gl.constexpr
    P: gl.constexpr
    Q: gl.constexpr
    KT: gl.constexpr  # WGMMA False (16 rows, mma.sync): K^T's and V's register operand layouts
    V: gl.constexpr
    WGMMA: gl.constexpr

    @gluon.jit
    def setup(self, tile_id):
        """The tile's coordinates and its steps: the key blocks of its split that its rows see (a window:
        from the block holding query 0's first key to the last query's last)."""
        rb = tile_id % self.row_blocks
        rest = tile_id // self.row_blocks
        split = rest % self.splits
        bhk = rest // self.splits
        lo = split * self.keys_per_split
        hi = gl.minimum(lo + self.keys_per_split, self.Nk)
        start = lo
        if self.WINDOW:
            shift = self.Nk - self.N
            start = lo + gl.maximum(shift - self.left - lo, 0) // self.BN * self.BN
            hi = gl.minimum(hi, self.N - 1 + shift + self.right + 1)
        steps = gl.maximum(gl.cdiv(hi - start, self.BN), 0)
        tile = Tile(bhk // self.Hkv, bhk % self.Hkv, split * self.num_bhk + bhk, rb * self.BM, start)
        return tile, steps

    @gluon.jit
    def load(self, stage, bar, tile, step):
        key = tile.first_key + step * self.BN
        tma.async_copy_global_to_shared(self.k_desc, [tile.b, tile.hk, key, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, tile.hk, key, 0], bar, stage.v)

    @gluon.jit
    def start(self, ctx, tile, prev):
        """No key seen yet, and the tile's Q rows loaded (rows past GROUP x N as zeros)."""
        rows = tile.row0 + gl.arange(0, self.BM, layout=gl.SliceLayout(1, self.Q))
        cols = gl.arange(0, self.D, layout=gl.SliceLayout(0, self.Q))
        head = (tile.hk * self.GROUP + rows // self.N).to(gl.int64)
        offs = tile.b.to(gl.int64) * self.sqb + head * self.sqh + (rows % self.N).to(gl.int64) * self.sqn
        ptrs = self.q_ptr + gl.expand_dims(offs, 1) + gl.expand_dims(cols * self.sqd, 0)
        ok = gl.expand_dims(rows < self.GROUP * self.N, 1) & gl.expand_dims(cols < self.D, 0)
        q = gl.load(ptrs, mask=ok, other=0.0)  # in the operand's layout: no shared scratch
        m, l = online_softmax_start(self.BM, self.S)
        return Running(m, l, gl.zeros([self.BM, self.DV], gl.float32, self.O), q)

    @gluon.jit
    def masked(self, s, tile, key):
        """s with -inf at keys past Nk and, causal or in a window, outside each row's query's keys
        (query r % N at key position r % N + Nk - N)."""
        rows = tile.row0 + gl.arange(0, self.BM, layout=gl.SliceLayout(1, self.S))
        at = gl.expand_dims(rows % self.N + (self.Nk - self.N), 1)
        keys = gl.expand_dims(key + gl.arange(0, self.BN, layout=gl.SliceLayout(0, self.S)), 0)
        ok = keys < self.Nk
        if self.CAUSAL:
            ok = ok & (keys <= at)
        if self.WINDOW:
            ok = ok & (keys <= at + self.right) & (keys >= at - self.left)
        return gl.where(ok, s, float("-inf"))

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """S = Q K^T (waited for), capped and masked where needed, one online-softmax step, and
        O = alpha O + P V issued (``wait`` ends it before the stage is released)."""
        key = tile.first_key + step * self.BN
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))
        zeros = gl.zeros([self.BM, self.BN], gl.float32, self.S)
        if self.WGMMA:
            s = warpgroup_mma(st.q, k_t, zeros, use_acc=False)
        else:
            s = mma_v2(st.q, k_t.load(self.KT), zeros)
        if self.SOFTCAP == 2:
            s = tanh_approx(s * self.tanh_scale)
        elif self.SOFTCAP:
            s = tanh_from_exp2(s * self.tanh_scale)
        if self.WINDOW:
            s = self.masked(s, tile, key)
        elif needs_mask(0, key, self.BN, self.N, self.Nk, self.CAUSAL):  # query 0 sees the fewest keys
            s = self.masked(s, tile, key)
        m, l, p, alpha = online_softmax_update(st.m, st.l, s, self.scale_log2e)
        acc = st.acc * as_column(alpha, self.O)
        p = gl.convert_layout(p.to(self.k_desc.dtype), self.P)  # (no wgmma in flight: ptxas's C7513)
        v = stage.v.reshape([self.BN, self.DV])
        if self.WGMMA:
            acc = warpgroup_mma(p, v, acc, is_async=True)
        else:
            acc = mma_v2(p, v.load(self.V), acc)
        return st.replace(m=m, l=l, acc=acc)

    @gluon.jit
    def wait(self, ctx, st):
        if self.WGMMA:
            st = st.replace(acc=warpgroup_mma_wait(0, deps=(st.acc,)))
        return st

    @gluon.jit
    def finish(self, ctx, st, tile):
        """O = acc / l and lse of the tile's rows: MERGED, O in the inputs' dtype and the natural lse;
        else the split's float32 O and base-2 lse for the merge. lse stored per row, O by one TMA store
        (rows past GROUP x N clipped by the view)."""
        out, lse = online_softmax_result(st.m, st.l, st.acc)
        if not self.MERGED:
            lse = lse * LOG2E
        store_rows(lse, self.lse_ptr, tile.part, tile.row0, self.GROUP * self.N)
        store_block(out, self.o_desc, ctx.out, [tile.part, tile.row0, 0])


@gluon.jit
def attention_decode_kernel(q_ptr, k_desc, v_desc, o_desc, lse_ptr, sqb, sqh, sqn, sqd, Hkv, N, Nk, GROUP,
                            num_bhk, splits, keys_per_split, left, right, scale_log2e, tanh_scale,
                            CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
                            MERGED: gl.constexpr, STAGES: gl.constexpr):
    """Every (batch x kv head, key split, row block) tile's O and lse on a persistent grid (program p
    takes tiles p, p + P, ...). Shapes from the descriptors' boxes: BN and D from K's, Dv from V's, the
    tile's rows (64) from O's, which views O (MERGED) or the float32 parts as (vectors, GROUP x N, Dv)."""
    BM: gl.constexpr = o_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    DV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(BM == 64 or BM == 16, "a tile is one warpgroup's 64 rows (wgmma) or 16 (mma.sync)")
    W: gl.constexpr = gl.num_warps()
    row_blocks = gl.cdiv(GROUP * N, BM)
    op = Decode(q_ptr, k_desc, v_desc, o_desc, lse_ptr, sqb, sqh, sqn, sqd, Hkv, N, Nk, GROUP, num_bhk, splits,
                row_blocks, keys_per_split, left, right, scale_log2e, tanh_scale, CAUSAL, WINDOW, SOFTCAP, MERGED,
                BM, BN, D, DV, mma_layout(BM, BN, W), mma_layout(BM, DV, W), operand_layout(BM, DV, W, 0),
                operand_layout(BM, BN, W, 0), operand_layout(BM, BN, W, 1), operand_layout(BM, DV, W, 1), BM == 64)
    layout = Layout(o_desc, STAGES, CONSUMERS=1, LATE_RELEASE=0)
    run(op, layout, KV(ring(k_desc, STAGES), ring(v_desc, STAGES)), num_bhk * splits * row_blocks)

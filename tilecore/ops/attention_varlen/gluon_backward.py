"""The packed variable-length attention backward on Hopper (``attention_varlen``'s Gluon backward):
the fixed-length Gluon backward's step (gluon_backward.py: S^T, dP^T, P^T, dS^T, dV += P^T dO,
dK += dS^T Q, dQ = dS K added by TMA reductions, FlashAttention-3's five matmuls a step) on the
tiles template, over a device-built list of (sequence, key tile, kv head) work items; or (dq_from
"gluon", DQ 0) dK and dV alone, then dQ by ``attention_varlen_dq_kernel`` over the forward's query
tiles (seven matmuls a block, the fixed path's choice for short sequences).

Layout: q, dO (total_q, Hq, D), k, v (total_k, Hkv, D), each described by TMA as its (heads, total,
D) view (op.packed_operand): a box is ``rows`` rows of one head at any row offset. dK, dV (and
the split path's dQ) are packed like their inputs, contiguous. The fused dQ goes to a float32 (Hq,
total_q, D) buffer (zeroed by the preprocess) by TMA reductions; the row statistics (lse with -inf
as +inf, and delta) come from the preprocess's (Hq, 2, total_q padded to 16 bytes) buffer
(launch.backward_preprocess on the packed tensors seen as one batch of total_q rows).

Work items of the dK/dV kernel (op.work_table over the keys: cu_seqlens_k's sequences, tiles of
TILE_N = 2 BLOCK_N keys): (sequence, key tile, kv head). Sequences come longest first (by N x Nk), a
sequence's tiles kv head by kv head, a head's key tiles from the first (the heaviest, causal);
programs draw them from a counter. A tile is TILE_N keys of one (sequence, kv head) counted from the
sequence's first key; each consumer owns BLOCK_N of them and keeps their dK and dV in registers. Its
steps are the query blocks of BLOCK_M rows that see one of its keys, for each q head of the kv head's
group, in the fixed kernel's walk (``step_rows``). Query blocks start at packed rows that are
multiples of 4 (the first at q0 - q0 % 4, taking up to 3 of the previous sequence's rows, masked):
a TMA box's innermost coordinate must be 16-byte aligned (else the H100 faults with an illegal
instruction), and the lse / delta box's innermost coordinate is the row.

Masks, per sequence (local positions, the causal diagonal and the window aligned to the bottom right
as op.py defines them): keys past Nk and queries before 0 or past N (a box's rows outside a
sequence are its neighbours': their scores are -inf, so P = 0 and dS = 0) and, causal or with a window, keys
outside a query's range. dK and dV of a consumer's rows go by one TMA store when all BLOCK_N are the
sequence's, else by a masked register store (its own rows only): no other sequence's rows are ever
written. The fused dQ's reductions of a last query block add exact zeros to the next sequence's
first rows (their dS is 0). The dQ kernel (``VarlenDQ``) takes the forward's tiles (2 BLOCK_M rows
counted from a sequence's last row), reads lse +inf for rows not its own, and stores its own rows.

Non-finite values next door: a box reads the next sequence's rows, and an inf or NaN there times a
P or dS of 0 is NaN, which would reach this sequence's gradients. ``ZERO_TAIL`` (config zero_tail,
configs.VARLEN_GLUON_BACKWARD_ZERO_TAIL) zeroes them in shared memory: a tile's K and V rows past Nk
once (each consumer its own rows), a step's Q and dO rows past N (lse +inf, delta 0, their dS and the
fused dQ's rows set to 0: the reductions then add exact zeros next door even where this sequence's
own K, V or dO holds an inf or NaN) in a sequence's last query block; the dQ kernel's K and V rows past Nk in a last key block (its own rows' lse and
delta are read by pointer, its Q / dO rows not its own get p = 0 and are never stored, but their
dQ rows are not this sequence's). Off until a GPU run checks it; finite inputs are never affected.
"""

from triton.experimental import gluon

from tilecore.ops.attention_backward.gluon_backward import AttentionBackward, QStage, ds_layout
from tilecore.ops.attention_backward.gluon_dq import AttentionDQ, Gradient
from tilecore.ops.attention.gluon_kernels import tanh_approx, tanh_from_exp2
from tilecore.ops.attention_varlen.gluon_forward import KV, VarlenAttention
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, struct, wgmma_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
# config zero_tail -> the kernel's ZERO_TAIL: off, every sequence, or the sequences whose neighbour rows a box
# reads hold an inf / NaN ("checked": op.neighbour_rows_nonfinite's flags, one pass over those rows)
ZERO_TAIL_MODES = {False: 0, True: 1, "checked": 2}


@gluon.jit
def store_sequence_rows(x, desc, out_smem, ptr, row_stride, head, row0, first, end):
    """x's rows as rows first .. first + R - 1 (local to a sequence whose first packed row is ``row0``) of head
    ``head`` of a packed (total, heads, D) tensor at ``ptr`` (``desc``: its (heads, total, D) view): one TMA
    store through ``out_smem`` when all are before ``end`` (the sequence's rows, or the tile's), else a masked
    store of those that are (none: nothing), so no other sequence's rows are written (dK, dV, the dq kernel's
    dQ). The TMA store is written out, not ``store_block``: its row's sum would come before the store wait."""
    ROWS: gl.constexpr = x.shape[0]
    D: gl.constexpr = x.shape[1]
    if first + ROWS <= end:
        tma.store_wait(0)  # the buffer's previous TMA store has read it
        out_smem.reshape([ROWS, D]).store(x.to(out_smem.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(desc, [head, row0 + first, 0], out_smem)
    elif first < end:
        layout: gl.constexpr = x.type.layout
        rows = first + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
        at = gl.expand_dims((row0 + rows).to(gl.int64) * row_stride + head * D, 1) + gl.expand_dims(cols, 0)
        ok = gl.expand_dims(rows < end, 1) & gl.expand_dims(cols < D, 0)
        gl.store(ptr + at, x.to(out_smem.dtype), mask=ok)


@struct
class VarlenKeyTile:
    """A work item: its first key (local to the sequence), kv head, first query block, query blocks
    per q head, where its walk starts (step_rows), the q head its walk starts at, 1 / group size, its
    sequence's first packed query and key rows and lengths, and ``r``: q0 % 4, the rows of the
    previous sequence before its first query block's first own row (query blocks start at packed rows
    that are multiples of 4: the side buffer's TMA box is 16-byte aligned only there)."""
    start_n: object
    hk: object
    first_mb: object
    per_head: object
    shift: object
    head0: object
    inv_group: object
    q0: object
    k0: object
    N: object
    Nk: object
    r: object
    zero: object  # ZERO_TAIL: whether this tile zeroes the neighbours' rows (2: where tail_flags marks its sequence)


@struct
class VarlenBackward:
    # AttentionBackward over the (heads, total, D) views (q_desc's box [1, BM, D], k_desc's [1, 2 BN, D]: both
    # consumers' keys, dk_desc's [1, BN, D], stats_desc's [1, 2, BM] of the (Hq, 2, total_q) row statistics, dq_desc's
    # [1, BM, D / 2] of the float32 (Hq, total_q, D) dQ; its H, N, Nk, num_bhk and head_group unused: None): the step
    # (step_with), its sizes, modes, dS buffers and dQ staging, the masks' options
    base: object
    dk_ptr: object  # dK and dV, for the masked stores of a sequence's last keys
    dv_ptr: object
    kv_row_stride: object
    cu_q: object
    cu_k: object
    work: object  # (tiles, 4) int32: sequence (-1: none), key tile, kv head, unused
    tail_flags: object  # ZERO_TAIL 2: (sequences,) int32, nonzero where a box reads a non-finite neighbour row
    ZERO_TAIL: gl.constexpr  # zero the next sequence's rows in shared memory (zero_rows_outside): 0 never,
    # 1 every sequence, 2 the sequences tail_flags marks (op.neighbour_rows_nonfinite)

    @gluon.jit
    def setup(self, tile_id):
        """The work item and its steps: every query block of the sequence that sees one of its keys,
        for each q head of the group (none for entries past the real ones: N = Nk = 0)."""
        TILE_N: gl.constexpr = 2 * self.base.BN
        entry = self.work + tile_id.to(gl.int64) * 4
        seq = gl.load(entry)
        key_block = gl.load(entry + 1)
        hk = gl.load(entry + 2)
        real = seq >= 0
        b = gl.maximum(seq, 0)
        q0 = gl.load(self.cu_q + b)
        k0 = gl.load(self.cu_k + b)
        N = gl.where(real, gl.load(self.cu_q + b + 1) - q0, 0)
        Nk = gl.where(real, gl.load(self.cu_k + b + 1) - k0, 0)
        start_n = key_block * TILE_N
        # query block m holds local rows m BM - r .. m BM - r + BM - 1: its packed first row q0 - r + m BM is a
        # multiple of 4, so its lse / delta box starts 16-byte aligned (TMA's rule for the innermost coordinate)
        r = q0 % 4
        first_mb = 0
        if self.base.CAUSAL:  # query i sees keys j <= i + Nk - N: the first query that sees key start_n
            first_mb = (gl.maximum(start_n - (Nk - N), 0) + r) // self.base.BM
        if self.base.WINDOW:  # from the first query block that sees start_n to the last that sees the tile's last key
            first_mb = (gl.maximum(start_n - (Nk - N) - self.base.right, 0) + r) // self.base.BM
            last_key = gl.minimum(start_n + TILE_N, Nk) - 1
            last_row = gl.minimum(N - 1, last_key - (Nk - N) + self.base.left)
            per_head = gl.where(last_row >= 0, gl.maximum(gl.cdiv(last_row + 1 + r, self.base.BM) - first_mb, 0), 0)
        else:
            per_head = gl.where(N > 0, gl.maximum(gl.cdiv(N + r, self.base.BM) - first_mb, 0), 0)
        shift = key_block % gl.maximum(per_head, 1)
        zero = real
        if self.ZERO_TAIL == 2:  # only where a neighbour's row a box reads holds an inf or NaN
            zero = real & (gl.load(self.tail_flags + b) != 0)
        tile = VarlenKeyTile(start_n, hk, first_mb, per_head, shift, key_block % self.base.GROUP,
                             1.0 / self.base.GROUP, q0, k0, N, Nk, r, zero)
        return tile, per_head * self.base.GROUP

    @gluon.jit
    def step_rows(self, tile, step):
        """The step's (q head, first query row local to the sequence: -r for the first block), in the
        fixed kernel's walk (gluon_backward.AttentionBackward.step_rows): one q head a kv head, the
        tiles of a head start at different query blocks (their dQ reductions add to different rows);
        grouped heads, every tile walks the blocks from the last down and at each block the group's q
        heads."""
        if self.base.GROUP == 1:
            head = step * 0
            walked = step + tile.shift
            block = tile.first_mb + gl.where(walked >= tile.per_head, walked - tile.per_head, walked)
        else:
            group = self.base.GROUP
            walked = (step.to(gl.float32) * tile.inv_group).to(gl.int32)  # step // group, or one off
            head = step - walked * group
            walked = gl.where(head >= group, walked + 1, gl.where(head < 0, walked - 1, walked))
            head = step - walked * group + tile.head0
            head = gl.where(head >= group, head - group, head)
            block = tile.first_mb + tile.per_head - 1 - walked
        return tile.hk * self.base.GROUP + head, block * self.base.BM - tile.r

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """The step's Q and dO blocks and its rows' lse and delta (rows before the sequence's first and
        past its end: the neighbours', masked; past the packed end: zeros)."""
        h, start_m = self.step_rows(tile, step)
        row = tile.q0 + start_m
        tma.async_copy_global_to_shared(self.base.q_desc, [h, row, 0], bar, stage.q)
        tma.async_copy_global_to_shared(self.base.do_desc, [h, row, 0], bar, stage.do)
        tma.async_copy_global_to_shared(self.base.stats_desc, [h, 0, row], bar, stage.stats)

    @gluon.jit
    def load_tile(self, kv_smem, bar, tile, consumer):
        """The tile's K and V blocks (keys past Nk: the next sequence's, masked)."""
        tma.async_copy_global_to_shared(self.base.k_desc, [tile.hk, tile.k0 + tile.start_n, 0], bar, kv_smem.index(0))
        tma.async_copy_global_to_shared(self.base.v_desc, [tile.hk, tile.k0 + tile.start_n, 0], bar, kv_smem.index(1))

    @gluon.jit
    def start(self, ctx, tile, prev):
        if self.ZERO_TAIL:  # this consumer's K and V rows past Nk (the next sequence's) set to 0, once a tile
            keep = tile.Nk - (tile.start_n + ctx.index * self.base.BN)
            zero_now = keep < self.base.BN
            if self.ZERO_TAIL == 2:  # only the sequences whose neighbour rows hold an inf / NaN
                zero_now = zero_now & tile.zero
            if zero_now:
                for j in gl.static_range(2):
                    rows = ctx.operand.index(j).reshape([2 * self.base.BN, self.base.D]).slice(
                        ctx.index * self.base.BN, self.base.BN)
                    self.zero_rows_outside(rows, 0, keep)
        return self.base.start(ctx, tile, prev)

    @gluon.jit
    def zero_rows_outside(self, smem, lo, hi):
        """Rows outside [lo, hi) of a [rows, D] shared buffer set to 0 (the neighbours': their P and dS
        are 0, but 0 times an inf or NaN there is NaN). Where both consumers do it to one stage, each
        writes the rows it keeps unchanged and zeros elsewhere: whatever order their stores land in,
        every row a wgmma reads is the kept value or 0 (gluon_forward.VarlenAttention.zero_rows_from)."""
        ROWS: gl.constexpr = smem.shape[0]
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        x = smem.load(layout)
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        smem.store(gl.where(gl.expand_dims((rows >= lo) & (rows < hi), 1), x, gl.zeros_like(x)))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def zero_stats_outside(self, stats_smem, lo, hi):
        """The step's rows outside [lo, hi) (the neighbours') get lse +inf and delta 0 in the side
        buffer: a neighbour's NaN lse would make their masked p NaN."""
        BM: gl.constexpr = stats_smem.shape[2]
        flat = stats_smem._reinterpret(gl.float32, [2 * BM], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        x = flat.load(layout)
        at = gl.arange(0, 2 * BM, layout=layout)
        row = gl.where(at < BM, at, at - BM)
        fill = gl.where(at < BM, float("inf"), 0.0)
        flat.store(gl.where((row >= lo) & (row < hi), x, fill))
        gl.thread_barrier()

    @gluon.jit
    def probabilities(self, s_t, lse, start_n, start_m, tile):
        """P^T (keys x queries, keys from start_n, queries from start_m, local to the tile's sequence of N
        queries and Nk keys) from S^T and the rows' lse as its columns, and (SOFTCAP) the cap's
        derivative (1.0 otherwise). Masked where a key is past Nk, a query before 0 or past N, or
        (causal, window) a key outside the query's range: only in blocks that have such a score."""
        N = tile.N
        Nk = tile.Nk
        st_layout: gl.constexpr = s_t.type.layout
        BN: gl.constexpr = s_t.shape[0]
        if self.base.SOFTCAP:
            if self.base.SOFTCAP == 2:
                s_t = tanh_approx(s_t * self.base.tanh_scale)
            else:
                s_t = tanh_from_exp2(s_t * self.base.tanh_scale)
        shift = Nk - N
        if self.base.WINDOW:
            masked = (start_n + BN - 1 > gl.minimum(start_m + shift + self.base.right, Nk - 1)) \
                | (start_n < start_m + self.base.BM - 1 + shift - self.base.left)
        else:
            bound = Nk
            if self.base.CAUSAL:
                bound = gl.minimum(bound, start_m + 1 + shift)  # the first query's last key + 1
            masked = start_n + BN > bound
        if masked | (start_m < 0) | (start_m + self.base.BM > N):
            # a key's queries are a range [lo, hi) (two compares a score, its bounds one a key row): 0 <= query < N,
            # causal: query >= key - shift; a window: key - shift - right <= query <= key - shift + left; a key
            # past Nk none (the per-score form of the five conditions kept ~16 more registers live: spills)
            keys = start_n + gl.arange(0, BN, layout=gl.SliceLayout(1, st_layout))
            queries = gl.expand_dims(start_m + gl.arange(0, self.base.BM, layout=gl.SliceLayout(0, st_layout)), 0)
            lo = keys * 0
            hi = N
            if self.base.CAUSAL:
                lo = gl.maximum(keys - shift, 0)
            if self.base.WINDOW:
                lo = gl.maximum(keys - (shift + self.base.right), 0)
                hi = gl.expand_dims(gl.minimum(keys - (shift - self.base.left) + 1, N), 1)
            lo = gl.where(keys < Nk, lo, N)
            ok = (queries >= gl.expand_dims(lo, 1)) & (queries < hi)
            s_t = gl.where(ok, s_t, float("-inf"))
        p_t = gl.exp2(s_t * self.base.scale_log2e - gl.expand_dims(lse * LOG2E, 0))
        dtanh = 1.0
        if self.base.SOFTCAP:  # a masked score's -inf gives min(inf, 1): a factor 0, not NaN
            dtanh = (1.0 - gl.minimum(s_t * s_t, 1.0)).to(gl.float16)
        return p_t, dtanh

    @gluon.jit
    def add_dq(self, ctx, tile, step, dq):
        """Add scale * dq (this consumer's half of the columns of the step's rows) to the float32 dQ
        (rows past the packed end dropped by the TMA reduction)."""
        h, start_m = self.step_rows(tile, step)
        if self.ZERO_TAIL:  # the neighbours' rows: their dS 0, but 0 times an inf in K is NaN
            if (start_m < 0) | (start_m + self.base.BM > tile.N):
                rows = start_m + gl.arange(0, self.base.BM, layout=gl.SliceLayout(1, dq.type.layout))
                dq = gl.where(gl.expand_dims((rows >= 0) & (rows < tile.N), 1), dq, 0.0)
        self.base.reduce_dq(self.base.dq_staging.index(ctx.index), dq,
                            [h, tile.q0 + start_m, ctx.index * (self.base.D // 2)], 0)

    @gluon.jit
    def before_products(self, ctx, stage, tile, start_m):
        """ZERO_TAIL: the step's rows before 0 or past N (the neighbours'): Q, dO 0, lse +inf, delta 0."""
        if self.ZERO_TAIL:
            zero_now = (start_m < 0) | (start_m + self.base.BM > tile.N)
            if self.ZERO_TAIL == 2:
                zero_now = zero_now & tile.zero
            if zero_now:
                self.zero_stats_outside(stage.stats, -start_m, tile.N - start_m)
                self.zero_rows_outside(stage.q.reshape([self.base.BM, self.base.D]), -start_m, tile.N - start_m)
                self.zero_rows_outside(stage.do.reshape([self.base.BM, self.base.D]), -start_m, tile.N - start_m)

    @gluon.jit
    def step_ds(self, ds_t, start_m, tile):
        """ZERO_TAIL: the neighbours' queries get dS exactly 0 (0 times this sequence's own inf in dP^T is NaN,
        which a dQ reduced in the kernel would add to their rows; with dQ after the kernel (DQ 0) nothing is
        added next door: ZERO_TAIL 2 leaves it out there)."""
        if self.ZERO_TAIL and ((self.base.DQ != 0) or (self.ZERO_TAIL == 1)):
            if (start_m < 0) | (start_m + self.base.BM > tile.N):
                queries = start_m + gl.arange(0, self.base.BM, layout=gl.SliceLayout(0, ds_t.type.layout))
                ds_t = gl.where(gl.expand_dims((queries >= 0) & (queries < tile.N), 0), ds_t, 0.0)
        return ds_t

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """One step, dQ after the kernel (DQ 0: attention_varlen_dq_kernel), fused (DQ 1: this step's,
        once both consumers wrote their dS) or lagged (DQ 3: the previous step's, issued with this
        step's dV and dK): gluon_backward.AttentionBackward.compute with the sequence's lengths in the masks
        (``probabilities``), its first query row in dQ's coordinates (``add_dq``) and ZERO_TAIL's zeroing
        (``before_products``, ``step_ds``)."""
        return self.base.step_with(self, ctx, st, stage, tile, step)

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def finish(self, ctx, st, tile):
        """dV, then dK (times the scale) of this consumer's keys that are the sequence's."""
        start_n = tile.start_n + ctx.index * self.base.BN
        store_sequence_rows(st.dv, self.base.dv_desc, ctx.out, self.dv_ptr, self.kv_row_stride, tile.hk, tile.k0,
                            start_n, tile.Nk)
        store_sequence_rows(st.dk * self.base.scale, self.base.dk_desc, ctx.out, self.dk_ptr, self.kv_row_stride,
                            tile.hk, tile.k0, start_n, tile.Nk)


@gluon.jit
def attention_varlen_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, dk_ptr,
                                dv_ptr, kv_row_stride, cu_q, cu_k, work, num_tiles, GROUP, scale, scale_log2e, left,
                                right, tanh_scale, tile_counter, tail_flags, CAUSAL: gl.constexpr,
                                STAGES: gl.constexpr, DQ: gl.constexpr, KV_REGS: gl.constexpr = False,
                                WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = 0, ZERO_TAIL: gl.constexpr = 0):
    """dK, dV and (added to dq_desc's float32 tensor) dQ of packed attention for every work item
    (op.work_table over the keys); a persistent grid of 2 consumer warpgroups of 4 warps and a
    producer warp drawing its tiles from ``tile_counter`` (None: program p takes tiles p, p + P, ...).
    WINDOW (not with CAUSAL: folded in) and SOFTCAP as the fixed kernel's; ZERO_TAIL: the next
    sequence's rows a box reads are zeroed in shared memory (an inf or NaN there stays there): 1 in every
    sequence, 2 in those ``tail_flags`` (int32 a sequence; None otherwise) marks."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    gl.static_assert(DQ == 0 or DQ == 1 or DQ == 3, "dQ after the kernel (0), fused (1) or lagged (3)")
    BM: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = dk_desc.block_type.shape[1]  # one consumer's keys; k_desc's block holds both
    D: gl.constexpr = q_desc.block_type.shape[2]
    gl.static_assert(k_desc.block_type.shape[1] == 2 * BN, "K and V blocks hold both consumers' keys")
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 2 * BN, BM], ds_layout(q_desc.dtype))
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(ds_full.index(j), count=2)
        mbarrier.init(ds_free.index(j), count=2)
    dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape, dq_desc.layout)
    base = AttentionBackward(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, None, None, None,
                             GROUP, scale, scale_log2e, None, None, ds_smem, ds_full, ds_free, dq_staging, left, right,
                             tanh_scale, CAUSAL, BM, BN, D, DQ, KV_REGS, WINDOW, SOFTCAP, False)
    op = VarlenBackward(base, dk_ptr, dv_ptr, kv_row_stride, cu_q, cu_k, work, tail_flags, ZERO_TAIL)
    layout = Layout(dk_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0,
                    tile_operand=TileOperand(k_desc, COUNT=2, SHARED=True), tile_counter=tile_counter)
    stages = QStage(ring(q_desc, STAGES), ring(stats_desc, STAGES), ring(do_desc, STAGES))
    run(op, layout, stages, num_tiles)
    for j in gl.static_range(2):
        mbarrier.invalidate(ds_full.index(j))
        mbarrier.invalidate(ds_free.index(j))


# --------------------------------------------------------------------------------------------
# dQ after the dK/dV kernel (DQ 0; the fixed path's "gluon" dq_from, faster for short sequences there)


@struct
class VarlenDQ:
    """dQ of packed attention over the forward's work items (op.work_table over the queries): a
    tile is 2 BLOCK_M query rows of one (sequence, q head) counted from the sequence's last row, the
    ring streams its sequence's K and V blocks, each consumer owns BLOCK_M rows (gluon_dq.AttentionDQ's
    step: S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K). Rows past the tile's own (the next
    tile's, or the next sequence's) read lse +inf: their p, dS and dQ are 0, and they are never stored."""
    q_desc: object  # [1, 2 BM, D]: both consumers' rows (the tile operand)
    do_desc: object
    k_desc: object  # [1, BN, D]
    v_desc: object
    dq_desc: object  # [1, BM, D]: one consumer's rows
    dq_ptr: object
    dq_row_stride: object
    lse: object  # (Hq, total_q) float32, natural log
    delta: object  # (Hq, total_q) float32
    total_q: object
    cu_q: object
    cu_k: object
    work: object
    GROUP: object
    scale: object
    scale_log2e: object
    left: object
    right: object
    tanh_scale: object
    CAUSAL: gl.constexpr
    BM: gl.constexpr
    BN: gl.constexpr
    D: gl.constexpr
    CONSUMERS: gl.constexpr
    WINDOW: gl.constexpr
    SOFTCAP: gl.constexpr
    ZERO_TAIL: gl.constexpr  # the next sequence's K / V rows in a last key block zeroed (VarlenBackward's)

    @gluon.jit
    def setup(self, tile_id):
        """The forward's work item (gluon_forward.VarlenAttention.setup): its rows and key blocks; a step
        per key block (no extra step: no P V to finish)."""
        rows, steps = VarlenAttention.setup(self, tile_id)
        return rows, rows.n_blocks

    @gluon.jit
    def load(self, stage, bar, tile, step):
        hk = tile.h // self.GROUP
        key = tile.k0 + (tile.first_block + step) * self.BN
        tma.async_copy_global_to_shared(self.k_desc, [hk, key, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.v_desc, [hk, key, 0], bar, stage.v)

    @gluon.jit
    def load_tile(self, bufs, bar, tile, consumer):
        """Both consumers' rows of Q and of dO."""
        tma.async_copy_global_to_shared(self.q_desc, [tile.h, tile.q0 + tile.first, 0], bar, bufs.index(0))
        tma.async_copy_global_to_shared(self.do_desc, [tile.h, tile.q0 + tile.first, 0], bar, bufs.index(1))

    @gluon.jit
    def start(self, ctx, tile, prev):
        """dQ = 0, this consumer's own rows' lse and delta (+inf and 0 elsewhere), and its steps (causal:
        up to its rows' diagonal; a window: gluon_forward.VarlenAttention.start's; none without own rows)."""
        s_layout: gl.constexpr = wgmma_layout(self.BM, self.BN, gl.num_warps())
        first = tile.first + ctx.index * self.BM
        rows = first + gl.arange(0, self.BM, layout=gl.SliceLayout(1, s_layout))
        own = rows < tile.end
        offs = tile.h.to(gl.int64) * self.total_q + tile.q0 + rows
        lse = gl.load(self.lse + offs, mask=own, other=float("inf"))
        lse = gl.where(lse == float("-inf"), float("inf"), lse)
        delta = gl.load(self.delta + offs, mask=own, other=0.0)
        n_own = tile.n_blocks
        own_first = n_own * 0
        if self.CAUSAL:
            own_hi = gl.maximum(gl.minimum(tile.Nk, first + self.BM + (tile.Nk - tile.N)), 0)
            n_own = gl.minimum(gl.cdiv(own_hi, self.BN), tile.n_blocks)
        if self.WINDOW:
            shift = tile.Nk - tile.N
            own_lo = gl.maximum(first + shift - self.left, 0) // self.BN - tile.first_block
            own_hi = gl.maximum(gl.minimum(tile.Nk, gl.minimum(first + self.BM, tile.N) - 1 + shift + self.right + 1),
                                0)
            own_first = gl.maximum(own_lo, 0)
            n_own = gl.minimum(gl.cdiv(own_hi, self.BN) - tile.first_block, tile.n_blocks)
        n_own = gl.where(first < tile.end, n_own, 0)
        dq = gl.zeros([self.BM, self.D], gl.float32, wgmma_layout(self.BM, self.D, gl.num_warps()))
        return Gradient(dq, lse * LOG2E, delta, first, n_own, own_first)

    @gluon.jit
    def lengths(self, tile):
        """(N, Nk) of the tile's sequence (AttentionDQ.ds_operand's masks)."""
        return tile.N, tile.Nk

    @gluon.jit
    def before_products(self, ctx, stage, tile, step):
        """ZERO_TAIL: the next sequence's K / V rows of a last key block zeroed (both consumers may: each writes
        the kept rows unchanged, zeros elsewhere)."""
        if self.ZERO_TAIL:
            keep = tile.Nk - (tile.first_block + step) * self.BN
            if keep < self.BN:
                VarlenBackward.zero_rows_outside(self, stage.k.reshape([self.BN, self.D]), 0, keep)
                VarlenBackward.zero_rows_outside(self, stage.v.reshape([self.BN, self.D]), 0, keep)

    @gluon.jit
    def ds_operand(self, s, dp, st, tile, step):
        return AttentionDQ.ds_operand(self, s, dp, st, tile, step)

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """gluon_dq.AttentionDQ's step, with the sequence's lengths in the masks (``lengths``)."""
        return AttentionDQ.compute(self, ctx, st, stage, tile, step)

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def finish(self, ctx, st, tile):
        """dQ * scale of this consumer's own rows: one TMA store when all BLOCK_M are, else a masked store."""
        store_sequence_rows(st.dq * self.scale, self.dq_desc, ctx.out, self.dq_ptr, self.dq_row_stride, tile.h,
                            tile.q0, st.first, tile.end)


@gluon.jit
def attention_varlen_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, dq_ptr, dq_row_stride, lse_ptr, delta_ptr,
                               total_q, cu_q, cu_k, work, num_tiles, GROUP, scale, scale_log2e, left, right,
                               tanh_scale, tile_counter, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                               WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = 0,
                               ZERO_TAIL: gl.constexpr = False):
    """dQ of packed attention for every work item of the forward's table (2 BLOCK_M query rows of a
    (sequence, q head)); a persistent grid of 2 consumer warpgroups and a producer warp drawing tiles
    from ``tile_counter`` (None: round-robin). q_desc / do_desc: both consumers' rows, dq_desc one's."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    BM: gl.constexpr = dq_desc.block_type.shape[1]
    gl.static_assert(q_desc.block_type.shape[1] == 2 * BM, "a tile is both consumers' query rows")
    op = VarlenDQ(q_desc, do_desc, k_desc, v_desc, dq_desc, dq_ptr, dq_row_stride, lse_ptr, delta_ptr, total_q, cu_q,
                  cu_k, work, GROUP, scale, scale_log2e, left, right, tanh_scale, CAUSAL, BM,
                  k_desc.block_type.shape[1], k_desc.block_type.shape[2], 2, WINDOW, SOFTCAP, ZERO_TAIL)
    layout = Layout(dq_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0,
                    tile_operand=TileOperand(q_desc, COUNT=2, SHARED=True), tile_counter=tile_counter)
    run(op, layout, KV(ring(k_desc, STAGES), ring(v_desc, STAGES)), num_tiles)


def compiled_backward(d: int = 128, causal: bool = True, softcap: int = 0, dtype=None, cfg: dict | None = None,
                      window: bool = False, group: int = 1):
    """The kernel compiled for sm_90a without a GPU (TRITON_INTERPRET unset), with the arguments
    op.backward_gluon passes (packed (total, heads, D) tensors of 4096 rows, 16 q heads)."""
    import torch

    from tilecore.ops.attention import configs as fixed_configs
    from tilecore.ops.attention.launch import row_stats_operand
    from tilecore.ops.attention_varlen import configs
    from tilecore.tiles.compile import compile_kernel
    from tilecore.tiles.launch import TmaOperand

    dtype = dtype or torch.bfloat16
    cfg = dict(cfg or configs.varlen_gluon_backward_config(d, causal))
    bm, bn = cfg["block_m"], cfg["block_n"]
    x = torch.empty(4096, 16, d, dtype=dtype)
    kv = torch.empty(4096, 16 // group, d, dtype=dtype)
    desc = lambda t, rows: TmaOperand(t.transpose(0, 1), [1, rows, d]).descriptor()  # noqa: E731
    stats = torch.empty(16, 2, 4096)
    dq_sum = torch.empty(16, 4096, d)
    i32 = torch.empty(64, dtype=torch.int32)
    args = dict(q_desc=desc(x, bm), k_desc=desc(kv, 2 * bn), v_desc=desc(kv, 2 * bn), do_desc=desc(x, bm),
                dk_desc=desc(kv, bn), dv_desc=desc(kv, bn), stats_desc=row_stats_operand(stats, bm).descriptor(),
                dq_desc=TmaOperand(dq_sum, [1, bm, d // 2]).descriptor(), dk_ptr=kv, dv_ptr=kv,
                kv_row_stride=kv.stride(0), cu_q=i32, cu_k=i32, work=i32, num_tiles=4096, GROUP=group, scale=0.1,
                scale_log2e=0.1, left=1000, right=0, tanh_scale=0.1, tile_counter=torch.zeros(1, dtype=torch.int32),
                tail_flags=i32 if cfg.get("zero_tail") == "checked" else None,
                CAUSAL=causal and not window, STAGES=cfg["stages"], DQ=fixed_configs.DQ_MODES[cfg["dq_from"]],
                KV_REGS=cfg.get("kv_regs", False), WINDOW=window, SOFTCAP=softcap,
                ZERO_TAIL=ZERO_TAIL_MODES[cfg.get("zero_tail", False)])
    return compile_kernel(attention_varlen_bwd_kernel, args, num_warps=4)


def compiled_dq(d: int = 128, causal: bool = True, softcap: int = 0, dtype=None, window: bool = False,
                group: int = 1, zero_tail: bool = False, stages: int | None = None):
    """attention_varlen_dq_kernel compiled for sm_90a without a GPU, with the arguments
    op.backward_gluon passes (configs.GLUON_DQ's blocks and ring unless ``stages``)."""
    import torch

    from tilecore.ops.attention import configs as fixed_configs
    from tilecore.tiles.compile import compile_kernel
    from tilecore.tiles.launch import TmaOperand

    dtype = dtype or torch.bfloat16
    cfg = fixed_configs.GLUON_DQ[d]
    bm, bn = cfg["block_m"], cfg["block_n"]
    x = torch.empty(4096, 16, d, dtype=dtype)
    kv = torch.empty(4096, 16 // group, d, dtype=dtype)
    desc = lambda t, rows: TmaOperand(t.transpose(0, 1), [1, rows, d]).descriptor()  # noqa: E731
    i32 = torch.empty(64, dtype=torch.int32)
    f32 = torch.empty(64)
    args = dict(q_desc=desc(x, 2 * bm), k_desc=desc(kv, bn), v_desc=desc(kv, bn), do_desc=desc(x, 2 * bm),
                dq_desc=desc(x, bm), dq_ptr=x, dq_row_stride=x.stride(0), lse_ptr=f32, delta_ptr=f32, total_q=4096,
                cu_q=i32, cu_k=i32, work=i32, num_tiles=4096, GROUP=group, scale=0.1, scale_log2e=0.1, left=1000,
                right=0, tanh_scale=0.1, tile_counter=torch.zeros(1, dtype=torch.int32), CAUSAL=causal and not window,
                STAGES=stages or cfg["stages"], WINDOW=window, SOFTCAP=softcap, ZERO_TAIL=zero_tail)
    return compile_kernel(attention_varlen_dq_kernel, args, num_warps=4)


def report(cases=((128, True, 0, False, 1), (128, False, 0, False, 1), (128, True, 0, False, 4),
                  (64, True, 0, False, 1), (128, True, 2, False, 1), (128, False, 0, True, 1)),
           dq: bool = True, dq_modes=(None,)) -> list[dict]:
    """Resources and Hopper instructions of the compiled kernels (the dK/dV kernel with its config's dQ, or
    each of ``dq_modes`` (None: the config's), and with ``dq`` the dQ kernel) for (D, causal, SOFTCAP, WINDOW,
    GROUP) cases."""
    from tilecore.ops.attention_varlen import configs
    from tilecore.tiles.compile import has_hopper_instructions, resources

    rows = []
    for d, causal, softcap, window, group in cases:
        for kernel in [("dkdv", mode) for mode in dq_modes] + ([("dq", None)] if dq else []):
            name, mode = kernel
            if name == "dkdv":
                cfg = dict(configs.varlen_gluon_backward_config(d, causal), **({"dq_from": mode} if mode else {}))
                compiled = compiled_backward(d, causal, softcap, cfg=cfg, window=window, group=group)
            else:
                cfg = None
                compiled = compiled_dq(d, causal, softcap, window=window, group=group)
            rows.append(dict(kernel=name, dq_from=cfg and cfg["dq_from"], D=d, causal=causal, softcap=softcap,
                             window=window, group=group, **vars(resources(compiled)),
                             **has_hopper_instructions(compiled.asm["ptx"])))
    return rows


if __name__ == "__main__":  # python -m tilecore.ops.attention_varlen.gluon_backward [--quick] (TRITON_INTERPRET unset)
    import json
    import sys

    # --quick: D128 causal, the shipped config's dK/dV kernel and the fused dQ's
    print(json.dumps(report(((128, True, 0, False, 1),), dq=False, dq_modes=(None, "fused")) if "--quick" in sys.argv
                     else report()))

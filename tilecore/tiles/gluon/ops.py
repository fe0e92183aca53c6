"""Gluon tile ops: the vocabulary of Hopper kernels on the template (:mod:`.pipeline`), with ``tl``
twins of the same names and meaning in :mod:`tilecore.tiles.ops` (row_max, row_sum, exp2_scaled,
online_softmax_update, mask_scores, needs_mask) so that a kernel reads the same in both languages.

Register tiles here are in wgmma accumulator layouts (``wgmma_layout``); ``split_n``/``join_n`` move
between a tile and its column halves without moving data between threads.
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import builtin, fence_async_shared, gl, ir, tma

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.constexpr_function
def wgmma_layout(block_m, block_n, num_warps, in_bits=16):
    """The accumulator layout of a [block_m, block_n] wgmma tile over ``num_warps`` warps, for
    operands of ``in_bits`` bits (an instruction's K is 256 / in_bits: 16 for bf16, 32 for fp8).

    Warpgroups (4 warps) stack along M first, each issuing m64 x n<=256 instructions.
    """
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if block_m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    n = 256
    while n > block_n // warps[1] or block_n % n:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 256 // in_bits])


@gluon.constexpr_function
def wgmma_lhs_layout(block_m, block_n, num_warps, in_bits=16):
    """The layout of a wgmma's register (left) operand, [block_m, k] of ``in_bits``-bit elements, for
    a [block_m, block_n] accumulator in ``wgmma_layout`` (attention's P of P V, or Q held in registers)."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(block_m, block_n, num_warps, in_bits),
                               k_width=32 // in_bits)


@gluon.jit
def split_n(x):
    """Split a [m, n] register tile into its left and right [m, n/2] halves (with the wgmma layout
    the high column bit is a register index, so no data moves between threads)."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, [M, 2, N // 2]), [0, 2, 1]))


@gluon.jit
def needs_mask(first_query, first_key, BLOCK_KEYS: gl.constexpr, N, Nk, CAUSAL: gl.constexpr):
    """Whether a block of scores, queries from ``first_query`` and ``BLOCK_KEYS`` keys from
    ``first_key``, has a masked score (see ``mask_scores``): a key past Nk, or (causal) a key after
    the first query's diagonal."""
    bound = Nk
    if CAUSAL:
        bound = gl.minimum(bound, first_query + 1 + (Nk - N))  # the first query's last key + 1
    return first_key + BLOCK_KEYS > bound


@gluon.jit
def opaque_int(x):
    """The int32 ``x`` through an instruction the compiler can neither see through nor move, so that
    what is computed from it stays where it is written. For a mask whose key offset is a constant
    (a tile's first key block): LLVM hoisted its comparisons (64 a thread) to the tile's start, kept
    them live through the tile as packed predicates, and turned the masking branch into selects run
    at every first step (notes/attention/README.md)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def mask_scores(s, layout: gl.constexpr, first_query, first_key, N, Nk, CAUSAL: gl.constexpr,
                KEY_AXIS: gl.constexpr):
    """The scores s (in ``layout``; keys along ``KEY_AXIS``: 1 for [queries, keys], 0 for the
    transposed [keys, queries]) with -inf where the key is past Nk or, causal, after the query's
    diagonal: aligned to the bottom right, query i sees keys j <= i + Nk - N."""
    QUERY_AXIS: gl.constexpr = 1 - KEY_AXIS
    keys = gl.expand_dims(first_key + gl.arange(0, s.shape[KEY_AXIS], layout=gl.SliceLayout(QUERY_AXIS, layout)),
                          QUERY_AXIS)
    ok = keys < Nk
    if CAUSAL:
        queries = gl.expand_dims(
            first_query + gl.arange(0, s.shape[QUERY_AXIS], layout=gl.SliceLayout(KEY_AXIS, layout)), KEY_AXIS)
        ok = ok & (keys <= queries + (Nk - N))
    return gl.where(ok, s, float("-inf"))


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile ``src`` to global memory at ``coord`` of ``tensor_desc`` with one
    TMA reduction (cp.reduce.async.bulk.tensor .add; out-of-bounds parts are dropped). Asynchronous
    like a TMA store: ``tma.store_wait`` before ``src`` is written again. (Gluon 3.6's hopper tma
    module wraps the copies but not the reduction; its op builder has it.)"""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def store_tile(x, out_desc, out_smem, off_m, off_n):
    """Epilogue store of a [m, n] register tile through ``out_smem`` (one slice of ``out_desc``'s
    block shape, [m, n / 2^s]) with TMA stores, slice by slice. Before each slice is written the
    previous TMA store (the last slice of the previous tile, the first time) must have read it."""
    SN: gl.constexpr = out_desc.block_type.shape[1]
    N: gl.constexpr = x.shape[1]
    if N == SN:
        tma.store_wait(0)
        out_smem.store(x.to(out_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [off_m, off_n], out_smem)
    else:
        lo, hi = split_n(x)
        store_tile(lo, out_desc, out_smem, off_m, off_n)
        store_tile(hi, out_desc, out_smem, off_m, off_n + N // 2)


@gluon.jit
def store_block(x, out_desc, out_smem, coord, scale=None):
    """A register tile (times ``scale`` where given) into ``out_desc``'s block at ``coord`` (any rank:
    the block holds x's elements) by one TMA store through ``out_smem``, once the previous TMA store
    from it has read it. The multiply comes after that wait (the backward's and dq's measured order).
    (As in ``store_tile``, the compiler's barrier analysis puts the bar.sync between the threads'
    shared stores and the TMA store: an explicit one compiled to the same PTX.)"""
    tma.store_wait(0)
    if scale is not None:
        x = x * scale
    out_smem.reshape(x.shape).store(x.to(out_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(out_desc, coord, out_smem)


@gluon.jit
def store_rows(x, ptr, vector, first_row, rows):
    """A per-row vector x [m] (in a row slice of a tile's layout) into entries first_row + i of the
    ``vector``-th vector of a [*, rows] float array at ``ptr`` (64-bit offsets), those from ``rows``
    on left out (a tile's lse: vector batch * head)."""
    offs = first_row + gl.arange(0, x.shape[0], layout=x.type.layout)
    gl.store(ptr + vector.to(gl.int64) * rows + offs, x, mask=offs < rows)


@gluon.jit
def as_column(x, layout: gl.constexpr):
    """A per-row vector x [m] as the column [m, 1] that broadcasts over a tile in ``layout``."""
    return gl.expand_dims(gl.convert_layout(x, gl.SliceLayout(1, layout)), 1)


@gluon.jit
def join_n(lo, hi):
    """The inverse of ``split_n``: [m, n/2] left and right halves back into one [m, n] tile."""
    M: gl.constexpr = lo.shape[0]
    N: gl.constexpr = 2 * lo.shape[1]
    return gl.reshape(gl.permute(gl.join(lo, hi), [0, 2, 1]), [M, N])


@gluon.jit
def row_max(x):
    """The max of each row of a [m, n] tile."""
    return gl.max(x, axis=1)


@gluon.jit
def row_sum(x):
    """The sum of each row of a [m, n] tile."""
    return gl.sum(x, axis=1)


@gluon.jit
def exp2_scaled(x, scale_log2e, row_shift):
    """exp2(x * scale_log2e - row_shift) for a [m, n] tile and a per-row shift (one FMA and one
    exp2 an element: the softmax scale folds into the exponent's multiply-add)."""
    return gl.exp2(x * scale_log2e - gl.expand_dims(row_shift, 1))


@gluon.jit
def online_softmax_start(ROWS: gl.constexpr, layout: gl.constexpr):
    """An online softmax's running row max and sum before any score, for the ROWS rows of a tile in
    ``layout``: m = -inf (see ``online_softmax_update``), l = 0."""
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    return gl.full([ROWS], float("-inf"), gl.float32, row_layout), gl.zeros([ROWS], gl.float32, row_layout)


@gluon.jit
def online_softmax_update(m_i, l_i, s, scale_log2e):
    """One online-softmax step on raw scores ``s`` (scale > 0, base 2): the new row max m (of the
    scaled scores), the new row sum l, the unnormalized probabilities P (float32), and alpha =
    exp2(m_old - m), the factor that rescales what was accumulated before (the ``tl`` twin also
    applies it to an accumulator; here the caller does, in the accumulator's layout, when it is
    done with the tensor cores). As the twin: m starts at -inf and masked scores are -inf; while a
    row's max is still -inf (exp2(-inf - -inf) would be NaN) the shift is -FLT_MAX, one max with m
    (the twin selects 0; both give P = exp2(-inf) = 0 and alpha = 0), so such a row keeps l = 0 and
    P = 0, and every finite m is its own shift; a NaN or +inf score makes its row's P and l NaN. A
    finite score whose scaled value overflows (m = +inf) makes its row NaN too, but at the end:
    ``online_softmax_result`` takes such a row's l for NaN (here exp2_scaled's FMA keeps s * c exact,
    so exp2(s * c - inf) = 0 where the twin's rounded s * c gives inf - inf; a max, once +inf, stays
    +inf). No select a step (a select cost the D64 three-consumer forward 2-5% on the H100, notes/tiles)."""
    m_new = gl.maximum(m_i, row_max(s) * scale_log2e)
    m_ref = gl.maximum(m_new, -3.4028234663852886e38)  # -inf -> -FLT_MAX: exp2(-inf + FLT_MAX) = 0
    p = exp2_scaled(s, scale_log2e, m_ref)
    alpha = gl.exp2(m_i - m_ref)
    return m_new, l_i * alpha + row_sum(p), p, alpha


@gluon.jit
def online_softmax_result(m, l, acc):
    """The rows' output acc / l and their lse (natural log: (m + log2 l) / log2 e) after the last
    online-softmax step: a row with no key (l = 0) gets 0 and -inf; a row whose l is NaN (a NaN or
    +inf score) NaN and NaN ("no key" is l == 0, not "not l > 0", which a NaN l passes too), and so
    does a row whose max m is +inf (a scaled score overflowed; see ``online_softmax_update``).
    The ``tl`` twin is ``tiles.ops.online_softmax_result``."""
    l = gl.where(m == float("inf"), float("nan"), l)
    no_key = l == 0.0
    l_safe = gl.where(no_key, 1.0, l)
    out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, acc.type.layout)), 1)
    return out, gl.where(no_key, float("-inf"), (m + gl.log2(l_safe)) / LOG2E)


@gluon.jit
def scale_rows(x, scale, first_row, rows, PER_ROW: gl.constexpr):
    """x [m, n] times a scale per row (``scale[first_row + i]``, 0 past ``rows``) or, without
    ``PER_ROW``, the scalar ``scale[0]`` (fp8 dequantization: A's per-token scales)."""
    if PER_ROW:
        offs = first_row + gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, x.type.layout))
        return x * gl.expand_dims(gl.load(scale + offs, mask=offs < rows, other=0.0), 1)
    else:
        return x * gl.load(scale)


@gluon.jit
def scale_cols(x, scale, first_col, cols, PER_COL: gl.constexpr):
    """x [m, n] times a scale per column (``scale[first_col + j]``, 0 past ``cols``) or the scalar
    ``scale[0]`` (fp8 dequantization: B's per-channel scales)."""
    if PER_COL:
        offs = first_col + gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, x.type.layout))
        return x * gl.expand_dims(gl.load(scale + offs, mask=offs < cols, other=0.0), 0)
    else:
        return x * gl.load(scale)


@gluon.jit
def add_cols(x, bias, first_col, cols):
    """x [m, n] plus a vector along its columns (``bias[first_col + j]`` in float32, 0 past ``cols``)."""
    offs = first_col + gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, x.type.layout))
    return x + gl.expand_dims(gl.load(bias + offs, mask=offs < cols, other=0.0).to(gl.float32), 0)

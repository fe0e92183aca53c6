"""hadamard_quantize's kernel for rows of n = m x p with a wide Hadamard order m > 64 (QuaRot's 108, 140,
148, 156, 172: Llama-2-7B's 11008 = 172 x 64, Qwen2-7B's 18944 = 148 x 128), issue 32.

Why a kernel of its own: quantize_kernels.rotate_quantize_kernel mixes the m sub-rows as one [M_PAD, Q]
tile, M_PAD the power of two >= m: at m = 172 that is H_256 X over 4 chunks of 64 columns of H, 256 x 256
multiply-adds a column where 172 x 172 are needed (2.2x the mixing's work), and the second product H_Q
runs on 256 sub-rows of which 172 are real (1.5x). The transform and every format ran at 9-25% of copy
there (H100), fp8 included: the work, not the epilogue.

Here a row's output sub-rows are NB = cdiv(m, MB) blocks of MB (64: 192 at m = 172) and the mixing's K
runs over NK = cdiv(m, KC) chunks of KC sub-rows (16: 176), so H_m X costs 192 x 176 a column (1.94x less
at 172) and H_Q 192 sub-rows (1.33x less):

    for each K chunk k:   V_t = X_t[k]                        (loaded once: [KC, Q] a slice t < S)
        for each block j: A_jt += H[j MB : j MB + MB, k] V_t  (tensor cores, float32 sums: exact for
                                                               16-bit inputs, as kernels_kron)
    Y_jt = A_jt H_Q (bf16 pieces, kernels_kron's accuracy design), then H_S over the S <= 2 slices

and each block quantizes as quantize_kernels._epilogue does (its codes and scales pointers advanced to
the block's first sub-row), but for the per-token scale, whose amax spans the blocks. Shapes: a block is
[MB, Q] float32, NB * S of them live at once (NB <= 4, S <= 2). 16-bit inputs only (the plan's choice).
"""
import triton
import triton.language as tl

from tilecore.ops.hadamard.kernels import _split_dot
from tilecore.ops.hadamard.kernels_kron import _load_sub_rows, _store
from tilecore.ops.hadamard.quantize_kernels import (AMAX, _codes_fast, _epilogue, _group_divisor, _nan_max,
                                                    _nan_maximum, _scale, _slices_max, _store_codes, _valid_only)
from tilecore.tiles.hadamard import sylvester_tile

# FORMAT id beyond quantize_kernels' (0-6): the rotated values themselves into ``codes`` (a tensor of x's dtype,
# rows of n): the plain transform on this kernel's tiling, for experiments/hadamard/gpu_quantize_probe.py to time
# against hadamard_transform's kron-tiled kernel (not wired into hadamard_transform)
STORE: tl.constexpr = tl.constexpr(7)


@triton.jit
def _mix_step(acc, h_ptr, v, J: tl.constexpr, K0, MB: tl.constexpr, KC: tl.constexpr, M_PAD: tl.constexpr,
              MMA_DTYPE: tl.constexpr):
    """acc + H[J MB .. J MB + MB - 1, K0 .. K0 + KC - 1] @ v: [MB, KC] x [KC, Q] -> [MB, Q] float32."""
    i = J * MB + tl.arange(0, MB)
    k = K0 + tl.arange(0, KC)
    h = tl.load(h_ptr + i[:, None] * M_PAD + k[None, :])
    return tl.dot(h.to(MMA_DTYPE), v.to(MMA_DTYPE), acc, out_dtype=tl.float32)


@triton.jit
def _finish(a0, a1, rscale, J: tl.constexpr, M: tl.constexpr, MB: tl.constexpr, P: tl.constexpr, Q: tl.constexpr,
            S: tl.constexpr, MID_PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """Block J's rotated slices (o0, o1) from its mixed ones: H_Q each, H_S over the two, times rscale, and
    sub-rows past M set to 0 (quantize_kernels._valid_only)."""
    hq = sylvester_tile(Q, Q, P, PIECE_DTYPE)
    mj: tl.constexpr = M - J * MB
    z0 = _split_dot(a0, hq, True, MID_PIECES, PIECE_DTYPE)
    if S == 2:
        z1 = _split_dot(a1, hq, True, MID_PIECES, PIECE_DTYPE)
        o0 = _valid_only((z0 + z1) * rscale, mj, MB, P, Q, 1)
        o1 = _valid_only((z0 - z1) * rscale, mj, MB, P, Q, 1)
    else:
        o0 = _valid_only(z0 * rscale, mj, MB, P, Q, 1)
        o1 = o0
    return o0, o1


@triton.jit
def _block_epilogue(codes, scales, gscale, tile, rows, stride_codes, stride_scales, o0, o1, J: tl.constexpr,
                    M: tl.constexpr, MB: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, S: tl.constexpr,
                    FORMAT: tl.constexpr, GROUP: tl.constexpr, G: tl.constexpr, SPG: tl.constexpr,
                    STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr, FAST: tl.constexpr):
    """Block J's codes and scales where its groups lie inside it (within a slice, or SPG | MB sub-rows):
    quantize_kernels._epilogue on pointers advanced to the block's first sub-row (FORMAT == STORE: the
    rotated values themselves into ``codes``)."""
    first = J * MB * P  # the block's first element in the row
    if FORMAT == STORE:
        _store(codes + first, tile, 0, o0, rows, stride_codes, 1.0, M - J * MB, MB, P, Q, 1, 1)
        if S == 2:
            _store(codes + first, tile, 1, o1, rows, stride_codes, 1.0, M - J * MB, MB, P, Q, 1, 1)
    else:
        cj = codes + (first // 2 if PACKED else first)
        if GROUP == 1:
            sj = scales + first // G
        else:
            sj = scales + (J * MB) // SPG
        _epilogue(cj, sj, gscale, tile, rows, stride_codes, stride_scales, o0, o1, o0, o0, o0, o0, o0, o0, S,
                  M - J * MB, MB, P, Q, 1, FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)


@triton.jit
def _block_codes(codes, tile, rows, stride_codes, o0, o1, div_r, st_r, rc_r, de_r, J: tl.constexpr,
                 M: tl.constexpr, MB: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, S: tl.constexpr,
                 FORMAT: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr,
                 FAST: tl.constexpr):
    """Block J's codes under the row's one (per-token) scale."""
    first = J * MB * P
    cj = codes + (first // 2 if PACKED else first)
    _store_codes(cj, tile, 0, _codes_fast(o0, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                 stride_codes, M - J * MB, MB, P, Q, 1, PACKED)
    if S == 2:
        _store_codes(cj, tile, 1, _codes_fast(o1, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                     stride_codes, M - J * MB, MB, P, Q, 1, PACKED)


@triton.jit
def _probe_loads(x, signs, tile, rows, stride_x, M: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, S: tl.constexpr,
                 KC: tl.constexpr, NK: tl.constexpr, SIGNS: tl.constexpr):
    """PROBE 1: a{block}{slice} = the row's K chunk block of slice slice as loaded (float32), no products."""
    a00 = _load_sub_rows(x, signs, tile, 0, rows, stride_x, 0, M, P, Q, 1, KC, SIGNS).to(tl.float32)
    a01 = a00
    if S == 2:
        a01 = _load_sub_rows(x, signs, tile, 1, rows, stride_x, 0, M, P, Q, 1, KC, SIGNS).to(tl.float32)
    a10, a11, a20, a21, a30, a31 = a00, a01, a00, a01, a00, a01
    if NK > 1:
        a10 = _load_sub_rows(x, signs, tile, 0, rows, stride_x, KC, M, P, Q, 1, KC, SIGNS).to(tl.float32)
        a11 = a10
        if S == 2:
            a11 = _load_sub_rows(x, signs, tile, 1, rows, stride_x, KC, M, P, Q, 1, KC, SIGNS).to(tl.float32)
    if NK > 2:
        a20 = _load_sub_rows(x, signs, tile, 0, rows, stride_x, 2 * KC, M, P, Q, 1, KC, SIGNS).to(tl.float32)
        a21 = a20
        if S == 2:
            a21 = _load_sub_rows(x, signs, tile, 1, rows, stride_x, 2 * KC, M, P, Q, 1, KC, SIGNS).to(tl.float32)
    if NK > 3:
        a30 = _load_sub_rows(x, signs, tile, 0, rows, stride_x, 3 * KC, M, P, Q, 1, KC, SIGNS).to(tl.float32)
        a31 = a30
        if S == 2:
            a31 = _load_sub_rows(x, signs, tile, 1, rows, stride_x, 3 * KC, M, P, Q, 1, KC, SIGNS).to(tl.float32)
    return a00, a01, a10, a11, a20, a21, a30, a31


@triton.jit
def _probe_finish(a00, a01, a10, a11, a20, a21, a30, a31, rscale, M: tl.constexpr, MB: tl.constexpr, NB: tl.constexpr,
                  P: tl.constexpr, Q: tl.constexpr):
    """PROBE 1 / 2: the blocks times rscale, sub-rows past M zeroed, without H_Q or H_S."""
    o00 = _valid_only(a00 * rscale, M, MB, P, Q, 1)
    o01 = _valid_only(a01 * rscale, M, MB, P, Q, 1)
    o10, o11, o20, o21, o30, o31 = o00, o01, o00, o01, o00, o01
    if NB > 1:
        o10 = _valid_only(a10 * rscale, M - MB, MB, P, Q, 1)
        o11 = _valid_only(a11 * rscale, M - MB, MB, P, Q, 1)
    if NB > 2:
        o20 = _valid_only(a20 * rscale, M - 2 * MB, MB, P, Q, 1)
        o21 = _valid_only(a21 * rscale, M - 2 * MB, MB, P, Q, 1)
    if NB > 3:
        o30 = _valid_only(a30 * rscale, M - 3 * MB, MB, P, Q, 1)
        o31 = _valid_only(a31 * rscale, M - 3 * MB, MB, P, Q, 1)
    return o00, o01, o10, o11, o20, o21, o30, o31


@triton.jit
def _row_out(codes, scales, gscale, row, rows, stride_codes, stride_scales, run_max,
             o00, o01, o10, o11, o20, o21, o30, o31, M: tl.constexpr, M_PAD: tl.constexpr, MB: tl.constexpr,
             NB: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, S: tl.constexpr, FORMAT: tl.constexpr,
             GROUP: tl.constexpr, G: tl.constexpr, SPG: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr,
             QMAX: tl.constexpr, FAST: tl.constexpr):
    """One row's codes and scales from its finished blocks o{block}{slice} (unused blocks: any of the used ones,
    never read): the per-token scale's amax over every block first, else each block on its own; FORMAT == AMAX:
    run_max with the row's |y| folded in. Returns run_max. The epilogue of wide_quantize_kernel (J_OUTER off) and
    quantize_wide_rows.wide_rows_quantize_kernel."""
    if FORMAT == AMAX or (GROUP == 0 and SPG == M_PAD):
        a = _slices_max(o00, o01, o00, o00, o00, o00, o00, o00, S)
        if NB > 1:
            a = _nan_maximum(a, _slices_max(o10, o11, o10, o10, o10, o10, o10, o10, S))
        if NB > 2:
            a = _nan_maximum(a, _slices_max(o20, o21, o20, o20, o20, o20, o20, o20, S))
        if NB > 3:
            a = _nan_maximum(a, _slices_max(o30, o31, o30, o30, o30, o30, o30, o30, S))
        if FORMAT == AMAX:
            run_max = _nan_maximum(run_max, a)
        else:  # one per-token scale over every block
            div, stored = _scale(_nan_max(a, 0), gscale, FORMAT, STATIC, QMAX)
            if not STATIC:
                tl.store(scales + tl.cast(row, tl.int64) * stride_scales, stored.to(scales.dtype.element_ty), mask=row < rows)
            recip, div_e = _group_divisor(div, FORMAT)
            zero = tl.zeros([MB, 1], tl.float32)
            div_r = div + zero
            st_r = stored + tl.zeros([MB, 1], stored.dtype)
            rc_r = recip + zero
            de_r = div_e + zero
            _block_codes(codes, row, rows, stride_codes, o00, o01, div_r, st_r, rc_r, de_r, 0, M, MB, P, Q, S,
                         FORMAT, STATIC, PACKED, QMAX, FAST)
            if NB > 1:
                _block_codes(codes, row, rows, stride_codes, o10, o11, div_r, st_r, rc_r, de_r, 1, M, MB, P, Q, S,
                             FORMAT, STATIC, PACKED, QMAX, FAST)
            if NB > 2:
                _block_codes(codes, row, rows, stride_codes, o20, o21, div_r, st_r, rc_r, de_r, 2, M, MB, P, Q, S,
                             FORMAT, STATIC, PACKED, QMAX, FAST)
            if NB > 3:
                _block_codes(codes, row, rows, stride_codes, o30, o31, div_r, st_r, rc_r, de_r, 3, M, MB, P, Q, S,
                             FORMAT, STATIC, PACKED, QMAX, FAST)
    else:  # groups inside a block: each block on its own
        _block_epilogue(codes, scales, gscale, row, rows, stride_codes, stride_scales, o00, o01, 0, M, MB, P, Q, S,
                        FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)
        if NB > 1:
            _block_epilogue(codes, scales, gscale, row, rows, stride_codes, stride_scales, o10, o11, 1, M, MB, P, Q,
                            S, FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)
        if NB > 2:
            _block_epilogue(codes, scales, gscale, row, rows, stride_codes, stride_scales, o20, o21, 2, M, MB, P, Q,
                            S, FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)
        if NB > 3:
            _block_epilogue(codes, scales, gscale, row, rows, stride_codes, stride_scales, o30, o31, 3, M, MB, P, Q,
                            S, FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)
    return run_max


@triton.jit
def wide_quantize_kernel(x, codes, scales, h, signs, gscale, amax_out, rows, stride_x, stride_codes, stride_scales,
                         rscale, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr,
                         S: tl.constexpr, MB: tl.constexpr, NB: tl.constexpr, KC: tl.constexpr, NK: tl.constexpr,
                         SIGNS: tl.constexpr, FORMAT: tl.constexpr, GROUP: tl.constexpr, G: tl.constexpr,
                         SPG: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr,
                         MMA_DTYPE: tl.constexpr, MID_PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr,
                         GRID: tl.constexpr, FAST: tl.constexpr = True, J_OUTER: tl.constexpr = False,
                         PROBE: tl.constexpr = 0):
    """codes, scales = quantize(rscale * (H_M (x) H_P) (signs * x)) for ``rows`` rows of M P (module
    docstring), one row a tile, a persistent grid of GRID programs. ``h``: H_M zero-padded to M_PAD x M_PAD
    (M_PAD >= NB MB, NK KC). Slices are [MB, Q], P = S Q (S <= 2), blocks NB <= 4. FORMAT == AMAX: each
    program's largest |y| into amax_out[program] (nvfp4's dynamic global scale, a first pass). J_OUTER (groups
    inside a block only): the blocks one after another, each rereading the row's K chunks (L1 / L2), so one
    block's S slices are live instead of all NB S. PROBE (experiments only, J_OUTER off; 0 ships): where a row's
    time goes, 1: no transform (block j is the row's K chunk j as loaded, MB == KC), 2: no second product (the
    mixing only); the epilogue as shipped (FORMAT AMAX: no codes, no stores)."""
    run_max = tl.zeros([MB], tl.float32)
    for tile in range(tl.program_id(0), rows, GRID):
        if J_OUTER:  # groups inside a block: one block at a time (its S slices live; the row's loads reread)
            for j in tl.static_range(NB):
                b0 = tl.zeros([MB, Q], tl.float32)
                b1 = tl.zeros([MB, Q], tl.float32)
                for kc in range(NK):  # a loop, not unrolled: the compiler pipelines its loads (num_stages)
                    v0 = _load_sub_rows(x, signs, tile, 0, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                    b0 = _mix_step(b0, h, v0, j, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                    if S == 2:
                        v1 = _load_sub_rows(x, signs, tile, 1, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                        b1 = _mix_step(b1, h, v1, j, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                o0, o1 = _finish(b0, b1, rscale, j, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
                if FORMAT == AMAX:
                    run_max = _nan_maximum(run_max, _slices_max(o0, o1, o0, o0, o0, o0, o0, o0, S))
                else:
                    _block_epilogue(codes, scales, gscale, tile, rows, stride_codes, stride_scales, o0, o1, j, M, MB,
                                    P, Q, S, FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)
        else:
            a00 = tl.zeros([MB, Q], tl.float32)  # a{block}{slice}: unused ones are never read (compiled away)
            a01 = tl.zeros([MB, Q], tl.float32)
            a10 = tl.zeros([MB, Q], tl.float32)
            a11 = tl.zeros([MB, Q], tl.float32)
            a20 = tl.zeros([MB, Q], tl.float32)
            a21 = tl.zeros([MB, Q], tl.float32)
            a30 = tl.zeros([MB, Q], tl.float32)
            a31 = tl.zeros([MB, Q], tl.float32)
            if PROBE == 1:  # no transform: the loaded chunks themselves (MB == KC, NB == NK)
                a00, a01, a10, a11, a20, a21, a30, a31 = _probe_loads(x, signs, tile, rows, stride_x, M, P, Q, S, KC, NK,
                                                                      SIGNS)
            for kc in range(NK if PROBE != 1 else 0):  # a loop, not unrolled: the compiler pipelines its loads (num_stages)
                v0 = _load_sub_rows(x, signs, tile, 0, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                a00 = _mix_step(a00, h, v0, 0, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 1:
                    a10 = _mix_step(a10, h, v0, 1, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 2:
                    a20 = _mix_step(a20, h, v0, 2, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 3:
                    a30 = _mix_step(a30, h, v0, 3, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if S == 2:
                    v1 = _load_sub_rows(x, signs, tile, 1, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                    a01 = _mix_step(a01, h, v1, 0, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                    if NB > 1:
                        a11 = _mix_step(a11, h, v1, 1, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                    if NB > 2:
                        a21 = _mix_step(a21, h, v1, 2, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                    if NB > 3:
                        a31 = _mix_step(a31, h, v1, 3, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
            if PROBE == 0:
                o00, o01 = _finish(a00, a01, rscale, 0, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
                o10, o11 = o00, o01
                o20, o21 = o00, o01
                o30, o31 = o00, o01
                if NB > 1:
                    o10, o11 = _finish(a10, a11, rscale, 1, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
                if NB > 2:
                    o20, o21 = _finish(a20, a21, rscale, 2, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
                if NB > 3:
                    o30, o31 = _finish(a30, a31, rscale, 3, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
            else:  # probes: no second product (and with PROBE 1 no mixing either)
                o00, o01, o10, o11, o20, o21, o30, o31 = _probe_finish(a00, a01, a10, a11, a20, a21, a30, a31, rscale,
                                                                       M, MB, NB, P, Q)
            run_max = _row_out(codes, scales, gscale, tile, rows, stride_codes, stride_scales, run_max, o00, o01,
                               o10, o11, o20, o21, o30, o31, M, M_PAD, MB, NB, P, Q, S, FORMAT, GROUP, G, SPG, STATIC,
                               PACKED, QMAX, FAST)
    if FORMAT == AMAX:
        tl.store(amax_out + tl.program_id(0), _nan_max(run_max, 0))

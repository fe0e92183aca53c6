"""The Hadamard transform of long rows (n = 8192 S, S = 2 or 4) on Hopper, as a kernel of the tiles'
pipeline template (tiles.gluon.persistent_pipeline): the same math as kernels.py's plan (S, 128, 64),
with the data movement made explicit.

A tile is one row: S slices X_s of 128 x 64 elements (the rows seen as lines of 64 elements). The
producer warp streams each slice through the ring as two 64-line halves (top, bottom) by TMA; two
consumer warpgroups share every slice, consumer c owning lines 64c .. 64c + 63 of each transform:

    T_s = H_128 X_s H_64,   and H_128 = H_2 (x) H_64,  so  rows of consumer c:
    (H_128 X_s)[64c + i] = H_64 top + (-1)^c H_64 bottom      (16-bit inputs times +-1, float32 sums)
    T_s[64c + i]         = (hi + lo) H_64                      (bf16 pieces of the float32 sums)
    out_j               += H_S[j, s] T_s                       (float32, as the slices arrive)

H_64 (and -H_64) for the first product is built in registers (wgmma's register operand); for the second it sits
in shared memory, a resident operand loaded once per program. The error analysis is kernels.py's:
the final rounding to the output dtype is the only one that matters. Each consumer then writes its
S output blocks into one staging buffer and issues their TMA stores back to back, so a row's stores
never wait for each other (Triton's version of this kernel waits for each store before the next).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilecore.tiles.gluon import persistent_pipeline, wgmma_layout
from tilecore.tiles.hadamard import bf16_pieces, sylvester_block

LINES = gl.constexpr(64)  # a slice half: lines of 64 elements; also H_64's size


@gluon.jit
def _setup(g, cfg: gl.constexpr, row):
    return row, cfg[0]  # a tile is a row; its S slices are the ring's steps


@gluon.jit
def _load(g, cfg: gl.constexpr, top, bottom, bar, row, s):
    line = row * g[5] + 2 * LINES * s
    tma.async_copy_global_to_shared(g[0], [line, 0], bar, top)
    tma.async_copy_global_to_shared(g[0], [line + LINES, 0], bar, bottom)


@gluon.jit
def _load_h(g, cfg: gl.constexpr, bufs, bar, row):
    tma.async_copy_global_to_shared(g[2], [0, 0], bar, bufs.index(0))


@gluon.jit
def _init(g, cfg: gl.constexpr, row, bufs):
    acc_layout: gl.constexpr = wgmma_layout(LINES, LINES, gl.num_warps())
    h = sylvester_block(LINES, LINES, gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2),
                        g[0].dtype)
    if cfg[-1] == 1:  # the second consumer's rows take -H_64 for the bottom half (see _compute)
        h_bottom = -h
    else:
        h_bottom = h
    z = gl.zeros([LINES, LINES], gl.float32, acc_layout)
    if cfg[0] == 2:
        return h, h_bottom, z, z
    else:
        return h, h_bottom, z, z, z, z


@gluon.jit
def _sign(j: gl.constexpr, s):
    """H_S[j, s] for S <= 4: (-1)^popcount(j & s), as a float."""
    b = j & s
    return 1.0 - 2.0 * ((b ^ (b >> 1)) & 1).to(gl.float32)


@gluon.jit
def _second_product(y, h_smem):
    """y H_64 for float32 ``y``: its two bf16 pieces times H_64 (shared memory), accumulated in float32;
    returned with the wgmma in flight."""
    acc_layout: gl.constexpr = y.type.layout
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    hi, lo = bf16_pieces(y)
    t = warpgroup_mma(gl.convert_layout(hi, operand), h_smem, gl.zeros_like(y), use_acc=False, is_async=True)
    return warpgroup_mma(gl.convert_layout(lo, operand), h_smem, t, is_async=True)


@gluon.jit
def _compute(g, cfg: gl.constexpr, state, top, bottom, s, bufs):
    acc_layout: gl.constexpr = wgmma_layout(LINES, LINES, gl.num_warps())
    zeros = gl.zeros([LINES, LINES], gl.float32, acc_layout)
    # H_64 top +- H_64 bottom (state[1] is -H_64 for the second consumer)
    y = warpgroup_mma(state[0], top, zeros, use_acc=False, is_async=True)
    y = warpgroup_mma(state[1], bottom, y, is_async=True)
    y = warpgroup_mma_wait(0, deps=(y,))
    if cfg[1]:
        state = _late_step(cfg[0], state, y, s, bufs.index(0))
    else:
        t = warpgroup_mma_wait(0, deps=(_second_product(y, bufs.index(0)),))
        if cfg[0] == 2:
            state = state[0], state[1], state[2] + t * _sign(0, s), state[3] + t * _sign(1, s)
        else:
            state = (state[0], state[1], state[2] + t * _sign(0, s), state[3] + t * _sign(1, s),
                     state[4] + t * _sign(2, s), state[5] + t * _sign(3, s))
    return state


@gluon.jit
def _late_step(S: gl.constexpr, state, y, s, h_smem):
    """LATE: the S-butterfly's first stage on the first products Y_s (float32), the second product
    on pair sums, since (Y_0 +- Y_1) H_64 are what the outputs combine: out_j = sum_s H_S[j, s] Y_s H_64.
    Slices 0 and 2 only keep Y_s; slices 1 and 3 make two second products each; the last combines
    them. Per row: the same wgmma, the same number of bf16 pieces, and 2 adds per element and slice
    where the per-slice form takes S multiply-adds. Slots (S = 4): (Y_0 + Y_1) H_64, (Y_0 - Y_1) H_64,
    Y_2, -, then the output blocks."""
    h = state[0]
    h_bottom = state[1]
    s0 = state[2]
    s1 = state[3]
    if S == 2:
        if s == 0:
            s0 = y
        else:
            t0 = _second_product(s0 + y, h_smem)
            t1 = _second_product(s0 - y, h_smem)
            s0, s1 = warpgroup_mma_wait(0, deps=(t0, t1))
        return h, h_bottom, s0, s1
    else:
        s2 = state[4]
        s3 = state[5]
        if s % 2 == 0:
            s2 = y
        elif s == 1:
            t0 = _second_product(s2 + y, h_smem)
            t1 = _second_product(s2 - y, h_smem)
            s0, s1 = warpgroup_mma_wait(0, deps=(t0, t1))
        else:
            # out_0, out_2 = (Y_0 + Y_1) H +- (Y_2 + Y_3) H;  out_1, out_3 = (Y_0 - Y_1) H +- (Y_2 - Y_3) H
            minus_y = s2 - y
            t = _second_product(s2 + y, h_smem)
            t = warpgroup_mma_wait(0, deps=(t,))
            s2 = s0 - t
            s0 = s0 + t
            t = _second_product(minus_y, h_smem)
            t = warpgroup_mma_wait(0, deps=(t,))
            s3 = s1 - t
            s1 = s1 + t
        return h, h_bottom, s0, s1, s2, s3


@gluon.jit
def _drain(g, cfg: gl.constexpr, state):
    return state  # compute waits for its own wgmma


@gluon.jit
def _finish(g, cfg: gl.constexpr, state, row, staging):
    """This consumer's S output blocks of the row: scaled, rounded once, stored by TMA."""
    S: gl.constexpr = cfg[0]
    tma.store_wait(0)  # the previous row's stores have read the staging buffer
    for j in gl.static_range(S):
        staging.slice(j * LINES, LINES).store((state[2 + j] * g[4]).to(g[1].dtype))
    fence_async_shared()
    gl.thread_barrier()
    line = row * g[5] + LINES * cfg[-1]
    for j in gl.static_range(S):
        tma.async_copy_shared_to_global(g[1], [line + 2 * LINES * j, 0], staging.slice(j * LINES, LINES))


@gluon.jit
def hadamard_gluon_kernel(x_desc, out_desc, staging_desc, h_desc, rows, scale, S: gl.constexpr,
                          STAGES: gl.constexpr, LATE: gl.constexpr = False):
    """scale * H_n of each of ``rows`` contiguous rows, n = 8192 S. x_desc/out_desc: the rows as
    (rows * n / 64, 64) lines with [64, 64] boxes; staging_desc: the same with [64 S, 64] boxes (only its
    shape and layout are used: a consumer's staging buffer); h_desc: H_64 in bf16, one [64, 64] box."""
    g = (x_desc, out_desc, h_desc, rows, scale, 128 * S)  # the last: lines per row
    cfg: gl.constexpr = gl.constexpr((S, LATE))
    persistent_pipeline(g, cfg, x_desc, x_desc, staging_desc, rows, _setup, _load, _init, _compute, _drain,
                        _finish, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, IN_FLIGHT=0,
                        tile_desc=h_desc, load_tile=_load_h,
                        TILE_SHARED=True, TILE_RESIDENT=True)

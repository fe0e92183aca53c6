"""The Gluon varlen forward's work table in one launch, its sequence order included (host time, issue 31).

op.work_table sorts the sequences longest first with torch ops (lengths, their products, a stable
argsort: ~7 small launches a call, ~30-40 us of an eager call's host time) and then writes the table
with kernels_tl.varlen_work_table (both write the entries by write_work_entries). For batches of at most RANKED_MAX_BATCH sequences this kernel
does both: each program ranks every sequence itself ([BLOCK_B, BLOCK_B] compares of N x Nk, ties in
batch order: argsort(descending, stable)'s order) and writes its BLOCK_T entries as the two-step path
does. The table is built from cu_seqlens' values on the GPU every call (nothing cached on the host).
"""
from __future__ import annotations

import triton
import triton.language as tl

RANKED_MAX_BATCH = 64  # [64, 64] compares a program (the table kernel's 4096: no spill on sm_90a)


@triton.jit
def varlen_work_table_ranked(CU_Q, CU_K, TABLE, B, entries, HEADS, TILE_M: tl.constexpr, BLOCK_B: tl.constexpr,
                             BLOCK_T: tl.constexpr):
    """TABLE (entries, 4) int32, op.work_table's: entry t is (sequence, query tile from its last row,
    q head, 0) for the sequences longest first (by N x Nk, descending, ties in batch order), each one's
    cdiv(N, TILE_M) tiles head by head; entries past the real tiles (-1, 0, 0, 0). B <= BLOCK_B."""
    offs_b = tl.arange(0, BLOCK_B)  # [BLOCK_B]: sequences in batch order
    b_ok = offs_b < B
    n = tl.load(CU_Q + offs_b + 1, mask=b_ok, other=0) - tl.load(CU_Q + offs_b, mask=b_ok, other=0)
    nk = tl.load(CU_K + offs_b + 1, mask=b_ok, other=0) - tl.load(CU_K + offs_b, mask=b_ok, other=0)
    work = tl.where(b_ok, n.to(tl.int64) * nk.to(tl.int64), -1)  # padding sorts after every sequence
    # rank of sequence i: the sequences before it in the order ([BLOCK_B (i), BLOCK_B (j)])
    before = (work[None, :] > work[:, None]) | ((work[None, :] == work[:, None]) & (offs_b[None, :] < offs_b[:, None]))
    rank = tl.sum(before.to(tl.int32), 1)  # [BLOCK_B] by i
    # position p's sequence and length ([BLOCK_B (p), BLOCK_B (i)])
    at = rank[None, :] == offs_b[:, None]
    seq = tl.sum(tl.where(at, offs_b[None, :], 0), 1)  # [BLOCK_B] by p
    n_sorted = tl.sum(tl.where(at, n[None, :], 0), 1)
    tiles = tl.where(b_ok, (n_sorted + TILE_M - 1) // TILE_M, 0)
    write_work_entries(TABLE, seq, tiles, B, entries, HEADS, BLOCK_B, BLOCK_T)


@triton.jit
def write_work_entries(TABLE, seq, tiles, B, entries, HEADS, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr):
    """This program's BLOCK_T entries of the work table, given the sequences in table order (seq
    [BLOCK_B], B real) and each one's query tiles: entry t is (sequence, query tile from its last row, q
    head, 0), a sequence's tiles head by head; past the real tiles (-1, 0, 0, 0). An entry's sequence is
    counted, not searched: the positions whose tiles end at or before it ([BLOCK_T, BLOCK_B] compares)."""
    offs_b = tl.arange(0, BLOCK_B)
    per_sequence = tiles * HEADS
    ends = tl.cumsum(per_sequence, 0)  # inclusive: entries up to and including each position's
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    done = ends[None, :] <= t[:, None]  # [BLOCK_T, BLOCK_B]: positions wholly before entry t
    position = tl.sum(done.to(tl.int32), 1)
    start = tl.sum(tl.where(done, per_sequence[None, :], 0), 1)
    mine = offs_b[None, :] == position[:, None]
    count = tl.maximum(tl.sum(tl.where(mine, tiles[None, :], 0), 1), 1)
    real = position < B
    local = t - start
    row = TABLE + t.to(tl.int64) * 4
    in_table = t < entries
    tl.store(row, tl.where(real, tl.sum(tl.where(mine, seq[None, :], 0), 1), -1), mask=in_table)
    tl.store(row + 1, tl.where(real, local % count, 0), mask=in_table)
    tl.store(row + 2, tl.where(real, local // count, 0), mask=in_table)
    tl.store(row + 3, t * 0, mask=in_table)

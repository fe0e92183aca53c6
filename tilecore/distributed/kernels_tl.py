"""The ring's elementwise kernels: the merge of partial attention results by their log-sum-exp, and a
rank's own dK/dV sum from its shares (two ranks), each one pass over the rows."""
import triton
import triton.language as tl


@triton.jit
def lse_merge_kernel(acc_ptr, acc_lse_ptr, part_ptr, part_lse_ptr, H, ROWS, D,
                     sa_b, sa_h, sa_n, sa_d, sla_b, sla_h, sla_n,
                     sp_b, sp_h, sp_n, sp_d, slp_b, slp_h, slp_n,
                     BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """acc (B, H, ROWS, D; any float dtype, updated in place) and acc_lse (B, H, ROWS; float32) <-
    the union of their keys with a part's (part: B, H, ROWS, D; part_lse float32), in float32:
    lse = log(e^acc_lse + e^part_lse), acc = acc e^(acc_lse - lse) + part e^(part_lse - lse).
    A row with no key on either side (both -inf) keeps lse -inf and gets 0; a NaN lse makes the row
    NaN. Grid: (B * H, cdiv(ROWS, BLOCK_M))."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    row_ok = rows < ROWS
    mask = row_ok[:, None] & (cols[None, :] < D)  # [BLOCK_M, BLOCK_D]

    lse_a_ptrs = acc_lse_ptr + b * sla_b + h * sla_h + rows * sla_n
    lse_a = tl.load(lse_a_ptrs, mask=row_ok, other=float("-inf"))
    lse_p = tl.load(part_lse_ptr + b * slp_b + h * slp_h + rows * slp_n, mask=row_ok, other=float("-inf"))
    top = tl.maximum(lse_a, lse_p)
    top = tl.where(top == float("-inf"), 0.0, top)  # both -inf: exp(-inf - 0) = 0, not NaN
    lse = top + tl.log(tl.exp(lse_a - top) + tl.exp(lse_p - top))  # NaN in, NaN out
    empty = lse == float("-inf")
    w_a = tl.where(empty, 0.0, tl.exp(lse_a - lse))
    w_p = tl.where(empty, 0.0, tl.exp(lse_p - lse))

    a_ptrs = acc_ptr + b * sa_b + h * sa_h + rows[:, None] * sa_n + cols[None, :] * sa_d
    p_ptrs = part_ptr + b * sp_b + h * sp_h + rows[:, None] * sp_n + cols[None, :] * sp_d
    acc = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
    part = tl.load(p_ptrs, mask=mask, other=0.0).to(tl.float32)
    merged = acc * w_a[:, None] + part * w_p[:, None]
    tl.store(a_ptrs, merged.to(acc_ptr.dtype.element_ty), mask=mask)
    tl.store(lse_a_ptrs, lse, mask=row_ok)


@triton.jit
def own_sum_kernel(out_ptr, a_ptr, b_ptr, c_ptr, ROWS, A_ROWS, B_ROWS, D,
                   so_bh, so_n, sa_bh, sa_n, sb_bh, sb_n, sc_bh, sc_n,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """out (BH, ROWS, D) <- ((a + b) + c) in float32, rounded once to out's dtype: a rank's own dK or
    dV from its two parts' shares (a: the first A_ROWS keys, b: the first B_ROWS; rows past them
    count 0) and the other rank's share c (ROWS keys). The same sums, in the same order, as the
    float32 buffer it replaces (ring_backward), in one pass instead of five. Last dims contiguous.
    Grid: (BH, cdiv(ROWS, BLOCK_M))."""
    bh = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    col_ok = cols[None, :] < D
    mask = (rows[:, None] < ROWS) & col_ok  # [BLOCK_M, BLOCK_D]
    a = tl.load(a_ptr + bh * sa_bh + rows[:, None] * sa_n + cols[None, :],
                mask=(rows[:, None] < A_ROWS) & col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + bh * sb_bh + rows[:, None] * sb_n + cols[None, :],
                mask=(rows[:, None] < B_ROWS) & col_ok, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + bh * sc_bh + rows[:, None] * sc_n + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    total = (a + b) + c
    tl.store(out_ptr + bh * so_bh + rows[:, None] * so_n + cols[None, :], total.to(out_ptr.dtype.element_ty),
             mask=mask)

"""Each tile operation and the scheduler, through small kernels in the interpreter, against torch."""
import math

import pytest
import torch
import triton
import triton.language as tl

from tilecore.tiles import ops
from tilecore.tiles.schedule import grouped_tile, num_tiles, persistent_programs


@triton.jit
def _binary_kernel(x_ptr, y_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, WHICH: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    acc = tl.full([M, N], 1.0, tl.float32)
    if WHICH == 0:  # A B
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :])
        y = tl.load(y_ptr + rk[:, None] * N + rn[None, :])
        out = ops.mma(x, y, acc)
    else:  # A B^T with B given as [N, K]
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :])
        y = tl.load(y_ptr + rn[:, None] * K + rk[None, :])
        out = ops.mma_abt(x, y, acc)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], out)


@pytest.mark.parametrize("which", [0, 1])
def test_mma(which):
    M, N, K = 32, 16, 64
    x = torch.randn(M, K, dtype=torch.float16)
    y = torch.randn(K, N, dtype=torch.float16) if which == 0 else torch.randn(N, K, dtype=torch.float16)
    out = torch.full((M, N), float("nan"))
    _binary_kernel[(1,)](x, y, out, M, N, K, which)
    ref = 1 + x.double() @ (y.double() if which == 0 else y.double().t())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)


@triton.jit
def _reduce_kernel(x_ptr, rmax, rsum, cmax, csum, M: tl.constexpr, N: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    x = tl.load(x_ptr + rm[:, None] * N + rn[None, :])
    tl.store(rmax + rm, ops.row_max(x))
    tl.store(rsum + rm, ops.row_sum(x))
    tl.store(cmax + rn, ops.col_max(x))
    tl.store(csum + rn, ops.col_sum(x))


def test_reductions():
    x = torch.randn(16, 32)
    outs = [torch.full((n,), float("nan")) for n in (16, 16, 32, 32)]
    _reduce_kernel[(1,)](x, *outs, 16, 32)
    torch.testing.assert_close(outs[0], x.amax(1))
    torch.testing.assert_close(outs[1], x.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[2], x.amax(0))
    torch.testing.assert_close(outs[3], x.sum(0), rtol=1e-5, atol=1e-5)


@triton.jit
def _elementwise_kernel(x_ptr, e_ptr, c_ptr, b_ptr, scale, M: tl.constexpr, N: tl.constexpr, rows, cols):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    x = tl.load(x_ptr + rm[:, None] * N + rn[None, :])
    tl.store(e_ptr + rm[:, None] * N + rn[None, :], ops.exp2_scaled(x, scale))
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], ops.causal_mask(x, rm, rn, float("-inf")))
    inside = ops.bounds_mask(rm, rn, rows, cols)
    tl.store(b_ptr + rm[:, None] * N + rn[None, :], ops.masked(x, inside, 0.0))


def test_exp2_and_masks():
    x = torch.randn(16, 16)
    e, c, b = (torch.full_like(x, float("nan")) for _ in range(3))
    s = 0.125 * math.log2(math.e)
    _elementwise_kernel[(1,)](x, e, c, b, s, 16, 16, 11, 7)
    torch.testing.assert_close(e, torch.exp(0.125 * x), rtol=1e-5, atol=1e-6)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    torch.testing.assert_close(c, x.masked_fill(~causal, float("-inf")))
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[:11, :7] = True
    torch.testing.assert_close(b, x * inside)


@triton.jit
def _softmax_kernel(s_ptr, v_ptr, o_ptr, lse_ptr, scale_log2e, M: tl.constexpr, N: tl.constexpr, D: tl.constexpr,
                    BLOCKS: tl.constexpr):
    # start / update / result, as a flash-attention kernel uses them
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rd = tl.arange(0, D)
    m_i, l_i = ops.online_softmax_start(M)
    acc = tl.zeros([M, D], tl.float32)
    for j in range(BLOCKS):
        s = tl.load(s_ptr + rm[:, None] * (N * BLOCKS) + j * N + rn[None, :])
        v = tl.load(v_ptr + (j * N + rn)[:, None] * D + rd[None, :])
        m_i, l_i, acc, p = ops.online_softmax_update(m_i, l_i, acc, s, scale_log2e)
        acc = ops.mma(p.to(tl.float16), v, acc)
    out, lse = ops.online_softmax_result(m_i, l_i, acc)
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], out)
    tl.store(lse_ptr + rm, lse)


def test_online_softmax_matches_softmax():
    M, N, D, blocks = 16, 16, 16, 4
    s = torch.randn(M, N * blocks) * 3
    v = torch.randn(N * blocks, D, dtype=torch.float16)
    o = torch.full((M, D), float("nan"))
    scale = 0.5
    _softmax_kernel[(1,)](s, v, o, torch.empty(M), scale * math.log2(math.e), M, N, D, blocks)
    ref = torch.softmax(s.double() * scale, dim=1) @ v.double()
    assert ((o.double() - ref).norm() / ref.norm()).item() < 2e-3  # p is rounded to fp16 for the mma


def test_online_softmax_fully_masked_leading_blocks_give_no_nan():
    # Causal attention's first key blocks can mask whole rows: those rows must stay at zero, not NaN.
    M, N, D, blocks = 16, 16, 16, 4
    s = torch.randn(M, N * blocks) * 3
    s[:, : 2 * N] = float("-inf")  # the first two blocks are masked for every row
    v = torch.randn(N * blocks, D, dtype=torch.float16)
    o = torch.full((M, D), float("nan"))
    _softmax_kernel[(1,)](s, v, o, torch.empty(M), 0.5 * math.log2(math.e), M, N, D, blocks)
    ref = torch.softmax(s.double() * 0.5, dim=1) @ v.double()
    assert not torch.isnan(o).any()
    assert ((o.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_online_softmax_start_and_result():
    # rows: ordinary, every score masked (no key: 0 and -inf), one NaN score and one +inf score (NaN
    # out and lse, as SDPA's softmax gives NaN there)
    M, N, D, blocks = 16, 16, 16, 3
    s = torch.randn(M, N * blocks) * 3
    s[1] = float("-inf")
    s[2, 5] = float("nan")
    s[3, 20] = float("inf")
    v = torch.randn(N * blocks, D, dtype=torch.float16)
    o = torch.full((M, D), float("nan"))
    lse = torch.full((M,), float("nan"))
    scale = 0.5
    _softmax_kernel[(1,)](s, v, o, lse, scale * math.log2(math.e), M, N, D, blocks)
    ok = torch.tensor([r not in (1, 2, 3) for r in range(M)])
    ref = torch.softmax(s[ok].double() * scale, dim=1) @ v.double()
    assert ((o[ok].double() - ref).norm() / ref.norm()).item() < 2e-3  # p is rounded to fp16 for the mma
    ref_lse = torch.logsumexp(s[ok].double() * scale, dim=1)
    assert (lse[ok].double() - ref_lse).abs().max().item() < 1e-5
    assert (o[1] == 0).all() and lse[1].item() == float("-inf")
    assert o[2:4].isnan().all() and lse[2:4].isnan().all()


@triton.jit
def _quant_kernel(x_ptr, q_ptr, d_ptr, inv_scale, scale, n: tl.constexpr, QMAX: tl.constexpr):
    r = tl.arange(0, n)
    x = tl.load(x_ptr + r)
    q = ops.quantize(x, inv_scale, QMAX, tl.float16)
    tl.store(q_ptr + r, q)
    tl.store(d_ptr + r, ops.dequantize(q, scale))
    tl.store(d_ptr + n + r, ops.cast(x, tl.float16).to(tl.float32))


def test_quantize_cast():
    x = torch.randn(64) * 100
    q = torch.full((64,), float("nan"), dtype=torch.float16)
    d = torch.full((128,), float("nan"))
    scale = 0.5
    _quant_kernel[(1,)](x, q, d, 1 / scale, scale, 64, 448.0)
    ref = (x / scale).clamp(-448, 448).half()
    torch.testing.assert_close(q, ref)
    torch.testing.assert_close(d[:64], ref.float() * scale)
    torch.testing.assert_close(d[64:], x.half().float())


@triton.jit
def _order_kernel(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    t = tl.program_id(0)
    pid_m, pid_n = grouped_tile(t, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * t, pid_m)
    tl.store(out_ptr + 2 * t + 1, pid_n)


def _order(pm, pn, group):
    out = torch.full((pm * pn * 2,), -1, dtype=torch.int32)
    _order_kernel[(pm * pn,)](out, pm, pn, group)
    return [tuple(p) for p in out.view(-1, 2).tolist()]


@pytest.mark.parametrize("pm,pn,group", [(5, 3, 1), (7, 4, 2), (6, 6, 4), (3, 9, 8)])
def test_grouped_order_is_a_permutation(pm, pn, group):
    order = _order(pm, pn, group)
    assert sorted(order) == [(m, n) for m in range(pm) for n in range(pn)]
    if group == 1:
        assert order == [(m, n) for m in range(pm) for n in range(pn)]  # row-major
    else:
        # inside a full group, consecutive tiles walk down the group's rows before moving right
        rows = min(group, pm)
        assert order[:rows] == [(m, 0) for m in range(rows)]


def test_grouped_order_is_l2_friendly():
    # a wave of 132 programs over a 32 x 32 tile grid: distinct A rows + B columns touched
    order = _order(32, 32, 8)[:132]
    assert len({m for m, _ in order}) + len({n for _, n in order}) <= 8 + 17
    row_major = _order(32, 32, 1)[:132]
    assert len({m for m, _ in row_major}) + len({n for _, n in row_major}) >= 32 + 5


def test_persistent_programs():
    assert num_tiles(300, 500, 128, 256) == 3 * 2
    assert persistent_programs(6, torch.device("cpu"), cpu_programs=3) == 3
    assert persistent_programs(2, torch.device("cpu"), cpu_programs=3) == 2

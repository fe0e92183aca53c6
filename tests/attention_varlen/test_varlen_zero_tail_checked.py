"""The Gluon varlen backward's checked zero tail (config zero_tail "checked", the kernel's ZERO_TAIL 2):
varlen.neighbour_rows_nonfinite marks the sequences whose boxes read a neighbour's inf / NaN row (the up to
3 rows before the first query block's own rows, the rows a last query block reads past the sequence, their
lse / delta, the keys a last key tile reads past it), and the kernel zeroes those rows only there. Checked
here: the flags against the rows the kernel's boxes read (from the float64 twin's tile rules), that
unmarked sequences need no zeroing (their gradients equal the reference without it), and the launch's
arguments. The kernel runs only on a GPU (experiments/attention/gpu_varlen_bwd.py times and checks it)."""
import pytest
import torch

from tilecore.ops.attention_varlen import configs
from tilecore.ops.attention_varlen import op as varlen
from tilecore.ops.attention_varlen.reference import varlen_backward_reference, varlen_reference

from test_varlen_gluon_backward import cdiv, cu_of, emulate  # noqa: E402  (the float64 twin of the kernel)

BLOCK_M, TILE_N = 64, 128


@pytest.fixture(autouse=True)
def one_thread():
    """Small torch ops on one thread (two on the loaded 2-core machine were many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rows_read_outside(cu_q, cu_k, b):
    """(query rows, key rows) outside sequence b that the dK/dV kernel's boxes read (its tile rules:
    query blocks of 64 from the packed row q0 - q0 % 4, key tiles of 128 from k0)."""
    q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
    n, nk = q1 - q0, k1 - k0
    if n == 0 or nk == 0:
        return set(), set()
    r = q0 % 4
    q_end = q0 - r + cdiv(n + r, BLOCK_M) * BLOCK_M
    k_end = k0 + cdiv(nk, TILE_N) * TILE_N
    return set(range(q0 - r, q0)) | set(range(q1, q_end)), set(range(k1, k_end))


def packed(lens_q, lens_k, hq=2, hkv=1, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(sum(lens_q), hq, d, generator=g) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g) for _ in range(2))
    stats = torch.randn(hq, 2, sum(lens_q), generator=g)
    return q, k, v, dout, stats


def flags(q, k, v, dout, stats, cu_q, cu_k):
    return varlen.neighbour_rows_nonfinite(q, k, v, dout, stats, cu_q, cu_k, BLOCK_M, TILE_N).tolist()


def test_finite_inputs_mark_no_sequence():
    lens_q, lens_k = [1, 0, 127, 300, 65, 2], [1, 0, 127, 300, 70, 5]
    q, k, v, dout, stats = packed(lens_q, lens_k)
    stats[:, 0, 5] = float("inf")  # a row that sees no key: its lse is +inf in the statistics, p = 0 either way
    assert flags(q, k, v, dout, stats, cu_of(lens_q), cu_of(lens_k)) == [0] * len(lens_q)


@pytest.mark.parametrize("where", ["q", "lse", "delta", "k"])  # dout and v take q's and k's code
def test_a_nonfinite_row_marks_exactly_the_sequences_whose_boxes_read_it(where):
    lens_q, lens_k = [100, 30, 129, 7, 200], [90, 140, 129, 7, 200]
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    keys = where in ("k", "v")
    edges = cu_k[1:] if keys else torch.cat([cu_q[:-1], cu_q[1:]])
    # rows at and around every place a box's reach ends: before a start, a last block's and a key tile's end
    candidates = {int(e) + o for e in edges for o in ((0, 63, 64, 127, 128) if keys else (-4, -3, -1, 0, 2, 63, 64))}
    total = sum(lens_k) if keys else sum(lens_q)
    for row in sorted(x for x in candidates if 0 <= x < total):
        q, k, v, dout, stats = packed(lens_q, lens_k)
        bad = float("nan") if row % 2 else float("inf")
        if where in ("q", "dout", "k", "v"):
            dict(q=q, dout=dout, k=k, v=v)[where][row, 1 if where in ("q", "dout") else 0, 3] = bad
        else:
            stats[1, 0 if where == "lse" else 1, row] = float("nan") if where == "lse" else bad
        got = flags(q, k, v, dout, stats, cu_q, cu_k)
        for b in range(len(lens_q)):
            q_rows, k_rows = rows_read_outside(cu_q, cu_k, b)
            read = row in (k_rows if where in ("k", "v") else q_rows)
            # every sequence whose boxes read the row is marked; the flags may take up to 3 rows more before
            # a sequence's start (whatever q0 % 4) and a key tile's whole 128 past its end
            if read:
                assert got[b] == 1, (where, row, b)
            elif got[b]:
                q0, q1, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b + 1])
                near = (q0 - 3 <= row < q0 or q1 <= row < q1 + BLOCK_M) if where not in ("k", "v") else (
                    k1 <= row < k1 + TILE_N)
                assert near, (where, row, b)


def test_unmarked_sequences_need_no_zeroing():
    # NaN / inf in the second sequence's first and last rows: the first and the third sequences read them
    # (marked: zeroed, right); the others' results without any zeroing equal the reference
    lens = [100, 30, 129, 20]
    hq, hkv, d = 1, 1, 16
    cu = cu_of(lens)
    g = torch.Generator().manual_seed(5)
    q, dout = (torch.randn(sum(lens), hq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(sum(lens), hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    scale = d ** -0.5
    out, lse = varlen_reference(q, k, v, cu, cu, causal=True)
    delta = (out * dout).sum(-1).T
    ref = varlen_backward_reference(dout, q, k, v, out, lse, None, cu, cu, causal=True, scale=scale,
                                    compute_dtype=torch.float64)
    for nxt in (slice(100, 110), slice(126, 130)):
        k[nxt], v[nxt], q[nxt], dout[nxt] = float("nan"), float("inf"), float("nan"), float("inf")
        lse[:, nxt], delta[:, nxt] = float("nan"), float("nan")
    stats = torch.stack([torch.where(torch.isneginf(lse), float("inf"), lse), delta], 1)
    marked = flags(q, k, v, dout, stats, cu, cu)
    assert marked[0] == 1 and marked[2] == 1 and marked[3] == 0
    zeroed = emulate(q, k, v, dout, lse, delta, cu, cu, True, None, scale, zero_tail=True)[:3]
    plain = emulate(q, k, v, dout, lse, delta, cu, cu, True, None, scale, zero_tail=False)[:3]
    for b, rows in ((0, slice(0, 100)), (2, slice(130, 259)), (3, slice(259, 279))):
        # the kernel's ZERO_TAIL 2: zeroed where marked, as without zeroing elsewhere
        got = zeroed if marked[b] else plain
        for x, want in zip(got, ref):
            assert torch.allclose(x[rows], want[rows], atol=1e-9), b


@pytest.mark.parametrize("zero_tail, mode", [(False, 0), (True, 1), ("checked", 2)])
def test_launch_passes_the_flags_only_when_checked(monkeypatch, zero_tail, mode):
    calls = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.setdefault(self.name, (args, kwargs))

    monkeypatch.setattr(varlen, "GLUON_VARLEN_BWD", Recorder("dkdv"))
    monkeypatch.setattr(varlen, "GLUON_VARLEN_DQ", Recorder("dq"))
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    from tilecore.ops.attention_varlen import gluon_backward as gluon_varlen_backward

    lengths = [70, 1, 0, 20]
    cu = cu_of(lengths)
    total = sum(lengths)
    q, dout, out = (torch.randn(total, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k = torch.randn(total, 2, 128, dtype=torch.bfloat16)
    k[71, 1, 5] = float("nan")  # the fourth sequence's first key: the first's and second's last key tiles read it
    lse = torch.randn(4, total)
    cfg = dict(configs.varlen_gluon_backward_config(128, True), dq_from="gluon", zero_tail=zero_tail)
    varlen.backward_gluon(dout, q, k, k, out, lse, None, cu, cu, True, 0.1, -1, -1, 0.0, config=cfg)
    args, kwargs = calls["dkdv"]
    named = dict(zip(gluon_varlen_backward.attention_varlen_bwd_kernel.arg_names, args))
    assert kwargs["ZERO_TAIL"] == mode and gluon_varlen_backward.ZERO_TAIL_MODES[zero_tail] == mode
    if zero_tail == "checked":
        # (the third, empty, is marked too: it has no tiles)
        assert named["tail_flags"].dtype == torch.int32 and named["tail_flags"].tolist() == [1, 1, 1, 0]
    else:
        assert named["tail_flags"] is None
    assert calls["dq"][1]["ZERO_TAIL"] is bool(zero_tail)  # the dq kernel's K / V zeroing: once a tile, always


def test_zero_tail_stays_off_until_a_gpu_check():
    assert configs.VARLEN_GLUON_BACKWARD_ZERO_TAIL is False
    assert configs.varlen_gluon_backward_config(128, True)["zero_tail"] is False

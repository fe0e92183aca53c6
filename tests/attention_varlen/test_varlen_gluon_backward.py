"""attention_varlen's Gluon backward (gluon_varlen_backward.py) without a GPU: the kernel's work items,
walk and masks mirrored in float64 against the reference backward (every key of every kv head
stored once, none past a sequence; dQ's reductions past a sequence's end add zeros), the launch's
arguments against the kernel's parameters, routing (off by default), and the sm_90a compile (wgmma,
TMA, spills bounded). The kernel itself runs only on a GPU (experiments/attention/gpu_varlen_bwd.py)."""

import pytest
import torch

from tilecore.ops.attention import configs as fixed_configs
from tilecore.ops.attention_varlen import configs
from tilecore.ops.attention_varlen import op as varlen
from tilecore.ops.attention_varlen.reference import varlen_backward_reference, varlen_reference
from compiled_run import command_json


@pytest.fixture(autouse=True)
def one_thread():
    """The float64 twin's small products on one thread (on a loaded 2-core machine, torch's two
    threads made them 20x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cu_of(lengths):
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist(), dtype=torch.int32)


def cdiv(a, b):
    return -(-a // b)


def key_tile(entry, cu_q, cu_k, block_m, block_n, causal, window):
    """gluon_varlen_backward.VarlenBackward.setup in Python: a dict of the tile's fields."""
    seq, key_block, hk = (int(x) for x in entry[:3])
    b = max(seq, 0)
    q0, k0 = int(cu_q[b]), int(cu_k[b])
    n = int(cu_q[b + 1]) - q0 if seq >= 0 else 0
    nk = int(cu_k[b + 1]) - k0 if seq >= 0 else 0
    start_n = key_block * 2 * block_n
    r = q0 % 4  # query blocks start at packed rows that are multiples of 4 (the lse/delta box's alignment)
    first_mb = 0
    if causal:
        first_mb = (max(start_n - (nk - n), 0) + r) // block_m
    if window:
        left, right = window
        first_mb = (max(start_n - (nk - n) - right, 0) + r) // block_m
        last_key = min(start_n + 2 * block_n, nk) - 1
        last_row = min(n - 1, last_key - (nk - n) + left)
        per_head = max(cdiv(last_row + 1 + r, block_m) - first_mb, 0) if last_row >= 0 else 0
    else:
        per_head = max(cdiv(n + r, block_m) - first_mb, 0) if n > 0 else 0
    shift = key_block % max(per_head, 1)
    return dict(start_n=start_n, hk=hk, first_mb=first_mb, per_head=per_head, shift=shift,
                head0=key_block, q0=q0, k0=k0, N=n, Nk=nk, r=r)


def step_rows(t, step, group, block_m):
    """VarlenBackward.step_rows: (q head, first query row local to the sequence)."""
    if group == 1:
        walked = step + t["shift"]
        block = t["first_mb"] + (walked - t["per_head"] if walked >= t["per_head"] else walked)
        head = 0
    else:
        walked = step // group
        head = (step - walked * group + t["head0"] % group) % group
        block = t["first_mb"] + t["per_head"] - 1 - walked
    return t["hk"] * group + head, block * block_m - t["r"]


def scores_seen(keys, queries, n, nk, causal, window):
    """Which (key, query) scores a query sees, by the definition: key < Nk, 0 <= query < N, causal: key <=
    query + Nk - N, a window (left, right): query + Nk - N - left <= key <= query + Nk - N + right."""
    keys, queries = keys[:, None], queries[None, :]
    ok = (keys < nk) & (queries >= 0) & (queries < n)
    if causal:
        ok &= keys <= queries + (nk - n)
    if window:
        ok &= (keys <= queries + (nk - n) + window[1]) & (keys >= queries + (nk - n) - window[0])
    return ok


def kernel_mask(keys, queries, n, nk, causal, window):
    """VarlenBackward.probabilities' mask: each key's queries are one range [lo, hi) (lo from the key row,
    hi N or, with a window, from the key row), a key past Nk an empty one; two compares a score."""
    shift = nk - n
    lo = torch.zeros_like(keys)
    hi = torch.full_like(keys, n)
    if causal:
        lo = torch.clamp(keys - shift, min=0)
    if window:
        lo = torch.clamp(keys - (shift + window[1]), min=0)
        hi = torch.clamp(keys - (shift - window[0]) + 1, max=n)
    lo = torch.where(keys < nk, lo, n)
    return (queries[None, :] >= lo[:, None]) & (queries[None, :] < hi[:, None])


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (False, (0, 0)), (False, (5, 0)),
                                            (False, (0, 7)), (False, (13, 29)), (False, (400, 400))])
def test_kernel_mask_is_the_definition(causal, window):
    # every block the kernel masks: queries before 0 (a first block's up to 3 rows of the previous
    # sequence) and past N, keys past Nk, N < Nk and N > Nk, the diagonal and the window's edges
    for n in (0, 1, 5, 64, 130):
        for nk in (0, 1, 3, 64, 131):
            for start_n in (0, 64, 128):
                keys = start_n + torch.arange(64)
                for start_m in range(-3, n + 64, 17):
                    queries = start_m + torch.arange(64)
                    assert torch.equal(kernel_mask(keys, queries, n, nk, causal, window),
                                       scores_seen(keys, queries, n, nk, causal, window)), (n, nk, start_n, start_m)


def emulate(q, k, v, dout, lse, delta, cu_q, cu_k, causal, window, scale, block_m=64, block_n=64, zero_tail=False):
    """The kernel's tiles in float64, with its boxes: a step's query rows and a tile's keys read past a
    sequence's end (the next sequence's rows; zeros past the packed end), masked as the kernel masks
    them; dK / dV stored where the kernel stores them. Returns (dq, dk, dv, times each (key, kv head)
    was stored). ``zero_tail``: the kernel's ZERO_TAIL (the next sequence's rows of a box zeroed: K, V
    past Nk; Q, dO past N with lse +inf and delta 0)."""
    total_q, hq, d = q.shape
    total_k, hkv, _ = k.shape
    group = hq // hkv

    def rows(x, first, count, total):  # a TMA box: rows past the packed end arrive as zeros
        idx = torch.arange(first, first + count)
        box = torch.zeros((count,) + x.shape[1:], dtype=x.dtype)
        box[idx < total] = x[idx[idx < total]]
        return box

    stats_lse = torch.where(torch.isneginf(lse), float("inf"), lse)  # the preprocess's row statistics
    dq = torch.zeros(total_q, hq, d, dtype=torch.float64)
    dk = torch.full((total_k, hkv, d), float("nan"), dtype=torch.float64)
    dv = torch.full((total_k, hkv, d), float("nan"), dtype=torch.float64)
    stores = torch.zeros(total_k, hkv, dtype=torch.long)
    # the table kernel's torch twin (equal: test_gluon_varlen; the interpreted kernel is slow here)
    for entry in varlen.work_table_torch(cu_k, cu_q, total_k, hkv, 2 * block_n).tolist():
        t = key_tile(entry, cu_q, cu_k, block_m, block_n, causal, window)
        n, nk, hk = t["N"], t["Nk"], t["hk"]
        for c in range(2):
            start_n = t["start_n"] + c * block_n
            keys = start_n + torch.arange(block_n)
            k_c = rows(k[:, hk], t["k0"] + start_n, block_n, total_k)
            v_c = rows(v[:, hk], t["k0"] + start_n, block_n, total_k)
            if zero_tail:
                k_c[keys >= nk] = 0
                v_c[keys >= nk] = 0
            dk_c = torch.zeros(block_n, d, dtype=torch.float64)
            dv_c = torch.zeros(block_n, d, dtype=torch.float64)
            for step in range(t["per_head"] * group):
                h, start_m = step_rows(t, step, group, block_m)
                queries = start_m + torch.arange(block_m)
                row0 = t["q0"] + start_m
                q_b, do_b = rows(q[:, h], row0, block_m, total_q), rows(dout[:, h], row0, block_m, total_q)
                lse_b, delta_b = rows(stats_lse[h], row0, block_m, total_q), rows(delta[h], row0, block_m, total_q)
                if zero_tail:
                    past = (queries < 0) | (queries >= n)
                    q_b[past], do_b[past], lse_b[past], delta_b[past] = 0, 0, float("inf"), 0
                s_t = k_c @ q_b.T  # [keys, queries]
                assert row0 % 4 == 0  # the lse / delta box's TMA start, 16-byte aligned
                ok = kernel_mask(keys, queries, n, nk, causal, window)
                p_t = torch.exp(torch.where(ok, s_t, float("-inf")) * scale - lse_b[None, :])
                ds_t = p_t * (v_c @ do_b.T - delta_b[None, :])
                if zero_tail:
                    ds_t[:, (queries < 0) | (queries >= n)] = 0
                dv_c += p_t @ do_b
                dk_c += ds_t @ q_b
                live = (row0 + torch.arange(block_m)) < total_q  # the reduction drops rows past the end
                if zero_tail:
                    live &= (queries >= 0) & (queries < n)  # the kernel zeroes them before the reduction
                dq[row0 + torch.arange(block_m)[live], h] += (scale * ds_t.T @ k_c)[live]
            own = keys < nk
            dk[t["k0"] + keys[own], hk] = (scale * dk_c)[own]
            dv[t["k0"] + keys[own], hk] = dv_c[own]
            stores[t["k0"] + keys[own], hk] += 1
    return dq, dk, dv, stores


# lengths 0, 1, odd, one tile (128 keys) and one past it, several tiles; N != Nk (bottom-right)
LENGTHS = [([1, 0, 127, 128, 129, 300, 2], [1, 0, 127, 128, 129, 300, 2]),
           ([300, 1, 64, 0, 65], [300, 5, 200, 7, 1])]
MASKS = [(True, (-1, -1)), (False, (-1, -1)), (False, (100, 37)), (True, (130, -1))]


@pytest.mark.parametrize("causal, window_size", MASKS)
@pytest.mark.parametrize("lens_q, lens_k", LENGTHS)
@pytest.mark.parametrize("hq, hkv", [(2, 1), (3, 3)])  # GQA's walk and one q head a kv head's
def test_tiles_store_every_key_once_and_match_the_reference(lens_q, lens_k, causal, window_size, hq, hkv):
    d = 16
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    g = torch.Generator().manual_seed(len(lens_q) + hq)
    q, dout = (torch.randn(sum(lens_q), hq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    dlse = torch.randn(hq, sum(lens_q), generator=g, dtype=torch.float64)
    scale = d ** -0.5
    out, lse = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, window_size=window_size)
    delta = (out * dout).sum(-1).T - dlse
    is_causal, is_window = varlen.gluon_masks(causal, *window_size)
    window = None
    if is_window:  # the kernel's left / right, as backward_gluon passes them
        wl, wr, has_left, has_right = varlen.kernel_window(causal, *window_size)
        unbounded = max(sum(lens_q), sum(lens_k))
        window = (wl if has_left else unbounded, wr if has_right else unbounded)
    dq, dk, dv, stores = emulate(q, k, v, dout, lse, delta, cu_q, cu_k, is_causal, window, scale)
    ref = varlen_backward_reference(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal=causal, scale=scale,
                                    window_size=window_size, compute_dtype=torch.float64)
    assert (stores == 1).all()  # every key of every kv head once, none past a sequence (no slot there)
    for got, want in zip((dq, dk, dv), ref):
        assert torch.allclose(got, want, atol=1e-9), (got - want).abs().max()


@pytest.mark.parametrize("zero_tail", [True, False])
def test_zero_tail_keeps_the_next_sequences_nonfinite_rows_out(zero_tail):
    lens = [100, 30, 129]  # the first sequence's last key tile and query block read the second's rows
    hq, hkv, d = 2, 1, 16
    cu = cu_of(lens)
    g = torch.Generator().manual_seed(5)
    q, dout = (torch.randn(sum(lens), hq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(sum(lens), hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    scale = d ** -0.5
    out, lse = varlen_reference(q, k, v, cu, cu, causal=True)
    delta = (out * dout).sum(-1).T
    ref = varlen_backward_reference(dout, q, k, v, out, lse, None, cu, cu, causal=True, scale=scale,
                                    compute_dtype=torch.float64)
    # the second sequence's first rows (after the first's last block) and its last rows (before the third's
    # first block: the third starts at row 130, its first query block at the aligned row 128)
    for nxt in (slice(100, 110), slice(126, 130)):
        k[nxt], v[nxt], q[nxt], dout[nxt] = float("nan"), float("inf"), float("nan"), float("inf")
        lse[:, nxt], delta[:, nxt] = float("nan"), float("nan")
    dq, dk, dv, _ = emulate(q, k, v, dout, lse, delta, cu, cu, True, None, scale, zero_tail=zero_tail)
    first = slice(0, 100)
    finite = all(torch.isfinite(x[first]).all() for x in (dq, dk, dv))
    assert finite == zero_tail  # without it, 0 x inf / NaN next door reaches the first sequence
    if zero_tail:
        for got, want in zip((dq, dk, dv), ref):
            assert torch.allclose(got[first], want[first], atol=1e-9)
        for got, want in zip((dq, dk, dv), ref):  # the third sequence's: untouched by the zeros added
            assert torch.allclose(got[130:], want[130:], atol=1e-9)


def emulate_dq(q, k, v, dout, lse, delta, cu_q, cu_k, causal, window, scale, block_m=64, block_n=64):
    """attention_varlen_dq_kernel's tiles in float64 (the forward's work items, 2 block_m rows counted
    from a sequence's last row; a consumer's steps from its rows' first to last key block), its own
    rows stored. Returns (dq, times each (row, q head) was stored)."""
    total_q, hq, d = q.shape
    group = hq // k.shape[1]
    tile_m = 2 * block_m
    dq = torch.full(q.shape, float("nan"), dtype=torch.float64)
    stores = torch.zeros(total_q, hq, dtype=torch.long)
    for seq, tile, h, _ in varlen.work_table_torch(cu_q, cu_k, total_q, hq, tile_m).tolist():
        b = max(seq, 0)
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        n = int(cu_q[b + 1]) - q0 if seq >= 0 else 0
        nk = int(cu_k[b + 1]) - k0 if seq >= 0 else 0
        first, end = max(n - (tile + 1) * tile_m, 0), n - tile * tile_m
        first_block = 0  # gluon_varlen.VarlenAttention.setup
        if causal:
            hi = max(min(nk, first + tile_m + nk - n), 0)
        elif window:
            first_block = max(first + nk - n - window[0], 0) // block_n
            hi = max(min(nk, min(first + tile_m, n) - 1 + nk - n + window[1] + 1), 0)
        else:
            hi = nk
        n_blocks = max(cdiv(hi, block_n) - first_block, 0) if n > 0 else 0
        for c in range(2):
            own_first_row = first + c * block_m
            own_first, n_own = 0, n_blocks  # VarlenDQ.start
            if causal:
                n_own = min(cdiv(max(min(nk, own_first_row + block_m + nk - n), 0), block_n), n_blocks)
            if window:
                own_first = max(max(own_first_row + nk - n - window[0], 0) // block_n - first_block, 0)
                own_hi = max(min(nk, min(own_first_row + block_m, n) - 1 + nk - n + window[1] + 1), 0)
                n_own = min(cdiv(own_hi, block_n) - first_block, n_blocks)
            if own_first_row >= end:
                continue
            rows = torch.arange(own_first_row, min(own_first_row + block_m, end))  # its own rows
            acc = torch.zeros(len(rows), d, dtype=torch.float64)
            for step in range(own_first, n_own):
                keys = (first_block + step) * block_n + torch.arange(block_n)
                keys = keys[keys < nk]  # past Nk: masked (the next sequence's keys)
                s = q[q0 + rows, h] @ k[k0 + keys, h // group].T * scale
                ok = torch.ones_like(s, dtype=torch.bool)
                if causal:
                    ok &= keys[None, :] <= rows[:, None] + (nk - n)
                if window:
                    ok &= (keys[None, :] <= rows[:, None] + (nk - n) + window[1]) \
                        & (keys[None, :] >= rows[:, None] + (nk - n) - window[0])
                row_lse = torch.where(torch.isneginf(lse[h, q0 + rows]), float("inf"), lse[h, q0 + rows])
                p = torch.exp(torch.where(ok, s, float("-inf")) - row_lse[:, None])
                ds = p * (dout[q0 + rows, h] @ v[k0 + keys, h // group].T - delta[h, q0 + rows][:, None])
                acc += ds @ k[k0 + keys, h // group]
            dq[q0 + rows, h] = scale * acc
            stores[q0 + rows, h] += 1
    return dq, stores


@pytest.mark.parametrize("causal, window_size", MASKS)
@pytest.mark.parametrize("lens_q, lens_k", LENGTHS)
def test_dq_tiles_store_every_row_once_and_match_the_reference(lens_q, lens_k, causal, window_size):
    hq, hkv, d = 2, 1, 16
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    g = torch.Generator().manual_seed(len(lens_q))
    q, dout = (torch.randn(sum(lens_q), hq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    dlse = torch.randn(hq, sum(lens_q), generator=g, dtype=torch.float64)
    scale = d ** -0.5
    out, lse = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, window_size=window_size)
    delta = (out * dout).sum(-1).T - dlse
    is_causal, is_window = varlen.gluon_masks(causal, *window_size)
    window = None
    if is_window:
        wl, wr, has_left, has_right = varlen.kernel_window(causal, *window_size)
        unbounded = max(sum(lens_q), sum(lens_k))
        window = (wl if has_left else unbounded, wr if has_right else unbounded)
    dq, stores = emulate_dq(q, k, v, dout, lse, delta, cu_q, cu_k, is_causal, window, scale)
    ref = varlen_backward_reference(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal=causal, scale=scale,
                                    window_size=window_size, compute_dtype=torch.float64)
    assert (stores == 1).all()  # every row of every q head once, none past a sequence
    assert torch.allclose(dq, ref[0], atol=1e-9), (dq - ref[0]).abs().max()


def test_gluon_window_bounds_each_side_by_the_batch():
    # the kernels add left / right to key and query positions in 32 bits: a side past any distance in the
    # batch is passed as unbounded's value (max(total_q, total_k)), whatever the caller gave
    assert varlen.gluon_window(False, 2**31 - 1, 5, 300, 200) == (300, 5)
    assert varlen.gluon_window(False, 7, 2**40, 300, 500) == (7, 500)
    assert varlen.gluon_window(True, -1, -1, 300, 200) == (300, 0)
    assert varlen.gluon_window(False, -1, 3, 10, 20) == (20, 3)


def test_launch_passes_every_kernel_parameter(monkeypatch):
    from tilecore.ops.attention_varlen import gluon_backward as gluon_varlen_backward

    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    monkeypatch.setattr(varlen, "GLUON_VARLEN_BWD", Recorder())
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    # the fused-dQ launch (the shipped D128 rows split dQ off since session 28: one more kernel after it)
    monkeypatch.setitem(configs.VARLEN_GLUON_BACKWARD_CONFIG, (128, True),
                        dict(configs.VARLEN_GLUON_BACKWARD_CONFIG[128, True], dq_from="fused"))
    lengths = [70, 1, 0, 20]
    cu = cu_of(lengths)
    total = sum(lengths)
    q, dout, out = (torch.randn(total, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k = torch.randn(total, 1, 128, dtype=torch.bfloat16)
    lse = torch.randn(4, total)
    dq, dk, dv = varlen.backward_gluon(dout, q, k, k, out, lse, None, cu, cu, True, 0.1, 100, -1, 30.0)
    (grid, args, kwargs), = calls
    params = gluon_varlen_backward.attention_varlen_bwd_kernel.arg_names
    assert kwargs.pop("num_warps") == 4 and sorted(params[len(args):]) == sorted(kwargs)
    named = dict(zip(params, args))
    assert named["GROUP"] == 4 and named["num_tiles"] == len(named["work"])
    assert grid == (min(132, len(named["work"])),)
    assert kwargs["SOFTCAP"] == 2 and kwargs["DQ"] == fixed_configs.DQ_MODES["fused"]
    # causal with a left edge: a window (100, 0), its 100 past the batch's 91 tokens: 91 (as unbounded, session 31)
    assert kwargs["CAUSAL"] is False and kwargs["WINDOW"] is True and (named["left"], named["right"]) == (total, 0)
    assert named["q_desc"].shape == [4, total, 128] and named["q_desc"].block_shape == [1, 64, 128]
    assert named["k_desc"].block_shape == [1, 128, 128] and named["dk_desc"].block_shape == [1, 64, 128]
    assert named["dk_desc"].base.data_ptr() == dk.data_ptr() and named["dk_ptr"] is dk
    assert named["kv_row_stride"] == 128
    assert named["dq_desc"].shape == [4, total, 128] and named["dq_desc"].block_shape == [1, 64, 64]
    assert named["stats_desc"].shape == [4, 2, total] and named["stats_desc"].block_shape == [1, 2, 64]
    # the work table over the keys: (sequence, key tile of 128 keys, kv head)
    assert torch.equal(named["work"], varlen.work_table_torch(cu, cu, total, 1, 128))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape


def test_split_launch_runs_dkdv_without_dq_then_the_dq_kernel(monkeypatch):
    from tilecore.ops.attention_varlen import gluon_backward as gluon_varlen_backward

    calls = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.setdefault(self.name, (grid, args, kwargs))

    monkeypatch.setattr(varlen, "GLUON_VARLEN_BWD", Recorder("dkdv"))
    monkeypatch.setattr(varlen, "GLUON_VARLEN_DQ", Recorder("dq"))
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    lengths = [70, 1, 0, 20]
    cu = cu_of(lengths)
    total = sum(lengths)
    q, dout, out = (torch.randn(total, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k = torch.randn(total, 2, 128, dtype=torch.bfloat16)
    lse = torch.randn(4, total)
    cfg = dict(configs.varlen_gluon_backward_config(128, False), dq_from="gluon")
    dq, dk, dv = varlen.backward_gluon(dout, q, k, k, out, lse, None, cu, cu, False, 0.1, -1, -1, 0.0, config=cfg)
    assert calls["dkdv"][2]["DQ"] == 0
    grid, args, kwargs = calls["dq"]
    params = gluon_varlen_backward.attention_varlen_dq_kernel.arg_names
    assert kwargs.pop("num_warps") == 4 and sorted(params[len(args):]) == sorted(kwargs)
    named = dict(zip(params, args))
    bm = fixed_configs.GLUON_DQ[128]["block_m"]
    assert named["GROUP"] == 2 and named["total_q"] == total and named["num_tiles"] == len(named["work"])
    assert torch.equal(named["work"], varlen.work_table_torch(cu, cu, total, 4, 2 * bm))  # the forward's table
    assert named["q_desc"].block_shape == [1, 2 * bm, 128] and named["dq_desc"].block_shape == [1, bm, 128]
    assert named["dq_desc"].base.data_ptr() == dq.data_ptr() and named["dq_ptr"] is dq
    assert named["lse_ptr"].shape == (4, total) and named["delta_ptr"].shape == (1, 4, total)
    assert kwargs["CAUSAL"] is False and kwargs["WINDOW"] is False


def test_gluon_backward_is_on_after_its_gpu_check_and_never_taken_on_the_cpu():
    # session 28's H100 run 10 checked it (windows too); ZERO_TAIL waits for its own check
    assert configs.VARLEN_GLUON_BACKWARD is True and configs.VARLEN_GLUON_BACKWARD_FEATURES == frozenset({"window"})
    assert configs.VARLEN_GLUON_BACKWARD_ZERO_TAIL is False
    q = torch.randn(10, 2, 128, dtype=torch.bfloat16)
    assert not varlen.gluon_backward_fits(q, q, q, True, -1, -1)
    assert not varlen.gluon_backward_fits(q, q, q, True, -1, -1, use_gluon=True)  # a CPU tensor


def test_switched_on_the_backward_routes_eligible_calls_to_the_gluon_kernel(monkeypatch):
    # what flipping configs.VARLEN_GLUON_BACKWARD does, on a pretended Hopper (CPU tensors stand in)
    monkeypatch.setattr(configs, "VARLEN_GLUON_BACKWARD", True)
    monkeypatch.setattr(varlen, "gluon_device", lambda device: True)
    monkeypatch.setattr(varlen.dispatch, "backend_for", lambda device: "kernel")
    taken = []
    monkeypatch.setattr(varlen, "backward_gluon", lambda *args: taken.append(args) or ("dq", "dk", "dv"))
    cu = cu_of([3, 0, 70])
    q = torch.randn(73, 4, 128, dtype=torch.bfloat16)
    kv = torch.randn(73, 2, 128, dtype=torch.bfloat16)
    fits = varlen.gluon_backward_fits
    assert fits(q, kv, kv, True, -1, -1) and fits(q, kv, kv, False, -1, -1)
    assert fits(q[..., :64], kv[..., :64], kv[..., :64], True, -1, -1)
    assert fits(q, kv, kv, True, 100, -1) and fits(q, kv, kv, False, 5, 5)  # windows: VARLEN_GLUON_BACKWARD_FEATURES
    assert not fits(q, kv, kv, False, 5, 5, features=frozenset())
    assert not fits(q[..., :96], kv[..., :96], kv[..., :96], True, -1, -1)  # D 96
    assert not fits(q, kv, kv[..., :64].contiguous(), True, -1, -1)  # Dv != D
    assert not fits(q.float(), kv.float(), kv.float(), True, -1, -1)
    assert not fits(q, kv, kv, True, -1, -1, use_gluon=False)
    lse = torch.zeros(4, 73)
    assert varlen._backward_impl(q, q, kv, kv, q, lse, None, cu, cu, True, 0.1, -1, -1, 0.0) == ("dq", "dk", "dv")
    assert len(taken) == 1 and taken[0][9] is True


def test_configs_name_a_dq_mode_the_kernel_takes():
    for (d, causal), cfg in configs.VARLEN_GLUON_BACKWARD_CONFIG.items():
        assert fixed_configs.DQ_MODES[cfg["dq_from"]] in (0, 1, 3) and d in (64, 128) and cfg["dq_from"] != "tl"
        assert configs.varlen_gluon_backward_config(d, causal) == dict(cfg, zero_tail=False)


@pytest.fixture(scope="module")
def compiled_report():
    return command_json(["-m", "tilecore.ops.attention_varlen.gluon_backward", "--quick"], timeout=600)


def test_compiles_for_sm90a_with_wgmma_and_tma(compiled_report):
    # two compiles (D128 causal: the shipped config's dK/dV kernel, dQ split off, and the fused dQ's): the full
    # report (python -m tilecore.ops.attention_varlen.gluon_backward) adds D64, no mask, GQA, softcap and the window
    assert {(r["D"], r["causal"]) for r in compiled_report} == {(128, True)}
    assert {r["dq_from"] for r in compiled_report} == {configs.varlen_gluon_backward_config(128, True)["dq_from"],
                                                       "fused"}
    for r in compiled_report:
        assert r["wgmma"] and r["tma"] and r["mbarrier"] and not r["wgmma_serialized"], r
        assert r["shared"] <= 227 * 1024, r
        # the fixed D128 causal kernels spill 192 bytes (fused dQ) and 28 (dQ split off); the sequence's masks
        # add to it: with each key's query range (session 31) 276 / 92 bytes stored (the per-score form of the
        # five conditions before: 432 / 128)
        assert r["spill_stores"] <= (300 if r["dq_from"] == "fused" else 100), r

"""attention_varlen's Gluon forward (gluon_varlen.py) without a GPU: its work table (device torch ops:
every (row, head) of every sequence in exactly the tiles it should be, longest first, an upper bound
from the shapes), the kernel's tile rules mirrored in float64 against the reference (the key blocks a
consumer walks cover every key its rows see; rows past a sequence never stored), the launch's
arguments against the kernel's parameters, routing (off by default), and the sm_90a compile (wgmma,
TMA, no spills). The kernel itself runs only on a GPU (experiments/attention/gpu_varlen.py --quick)."""
import math

import pytest
import torch

from tilecore.ops.attention_varlen import configs
from tilecore.ops.attention_varlen import op as varlen
from tilecore.ops.attention_varlen.reference import varlen_reference
from compiled_run import command_json


def cu_of(lengths):
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist(), dtype=torch.int32)


def tile_rows(entry, cu_q, cu_k, tile_m, block_n, causal, window=None):
    """gluon_varlen.VarlenAttention.setup in Python: (q0, k0, N, Nk, first row, key blocks, end, first
    key block); ``window``: the kernel's (left, right)."""
    seq, tile = int(entry[0]), int(entry[1])
    b = max(seq, 0)
    q0, k0 = int(cu_q[b]), int(cu_k[b])
    n = int(cu_q[b + 1]) - q0 if seq >= 0 else 0
    nk = int(cu_k[b + 1]) - k0 if seq >= 0 else 0
    first = max(n - (tile + 1) * tile_m, 0)
    first_block = 0
    if causal:
        hi = max(min(nk, first + tile_m + nk - n), 0)
    elif window:
        left, right = window
        first_block = max(first + nk - n - left, 0) // block_n
        hi = max(min(nk, min(first + tile_m, n) - 1 + nk - n + right + 1), 0)
    else:
        hi = nk
    n_blocks = max(-(-hi // block_n) - first_block, 0) if n > 0 else 0
    return q0, k0, n, nk, first, n_blocks, n - tile * tile_m, first_block


def consumer_steps(first, n, nk, n_blocks, end, first_block, block_m, block_n, causal, window=None):
    """gluon_varlen.VarlenAttention.start: the steps [own_first, n_own) a consumer's rows from
    ``first`` walk."""
    own_first, n_own = 0, n_blocks
    if causal:
        own_hi = max(min(nk, first + block_m + nk - n), 0)
        n_own = min(max(-(-own_hi // block_n), 1), n_blocks)
    if window:
        left, right = window
        own_lo = max(first + nk - n - left, 0) // block_n - first_block
        own_hi = max(min(nk, min(first + block_m, n) - 1 + nk - n + right + 1), 0)
        own_first = min(max(own_lo, 0), n_blocks - 1)
        n_own = min(max(-(-own_hi // block_n) - first_block, own_first + 1), n_blocks)
    return own_first, (n_own if first < end else 0)


def emulate(q, k, v, cu_q, cu_k, causal, window=None, block_m=64, block_n=128, consumers=2):
    """The kernel's tiles in float64: each consumer's rows against the keys of the blocks it walks
    (keys past the sequence, after the diagonal or outside the window masked), stored where the
    kernel stores them (the tile's own rows). Returns (O, lse, times each (row, head) was stored)."""
    total_q, hq, d = q.shape
    group = hq // k.shape[1]
    tile_m = block_m * consumers
    out = torch.full((total_q, hq, v.shape[2]), float("nan"), dtype=torch.float64)
    lse = torch.full((hq, total_q), float("nan"), dtype=torch.float64)
    stores = torch.zeros(total_q, hq, dtype=torch.long)
    for entry in varlen.work_table(cu_q, cu_k, total_q, hq, tile_m).tolist():
        q0, k0, n, nk, first, n_blocks, end, first_block = tile_rows(entry, cu_q, cu_k, tile_m, block_n, causal,
                                                                     window)
        h = entry[2]
        for c in range(consumers):
            own_first = first + c * block_m
            lo, hi = consumer_steps(own_first, n, nk, n_blocks, end, first_block, block_m, block_n, causal, window)
            rows = torch.arange(own_first, max(own_first, min(own_first + block_m, end)))
            if rows.numel() == 0:
                continue
            keys = torch.arange((first_block + lo) * block_n, max((first_block + lo) * block_n,
                                                                  min((first_block + hi) * block_n, nk)))
            s = (q[q0 + rows, h].double() @ k[k0 + keys, h // group].double().T) * d ** -0.5
            if causal:
                s = s.masked_fill(keys[None, :] > rows[:, None] + (nk - n), float("-inf"))
            if window:
                position = rows[:, None] + (nk - n)
                s = s.masked_fill((keys[None, :] < position - window[0]) | (keys[None, :] > position + window[1]),
                                  float("-inf"))
            m = torch.logsumexp(s, 1) if keys.numel() else torch.full((rows.numel(),), float("-inf"), dtype=s.dtype)
            p = torch.exp(s - torch.where(torch.isinf(m), 0.0, m)[:, None])
            o = p @ v[k0 + keys, h // group].double() / torch.where(torch.isinf(m), 1.0, p.sum(1))[:, None]
            out[q0 + rows, h] = o
            lse[h, q0 + rows] = m
            stores[q0 + rows, h] += 1
    return out, lse, stores


# lengths 0, 1, odd, one tile (128 rows) and one past it, several tiles; N != Nk (bottom-right)
LENGTHS = [([1, 0, 127, 128, 129, 300, 2], [1, 0, 127, 128, 129, 300, 2]),
           ([300, 1, 64, 0, 65], [300, 5, 200, 7, 1])]


# (causal, window_size as the caller gives it): a window takes the kernel's WINDOW (causal folded in)
MASKS = [(True, (-1, -1)), (False, (-1, -1)), (False, (100, 37)), (True, (130, -1)), (False, (0, 0))]


@pytest.mark.parametrize("causal, window_size", MASKS)
@pytest.mark.parametrize("lens_q, lens_k", LENGTHS)
def test_tiles_store_every_row_once_and_match_the_reference(lens_q, lens_k, causal, window_size):
    hq, hkv, d = 2, 1, 16  # GQA
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    q = torch.randn(sum(lens_q), hq, d)
    k = torch.randn(sum(lens_k), hkv, d)
    v = torch.randn(sum(lens_k), hkv, d)
    is_causal, is_window = varlen.gluon_masks(causal, *window_size)
    window = None
    if is_window:  # the kernel's left / right, as forward_gluon passes them
        wl, wr, has_left, has_right = varlen.kernel_window(causal, *window_size)
        unbounded = max(sum(lens_q), sum(lens_k))
        window = (wl if has_left else unbounded, wr if has_right else unbounded)
    out, lse, stores = emulate(q, k, v, cu_q, cu_k, is_causal, window)
    ref, ref_lse = varlen_reference(q.double(), k.double(), v.double(), cu_q, cu_k, causal=causal,
                                    window_size=window_size)
    assert (stores == 1).all()  # every row of every head once, no row past a sequence (those have no slot)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    live = torch.isfinite(ref_lse)
    assert torch.allclose(lse[live], ref_lse[live], atol=1e-9)
    assert torch.allclose(out, ref, atol=1e-9)
    assert (out.transpose(0, 1)[torch.isneginf(ref_lse)] == 0).all()  # rows with no key: O = 0


def test_work_table_is_longest_first_and_bounded_by_the_shapes():
    lengths = [5, 4000, 0, 1, 700, 4000, 129]
    cu = cu_of(lengths)
    hq, tile_m = 3, 128
    table = varlen.work_table(cu, cu, sum(lengths), hq, tile_m)
    assert table.dtype == torch.int32 and table.shape == ((math.ceil(sum(lengths) / tile_m) + len(lengths)) * hq, 4)
    real = table[table[:, 0] >= 0]
    assert len(real) == sum(math.ceil(n / tile_m) for n in lengths) * hq
    assert (table[len(real):, 0] == -1).all()  # the padding entries come last
    # sequences in order of N x Nk (ties: batch order), each one's tiles head by head, heaviest first
    seqs = list(dict.fromkeys(real[:, 0].tolist()))
    assert seqs == [1, 5, 4, 6, 0, 3]
    first = real[real[:, 0] == 1]
    tiles = math.ceil(4000 / tile_m)
    assert first[:, 2].tolist() == sum(([h] * tiles for h in range(hq)), [])
    assert first[:, 1].tolist() == list(range(tiles)) * hq


def test_work_table_of_an_empty_batch_has_only_padding():
    cu = cu_of([0, 0])
    table = varlen.work_table(cu, cu, 0, 2, 128)
    assert table.shape == (4, 4) and (table[:, 0] == -1).all()


def test_launch_passes_every_kernel_parameter(monkeypatch):
    from tilecore.ops.attention_varlen import gluon_forward as gluon_varlen

    calls = []

    class Recorder:  # CachedLaunch.run's call (key None: a plain launch)
        def run(self, key, grid, args, kwargs):
            calls.append((grid, args, kwargs))

    monkeypatch.setattr(varlen, "GLUON_VARLEN_FWD", Recorder())
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    lengths = [300, 1, 0, 77]
    cu = cu_of(lengths)
    q = torch.randn(sum(lengths), 8, 128, dtype=torch.bfloat16)
    k = torch.randn(sum(lengths), 2, 128, dtype=torch.bfloat16)
    out, lse = varlen.forward_gluon(q, k, k, cu, cu, True, 0.1, 30.0, 100, -1)
    (grid, args, kwargs), = calls
    params = gluon_varlen.attention_varlen_fwd_kernel.arg_names
    assert kwargs.pop("num_warps") == 4 and sorted(params[len(args):]) == sorted(kwargs)
    named = dict(zip(params, args))
    assert named["GROUP"] == 4 and named["total_q"] == sum(lengths) and named["num_tiles"] == len(named["work"])
    assert grid == (min(132, len(named["work"])),)
    assert kwargs["SOFTCAP"] == 2  # tanh.approx, as the fixed Gluon forward
    # causal with a left edge: a window (100, 0); the unbounded side past any distance
    assert kwargs["CAUSAL"] is False and kwargs["WINDOW"] is True and (named["left"], named["right"]) == (100, 0)
    assert named["q_desc"].shape == [8, sum(lengths), 128] and named["q_desc"].strides == [128, 8 * 128, 1]
    assert named["k_desc"].block_shape == [1, 128, 128] and named["o_desc"].base.data_ptr() == out.data_ptr()
    assert out.shape == (sum(lengths), 8, 128) and lse.shape == (8, sum(lengths))


def test_gluon_path_is_never_taken_on_the_cpu_and_windows_go_to_it_after_their_gpu_check():
    assert configs.VARLEN_GLUON_FEATURES == frozenset({"window"})  # session 28's H100 check
    q = torch.randn(10, 2, 128, dtype=torch.bfloat16)
    assert not varlen.gluon_forward_fits(q, q, q, True, -1, -1)
    assert not varlen.gluon_forward_fits(q, q, q, True, -1, -1, use_gluon=True)  # a CPU tensor


@pytest.fixture(scope="module")
def compiled_report():
    return command_json(["-m", "tilecore.ops.attention_varlen.gluon_forward", "--quick"], timeout=600)


def test_compiles_for_sm90a_with_wgmma_and_tma_and_no_spills(compiled_report):
    # one compile (20-50 s here): causal with the softcap, the default path's most code (python -m
    # tilecore.ops.attention_varlen.gluon_forward compiles D 64 / 128, causal and not, and the window (not
    # routed by default): no spill but the window's 8 / 16 bytes)
    assert {(r["D"], r["causal"], r["softcap"], r["window"]) for r in compiled_report} == {(128, True, 2, False)}
    for r in compiled_report:
        assert r["wgmma"] and r["tma"] and r["mbarrier"] and not r["wgmma_serialized"], r
        # the window's per-consumer first step and bounds: 8 bytes stored, 16 loaded (scalars; the fixed
        # forward's window spills 20 / 36)
        allowed = 16 if r["window"] else 0
        assert r["spill_stores"] <= allowed and r["spill_loads"] <= allowed and r["stack"] <= allowed, r
        assert r["shared"] <= 227 * 1024, r


@pytest.mark.parametrize("lengths_q, lengths_k", [
    ([5, 4000, 0, 1, 700, 4000, 129], [5, 4000, 0, 1, 700, 4000, 129]),
    ([0, 0], [3, 0]),
    ([128, 256, 127, 3, 3, 300], [1, 256, 900, 3, 0, 300])])
def test_work_table_kernel_matches_its_torch_twin(lengths_q, lengths_k):
    cu_q, cu_k = cu_of(lengths_q), cu_of(lengths_k)
    for heads in (1, 3):
        fast = varlen.work_table(cu_q, cu_k, sum(lengths_q), heads, 128)
        assert torch.equal(fast, varlen.work_table_torch(cu_q, cu_k, sum(lengths_q), heads, 128))


def test_switched_on_the_public_op_routes_eligible_calls_to_the_gluon_forward(monkeypatch):
    # what flipping configs.VARLEN_GLUON_FORWARD does, on a pretended Hopper (CPU tensors stand in)
    monkeypatch.setattr(configs, "VARLEN_GLUON_FORWARD", True)
    monkeypatch.setattr(varlen, "gluon_device", lambda device: True)
    taken = []
    monkeypatch.setattr(varlen, "forward_gluon", lambda *args, key=None: taken.append(args) or ("out", "lse"))
    cu = cu_of([3, 0, 70])
    q = torch.randn(73, 4, 128, dtype=torch.bfloat16)
    kv = torch.randn(73, 2, 128, dtype=torch.bfloat16)
    fits = varlen.gluon_forward_fits
    assert fits(q, kv, kv, True, -1, -1) and fits(q, kv, kv, False, -1, -1) and fits(q[..., :64], kv[..., :64],
                                                                                     kv[..., :64], True, -1, -1)
    assert fits(q, kv, kv, False, -1, 0)  # the window (-1, 0) is causal
    assert fits(q, kv, kv, True, 100, -1) and fits(q, kv, kv, False, 5, 5)  # configs.VARLEN_GLUON_FEATURES
    assert not fits(q, kv, kv, False, 5, 5, features=frozenset())  # without "window": the tl kernels
    assert not fits(q[..., :96], kv[..., :96], kv[..., :96], True, -1, -1)  # D 96
    assert not fits(q, kv, kv[..., :64].contiguous(), True, -1, -1)  # Dv != D
    assert not fits(q.float(), kv.float(), kv.float(), True, -1, -1)
    assert not fits(q, kv.transpose(1, 2).contiguous().transpose(1, 2), kv, True, -1, -1)  # D's stride 2: no TMA
    assert not fits(q, kv, kv, True, -1, -1, use_gluon=False)
    assert varlen._forward_impl(q, kv, kv, cu, cu, True, 0.1, -1, -1, 0.0) == ("out", "lse")
    assert len(taken) == 1 and taken[0][5] is True and taken[0][-2:] == (-1, -1)
    assert varlen.gluon_masks(True, -1, -1) == (True, False) and varlen.gluon_masks(False, -1, -1) == (False, False)
    assert varlen.gluon_masks(True, 100, -1) == (False, True) and varlen.gluon_masks(False, -1, 3) == (False, True)

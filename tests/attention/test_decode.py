"""The split-key (decode) path of tilecore.attention through Triton's interpreter, in fp16 (bf16 is
checked on the GPU by experiments/attention/decode_probe.py): against the float64 reference, into
poisoned buffers, with the keys split in several ways, grouped heads packed into a tile, causal rows
that see no key, and the split count's rule."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference, launch
from tilecore.ops.attention_decode import configs, plan

from attention_testing import F16, check_lse, make, reference_grads  # tests/attention


def decode_poisoned(q, k, v, causal, scale, splits):
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32)
    launch.forward_into(q, k, v, out, lse, causal, scale, path="decode", splits=splits)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), "some outputs were never written"
    return out, lse


# B, Hq, Hkv, N, Nk, D, causal, splits (the interpreter's blocks are 16 keys: 100 keys in 3 splits
# are ranges of 48, 48 and 4)
CASES = [
    (1, 4, 2, 1, 100, 64, False, 1),
    (1, 4, 2, 1, 100, 64, False, 3),
    (2, 8, 2, 3, 200, 80, True, 4),     # packed rows of 3 queries x 4 heads; D not a power of two
    (1, 4, 4, 16, 70, 32, True, 2),     # MHA, 16 queries: the last split is past some rows' diagonal
    (1, 20, 1, 4, 90, 64, True, 3),     # MQA, 80 packed rows: two tiles of 64 rows
    (1, 2, 1, 5, 3, 64, True, 1),       # N > Nk: rows 0 and 1 see no key
    (1, 2, 1, 40, 20, 64, True, 2),     # ... with the keys split: every part of rows 0..19 is empty
    (2, 2, 1, 1, 1, 16, False, 1),
]
IDS = [f"B{b}-H{h}/{hk}-N{n}-Nk{nk}-D{d}-{'causal' if c else 'full'}-splits{s}" for b, h, hk, n, nk, d, c, s in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_split_keys_near_the_rounding_floor(case):
    *shape, causal, splits = case
    q, k, v = make(*shape)
    out, lse = decode_poisoned(q, k, v, causal, shape[-1] ** -0.5, splits)
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    assert accuracy.error_over_floor(out, ref) <= 2.0
    check_lse(lse, ref_lse)
    empty = torch.isneginf(ref_lse)
    assert (out[empty] == 0).all()


def test_no_keys_at_all():
    q, k, v = make(1, 4, 2, 1, 0, 32)
    out, lse = decode_poisoned(q, k, v, False, 0.2, None)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_negative_scale_and_strided_cache():
    # K and V as the first 75 rows of a (B, Nmax, Hkv, D) cache viewed as (B, Hkv, N, D)
    cache_k, cache_v = (torch.randn(2, 128, 2, 32, dtype=F16) for _ in range(2))
    k, v = cache_k[:, :75].transpose(1, 2), cache_v[:, :75].transpose(1, 2)
    q = torch.randn(2, 6, 2, 32, dtype=F16)
    for scale in (0.3, -0.3):
        out, lse = decode_poisoned(q, k, v, True, scale, 3)
        ref, ref_lse = attention_reference(q, k, v, causal=True, scale=scale)
        assert accuracy.error_over_floor(out, ref) <= 2.0
        check_lse(lse, ref_lse)


def test_the_public_function_takes_it_for_few_queries_and_differentiates(monkeypatch):
    calls = []
    monkeypatch.setattr(configs, "DECODE_MIN_SPLIT_KEYS", 16)
    monkeypatch.setattr(configs, "DECODE_PROGRAMS_PER_SM", 4)  # the interpreter's 4 "SMs" then ask for splits
    real = plan.decode_splits
    monkeypatch.setattr(plan, "decode_splits", lambda *a: calls.append(real(*a)) or calls[-1])
    q, k, v = make(2, 8, 2, 2, 150, 64, grad=True)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert calls == [4]  # 16 programs asked of 4 tiles (2 batches x 2 kv heads)
    ref, ref_lse = attention_reference(q, k, v, causal=True)
    assert accuracy.error_over_floor(out.detach(), ref) <= 2.0
    check_lse(lse.detach(), ref_lse)
    # the backward (the usual kernels) from the split path's out and lse
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for g, r in zip(grads, reference_grads(q, k, v, dout, None, True, 64**-0.5)):
        assert accuracy.error_over_floor(g, r) <= 3.0
    # 32 queries of a group of 4 pack 128 rows: still split; 40 queries (160 rows) in 5 x 8 query
    # tiles take the query blocks
    attention(*make(5, 8, 2, 32, 30, 64))
    assert len(calls) == 2
    attention(*make(5, 8, 2, 40, 30, 64))
    assert len(calls) == 2


@pytest.mark.parametrize("b,hq,hkv,n,fits", [
    (4, 32, 8, 1, True), (4, 32, 8, 16, True), (4, 32, 8, 32, True), (4, 32, 8, 33, False),
    (4, 32, 32, 64, True), (4, 32, 32, 65, False), (4, 128, 1, 16, True), (4, 128, 1, 17, False),
    # few query tiles of 128 rows (B x Hq x ceil(N / 128) <= 32), up to 512 queries
    (1, 32, 8, 128, True), (1, 32, 8, 129, False), (1, 8, 8, 512, True), (1, 8, 8, 513, False),
    (2, 8, 8, 256, True), (2, 8, 8, 257, False),
])
def test_which_inputs_split_the_keys(b, hq, hkv, n, fits):
    q, k = torch.empty(b, hq, n, 64), torch.empty(b, hkv, 100, 64)
    assert plan.decode_fits(q, k) == fits


@pytest.mark.parametrize("tiles,nk,programs,expect", [
    (8, 1024, 132, 8),        # B 1, 8 kv heads, one wave of 132 programs asked: 8 ranges of 128 keys
    (8, 4096, 132, 16),       # 16 ranges of 256 keys: 128 programs
    (8, 16384, 132, 16),
    (8, 2**20, 4 * 132, 64),  # at most DECODE_MAX_SPLITS
    (64, 4096, 132, 2),
    (128, 4096, 132, 1),      # a wave of tiles already: no split, no merge
    (8, 100, 132, 1),         # fewer keys than a split's least
    (8, 0, 132, 1),
])
def test_split_count_rule(tiles, nk, programs, expect):
    splits = plan.decode_splits(tiles, nk, 64, programs, 128)
    assert splits == expect
    ranges, keys = plan.key_ranges(nk, splits, 64)
    assert ranges == splits and keys % 64 == 0 and (ranges - 1) * keys < max(nk, 1) <= ranges * keys

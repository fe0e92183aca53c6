"""tilecore.compat.flash_attn: flash-attn 2's signatures and return values against tilecore's own
functions (the same kernels, so equal results), the packed batch against the dense one it packs,
and the arguments tilecore does not implement refused by name. On the CPU path (torch's CPU math,
float32): the interpreter's kernels behind these functions are tested in test_varlen, test_kvcache
and the attention tests."""
import inspect

import pytest
import torch

import tilecore
from tilecore import accuracy
from tilecore.compat import flash_attn as fa
from tilecore.ops.attention_kvcache import attention_with_kvcache
from tilecore.ops.attention.reference import reference_attention
from tilecore.ops.attention_varlen import attention_varlen


@pytest.fixture(autouse=True)
def _cpu_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def test_signatures_are_flash_attn_2s():
    # flash-attn 2.x flash_attn_interface: names, order and defaults
    assert list(inspect.signature(fa.flash_attn_func).parameters) == [
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
        "deterministic", "return_attn_probs"]
    assert list(inspect.signature(fa.flash_attn_varlen_func).parameters) == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p", "softmax_scale",
        "causal", "window_size", "softcap", "alibi_slopes", "deterministic", "return_attn_probs", "block_table"]
    assert list(inspect.signature(fa.flash_attn_with_kvcache).parameters) == [
        "q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
        "cache_leftpad", "block_table", "softmax_scale", "causal", "window_size", "softcap", "rotary_interleaved",
        "alibi_slopes", "num_splits", "return_softmax_lse"]
    assert inspect.signature(fa.flash_attn_func).parameters["window_size"].default == (-1, -1)


@pytest.mark.parametrize("options", [dict(causal=True), dict(window_size=(3, 2), softcap=2.0, softmax_scale=0.2)])
def test_flash_attn_func_is_tilecore_attention_in_bnhd(options):
    q = torch.randn(2, 9, 4, 16, requires_grad=True)  # (B, N, H, D)
    k = torch.randn(2, 11, 2, 16, requires_grad=True)
    v = torch.randn(2, 11, 2, 8, requires_grad=True)
    out = fa.flash_attn_func(q, k, v, **options)
    assert out.shape == (2, 9, 4, 8)
    scale = options.pop("softmax_scale", None)
    ref, _ = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                                 compute_dtype=torch.float64, **options)
    assert accuracy.rel_rms(out.detach(), ref.detach().transpose(1, 2)) < 1e-5
    mine = tilecore.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, **options)
    assert torch.equal(out, mine.transpose(1, 2))
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    expect = torch.autograd.grad(mine.transpose(1, 2), (q, k, v), dout)
    assert all(torch.equal(a, b) for a, b in zip(got, expect))


def test_varlen_of_equal_lengths_is_the_dense_batch():
    b, n, h, d = 3, 7, 2, 16
    q, k, v = (torch.randn(b, n, h, d, requires_grad=True) for _ in range(3))
    cu = torch.arange(0, (b + 1) * n, n, dtype=torch.int32)
    packed = fa.flash_attn_varlen_func(q.reshape(b * n, h, d), k.reshape(b * n, h, d), v.reshape(b * n, h, d),
                                       cu, cu, n, n, causal=True, window_size=(4, -1))
    dense = fa.flash_attn_func(q, k, v, causal=True, window_size=(4, -1))
    assert accuracy.rel_rms(packed.detach().view(b, n, h, d), dense.detach()) < 1e-6
    dout = torch.randn(b, n, h, d)
    g_packed = torch.autograd.grad(packed, (q, k, v), dout.reshape(b * n, h, d))
    g_dense = torch.autograd.grad(dense, (q, k, v), dout)
    assert all(accuracy.rel_rms(a, c) < 1e-5 for a, c in zip(g_packed, g_dense))
    assert torch.equal(packed, attention_varlen(q.reshape(b * n, h, d), k.reshape(b * n, h, d),
                                                v.reshape(b * n, h, d), cu, cu, n, n, causal=True,
                                                window_size=(4, -1)))


def test_with_kvcache_returns_out_and_lse_and_takes_an_int_length():
    q = torch.randn(2, 1, 4, 16)
    k_cache, v_cache = torch.randn(2, 32, 2, 16), torch.randn(2, 32, 2, 16)
    k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    mine_k, mine_v = k_cache.clone(), v_cache.clone()
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=10, causal=True,
                                          return_softmax_lse=True, num_splits=4)
    assert out.shape == (2, 1, 4, 16) and lse.shape == (2, 4, 1)
    expect, expect_lse = attention_with_kvcache(q, mine_k, mine_v, k, v, cache_seqlens=torch.tensor([10, 10]).int(),
                                                causal=True, return_lse=True)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse) and torch.equal(k_cache, mine_k)
    assert torch.equal(k_cache[:, 10], k[:, 0])
    full = fa.flash_attn_with_kvcache(q, k_cache, v_cache)  # cache_seqlens=None: every cache full
    assert torch.equal(full, attention_with_kvcache(q, k_cache, v_cache,
                                                    cache_seqlens=torch.full((2,), 32, dtype=torch.int32)))


@pytest.mark.parametrize("call,name", [
    (lambda q: fa.flash_attn_func(q, q, q, dropout_p=0.1), "dropout_p"),
    (lambda q: fa.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2)), "alibi_slopes"),
    (lambda q: fa.flash_attn_func(q, q, q, return_attn_probs=True), "return_attn_probs"),
    (lambda q: fa.flash_attn_varlen_func(q[0], q[0], q[0], *[torch.tensor([0, 4]).int()] * 2, 4, 4,
                                         block_table=torch.zeros(1, 1).int()), "block_table"),
    (lambda q: fa.flash_attn_with_kvcache(q, q, q, rotary_cos=torch.ones(4, 8), rotary_sin=torch.ones(4, 8)),
     "rotary_cos"),
    (lambda q: fa.flash_attn_with_kvcache(q, q, q, cache_batch_idx=torch.zeros(1).int()), "cache_batch_idx"),
    (lambda q: fa.flash_attn_with_kvcache(q, q, q, cache_leftpad=torch.zeros(1).int()), "cache_leftpad"),
])
def test_unsupported_arguments_are_named(call, name):
    with pytest.raises(NotImplementedError, match=name):
        call(torch.randn(1, 4, 2, 16))

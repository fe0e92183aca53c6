"""tilecore.attention_with_kvcache through Triton's interpreter (fp16) against the float64 reference:
paged and contiguous caches poisoned with NaN beyond every sequence's length (and block-table entries
past a sequence's pages pointing at a NaN page), so a read past a length shows; lengths 0, 1, odd and
a part-filled tail page; new keys appended in place; decode and chunked prefill; key splits merged;
the CPU path; the custom op under torch.compile; bad input."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.attention_kvcache import op as kvcache
from tilecore.ops.attention_kvcache import attention_with_kvcache
from tilecore.ops.attention_kvcache.reference import gather_cache, kvcache_reference

F16 = torch.float16
NAN = float("nan")


def make_cache(lengths, hkv, d, dv, page=None, max_pages=4, dtype=F16):
    """(k_cache, v_cache, block_table): rows < length random, everything else NaN. Paged: pages in a
    shuffled order, page 0 all NaN and every table entry past a sequence's pages naming it."""
    b = len(lengths)
    if page is None:
        shape = (b, max(lengths) + 8, hkv)
        k_cache, v_cache = torch.full(shape + (d,), NAN, dtype=dtype), torch.full(shape + (dv,), NAN, dtype=dtype)
        for i, n in enumerate(lengths):
            k_cache[i, :n], v_cache[i, :n] = torch.randn(n, hkv, d), torch.randn(n, hkv, dv)
        return k_cache, v_cache, None
    pages = 1 + b * max_pages
    k_cache = torch.full((pages, page, hkv, d), NAN, dtype=dtype)
    v_cache = torch.full((pages, page, hkv, dv), NAN, dtype=dtype)
    table = (1 + torch.randperm(b * max_pages)).view(b, max_pages).int()
    for i, n in enumerate(lengths):
        for j in range(n):
            k_cache[table[i, j // page], j % page] = torch.randn(hkv, d)
            v_cache[table[i, j // page], j % page] = torch.randn(hkv, dv)
    return k_cache, v_cache, table


def poison_unused_entries(table, lengths, page):
    for i, n in enumerate(lengths):
        table[i, -(-n // page):] = 0  # the NaN page


# (lengths before the call, Nnew, Nq, Hq, Hkv, D, Dv, page, options)
CASES = [
    ([0, 17, 40], 1, 1, 4, 2, 32, 32, 16, dict()),                                     # decode, paged 16
    ([5, 33], 3, 3, 2, 1, 16, 16, 32, dict(causal=True, window_size=(6, -1), softcap=1.5)),  # chunked prefill
    ([1, 22], 0, 2, 2, 2, 16, 24, None, dict(causal=True, scale=-0.3)),               # contiguous, no new keys
]
IDS = ["decode-paged16-gqa", "prefill-paged32-window-softcap", "contiguous-dv-causal"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_near_the_rounding_floor_never_reading_past_a_length(case):
    lengths, nnew, nq, hq, hkv, d, dv, page, options = case
    k_cache, v_cache, table = make_cache([n + nnew for n in lengths], hkv, d, dv, page)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    new_k = torch.randn(len(lengths), nnew, hkv, d, dtype=F16)
    new_v = torch.randn(len(lengths), nnew, hkv, dv, dtype=F16)
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    for i, n in enumerate(lengths):  # the rows the new keys go to: poisoned too until the call writes them
        for t in range(nnew):
            where = (i, n + t) if table is None else (int(table[i, (n + t) // page]), (n + t) % page)
            expect_k[where], expect_v[where] = new_k[i, t], new_v[i, t]
            k_cache[where] = v_cache[where] = NAN
    if table is not None:
        poison_unused_entries(table, [n + nnew for n in lengths], page)
    q = torch.randn(len(lengths), nq, hq, d, dtype=F16)
    ref, ref_lse = kvcache_reference(q, expect_k, expect_v, seqlens + nnew, block_table=table, **options)

    out, lse = attention_with_kvcache(q, k_cache, v_cache, new_k if nnew else None, new_v if nnew else None,
                                      cache_seqlens=seqlens, block_table=table, return_lse=True, **options)
    assert torch.equal(k_cache.isnan(), expect_k.isnan()) and torch.equal(v_cache.isnan(), expect_v.isnan())
    assert torch.equal(k_cache.nan_to_num(), expect_k.nan_to_num()), "the append wrote elsewhere"
    assert torch.equal(v_cache.nan_to_num(), expect_v.nan_to_num())
    assert seqlens.tolist() == lengths, "cache_seqlens is not updated (flash-attn's contract)"
    scale = options.get("scale", d ** -0.5)
    left, right = options.get("window_size", (-1, -1))
    capacity = k_cache.shape[1] * (1 if table is None else table.shape[1])
    for splits in (None, 1, 3):
        if splits is not None:  # the kernels alone, into poisoned outputs, the keys split in several ways
            out = torch.full(out.shape, NAN, dtype=F16)
            lse = torch.full(lse.shape, NAN)
            kvcache.forward_kernels(q, k_cache, v_cache, nnew, seqlens, table, options.get("causal", False), scale,
                                    left, right, options.get("softcap", 0.0), capacity, splits=splits, out=out,
                                    lse=lse)
        assert not out.isnan().any() and not lse.isnan().any(), f"NaN read or a row not written (splits {splits})"
        assert accuracy.error_over_floor(out, ref) <= 2.0
        live = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        assert torch.allclose(lse[live].double(), ref_lse[live], rtol=1e-5, atol=1e-5)


def test_cpu_path_float32_and_empty_rows(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    lengths = [0, 3, 20]
    k_cache, v_cache, table = make_cache(lengths, 2, 16, 16, page=16, dtype=torch.float32)
    poison_unused_entries(table, lengths, 16)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(3, 2, 4, 16)
    out, lse = attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True,
                                      return_lse=True)
    ref, ref_lse = kvcache_reference(q, k_cache, v_cache, seqlens, block_table=table, causal=True)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()  # no key: 0 and -inf
    live = ~torch.isneginf(ref_lse)
    assert accuracy.rel_rms(out[1:], ref[1:]) < 1e-5 and torch.allclose(lse[live].double(), ref_lse[live])


def test_custom_op_opcheck_and_compile_fullgraph_mutating_the_cache(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    lengths = [4, 9]
    k_cache, v_cache, table = make_cache([n + 1 for n in lengths], 2, 16, 16, page=16, dtype=torch.float32)
    k_cache, v_cache = k_cache.nan_to_num(), v_cache.nan_to_num()
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    q, k, v = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    torch.library.opcheck(torch.ops.tilecore.attention_with_kvcache.default,
                          (q, k_cache.clone(), v_cache.clone(), k, v, seqlens, table, False, 0.25, -1, -1, 0.0,
                           k_cache.shape[1] * table.shape[1]), test_utils=("test_schema", "test_faketensor"))

    def step(q, k_cache, v_cache, k, v):
        return attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                                      scale=0.25)

    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    expect = step(q, eager_k, eager_v, k, v)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k_cache, v_cache, k, v)
    assert torch.allclose(got, expect, rtol=1e-5, atol=1e-6)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), "the compiled call appended too"


def _call(**change):
    lengths = [3, 20]
    k_cache, v_cache, table = make_cache(lengths, 1, 16, 16, page=16, max_pages=2)
    args = dict(q=torch.randn(2, 1, 2, 16, dtype=F16), k_cache=k_cache, v_cache=v_cache,
                k=torch.randn(2, 1, 1, 16, dtype=F16), v=torch.randn(2, 1, 1, 16, dtype=F16),
                cache_seqlens=torch.tensor(lengths, dtype=torch.int32), block_table=table)
    args.update(change)
    q, kc, vc, k, v = (args.pop(n) for n in ("q", "k_cache", "v_cache", "k", "v"))
    return lambda: attention_with_kvcache(q, kc, vc, k, v, **args)


@pytest.mark.parametrize("change,words", [
    (dict(block_table=torch.tensor([[1, 2], [3, 99]], dtype=torch.int32)), "outside"),
    (dict(block_table=torch.tensor([[-1, 2], [3, 4]], dtype=torch.int32)), "outside"),
    (dict(cache_seqlens=torch.tensor([3, 32], dtype=torch.int32)), "capacity"),
    (dict(cache_seqlens=torch.tensor([3, 20])), "int32"),
    (dict(block_table=torch.zeros(2, 2)), "block_table must be int32"),
    (dict(k_cache=torch.randn(5, 8, 1, 16, dtype=F16), v_cache=torch.randn(5, 8, 1, 16, dtype=F16)), "page_size"),
    (dict(v=None), "together"),
    (dict(q=torch.randn(2, 1, 3, 16, dtype=F16), k_cache=torch.randn(5, 16, 2, 16, dtype=F16),
          v_cache=torch.randn(5, 16, 2, 16, dtype=F16), k=None, v=None), "multiple"),
    (dict(q=torch.randn(2, 3, 16, dtype=F16)), "4-D"),
    (dict(block_table=None), "contiguous cache must be"),
    (dict(window_size=(3, -3)), "window_size"),
    (dict(softcap=-2.0), "softcap"),
])
def test_bad_input_is_refused_clearly(change, words):
    with pytest.raises((TypeError, ValueError), match=words):
        _call(**change)()


def test_key_splits_count_the_row_blocks_among_the_programs():
    # decode: one row block a kv head, the keys split for a wave (4 SMs interpreted, 768 keys: 3 of >= 256 keys);
    # a chunk of 64 queries x 4 q heads: 4 row blocks of 64 already fill the wave, one split and no merge pass
    kc = vc = torch.zeros(1, 768, 1, 32)
    for nq, splits in ((1, 3), (64, 1)):
        q = torch.zeros(1, nq, 4, 32)
        layout = kvcache._DecodeLayout(q, kc, vc, None, True, -1, -1, 0.0, 768, None)
        assert layout.splits == splits and layout.merged == (splits == 1)


def test_gather_cache_reads_pages_in_table_order():
    k_cache, _, table = make_cache([40], 1, 16, 16, page=16)
    rows = gather_cache(k_cache, 0, 40, table)
    assert rows.shape == (40, 1, 16) and not rows.isnan().any()
    assert torch.equal(rows[16:32], k_cache[table[0, 1]])

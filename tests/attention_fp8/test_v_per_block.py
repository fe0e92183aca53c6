"""v's descales per block of 128 keys (session 34, the convenience path's ``v_scales="block"``): the quantizer's one
pass (codes and descales as quantize_fp8's), the emulation against float64, the tl kernel (interpreter) against the
emulation at tails, GQA and causal in both v layouts, the public call's checks, and the convenience path end to end
(near float64; more accurate than one descale a head where v's magnitude changes along the keys)."""
import pytest
import torch

from tilecore.ops.attention_fp8 import (attention_fp8, attention_fp8_emulated, attention_fp8_exact,
                                        attention_fp8_rotated, quantize_fp8)
from tilecore.ops.attention_fp8 import launch
from tilecore.ops.attention_fp8.quantize import quantize_v_permuted


def rel_rms(x, ref):
    ref = ref.double()
    return ((x.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def inputs(B, Hq, Hkv, N, Nk, D, seed=0, spread=True):
    """q, k N(0, 1) / N(0, 4); v N(0, 1) times a magnitude that changes by 10^4 along the keys (with ``spread``)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g) * 2
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    if spread:
        v = v * torch.logspace(-2, 2, Nk)[:, None]
    return q, k, v


def test_quantizer_one_pass_is_quantize_fp8_per_block():
    g = torch.Generator().manual_seed(1)
    for Nk, D in ((300, 64), (45, 48), (128, 32)):
        v = (torch.randn(2, 2, Nk, D, generator=g) * torch.logspace(-1, 1, Nk)[:, None]).to(torch.float16)
        want, want_descale = quantize_fp8(v, per="block", layout="keys_permuted")
        for options in (dict(), dict(permute_in_registers=True)):
            codes, descale = quantize_v_permuted(v, per="block", **options)
            assert descale.shape == (2, 2, -(-Nk // 128))
            assert torch.equal(descale, want_descale), options
            assert torch.equal(codes.float(), want.float()), options


def test_quantizer_zero_block_and_bad_per():
    v = torch.zeros(1, 1, 200, 32, dtype=torch.float16)
    v[0, 0, 150] = 3.0
    codes, descale = quantize_v_permuted(v, per="block")
    assert descale[0, 0, 0] == 1.0 and descale[0, 0, 1] == pytest.approx(3.0 / 448)  # an all-zero block: 1
    with pytest.raises(ValueError, match="per must be"):
        quantize_v_permuted(v, per="token")


def test_emulation_near_float64_and_equal_to_per_head_when_the_blocks_share_one_descale():
    q, k, v = inputs(1, 2, 1, 70, 300, 32)
    q8, qs = quantize_fp8(q, per="token")
    k8, ks = quantize_fp8(k, per="block")
    v8, vs = quantize_fp8(v, per="block")
    emu, lse = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=True, p_linear=True)
    ref, lse_ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=True)
    assert 1e-3 < rel_rms(emu, ref) < 0.05
    # one descale a head given as a descale a block: the same O (float32 sums in another order)
    v8h, vsh = quantize_fp8(v, per="head")
    per_head = attention_fp8_emulated(q8, k8, v8h, qs, ks, vsh)[0]
    as_blocks = attention_fp8_emulated(q8, k8, v8h, qs, ks, vsh[:, :, None].expand(1, 1, 3).contiguous())[0]
    assert (per_head - as_blocks).abs().max() <= 1e-6 * per_head.abs().max()


# (B, Hq, Hkv, N, Nk, D, causal, q/k descales, v layout): tails, GQA, N > Nk causal (rows with no key)
CASES = [(1, 2, 1, 40, 300, 64, False, "head", "keys_permuted"),
         (1, 4, 2, 70, 260, 32, True, "block", "bhnd"),
         (2, 2, 2, 300, 150, 48, True, "token", "keys_permuted")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_tl_kernel_is_the_emulated_math(case):
    B, Hq, Hkv, N, Nk, D, causal, per, layout = case
    q, k, v = inputs(B, Hq, Hkv, N, Nk, D, seed=N + Nk)
    q8, qs = quantize_fp8(q, per=per)
    k8, ks = quantize_fp8(k, per=per)
    v8, vs = quantize_fp8(v, per="block")
    v_in = quantize_fp8(v, per="block", layout=layout)[0]
    plan = launch.plan(q8, k8, causal, path="tl")
    out = torch.full((B, Hq, N, D), float("nan"))
    lse = torch.full((B, Hq, N), float("nan"))
    launch.forward(plan, q8, k8, v_in, qs, ks, vs, causal, D ** -0.5, torch.float32, layout == "keys_permuted",
                   out=out, lse=lse)
    emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal, block_n=plan.config["BLOCK_N"])
    ref, lse_ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=causal)
    assert not out.isnan().any() and not lse.isnan().any()  # every element written
    assert (out - emu).abs().max() <= 1e-5 * emu.abs().max()
    assert torch.equal(lse.isinf(), lse_emu.isinf()) and (lse - lse_emu).nan_to_num(0, 0, 0).abs().max() < 1e-5
    seen = torch.isfinite(lse_ref)
    assert 0.003 < rel_rms(out[seen], ref[seen]) < 0.04
    assert (out[~seen] == 0).all()
    if causal and N > Nk:
        assert (~seen).any()


def test_public_call_takes_per_block_v_descales_and_refuses_other_shapes():
    q, k, v = inputs(1, 2, 1, 40, 300, 32, spread=False)
    q8, qs = quantize_fp8(q)
    k8, ks = quantize_fp8(k)
    v8, vs = quantize_fp8(v, per="block")
    out = attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=torch.float32)
    ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs)[0]
    assert rel_rms(out, ref) < 0.04
    for bad in (torch.ones(1, 1, 300), torch.ones(1, 1, 2), torch.ones(1, 1, 4)):
        with pytest.raises(ValueError, match="per block of 128 keys"):
            attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs * torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize("causal", [False, True])
def test_convenience_path_near_float64_and_no_worse_than_per_head(causal):
    q, k, v = (t.to(torch.float16) for t in inputs(1, 2, 2, 90, 400, 32, seed=7))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=False) \
        if not causal else None
    if causal:  # bottom right (N < Nk)
        s = (q.double() @ k.double().transpose(-1, -2)) * 32 ** -0.5
        allowed = torch.arange(400)[None, :] <= torch.arange(90)[:, None] + 400 - 90
        ref = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v.double()
    block = attention_fp8_rotated(q, k, v, causal=causal, v_scales="block")
    head = attention_fp8_rotated(q, k, v, causal=causal, v_scales="head")
    e_block, e_head = rel_rms(block, ref), rel_rms(head, ref)
    assert e_block < 0.1, e_block  # (FP8 of q, k with k ~ N(0, 4): sharp rows; as the per-head form)
    assert e_block <= e_head * 1.02, (e_block, e_head)  # v's small keys keep their bits with their block's descale
    with pytest.raises(ValueError, match="v_scales must be"):
        attention_fp8_rotated(q, k, v, v_scales="token")


def test_convenience_path_traces_under_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g) for _ in range(3))

    def f(q, k, v):
        return attention_fp8_rotated(q, k, v, causal=True, v_scales="block") * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.equal(got, f(q, k, v))

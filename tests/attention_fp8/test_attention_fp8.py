"""attention_fp8 on the CPU: the tl kernel (Triton's interpreter) against the float32 emulation of the
kernels' math and against float64 attention on the dequantized inputs; P's rounding; the kernel's V
layout; descales per head, per block and per token; tails, GQA, causal; bad input; torch.compile;
the convenience path's rotation."""
import math

import pytest
import torch
import triton
import triton.language as tl

from tilecore.ops.attention_fp8 import (attention_fp8, attention_fp8_emulated, attention_fp8_exact,
                                        attention_fp8_rotated, quantize_fp8)
from tilecore.ops.attention_fp8 import launch
from tilecore.ops.attention_fp8.kernels_tl import round_to_e4m3
from tilecore.ops.attention_fp8.reference import key_position, keys_permuted, keys_unpermuted

F8 = torch.float8_e4m3fn


def rel_rms(x, ref):
    ref = ref.double()
    return ((x.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def inputs(B, Hq, Hkv, N, Nk, D, per, seed=0, layout="bhnd"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g) * 2
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    q8, qs = quantize_fp8(q, per=per)
    k8, ks = quantize_fp8(k, per=per)
    v8, vs = quantize_fp8(v, per="head")
    v_in = quantize_fp8(v, per="head", layout=layout)[0]
    return q8, k8, v8, v_in, qs, ks, vs


# (B, Hq, Hkv, N, Nk, D, causal, per, v layout): tails (N, Nk not multiples of the blocks), GQA, N > Nk
# causal (rows with no key), one query, D not a power of two
CASES = [(1, 2, 1, 40, 70, 64, False, "head", "keys_permuted"),
         (1, 2, 1, 40, 70, 64, True, "token", "bhnd"),
         (1, 4, 2, 70, 45, 32, True, "block", "keys_permuted"),
         (2, 2, 2, 1, 50, 48, False, "head", "bhnd")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_tl_kernel_is_the_emulated_math_and_near_float64(case):
    B, Hq, Hkv, N, Nk, D, causal, per, layout = case
    q8, k8, v8, v_in, qs, ks, vs = inputs(B, Hq, Hkv, N, Nk, D, per, layout=layout)
    plan = launch.plan(q8, k8, causal, path="tl")
    out = torch.full((B, Hq, N, D), float("nan"))
    lse = torch.full((B, Hq, N), float("nan"))
    launch.forward(plan, q8, k8, v_in, qs, ks, vs, causal, D ** -0.5, torch.float32, layout == "keys_permuted",
                   out=out, lse=lse)
    emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal, block_n=plan.config["BLOCK_N"])
    ref, lse_ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=causal)
    assert not out.isnan().any() and not lse.isnan().any()  # every element written
    # the same math: float32 sums in another order only (P's e4m3 rounding is the emulation's)
    assert (out - emu).abs().max() < 1e-5
    assert torch.equal(lse.isinf(), lse_emu.isinf()) and (lse - lse_emu).nan_to_num(0, 0, 0).abs().max() < 1e-5
    # against float64: P's rounding to e4m3 (3 bits: 2^-4 relative) dominates; lse has no P rounding
    seen = torch.isfinite(lse_ref)
    err = rel_rms(out[seen], ref[seen])
    assert 0.003 < err < 0.04, err
    assert (lse.double()[seen] - lse_ref[seen]).abs().max() < 1e-5
    assert (out[~seen] == 0).all() and (lse[~seen] == float("-inf")).all()  # rows with no key
    if causal and N > Nk:
        assert (~seen).any()


def test_tl_kernel_with_real_e4m3_casts_matches_the_float16_emulation_path():
    # UPCAST=False: e4m3 dots and the float32 -> e4m3 cast of P (wrong in the interpreter for some values,
    # so only O's bulk is compared here; the GPU runs check it exactly: experiments/attention_fp8/gpu_fp8.py)
    q8, k8, v8, v_in, qs, ks, vs = inputs(1, 2, 2, 32, 64, 64, "head")
    plan = launch.plan(q8, k8, False, path="tl")
    plan.config["UPCAST"] = False
    out, _ = launch.forward(plan, q8, k8, v8, qs, ks, vs, False, 0.125, torch.float32)
    emu, _ = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, block_n=plan.config["BLOCK_N"])
    assert torch.isfinite(out).all() and rel_rms(out, emu) < 0.2


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, round_to_e4m3(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def test_round_to_e4m3_is_torchs_cast():
    codes = torch.arange(0, 127, dtype=torch.uint8).view(F8).float()  # every e4m3 value in [0, 448]
    mids = (codes[1:] + codes[:-1]) / 2  # ties: to even
    x = torch.cat([codes, mids, mids * (1 + 1e-6), mids * (1 - 1e-6), torch.rand(500) * 256,
                   torch.exp2(-torch.rand(500) * 24) * 256])
    y = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    assert torch.equal(y, x.to(F8).float())


def test_kernel_v_layout_round_trips_and_permutes_within_32():
    pos = key_position(torch.arange(64))
    assert sorted(pos.tolist()) == list(range(64)) and (pos // 32 == torch.arange(64) // 32).all()
    v = torch.randn(2, 3, 45, 16).to(F8)
    vp = keys_permuted(v)
    assert vp.shape == (2, 3, 16, 64) and vp.is_contiguous()
    assert torch.equal(keys_unpermuted(vp, 45).float(), v.float())
    assert (vp.float()[..., pos[45:]] == 0).all()  # padding keys are zeros


def test_cpu_path_is_the_emulation():
    q8, k8, v8, v_in, qs, ks, vs = inputs(1, 2, 1, 20, 30, 64, "token", layout="keys_permuted")
    out, lse = launch.forward(launch.plan(q8, k8, True, path="emulate"), q8, k8, v_in, qs, ks, vs, True, 0.1,
                              torch.bfloat16, True)
    emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=True, softmax_scale=0.1,
                                          out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, emu) and torch.equal(lse, lse_emu)


def test_public_function_outputs():
    q8, k8, v8, v_in, qs, ks, vs = inputs(1, 2, 1, 33, 40, 64, "head")
    o, lse = attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, causal=True, return_lse=True)
    assert o.shape == (1, 2, 33, 64) and o.dtype == torch.bfloat16 and lse.shape == (1, 2, 33)
    assert lse.dtype == torch.float32
    ref, _ = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=True)
    seen = torch.isfinite(lse)
    assert rel_rms(o.float()[seen], ref[seen]) < 0.04
    o16 = attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=torch.float16)
    assert o16.dtype == torch.float16


def test_torch_compile_fullgraph():
    q8, k8, v8, v_in, qs, ks, vs = inputs(1, 2, 1, 16, 32, 64, "head")

    def f(q8, k8, v8, qs, ks, vs):
        return attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=torch.float32) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q8, k8, v8, qs, ks, vs)
    assert torch.allclose(got, f(q8, k8, v8, qs, ks, vs))


def test_bad_input_says_what_is_accepted():
    q8, k8, v8, v_in, qs, ks, vs = inputs(1, 2, 1, 16, 32, 64, "head")
    call = lambda **kw: attention_fp8(**{**dict(q=q8, k=k8, v=v8, q_scale=qs, k_scale=ks, v_scale=vs), **kw})
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        call(q=q8.float())
    with pytest.raises(ValueError, match=r"q_scale must have shape \(1, 2\) or \(1, 2, 1\) or \(1, 2, 16\)"):
        call(q_scale=torch.ones(1, 2, 5))
    with pytest.raises(ValueError, match="v_scale must have shape"):
        call(v_scale=torch.ones(1, 1, 32))
    with pytest.raises(TypeError, match="k_scale must be a float32 tensor"):
        call(k_scale=ks.double())
    with pytest.raises(ValueError, match="finite and > 0"):
        call(k_scale=torch.zeros_like(ks))
    with pytest.raises(ValueError, match="finite and > 0"):
        call(q_scale=torch.full_like(qs, float("inf")))
    with pytest.raises(ValueError, match="head_dim must be from 1 to 256"):
        z = torch.zeros(1, 2, 4, 300).to(F8)
        attention_fp8(z, z, z, q_scale=torch.ones(1, 2), k_scale=torch.ones(1, 2), v_scale=torch.ones(1, 2))
    with pytest.raises(ValueError, match="multiple of k's and v's heads"):
        kv = torch.zeros(1, 2, 32, 64).to(F8)
        call(q=torch.zeros(1, 3, 16, 64).to(F8), k=kv, v=kv, q_scale=torch.ones(1, 3), k_scale=torch.ones(1, 2),
             v_scale=torch.ones(1, 2))
    with pytest.raises(TypeError, match="out_dtype"):
        call(out_dtype=torch.int8)
    with pytest.raises(ValueError, match="softmax_scale"):
        call(softmax_scale=-1.0)
    with pytest.raises(ValueError, match="keys_permuted"):
        call(v_layout="keys_permuted")  # v not in that layout
    with pytest.raises(ValueError, match="v_layout"):
        call(v_layout="bnhd")
    with pytest.raises(ValueError, match="4-D"):
        call(q=q8[0])


def test_forward_only():
    x = torch.randn(1, 2, 16, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match="forward-only"):
        attention_fp8_rotated(x, x, x)
    with pytest.raises(RuntimeError, match="forward-only"):
        q8, k8, v8, v_in, qs, ks, vs = inputs(1, 2, 1, 16, 32, 64, "head")
        attention_fp8(q8, k8, v8, q_scale=qs.requires_grad_(), k_scale=ks, v_scale=vs)
    with torch.no_grad():
        assert attention_fp8_rotated(x, x, x).shape == x.shape


def test_rotation_leaves_qk_unchanged_and_the_rotated_path_is_near_float64():
    import tilecore
    from tilecore.ops.attention_fp8.quantize import rotation_signs

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 24, 64, generator=g) for _ in range(3))
    signs = rotation_signs(64, q.device)
    assert torch.equal(signs, rotation_signs(64, q.device)) and set(signs.tolist()) == {-1.0, 1.0}
    rot = lambda x: tilecore.hadamard_transform(x * signs, scale=64 ** -0.5)
    assert torch.allclose(rot(q) @ rot(k).transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-4)
    qd, kd, vd = (t.double() for t in (q, k, v))
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / 8, -1) @ vd
    for rotate in (True, False):
        out = attention_fp8_rotated(q, k, v, rotate=rotate)
        assert out.dtype == torch.float32 and rel_rms(out, ref) < 0.05


def test_v_quantizer_kernel_writes_the_kernel_layout():
    from tilecore.ops.attention_fp8.quantize import quantize_v_permuted

    v = (torch.randn(1, 2, 45, 48) * 3).to(torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)  # strided
    codes, descale = quantize_v_permuted(v)
    want, want_descale = quantize_fp8(v, per="head", layout="keys_permuted")
    assert codes.shape == (1, 2, 48, 64) and codes.is_contiguous()
    assert torch.equal(descale, want_descale) and torch.equal(codes.float(), want.float())

"""The softmax's session-27 variants (reference.py and the tl kernel), OFF by default:

* conditional rescaling (FlashAttention-4's idea; the kernels' RESCALE_TAU and P_SHIFT): a row's running max moves
  only where the block's max exceeds it by more than tau, so O *= alpha can be skipped where no row moved;
* l of the rounded P (the tl kernel's L_ROUNDED, the emulation's l_rounded; the Hopper kernel's L_MMA sums P on
  the tensor cores, as P times a block of ones).

Checked on the CPU: the tl kernel (Triton's interpreter) is the emulation's math with the same rules, both stay
within FP8's own error of float64, P's larger range (up to 2^(shift + tau)) does not saturate, and bad (tau, shift)
pairs are refused. The Hopper kernel sums the rounded P (its shipped l: test_attention_fp8_hopper_compile); its
RESCALE_TAU branch, right and slower on the H100 (session 27), was removed by issue 30 (code at commit 741bc3b)."""
import pytest
import torch

from tilecore.ops.attention_fp8 import attention_fp8_emulated, attention_fp8_exact, launch, quantize_fp8
from tilecore.ops.attention_fp8.reference import check_rescale


def rel_rms(x, ref):
    ref = ref.double()
    return ((x.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def ramp_inputs(B, Hq, Hkv, N, Nk, D, seed, per="token"):
    """Random q, k, v, with k growing along the keys: each row's max rises through the blocks in steps both
    under and over tau, so both branches of the rule (m kept with p above 2^shift, m moved) are taken."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    ramp = torch.linspace(0.5, 2.0, Nk)[None, None, :, None]
    k = (torch.randn(B, Hkv, Nk, D, generator=g) + 0.3 * q[:, : Hkv].mean(2, keepdim=True)) * ramp
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    q8, qs = quantize_fp8(q, per=per)
    k8, ks = quantize_fp8(k, per=per)
    v8, vs = quantize_fp8(v, per="head")
    return q8, k8, v8, qs, ks, vs


# (B, Hq, Hkv, N, Nk, D, causal, tau, shift, l of the rounded P): tails, GQA, rows with no key (causal, N > Nk)
CASES = [(1, 4, 2, 45, 100, 64, True, 0.8, 8, False),
         (1, 2, 1, 70, 45, 32, True, 2.8, 6, True),
         (2, 2, 2, 33, 90, 64, False, 1.8, 7, False),
         (1, 4, 2, 45, 100, 64, True, 0.0, 8, True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_tl_kernel_is_the_emulated_rule_and_near_float64(case):
    B, Hq, Hkv, N, Nk, D, causal, tau, shift, l_rounded = case
    q8, k8, v8, qs, ks, vs = ramp_inputs(B, Hq, Hkv, N, Nk, D, seed=len(CASES) + N)
    plan = launch.plan(q8, k8, causal, path="tl")
    plan.config.update(RESCALE_TAU=tau, P_SHIFT=shift, L_ROUNDED=l_rounded)
    out = torch.full((B, Hq, N, D), float("nan"))
    lse = torch.full((B, Hq, N), float("nan"))
    launch.forward(plan, q8, k8, v8, qs, ks, vs, causal, D ** -0.5, torch.float32, out=out, lse=lse)
    block_n = plan.config["BLOCK_N"]
    emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal, block_n=block_n, rescale_tau=tau,
                                          p_shift=shift, l_rounded=l_rounded)
    always, _ = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal, block_n=block_n)
    ref, lse_ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=causal)
    assert not out.isnan().any() and not lse.isnan().any()  # every element written
    assert (out - emu).abs().max() < 1e-5  # the same math, float32 sums in another order
    assert torch.equal(lse.isinf(), lse_emu.isinf()) and (lse - lse_emu).nan_to_num(0, 0, 0).abs().max() < 1e-5
    assert not torch.equal(emu, always)  # the rule changed some step's P (its rounding follows the kept max)
    seen = torch.isfinite(lse_ref)
    err, err_always = rel_rms(out[seen], ref[seen]), rel_rms(always[seen], ref[seen])
    # FP8's own error (P's 3 mantissa bits), not worse than rescaling every step by more than a fifth
    assert 0.003 < err < 1.2 * err_always + 1e-3 and err < 0.04, (err, err_always)
    # exact with l of the float32 p (l and O use the same m); l of the rounded P is off by at most P's rounding, 2^-4
    assert (lse.double()[seen] - lse_ref[seen]).abs().max() < (0.065 if l_rounded else 1e-5)
    assert (out[~seen] == 0).all() and (lse[~seen] == float("-inf")).all()
    if causal and N > Nk:
        assert (~seen).any()


def test_kept_max_lets_p_exceed_its_scale_without_saturating():
    # one key block whose max is 0.7 (log2) above the first block's: with tau 0.8 the max is kept and the new
    # block's largest P is 2^(8 + 0.7) ~ 416 (< 448: no saturation), and the output is exact up to P's rounding
    D = 32
    q = torch.zeros(1, 1, 1, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 64, D)
    k[0, 0, :32, 0] = 1.0
    k[0, 0, 32:, 0] = 1.0 + 0.7 * (D ** 0.5) / 1.4426950408889634  # 0.7 higher in base 2 after the scale
    v = torch.randn(1, 1, 64, D, generator=torch.Generator().manual_seed(1))
    q8, qs = quantize_fp8(q + 0.0, per="head")
    k8, ks = quantize_fp8(k, per="head")
    v8, vs = quantize_fp8(v, per="head")
    ref, _ = attention_fp8_exact(q8, k8, v8, qs, ks, vs)
    kept, _ = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, block_n=32, rescale_tau=0.8)
    moved, _ = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, block_n=32)
    for out in (kept, moved):
        assert rel_rms(out, ref) < 0.05
    assert not torch.equal(kept, moved)


@pytest.mark.parametrize("tau, shift", [(1.0, 8), (-0.1, 8), (3.0, 6), (0.0, 0), (0.0, 9)])
def test_bad_pairs_are_refused(tau, shift):
    with pytest.raises(ValueError, match="log2\\(448\\)"):
        check_rescale(tau, shift)
    q8, k8, v8, qs, ks, vs = ramp_inputs(1, 1, 1, 8, 8, 32, seed=0)
    plan = launch.plan(q8, k8, False, path="tl")
    plan.config.update(RESCALE_TAU=tau, P_SHIFT=shift)
    with pytest.raises(ValueError, match="rescale_tau"):
        launch.forward(plan, q8, k8, v8, qs, ks, vs, False, 0.2, torch.float32)


def test_good_pairs_pass():
    for tau, shift in [(0.0, 8), (0.8, 8), (1.8, 7), (2.8, 6)]:
        check_rescale(tau, shift)


def test_l_of_the_rounded_p_normalizes_the_weights_that_multiply_v():
    # with l the sum of the rounded P, O is a convex combination of V's rows: v constant along the keys gives O = v
    # exactly (up to float32 sums), where l of the float32 p leaves P's rounding bias (sum P8 / sum p != 1)
    q8, k8, v8, qs, ks, vs = ramp_inputs(1, 2, 1, 16, 96, 32, seed=3)
    v8 = v8[:, :, :1].expand_as(v8).contiguous()
    rounded, _ = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, block_n=32, l_rounded=True)
    plain, _ = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, block_n=32)
    want = (v8[:, :, :1].float() * vs[:, :, None, None]).expand_as(rounded)
    assert (rounded - want).abs().max() < 1e-5 * want.abs().max()
    assert (plain - want).abs().max() > 1e-4 * want.abs().max()

"""The one-pass three-factor kernel (kernels_mono.py) through Triton's interpreter against float64: order 2
and order 3 (batched and permuted middle stage; the spectrum read in the kernel or laid out as the tile
on the host), the convolution and the correlation (du's form), an odd
batch and a loop past it, every element written, a non-finite sequence kept out of its pair's partner,
the config switch through fft_conv with gradients; and its sm_90a build (no spill at 1024)."""
import math

import pytest
import torch

from tilecore import accuracy
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, launch, model, plan
from compiled_run import compiled_json


def correlation64(u, k):
    """y[n] = sum_{m >= n} u[m] k[m - n] in float64 (the adjoint of the causal convolution)."""
    n = u.shape[-1]
    spectrum = torch.fft.rfft(u.double(), n=2 * n) * torch.fft.rfft(k.double(), n=2 * n).conj()
    return torch.fft.irfft(spectrum, n=2 * n)[..., :n]


def run_mono(config, B, H, dtype, conj=False, seed=0, u=None):
    n = config[0] * config[1] * config[2] // 2
    g = torch.Generator().manual_seed(seed)
    if u is None:
        u = torch.randn(B, H, n, generator=g).to(dtype)
    k = (torch.randn(H, n, generator=g) / math.sqrt(n)).to(dtype)
    y = torch.full(u.shape, math.nan, dtype=dtype)  # poisoned: the kernel must write every element
    launch.launch(plan.mono_plan(*config), u, filter_spectrum(k, n), y, conj)
    ref = correlation64(u, k) if conj else fft_conv_reference(u.double(), k.double())
    return y, ref


# bounds (multiples of the rounding floor): float16 products give fp16 ~2.3-2.9x (as the pair kernel);
# bf16 ~2.0-2.2x here because the interpreter truncates its bf16 stores (1.03-1.05x on the GPU)
BOUND = {torch.float16: 3.2, torch.bfloat16: 2.6}


@pytest.mark.parametrize("config, B, H", [
    ((32, 16, 1, 1, 4), 2, 3),  # order 2, N = 256
    ((32, 64, 1, 2, 4), 3, 2),  # order 2, N = 1024, odd batch, a loop of 2 past the batch
    ((32, 16, 16, 1, 8), 2, 2),  # order 3, N = 4096, the middle stage batched over k_b
    ((32, 16, 16, 2, 8, True), 3, 1),  # order 3, permuted middle stage, loop past an odd batch
    ((32, 64, 1, 2, 4, False, True), 3, 2),  # the spectrum and twiddles laid out as the tile (kfull)
    ((32, 16, 16, 1, 8, False, True), 2, 1),  # kfull, batched middle stage
    ((32, 16, 16, 1, 8, True, True), 2, 1),  # kfull, permuted middle stage (the natural order of f)
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_float64(config, B, H, dtype):
    y, ref = run_mono(config, B, H, dtype)
    assert torch.isfinite(y).all(), "unwritten elements"
    err = accuracy.error_over_floor(y, ref)
    assert err <= BOUND[dtype], f"{err:.3f}x the rounding floor"


@pytest.mark.parametrize("config", [(32, 64, 1, 1, 4), (32, 16, 16, 1, 8, True), (32, 16, 16, 1, 8, False, True)])
def test_correlation_matches_float64(config):
    y, ref = run_mono(config, 2, 2, torch.float16, conj=True, seed=1)
    assert torch.isfinite(y).all()
    assert accuracy.error_over_floor(y, ref) <= BOUND[torch.float16]


def test_unequal_scales_and_nonfinite_stay_in_their_sequence():
    n = 256
    g = torch.Generator().manual_seed(3)
    u = torch.randn(4, 2, n, generator=g)
    u[1] *= 1e-4  # the pair (0, 1): halves 10^4 apart in scale, each at its own floor
    u[2, 1, 17] = math.inf  # sequence (2, 1): its outputs NaN; its partner (3, 1) untouched
    u[3, 0, 5] = math.nan
    u = u.half()
    y, ref = run_mono((32, 16, 1, 1, 4), 4, 2, torch.float16, u=u)
    assert torch.isnan(y[2, 1]).all() and torch.isnan(y[3, 0]).all()
    for b, h in [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 1)]:
        assert torch.isfinite(y[b, h]).all(), (b, h)
        assert accuracy.error_over_floor(y[b, h], ref[b, h]) <= BOUND[torch.float16], (b, h)


def test_switch_routes_fft_conv_with_gradients(monkeypatch):
    """An entry in configs.MONO_CONFIGS (the switch) sends bf16 / fp16 calls at that N to the kernel, the
    backward's du through it too (the conjugate spectrum)."""
    monkeypatch.setitem(configs.MONO_CONFIGS, 1024, (32, 64, 1, 2, 4))
    monkeypatch.setattr(launch, "output", lambda shape, dtype, device: torch.full(shape, math.nan, dtype=dtype,
                                                                                  device=device))
    assert plan.plan(1024, torch.device("cpu"), torch.float16).path == "mono"
    assert plan.plan(1024, torch.device("cpu"), torch.float32).path != "mono"
    u = torch.randn(3, 2, 1024).half().requires_grad_()
    k = (torch.randn(2, 1024) / 32).half().requires_grad_()
    y = fft_conv(u, k)
    dy = torch.randn(u.shape).half()
    du, dk = torch.autograd.grad(y, (u, k), dy)
    u64, k64 = u.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref = fft_conv_reference(u64, k64)
    ref_du, ref_dk = torch.autograd.grad(ref, (u64, k64), dy.double())
    for out, r in ((y, ref), (du, ref_du), (dk, ref_dk)):
        assert torch.isfinite(out).all()
        assert accuracy.error_over_floor(out.detach(), r.detach()) <= BOUND[torch.float16]


def test_model_counts():
    """Order 2 in the mono kernel counts as the pair kernel's; order 3 at 4096 cuts the FLOPs 2.7x."""
    assert model.mono_flops(32, 64, 1) == model.pair_flops(32, 64)
    assert model.pair_flops(128, 64) / model.mono_flops(32, 16, 16) > 2.6
    [row] = model.passes("mono", 16, 768, 4096, 32, 16, n3=16)
    assert row["flops_ms"] < row["bytes_ms"]  # order 3 at 4096: bound by the bytes


CODE = """
import json
from tilecore.ops.fft_conv.report import mono_variant
from tilecore.tiles.report import rows
print(json.dumps(rows([mono_variant(32, 64, 1, 1, 4)])))
"""


def test_compiles_for_hopper_without_spills():
    [row] = compiled_json(CODE, timeout=600)
    assert row["spill_stores"] == 0 and row["shared"] <= 227 * 1024, row
    assert row["wgmma"], row


@pytest.mark.parametrize("config", [(32, 64, 1, 1, 4), (32, 16, 16, 1, 8, True)])
def test_timing_probes_run_and_write_every_element(config):
    """The GPU script's timing probes (PROBE: parts of the chain left out, results wrong by design) run at
    the kernel's shapes and still store every element."""
    import dataclasses

    n = config[0] * config[1] * config[2] // 2
    u = torch.randn(2, 2, n).half()
    spectrum = filter_spectrum((torch.randn(2, n) / math.sqrt(n)).half(), n)
    for probe in (1, 4, 5):
        y = torch.full(u.shape, math.nan, dtype=u.dtype)
        launch.launch(dataclasses.replace(plan.mono_plan(*config), probe=probe), u, spectrum, y, False)
        assert torch.isfinite(y).all(), probe

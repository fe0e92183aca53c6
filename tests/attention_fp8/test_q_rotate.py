"""q rotated and quantized inside Hopper's FP8 kernel (the convenience path's configs.ROTATED["q_in_kernel"]; the
kernel's Q_ROTATE, gluon_fp8.AttentionFp8.rotate_q).

The kernel cannot run here: its twin (quantize.rotate_quantize_rows, float32 torch) is checked against float64 and
against rotate_quantize (the pass it replaces), the switch leaves CPU calls alone, and the kernel is compiled for
sm_90a on this machine (subprocess): the rotation's bf16 wgmma, the codes' e4m3 conversion, the fence before S reads
them, no serialized wgmma, spills and shared memory within bounds."""
import json

import pytest
import torch

from tilecore.ops.attention_fp8 import attention_fp8_rotated, configs, launch
from tilecore.ops.attention_fp8.quantize import (q_in_kernel, rotate_quantize, rotate_quantize_rows, rotation_signs,
                                                 signed_hadamard)
from tilecore.tiles.switches import patched
from compiled_run import compiled_json

# spill bytes of the D128 causal N4096 rotated kernel on three consumers (sm_90a: 140-152 stored, 144-200 loaded, the full
# rotation; none in the steady step), with a margin for ptxas's moods
SPILLS_D128 = 160

E4M3_STEP = 0.126  # a relative step of e4m3's 3 mantissa bits (1/8), with room for float32 ties


@pytest.mark.parametrize("D", [64, 128])
def test_twin_is_the_rotation_quantized_per_row(D):
    g = torch.Generator().manual_seed(D)
    x = (torch.randn(1, 2, 70, D, generator=g) * 3).to(torch.bfloat16)
    x[0, 1, 69] = 0.0  # a row of zeros (as TMA fills rows past N): descale 1, codes 0
    signs = rotation_signs(D, x.device)
    codes, descale = rotate_quantize_rows(x, signs)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape and descale.shape == (1, 2, 70)
    y = (x.double() @ signed_hadamard(signs).double()) * D ** -0.5
    amax = y.abs().amax(-1)
    want_descale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    assert torch.allclose(descale.double(), want_descale, rtol=1e-6, atol=0)
    assert descale[0, 1, 69] == 1.0 and (codes[0, 1, 69].float() == 0).all()
    # dequantized: the rotated rows within half an e4m3 step (relative to each row's largest: subnormals count too)
    err = (codes.double() * descale.double()[..., None] - y).abs() / amax.clamp_min(1e-30)[..., None]
    assert err.max() <= 2 ** -4 * 1.01
    assert (codes.float().abs() == 448).any(-1)[..., :69].all()  # each nonzero row's largest code is 448


@pytest.mark.parametrize("D", [64, 128])
def test_twin_agrees_with_rotate_quantize(D):
    # the pass the kernel replaces divides by the descale, the twin (and the kernel) multiplies by its reciprocal:
    # descales identical, codes identical but for a float32 tie at a rounding boundary (one e4m3 step at most)
    g = torch.Generator().manual_seed(10 + D)
    x = torch.randn(2, 3, 50, D, generator=g).to(torch.bfloat16)
    signs = rotation_signs(D, x.device)
    codes, descale = rotate_quantize_rows(x, signs)
    want, want_descale = rotate_quantize(x, signs=signs, scales="token")
    assert torch.equal(descale, want_descale)
    diff = (codes.float() - want.float()).abs() / want.float().abs().clamp_min(2 ** -6)
    assert (diff <= E4M3_STEP).all() and (diff == 0).float().mean() > 0.99


def test_twin_keeps_q_k_products():
    # q and k rotated by the same signed Hadamard: the dequantized products are q k^T within FP8's rounding
    D = 128
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 64, D, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 1, 96, D, generator=g).to(torch.bfloat16)
    signs = rotation_signs(D, q.device)
    q8, qs = rotate_quantize_rows(q, signs)
    k8, ks = rotate_quantize_rows(k, signs)
    got = (q8.double() * qs.double()[..., None]) @ (k8.double() * ks.double()[..., None]).transpose(-1, -2)
    want = q.double() @ k.double().transpose(-1, -2)
    assert ((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item() < 0.05


def test_a_nan_makes_its_row_nan():
    D = 64
    x = torch.randn(1, 1, 8, D).to(torch.bfloat16)
    x[0, 0, 3, 7] = float("nan")
    codes, descale = rotate_quantize_rows(x, rotation_signs(D, x.device))
    assert torch.isnan(codes[0, 0, 3].float()).all()  # the rotation spreads it over the row
    assert torch.isfinite(codes[0, 0, [0, 1, 2, 4, 5, 6, 7]].float()).all()
    assert torch.isfinite(descale).all()


def test_switch_leaves_cpu_calls_alone():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=g) for _ in range(3))
    want = attention_fp8_rotated(q, k, v, causal=True)
    with patched(configs, ROTATED=dict(configs.ROTATED, q_in_kernel=(64, 128))):
        assert not q_in_kernel(q, k, True, True, "block", "fused")  # the Gluon kernel's path only
        got = attention_fp8_rotated(q, k, v, causal=True)
    assert torch.equal(got, want)
    # on at D64 and D128: faster end to end and right (notes/attention_fp8's decision log: q_in_kernel)
    assert configs.ROTATED["q_in_kernel"] == (64, 128)


SCRIPT = r"""
import json, re, sys, torch
from tilecore.ops.attention_fp8 import configs, gluon_fp8, launch
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import gluon_descriptor
from tilecore.tiles.switches import patched

out = []
for D, causal, N in json.loads(sys.argv[1]):
    with patched(configs, ROTATED=dict(configs.ROTATED, q_in_kernel=(64, 128))):
        cfg = launch.rotated_q_config(D, causal)
    f8 = torch.float8_e4m3fn
    q = torch.empty(2, 4, N, D, dtype=torch.bfloat16)
    k = torch.empty(2, 2, N, D, dtype=f8)
    vt = torch.empty(2, 2, D, -(-N // 32) * 32, dtype=f8)
    o = torch.empty(2, 4, N, D, dtype=torch.bfloat16)
    f32 = torch.empty(8192)
    k_n = -(-N // 128)
    opts = launch.gluon_options(q, k, cfg, causal, True, True, k_n, 128, True, q_rotate=True)
    bm, bn = cfg["block_m"], cfg["block_n"]
    args = dict(q_desc=gluon_descriptor(q, [1, 1, bm, D]), k_desc=gluon_descriptor(k, [1, 1, bn, D]),
                vt_desc=gluon_descriptor(vt, [1, 1, D, bn]), o_desc=gluon_descriptor(o, [1, 1, bm, D]), lse_ptr=f32,
                q_scales=f32, k_scales=f32, v_scales=f32, H=4, N=N, Nk=N, GROUP=2, scale_log2e=0.1,
                q_n_scales=N, q_rows_per_scale=1, k_n_scales=k_n, k_rows_per_scale=128, num_bh=8,
                head_group=4, schedule=None, v_n_scales=k_n, signs=f32)
    num_warps = opts.pop("num_warps")
    c = compile_kernel(gluon_fp8.attention_fp8_fwd_kernel, dict(args, **opts), num_warps=num_warps)
    ptx = c.asm["ptx"]
    out.append(dict(D=D, causal=causal, stages=cfg["stages"], q_buffers=cfg["q_buffers"], q_rotate=opts["Q_ROTATE"],
                    consumers=opts["CONSUMERS"], serial=opts.get("SERIAL", False),
                    **has_hopper_instructions(ptx), **vars(resources(c)),
                    bf16_wgmma=len(re.findall(r"wgmma\.mma_async\S*\.bf16\.bf16", ptx)),
                    e4m3_wgmma=len(re.findall(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx)),
                    e4m3_cvt=ptx.count("cvt.rn.satfinite.e4m3x2.f32"), fence=ptx.count("fence.proxy.async")))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    cases = [(128, True, 4096), (64, False, 1000)]
    return compiled_json(SCRIPT, json.dumps(cases), timeout=600)


def test_kernel_compiles_with_the_rotation_on_the_tensor_cores(report):
    for r in report:
        assert r["q_rotate"] and r["wgmma"] and r["tma"] and not r["wgmma_serialized"], r
        # the rotation: one [64, D] x [D, D] bf16 wgmma a consumer (D / 16 instructions of k16)
        assert r["bf16_wgmma"] == r["consumers"] * r["D"] // 16, r
        assert r["e4m3_wgmma"] > 0 and r["e4m3_cvt"] > 0 and r["fence"] > 0, r  # the codes, fenced before S
        assert r["shared"] <= 227 * 1024, r
    d128, d64 = report
    # D128 (since session 42) on three consumers with the shipped 2 stages and 1 Q buffer a consumer (the e4m3 codes
    # over the bf16 buffer, no buffer of their own); at 160 registers a thread (168 the first) spills in the tile's
    # setup and epilogue, none in the steady step (sm_90a SASS); D64 none
    assert (d128["stages"], d128["q_buffers"]) == (2, 1), d128
    assert d128["spill_stores"] <= SPILLS_D128 and d128["spill_loads"] <= SPILLS_D128 + 48, d128
    assert d64["spill_stores"] == 0 and d64["spill_loads"] == 0, d64
    # three consumer warpgroups with serial steps (configs.ROTATED["serial_c3"]; 160 registers a thread): D64 serial 1
    # (P V into a zero accumulator), D128 serial 2 (O rescaled first, P V added in place: D128's registers)
    assert (d64["consumers"], d64["serial"], d128["consumers"], d128["serial"]) == (3, 1, 3, 2), report


def test_rotated_config_takes_three_serial_consumers_where_rotated_says():
    # configs.ROTATED["serial_c3"]: the head dims at which the rotated kernel's config takes consumers 3 and serial
    # (the plain kernel's configs.GLUON_FORWARD does not); a GLUON_FORWARD that names serial is kept (A/B runs)
    assert (launch.rotated_q_config(64, True)["consumers"], launch.rotated_q_config(64, False)["serial"]) == (3, True)
    assert (launch.rotated_q_config(128, True)["consumers"], launch.rotated_q_config(128, True)["serial"]) == (3, 2)
    assert "serial" not in configs.gluon_config(64, True) and configs.gluon_config(64, True)["consumers"] == 2
    with patched(configs, ROTATED=dict(configs.ROTATED, serial_c3=())):
        assert launch.rotated_q_config(64, True)["consumers"] == 2
    two = {d: dict(c, serial=False) for d, c in configs.GLUON_FORWARD.items()}
    with patched(configs, GLUON_FORWARD=two):
        cfg = launch.rotated_q_config(64, True)
        assert (cfg["consumers"], cfg["serial"]) == (2, False)


def test_launch_binds_to_the_kernel(monkeypatch):
    # forward_q_rotated's arguments as the Gluon kernel's signature binds them (no GPU: the launch recorded, not made)
    import inspect

    from tilecore.ops.attention_fp8 import gluon_fp8, launch

    calls = []

    class Recorder:
        def run(self, key, grid, args, kwargs):
            calls.append((args, kwargs))

    monkeypatch.setattr(launch, "GLUON_FWD", Recorder())
    monkeypatch.setattr(launch, "_tiling", lambda q, k, rows, bn, causal: ((4,), 2, None))
    B, Hq, Hkv, N, Nk, D = 1, 4, 2, 100, 130, 128
    q = torch.randn(B, Hq, N, D).to(torch.bfloat16)
    k8 = torch.zeros(B, Hkv, Nk, D, dtype=torch.float8_e4m3fn)
    v8 = torch.zeros(B, Hkv, D, 160, dtype=torch.float8_e4m3fn)
    ks, vs = torch.ones(B, Hkv, 2), torch.ones(B, Hkv, 2)
    launch.forward_q_rotated(q, rotation_signs(D, q.device), k8, v8, ks, vs, True, D ** -0.5, torch.bfloat16)
    (args, kwargs), = calls
    options = {name: kwargs.pop(name) for name in ("num_warps",)}  # launch options, not parameters
    bound = inspect.signature(gluon_fp8.attention_fp8_fwd_kernel.fn).bind(*args, **kwargs).arguments
    assert options == {"num_warps": 4}
    assert bound["Q_ROTATE"] is True and bound["Q_PER_ROW"] is True and bound["CAUSAL"] is True
    assert bound["signs"].shape == (D,) and bound["V_PER_BLOCK"] is True and bound["K_PER_BLOCK"] is True
    assert bound["GROUP"] == Hq // Hkv and bound["N"] == N and bound["Nk"] == Nk and bound["v_n_scales"] == 2

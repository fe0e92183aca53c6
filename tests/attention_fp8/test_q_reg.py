"""q's codes kept in registers as S's operand (configs.ROTATED["q_reg"], on at D64; at D128 before its three
consumers; the Hopper kernel's Q_REG with q rotated in the kernel): the rotation's accumulator is read as the e4m3
register operand as it lies, its columns relabelled as P's are for P V (fp8_operand_order), so the rotation matrix's
rows are permuted to match (signed_hadamard_t's PERMUTED): no stores of the codes, no fence, no warpgroup barriers at
a tile's start.

The kernel cannot run here: the permutation is checked against reference.key_position (the relabelling the GPU runs
have verified for P and V since session 26), the math is rotate_q's (its twin, quantize.rotate_quantize_rows: the
codes and descales are the same numbers, held elsewhere), the switch is off, the launch passes it, and the kernel
compiles for sm_90a: no serialized wgmma, one fence (the ones block's) against rotate_q's two, spills bounded."""
import json

import pytest
import torch

from tilecore.ops.attention_fp8 import configs
from tilecore.ops.attention_fp8.quantize import rotation_signs, signed_hadamard
from tilecore.ops.attention_fp8.reference import key_position
from compiled_run import compiled_json


def permuted_row(c: torch.Tensor) -> torch.Tensor:
    """signed_hadamard_t's PERMUTED index arithmetic (row c holds row f(c)), as the kernel writes it."""
    return (c >> 4 << 4) | (((c >> 1) & 3) << 2) | (((c >> 3) & 1) << 1) | (c & 1)


@pytest.mark.parametrize("D", [64, 128])
def test_permutation_is_the_operand_relabelling(D):
    c = torch.arange(D)
    assert torch.equal(permuted_row(c), key_position(c))
    assert torch.equal(torch.sort(permuted_row(c)).values, c)  # a permutation


@pytest.mark.parametrize("D", [64, 128])
def test_relabelled_rotation_is_the_rotation(D):
    # the accumulator of x times the permuted matrix, column c, read as operand index f(c): x's rotation itself
    g = torch.Generator().manual_seed(D)
    x = torch.randn(16, D, generator=g, dtype=torch.float64)
    m = signed_hadamard(rotation_signs(D, x.device)).double()  # x m = x diag(s) H
    f = key_position(torch.arange(D))
    m_perm_t = m.T[f]  # the kernel's [D_out, D_in] matrix: row c = (diag(s) H)^T row f(c)
    acc = x @ m_perm_t.T  # column c
    operand = torch.empty_like(acc)
    operand[:, f] = acc  # accumulator column c is operand index f(c)
    assert torch.allclose(operand, x @ m, rtol=0, atol=1e-12)


def test_switch():
    # on at D64 (with three serial consumers; at D128 from session 36 to 41): faster on the H100 with O's error the same
    # (notes/attention_fp8's decision log: q_reg, c3qreg)
    assert configs.ROTATED["q_reg"] == (64,)  # (D128 on three consumers since session 42: codes in shared memory)


def test_launch_binds_to_the_kernel(monkeypatch):
    import inspect

    from tilecore.ops.attention_fp8 import gluon_fp8, launch

    calls = []

    class Recorder:
        def run(self, key, grid, args, kwargs):
            calls.append((args, kwargs))

    monkeypatch.setattr(launch, "GLUON_FWD", Recorder())
    monkeypatch.setattr(launch, "_tiling", lambda q, k, rows, bn, causal: ((4,), 2, None))
    B, Hq, Hkv, N, Nk, D = 1, 4, 2, 100, 130, 64
    q = torch.randn(B, Hq, N, D).to(torch.bfloat16)
    k8 = torch.zeros(B, Hkv, Nk, D, dtype=torch.float8_e4m3fn)
    v8 = torch.zeros(B, Hkv, D, 160, dtype=torch.float8_e4m3fn)
    ks, vs = torch.ones(B, Hkv, 2), torch.ones(B, Hkv, 2)
    signs = rotation_signs(D, q.device)
    launch.forward_q_rotated(q, signs, k8, v8, ks, vs, True, D ** -0.5, torch.bfloat16, q_reg=False)
    launch.forward_q_rotated(q, signs, k8, v8, ks, vs, True, D ** -0.5, torch.bfloat16, q_reg=True)
    (a0, k0), (a1, k1) = calls
    sig = inspect.signature(gluon_fp8.attention_fp8_fwd_kernel.fn)
    for args, kwargs, want in ((a0, k0, False), (a1, k1, True)):
        kwargs.pop("num_warps")
        bound = sig.bind(*args, **kwargs).arguments
        assert bound.get("Q_REG", False) is want and bound["Q_ROTATE"] is True and bound["V_PER_BLOCK"] is True
    with pytest.raises(ValueError, match="rotated in the kernel"):
        launch._GluonLayout(k8, k8, launch.rotated_q_config(D, True), True, True, True, 2, 128, q_reg=True)


SCRIPT = r"""
import json, re, sys, torch
from tilecore.ops.attention_fp8 import configs, gluon_fp8, launch
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import gluon_descriptor
from tilecore.tiles.switches import patched

out = []
for D, causal, N, q_reg, shipped in json.loads(sys.argv[1]):
    # (D128: the two-consumer kernel Q_REG served from session 36 to 41, the d128c2 form; D128 ships three consumers
    # with the codes in shared memory since session 42; ``shipped``: the shipped configs as they are)
    if shipped:
        cfg = launch.rotated_q_config(D, causal)
    else:
        with patched(configs, ROTATED=dict(configs.ROTATED, serial_c3={64: 1}, q_buffers={}, q_last_buffers={},
                                           stages={})):
            cfg = launch.rotated_q_config(D, causal)
    f8 = torch.float8_e4m3fn
    q = torch.empty(2, 4, N, D, dtype=torch.bfloat16)
    k = torch.empty(2, 2, N, D, dtype=f8)
    vt = torch.empty(2, 2, D, -(-N // 32) * 32, dtype=f8)
    o = torch.empty(2, 4, N, D, dtype=torch.bfloat16)
    f32 = torch.empty(8192)
    k_n = -(-N // 128)
    opts = launch.gluon_options(q, k, cfg, causal, True, True, k_n, 128, True, q_rotate=True, q_reg=q_reg)
    bm, bn = cfg["block_m"], cfg["block_n"]
    args = dict(q_desc=gluon_descriptor(q, [1, 1, bm, D]), k_desc=gluon_descriptor(k, [1, 1, bn, D]),
                vt_desc=gluon_descriptor(vt, [1, 1, D, bn]), o_desc=gluon_descriptor(o, [1, 1, bm, D]), lse_ptr=f32,
                q_scales=f32, k_scales=f32, v_scales=f32, H=4, N=N, Nk=N, GROUP=2, scale_log2e=0.1,
                q_n_scales=N, q_rows_per_scale=1, k_n_scales=k_n, k_rows_per_scale=128, num_bh=8,
                head_group=4, schedule=None, v_n_scales=k_n, signs=f32)
    num_warps = opts.pop("num_warps")
    c = compile_kernel(gluon_fp8.attention_fp8_fwd_kernel, dict(args, **opts), num_warps=num_warps)
    ptx = c.asm["ptx"]
    out.append(dict(D=D, causal=causal, q_reg=opts.get("Q_REG", False), consumers=opts["CONSUMERS"],
                    q_last_buffers=opts.get("Q_LAST_BUFFERS", 0),
                    **has_hopper_instructions(ptx),
                    **vars(resources(c)), fence=ptx.count("fence.proxy.async"),
                    bf16_wgmma=len(re.findall(r"wgmma\.mma_async\S*\.bf16\.bf16", ptx)),
                    e4m3_wgmma=len(re.findall(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx))))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    cases = [(128, True, 4096, True, False), (128, True, 4096, False, False), (64, False, 1000, True, False),
             (128, True, 1000, False, True), (128, False, 1000, False, True)]
    return compiled_json(SCRIPT, json.dumps(cases), timeout=600)


def test_kernel_compiles_with_q_in_registers(report):
    reg128, smem128, reg64 = report[:3]
    for r in (reg128, reg64):
        assert r["q_reg"] and r["wgmma"] and r["tma"] and not r["wgmma_serialized"], r
        # the rotation (one a consumer; D64: three consumers, configs.ROTATED["serial_c3"]); S and P V in e4m3
        assert r["bf16_wgmma"] == r["consumers"] * r["D"] // 16 and r["e4m3_wgmma"] > 0, r
        assert r["fence"] < smem128["fence"], (r, smem128)  # no fence for the codes: they are not stored
        assert r["shared"] <= smem128["shared"], r
    # D128 causal N4096 (GQA 4 / 2 here): 72 / 76 bytes of spills with hide_first_key (D128's default; 32 / 32 without
    # it; sm_90a SASS: stored once a program, reloaded in a tile's start and finish, none in the steady step,
    # experiments/attention_fp8/sass_fp8.py --variants qreg), D64 none
    assert reg128["spill_stores"] <= 80 and reg128["spill_loads"] <= 96, reg128
    assert reg64["spill_stores"] == 0 and reg64["spill_loads"] == 0, reg64


def test_rotated_config_takes_stages_and_q_buffers():
    # configs.ROTATED's per-head-dim "stages" and "q_buffers" reach the rotated kernel's config; other head dims keep
    # configs.GLUON_FORWARD's (with q_reg and 1 Q buffer, D128 fits 4 stages: 230,248 bytes, sm_90a)
    from tilecore.ops.attention_fp8 import launch
    from tilecore.tiles.switches import patched

    with patched(configs, ROTATED=dict(configs.ROTATED, q_buffers={}, q_last_buffers={}, stages={}, serial_c3={64: 1})):
        cfg = launch.rotated_q_config(128, True)
        assert {k: v for k, v in cfg.items() if k not in ("hide_first_key", "mask32")} == configs.gluon_config(128,
                                                                                                            True)
    with patched(configs, ROTATED=dict(configs.ROTATED, q_buffers={128: 1}, stages={128: 4})):
        cfg, cfg64 = launch.rotated_q_config(128, True), launch.rotated_q_config(64, True)
    assert (cfg["stages"], cfg["q_buffers"]) == (4, 1)
    with patched(configs, ROTATED=dict(configs.ROTATED, q_last_buffers={128: 2})):  # the last consumer's: causal only
        assert launch.rotated_q_config(128, True)["q_last_buffers"] == 2
        assert "q_last_buffers" not in launch.rotated_q_config(128, False)
        assert "q_last_buffers" not in launch.rotated_q_config(64, True)
    assert (cfg64["stages"], cfg64["q_buffers"]) == (configs.gluon_config(64, True)["stages"],
                                                     configs.gluon_config(64, True)["q_buffers"])


def test_rotated_config_hides_the_first_key_where_rotated_says():
    # configs.ROTATED["hide_first_key"]: the head dims at which the rotated kernel's config takes hide_first_key (the
    # plain kernel's configs.GLUON_FORWARD does not); a GLUON_FORWARD that names it is kept (A/B runs patch it there)
    from tilecore.ops.attention_fp8 import launch
    from tilecore.tiles.switches import patched

    with patched(configs, ROTATED=dict(configs.ROTATED, hide_first_key=(128,))):
        assert launch.rotated_q_config(128, True)["hide_first_key"] is True
        assert launch.rotated_q_config(64, True)["hide_first_key"] is False
        off = {d: dict(c, hide_first_key=False) for d, c in configs.GLUON_FORWARD.items()}
        with patched(configs, GLUON_FORWARD=off):
            assert launch.rotated_q_config(128, True)["hide_first_key"] is False
    with patched(configs, ROTATED=dict(configs.ROTATED, hide_first_key=())):
        assert launch.rotated_q_config(128, True)["hide_first_key"] is False
    assert "hide_first_key" not in configs.gluon_config(128, True)  # the plain kernel: off (notes/attention_fp8)


def test_rotated_config_takes_mask32_where_rotated_says():
    # configs.ROTATED["mask32"]: the head dims at which the rotated kernel's config takes mask32 (the causal mask in 32
    # bits; the plain kernel's configs.GLUON_FORWARD does not: it was not faster there, notes/attention_fp8); a
    # GLUON_FORWARD that names it is kept (A/B runs patch it there)
    from tilecore.ops.attention_fp8 import launch
    from tilecore.tiles.switches import patched

    assert launch.rotated_q_config(128, True)["mask32"] is True and launch.rotated_q_config(64, True)["mask32"] is True
    with patched(configs, ROTATED=dict(configs.ROTATED, mask32=(128,))):
        assert launch.rotated_q_config(128, True)["mask32"] is True
        assert launch.rotated_q_config(64, True)["mask32"] is False
        off = {d: dict(c, mask32=False) for d, c in configs.GLUON_FORWARD.items()}
        with patched(configs, GLUON_FORWARD=off):
            assert launch.rotated_q_config(128, True)["mask32"] is False
    assert "mask32" not in configs.gluon_config(128, True)  # the plain kernel: off


def test_shipped_d128_last_consumer_q_buffers(report):
    """The convenience path's D128 kernels as shipped (session 43): causal gives the last consumer a second bf16 Q
    buffer (configs.ROTATED["q_last_buffers"]), full does not; both within Hopper's 227 KiB, not serialized."""
    causal, full = report[3:5]
    assert causal["consumers"] == 3 and causal["q_last_buffers"] == 2 and full["q_last_buffers"] == 0, (causal, full)
    for r in (causal, full):
        assert r["shared"] <= 232448 and not r["wgmma_serialized"] and r["spill_stores"] <= 256, r
    assert 128 * 64 * 2 <= causal["shared"] - full["shared"] <= 128 * 64 * 2 + 16, (causal, full)

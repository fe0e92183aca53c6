"""Session 31's switches of Based's Gluon forward (issue 33): SEL_REG (the selections' A operand q / k from
registers), PHIQ_REG (phi_q kept in registers as the A operand of o's phi_q S wgmmas, no phi_q buffer in shared
memory) and FEAT_ALU (the features by the CUDA cores in blocks of 4 x 4 products, no selection wgmmas). On the CPU:
they reach the kernel only where asked (or turned on in configs), SEL_REG / PHIQ_REG only with SEL_ASYNC 3, the
shipped launch keeps its arguments; FEAT_ALU's feature table gives 1 + s + s^2 / 2, its chunked math (emulate) is the
float64 recurrence's with its state maps; the kernels compile for sm_90a with TMA and unserialized wgmma within
Hopper's shared memory at 3 stages. The kernel runs on the GPU only: experiments/linear_attention/gpu_forward_s31.py
checks each variant against float64 there."""
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_based, linear_attention_reference

BF = torch.bfloat16


def based_args(**kw):
    q = torch.empty(1, 128, 2, gluon_based.DK, dtype=BF)
    v = torch.empty(1, 128, 2, 64, dtype=BF)
    return gluon_based.launch_args(q, q, v, None, torch.empty_like(v), None, 0.25, 2, **kw)[1]


def test_off_unless_asked_and_the_kernel_defaults_off():
    assert not {"SEL_REG", "PHIQ_REG", "FEAT_ALU"} & set(based_args(chain=True, sel_async=3))
    alu = based_args(chain=True, sel_async=3, feat_alu=True)
    assert alu["FEAT_ALU"] == 1 and "SEL_ASYNC" not in alu and alu["CHAIN"] is True
    assert based_args(chain=True, sel_async=3, feat_alu=2)["FEAT_ALU"] == 2
    args = based_args(chain=True, sel_async=3, sel_reg=True, phiq_reg=True)
    assert args["SEL_REG"] is True and args["PHIQ_REG"] is True and args["SEL_ASYNC"] == 3
    params = inspect.signature(gluon_based.based_fwd_gluon_kernel.fn).parameters
    assert params["SEL_REG"].default is False and params["PHIQ_REG"].default is False
    assert params["FEAT_ALU"].default == 0 and configs.GLUON_BASED_FEAT_ALU in (0, 1, 2, 3)
    assert configs.GLUON_BASED_SEL_REG in (False, True) and configs.GLUON_BASED_PHIQ_REG in (False, True)


def test_out_direct_only_with_feat_alu():
    args = based_args(chain=True, sel_async=3, feat_alu=1, out_direct=True)
    assert args["OUT_DIRECT"] is True and args["O"] is not None and args["son"] == 2 * 64
    assert args["o_desc"].block_shape[2] == 8  # the epilogue buffer shrinks to 8 rows (the kernel stores o itself)
    assert "OUT_DIRECT" not in based_args(chain=True, sel_async=3, out_direct=True)
    assert configs.GLUON_BASED_OUT_DIRECT in (False, True)


def test_launch_args_take_a_descriptor_maker():
    """A keyed launch's TmaOperand (as launch.gluon_forward_keyed gives gluon_forward) in place of the descriptors."""
    from tilecore.tiles.launch import TmaOperand

    args = based_args(chain=True, feat_alu=1, operand=TmaOperand)
    assert all(isinstance(args[n], TmaOperand) for n in ("q_desc", "k_desc", "v_desc", "o_desc"))
    assert args["q_desc"].block_shape == [1, 1, 64, 16] and args["v_desc"].block_shape == [1, 1, 64, 64]


def test_the_plan_gives_feat_alu_its_stages(monkeypatch):
    from tilecore.ops.linear_attention.plan import BASED, tl_plan

    q = torch.empty(1, 64, 2, 16, dtype=BF)
    v = torch.empty(1, 64, 2, 64, dtype=BF)
    monkeypatch.setattr(configs, "GLUON_BASED_FEAT_ALU", 1)
    assert tl_plan(q, v, None, BASED).config["gluon_based_stages"] == configs.GLUON_BASED_ALU_STAGES
    monkeypatch.setattr(configs, "GLUON_BASED_FEAT_ALU", 0)
    assert tl_plan(q, v, None, BASED).config["gluon_based_stages"] == configs.GLUON_BASED_STAGES


def test_forward_passes_feat_alu_and_its_state_rows(monkeypatch):
    """gluon_based.forward with configs' FEAT_ALU: the launch asks for it and the initial state goes in FEAT_ALU's
    rows (compress(alu=True))."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_launch_args(q, k, v, x0, *a, **kw):
        seen.update(kw, x0=x0)
        raise Stop

    monkeypatch.setattr(gluon_based, "launch_args", fake_launch_args)
    monkeypatch.setattr(configs, "GLUON_BASED_FEAT_ALU", 1)
    q = torch.randn(1, 64, 2, gluon_based.DK).to(BF)
    v = torch.randn(1, 64, 2, 64).to(BF)
    h0 = torch.randn(1, 2, 1 + 16 + 256, 64)
    with pytest.raises(Stop):
        gluon_based.forward(q, q, v, h0, 0.25, True)
    assert seen["feat_alu"] == 1
    torch.testing.assert_close(seen["x0"], gluon_based.compress(h0, alu=True))


def test_forward_drops_them_without_sel_async_3(monkeypatch):
    """gluon_based.forward passes SEL_REG / PHIQ_REG only with SEL_ASYNC 3 (the kernel's static_assert otherwise):
    the launch it would make, captured before it runs."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_launch_args(*a, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(gluon_based, "launch_args", fake_launch_args)
    q = torch.randn(1, 64, 2, gluon_based.DK).to(BF)
    v = torch.randn(1, 64, 2, 64).to(BF)
    for sel_async, expect in ((3, True), (2, False), (0, False)):
        seen.clear()
        with pytest.raises(Stop):
            gluon_based.forward(q, q, v, None, 0.25, False, sel_async=sel_async, sel_reg=True, phiq_reg=True,
                                feat_alu=0)
        assert seen["sel_reg"] is expect and seen["phiq_reg"] is expect


def test_feat_alu_features_are_the_taylor_kernel_each_pair_once():
    pairs = gluon_based.feature_pairs_alu()
    real = [p for p in pairs if p != (-1, -1)]
    assert len(pairs) == gluon_based.FEATURES and len(real) == len(set(real)) == 153
    assert {p for p in real if p[1] < 16} == {(a, b) for a in range(16) for b in range(a, 16)}
    torch.manual_seed(0)
    q, k = torch.randn(40, 16, dtype=torch.float64), torch.randn(40, 16, dtype=torch.float64)
    for scale in (0.25, 0.3):
        s = scale * q @ k.T
        phi = gluon_based.alu_features(q * scale) @ gluon_based.alu_features(k).T
        torch.testing.assert_close(phi, 1 + s + s * s / 2, rtol=1e-12, atol=1e-12)


def test_feat_alu_piece_order_is_the_kernels_blocks():
    """Feature 32 p + 2 (4 i + j) + w is block ALU_BLOCKS[2 p + w]'s (i, j), as features_alu joins them."""
    pairs = gluon_based.feature_pairs_alu()
    for p in range(5):
        for w in range(2):
            G, H = gluon_based.ALU_BLOCKS[2 * p + w]
            if G != H:
                for i in range(4):
                    for j in range(4):
                        assert pairs[32 * p + 2 * (4 * i + j) + w] == (4 * G + i, 4 * H + j)
            else:
                assert pairs[32 * p + 2 * (4 * 1 + 0) + w] == (4 * G, 16)  # (1, 0): x_(4G + 0)
                assert pairs[32 * p + 2 * (4 * 3 + 0) + w] == (4 * G + 3, 16)
                assert pairs[32 * p + 2 * (4 * 2 + 2) + w] == (4 * G + 2, 4 * G + 2)


@pytest.mark.parametrize("with_h0", [False, True])
def test_feat_alu_emulated_kernel_matches_the_recurrence(with_h0):
    torch.manual_seed(1)
    B, N, H, Dv = 1, 77, 2, 8
    q, k, v = (torch.randn(B, N, H, d, dtype=torch.float64) for d in (16, 16, Dv))
    h0 = torch.randn(B, H, 1 + 16 + 256, Dv, dtype=torch.float64) if with_h0 else None  # asymmetric too
    x0 = gluon_based.compress(h0, alu=True) if with_h0 else None
    o, x = gluon_based.emulate(q, k, v, x0, 0.25, chunk=32, alu=True)
    ht = gluon_based.expand(x, alu=True) + (h0 - gluon_based.expand(x0, alu=True) if with_h0 else 0.0)
    ref, ref_state = linear_attention_reference(q, k, v, feature_map="based", scale=0.25, initial_state=h0)
    torch.testing.assert_close(o, ref, rtol=1e-6, atol=1e-6)  # compress in float32
    torch.testing.assert_close(ht.double(), ref_state, rtol=1e-6, atol=1e-6)


def test_feat_alu_state_maps_round_trip():
    torch.manual_seed(2)
    x = torch.randn(1, 2, gluon_based.FEATURES, 4)
    x[:, :, [f for f, p in enumerate(gluon_based.feature_pairs_alu()) if p == (-1, -1)]] = 0
    torch.testing.assert_close(gluon_based.compress(gluon_based.expand(x, alu=True), alu=True), x, rtol=1e-6,
                               atol=1e-6)


# one compile (~20-40 s on 2 cores): both switches at 3 stages with initial and final states: 3456 B spilled (the
# shipped kernel with states 2816 B: the states' [64, 128] pointer tiles in start / finish, outside the walk;
# without states 272 B against the shipped 124 B), 182,800 B of shared memory (shipped at 2 stages 199,200)
CODE = ("import json; from tilecore.ops.linear_attention.gluon_based import compile_report; "
        "print(json.dumps(compile_report(states=True, stages=3, chain=True, sel_async=3, sel_reg=True, "
        "phiq_reg=True)))")


# FEAT_ALU at 3 stages with states: (filled in below from the compile)
CODE_ALU = ("import json; from tilecore.ops.linear_attention.gluon_based import compile_report; "
            "print(json.dumps(compile_report(states={states}, stages={stages}, chain=True, sel_async=3, "
            "feat_alu=True)))")


def _compile(code):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["tma"] and r["wgmma"] and r["mbarrier"], r
    assert not r["wgmma_serialized"], r
    assert r["shared"] <= 227 * 1024, r
    assert r["threads"] == 384, r
    return r


def test_sel_reg_phiq_reg_compile_for_sm90a_at_3_stages():
    assert _compile(CODE)["spill_bytes"] <= 3584


def test_feat_alu_compiles_for_sm90a_without_spilling_in_the_walk():
    assert _compile(CODE_ALU.format(states=False, stages=2))["spill_bytes"] == 0
    r = _compile(CODE_ALU.replace("feat_alu=True", "feat_alu=1, out_direct=True").format(states=False, stages=4))
    assert r["spill_bytes"] <= 64 and r["shared"] <= 227 * 1024  # 4 stages: 221,632 B, 48 B spilled
    for mode in (2, 3):
        assert _compile(CODE_ALU.replace("feat_alu=True", f"feat_alu={mode}").format(states=False, stages=2))[
            "spill_bytes"] == 0
    assert _compile(CODE_ALU.format(states=True, stages=3))["spill_bytes"] <= 3584

"""norm's and gemm's keyed calls hold tiles.switches.generation in their key: their plans read configs, so a probe's
``switches.patched`` block must get plans (and the recipes and kept launches made from them) of its own, and the
shipped ones again after the block, on the very inputs the shipped config ran on (never a plan made under other
switches). Under Triton's interpreter with the ops' signature taken for CPU tensors (host_testing.plain_signature)."""
import pytest
import torch

from host_testing import plain_signature
from tilecore.ops.gemm import configs as gemm_configs, op as gemm_op, plan as gemm_plan
from tilecore.ops.norm import configs as norm_configs, launch as norm_launch, op as norm_op
from tilecore.tiles.switches import patched


def _norm_caches():
    return (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS,
            norm_launch._BACKWARD_RECIPES)


@pytest.mark.parametrize("grad", [False, True])
def test_norm_plans_again_in_a_patched_block_and_after_it(monkeypatch, grad):
    """rms_norm rows of 32: whole rows by the shipped WHOLE_ROW_MAX, two passes (the stats kernel) under a block
    that sets it to 16: each call of the block is planned under it (the key's first call plans, the later ones
    reuse it: the recipe of the block's plan), and after the block the shipped plan again; the outputs of the two
    plans agree (the same norm: their rounding may differ) and each plan's calls give its first call's bits."""
    monkeypatch.setattr(norm_op, "signature", plain_signature)
    for cache in _norm_caches():
        cache.clear()
    made = []
    real = norm_op.plan
    monkeypatch.setattr(norm_op, "plan", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    x = torch.randn(6, 32, dtype=torch.float16, requires_grad=grad)
    w = torch.randn(32, dtype=torch.float16, requires_grad=grad)

    def calls(n=3):
        return [norm_op.layer_norm(x, w, rms=True).detach() for _ in range(n)]

    shipped = calls()
    assert [p.whole_row for p in made] == [True]
    with patched(norm_configs, WHOLE_ROW_MAX=16):
        variant = calls()
    assert [p.whole_row for p in made] == [True, False]
    after = calls()
    assert [p.whole_row for p in made] == [True, False, True]
    for ys in (shipped, variant, after):
        assert all(torch.equal(y, ys[0]) for y in ys[1:])
    assert torch.equal(after[0], shipped[0])
    torch.testing.assert_close(variant[0], shipped[0], rtol=2e-3, atol=2e-3)
    for cache in _norm_caches():
        cache.clear()


def test_gemm_plans_again_in_a_patched_block_and_after_it(monkeypatch):
    """gemm's plan cache (and its recipes) keyed on the generation: a key's plan is made once outside a block, once
    in a patched block (TL_CPU: the interpreter's tile), and once more after it; the block's calls run its plan."""
    monkeypatch.setattr(gemm_op, "signature", plain_signature)
    gemm_op._PLANS.clear()
    gemm_op._GEMMS.clear()
    made = []
    real = gemm_plan.plan
    monkeypatch.setattr(gemm_plan, "plan", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    a = torch.randn(48, 40, dtype=torch.bfloat16)
    b = torch.randn(40, 24, dtype=torch.bfloat16)
    shipped = [gemm_op.gemm(a, b) for _ in range(2)]
    assert len(made) == 1 and made[0].config == gemm_configs.TL_CPU
    tile = dict(gemm_configs.TL_CPU, block=(16, 32, 32))  # (another tile: the same product, other rounding order)
    with patched(gemm_configs, TL_CPU=tile):
        variant = [gemm_op.gemm(a, b) for _ in range(2)]
        assert len(made) == 2 and made[1].config == tile
    after = gemm_op.gemm(a, b)
    assert len(made) == 3 and made[2].config == gemm_configs.TL_CPU
    assert all(torch.equal(c, shipped[0]) for c in (shipped[1], after))
    torch.testing.assert_close(variant[0], shipped[0], rtol=1e-2, atol=1e-2)
    gemm_op._PLANS.clear()
    gemm_op._GEMMS.clear()

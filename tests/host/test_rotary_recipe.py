"""apply_rotary's per-key recipe (op._RotaryLaunch, under tiles.launch.OP_RECIPES; issue 31's host time): a plain eager
call's second call on goes through the recipe alone (no checks, expand, strides, plan or launch-key lookup) and gives
the general path's bits, with and without position_ids, half-split and interleaved, token- and head-major. Keys are
CUDA-only, so the module's signature is replaced by one for CPU tensors and the kernel runs in Triton's interpreter;
the GPU's check is experiments/common/host_rows.py's float64 rows and same bits."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.rotary import op
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.switches import patched
from host_testing import plain_signature, served_calls

pytestmark = pytest.mark.skipif(not dispatch.interpreter_enabled(),
                                reason="the tl kernel on CPU tensors runs in Triton's interpreter")


@pytest.fixture
def served(monkeypatch):
    yield from served_calls(monkeypatch, op._RotaryLaunch, (op._CHECKED, op._PLANS, op._RECIPES))


def _case(name):
    torch.manual_seed(3)
    cos, sin = torch.randn(40, 8), torch.randn(40, 8)
    if name == "head-major":  # a (B, H, N, D) tensor's transposed view: the BLOCK_T tiles
        xs = [torch.randn(2, 3, 9, 32, dtype=torch.float16).transpose(1, 2) for _ in range(3)]
    elif name == "pass-through":  # features past 2R copied
        xs = [torch.randn(2, 5, 3, 20, dtype=torch.float16) for _ in range(3)]
    else:
        xs = [torch.randn(2, 5, 3, 16) for _ in range(3)]
    pos = {"positions": torch.randint(0, 40, (2, 5)), "broadcast positions": torch.randint(0, 40, (5,))}.get(name)
    if name == "strided cos":  # cos and sin with a column stride: the general path copies them, no recipe
        cos, sin = torch.randn(40, 16)[:, ::2], torch.randn(40, 16)[:, ::2]
    return xs, cos, sin, pos


@pytest.mark.parametrize("name", ["plain", "positions", "broadcast positions", "head-major", "pass-through",
                                  "strided cos"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_recipe_gives_the_general_paths_bits(monkeypatch, served, name, interleaved):
    xs, cos, sin, pos = _case(name)
    runs = []
    for sig in (plain_signature, lambda *items: None):
        monkeypatch.setattr(op, "signature", sig)
        for cache in (op._CHECKED, op._PLANS, op._RECIPES):
            cache.clear()
        runs.append([op.apply_rotary(x, cos, sin, position_ids=pos, interleaved=interleaved) for x in xs])
        if sig is plain_signature:
            recipe = next(iter(op._RECIPES._data.values()))[0]
            if name == "strided cos":
                assert recipe is False and not served
            else:
                assert type(recipe) is op._RotaryLaunch and len(served) == 2  # calls 2 and 3
    for keyed, plain in zip(*runs):
        assert keyed.shape == plain.shape and keyed.is_contiguous()
        assert torch.equal(keyed, plain)


def test_rotary_recipe_follows_switches_and_skips_inplace_and_gradients(monkeypatch, served):
    monkeypatch.setattr(op, "signature", plain_signature)
    cos, sin = torch.randn(16, 4), torch.randn(16, 4)
    x = torch.randn(1, 6, 2, 8)
    with patched(tiles_launch, OP_RECIPES=False):
        for _ in range(3):
            op.apply_rotary(x, cos, sin)
    assert not served and len(op._RECIPES) == 0
    y = [op.apply_rotary(x, cos, sin) for _ in range(3)]
    assert len(served) == 2 and all(torch.equal(t, y[0]) for t in y)
    with patched(op, DTYPES=op.DTYPES):  # a patched block: another generation, the general path plans anew
        op.apply_rotary(x, cos, sin)
        assert len(served) == 2
        op.apply_rotary(x, cos, sin)  # (the block's own recipe, made by its first call)
        assert len(served) == 3
    op.apply_rotary(x, cos, sin)  # after it: planned again, and the recipe made again
    assert len(served) == 3
    op.apply_rotary(x, cos, sin)
    assert len(served) == 4
    xg = x.clone().requires_grad_()
    op.apply_rotary(xg, cos, sin).sum().backward()  # recording a gradient: the general path (its Function)
    z = x.clone()
    op.apply_rotary(z, cos, sin, inplace=True)
    assert len(served) == 4 and torch.equal(z, y[0])

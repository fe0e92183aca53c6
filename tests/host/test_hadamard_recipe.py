"""hadamard_transform's per-key recipe (op._TlTransform, under tiles.launch.OP_RECIPES; issue 31's host time): a keyed
call's second call on goes through the recipe alone (no checks, reshapes, plan or launch-key lookup), plainly and in
the recorded-gradient Function's forward and backward, and gives the general path's bits. Keys are CUDA-only, so the
module's signature is replaced by one for CPU tensors and the kernel runs in Triton's interpreter (the tl path); the
GPU's check is experiments/common/host_rows.py's same bits."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.hadamard import op
from tilecore.ops.hadamard.reference import hadamard_matrix
from tilecore.tiles import launch as tiles_launch
from host_testing import plain_signature, served_calls

pytestmark = pytest.mark.skipif(not dispatch.interpreter_enabled(),
                                reason="the tl path on CPU tensors runs in Triton's interpreter")


def _clear():
    for cache in (op._PLANS, op._RECIPES):
        cache.clear()


@pytest.fixture
def served(monkeypatch):
    yield from served_calls(monkeypatch, op._TlTransform, (op._PLANS, op._RECIPES))


def _inputs(case, n=64):
    torch.manual_seed(0)
    if case == "3-D":
        return [torch.randn(2, 3, n, dtype=torch.float16) * (1 + i) for i in range(3)]
    if case == "row stride":  # rows of a wider tensor: a view with its own row stride, no copy
        return [torch.randn(5, 2 * n, dtype=torch.float16)[:, :n] for _ in range(3)]
    if case == "transposed":  # reshape copies: the general path
        return [torch.randn(n, 6, dtype=torch.float16).t() for _ in range(3)]
    if case == "kron":  # n = 12 x 16: the Kronecker path, the general path
        return [torch.randn(4, 192, dtype=torch.float16) for _ in range(3)]
    return [torch.randn(6, n, dtype=torch.float32) for _ in range(3)]


@pytest.mark.parametrize("case", ["2-D float32", "3-D", "row stride", "transposed", "kron"])
def test_hadamard_recipe_gives_the_general_paths_bits(monkeypatch, served, case):
    xs = _inputs(case)
    runs = []
    for sig in (plain_signature, lambda *items: None):
        monkeypatch.setattr(op, "signature", sig)
        _clear()
        runs.append([op.hadamard_transform(x, 0.5 + i) for i, x in enumerate(xs)])
        if sig is plain_signature:
            recipe = next(iter(op._RECIPES._data.values()))[0]
            if case in ("transposed", "kron"):
                assert recipe is False and not served
            else:
                assert type(recipe) is op._TlTransform and len(served) == 2  # calls 2 and 3
    for keyed, plain in zip(*runs):
        assert torch.equal(keyed.view(torch.int16 if keyed.dtype == torch.float16 else torch.int32),
                           plain.view(torch.int16 if plain.dtype == torch.float16 else torch.int32))
    ref = [x.double() @ hadamard_matrix(x.shape[-1], torch.float64).T * (0.5 + i)
           for i, x in enumerate(xs)] if case != "kron" else None
    if ref is not None:
        for y, r in zip(runs[0], ref):
            assert torch.allclose(y.double(), r, rtol=2e-3, atol=2e-3)


def test_hadamard_recipe_in_the_recorded_gradient_path(monkeypatch, served):
    monkeypatch.setattr(op, "signature", plain_signature)
    torch.manual_seed(1)
    x = torch.randn(6, 64, requires_grad=True)
    g = torch.randn(6, 64)
    outs = []
    for _ in range(3):
        y = op.hadamard_transform(x, 0.25)
        (dx,) = torch.autograd.grad(y, x, g)
        outs.append((y.detach(), dx))
    assert served  # the Function's forward and its backward's plain call, from their keys' second calls
    with torch.no_grad():
        _clear()
        monkeypatch.setattr(op, "signature", lambda *items: None)
        y0, dx0 = op.hadamard_transform(x, 0.25), op.hadamard_transform(g, 0.25)
    for y, dx in outs:
        assert torch.equal(y, y0) and torch.equal(dx, dx0)


def test_hadamard_recipe_waits_for_its_switch_and_a_float_scale(monkeypatch, served):
    monkeypatch.setattr(op, "signature", plain_signature)
    x = torch.randn(4, 32)
    monkeypatch.setattr(tiles_launch, "OP_RECIPES", False)
    for _ in range(3):
        op.hadamard_transform(x)
    assert not served and len(op._RECIPES) == 0
    monkeypatch.setattr(tiles_launch, "OP_RECIPES", True)
    op.hadamard_transform(x)
    op.hadamard_transform(x, 2)  # an int scale: checked (real_scale), then the recipe from _hadamard_impl
    assert len(served) == 1
    with pytest.raises(ValueError, match="finite"):
        op.hadamard_transform(x, float("inf"))
    assert len(served) == 1

"""hadamard_quantize's per-key recipe (quantize._Pow2Quantize, under tiles.launch.OP_RECIPES; issue 31's host time):
a keyed call's second call on goes through the recipe alone (no checks, plan, reshapes or launch-key lookup) and
gives the plain call's bits. Keys are CUDA-only, so the module's signature is replaced by one for CPU tensors and
the kernel runs in Triton's interpreter; the GPU's check is experiments/common/host_rows.py's same bits."""
import pytest
import torch

from tilecore.ops.hadamard import quantize
from tilecore.tiles import launch as tiles_launch
from host_testing import plain_signature as _cpu_signature, served_calls


def _clear():
    for cache in (quantize._CHECKED, quantize._PLANS, quantize._RECIPES):
        cache.clear()


@pytest.fixture
def served(monkeypatch):
    yield from served_calls(monkeypatch, quantize._Pow2Quantize, (quantize._CHECKED, quantize._PLANS, quantize._RECIPES))


def _inputs(case, n=256):
    torch.manual_seed(0)
    if case == "3-D":
        return [torch.randn(2, 3, n, dtype=torch.float16) for _ in range(3)]
    if case == "row stride":  # rows of a wider tensor: _impl copies them, so no recipe
        return [torch.randn(5, 2 * n, dtype=torch.float16)[:, :n] for _ in range(3)]
    return [torch.randn(6, n, dtype=torch.float16) * (1 + i) for i in range(3)]


@pytest.mark.parametrize("fmt,kw,case", [("fp8_e4m3", {}, "2-D"), ("fp8_e5m2", {}, "3-D"), ("int8", {}, "2-D"),
                                         ("mxfp4", {}, "2-D"), ("int4", {}, "3-D"), ("fp8_e4m3", {"group": 128}, "2-D"),
                                         ("int8", {"block": 32}, "2-D"), ("fp8_e4m3", {}, "row stride"),
                                         ("nvfp4", {}, "2-D")])
def test_quantize_recipe_gives_the_plain_calls_bits(monkeypatch, served, fmt, kw, case):
    xs = _inputs(case)
    runs = []
    for sig in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(quantize, "signature", sig)
        _clear()
        outs = []
        for x in xs:
            codes, scales = quantize.hadamard_quantize(x, format=fmt, **kw)
            outs += [codes] + (list(scales) if isinstance(scales, tuple) else [scales])
        runs.append(outs)
        if sig is _cpu_signature:
            recipe = next(iter(quantize._RECIPES._data.values()))[0]
            path = next(iter(quantize._PLANS._data.values()))[0].path
            # a copy each call, nvfp4's two launches, another path (blocks of 32: the fused kernel): the general path
            if case == "row stride" or fmt == "nvfp4" or path != "pow2":
                assert recipe is False and not served
                assert (path == "pow2") == ("block" not in kw)
            else:
                assert type(recipe) is quantize._Pow2Quantize
                assert len(served) == len(xs) - 1  # every call after the key's first: the recipe alone
    for a, b in zip(*runs):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else torch.equal(a, b)


def test_quantize_recipe_waits_for_its_switch(monkeypatch, served):
    monkeypatch.setattr(quantize, "signature", _cpu_signature)
    x = torch.randn(4, 128, dtype=torch.float16)
    tiles_launch.keep_op_recipes(False)
    try:
        for _ in range(3):
            quantize.hadamard_quantize(x, format="int8")
        assert not served and not quantize._RECIPES._data  # off: no recipe made or used
    finally:
        tiles_launch.keep_op_recipes(True)
    for _ in range(3):
        quantize.hadamard_quantize(x, format="int8")
    assert len(served) == 2

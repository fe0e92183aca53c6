"""The convenience path's per-key recipe (quantize.ROTATED_RECIPES, quantize._QInKernelCall; issue 31's host time):
a plain eager call on the q-in-kernel path is keyed on its tensors and options; the key's later calls run no checks,
no plan and no launch key, and launch what the first call launched. No Gluon kernel runs on the CPU: the attention's
launch is recorded, k's and v's quantizers run in the interpreter (their codes compared bit for bit), CPU tensors
keyed by a stand-in of the CUDA-only signature."""
import pytest
import torch

from tilecore.ops.attention_fp8 import configs, launch, op, quantize
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.switches import patched


def cpu_signature(*items):
    out = []
    for t in items:
        if isinstance(t, torch.Tensor):
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or isinstance(t, tiles_launch._KEY_SCALARS):
            out.append(t)
        else:
            return None
    return tuple(out)


@pytest.fixture
def recorded(monkeypatch):
    """CPU calls keyed and taken down the q-in-kernel path, the attention's launches recorded, the checks and the
    attention's launch preparations counted; the caches empty."""
    seen = {"launches": [], "checks": 0, "prepared": 0}

    class Recorder:
        keyed = tiles_launch.LRU(4)

        def run(self, key, grid, args, kwargs):
            seen["launches"].append((key, grid, args, kwargs))

    check, prepare = op.check, launch.q_rotated_launch

    def counted_check(*a):
        seen["checks"] += 1
        return check(*a)

    def counted_prepare(*a, **kw):
        seen["prepared"] += 1
        return prepare(*a, **kw)

    monkeypatch.setattr(launch, "GLUON_FWD", Recorder())
    monkeypatch.setattr(launch, "_tiling", lambda q, k, rows, block_n, causal: ((7,), 2, None))
    monkeypatch.setattr(launch, "signature", cpu_signature)
    monkeypatch.setattr(quantize, "signature", cpu_signature)
    monkeypatch.setattr(quantize, "q_in_kernel", lambda *a: True)
    monkeypatch.setattr(op, "check", counted_check)
    monkeypatch.setattr(launch, "q_rotated_launch", counted_prepare)
    caches = (quantize._ROTATED_CALLS, launch._GLUON_LAYOUTS, launch._TILINGS)
    for cache in caches:
        cache.clear()
    yield seen
    for cache in caches:
        cache.clear()


def _inputs(seed=0, Hq=4, Hkv=2, N=40, Nk=150, D=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hq, N, D, generator=g).to(torch.float16)
    k, v = (torch.randn(1, Hkv, Nk, D, generator=g).to(torch.float16) for _ in range(2))
    return q, k, v


def _same_launch(a, b):
    """Two recorded launches of the attention: the same key, grid, options, and argument for argument the same
    (descriptors: the same view of equal bytes; tensors equal; the rest equal); O and lse fresh each call."""
    (key0, grid0, args0, opts0), (key1, grid1, args1, opts1) = a, b
    assert key0 == key1 and key0 is not None and grid0 == grid1 and opts0.keys() == opts1.keys()
    assert all(opts0[n] is opts1[n] or opts0[n] == opts1[n] for n in opts0)
    assert len(args0) == len(args1)
    for i, (x, y) in enumerate(zip(args0, args1)):
        if isinstance(x, tiles_launch.TmaOperand):
            assert (x.shape, x.strides, x.block_shape) == (y.shape, y.strides, y.block_shape)
            if i != 3:  # (3: O, fresh)
                assert torch.equal(x.base.view(torch.uint8), y.base.view(torch.uint8)), i
        elif isinstance(x, torch.Tensor):
            assert x.shape == y.shape and x.dtype == y.dtype
            if i != 4:  # (4: lse, fresh)
                assert torch.equal(x, y), i
        else:
            assert x == y, i


@pytest.mark.parametrize("v_scales", ["block", "head"])
def test_later_calls_of_a_key_check_and_plan_nothing_and_launch_the_same(recorded, v_scales):
    q, k, v = _inputs()
    with patched(quantize, ROTATED_RECIPES=True):
        outs = [quantize.attention_fp8_rotated(q, k, v, causal=True, return_lse=True, v_scales=v_scales)
                for _ in range(3)]
    assert recorded["checks"] == 1 and recorded["prepared"] == 1 and len(quantize._ROTATED_CALLS) == 1
    first, *later = recorded["launches"]
    for launch_ in later:
        _same_launch(first, launch_)
    assert all(o.shape == q.shape and lse.shape == q.shape[:3] for o, lse in outs)


def test_without_the_switch_or_with_other_configs_every_call_is_checked(recorded):
    q, k, v = _inputs(1)
    with patched(quantize, ROTATED_RECIPES=False):
        for _ in range(2):
            quantize.attention_fp8_rotated(q, k, v)
    assert recorded["checks"] == 2 and len(quantize._ROTATED_CALLS) == 0
    with patched(quantize, ROTATED_RECIPES=True):
        quantize.attention_fp8_rotated(q, k, v)
        quantize.attention_fp8_rotated(q, k, v)
        assert recorded["checks"] == 3
        with patched(configs, ROTATED=dict(configs.ROTATED)):  # other configs: the kept recipe is not theirs
            quantize.attention_fp8_rotated(q, k, v)
        assert recorded["checks"] == 4
        quantize.attention_fp8_rotated(q, k, v, causal=True)  # another key
        assert recorded["checks"] == 5
    _same_launch(recorded["launches"][2], recorded["launches"][3])


def test_a_call_recording_a_gradient_is_refused_not_served_by_the_recipe(recorded):
    q, k, v = _inputs(2)
    with patched(quantize, ROTATED_RECIPES=True):
        quantize.attention_fp8_rotated(q, k, v)
        quantize.attention_fp8_rotated(q, k, v)
        with pytest.raises(RuntimeError, match="forward-only"):
            quantize.attention_fp8_rotated(q.requires_grad_(), k, v)
    assert recorded["checks"] == 1 and len(recorded["launches"]) == 2

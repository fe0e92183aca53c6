"""What a keyed eager call of issue 31's three rows still over 40 us does on its host path, counted (session 37): the
rows' floors are these allocations and launches (notes/host's rows table), and a change that adds one shows here.
CPU tensors keyed through a stand-in signature (interpreter), launches by a counting stand-in of a kept KeyedLaunch,
allocations (torch.empty, Tensor.new_empty) counted.

* paged decode (attention_with_kvcache with a block table, O alone): 2 allocations (O; the split parts, with the
  merged lse in them), 2 launches (split keys, merge), no check, no layout.
* attention's split-key decode recording a gradient (O alone): 3 allocations (O, lse, the split parts), 2 launches,
  no plan, no check, one autograd node.
* fft_conv by its Gluon recipe: 1 allocation (y), 1 launch, no plan, no check; the filter's rfft of a padded copy by
  one cat with the recipe's zeros (PAD_BY_CAT) or of k with n = 2N (off).
* rms_norm recording a gradient (session 39): 2 allocations (y, rstd), 1 launch, no check, no plan, one autograd node
  (the recorded recipe's, y its only output, where norm op.RECORDED_RECIPES is on).
* attention's recording tag: dispatch.gluon_ok asked once a CUDA device (session 39).
"""
import sys

import pytest
import torch

from host_testing import Kept, clear_fft_conv, cpu_signature, fft_conv_on_gluon
from tilecore.ops.attention import op as attention_op
from tilecore.ops.attention_decode import launch as decode_launch
from tilecore.ops.attention_kvcache import op as kvcache
from tilecore.tiles import launch


@pytest.fixture
def counts(monkeypatch):
    counts = {"empty": 0, "launch": 0, "check": 0, "plan": 0}
    empty, new_empty = torch.empty, torch.Tensor.new_empty

    def counted_empty(*args, **kwargs):
        counts["empty"] += 1
        return empty(*args, **kwargs)

    def counted_new_empty(self, *args, **kwargs):
        counts["empty"] += 1
        return new_empty(self, *args, **kwargs)
    monkeypatch.setattr(torch, "empty", counted_empty)
    monkeypatch.setattr(torch.Tensor, "new_empty", counted_new_empty)
    return counts


def _counting(monkeypatch, module, name, counts, what):
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: counts.__setitem__(what, counts[what] + 1) or real(*a, **k))


def test_paged_decode_keyed_call_allocates_twice_and_launches_twice(monkeypatch, counts):
    monkeypatch.setattr(kvcache, "signature", cpu_signature)
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()
    kc, vc = (torch.randn(3, 256, 1, 32, dtype=torch.float16) for _ in range(2))
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    lengths = torch.tensor([600], dtype=torch.int32)
    q = torch.randn(1, 1, 4, 32, dtype=torch.float16)
    for _ in range(2):  # the key's first (checked) call makes the recipe; the second finds the memo's entry
        kvcache.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table)
    recipe = next(iter(kvcache._LAUNCHES._data.values()))[0]
    assert recipe.merge is not None  # (three key ranges and the merge)
    recipe.split = recipe.merge = Kept(counts)
    _counting(monkeypatch, kvcache, "check", counts, "check")
    _counting(monkeypatch, kvcache, "_DecodeLayout", counts, "plan")
    counts.update(empty=0, launch=0)
    out = kvcache.attention_with_kvcache(torch.randn(1, 1, 4, 32, dtype=torch.float16), kc, vc,
                                         cache_seqlens=lengths, block_table=table)
    assert out.shape == (1, 1, 4, 32)
    assert counts == {"empty": 2, "launch": 2, "check": 0, "plan": 0}
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()


def test_attention_decode_recording_a_gradient_allocates_three_times_and_launches_twice(monkeypatch, counts):
    monkeypatch.setattr(attention_op, "signature", cpu_signature)
    attention_op._PLANS.clear()
    decode_launch._DECODE_LAUNCHES.clear()
    q = torch.randn(1, 4, 2, 32, dtype=torch.float16)
    k = torch.randn(1, 2, 300, 32, dtype=torch.float16)
    attention_op.attention(q, k, k)  # the key's plan and recipe
    recipe = next(iter(decode_launch._DECODE_LAUNCHES._data.values()))[0]
    recipe.split = recipe.merge = Kept(counts)
    _counting(monkeypatch, attention_op, "plan_forward", counts, "plan")
    _counting(monkeypatch, attention_op, "check", counts, "check")
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, k))
    attention_op.attention(qg, kg, vg)  # (the grad-recording signature's own first lookups)
    counts.update(empty=0, launch=0, plan=0, check=0)
    o = attention_op.attention(qg, kg, vg)
    assert o.grad_fn is not None and type(o.grad_fn).__name__.startswith("_AttentionOutFunction")
    assert counts == {"empty": 3, "launch": 2, "check": 0, "plan": 0}
    attention_op._PLANS.clear()
    decode_launch._DECODE_LAUNCHES.clear()


@pytest.mark.parametrize("pad_by_cat", [True, False])
def test_fft_conv_recipe_allocates_once_and_launches_once(monkeypatch, counts, pad_by_cat):
    from tilecore.ops.fft_conv import op as fft_op

    plans = []
    fft_conv_on_gluon(monkeypatch, plans=plans)
    u = torch.randn(2, 3, 1024).to(torch.bfloat16)
    k = torch.randn(3, 300)
    for _ in range(2):
        fft_op.fft_conv(u, k)
    recipe = next(iter(fft_op._GLUON_CONVS._data.values()))[0]
    recipe.launch = Kept(counts)
    _counting(monkeypatch, fft_op, "check", counts, "check")
    ffts, cats = [], []
    rfft, cat = torch.fft.rfft, torch.cat
    monkeypatch.setattr(torch.fft, "rfft", lambda x, *a, **kw: ffts.append((x.shape, a, kw)) or rfft(x, *a, **kw))
    monkeypatch.setattr(torch, "cat", lambda *a, **kw: cats.append(1) or cat(*a, **kw))
    counts.update(empty=0, launch=0, plan=0, check=0)
    plans.clear()
    # (the switch set for the call, not a patched block: that would move the plans' generation, and the key with it)
    monkeypatch.setattr(fft_op, "PAD_BY_CAT", pad_by_cat)
    y = fft_op.fft_conv(u, k)
    assert y.shape == u.shape and y.dtype == u.dtype
    assert counts == {"empty": 1, "launch": 1, "check": 0, "plan": 0} and plans == []
    if pad_by_cat:
        assert cats == [1] and ffts == [(torch.Size([3, 2048]), (), {})]
    else:
        assert cats == [] and ffts == [(torch.Size([3, 300]), (), {"n": 2048})]
    clear_fft_conv()


@pytest.mark.parametrize("recorded_recipes", [True, False])
def test_rms_norm_recording_a_gradient_allocates_twice_and_launches_once(monkeypatch, counts, recorded_recipes):
    """rms_norm recording a gradient by its key's recorded recipe (norm op.RECORDED_RECIPES): y and rstd allocated,
    one launch, no check or plan, one autograd node whose only output is y; off, the general path's Function (the
    same allocations and launch, its 4 outputs)."""
    from tilecore.ops.norm import launch as norm_launch
    from tilecore.ops.norm import op as norm_op

    monkeypatch.setattr(norm_op, "signature", cpu_signature)
    caches = (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS)
    for cache in caches:
        cache.clear()
    x = torch.randn(4, 32, dtype=torch.float16, requires_grad=True)
    w = torch.randn(32, dtype=torch.float16, requires_grad=True)
    norm_op.layer_norm(x, w, rms=True)  # the key's first (checked) call keeps its NormForward
    recipe = next(iter(norm_op._FORWARDS._data.values()))[0]
    assert recipe.stats is None  # (whole rows: the forward kernel alone)
    recipe.forward = Kept(counts)
    _counting(monkeypatch, norm_op, "check", counts, "check")
    _counting(monkeypatch, norm_op, "plan", counts, "plan")
    counts.update(empty=0, launch=0)
    monkeypatch.setattr(norm_op, "RECORDED_RECIPES", recorded_recipes)  # (not a patched block: as fft_conv's above)
    y = norm_op.layer_norm(x, w, rms=True)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert counts == {"empty": 2, "launch": 1, "check": 0, "plan": 0}
    name = "_RecordedFunctionBackward" if recorded_recipes else "_LayerNormFunctionBackward"
    assert type(y.grad_fn).__name__ == name and y.grad_fn.next_functions[0][0] is not None
    for cache in caches:
        cache.clear()


def test_attention_asks_gluon_ok_once_a_cuda_device(monkeypatch):
    """attention's recording tag asks dispatch.gluon_ok once for each CUDA device index (kept), each call for CPU and
    meta tensors (dispatch.pretend may describe another GPU)."""
    asked = []
    monkeypatch.setattr(attention_op.dispatch, "gluon_ok", lambda device: asked.append(device) or True)
    monkeypatch.setattr(attention_op, "_GLUON_OK", {})

    class OnCuda:  # (a CUDA tensor's get_device and device, on a machine without one)
        def __init__(self, index):
            self.index = index

        def get_device(self):
            return self.index

        @property
        def device(self):
            return torch.device("cuda", self.index)
    for q in (OnCuda(0), OnCuda(0), OnCuda(1), OnCuda(0), OnCuda(1)):
        assert attention_op._gluon_ok(q)
    assert asked == [torch.device("cuda", 0), torch.device("cuda", 1)]
    for q in (torch.empty(1), torch.empty(1, device="meta")):
        asked.clear()
        assert attention_op._gluon_ok(q) and attention_op._gluon_ok(q)
        assert asked == [q.device, q.device]


@pytest.mark.parametrize("case", ["rms", "ln residual"])
def test_norm_keyed_backward_makes_no_empty_tensors(monkeypatch, case):
    """An eager backward with a launch key (norm launch.backward's ``key``) allocates no empty dres, dweight or dbias
    (the custom op's schema wants them; the eager caller takes None): every allocation of its call holds elements, and
    its gradients are the unkeyed backward's bits."""
    from tilecore.ops.norm import launch as norm_launch
    from tilecore.ops.norm import op as norm_op
    from tilecore.tiles import eager

    caches = (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS,
              norm_launch._BACKWARD_RECIPES)
    x0 = torch.randn(2, 3, 32, dtype=torch.float16)
    w0 = torch.randn(32, dtype=torch.float16)
    res0 = torch.randn(2, 3, 32, dtype=torch.float32) if case != "rms" else None  # (dres written apart)
    g = torch.randn(2, 3, 32, dtype=torch.float16)
    sizes, grads = [], {}
    empty, new_empty = torch.empty, torch.Tensor.new_empty
    for keyed in (True, False):
        monkeypatch.setattr(norm_op, "signature", cpu_signature if keyed else lambda *items: None)
        monkeypatch.setattr(eager, "signature", cpu_signature if keyed else lambda *items: None)
        for cache in caches:
            cache.clear()
        for i in range(2):  # (the second call: the recorded recipe where keyed)
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            res = None if res0 is None else res0.clone().requires_grad_()
            y = norm_op.layer_norm(x, w, residual=res, rms=case == "rms")
            sizes.clear()

            def counted(make):  # (tilecore's allocations: the interpreter makes its own copies)
                def alloc(*a, **k):
                    t = make(*a, **k)
                    if sys._getframe(1).f_globals.get("__name__", "").startswith("tilecore"):
                        sizes.append(t.numel())
                    return t
                return alloc
            monkeypatch.setattr(torch, "empty", counted(empty))
            monkeypatch.setattr(torch.Tensor, "new_empty", counted(new_empty))
            y.backward(g)
            monkeypatch.setattr(torch, "empty", empty)
            monkeypatch.setattr(torch.Tensor, "new_empty", new_empty)
            if keyed:
                assert sizes and 0 not in sizes
            else:
                assert 0 in sizes  # (the op's schema: an empty dres / dbias)
            grads[keyed, i] = [t.grad for t in (x, w, res) if t is not None]
    for i in range(2):
        assert all(torch.equal(a, b) for a, b in zip(grads[True, i], grads[False, i]))
    for cache in caches:
        cache.clear()

"""tiles.launch.SignatureMemo (session 32, issue 31's host time): a call site's signature checked against its last
repeated one by torch's C-level tensor check. It must answer what the site's signature function answers on every
call, whatever changed between calls (shape, strides, dtype, device, alignment, requires_grad, a scalar's value or
type, a tensor where a scalar was, a subclass, an in-place resize), and hit where nothing did.

The CUDA signature (tiles.launch.signature) refuses CPU tensors, so the memo here builds with the same function
for any device (``_any_device_signature``), handed through the namespace as an op module hands its own."""
import gc
import random
import weakref

import pytest
import torch

from tilecore.tiles import launch
from tilecore.tiles.launch import SignatureMemo

pytestmark = pytest.mark.skipif(launch._TensorGuards is None, reason="this torch has no TensorGuards")


def _any_device_signature(*items):
    """tiles.launch.signature without its CUDA-only rule (and counting its calls)."""
    CALLS[0] += 1
    out = []
    for t in items:
        kind = type(t)
        if kind is torch.Tensor:
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or kind in launch._KEY_SCALAR_TYPES:
            out.append(t)
        elif isinstance(t, torch.Tensor):
            return None
        elif isinstance(t, launch._KEY_SCALARS):
            out.append(t)
        else:
            return None
    return tuple(out)


CALLS = [0]


@pytest.fixture
def memo():
    launch.memo_signatures(True)
    yield SignatureMemo({"signature": _any_device_signature})
    launch.memo_signatures(True)


def test_a_repeated_signature_hits_after_two_calls_and_is_the_same_object(memo):
    x, w = torch.randn(8, 16), torch.randn(16)
    keys = [memo(x, w, None, 1e-5, True) for _ in range(4)]
    assert all(k == _any_device_signature(x, w, None, 1e-5, True) for k in keys)
    before = CALLS[0]
    # new tensors with the same metadata (an eager loop's fresh activations) hit: no signature built
    for _ in range(5):
        assert memo(torch.randn(8, 16), torch.randn(16), None, 1e-5, True) is keys[-1]
    assert CALLS[0] == before


class Sub(torch.Tensor):
    pass


def _variants(x: torch.Tensor):
    """Items differing from (x, 1e-5, True, None) in one part each (every part of the signature)."""
    wide = torch.randn(x.shape[0], x.shape[1] + 1)
    meta = torch.empty(x.shape, device="meta")
    flat = torch.randn(x.numel() + 4)
    resized = x.clone()
    resized.resize_(x.shape[0] + 1, x.shape[1])
    return [
        (torch.randn(x.shape[0] + 1, x.shape[1]), 1e-5, True, None),  # shape
        (wide[:, :x.shape[1]], 1e-5, True, None),  # strides
        (x.t().contiguous().t(), 1e-5, True, None),  # strides (column-major)
        (x.double(), 1e-5, True, None),  # dtype
        (meta, 1e-5, True, None),  # device
        (flat[1:1 + x.numel()].view(x.shape), 1e-5, True, None),  # base 4 bytes off 16
        (x.clone().requires_grad_(), 1e-5, True, None),  # requires_grad (a miss, never a wrong key)
        (x.clone(), 2e-5, True, None),  # a scalar's value
        (x.clone(), 1e-5, 1, None),  # a scalar's type (bool -> int: equal by ==, a miss by type)
        (x.clone(), torch.tensor(1e-5), True, None),  # a tensor where a scalar was
        (x.clone(), 1e-5, True, torch.tensor(0.0)),  # a tensor where None was
        (x.clone().as_subclass(Sub), 1e-5, True, None),  # a subclass (signature: None)
        (resized, 1e-5, True, None),  # an in-place resize
        (x.clone(), 1e-5, True, None, 3),  # one item more
        (x.clone(), 1e-5, True),  # one item fewer
    ]


def test_each_changed_part_misses_and_answers_what_the_signature_answers(memo):
    x = torch.randn(6, 8)
    same = (x, 1e-5, True, None)
    for _ in range(3):
        memo(*same)
    assert memo._last is not None
    for items in _variants(x):
        for _ in range(3):  # a variant repeated becomes the entry; the original then misses back
            assert memo(*items) == _any_device_signature(*items)
        assert memo(*same) == _any_device_signature(*same)


def test_in_place_metadata_changes_of_the_same_tensor_miss(memo):
    x = torch.randn(4, 8)
    for _ in range(3):
        memo(x, 0.5)
    x.resize_(8, 4)  # the same Python object, other metadata
    assert memo(x, 0.5) == _any_device_signature(x, 0.5)
    y = torch.randn(64)
    for _ in range(3):
        memo(y[:32], 0.5)
    y2 = y[:32]
    y2.as_strided_((16,), (2,))
    assert memo(y2, 0.5) == _any_device_signature(y2, 0.5)


def test_random_call_sequences_always_answer_the_signature(memo):
    """A fuzz over calls drawn from a small pool (repeats, alternations, every kind of change): the memo's answer
    equals the signature's on every call, and the repeats hit."""
    rng = random.Random(0)
    base = torch.randn(5, 7)
    pool = [(base, 1e-5, True, None)] + _variants(base)
    hits = 0
    for _ in range(400):
        items = pool[0] if rng.random() < 0.5 else rng.choice(pool)
        before = CALLS[0]
        got = memo(*items)
        hits += CALLS[0] == before
        assert got == _any_device_signature(*items)
    assert hits > 50


def test_alternating_signatures_do_not_rebuild_the_entry_each_call(memo, monkeypatch):
    built = []
    entry = SignatureMemo._entry
    monkeypatch.setattr(SignatureMemo, "_entry", staticmethod(lambda *a: built.append(1) or entry(*a)))
    a, b = torch.randn(4, 4), torch.randn(8, 4)
    for _ in range(20):
        assert memo(a, 1) == _any_device_signature(a, 1)
        assert memo(b, 1) == _any_device_signature(b, 1)
    assert built == []


def test_the_switch_and_a_replaced_signature_function(memo):
    x = torch.randn(4, 4)
    for _ in range(3):
        memo(x, 1)
    launch.memo_signatures(False)
    before = CALLS[0]
    assert memo(x, 1) == _any_device_signature(x, 1) and CALLS[0] == before + 2
    launch.memo_signatures(True)
    # the namespace's signature replaced (as tests replace an op module's): the entry it did not build never hits
    memo._namespace["signature"] = lambda *items: None
    try:
        assert memo(x, 1) is None
    finally:
        memo._namespace["signature"] = _any_device_signature


def test_the_entry_keeps_no_tensor_alive(memo):
    x = torch.randn(256, 256)
    ref = weakref.ref(x)
    for _ in range(3):
        memo(x, 1)
    assert memo._last is not None
    del x
    gc.collect()
    assert ref() is None


def test_the_ops_call_sites_are_memos_over_their_modules_signature():
    """Each keyed op's call site is a SignatureMemo whose misses go through its module's ``signature`` (so the
    tests that replace it keep their meaning)."""
    from tilecore.ops.attention import op as attention
    from tilecore.ops.attention_fp8 import op as fp8
    from tilecore.ops.attention_kvcache import op as kvcache
    from tilecore.ops.attention_varlen import op as varlen
    from tilecore.ops.fft_conv import op as fft_conv
    from tilecore.ops.gemm import op as gemm
    from tilecore.ops.hadamard import quantize as hadamard_quantize
    from tilecore.ops.linear_attention import op as la
    from tilecore.ops.norm import op as norm
    from tilecore.ops.rotary import op as rotary

    for module, names in ((attention, ("_FORWARD_KEY", "_BACKWARD_KEY", "_ADDING_DQ_KEY")), (kvcache, ("_CALL_KEY",)),
                          (varlen, ("_CALL_KEY",)), (fp8, ("_CALL_KEY",)),
                          (gemm, ("_GEMM_KEY", "_FP8_KEY")),
                          (la, ("_FORWARD_KEY", "_STEP_KEY", "_MAMBA_STEP_KEY")), (norm, ("_CALL_KEY",)),
                          (rotary, ("_CALL_KEY",)), (fft_conv, ("_CALL_KEY",)),
                          (hadamard_quantize, ("_CALL_KEY",))):
        for name in names:
            site = getattr(module, name)
            assert isinstance(site, SignatureMemo) and site._namespace is vars(module)
            assert vars(module)["signature"] is launch.signature


def test_a_tensor_guards_that_refuses_turns_the_memo_off(memo, monkeypatch):
    def refuse(*args, **kwargs):
        raise TypeError("another signature")
    monkeypatch.setattr(launch, "_TensorGuards", refuse)
    x = torch.randn(4, 4)
    for _ in range(4):
        assert memo(x, 1) == _any_device_signature(x, 1)
    assert memo._last is None and launch.MEMO_SIGNATURES is False


def test_a_tensor_given_twice_is_checked_once_and_must_repeat(memo):
    """attention(q, k, k): TensorGuards refuses a tensor twice, so the entry checks k once and needs the same
    object at v's position again (found on the H100, session 32 run 3: the decode case rebuilt its entry every
    call, 1.6x slower)."""
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 64, 16)
    for _ in range(3):
        memo("forward", q, k, k, True)
    assert memo._last is not None
    before = CALLS[0]
    k2 = torch.randn(1, 2, 64, 16)
    assert memo("forward", torch.randn(1, 4, 1, 16), k2, k2, True) is memo._last[5]
    assert CALLS[0] == before  # a hit
    v = torch.randn(1, 2, 64, 16)  # the same metadata, not aliased: a miss, the signature's answer
    assert memo("forward", q, k, v, True) == _any_device_signature("forward", q, k, v, True)
    assert CALLS[0] == before + 2  # (the memo's miss and the assertion's own call)


def test_an_entry_that_cannot_be_made_is_not_tried_at_every_call(memo, monkeypatch):
    tried = []
    monkeypatch.setattr(SignatureMemo, "_entry", staticmethod(lambda *a: tried.append(1)))
    x = torch.randn(4, 4)
    for _ in range(10):
        assert memo(x, 1) == _any_device_signature(x, 1)
    assert len(tried) == 1


# session 33: fft_conv's and hadamard_quantize's call sites on the memo (issue 31's host time)

def _fft_items(x):
    return (x, torch.randn(2, 16))


def _quantize_items(x):
    return (x, "fp8_e4m3", None, True, None)  # hadamard_quantize's keyed items: x, format, block, rotate, group


@pytest.mark.parametrize("which", ["fft_conv", "hadamard_quantize"])
def test_fft_conv_and_hadamard_quantize_sites_hit_repeats_and_miss_each_change(which, monkeypatch):
    """The two sites converted in session 33: a repeated signature hits (no signature built), and a changed
    stride, dtype, device or requires_grad misses (the module's signature is built: its answer returned)."""
    from tilecore.ops.fft_conv import op as fft_op
    from tilecore.ops.hadamard import quantize as hq

    module, items_of = (fft_op, _fft_items) if which == "fft_conv" else (hq, _quantize_items)
    site = module._CALL_KEY
    assert isinstance(site, SignatureMemo) and site._namespace is vars(module)
    launch.memo_signatures(True)
    monkeypatch.setattr(module, "signature", _any_device_signature)
    site._last = site._missed = site._refused = None
    x = torch.randn(2, 64, dtype=torch.float16)
    for _ in range(3):
        site(*items_of(x))
    assert site._last is not None
    before = CALLS[0]
    for _ in range(3):  # fresh tensors of the same metadata: hits
        items = items_of(torch.randn(2, 64, dtype=torch.float16))
        got = site(*items)
        assert CALLS[0] == before and got is site._last[5]
        assert got == _any_device_signature(*items)
        before = CALLS[0]
    wide = torch.randn(2, 80, dtype=torch.float16)
    changed = {"stride": wide[:, :64], "dtype": x.float(), "device": torch.empty(2, 64, dtype=torch.float16,
                                                                                   device="meta"),
               "requires_grad": x.clone().requires_grad_()}
    for what, y in changed.items():
        items = items_of(y)
        before = CALLS[0]
        got = site(*items)
        assert CALLS[0] == before + 1, f"a changed {what} hit the kept entry"
        assert got == _any_device_signature(*items)
        site._last = site._missed = None  # (the next change meets the original entry again)
        for _ in range(2):
            site(*items_of(x))
    site._last = site._missed = site._refused = None


def test_fft_conv_and_hadamard_quantize_give_the_same_results_with_the_memo_on_and_off(monkeypatch):
    """Through the ops (the interpreter, the signature let through for CPU tensors): a call sequence with repeats
    and each kind of change gives the same bits with MEMO_SIGNATURES on and off, and the repeats hit."""
    from tilecore.ops.fft_conv import op as fft_op
    from tilecore.ops.hadamard import quantize as hq

    torch.manual_seed(33)
    u = torch.randn(1, 2, 64, dtype=torch.float16)
    k = torch.randn(2, 16)
    wide = torch.randn(1, 2, 80, dtype=torch.float16)
    x = torch.randn(2, 48, dtype=torch.float16)
    xw = torch.randn(2, 96, dtype=torch.float16)
    fft_calls = [(u, k), (u.clone(), k.clone()), (u + 1, k), (wide[..., :64], k), (u.float(), k),
                 (u.clone().requires_grad_(), k), (u, k), (u - 1, k)]
    quantize_calls = [x, x.clone(), x + 1, xw[:, :48], x.float(), x - 1, x * 2]
    runs = {}
    for on in (True, False):
        launch.memo_signatures(on)
        monkeypatch.setattr(fft_op, "signature", _any_device_signature)
        monkeypatch.setattr(hq, "signature", _any_device_signature)
        for site in (fft_op._CALL_KEY, hq._CALL_KEY):
            site._last = site._missed = site._refused = None
        built = CALLS[0]
        outs = [fft_op.fft_conv(a, b).detach() for a, b in fft_calls]
        for y in quantize_calls:
            codes, scales = hq.hadamard_quantize(y, format="fp8_e4m3")
            outs += [codes.view(torch.uint8), scales]
        runs[on] = (outs, CALLS[0] - built)
    launch.memo_signatures(True)
    for site in (fft_op._CALL_KEY, hq._CALL_KEY):
        site._last = site._missed = site._refused = None
    (on_outs, on_built), (off_outs, off_built) = runs[True], runs[False]
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(on_outs, off_outs))
    assert off_built == len(fft_calls) + len(quantize_calls)
    assert on_built <= off_built - 3  # the repeats (calls 3 of each run of one signature) hit

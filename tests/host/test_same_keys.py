"""LRU's last lookup kept by key object and SameKey's kept composite keys (tiles.launch.SAME_KEYS; issue 31's host
time): a lookup by the same object answers what the dict answers, fills and clears forget the kept answer, and
linear_attention's nested keys are one object a call site while their parts repeat (its recorded call's five
lookups then hash nothing)."""
import pytest
import torch

from tilecore.tiles import launch
from host_testing import plain_signature


class Key(tuple):
    """A tuple key that counts its hashes (a dict lookup hashes the key it is given)."""
    hashes = 0

    def __hash__(self):
        Key.hashes += 1
        return tuple.__hash__(self)


@pytest.mark.parametrize("on", [True, False])
def test_lru_answers_by_the_same_object_as_the_dict_does(monkeypatch, on):
    monkeypatch.setattr(launch, "SAME_KEYS", on)
    lru = launch.LRU(2)
    a, b, c = Key(("a", 1)), Key(("b", 2)), Key(("c", 3))
    assert lru.get(a) is None and a not in lru
    lru.put(a, "A")  # a fill forgets the kept miss
    Key.hashes = 0
    assert lru.get(a) == "A" and lru.get(a) == "A" and a in lru
    assert Key.hashes == (1 if on else 3)  # on: the first lookup hashes, the same object's later ones do not
    assert lru.get(Key(("a", 1))) == "A"  # an equal key of another object: the dict's answer
    lru.put(b, "B")
    lru.put(c, "C")  # evicts one of a, b (CLOCK): the kept entry must not outlive it
    present = {k: lru.get(k) for k in (a, b, c)}
    assert present[c] == "C" and sum(v is not None for v in present.values()) == 2
    for k in (a, b):
        assert (lru.get(k) is not None) == (k in lru._data)
    lru.put(c, "C2")  # a refill of the same key: its new value
    assert lru.get(c) == "C2"
    lru.clear()
    assert lru.get(c) is None and c not in lru
    assert lru.memo(c, lambda: "made") == "made" and lru.get(c) == "made"


def test_same_key_is_one_object_while_its_parts_are_the_same_objects(monkeypatch):
    site = launch.SameKey()
    sig = (("shape", "strides"), None, True)
    first = site("op", 7, sig)
    assert site("op", 7, sig) is first
    other = site("op", 7, tuple(list(sig)))  # an equal part of another object: a new tuple, equal
    assert other is not first and other == first
    assert site("op", 7, sig) is not first  # (the site keeps its last key only)
    assert site("op", 8, sig) != first  # a part changed: a new key
    monkeypatch.setattr(launch, "SAME_KEYS", False)
    assert site("op", 8, sig) is not site("op", 8, sig)


def test_linear_attention_recorded_call_looks_its_keys_up_by_identity(monkeypatch):
    """The recorded-gradient call's forward: its nested keys are the same objects call after call, so every LRU lookup
    of the call after the key's first calls finds its answer kept (counted by wrapping LRU.get). CPU keys: the
    module's signature replaced by one for CPU tensors; the kernels run in Triton's interpreter."""
    from tilecore import dispatch
    from tilecore.ops.linear_attention import op as la_op
    if not dispatch.interpreter_enabled():
        pytest.skip("the tl kernels on CPU tensors run in Triton's interpreter")
    monkeypatch.setattr(la_op, "signature", plain_signature)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 32, 2, 16, requires_grad=True) for _ in range(3))
    seen = []
    get = launch.LRU.get

    def counted(self, key, default=None):
        seen.append(self._last[0] is key)
        return get(self, key, default)

    outs = []
    for call in range(4):
        if call == 3:
            monkeypatch.setattr(launch.LRU, "get", counted)
        outs.append(la_op.linear_attention(q, k, v).detach())
    monkeypatch.setattr(launch.LRU, "get", get)
    assert len(seen) >= 5 and all(seen)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])

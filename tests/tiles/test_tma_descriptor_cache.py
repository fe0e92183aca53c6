"""tiles.launch.descriptor_expander (session 29, issue 31's host time): a direct launch of a Gluon kernel hands
Triton's compiled launcher the arguments Triton's own descriptor wrapper (driver.wrap_handle_tensordesc) would,
with each TMA descriptor's encoding kept per (base address, shape, strides, padding). Checked on the CPU against
that wrapper itself, with Triton's encoder replaced by a recording stand-in (the real one needs a GPU)."""
import pytest
import torch
import triton.backends.nvidia.driver as nvidia_driver

from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import TmaOperand, descriptor_expander

SIGNATURE = {0: "*bf16", 1: "tensordesc<bf16[1, 64, 64]>", 2: "i32", 3: "*fp32",
             4: "tensordesc<bf16[1, 64, 64]>", 5: "fp32"}
METAS = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=[1, 64, 64], fp4_padded=False),
         dict(swizzle=2, elem_size=2, elem_type=9, block_size=[1, 64, 32], fp4_padded=False)]
BASE = tuple(range(13))  # the 13 launch arguments before the kernel's (grid, stream, function, ...)


@pytest.fixture
def encoder(monkeypatch):
    """Triton's make_tensordesc_arg replaced by a stand-in: (the descriptor's fields, the metadata's swizzle)
    as its "CUtensorMap", then the shape and strides, as Triton lays them out; counts its calls."""
    calls = []

    def encode(arg, meta):
        calls.append((arg.base.data_ptr(), tuple(arg.shape)))
        return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta["swizzle"]),
                *arg.shape, *arg.strides]

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", encode)
    return calls


def _launchers():
    received = []

    def raw(*args):
        received.append(args)

    return raw, received, nvidia_driver.wrap_handle_tensordesc(raw, SIGNATURE, METAS)


def _args(q, out):
    return [q, TmaOperand(q, [1, 64, 64]), 7, out, TmaOperand(q[:, :32], [1, 64, 32]), 0.5]


def test_expanded_arguments_are_tritons_and_encodings_are_kept(encoder):
    raw, received, inner = _launchers()
    parts = descriptor_expander(inner)
    assert parts is not None and parts[0] is raw
    _, expand = parts
    torch.manual_seed(0)
    q, q2 = torch.randn(2, 128, 64), torch.randn(2, 128, 64)
    out = torch.empty(4)
    for x in (q, q, q2, q):
        args = _args(x, out)
        inner(*BASE, *args)  # Triton's wrapper: encodes each descriptor
        raw(*BASE, *expand(args))
        assert received[-1] == received[-2]  # the same arguments, in the same order
    # Triton's wrapper encoded 2 descriptors x 4 launches; the expander each layout once: q's two, q2's two
    assert len(encoder) == 8 + 4
    a = TmaOperand(q, [1, 64, 64], shape=[2, 64, 64])  # another view of q's memory: its own encoding
    args = [q, a, 7, out, TmaOperand(q[:, :32], [1, 64, 32]), 0.5]
    inner(*BASE, *args)
    raw(*BASE, *expand(args))
    assert received[-1] == received[-2] and len(encoder) == 8 + 4 + 2 + 1


def test_kept_encodings_are_bounded(encoder, monkeypatch):
    monkeypatch.setattr(tiles_launch, "TMA_ENCODINGS_KEPT", 3)
    raw, received, inner = _launchers()
    _, expand = descriptor_expander(inner)
    out = torch.empty(4)
    tensors = [torch.randn(2, 128, 64) for _ in range(6)]
    for x in tensors + tensors[-2:]:
        raw(*BASE, *expand(_args(x, out)))
    assert len(encoder) == 2 * 6  # the last two layouts were still kept; never more than 3 a slot
    for x in tensors[:1]:
        raw(*BASE, *expand(_args(x, out)))
    assert len(encoder) == 2 * 7  # the first had been dropped


def test_not_the_wrapper_or_no_metadata_gives_none():
    raw, _, _ = _launchers()
    assert descriptor_expander(raw) is None  # no descriptors: the launcher itself
    no_meta = nvidia_driver.wrap_handle_tensordesc(raw, SIGNATURE, None)
    assert descriptor_expander(no_meta) is None  # Triton's encoding holds the tensor: not kept
    assert descriptor_expander(lambda *args: None) is None


def test_keyed_hit_on_its_device_skips_the_guard_and_launches_as_before(fast_launch, monkeypatch):
    """CachedLaunch.run's keyed hit (session 29): where the key's device is the current one it launches without
    the device guard, with launch_keyed's arguments; on another current device it takes the guarded path."""
    import triton
    import triton.language as tl

    from tilecore import dispatch
    from tilecore.tiles.launch import CachedLaunch

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    from triton.runtime.jit import JITFunction

    cached = CachedLaunch(JITFunction(add_one.fn))  # compiled-mode parameters (the interpreter's jit has none)
    fake = fast_launch(cached)
    guarded = []
    monkeypatch.setattr(dispatch, "on_device", lambda device: guarded.append(device) or __import__(
        "contextlib").nullcontext())
    x = torch.zeros(10)
    for _ in range(3):
        cached.run(("key",), (2,), (x, 10), dict(BLOCK=8))
    assert len(fake.calls) == 3 and all(c == fake.calls[0] for c in fake.calls)
    assert cached.keyed.get(("key",))[2] == 0  # kept with its device
    assert len(guarded) == 2  # the first (checked) launch and the keyed one that kept it; the hit: no guard
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    cached.run(("key",), (2,), (x, 10), dict(BLOCK=8))
    assert len(guarded) == 3 and len(fake.calls) == 4 and fake.calls[-1] == fake.calls[0]

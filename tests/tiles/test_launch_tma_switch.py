"""tiles.launch.CACHE_TMA_DESCRIPTORS read at each direct launch (session 30, issue 31): one process times a Gluon
kernel's keyed launches with and without the kept TMA encodings (host_time.py --ab-tma), and both ways hand
Triton's compiled launcher the same arguments. CPU: Triton's descriptor wrapper and encoder with stand-ins."""
import sys
import types

import pytest
import torch
import triton.backends.nvidia.driver as nvidia_driver
import triton.runtime.driver  # noqa: F401 (the module, which triton.runtime's `driver` object shadows)

from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import TmaOperand, direct_launch

SIGNATURE = {0: "*bf16", 1: "tensordesc<bf16[64, 64]>", 2: "i32"}
METAS = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=[64, 64], fp4_padded=False)]


@pytest.fixture
def fake_gluon_kernel(monkeypatch):
    """A compiled kernel whose launcher is Triton's descriptor wrapper around a recording raw launcher;
    returns (compiled, what the raw launcher received, the encoder's calls)."""
    encoded = []

    def encode(arg, meta):
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides)), *arg.shape, *arg.strides]

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", encode)
    monkeypatch.setattr(sys.modules["triton.runtime.driver"], "driver", types.SimpleNamespace(
        active=types.SimpleNamespace(get_current_stream=lambda device: 1000 + device, get_current_device=lambda: 0)))
    received = []
    if getattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", None) != 13:
        pytest.skip("this triton's launcher is not 3.6's: direct_launch declines it (the runner launches)")
    CudaLauncher = type("CudaLauncher", (), dict(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                                                 launch_pdl=False, __module__=nvidia_driver.__name__))
    run = CudaLauncher()
    run.launch = nvidia_driver.wrap_handle_tensordesc(lambda *a: received.append(a), SIGNATURE, METAS)
    return types.SimpleNamespace(run=run, function=7, packed_metadata="packed"), received, encoded


def test_the_switch_is_read_each_launch_and_both_ways_agree(fake_gluon_kernel, monkeypatch):
    compiled, received, encoded = fake_gluon_kernel
    monkeypatch.setattr(tiles_launch, "CACHE_TMA_DESCRIPTORS", False)
    go = direct_launch(compiled)  # made with the switch off: still follows it later
    q = torch.randn(128, 64)
    args = [q, TmaOperand(q, [64, 64]), 5]
    for on in (False, True, True, False, True):
        tiles_launch.cache_tma_descriptors(on)
        go((2, 1, 1), args)
    assert len(set(received)) == 1 and len(received) == 5  # the same arguments every launch, either way
    assert len(encoded) == 2 + 1  # off: Triton encodes each launch; on: once, then kept


def test_a_keyed_hit_appends_the_keys_constexprs_or_reads_its_kwargs(fast_launch):
    """CachedLaunch's keyed hit (session 30): where every parameter after the positional arguments is a constexpr
    (fixed by the key) it appends them as the key's first launch gave them; a runtime parameter passed by keyword
    is read from each call's kwargs. Either way each launch gets the arguments the plain launch would."""
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    from tilecore.tiles.launch import CachedLaunch

    @triton.jit
    def scaled(x_ptr, n, scale, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)

    cached = CachedLaunch(JITFunction(scaled.fn))
    fake = fast_launch(cached)
    x = torch.zeros(10)
    for scale in (1.0, 2.0, 3.0):  # constexpr tail: kept with the key
        cached.run(("tail",), (2,), (x, 10, scale), dict(BLOCK=8))
    assert cached.keyed.get(("tail",))[3] == (3, [8, False])
    assert [c[1][2] for c in fake.calls] == [1.0, 2.0, 3.0] and all(c[1][3:] == (8, False) for c in fake.calls)
    for scale in (4.0, 5.0):  # scale by keyword: no tail kept, each call's value launched
        cached.run(("kw",), (2,), (x, 10), dict(scale=scale, BLOCK=8, EVEN=True))
    assert cached.keyed.get(("kw",))[3] is None
    assert [c[1][2:] for c in fake.calls[3:]] == [(4.0, 8, True), (5.0, 8, True)]

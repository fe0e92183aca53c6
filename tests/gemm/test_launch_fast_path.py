"""The Hopper launch fast path without a GPU: a cached compiled kernel is called with a 3-D grid and
every argument of gemm_kernel, in the kernel's order, with descriptors the launcher can read."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.gemm import configs, launch, plan
from tilecore.ops.gemm.gluon_kernels import gemm_kernel


@pytest.mark.parametrize("b_t", [False, True])
def test_fast_path_passes_every_argument_in_order(fast_launch, monkeypatch, b_t):
    M, N, K = 300, 264, 72
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(N, K, dtype=torch.bfloat16) if b_t else torch.randn(K, N, dtype=torch.bfloat16)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    bias = torch.randn(N, dtype=torch.bfloat16)
    monkeypatch.setattr(dispatch, "interpreted", lambda device: False)  # plan as on Hopper
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    p = plan.plan(a, b.t() if b_t else b, out_dtype=torch.bfloat16, bias=bias, config=configs.GLUON_BF16)
    assert p.path == "gluon" and p.b_t is b_t
    fake = fast_launch(launch._GLUON_GEMM)
    launch.launch(p, a, b.t() if b_t else b, bias, out=c)
    (grid, args), = fake.calls
    assert grid[1:] == (1, 1) and grid[0] >= 1
    names = gemm_kernel.arg_names
    assert len(args) == len(names)
    bound = dict(zip(names, args))
    for name, t, shape in (("a_desc", a, [M, K]), ("b_desc", b, list(b.shape)), ("c_desc", c, [M, N])):
        d = bound[name]
        assert d.base.data_ptr() == t.data_ptr()  # t itself, or (B^T) a view of it
        assert list(d.shape) == shape and list(d.strides) == [t.stride(0), 1] and d.padding == "zero"
    assert (bound["M"], bound["N"], bound["K"]) == (M, N, K)
    assert bound["bias_ptr"] is bias
    assert bound["B_T"] is b_t and bound["HAS_BIAS"] is True and bound["SCALES"] == 0
    assert bound["GROUP_M"] == configs.GLUON_BF16["group_m"] and bound["STAGES"] == configs.GLUON_BF16["stages"]


def test_keyed_launch_passes_the_same_arguments_as_the_checked_one(fast_launch, monkeypatch):
    """launch_keyed (the signature-keyed lookup of an eager call) calls the kernel with exactly the
    arguments, in the same order, as the launch that computes Triton's key."""
    from tilecore.tiles.launch import signature

    M, N, K = 256, 128, 64
    a, b = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)
    monkeypatch.setattr(dispatch, "interpreted", lambda device: False)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    monkeypatch.setattr(dispatch, "on_device", lambda device: __import__("contextlib").nullcontext())
    p = plan.plan(a, b, out_dtype=torch.bfloat16, config=configs.GLUON_BF16)
    fake = fast_launch(launch._GLUON_GEMM)
    key = (("sig",), "test")
    launch.launch(p, a, b)  # the checked launch
    launch.launch(p, a, b, key=key)  # first keyed launch: the checked way, then kept under the key
    assert launch._GLUON_GEMM.keyed.get(key)[0] is fake
    launch.launch(p, a, b, key=key)  # keyed hit
    assert len(fake.calls) == 3
    (g0, checked), _, (g2, keyed) = fake.calls
    assert g0 == g2 and len(checked) == len(keyed) == len(gemm_kernel.arg_names)
    for x, y in zip(checked, keyed):
        if isinstance(x, torch.Tensor):
            assert x.shape == y.shape and x.dtype == y.dtype  # C: a fresh output each call
        elif hasattr(x, "base"):
            assert (x.shape, x.strides, x.block_shape) == (y.shape, y.strides, y.block_shape)
        else:
            assert x == y


def test_signature_caches_only_plain_cuda_calls():
    from tilecore.tiles.launch import signature

    t = torch.randn(4, 8)
    assert signature(t, 1.0) is None  # CPU: plans there follow the environment (the interpreter)
    assert signature(torch.empty(2, device="meta")) is None
    assert signature([1, 2]) is None  # not a key item: uncached, the checks speak


def test_eager_mode_routes_each_call():
    t = torch.randn(3, requires_grad=True)
    u = torch.randn(3)
    assert dispatch.eager_mode(u, None) == "direct"
    assert dispatch.eager_mode(t, u) == "autograd"
    with torch.no_grad():
        assert dispatch.eager_mode(t) == "direct"
    assert dispatch.eager_mode(torch.empty(3, device="meta")) == "op"
    assert dispatch.eager_mode([1.0]) == "op"
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert dispatch.eager_mode(torch.empty(3)) == "op"
    assert torch.func.grad(lambda x: (dispatch.eager_mode(x) == "op") * x.sum())(u).eq(1).all()


def test_eager_autograd_path_matches_the_custom_op():
    """The eager autograd.Function path (gradients recorded without the custom op) gives the custom
    op's gradients, first and second order."""
    import tilecore

    a = torch.randn(20, 12, dtype=torch.float64).float().requires_grad_()
    b = torch.randn(12, 9).requires_grad_()
    bias = torch.randn(9).requires_grad_()
    c = tilecore.gemm(a, b, bias=bias)
    assert c.grad_fn is not None and "GemmFunction" in type(c.grad_fn).__name__
    g = torch.randn_like(c)
    ga, gb, gbias = torch.autograd.grad(c, (a, b, bias), g, create_graph=True)
    ra, rb, rbias = torch.autograd.grad(a @ b + bias, (a, b, bias), g, create_graph=True)
    for x, y in ((ga, ra), (gb, rb), (gbias, rbias)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    # second order: d/db of sum(dA) through the backward's own gemm
    torch.testing.assert_close(torch.autograd.grad(ga.sum(), b)[0], torch.autograd.grad(ra.sum(), b)[0])


def test_direct_launch_calls_the_launcher_as_the_runner_does(monkeypatch):
    """direct_launch hands Triton 3.6's launcher what the runner would (grid, stream, function,
    cooperative, pdl, no scratch, packed metadata, no launch metadata or hooks, then the arguments),
    and declines launchers it does not know or that need scratch memory."""
    import types

    import sys

    import triton.runtime.driver  # noqa: F401 (the module, which triton.runtime's `driver` object shadows)
    from tilecore.tiles.launch import direct_launch

    import triton.backends.nvidia.driver as nvidia_driver

    if getattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", None) != 13:  # triton 3.7 on: another launch convention
        assert direct_launch(types.SimpleNamespace(run=nvidia_driver.CudaLauncher.__new__(nvidia_driver.CudaLauncher),
                                                   function=1, packed_metadata=1)) is None
        pytest.skip("this triton's launcher is not 3.6's: direct_launch declines it (the runner launches)")
    monkeypatch.setattr(sys.modules["triton.runtime.driver"], "driver", types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_stream=lambda device: 1000 + device, get_current_device=lambda: 3)))
    calls = []
    # (a launcher of triton's nvidia driver module, whose _BASE_ARGS_FORMAT_LEN names 3.6's convention)
    CudaLauncher = type("CudaLauncher", (), dict(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                                                 launch_pdl=True, __module__=nvidia_driver.__name__))
    run = CudaLauncher()
    run.launch = lambda *a: calls.append(a)
    compiled = types.SimpleNamespace(run=run, function=77, packed_metadata="packed")
    go = direct_launch(compiled)
    go((4, 1, 1), ["x", 5])
    assert calls == [(4, 1, 1, 1003, 77, False, True, None, None, "packed", None, None, None, "x", 5)]
    run.global_scratch_size = 64
    assert direct_launch(compiled) is None
    assert direct_launch(types.SimpleNamespace(run=lambda *a: None, function=1, packed_metadata=1)) is None


def test_direct_launch_declines_a_launcher_of_another_convention(monkeypatch):
    """Triton 3.7 on calls its C launcher with the hooks first and the kernel's arguments as one tuple after their
    annotations (its driver module has no _BASE_ARGS_FORMAT_LEN): direct_launch's 3.6 call would hand it the wrong
    values, so it declines (the runner launches), found under the compat matrix's 3.7-3.9 (session 34)."""
    import types

    import triton.backends.nvidia.driver as nvidia_driver
    from tilecore.tiles.launch import direct_launch

    monkeypatch.setattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", 16, raising=False)
    CudaLauncher = type("CudaLauncher", (), dict(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                                                 launch_pdl=False, launch=lambda *a: None, __module__=nvidia_driver.__name__))
    assert direct_launch(types.SimpleNamespace(run=CudaLauncher(), function=1, packed_metadata=1)) is None
    monkeypatch.delattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN")
    assert direct_launch(types.SimpleNamespace(run=CudaLauncher(), function=1, packed_metadata=1)) is None

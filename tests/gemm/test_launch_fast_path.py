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

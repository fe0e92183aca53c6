"""The Hopper launch fast path without a GPU: a cached compiled kernel is called with a 3-D grid and
every argument of gemm_kernel, in the kernel's order, with descriptors the launcher can read."""
import pytest
import torch

from tilecore.ops.gemm import launch
from tilecore.ops.gemm.gluon_kernels import gemm_kernel


@pytest.mark.parametrize("b_t", [False, True])
def test_fast_path_passes_every_argument_in_order(fast_launch, b_t):
    M, N, K = 300, 264, 72
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(N, K, dtype=torch.bfloat16) if b_t else torch.randn(K, N, dtype=torch.bfloat16)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    bias = torch.randn(N, dtype=torch.bfloat16)
    fake = fast_launch(launch._GLUON_GEMM)
    launch.launch_gluon(a, b, c, bias, plan=(a, b, b_t), **launch.GLUON_BF16)
    (grid, args), = fake.calls
    assert grid[1:] == (1, 1) and grid[0] >= 1
    names = gemm_kernel.arg_names
    assert len(args) == len(names)
    bound = dict(zip(names, args))
    for name, t, shape in (("a_desc", a, [M, K]), ("b_desc", b, list(b.shape)), ("c_desc", c, [M, N])):
        d = bound[name]
        assert d.base is t and list(d.shape) == shape and list(d.strides) == [t.stride(0), 1] and d.padding == "zero"
    assert (bound["M"], bound["N"], bound["K"]) == (M, N, K)
    assert bound["bias_ptr"] is bias
    assert bound["B_T"] is b_t and bound["HAS_BIAS"] is True and bound["SCALES"] == 0
    assert bound["GROUP_M"] == launch.GLUON_BF16["group_m"] and bound["STAGES"] == launch.GLUON_BF16["stages"]

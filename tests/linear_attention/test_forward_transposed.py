"""kernels_forward.la_fwd_transposed_kernel (the state held as S^T) in Triton's interpreter: o, the final
state and o before D and z written into NaN-filled buffers, against the float64 recurrence, for no decay,
a scalar decay with initial and final states, partial chunks, and Mamba-2's beta, D, z and grouped q/k."""
import pytest
import torch
from la_testing import F16, F32, make, reference

from tilecore import accuracy
from tilecore.ops.linear_attention import launch, mamba2_reference
from tilecore.ops.linear_attention.kernels_forward import la_fwd_transposed_kernel
from tilecore.ops.linear_attention.plan import IDENTITY, plan, tl_plan


def transposed_forward(q, k, v, g, s0, *, scale, chunk=None, beta=None, d_skip=None, z=None, **over):
    """(o, final state, o before D and z) of the transposed kernel into NaN-filled buffers (asserts every
    element was written)."""
    p = tl_plan(q, v, g, IDENTITY, chunk, **over) if over else plan(q, v, g, IDENTITY, chunk)
    B, N, H, Dv = v.shape
    o = torch.full(v.shape, float("nan"), dtype=v.dtype)
    o_lin = torch.full(v.shape, float("nan"), dtype=F32)
    ht = torch.full((B, H, q.shape[-1], Dv), float("nan"), dtype=F32)
    _, grid, args, kw = launch.forward_call(p, q, k, v, g, beta, d_skip, z, s0, o, ht, o_lin, scale, IDENTITY)
    la_fwd_transposed_kernel[grid](*args, **kw)
    for name, t in (("o", o), ("final state", ht), ("o before D and z", o_lin)):
        assert not torch.isnan(t).any(), f"{name}: some elements were never written"
    return o, ht, o_lin


@pytest.mark.parametrize("decay,N,dtype,over", [
    (None, 50, F16, {}),                          # a partial last chunk
    ("scalar", 70, F16, {}),
    ("scalar", 1, F32, {}),
    ("scalar", 40, F32, dict(BV=16)),             # two value blocks
])
def test_transposed_matches_the_recurrence(decay, N, dtype, over):
    torch.manual_seed(0)
    q, k, v, g, s0 = make(1, N, 2, 2, 32, 32, dtype=dtype, decay=decay, h0=True)
    scale = 32 ** -0.5
    o, ht, o_lin = transposed_forward(q, k, v, g, s0, scale=scale, **over)
    ref, ref_state = reference(q, k, v, g, s0, scale=scale)
    floor = 2.5 if dtype == F16 else 1e4  # fp16 dots: 1.4-2.0x the floor (notes); float32 against fp32's floor
    assert accuracy.error_over_floor(o, ref) < floor
    assert accuracy.rel_rms(o_lin, ref) < (2e-3 if dtype == F16 else 1e-5)  # float32, from fp16 dots
    assert accuracy.rel_rms(ht, ref_state) < (2e-3 if dtype == F16 else 1e-5)


def test_transposed_mamba2_terms():
    """beta (dt), D, z and one q/k head for two v heads, against mamba2_reference."""
    torch.manual_seed(1)
    b, n, h, p, s = 1, 45, 2, 32, 32
    x = torch.randn(b, n, h, p, dtype=F16)
    dt = torch.nn.functional.softplus(torch.randn(b, n, h) - 1)
    A = -torch.rand(h) * 4 - 0.5
    Bm = (torch.randn(b, n, 1, s) * s ** -0.5).to(F16)
    Cm = (torch.randn(b, n, 1, s) * s ** -0.5).to(F16)
    D = torch.randn(h)
    z = torch.randn(b, n, h, p, dtype=F16)
    o, _, _ = transposed_forward(Cm, Bm, x, dt * A, None, scale=1.0, beta=dt, d_skip=D[:, None].expand(h, p), z=z)
    ref, _ = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                              z=z.double())
    assert accuracy.error_over_floor(o, ref) < 3.0

"""hadamard_transform's m x 2^k path (m > 64) on the wide_rows kernel (kron._wide_rows_plan; configs.KRON_WIDE_ROWS,
empty until a GPU run; plan tuning ``wide_rows``): quantize_wide_rows.wide_rows_quantize_kernel storing the rotated
values. Through the interpreter, float16 (the interpreter's bf16 products are not the GPU's), m = 108, 156: within 1.25x
the rounding floor of the float64 transform, every element written (NaN-poisoned output), an odd row count (two
rows a tile: the last tile half past the end), H_m^T for the transpose, in place; the plan only where asked."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.hadamard import configs, hadamard_reference, kron, orders


# m = 156: H_156 is not symmetric (the transpose is another matrix)
@pytest.mark.parametrize("m, p, mode, transpose, in_place", [(108, 64, "pair", False, False), (156, 128, True, True, True)])
def test_wide_rows_transform_at_the_rounding_floor(m, p, mode, transpose, in_place):
    torch.manual_seed(8)
    n = m * p
    x = torch.randn(3 if p == 64 else 2, n, dtype=torch.float16)
    plan = kron.kron_plan(x, m, p, wide_rows=mode)
    assert plan.path == "wide_rows" and plan.config["R"] == (2 if p == 64 else 1)
    assert plan.config["SPLIT"] == (mode is True)
    x0 = x.clone()
    out = x if in_place else torch.full_like(x, float("nan"))
    kron.launch(plan, x, out, n**-0.5, transpose and not orders.is_symmetric(m))
    assert bool(torch.isfinite(out).all())
    if transpose:  # (H_m^T (x) H_p) x: H_m^T over the sub-rows, then H_p along each, in float64
        hm = orders.hadamard_of_order(m).to(torch.float64).T
        ref = _hp_only(hm @ x0.to(torch.float64).reshape(-1, m, p), p, n)
    else:
        ref = hadamard_reference(x0, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(out, ref) <= 1.25


def _hp_only(y, p, n):
    """(rows, m, p) float64 -> each sub-row times H_p (Sylvester), scaled by n^-1/2, as rows of n."""
    hp = torch.ones(1, 1, dtype=torch.float64)
    while hp.shape[0] < p:
        hp = torch.cat([torch.cat([hp, hp], 1), torch.cat([hp, -hp], 1)], 0)
    return (y @ hp * n**-0.5).reshape(y.shape[0], n)


def test_wide_rows_transform_plan_only_where_asked():
    def plan(m, p, dtype=torch.bfloat16, **tuning):
        return kron.kernel_plan(24385, m, p, dtype, 132, **tuning)

    for m, p in ((172, 64), (148, 128)):  # the shipped plan unless configs.KRON_WIDE_ROWS names the shape
        assert plan(m, p).path == ("wide_rows" if (m, p) in configs.KRON_WIDE_ROWS else "fused")
    p = plan(172, 64, wide_rows="pair")
    assert (p.path, p.config["R"], p.config["NB"], p.config["NK"], p.grid) == ("wide_rows", 2, 3, 3, (528,))
    assert plan(148, 128, wide_rows=True).config["S"] == 2
    assert plan(172, 64, torch.float32, wide_rows=True).path == "fused"  # 16-bit only
    assert plan(28, 512, wide_rows=True).path == "fused"  # m <= 64
    assert plan(172, 512, wide_rows=True).path != "wide_rows"  # more than 2 slices

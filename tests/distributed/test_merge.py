"""The ring's lse merge: the tl kernel (in Triton's interpreter) and torch's ops against float64,
on row slices of strided tensors, with rows that have no key on one side or both, and a NaN row."""
import math

import pytest
import torch

from tilecore.distributed.ring import merge_into

# the interpreter runs the kernel's exp and log of -inf rows in numpy, which warns about them
pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


def merged64(acc, acc_lse, part, part_lse):
    lse = torch.logaddexp(acc_lse.double(), part_lse.double())
    base = torch.where(torch.isneginf(lse), 0.0, lse)
    w_a, w_p = torch.exp(acc_lse.double() - base), torch.exp(part_lse.double() - base)
    return acc.double() * w_a[..., None] + part.double() * w_p[..., None], lse


@pytest.mark.parametrize("interpret", ["1", "0"])
@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.float16])
def test_merge_matches_float64(monkeypatch, interpret, acc_dtype):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)  # "0": torch's ops on the CPU
    B, H, n, D = 2, 3, 37, 24
    acc_full = torch.randn(B, H, n, D).to(acc_dtype)
    lse_full = torch.randn(B, H, n) * 3
    part = torch.randn(B, H, 20, D, dtype=torch.float16)
    part_lse = torch.randn(B, H, 20) * 3
    rows = slice(n - 20, n)  # the late rows, as a causal step merges them
    acc_lse = lse_full[:, :, rows]
    acc_lse[0, 0, 0] = part_lse[0, 0, 0] = -math.inf  # no key on either side
    acc_lse[0, 1, 1] = -math.inf  # no key so far
    part_lse[1, 2, 3] = -math.inf  # none in this block
    part_lse[1, 0, 5] = math.nan
    acc_before, lse_before = acc_full.clone(), lse_full.clone()
    want, want_lse = merged64(acc_full[:, :, rows], acc_lse, part, part_lse)
    acc_full[0, 0, rows.start] = 0.0  # a row with no key holds 0
    want[0, 0, 0] = 0.0

    merge_into(acc_full[:, :, rows], lse_full[:, :, rows], part, part_lse)

    got, got_lse = acc_full[:, :, rows].double(), lse_full[:, :, rows].double()
    assert torch.equal(acc_full[:, :, :n - 20], acc_before[:, :, :n - 20])  # other rows untouched
    assert torch.equal(lse_full[:, :, :n - 20], lse_before[:, :, :n - 20])
    assert torch.equal(torch.isnan(got_lse), torch.isnan(want_lse)) and torch.isnan(got[1, 0, 5]).all()
    assert torch.isneginf(got_lse[0, 0, 0]) and (got[0, 0, 0] == 0).all()
    ok = ~torch.isnan(want_lse)
    assert torch.allclose(got_lse[ok], want_lse[ok], atol=1e-5, rtol=1e-6)
    tol = 2e-3 if acc_dtype == torch.float16 else 1e-5
    assert torch.allclose(got[ok], want[ok], atol=tol, rtol=tol)

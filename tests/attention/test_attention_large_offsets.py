"""Offsets past 2^31 elements in the tl kernels (the split-key decode kernels, and the tl forward and
backward that serve what the Gluon kernels do not). q, k, v and dO are views into one storage whose
rows (or columns) lie far apart, so that the last ones start past 2^31 elements; the storage is
allocated but never filled (the OS maps only the pages the views touch), so a test costs a few MB.

- Rows 2^23 - 64 elements apart (300 rows) or 2^30 + 256 apart (3 rows): the kernels address rows
  in 64 bits (tiles.ops.block_ptrs). Before, the address wrapped: the interpreter crashed reading
  it, and on the H100 a decode step against a 2M-key cache faulted (notes/attention/README.md, session 22).
- Columns 2^25 + 2^20 elements apart: a block's columns span 2^31; such views are copied first
  (tiles.launch.tl_addressable).
"""
import pytest
import torch
from attention_testing import check_lse, reference_grads

from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference, configs, launch

D = 64


def far_apart(rows, row_stride, col_stride=1):
    """Views (1, 1, rows, D) of q, k, v and dO into one storage, rows ``row_stride`` and columns
    ``col_stride`` elements apart (the four views side by side)."""
    extent = (rows - 1) * row_stride + (D - 1) * col_stride + 1
    side = D if col_stride == 1 else rows  # where the next view starts
    base = torch.empty(extent + 3 * side, dtype=torch.float16)  # 4-5 GiB, never touched
    views = []
    for i in range(4):
        t = base.as_strided((1, 1, rows, D), (0, 0, row_stride, col_stride), storage_offset=i * side)
        t.copy_(torch.randn(1, 1, rows, D, dtype=torch.float16))
        views.append(t)
    assert extent > 2**31
    return views


LAYOUTS = {"rows 2^23 apart": (300, (1 << 23) - 64), "rows 2^30 apart": (3, (1 << 30) + 256),
           "columns 2^25 apart": (3, 1, (1 << 25) + (1 << 20))}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_reads_rows_past_2_31(layout, causal):
    q, k, v, _ = far_apart(*LAYOUTS[layout])
    ref, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=causal)
    out, lse = attention(q, k, v, causal=causal, return_lse=True)  # few query tiles: the split-key path
    assert accuracy.error_over_floor(out, ref) < 2.0
    check_lse(lse, ref_lse)
    out_tl, lse_tl = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    launch.forward_into(q, k, v, out_tl, lse_tl, causal, D ** -0.5, path="tl", config=configs.forward_config(D, True))
    assert accuracy.error_over_floor(out_tl, ref) < 2.0
    check_lse(lse_tl, ref_lse)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_reads_rows_past_2_31(layout):
    q, k, v, dout = far_apart(*LAYOUTS[layout])
    n, scale = q.shape[2], D ** -0.5
    out, lse = torch.empty(1, 1, n, D, dtype=torch.float16), torch.empty(1, 1, n)
    # not causal: with 3 rows, causal row 0's dq is exactly 0 and the floor metric reads its rounding
    launch.forward_into(q, k, v, out, lse, False, scale, path="tl", config=configs.forward_config(D, True))
    dq, dk, dv = (torch.full((1, 1, n, D), float("nan"), dtype=torch.float16) for _ in range(3))
    launch.backward_into(dout, q, k, v, out, lse, None, dq, dk, dv, False, scale, path="tl",
                         config=configs.backward_config(D, True))
    for got, ref in zip((dq, dk, dv), reference_grads(q, k, v, dout, None, False, scale)):
        assert accuracy.error_over_floor(got, ref) < 3.0

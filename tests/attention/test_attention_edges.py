"""Edges of tilecore.attention's front: every shape error says the layout (and a flash-attn
(B, N, H, D) tensor is called out where its heads look like a sequence), the scale's accepted types,
float32 where compiled kernels would run."""
import warnings

import numpy as np
import pytest
import torch

from tilecore.ops.attention import attention, op

F16 = torch.float16


@pytest.mark.parametrize("shapes", [
    ((2, 8, 64), (2, 8, 64), (2, 8, 64)),           # 3-D
    ((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64)),  # k, v differ
    ((1, 2, 8, 64), (1, 2, 8, 32), (1, 2, 8, 32)),  # head_dim
    ((2, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)),  # batch
    ((1, 2, 8, 640),) * 3,                          # head_dim too large (past 576)
    ((1, 100, 8, 64), (1, 90, 8, 64), (1, 90, 8, 64)),  # flash-attn's layout, N = 100 and 90: "heads"
])
def test_every_shape_error_says_the_layout(shapes):
    q, k, v = (torch.zeros(s, dtype=F16) for s in shapes)
    with pytest.raises(ValueError, match=r"\(batch, heads, queries, head_dim\).*transpose\(1, 2\)"):
        attention(q, k, v)


def test_flash_attn_layout_is_called_out_where_heads_look_like_a_sequence():
    q = torch.randn(1, 300, 4, 16, dtype=F16)  # (B, N, H, D) as flash-attn takes it
    with pytest.warns(UserWarning, match=r"300 heads of 4 queries.*\(batch, seqlen, heads, head_dim\)"):
        attention(q, q, q)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="attention")
        attention(torch.randn(1, 8, 20, 16, dtype=F16), *[torch.randn(1, 8, 20, 16, dtype=F16)] * 2)


@pytest.mark.parametrize("scale", [np.float32(0.25), np.float64(0.25), torch.tensor(0.25), torch.tensor([0.25]),
                                   torch.tensor(0.25, dtype=torch.float64), 1, np.int64(1)])
def test_scale_takes_any_real_number(scale):
    q = torch.randn(1, 2, 5, 16, dtype=F16)
    assert torch.equal(attention(q, q, q, scale=scale), attention(q, q, q, scale=float(scale)))


@pytest.mark.parametrize("scale, error", [(True, TypeError), ("0.5", TypeError), (torch.tensor([0.5, 0.5]), TypeError),
                                          (1j, TypeError), (np.float32("nan"), ValueError),
                                          (torch.tensor(float("inf")), ValueError)])
def test_scale_refuses_what_is_not_one_finite_real(scale, error):
    q = torch.randn(1, 2, 5, 16, dtype=F16)
    with pytest.raises(error, match="finite real number"):
        attention(q, q, q, scale=scale)


def test_float32_is_a_cpu_dtype(monkeypatch):
    q = torch.randn(1, 2, 5, 16)
    assert attention(q, q, q).dtype == torch.float32
    monkeypatch.setattr(op, "_compiled", lambda device: True)  # as if compiled GPU kernels served them
    with pytest.raises(TypeError, match="float16, bfloat16 on the GPU"):
        attention(q, q, q)

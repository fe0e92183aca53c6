"""A query row that sees no key (causal or a window with N > Nk: its leading rows) has O = 0 whatever its query,
so its dQ is 0 even when that query holds a NaN: a masked key's dS is 0, capped or not (the reference module's rule:
a row's NaN reaches only the keys it attends). Checked on the paths the interpreter runs (the tl kernels, the CPU
path) against the float64 backward by the FlashAttention-2 formulas (attention_backward_reference, whose cap's
derivative is taken of the masked scores). A row with a NaN that sees keys stays NaN; the other rows stay near the
reference. autograd through attention_reference agrees (its scores are capped after the mask: tanh' of a masked NaN
score would give that row 0 x NaN = NaN). The Gluon dq kernel (SOFTCAP 3: y - y tanh^2, zeroed where masked,
as the dK/dV kernel) is checked the same way on the GPU by experiments/attention/gpu_issue35_bwd.py's ``empty``
phase."""
import os

import pytest
import torch

from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference, launch
from tilecore.ops.attention.reference import attention_backward_reference

from attention_testing import make

EMPTY_ROW, SEEING_ROW = 3, 25  # N 40 over Nk 30, aligned to the bottom right: rows 0-9 see no key


def nan_inputs():
    q, k, v = make(1, 2, 1, 40, 30, 32)
    q[0, 0, EMPTY_ROW, 5] = float("nan")
    q[0, 1, SEEING_ROW, 2] = float("nan")
    return q, k, v, torch.randn(q.shape, dtype=q.dtype)


def reference_dq(q, k, v, dout, window, softcap):
    q64, k64, v64 = (t.double() for t in (q, k, v))
    o, lse = attention_reference(q64, k64, v64, causal=True, scale=0.125, window_size=window, softcap=softcap)
    return attention_backward_reference(dout.double(), q64, k64, v64, o, lse, None, causal=True, scale=0.125,
                                        window_size=window, softcap=softcap, compute_dtype=torch.float64)[0]


def path_dq(path, q, k, v, dout, window, softcap, monkeypatch):
    if path == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        o = attention(qg, kg, vg, causal=True, scale=0.125, window_size=window, softcap=softcap)
        return torch.autograd.grad(o, (qg, kg, vg), dout)[0]
    assert os.environ.get("TRITON_INTERPRET") == "1"
    out, lse = torch.full(q.shape, 7.0, dtype=q.dtype), torch.full(q.shape[:3], 7.0)
    launch.forward_into(q, k, v, out, lse, True, 0.125, window, softcap, path=path)
    grads = [torch.full(t.shape, 7.0, dtype=t.dtype) for t in (q, k, v)]
    launch.backward_into(dout, q, k, v, out, lse, None, *grads, True, 0.125, window, softcap, path=path)
    return grads[0]


@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
def test_the_reference_gives_a_nan_row_with_no_key_zero_dq(window, softcap):
    q, k, v, dout = nan_inputs()
    ref = reference_dq(q, k, v, dout, window, softcap)
    assert (ref[0, 0, EMPTY_ROW] == 0).all()
    assert torch.isnan(ref[0, 1, SEEING_ROW]).all()
    nan_rows = torch.isnan(ref).any(-1)
    assert nan_rows.sum() == 1  # the row that sees keys, nothing else


@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
def test_autograd_through_the_reference_agrees(window, softcap):
    q, k, v, dout = nan_inputs()
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o, _ = attention_reference(q64, k64, v64, causal=True, scale=0.125, window_size=window, softcap=softcap)
    dq = torch.autograd.grad(o, (q64, k64, v64), dout.double())[0]
    ref = reference_dq(q, k, v, dout, window, softcap)
    assert (dq[0, 0, EMPTY_ROW] == 0).all()
    assert torch.equal(torch.isnan(dq), torch.isnan(ref))
    finite = torch.isfinite(ref)
    assert torch.allclose(dq[finite], ref[finite], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
@pytest.mark.parametrize("path", ["tl", "cpu"])
def test_paths_give_a_nan_row_with_no_key_zero_dq(path, window, softcap, monkeypatch):
    q, k, v, dout = nan_inputs()
    ref = reference_dq(q, k, v, dout, window, softcap)
    dq = path_dq(path, q, k, v, dout, window, softcap, monkeypatch)
    assert (dq[0, 0, EMPTY_ROW] == 0).all()
    nan_rows = torch.isnan(ref).any(-1)
    assert torch.equal(torch.isnan(dq).any(-1), nan_rows) and torch.isnan(dq[nan_rows]).all()
    assert accuracy.error_over_floor(dq[~nan_rows], ref[~nan_rows]) <= 3.0

"""linear_attention's edges: log decays near 0 and near -inf (-1e30, -inf: resets) with no NaN or
overflow in the cumulative decay, NaN propagation as the recurrence's, empty inputs, and bad input named
with what is accepted."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import linear_attention, mamba2_chunk_scan

from la_testing import F16, F32, check_extreme_decays, make, reference


@pytest.mark.parametrize("kind", ["scalar", "channel"])
def test_decays_near_zero_and_near_minus_infinity(kind):
    B, N, H, D = 1, 40, 2, 16
    q, k, v, g, s0 = make(B, N, H, H, D, D, dtype=F32, decay=kind, h0=True)
    g = -torch.rand(g.shape) * 1e-6  # near 0
    g[:, 5] = -1e30
    g[:, 21] = float("-inf")  # resets the state
    g[:, 22] = -200.0
    g[:, 30:] = -60.0
    check_extreme_decays(q, k, v, g, s0, 16)


def test_strong_decays_fp16():
    q, k, v, g, _ = make(1, 100, 1, 2, 32, 16, decay="scalar", strong=True)
    ref, _ = reference(q, k, v, g, None)
    assert accuracy.error_over_floor(linear_attention(q, k, v, decay=g, chunk_size=32), ref) <= 2.0


def test_nan_reaches_the_rows_the_recurrence_reaches():
    q, k, v, g, _ = make(1, 40, 1, 1, 16, 16, dtype=F32, decay="scalar")
    q[0, 3, 0, 0] = float("nan")   # row 3 only
    k[0, 35, 0, 2] = float("nan")  # rows 35 on
    v[0, 20, 0, 5] = float("nan")  # column 5 from token 20 on
    o = linear_attention(q, k, v, decay=g, chunk_size=16)
    ref, _ = reference(q, k, v, g, None)
    # exact but for v's NaN, which the intra-chunk product P V also multiplies by the zeros above the
    # diagonal: it reaches column 5 of its chunk's earlier rows (16-19) too
    reached = torch.isnan(ref)
    reached[0, 16:20, 0, 5] = True
    assert torch.equal(torch.isnan(o), reached)
    live = ~reached
    assert accuracy.rel_rms(o[live], ref[live]) < 1e-5


def test_empty_sequences_and_batches():
    q, k, v, _, s0 = make(2, 0, 1, 2, 16, 16, dtype=F32, h0=True)
    o, ht = linear_attention(q, k, v, initial_state=s0, return_final_state=True)
    assert o.shape == (2, 0, 2, 16) and torch.equal(ht, s0)
    q, k, v, _, _ = make(0, 5, 1, 2, 16, 16)
    assert linear_attention(q, k, v).shape == (0, 5, 2, 16)


def _t(*shape, dtype=F16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args,kwargs,error,words", [
    ((_t(2, 8, 64), _t(2, 8, 64), _t(2, 8, 64)), {}, ValueError, "4-D"),
    ((_t(1, 8, 2, 16, dtype=torch.float64),) * 3, {}, TypeError, "float16, bfloat16, float32"),
    ((_t(1, 8, 2, 16), _t(1, 8, 2, 16, dtype=F32), _t(1, 8, 2, 16)), {}, TypeError, "one dtype"),
    ((_t(1, 8, 2, 16), _t(1, 8, 2, 8), _t(1, 8, 2, 16)), {}, ValueError, "q and k must have one shape"),
    ((_t(1, 8, 2, 16), _t(1, 8, 2, 16), _t(1, 8, 3, 16)), {}, ValueError, "multiple"),
    ((_t(1, 8, 2, 16), _t(1, 8, 2, 16), _t(1, 9, 2, 16)), {}, ValueError, "batch and tokens"),
    ((_t(1, 8, 2, 300),) * 3, {}, ValueError, "from 1 to 256"),
    ((_t(1, 8, 2, 32),) * 3, {"feature_map": "based"}, ValueError, "up to 16"),
    ((_t(1, 8, 2, 16),) * 3, {"feature_map": "cosine"}, ValueError, "None, 'based' or 'hedgehog'"),
    ((_t(1, 8, 2, 16),) * 3, {"feature_map": "hedgehog"}, TypeError, "feature_weights"),
    ((_t(1, 8, 2, 16),) * 3, {"feature_map": "hedgehog", "feature_weights": _t(2, 8, 4)}, ValueError,
     r"\(2, 16, features\)"),
    ((_t(1, 8, 2, 16),) * 3, {"decay": _t(1, 8, 3, dtype=F32)}, ValueError, r"\(1, 8, 2\)"),
    ((_t(1, 8, 2, 4),) * 3, {"decay": _t(1, 8, 2, 21, dtype=F32), "feature_map": "based"}, ValueError, "scalar"),
    ((_t(1, 8, 2, 16),) * 3, {"decay": torch.zeros(1, 8, 2, dtype=torch.int32)}, TypeError, "floating-point"),
    ((_t(1, 8, 2, 16),) * 3, {"initial_state": _t(1, 2, 15, 16, dtype=F32)}, ValueError, r"\(1, 2, 16, 16\)"),
    ((_t(1, 8, 2, 16),) * 3, {"scale": float("nan")}, TypeError, "finite"),
    ((_t(1, 8, 2, 16),) * 3, {"chunk_size": 48}, ValueError, "16, 32, 64"),
    (([1.0], _t(1), _t(1)), {}, TypeError, "torch.Tensor"),
])
def test_bad_input_names_what_is_accepted(args, kwargs, error, words):
    with pytest.raises(error, match=words):
        linear_attention(*args, **kwargs)


@pytest.mark.parametrize("change,error,words", [
    (dict(x=_t(1, 8, 4)), ValueError, "x must be"),
    (dict(B=_t(1, 8, 3, 16), C=_t(1, 8, 3, 16)), ValueError, "multiple of ngroups"),
    (dict(C=_t(1, 8, 1, 8)), ValueError, "C must have B's shape"),
    (dict(A=torch.zeros(3)), ValueError, r"A must have shape \(4,\)"),
    (dict(D=torch.zeros(4, 3)), ValueError, r"\(4,\) or \(4, 16\)"),
    (dict(chunk_size=0), ValueError, "positive int"),
    (dict(B=_t(1, 8, 1, 16, dtype=F32), C=_t(1, 8, 1, 16, dtype=F32)), TypeError, "x's dtype"),
])
def test_mamba2_bad_input(change, error, words):
    args = dict(x=_t(1, 8, 4, 16), dt=torch.zeros(1, 8, 4), A=torch.zeros(4), B=_t(1, 8, 1, 16), C=_t(1, 8, 1, 16))
    kwargs = {}
    for key, value in change.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(error, match=words):
        mamba2_chunk_scan(**args, **kwargs)

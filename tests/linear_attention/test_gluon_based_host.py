"""Based's Gluon forward (gluon_based.py), its host side on the CPU: the symmetric features (selections and
column constants) give Based's 1 + s + s^2 / 2, the kernel's chunked math on them (``emulate``, float64)
is the float64 recurrence's, and the state maps (``compress``, ``expand``) carry an initial state, even an
asymmetric one, into the kernel's rows and the final state back exactly. The kernel itself cannot run in
the interpreter: test_gluon_based_compile.py compiles it, experiments/linear_attention/gpu_forward.py
checks it on the GPU."""
import pytest
import torch

from tilecore.ops.linear_attention import gluon_based as gb
from tilecore.ops.linear_attention import linear_attention_reference


def test_features_are_the_taylor_kernel():
    torch.manual_seed(0)
    q, k = torch.randn(50, gb.DK, dtype=torch.float64), torch.randn(50, gb.DK, dtype=torch.float64)
    sel = gb.selection(torch.float64, "cpu")
    assert sel.shape == (2, gb.FEATURES, gb.DK) and set(sel.unique().tolist()) == {0.0, 1.0}
    for scale in (0.25, 0.3):
        ca, cb, w = (t.double() for t in gb.feature_constants(scale))
        phi_q = (q @ sel[0].T + ca) * (q @ sel[1].T + cb) * w
        phi_k = (k @ sel[0].T + ca) * (k @ sel[1].T + cb)
        s = scale * q @ k.T
        torch.testing.assert_close(phi_q @ phi_k.T, 1 + s + s * s / 2, rtol=1e-6, atol=1e-6)  # w in float32
        assert (phi_k[:, 153:] == 0).all()  # padding


def test_kernel_selection_holds_each_piece_a_then_b():
    sel = gb.selection(torch.float32, "cpu")
    pieces = gb.kernel_selection(torch.float32, "cpu")
    assert pieces.shape == (2 * gb.FEATURES, gb.DK)
    for p in range(gb.FEATURES // gb.PIECE):
        torch.testing.assert_close(pieces[64 * p:64 * p + 32], sel[0, 32 * p:32 * p + 32], rtol=0, atol=0)
        torch.testing.assert_close(pieces[64 * p + 32:64 * p + 64], sel[1, 32 * p:32 * p + 32], rtol=0, atol=0)


def test_feature_order_is_the_kernels_pieces():
    pairs = gb.feature_pairs()
    assert len(pairs) == gb.FEATURES
    assert pairs[:16] == [(a, a) for a in range(16)] and pairs[16:32] == [(a, 16) for a in range(16)]
    assert pairs[128 + 24] == (16, 16) and pairs[153:] == [(-1, -1)] * 7  # the tail's constant column


@pytest.mark.parametrize("with_h0", [False, True])
def test_emulated_kernel_matches_the_recurrence(with_h0):
    torch.manual_seed(1)
    B, N, H, Dv = 2, 77, 3, 8  # a partial last chunk
    f64 = torch.float64
    q, k = torch.randn(B, N, H, 16, dtype=f64), torch.randn(B, N, H, 16, dtype=f64)
    v = torch.randn(B, N, H, Dv, dtype=f64)
    h0 = torch.randn(B, H, 1 + 16 + 256, Dv, dtype=f64) if with_h0 else None  # not symmetric
    ref, ref_state = linear_attention_reference(q, k, v, feature_map="based", scale=0.25, initial_state=h0)
    x0 = gb.compress(h0) if with_h0 else None
    o, x = gb.emulate(q, k, v, x0, 0.25, chunk=32)
    ht = gb.expand(x) + (h0 - gb.expand(x0) if with_h0 else 0.0)
    assert torch.isfinite(o).all() and x.shape == (B, H, gb.FEATURES, Dv)
    torch.testing.assert_close(o, ref, rtol=1e-6, atol=1e-6)  # compress in float32
    torch.testing.assert_close(ht, ref_state, rtol=1e-6, atol=1e-5)


def test_state_maps_round_trip_a_symmetric_state():
    torch.manual_seed(2)
    x = torch.randn(1, 2, gb.FEATURES, 4)
    x[:, :, 153:] = 0  # padding rows carry nothing
    torch.testing.assert_close(gb.compress(gb.expand(x)), x, rtol=1e-6, atol=1e-6)


def test_fits_says_what_it_does_not_take():
    bf = torch.bfloat16
    q = torch.empty(1, 8, 2, 16, dtype=bf)
    v = torch.empty(1, 8, 2, 64, dtype=bf)
    assert "CUDA" in gb.fits(q, q, v, None)
    assert "decay" in gb.fits(q, q, v, torch.empty(1, 8, 2))
    assert "Dk" in gb.fits(torch.empty(1, 8, 2, 8, dtype=bf), torch.empty(1, 8, 2, 8, dtype=bf), v, None)
    assert "bf16" in gb.fits(q.float(), q.float(), v.float(), None)
    assert "odd" in gb.fits(torch.empty(1, 8, 1, 16, dtype=bf), torch.empty(1, 8, 1, 16, dtype=bf),
                            torch.empty(1, 8, 1, 64, dtype=bf), None)

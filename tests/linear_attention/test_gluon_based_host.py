"""Based's Gluon forward (gluon_based.py), its host side on the CPU: the kernel's symmetric features (made by the CUDA
cores in blocks of 4 x 4 products) give Based's 1 + s + s^2 / 2, each pair once, in the kernel's block order; the
kernel's chunked math on them (``emulate``, float64) is the float64 recurrence's; the state maps (``compress``,
``expand``) carry an initial state, even an asymmetric one, into the kernel's rows and the final state back exactly;
the launch takes a descriptor maker and the initial state in the kernel's rows. The kernel itself cannot run in
the interpreter: test_gluon_based_compile.py compiles it, experiments/linear_attention/gpu_forward.py checks it on
the GPU."""
import pytest
import torch

from tilecore.ops.linear_attention import gluon_based as gb
from tilecore.ops.linear_attention import linear_attention_reference

BF = torch.bfloat16


def test_features_are_the_taylor_kernel_each_pair_once():
    pairs = gb.feature_pairs()
    real = [p for p in pairs if p != (-1, -1)]
    assert len(pairs) == gb.FEATURES and len(real) == len(set(real)) == 153
    assert {p for p in real if p[1] < 16} == {(a, b) for a in range(16) for b in range(a, 16)}
    torch.manual_seed(0)
    q, k = torch.randn(40, 16, dtype=torch.float64), torch.randn(40, 16, dtype=torch.float64)
    for scale in (0.25, 0.3):
        s = scale * q @ k.T
        phi = gb.features(q * scale) @ gb.features(k).T
        torch.testing.assert_close(phi, 1 + s + s * s / 2, rtol=1e-12, atol=1e-12)


def test_feature_order_is_the_kernels_blocks():
    """Feature 32 p + 2 (4 i + j) + w is block ALU_BLOCKS[2 p + w]'s (i, j), as features_alu joins them."""
    pairs = gb.feature_pairs()
    for p in range(5):
        for w in range(2):
            G, H = gb.ALU_BLOCKS[2 * p + w]
            if G != H:
                for i in range(4):
                    for j in range(4):
                        assert pairs[32 * p + 2 * (4 * i + j) + w] == (4 * G + i, 4 * H + j)
            else:
                assert pairs[32 * p + 2 * (4 * 1 + 0) + w] == (4 * G, 16)  # (1, 0): x_(4G + 0)
                assert pairs[32 * p + 2 * (4 * 3 + 0) + w] == (4 * G + 3, 16)
                assert pairs[32 * p + 2 * (4 * 2 + 2) + w] == (4 * G + 2, 4 * G + 2)


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
    torch.testing.assert_close(ht.double(), ref_state, rtol=1e-6, atol=1e-5)


def test_state_maps_round_trip_a_symmetric_state():
    torch.manual_seed(2)
    x = torch.randn(1, 2, gb.FEATURES, 4)
    x[:, :, [f for f, p in enumerate(gb.feature_pairs()) if p == (-1, -1)]] = 0  # padding rows carry nothing
    torch.testing.assert_close(gb.compress(gb.expand(x)), x, rtol=1e-6, atol=1e-6)


def test_launch_args_take_a_descriptor_maker():
    """A keyed launch's TmaOperand (as launch.gluon_based_keyed gives it) in place of the descriptors."""
    from tilecore.tiles.launch import TmaOperand

    q = torch.empty(1, 128, 2, gb.DK, dtype=BF)
    v = torch.empty(1, 128, 2, 64, dtype=BF)
    args = gb.launch_args(q, q, v, None, torch.empty_like(v), None, 0.25, 3, operand=TmaOperand)[1]
    assert all(isinstance(args[n], TmaOperand) for n in ("q_desc", "k_desc", "v_desc", "o_desc"))
    assert args["q_desc"].block_shape == [1, 1, 64, 16] and args["v_desc"].block_shape == [1, 1, 64, 64]
    assert args["STAGES"] == 3 and not args["HAS_H0"] and not args["STORE_HT"]


def test_forward_launches_the_initial_state_in_the_kernels_rows():
    """gluon_based.forward's launch (captured, not run): the initial state as compress(h0), the final state's buffer
    in the kernel's rows."""
    seen = {}
    q = torch.randn(1, 64, 2, gb.DK).to(BF)
    v = torch.randn(1, 64, 2, 64).to(BF)
    h0 = torch.randn(1, 2, 1 + 16 + 256, 64)
    gb.forward(q, q, v, h0, 0.25, True, launch=lambda grid, args, warps: seen.update(args, warps=warps))
    torch.testing.assert_close(seen["H0"], gb.compress(h0))
    assert seen["HT"].shape == (1, 2, gb.FEATURES, 64) and seen["warps"] == 4 and seen["STAGES"] == 3


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

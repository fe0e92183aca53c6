"""ring.own_sum (two ranks' own dK/dV from the shares, one pass: kernels_tl.own_sum_kernel) against
the float32 buffer it replaces, in Triton's interpreter (fp16: the interpreter's bf16 sums are
wrong) and on torch's CPU path; poisoned output, partial and missing shares."""
import torch

from tilecore import dispatch
from tilecore.distributed import ring


def buffer_sum(a, a_keys, b, b_keys, c, dtype):
    """What ring_backward did: a float32 buffer, shares added in order, cast once."""
    total = torch.zeros(c.shape, dtype=torch.float32)
    for t, keys in ((a, a_keys), (b, b_keys)):
        if t is not None and keys:
            total[:, :, :keys] += t[:, :, :keys].float()
    return total.add_(c.float()).to(dtype)


def test_own_sum_matches_the_buffer_it_replaces():
    assert dispatch.backend_for(torch.device("cpu")) == "kernel"  # the interpreter runs the tl kernel
    g = torch.Generator().manual_seed(3)
    B, H, n, D = 2, 3, 21, 40  # D not a power of two: masked columns
    c = torch.randn(B, H, n, D, generator=g).half()
    a = torch.randn(B, H, n, D, generator=g).half()
    b = torch.randn(B, H, 14, D, generator=g).half()  # a part with fewer keys (causal: the early chunk)
    for args in ((a, n, b, 9, c), (None, 0, b, 14, c), (a, n, None, 0, c), (a[:, :, :5], 5, None, 0, c)):
        got = ring.own_sum(*args, torch.float16)
        assert got.shape == c.shape and got.dtype == torch.float16 and torch.isfinite(got).all()
        assert torch.equal(got, buffer_sum(*args, torch.float16))  # same sums, same order: bit for bit
    nan_c = c.clone()
    nan_c[1, 2, 7, 3] = float("nan")
    got = ring.own_sum(a, n, b, 9, nan_c, torch.float16)
    assert torch.isnan(got[1, 2, 7, 3]) and torch.isfinite(got).sum() == got.numel() - 1
    empty = torch.empty(1, 2, 0, 8).half()
    assert ring.own_sum(empty, 0, None, 0, empty, torch.float16).shape == (1, 2, 0, 8)


def test_passing_sum_in_one_pass_is_the_copy_then_add():
    """Past two ranks (ring.ONE_PASS_SUMS_ABOVE_TWO) a passing dK/dV sum is own_sum(share, keys, None,
    0, incoming float32, float32): the copy of the incoming sum with the share added, value for value,
    in the interpreter's kernel; no share: the incoming sum's copy."""
    assert dispatch.backend_for(torch.device("cpu")) == "kernel"
    g = torch.Generator().manual_seed(5)
    B, H, n, D = 1, 2, 19, 24
    incoming = torch.randn(B, H, n, D, generator=g)
    share = torch.randn(B, H, 11, D, generator=g).half()
    for a, keys in ((share, 11), (share[:, :, :0], 0), (None, 0)):
        got = ring.own_sum(a, keys, None, 0, incoming, torch.float32)
        want = incoming.clone()
        if a is not None and keys:
            want[:, :, :keys] += a[:, :, :keys]
        assert got.dtype == torch.float32 and got.data_ptr() != incoming.data_ptr()
        assert torch.equal(got, want)

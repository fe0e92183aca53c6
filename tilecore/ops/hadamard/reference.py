"""The Hadamard transform in float64 with PyTorch operations: the reference every kernel result is
compared with. n a power of two: Sylvester's H_n by butterflies; n = m x p (m in orders.ORDERS, p a
power of two): H_m (x) H_p, H_m from orders.py, with the same Kronecker order as the kernels."""
import torch

from tilecore.ops.hadamard import orders


def _sylvester(y: torch.Tensor, n: int) -> torch.Tensor:
    """H_n along the last dimension of the float64 rows ``y`` (rows, n), n a power of two."""
    h = 1
    while h < n:
        y = y.view(-1, n // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2)
        h *= 2
    return y.reshape(-1, n)


def hadamard_reference(x: torch.Tensor, scale: float = 1.0, *, out_dtype: torch.dtype | None = None,
                       transpose: bool = False) -> torch.Tensor:
    """scale * H_n x over the last dimension, computed in float64 (H_n^T x with ``transpose``: the same
    but where H_m is not symmetric, orders.is_symmetric)."""
    n = x.shape[-1]
    parts = orders.split(n)
    if parts is None:
        raise ValueError(f"no Hadamard matrix of order {n}: {orders.supported_text()}")
    m, p = parts
    y = _sylvester(x.to(torch.float64).reshape(-1, n).clone(), p) if m == 1 else \
        _sylvester(x.to(torch.float64).reshape(-1, p), p).view(-1, m, p)
    if m > 1:
        h = orders.hadamard_of_order(m).to(y.device)  # H_m is built on the CPU; the rows may live anywhere
        y = torch.matmul(h.T if transpose else h, y)
    y = y.reshape(x.shape) * scale
    return y.to(out_dtype or x.dtype)


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The n x n matrix the transform multiplies by (entries +-1): Sylvester's for n a power of two,
    H_m (x) H_p for n = m p."""
    return hadamard_reference(torch.eye(n, dtype=torch.float64)).T.contiguous().to(dtype)

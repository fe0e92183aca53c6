"""The fast Walsh-Hadamard transform in float64 with PyTorch operations: the reference every kernel
result is compared with, and the CPU path when Triton's interpreter is off."""
import torch


def hadamard_reference(x: torch.Tensor, scale: float = 1.0, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """scale * H_n x over the last dimension (Sylvester order), computed in float64."""
    n = x.shape[-1]
    y = x.to(torch.float64).reshape(-1, n).clone()
    h = 1
    while h < n:
        y = y.view(-1, n // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2)
        h *= 2
    y = (y.reshape(x.shape) * scale)
    return y.to(out_dtype or x.dtype)


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix (entries +-1)."""
    return hadamard_reference(torch.eye(n, dtype=torch.float64)).to(dtype)

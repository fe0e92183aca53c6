"""Modules built on tilecore's ops."""
from __future__ import annotations

import torch

from tilecore.ops.hadamard import hadamard_transform


class HadamardRotation(torch.nn.Module):
    """The orthonormal rotation x -> H_n (s * x) / sqrt(n) over the last dimension.

    With ``randomized=True``, s is a fixed vector of random signs (the randomized Hadamard transform
    QuaRot and FlashAttention-3 use to spread outliers before quantization), drawn from ``seed``;
    otherwise s = 1. The rotation is orthogonal, so ``inverse`` undoes it exactly in real arithmetic.
    """

    def __init__(self, n: int, randomized: bool = False, seed: int | None = None):
        super().__init__()
        if not isinstance(n, int) or n < 1 or n & (n - 1):
            raise ValueError(f"HadamardRotation needs n to be a power of two, got {n!r}")
        self.n = n
        self.randomized = randomized
        if randomized:
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            signs = torch.randint(0, 2, (n,), generator=gen) * 2 - 1
            self.register_buffer("signs", signs.to(torch.float32))
        else:
            self.register_buffer("signs", None)

    def _check(self, x, name: str) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.n:
            got = f"a last dimension of {x.shape[-1]}" if isinstance(x, torch.Tensor) and x.dim() else \
                f"{'a 0-d tensor' if isinstance(x, torch.Tensor) else type(x).__name__}"
            raise ValueError(f"HadamardRotation({self.n}).{name} needs a last dimension of {self.n}; got {got}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x, "forward")
        if self.signs is not None:
            x = x * self.signs.to(x.dtype)
        return hadamard_transform(x, self.n**-0.5)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """x from y = self(x): H is symmetric and orthogonal after scaling, and the signs square to 1."""
        self._check(y, "inverse")
        x = hadamard_transform(y, self.n**-0.5)
        return x * self.signs.to(x.dtype) if self.signs is not None else x

    def extra_repr(self) -> str:
        return f"n={self.n}, randomized={self.randomized}"

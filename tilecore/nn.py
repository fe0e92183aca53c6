"""Modules built on tilecore's ops."""
from __future__ import annotations

import torch

from tilecore.ops.hadamard import hadamard_reference, hadamard_transform, orders
from tilecore.ops.hadamard.quantize import hadamard_quantize


class HadamardRotation(torch.nn.Module):
    """The orthonormal rotation x -> H_n (s * x) / sqrt(n) over the last dimension.

    n a power of two, or m x 2^k as hadamard_transform takes. With ``randomized=True``, s is a fixed
    vector of random signs (the randomized Hadamard transform QuaRot and FlashAttention-3 use to spread
    outliers before quantization), drawn from ``seed``; otherwise s = 1. The rotation is orthogonal, so
    ``inverse`` (H_n^T, then the signs) undoes it exactly in real arithmetic.
    """

    def __init__(self, n: int, randomized: bool = False, seed: int | None = None):
        super().__init__()
        if not isinstance(n, int) or isinstance(n, bool) or orders.split(n) is None:
            raise ValueError(f"HadamardRotation needs n = 2^k or m x 2^k ({orders.supported_text()}), got {n!r}")
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
        x = hadamard_transform(y, self.n**-0.5, transpose=True)
        return x * self.signs.to(x.dtype) if self.signs is not None else x

    def extra_repr(self) -> str:
        return f"n={self.n}, randomized={self.randomized}"


class RotatedLinear(torch.nn.Module):
    """A W8A8 FP8 linear layer with a Hadamard rotation, QuaRot-style: y = x W^T + b computed as

        y = gemm_fp8(Q(R x), Q(W R^T)^T) + b,   R = H_n diag(s) / sqrt(n)  (orthogonal: R^T R = I)

    The rotation is folded into the weight offline (W R^T in float64, then e4m3 with a float32 scale per
    output channel) and applied to the activation online, fused with its quantization
    (``hadamard_quantize``: e4m3 with a float32 scale per token, one pass), then ``tilecore.gemm_fp8``
    with per-token and per-channel scales. n = in_features: a power of two or m x 2^k
    (hadamard_transform's sizes). ``rotate=False`` gives the same layer without the rotation (for
    comparison). Inference only (no gradient). Build it with ``RotatedLinear.from_linear(linear)``.
    """

    def __init__(self, weight_codes: torch.Tensor, weight_scales: torch.Tensor, bias: torch.Tensor | None,
                 signs: torch.Tensor | None = None, rotate: bool = True):
        super().__init__()
        self.out_features, self.in_features = weight_codes.shape
        self.rotate = rotate
        self.register_buffer("weight_codes", weight_codes)  # e4m3 [out, in]: W R^T quantized per row
        self.register_buffer("weight_scales", weight_scales.reshape(1, -1).to(torch.float32))
        self.register_buffer("bias", bias)
        self.register_buffer("signs", signs)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, format: str = "fp8_e4m3", *, rotate: bool = True,
                    randomized: bool = False, seed: int | None = None) -> "RotatedLinear":
        """The rotated FP8 layer of ``linear`` (its weight and bias copied; ``linear`` is left as it is).
        ``randomized=True`` draws random signs s from ``seed`` (QuaRot's randomized Hadamard)."""
        if format != "fp8_e4m3":
            raise ValueError(f"RotatedLinear is W8A8 FP8: format must be 'fp8_e4m3', got {format!r}")
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"RotatedLinear.from_linear takes a torch.nn.Linear, got {type(linear).__name__}")
        from tilecore.ops.hadamard.quantize_reference import quantize_rotated

        w = linear.weight.detach().to(torch.float64)
        n = w.shape[1]
        signs = None
        if rotate:
            if orders.split(n) is None:
                raise ValueError(f"RotatedLinear: no Hadamard matrix of order in_features = {n}: "
                                 f"{orders.supported_text()}; or rotate=False")
            if randomized:
                gen = torch.Generator().manual_seed(seed) if seed is not None else None
                signs = (torch.randint(0, 2, (n,), generator=gen) * 2 - 1).to(torch.float32)
                w = w * signs.to(device=w.device, dtype=torch.float64)
            # W R^T = W diag(s) H^T / sqrt(n): row o is R w_o, the float64 transform of each row (no n x n matrix)
            w = hadamard_reference(w, n**-0.5)
        codes, scales = quantize_rotated(w, "fp8_e4m3", None)  # per output channel, float32 scales
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        layer = cls(codes, scales, bias, signs.to(w.device) if signs is not None else None, rotate)
        return layer.to(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.in_features:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"RotatedLinear({self.in_features} -> {self.out_features}) needs a last dimension of "
                             f"{self.in_features}; got {got}")
        lead = x.shape[:-1]
        codes, scales = hadamard_quantize(x, format="fp8_e4m3", rotate=self.rotate, randomized_signs=self.signs)
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        from tilecore.ops.gemm.op import gemm_fp8

        y = gemm_fp8(codes.reshape(-1, self.in_features), self.weight_codes.t(), scales.reshape(-1, 1),
                     self.weight_scales, out_dtype=out_dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rotate={self.rotate}, "
                f"randomized={self.signs is not None}")

"""The tour's Hadamard cases: bf16 rows of n = 4096 (the size LLM activations are rotated at)."""
import torch

from tilecore.ops.hadamard.op import hadamard_transform
from tilecore.ops.hadamard.reference import hadamard_reference
from tilecore.tour_case import TourCase


def tour_cases(device: torch.device) -> list:
    cases = []
    for n, dtype in ((4096, torch.bfloat16), (16384, torch.float16)):
        rows = 2**26 // n if device.type == "cuda" else 4
        x = torch.randn(rows, n, dtype=dtype, device=device)
        cases.append(TourCase(
            op="hadamard_transform", shape=f"{rows}x{n}", dtype=dtype,
            run=lambda x=x, n=n: hadamard_transform(x, n**-0.5),
            reference=lambda x=x, n=n: hadamard_reference(x, n**-0.5, out_dtype=torch.float64),
            bytes=2 * x.numel() * x.element_size(), bound="memory"))
    return cases

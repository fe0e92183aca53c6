"""The CPU paths' memory (issue 31: CPU tensors through torch's own kernels, within 2x of the torch op in time and
memory; experiments/common/host_cpu_path.py measures both): a path that works in chunks to bound its float32
temporaries must give the bits of the whole tensor at once."""
import pytest
import torch

from tilecore.ops.rotary import launch as rotary_launch
from tilecore.ops.rotary.reference import rotary_reference


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("conjugate", [False, True])
@pytest.mark.parametrize("positions", [None, "batch", "shared"])
@pytest.mark.parametrize("in_place", [False, True])
def test_rotary_cpu_chunks_give_the_whole_tensors_bits(monkeypatch, interleaved, conjugate, positions, in_place):
    torch.manual_seed(31)
    B, N, H, D, R = 2, 37, 3, 20, 6  # D > 2R: features past the rotary dims pass through
    x = torch.randn(B, N, H, D, dtype=torch.bfloat16)
    cos, sin = torch.randn(50, R), torch.randn(50, R)
    pos = None if positions is None else (torch.randint(0, 50, (B, N)) if positions == "batch" else
                                          torch.randint(0, 50, (1, N)).expand(B, N))
    outs = []
    for chunk in (1 << 30, B * H * 2 * R * 5, 1):  # one chunk; 5 tokens a chunk; one token a chunk
        monkeypatch.setattr(rotary_launch, "CPU_CHUNK_ELEMS", chunk)
        src = x.clone()
        out = src if in_place else torch.full_like(x, float("nan"))
        rotary_launch._cpu(src, cos, sin, pos, out, interleaved, conjugate, in_place)
        outs.append(out)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    ref = rotary_reference(x, cos, sin, interleaved=interleaved, position_ids=pos, conjugate=conjugate)
    err = (outs[0].double() - ref).abs().max() / ref.abs().max()
    assert not outs[0].isnan().any() and err < 2 ** -7  # bf16: one rounding of float32 math


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "int8", "mxfp4", "nvfp4", "int4"])
@pytest.mark.parametrize("variant", ["plain", "block", "signs", "static", "unrotated"])
def test_hadamard_quantize_torch_path_chunks_give_the_whole_tensors_bits(monkeypatch, fmt, variant):
    """hadamard_quantize's "cpu" path (torch's ops: CPU tensors, and the e4m3 formats where Triton has none) in chunks
    of rows: the bits of the whole tensor at once, codes and scales (nvfp4 with a dynamic global scale stays whole:
    its amax spans the tensor)."""
    from tilecore import dispatch
    from tilecore.ops.hadamard import quantize as hq
    from tilecore.ops.hadamard.quantize_reference import FORMATS

    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)  # CPU tensors: torch's ops
    torch.manual_seed(32)
    rows, n = 13, 128
    x = torch.randn(rows, n, dtype=torch.bfloat16) * torch.logspace(-2, 2, rows)[:, None].bfloat16()
    x[3, 5] = float("nan")
    f = FORMATS[fmt]
    block = 32 if variant == "block" else None
    signs = (torch.randint(0, 2, (n,)) * 2 - 1).float() if variant == "signs" else None
    scale = torch.tensor([0.05]) if variant == "static" and f.static else None
    rotate = variant != "unrotated"
    outs = []
    for chunk in (1 << 30, 5 * n, n):  # whole; 5 rows a chunk; one row a chunk
        monkeypatch.setattr(hq, "TORCH_CHUNK_ELEMS", chunk)
        codes, scales, gscale = hq._run(x, fmt, f.default_group, block, rotate, scale, signs, plan=hq.QuantizePlan("cpu"))
        outs.append([t.view(torch.uint8) if t.dtype.itemsize == 1 else t for t in (codes, scales, gscale)
                     if t is not None])
    for other in outs[1:]:
        assert len(other) == len(outs[0])
        for a, b in zip(outs[0], other):
            assert a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num()), (fmt, variant)

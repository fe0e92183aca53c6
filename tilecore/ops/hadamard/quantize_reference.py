"""The formats of hadamard_quantize, written plainly with PyTorch operations: the float64 reference the
kernel is checked against (rotate in float64, then round to nearest even into the format), the CPU
path (the same functions in float32 after the float32 transform), and ``dequantize``.

Byte layouts (every format quantizes the last dimension, n elements a row; ``lead`` = the other dims):

| format | codes | scales |
| --- | --- | --- |
| fp8_e4m3 | torch.float8_e4m3fn, (*lead, n) | float32: (*lead, 1) per token, (*lead, n / g) per 1 x g block (g = ``group``, DeepSeek-V3: 128), or the static scale given (1 element) |
| fp8_e5m2 | torch.float8_e5m2, (*lead, n) | as fp8_e4m3 |
| int8 | torch.int8, (*lead, n), symmetric, -127..127 | float32 (*lead, 1) per token |
| mxfp4 | torch.uint8, (*lead, n / 2): two e2m1 codes a byte, element 2j in the low nibble, 2j + 1 in the high one (torch.float4_e2m1fn_x2's and torchao's order; ``codes.view(torch.float4_e2m1fn_x2)``) | torch.float8_e8m0fnu (*lead, n / 32): a biased exponent (OCP MX 1.0) |
| nvfp4 | torch.uint8, (*lead, n / 2), as mxfp4 | (block scales torch.float8_e4m3fn (*lead, n / 16), global scale float32 (1,)) |
| int4 | torch.uint8, (*lead, n / 2): two's-complement nibbles, -8..7, element 2j low | float32 (*lead, n / g), g = ``group`` (128) |

Scales (a = the block's or token's largest |y|, y the rotated values, a and the scale arithmetic in
float32 as the formats define them; dequantized value = code x scale):
* fp8, int8, int4: scale = a / qmax (448, 57344, 127, 7), or 1 where a = 0; code = the value y / scale,
  clamped to +-qmax (saturating: a static scale may be exceeded), rounded to nearest even into the format.
* mxfp4 (torchao's default "floor" mode): scale = 2^(floor(log2 a) - 2), the exponent clamped to
  [-127, 127] (a = 0: 2^-127), NaN (0xFF) where a is not finite; codes = e2m1(y / scale), saturating at 6.
* nvfp4 (torchao's two-level scaling): global G = a_tensor / (448 x 6) (1 where a_tensor = 0; or given);
  block scale s = e4m3((a / 6) / G, clamped to [2^-6, 448]); codes = e2m1(y / (G s)), saturating at 6.
Non-finite inputs: NaN and inf reach the scale (amax NaN or inf), whose dequantized row or block is then
NaN as in a torch reference; codes are the format's NaN where it has one (fp8) and 0 otherwise (int8,
int4, and fp4 blocks whose scale is not finite).
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore.ops.hadamard.reference import hadamard_reference

E4M3_TINY = 2.0**-6  # torch.finfo(torch.float8_e4m3fn).tiny: nvfp4's smallest block scale (as torchao)


@dataclasses.dataclass(frozen=True)
class Format:
    name: str
    kernel_id: int  # the kernel's FORMAT constexpr
    qmax: float
    packed: bool  # two 4-bit codes a byte
    groups: tuple  # the group sizes accepted: None per token
    default_group: int | None
    static: bool  # accepts a given scale (fp8: the scale; nvfp4: the global scale)


FORMATS = {f.name: f for f in (
    Format("fp8_e4m3", 0, 448.0, False, (None, 16, 32, 64, 128), None, True),
    Format("fp8_e5m2", 1, 57344.0, False, (None, 16, 32, 64, 128), None, True),
    Format("int8", 2, 127.0, False, (None,), None, False),
    Format("mxfp4", 3, 6.0, True, (32,), 32, False),
    Format("nvfp4", 4, 6.0, True, (16,), 16, True),
    Format("int4", 5, 7.0, True, (32, 64, 128), 128, False),
)}
FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_half_even_e2m1(v: torch.Tensor) -> torch.Tensor:
    """|v| (<= 6) rounded to nearest even on the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}: the 4-bit magnitude
    code 0..7."""
    a = v.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(a.dtype)
    q = torch.round(a / step) * step  # torch.round: half to even, and the grid's even codes are its even multiples
    return torch.where(q < 2, q * 2, torch.where(q < 4, q + 2, q / 2 + 4)).to(torch.int32)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., n) 4-bit codes (int) -> (..., n / 2) uint8, element 2j in the low nibble."""
    c = codes.to(torch.int32) & 0xF
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(..., n / 2) uint8 -> (..., n) codes 0..15 (int32)."""
    p = packed.to(torch.int32)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)


def code_order(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """Codes of ``fmt`` as signed integers in value order, so that neighbours on the grid differ by 1
    (+0 and -0 both 0; an fp8 NaN as a far-away 1000): how far two quantizations of a value are apart."""
    if fmt == "int8":
        return codes.to(torch.int64)
    if fmt == "int4":
        raw = unpack_nibbles(codes)
        return (raw - ((raw & 8) << 1)).to(torch.int64)
    if FORMATS[fmt].packed:
        raw = unpack_nibbles(codes).to(torch.int64)
        return torch.where(raw & 8 != 0, -(raw & 7), raw & 7)
    b = codes.view(torch.uint8).to(torch.int64)
    mag = b & 0x7F
    o = torch.where(b & 0x80 != 0, -mag, mag)
    return torch.where(torch.isnan(codes.to(torch.float32)), torch.full_like(o, 1000), o)


def _nonzero_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """amax / qmax in float32 arithmetic (the formats' scales are float32 numbers), 1 where amax = 0."""
    a32 = amax.to(torch.float32)
    return torch.where(a32 == 0, torch.ones_like(a32), a32 / qmax)


def quantize_rotated(y: torch.Tensor, fmt: str, group: int | None, scale: torch.Tensor | None = None):
    """(codes, scales) of rotated values ``y`` (rows, n) in float64 (the reference) or float32 (the CPU
    path), as the module docstring defines them. ``scale``: fp8's static scale or nvfp4's global scale."""
    f = FORMATS[fmt]
    rows, n = y.shape
    if fmt in FP8_DTYPES:
        if scale is not None:
            s32 = scale.reshape(1, 1).to(torch.float32)
            s = s32.to(y.dtype)
            g = n
        else:
            g = group or n
            amax = y.view(rows, n // g, g).abs().amax(-1)
            s32 = _nonzero_scale(amax, f.qmax)
            s = s32.to(y.dtype).repeat_interleave(g, dim=1)
        v = (y / s).clamp(-f.qmax, f.qmax)  # NaN stays NaN
        return v.to(FP8_DTYPES[fmt]), (scale.reshape(-1).to(torch.float32) if scale is not None else s32)
    if fmt in ("int8", "int4"):
        g = n if fmt == "int8" else group
        amax = y.view(rows, n // g, g).abs().amax(-1)
        s32 = _nonzero_scale(amax, f.qmax)
        v = y / s32.to(y.dtype).repeat_interleave(g, dim=1)
        q = torch.round(v.clamp(-f.qmax, f.qmax))
        q = torch.where(torch.isnan(q), torch.zeros_like(q), q).to(torch.int32)
        return (q.to(torch.int8) if fmt == "int8" else pack_nibbles(q)), s32
    # fp4: e2m1 codes with a block scale
    g = f.default_group
    blocks = y.view(rows, n // g, g)
    amax = blocks.abs().amax(-1)
    finite = torch.isfinite(amax)
    if fmt == "mxfp4":
        a32 = amax.to(torch.float32)  # floor(log2 a) from a float32's exponent bits, as torchao (-127 for 0)
        e = (((a32.view(torch.int32) >> 23) & 0xFF) - 127 - 2).clamp(-127, 127)
        stored = torch.where(finite, e + 127, torch.full_like(e, 255)).to(torch.uint8)
        mult = torch.exp2(-e.to(y.dtype))
        v = blocks * mult[..., None]
        scales = stored.view(torch.float8_e8m0fnu)
    else:  # nvfp4
        # the scale arithmetic in float32, as the format (and torchao) defines it; the division of the
        # rotated values by the total scale in y's precision
        gs = scale.reshape(()).to(torch.float32)
        s = (amax.to(torch.float32) / 6) / gs
        s = torch.where(torch.isnan(s), s, s.clamp(E4M3_TINY, 448.0))
        s8 = s.to(torch.float8_e4m3fn)
        total = gs * s8.to(torch.float32)
        v = blocks / total.to(y.dtype)[..., None]
        scales = s8
        finite = finite & torch.isfinite(total)
    v = v.clamp(-6.0, 6.0)
    mag = round_half_even_e2m1(torch.where(torch.isnan(v), torch.zeros_like(v), v))
    code = mag | (torch.signbit(v).to(torch.int32) << 3)
    code = torch.where(finite[..., None], code, torch.zeros_like(code))
    return pack_nibbles(code.view(rows, n)), scales


def nvfp4_global_scale(y: torch.Tensor) -> torch.Tensor:
    """The dynamic global scale of rotated values ``y``: a_tensor / (448 x 6), 1 where it is 0 (float32, (1,))."""
    amax = y.abs().amax() if y.numel() else torch.zeros((), dtype=y.dtype)
    return _nonzero_scale(amax, 448.0 * 6.0).to(torch.float32).reshape(1)


def rotated_rows(x: torch.Tensor, block: int | None, rotate: bool, signs: torch.Tensor | None, dtype: torch.dtype):
    """The rotated rows (rows, n) in ``dtype``: signs applied, then the orthonormal transform of each block
    (the whole row where block is None) in float64 (the reference) or float32 (hadamard_transform's CPU
    path)."""
    n = x.shape[-1]
    y = x.reshape(-1, n).to(dtype)
    if signs is not None:
        y = y * signs.to(dtype)
    if not rotate:
        return y
    size = block or n
    if dtype == torch.float64:
        return hadamard_reference(y.reshape(-1, size), size**-0.5).reshape(-1, n)
    from tilecore.ops.hadamard.op import hadamard_transform

    return hadamard_transform(y.reshape(-1, size), size**-0.5).reshape(-1, n)


def hadamard_quantize_reference(x: torch.Tensor, *, format: str, block: int | None = None, scale=None,
                                rotate: bool = True, randomized_signs=None, group: int | None = None):
    """hadamard_quantize in float64: rotate, then quantize (the module docstring's definitions); scales
    rounded once to their dtype. Returns what hadamard_quantize returns."""
    f = FORMATS[format]
    group = group if group is not None else f.default_group
    lead, n = x.shape[:-1], x.shape[-1]
    y = rotated_rows(x, block, rotate, randomized_signs, torch.float64)
    if scale is not None and not isinstance(scale, torch.Tensor):
        scale = torch.tensor([float(scale)], dtype=torch.float32)
    if format == "nvfp4" and scale is None:
        scale = nvfp4_global_scale(y)
    codes, scales = quantize_rotated(y, format, group, scale)
    return shape_outputs(codes, scales, lead, scale if format == "nvfp4" else None)


def shape_outputs(codes, scales, lead, global_scale=None):
    """(codes, scales) with the leading dimensions restored (nvfp4: scales = (block scales, global))."""
    codes = codes.reshape(*lead, codes.shape[-1])
    if scales.dim() == 2:  # per row (a static scale is 1-D and stays as given)
        scales = scales.reshape(*lead, scales.shape[-1])
    if global_scale is not None:
        return codes, (scales, global_scale.reshape(1).to(torch.float32))
    return codes, scales


def dequantize(codes: torch.Tensor, scales, *, format: str, group: int | None = None, block: int | None = None,
               rotate: bool = False, randomized_signs=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values ``codes`` and ``scales`` (as hadamard_quantize returns them) stand for, in ``dtype``:
    code x scale, in the rotated domain; with ``rotate=True`` also rotated back (the transposed transform
    of each ``block``, or of the whole row, then the ``randomized_signs``), giving x's approximation."""
    if format not in FORMATS:
        raise ValueError(f"dequantize: unknown format {format!r}; formats: {', '.join(FORMATS)}")
    f = FORMATS[format]
    group = group if group is not None else f.default_group
    if f.packed:
        if codes.dtype != torch.uint8:
            raise TypeError(f"dequantize: {format} codes are uint8 (two a byte), got {codes.dtype}")
        raw = unpack_nibbles(codes)
        if format == "int4":
            values = (raw - ((raw & 0x8) << 1)).to(torch.float32)  # two's complement
        else:
            table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
            values = table[raw & 0x7] * torch.where((raw & 0x8) != 0, -1.0, 1.0)
    else:
        values = codes.to(torch.float32)
    n = values.shape[-1]
    lead = values.shape[:-1]
    if format == "nvfp4":
        block_scales, global_scale = scales
        s = block_scales.to(torch.float32) * global_scale.to(torch.float32).reshape(())
        g = 16
    elif format == "mxfp4":
        bits = scales.view(torch.uint8).to(torch.int32)
        s = torch.where(bits == 255, torch.full(bits.shape, float("nan"), device=bits.device),
                        torch.exp2((bits - 127).to(torch.float32)))
        g = 32
    else:
        s = scales.to(torch.float32)
        g = n // s.shape[-1] if s.dim() and s.shape[-1] > 0 and s.numel() > 1 else n
        if s.numel() == 1:
            s = s.reshape(())
    if s.dim():
        s = s.reshape(*lead, -1).repeat_interleave(g, dim=-1)
    y = (values * s)
    if rotate:
        size = block or n
        from tilecore.ops.hadamard.op import hadamard_transform

        y = hadamard_transform(y.reshape(-1, size), size**-0.5, transpose=True).reshape(*lead, n)
    if randomized_signs is not None and rotate:
        y = y * randomized_signs.to(torch.float32)
    return y.to(dtype)

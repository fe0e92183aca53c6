"""FP8 attention with PyTorch operations: the exact reference (float64, no rounding but the inputs'),
and the emulation of the kernels' math (float32, P rounded to e4m3 block by block), which is also
the CPU path.

Descales (see op.py): the dequantized inputs are q = q8 * q_scale, k = k8 * k_scale, v = v8 * v_scale,
with q_scale and k_scale per (batch, head), per block of ``SCALE_BLOCK`` rows or per row, v_scale per
(batch, kv head) or per block of ``SCALE_BLOCK`` keys (the Hopper kernel folds a block's descale into
O's rescale: O is carried in units of the last block's descale). Masks as tilecore.attention: causal aligned to the bottom right (query i sees keys
j <= i + Nk - N); a row with no key gets 0 and lse -inf.

The kernels' math (FlashAttention-3's FP8 forward), in base 2, for each block of ``block_n`` keys:

    s    = (q8 k8^T) * (q_scale_i * k_scale_j * softmax_scale * log2 e)     float32
    m    = max(m, rowmax s);  alpha = 2^(m_old - m);  p = 2^(s - m)          p in [0, 1]
    l    = l alpha + rowsum p                                               (float32 p, not rounded)
    acc  = acc alpha + e4m3(P_SCALE * p) v8                                 P_SCALE = 2^8
    O    = acc * v_scale / (P_SCALE * l)

P is rounded to e4m3 scaled by P_SCALE = 256 (FlashAttention-3's "max offset" of 8 in the exponent):
the largest p (1) goes to 256 (< 448, e4m3's largest), and p down to 2^-14 stay normal e4m3 numbers
(unscaled, everything under 2^-6 would be subnormal, losing bits). P's rounding is relative to the
running max of the blocks so far, so the emulation walks the key blocks as the kernel does.

Conditional rescaling (``rescale_tau`` > 0, FlashAttention-4's idea; the kernels' ``RESCALE_TAU``): a row's m
moves to the new row max only where that exceeds m by more than tau (base 2); otherwise m stays, alpha is exactly
1 and the kernel skips ``acc * alpha`` where no row of a warpgroup moved. Exact in real arithmetic (l and acc use
the same m); p may reach 2^tau, so P is rounded as 2^p_shift p with p_shift + tau <= log2(448) (e4m3's largest:
MAX_SHIFT_PLUS_TAU), e.g. (8, 0.8) or (6, 2.8). Per row, so the emulation follows the kernel exactly.

``l_rounded`` (the Hopper kernel's ``L_MMA``, which sums P on the tensor cores as P times a block of ones): l sums P
as rounded to e4m3 (the weights that multiply V) instead of the float32 p, so O's weights sum to exactly 1.
"""
from __future__ import annotations

import math

import torch

P_SCALE = 256.0  # P is rounded to e4m3 as P_SCALE * p (p <= 1): see the module docstring
SCALE_BLOCK = 128  # a per-block descale covers this many rows (queries or keys)
LOG2E = math.log2(math.e)
P_SHIFT = 8  # P_SCALE = 2^P_SHIFT
MAX_SHIFT_PLUS_TAU = math.log2(448.0)  # 2^(p_shift + rescale_tau) stays within e4m3's range


def check_rescale(rescale_tau: float, p_shift: int) -> None:
    """Raise unless (rescale_tau, p_shift) keep P = 2^p_shift p (p <= 2^tau) within e4m3's range."""
    if not (rescale_tau >= 0 and 1 <= p_shift <= 8 and p_shift + rescale_tau <= MAX_SHIFT_PLUS_TAU):
        raise ValueError(f"rescale_tau {rescale_tau} and p_shift {p_shift}: need tau >= 0, p_shift in 1..8 and "
                         f"p_shift + tau <= log2(448) = {MAX_SHIFT_PLUS_TAU:.3f}")


# P_LINEAR (the Hopper kernel's configs key p_linear): P's e4m3 code by one multiply-add, no exp2
LINEAR_LSE_BIAS = 0.05708148  # log2 of the codes' mean overestimate of 2^x (1.0404, x uniform over the octaves)


def linear_e4m3(x: torch.Tensor) -> torch.Tensor:
    """2^x as e4m3 by the linear code (the kernel's P_LINEAR; x <= 8 for the codes to stay <= 120): e4m3's byte
    b = round(8 x + 56) (round half to even, clamped at 0: x < -7 gives 0), i.e. the exponent and mantissa bits of b
    read as one fixed-point number, 2^x with the mantissa interpolated linearly between powers of two (0.96x to 1.11x
    of 2^x after the rounding, 1.04x on average). NaN stays NaN. Float32 values of the codes."""
    z = x.float() * 8.0 + 56.0
    code = torch.clamp(torch.round(torch.nan_to_num(z, nan=0.0, posinf=126.0, neginf=0.0)), 0.0, 126.0)
    val = code.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    return torch.where(torch.isnan(z), float("nan"), val)


KEY_CHUNK = 32  # the Hopper kernel's V layout permutes keys within chunks of this many (key_position)


def key_position(j: torch.Tensor) -> torch.Tensor:
    """Where key j sits in the Hopper kernel's V layout ("keys_permuted"): within each chunk of 32 keys,
    key c = 16 a + 8 b + 2 r + e goes to position 16 a + 4 r + 2 b + e. That is P's column order in
    the wgmma accumulator (lane r of a quad holds columns 2 r, 2 r + 1 of every 8) read as the order
    of the register operand's k (lane r holds k = 4 r .. 4 r + 3 of every 16): with V's keys so
    placed, P goes from one layout to the other in each thread's own registers (gluon_fp8.p_operand)."""
    c = j % KEY_CHUNK
    return j - c + 16 * (c // 16) + 4 * ((c % 8) // 2) + 2 * ((c // 8) % 2) + c % 2


def keys_permuted(v: torch.Tensor) -> torch.Tensor:
    """v (B, H, Nk, D) in the Hopper kernel's layout: V^T (B, H, D, ceil(Nk / 32) * 32), keys contiguous,
    key j at position key_position(j), zeros past Nk. One copy (e4m3 copied as bytes)."""
    B, H, Nk, D = v.shape
    padded = -(-Nk // KEY_CHUNK) * KEY_CHUNK
    vt = v.transpose(2, 3)
    raw = vt.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else vt
    if padded != Nk:
        raw = torch.nn.functional.pad(raw, (0, padded - Nk))
    # (..., chunk, a, b, r, e) -> (..., chunk, a, r, b, e)
    out = raw.reshape(B, H, D, padded // KEY_CHUNK, 2, 2, 4, 2).permute(0, 1, 2, 3, 4, 6, 5, 7).reshape(B, H, D, padded)
    return out.view(v.dtype) if v.dtype == torch.float8_e4m3fn else out.contiguous()


def keys_unpermuted(vp: torch.Tensor, nk: int) -> torch.Tensor:
    """The inverse of keys_permuted: (B, H, Nk, D) from the kernel's layout."""
    index = key_position(torch.arange(nk, device=vp.device))
    raw = vp.view(torch.uint8) if vp.dtype == torch.float8_e4m3fn else vp
    out = raw.index_select(3, index).transpose(2, 3)
    return out.view(vp.dtype) if vp.dtype == torch.float8_e4m3fn else out


def expand_scale(scale: torch.Tensor, heads_rows: tuple[int, int, int], rows: int) -> torch.Tensor:
    """A descale (B, H), (B, H, ceil(rows / SCALE_BLOCK)) or (B, H, rows) as one per row: (B, H, rows)."""
    B, H, _ = heads_rows
    if scale.dim() == 2:
        return scale[:, :, None].expand(B, H, rows)
    if scale.shape[2] == rows:
        return scale
    return scale.repeat_interleave(SCALE_BLOCK, dim=2)[:, :, :rows]


def dequantized(q8, k8, v8, q_scale, k_scale, v_scale, dtype=torch.float64):
    """(q, k, v) dequantized in ``dtype``: codes times their descales."""
    q = q8.to(dtype) * expand_scale(q_scale, q8.shape[:3], q8.shape[2]).to(dtype)[..., None]
    k = k8.to(dtype) * expand_scale(k_scale, k8.shape[:3], k8.shape[2]).to(dtype)[..., None]
    v = v8.to(dtype) * expand_scale(v_scale, v8.shape[:3], v8.shape[2]).to(dtype)[..., None]
    return q, k, v


def _allowed(n: int, nk: int, device, causal: bool, rows: slice) -> torch.Tensor | None:
    if not causal:
        return None
    i = torch.arange(rows.start, rows.stop, device=device)[:, None] + (nk - n)
    return torch.arange(nk, device=device)[None, :] <= i


def attention_fp8_exact(q8, k8, v8, q_scale, k_scale, v_scale, *, causal=False, softmax_scale=None):
    """(O, lse) in float64 of softmax(scale q k^T) v on the dequantized inputs: no rounding but the
    inputs' (what the kernels approximate)."""
    q, k, v = dequantized(q8, k8, v8, q_scale, k_scale, v_scale)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    s = (q @ k.transpose(-1, -2)) * scale
    allowed = _allowed(q.shape[2], k.shape[2], q.device, causal, slice(0, q.shape[2]))
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    no_key = lse == float("-inf")
    p = torch.exp(s - torch.where(no_key, 0.0, lse)[..., None])
    return (p @ v).masked_fill(no_key[..., None], 0.0), lse


def attention_fp8_emulated(q8, k8, v8, q_scale, k_scale, v_scale, *, causal=False, softmax_scale=None,
                           block_n: int = 128, out_dtype=torch.float32, rows_at_once: int = 1024,
                           rescale_tau: float = 0.0, p_shift: int = P_SHIFT, l_rounded: bool = False,
                           p_linear: bool = False):
    """(O in ``out_dtype``, lse float32) by the kernels' math (module docstring) in float32, key block
    by key block of ``block_n`` (the kernels': P's rounding depends on it), ``rows_at_once`` query
    rows at a time. The CPU path of attention_fp8. ``rescale_tau``, ``p_shift``: conditional rescaling
    and P's scale 2^p_shift (module docstring; the kernels' defaults 0 and 8); ``l_rounded``: l sums the
    rounded P (module docstring; the Hopper kernel's L_MMA); ``p_linear``: P by linear_e4m3 instead of the rounded
    exp2 (the Hopper kernel's P_LINEAR, which sums l of the codes: implies l_rounded; lse corrected by
    LINEAR_LSE_BIAS)."""
    check_rescale(rescale_tau, p_shift)
    if p_linear and p_shift + rescale_tau > 8.75:
        raise ValueError(f"p_linear: p_shift + rescale_tau <= 8.75 (codes <= 126, e4m3's 448); got {p_shift} + "
                         f"{rescale_tau}")
    p_scale = float(2 ** p_shift)
    B, Hq, N, D = q8.shape
    Hkv, Nk = k8.shape[1], k8.shape[2]
    group = Hq // Hkv
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    f32 = torch.float32
    qs = expand_scale(q_scale, q8.shape[:3], N).to(f32) * (scale * LOG2E)
    ks = expand_scale(k_scale, k8.shape[:3], Nk).to(f32).repeat_interleave(group, 1)
    k = k8.to(f32).repeat_interleave(group, 1)
    v = v8.to(f32).repeat_interleave(group, 1)
    if v_scale.dim() == 3:  # per block of SCALE_BLOCK keys: inside P V's sum (v dequantized a key at a time)
        v = v * expand_scale(v_scale, v8.shape[:3], Nk).to(f32).repeat_interleave(group, 1)[..., None]
        vs = torch.ones((), dtype=f32, device=q8.device)
    else:
        vs = v_scale.to(f32).repeat_interleave(group, 1)[:, :, None, None]
    out = torch.empty((B, Hq, N, D), dtype=out_dtype, device=q8.device)
    lse = torch.empty((B, Hq, N), dtype=f32, device=q8.device)
    for r0 in range(0, N, rows_at_once):
        rows = slice(r0, min(N, r0 + rows_at_once))
        q = q8[:, :, rows].to(f32)
        m = torch.full(q.shape[:3], float("-inf"), dtype=f32, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape, dtype=f32, device=q.device)
        allowed = _allowed(N, Nk, q.device, causal, rows)
        for j0 in range(0, Nk, block_n):
            keys = slice(j0, min(Nk, j0 + block_n))
            s = (q @ k[:, :, keys].transpose(-1, -2)) * qs[:, :, rows, None] * ks[:, :, None, keys]
            if allowed is not None:
                s = s.masked_fill(~allowed[:, keys], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            if rescale_tau > 0:  # m moves only where the max grows by more than tau
                m_new = torch.where(m_new > m + rescale_tau, m_new, m)
            m_ref = torch.where(m_new == float("-inf"), 0.0, m_new)
            alpha = torch.exp2(m - m_ref)
            if p_linear:
                p8 = linear_e4m3(s - m_ref[..., None] + p_shift)
                l = l * alpha + p8.sum(-1) / p_scale
            else:
                p = torch.exp2(s - m_ref[..., None])
                p8 = (p * p_scale).to(torch.float8_e4m3fn).to(f32)
                l = l * alpha + (p8.sum(-1) / p_scale if l_rounded else p.sum(-1))
            acc = acc * alpha[..., None] + p8 @ v[:, :, keys]
            m = m_new
        no_key = l == 0.0
        l_safe = torch.where(no_key, 1.0, l)
        out[:, :, rows] = (acc * vs / (p_scale * l_safe[..., None])).to(out_dtype)
        lse_bias = LINEAR_LSE_BIAS if p_linear else 0.0
        lse[:, :, rows] = torch.where(no_key, float("-inf"), (m + torch.log2(l_safe) - lse_bias) / LOG2E)
    return out, lse

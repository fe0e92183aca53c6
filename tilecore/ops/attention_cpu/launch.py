"""attention on CPU tensors without Triton's interpreter (attention's "sdpa" and "reference" plans,
cpu_plan.torch_path): torch's CPU flash-attention kernel (SDPA's, forward and backward, with its lse;
a sliding window as its float mask), or the float32 math of attention's reference.py a block of query
rows at a time (plan.sizes' max_scores). attention's launch.py maps those paths here."""
from __future__ import annotations

import torch

from tilecore.ops.attention.reference import (attention_backward_reference, attention_reference, effective_window,
                                              window_allowed)

NO_WINDOW = (-1, -1)


def launch_forward_reference(plan, q, k, v, out, lse, causal: bool, scale: float, window=NO_WINDOW,
                             softcap: float = 0.0) -> None:
    o, l = attention_reference(q, k, v, causal=causal, scale=scale, window_size=window, softcap=softcap,
                               compute_dtype=torch.float32, max_scores=plan.sizes.get("max_scores"))
    out.copy_(o)
    lse.copy_(l)


def launch_forward_sdpa(plan, q, k, v, out, lse, causal: bool, scale: float, window=NO_WINDOW,
                        softcap: float = 0.0) -> None:
    """forward_sdpa into the given buffers (no softcap: plan.py sends that to the reference)."""
    o, l = forward_sdpa(q, k, v, causal, scale, window)
    out.copy_(o)
    lse.copy_(l)


def forward_sdpa(q, k, v, causal: bool, scale: float, window=NO_WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse), contiguous, by torch's CPU flash-attention kernel (what SDPA runs on the CPU),
    which gives lse too: causal with N = Nk its own causal mask, with N < Nk (or a sliding window)
    a bottom-right float mask; the first rows that see no key (N > Nk causal, a window's right edge
    before key 0) get 0 and lse -inf, the others the kernel's."""
    first, is_causal, mask = _sdpa_rows(q, k, causal, window)
    if first == 0:
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, *_sdpa_kv(q, k, v), 0.0, is_causal, attn_mask=mask, scale=scale)
        return o.contiguous(), l.contiguous()
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), device=q.device)
    if first < q.shape[2]:
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[:, :, first:], *_sdpa_kv(q, k, v), 0.0, is_causal, attn_mask=mask, scale=scale)
        out[:, :, first:] = o
        lse[:, :, first:] = l
    return out, lse


def _sdpa_rows(q, k, causal: bool, window=NO_WINDOW):
    """(first query row that sees a key, is_causal, attn_mask) of the flash kernel's call on rows
    [first, N): with N > Nk causal the rows before N - Nk see no key (masked, the kernel would give
    them lse 0, not -inf) and the rest are a square causal block; N < Nk causal takes the
    bottom-right mask (tilecore's causal: query i sees keys j <= i + Nk - N, where the kernel's
    is_causal aligns to the top left). A window (left, right): rows before N - Nk - right see no key
    (a row's keys are [i' - left, i' + right] with i' = i + Nk - N <= Nk - 1: only its right edge
    can fall before key 0), the others take the window's float mask."""
    n, nk = q.shape[2], k.shape[2]
    left, right = effective_window(causal, window)
    if nk == 0:
        return n, False, None
    if (left, right) == NO_WINDOW:
        return 0, False, None
    first = 0 if right < 0 else min(n, max(0, n - nk - right))
    if (left, right) == (-1, 0) and n >= nk:
        return first, True, None
    mask = torch.zeros((n - first, nk), dtype=q.dtype, device=q.device)
    allowed = window_allowed(n, nk, q.device, (left, right), slice(first, n))
    return first, False, mask.masked_fill_(~allowed, float("-inf"))


_TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
SDPA_CPU_GQA = _TORCH_VERSION >= (2, 5)  # the CPU flash kernel reads kv head h // group itself


def _sdpa_kv(q, k, v):
    """k and v for the flash kernel: as they are where it takes grouped heads, else each kv head
    repeated for its q heads (the backward sums their gradients back)."""
    if SDPA_CPU_GQA or k.shape[1] == q.shape[1]:
        return k, v
    group = q.shape[1] // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def launch_backward_reference(plan, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float,
                              window=NO_WINDOW, softcap: float = 0.0) -> None:
    gq, gk, gv = attention_backward_reference(dout, q, k, v, out, lse, dlse, causal=causal, scale=scale,
                                              window_size=window, softcap=softcap,
                                              max_scores=plan.sizes.get("max_scores"))
    dq.copy_(gq)
    dk.copy_(gk)
    dv.copy_(gv)


def launch_backward_sdpa(plan, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float,
                         window=NO_WINDOW, softcap: float = 0.0) -> None:
    """backward_sdpa into the given buffers (no softcap: plan.py sends that to the reference)."""
    for g, result in zip((dq, dk, dv), backward_sdpa(dout, q, k, v, out, lse, dlse, causal, scale, window)):
        g.copy_(result)


def backward_sdpa(dout, q, k, v, out, lse, dlse, causal: bool, scale: float, window=NO_WINDOW):
    """(dq, dk, dv), contiguous, by torch's CPU flash-attention backward on the rows the forward's
    kernel ran (forward_sdpa), from the forward's out and lse. It takes no lse gradient, so a dlse
    (unless all zeros, as autograd gives where lse was not used) rides in extra head-dim columns
    (_dlse_columns), which make the kernel's delta = rowsum(dO * O) rowsum(dO * O) - dlse and change
    nothing else."""
    n, d = q.shape[2], q.shape[3]
    first, is_causal, mask = _sdpa_rows(q, k, causal, window)
    if first == n:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    rows = slice(first, n)
    q_in, dout, out, lse = q[:, :, rows], dout[:, :, rows], out[:, :, rows], lse[:, :, rows]
    k_in, v_in = _sdpa_kv(q, k, v)
    if dlse is not None and bool(dlse.any()):
        q_in, k_in, v_in, out, dout = _dlse_columns(dlse[:, :, rows], q_in, k_in, v_in, out, dout)
    grads = list(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q_in, k_in, v_in, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale))
    del q_in, k_in, v_in, out, dout
    for i, t in enumerate((q, k, v)):  # one at a time: each kernel result freed as its copy is made
        g = grads[i][..., :d]
        if g.shape[1] != t.shape[1]:  # kv heads repeated for the kernel: their q heads' sums
            g = g.unflatten(1, (t.shape[1], -1)).sum(2)
        if i == 0 and first:
            grads[i] = torch.zeros_like(q)
            grads[i][:, :, rows] = g
        else:
            grads[i] = g.contiguous()
    return tuple(grads)


def _dlse_columns(dlse, q, k, v, out, dout):
    """(q, k, v, out, dout) with columns that carry dlse (float32, (B, Hq, N)) into the flash
    backward's delta = rowsum(dO * O): zeros in q, k and v (no score and no dP changes), in O -dlse
    and in dO ones. float32 takes dlse in one column; bf16 and fp16 in two (its rounding and the
    rest), scaled per row by a power of two c (O gets -dlse / c in [-1, 1], dO gets c), so fp16's
    range holds any dlse up to ~2e9 and a small one keeps its digits."""
    if q.dtype == torch.float32:
        parts, c = [dlse], torch.ones_like(dlse)
    else:
        c = torch.exp2(torch.ceil(torch.log2(dlse.abs().clamp_min(2.0**-100)))).nan_to_num(1.0, 1.0, 1.0)
        if q.dtype == torch.float16:  # a normal fp16 power of two
            c = c.clamp(2.0**-14, 2.0**15)
        hi = (dlse / c).to(q.dtype)
        parts = [hi, (dlse / c - hi.float()).to(q.dtype)]
    cols = len(parts)
    q, k, v = (torch.cat([t, t.new_zeros(*t.shape[:-1], cols)], -1) for t in (q, k, v))
    out = torch.cat([out, -torch.stack(parts, -1).to(q.dtype)], -1)
    dout = torch.cat([dout, c[..., None].expand(*c.shape, cols).to(q.dtype)], -1)
    return q, k, v, out, dout

"""Attention with PyTorch operations: the reference every kernel result is compared with (float64),
and, in float32 and a block of query rows at a time, the CPU path for inputs whose scores may not
be finite (launch.py; the CPU otherwise runs torch's own SDPA kernels).

The masking rules are the kernels' (flash-attn's): query i of N sits at key position
i' = i + (Nk - N) (aligned to the bottom right) and, with ``window_size = (left, right)``, attends
key j of Nk when i' - left <= j <= i' + right (-1: unbounded on that side); ``causal`` is the
window (left, 0). A query row with no key to attend to (every key masked, or every score -inf)
gets output 0 and log-sum-exp -inf. ``softcap`` > 0 replaces the scaled score scale * q.k by
softcap * tanh(scale * q.k / softcap) before the softmax (0: off). v's head size Dv may differ
from q's and k's D: O is (B, Hq, N, Dv).

NaN and inf propagate as in SDPA's math (softmax(s) = exp(s - max s) / sum): a row with a NaN or
+inf score (a NaN or inf in its query, or scores past float32's range) gets NaN outputs and lse
NaN, and its NaN reaches the gradients of the keys it attends to; other rows are untouched.
"""
from __future__ import annotations

import torch


def window_allowed(n: int, nk: int, device, window_size=(-1, -1), rows: slice | None = None) -> torch.Tensor:
    """[n, nk] boolean (or the query ``rows`` of it): may query i attend key j, for
    ``window_size = (left, right)``: i' - left <= j <= i' + right with i' = i + nk - n (-1: no bound)."""
    rows = rows or slice(0, n)
    left, right = window_size
    i = torch.arange(rows.start, rows.stop, device=device)[:, None] + (nk - n)
    j = torch.arange(nk, device=device)[None, :]
    ok = torch.ones((rows.stop - rows.start, nk), dtype=torch.bool, device=device)
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    return ok


def effective_window(causal: bool, window_size=(-1, -1)) -> tuple[int, int]:
    """(left, right) of ``causal`` and ``window_size`` together: causal is the window (left, 0)."""
    left, right = (int(w) for w in window_size)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def capped(s: torch.Tensor, softcap: float) -> torch.Tensor:
    """softcap * tanh(s / softcap) of scaled scores ``s`` (softcap 0: s)."""
    return s if not softcap else torch.tanh(s / softcap) * softcap


def _expand_kv(t: torch.Tensor, hq: int) -> torch.Tensor:
    """(B, Hkv, Nk, D) -> (B, Hq, Nk, D): q head h reads kv head h // (Hq // Hkv)."""
    return t if t.shape[1] == hq else t.repeat_interleave(hq // t.shape[1], dim=1)


def _scores(qc, kc, n: int, nk: int, rows: slice, window: tuple[int, int], scale: float,
            softcap: float = 0.0) -> torch.Tensor:
    """Scaled (and capped) scores of the query ``rows`` (qc holds just those rows), masked with -inf
    outside the (left, right) ``window``."""
    s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
    if window == (-1, -1):
        return capped(s, softcap)
    masked = ~window_allowed(n, nk, qc.device, window, rows)
    if softcap:  # capped after the mask: autograd's tanh' of a masked NaN score would reach dQ as 0 x NaN
        s = s.masked_fill(masked, 0.0)
    return capped(s, softcap).masked_fill(masked, float("-inf"))


def row_lse(s: torch.Tensor) -> torch.Tensor:
    """The rows' log-sum-exp by tilecore's rule: -inf for a row with no key (every score -inf), NaN
    for a row with a NaN or a +inf score (as the kernels give: their exp(s - max) is NaN there)."""
    lse = torch.logsumexp(s, dim=-1)
    return torch.where(lse == float("inf"), float("nan"), lse)


def probabilities(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(s - lse), with p = 0 in rows with no key (lse = -inf), where exp(-inf - -inf) would be
    NaN; a NaN lse gives a NaN row."""
    empty = (lse == float("-inf"))[..., None]
    return torch.exp(s - torch.where(empty, 0.0, lse[..., None]))


def _row_blocks(n: int, per_row: int, max_elements: int | None):
    """Slices of query rows, each holding at most ``max_elements`` scores (all rows if None)."""
    if max_elements is None or n == 0:
        return [slice(0, n)]
    step = max(1, max_elements // max(per_row, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None,
                        window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                        compute_dtype: torch.dtype = torch.float64,
                        max_scores: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) in ``compute_dtype``: O = softmax(cap(scale q k^T) [masked]) v, (B, Hq, N, Dv),
    lse = logsumexp of the scaled, capped, masked scores (natural log), (B, Hq, N). ``window_size``
    and ``softcap`` as the module says (causal: the window (left, 0)). Differentiable with
    torch.autograd. ``max_scores`` bounds the scores held at once (a block of query rows at a time)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    window = effective_window(causal, window_size)
    b, hq, n, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    kc = _expand_kv(k.to(compute_dtype), hq)
    vc = _expand_kv(v.to(compute_dtype), hq)
    outs, lses = [], []
    for rows in _row_blocks(n, b * hq * nk, max_scores):
        s = _scores(q[:, :, rows].to(compute_dtype), kc, n, nk, rows, window, scale, float(softcap))
        lse = row_lse(s)
        outs.append(torch.matmul(probabilities(s, lse), vc))
        lses.append(lse)
    return (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs, 2), torch.cat(lses, 2))


def reference_attention(q, k, v, causal: bool = False, scale: float | None = None,
                        window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                        compute_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) of one dense (B, H, N, D) batch by the module's rules, in ``compute_dtype``
    (float64 by default): attention_reference with positional options (what per-sequence
    references build on)."""
    return attention_reference(q, k, v, causal=causal, scale=scale, window_size=window_size, softcap=softcap,
                               compute_dtype=compute_dtype)


def attention_backward_reference(dout, q, k, v, out, lse, dlse, *, causal: bool, scale: float,
                                 window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                 compute_dtype: torch.dtype = torch.float32, max_scores: int | None = None):
    """(dq, dk, dv) by the FlashAttention-2 backward formulas, in ``compute_dtype``: p recomputed
    from lse, dS = p (dP - delta) with delta = rowsum(dO * O) - dlse (times 1 - tanh^2 under a
    softcap), GQA groups summed; a block of query rows at a time where ``max_scores`` bounds the
    scores held at once."""
    window = effective_window(causal, window_size)
    softcap = float(softcap)
    b, hq, hkv, n, nk = q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    c = compute_dtype
    kc, vc = _expand_kv(k.to(c), hq), _expand_kv(v.to(c), hq)
    dk = torch.zeros(kc.shape, dtype=c, device=q.device)
    dv = torch.zeros(vc.shape, dtype=c, device=q.device)
    dqs = []
    for rows in _row_blocks(n, b * hq * nk, max_scores):
        qc, doc = q[:, :, rows].to(c), dout[:, :, rows].to(c)
        s = _scores(qc, kc, n, nk, rows, window, scale, softcap)
        p = probabilities(s, lse[:, :, rows].to(c))
        delta = (doc * out[:, :, rows].to(c)).sum(-1)
        if dlse is not None:
            delta = delta - dlse[:, :, rows].to(c)
        dv += torch.matmul(p.transpose(-1, -2), doc)
        ds = p * (torch.matmul(doc, vc.transpose(-1, -2)) - delta[..., None])
        if softcap:  # d(cap tanh(x / cap)) / dx = 1 - tanh^2; masked scores have p = 0
            t = torch.nan_to_num(s / softcap, neginf=0.0)
            ds = ds * (1 - t * t)
        dqs.append(torch.matmul(ds, kc) * scale)
        dk += torch.matmul(ds.transpose(-1, -2), qc) * scale
    dq = dqs[0] if len(dqs) == 1 else torch.cat(dqs, 2)
    g = hq // hkv
    return dq, dk.view(b, hkv, g, nk, -1).sum(2), dv.view(b, hkv, g, nk, -1).sum(2)


def reference_grads(q, k, v, dout, *, causal: bool = False, scale: float | None = None,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0):
    """(dq, dk, dv) of attention_reference in float64 (what kernel gradients are checked against)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = attention_reference(q64, k64, v64, causal=causal, scale=scale, window_size=window_size,
                                 softcap=softcap)
    return torch.autograd.grad(out, (q64, k64, v64), dout.double())

"""Linear attention and Mamba-2 as their recurrences, token by token, in float64: the references every
kernel result is compared with (the math, plainly; not fast).

Layout (B, N, H, D), as flash-linear-attention's: q, k (batch, tokens, q/k heads, Dk), v (batch,
tokens, heads, Dv), heads a multiple of q/k heads (head h reads q/k head h // (H // Hqk)). The state
of head h is S (F, Dv), F the feature size (Dk, or Based's 1 + Dk + Dk^2), and per token t

    S_t = diag(exp(g_t)) S_{t-1} + phi_k(k_t) v_t^T         (g_t: the log decay, scalar or (F,))
    o_t = scale * phi_q(q_t)^T S_t                           (inclusive: o_t sees token t itself)

with S_0 the initial state (zeros by default). Feature maps phi:

* None: phi(x) = x.
* "based": Based's second-order Taylor map of exp, phi(x) = [1, x, vec(x x^T) / sqrt(2)] (F = 1 + Dk +
  Dk^2), so that scale * phi(q).phi(k) is taken as 1 + s + s^2 / 2 with s = scale * q.k: the scale
  rides inside the map (phi_q(q) = [1, scale q, scale^2 vec(q q^T) / sqrt(2)]) and the output is not
  scaled again.
* "hedgehog": phi(x) = [softmax(x W_h), softmax(-x W_h)] (each softmax over the F/2 projected
  features), with the head's learned projection W_h (Dk, F/2) (its weights are passed in).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SQRT_HALF = math.sqrt(0.5)


def based_features(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """[1, scale x, scale^2 vec(x x^T) / sqrt(2)] over the last dimension (D -> 1 + D + D^2)."""
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2) * (scale * scale * SQRT_HALF)
    return torch.cat([torch.ones_like(x[..., :1]), x * scale, outer], dim=-1)


def hedgehog_features(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[softmax(x W_h), softmax(-x W_h)] for x (B, N, H, D) and per-head projections W (H, D, F/2)."""
    proj = torch.einsum("bnhd,hdf->bnhf", x, weight.to(x.dtype))
    return torch.cat([proj.softmax(-1), (-proj).softmax(-1)], dim=-1)


def feature_size(feature_map: str | None, dk: int, weight_features: int = 0) -> int:
    """F, the rows of a head's state: Dk, Based's 1 + Dk + Dk^2, or Hedgehog's 2 x its projection's width."""
    if feature_map == "based":
        return 1 + dk + dk * dk
    if feature_map == "hedgehog":
        return 2 * weight_features
    return dk


def linear_attention_reference(q, k, v, *, feature_map=None, feature_weights=None, decay=None, scale=None,
                               initial_state=None, beta=None):
    """(o, final state) in float64 by the recurrence above, one token at a time.

    ``decay``: log decay (B, N, H) or (B, N, H, F); ``beta``: a per-(batch, token, head) factor on each
    token's contribution beta_t phi_k(k_t) v_t^T (Mamba-2's dt); ``feature_weights``: Hedgehog's W, one
    (Hqk, Dk, F/2) tensor for q and k or a pair (W_q, W_k); ``scale`` defaults to Dk^-0.5 (1 for Hedgehog).
    Returns o (B, N, H, Dv) and S (B, H, F, Dv), both float64."""
    f64 = torch.float64
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    B, N, Hqk, Dk = q.shape
    H, Dv = v.shape[2], v.shape[3]
    group = H // Hqk
    if scale is None:
        scale = 1.0 if feature_map == "hedgehog" else Dk ** -0.5
    q_heads, k_heads = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    if feature_map == "based":
        phi_q, phi_k, out_scale = based_features(q_heads, scale), based_features(k_heads), 1.0
    elif feature_map == "hedgehog":
        wq, wk = feature_weights if isinstance(feature_weights, (tuple, list)) else (feature_weights,) * 2
        phi_q = hedgehog_features(q_heads, wq.to(f64).repeat_interleave(group, dim=0))
        phi_k = hedgehog_features(k_heads, wk.to(f64).repeat_interleave(group, dim=0))
        out_scale = scale
    else:
        phi_q, phi_k, out_scale = q_heads, k_heads, scale
    if beta is not None:  # a factor on each token's contribution beta_t phi(k_t) v_t^T
        phi_k = phi_k * beta.to(f64)[..., None]
    Fdim = phi_q.shape[-1]
    state = torch.zeros(B, H, Fdim, Dv, dtype=f64, device=q.device) if initial_state is None \
        else initial_state.to(f64).clone()
    out = torch.empty(B, N, H, Dv, dtype=f64, device=q.device)
    for t in range(N):
        if decay is not None:
            g = decay[:, t].to(f64)  # (B, H) or (B, H, F)
            factor = g.exp()[..., None, None] if g.dim() == 2 else g.exp()[..., None]
            state = state * factor
        state = state + phi_k[:, t, :, :, None] * v[:, t, :, None, :]
        out[:, t] = out_scale * torch.einsum("bhf,bhfv->bhv", phi_q[:, t], state)
    return out, state


def mamba2_reference(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, initial_states=None,
                     dt_limit=(0.0, float("inf"))):
    """mamba_ssm's ``mamba_chunk_scan_combined`` as its recurrence, in float64: (y, final states).

    x (b, n, h, p), dt (b, n, h), A (h,), B and C (b, n, g, s) with h a multiple of g; D (h,) or (h, p);
    z (b, n, h, p); dt_bias (h,); initial states (b, h, p, s). Per token, dt = clamp(softplus?(dt +
    dt_bias), dt_limit); the head's state h_t = exp(dt A) h_{t-1} + dt x_t B_t^T (p, s);
    y_t = h_t C_t + D x_t, and with z, y_t * silu(z_t). Returns y (b, n, h, p) and h (b, h, p, s)."""
    f64 = torch.float64
    x, dt, A, B, C = (t.to(f64) for t in (x, dt, A, B, C))
    b, n, h, p = x.shape
    group = h // B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(f64)
    if dt_softplus:
        dt = F.softplus(dt)  # linear past 20, as mamba's
    dt = dt.clamp(dt_limit[0], dt_limit[1])
    Bh, Ch = B.repeat_interleave(group, dim=2), C.repeat_interleave(group, dim=2)
    state = torch.zeros(b, h, p, B.shape[-1], dtype=f64, device=x.device) if initial_states is None \
        else initial_states.to(f64).clone()
    y = torch.empty(b, n, h, p, dtype=f64, device=x.device)
    for t in range(n):
        decay = torch.exp(dt[:, t] * A)  # (b, h)
        state = state * decay[..., None, None] + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        y[:, t] = torch.einsum("bhps,bhs->bhp", state, Ch[:, t])
    if D is not None:
        Dd = D.to(f64)
        y = y + x * (Dd[:, None] if Dd.dim() == 1 else Dd)
    if z is not None:
        y = y * F.silu(z.to(f64))
    return y, state

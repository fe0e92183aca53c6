"""Held-out loss under each attention precision, Q/K activation statistics, and outlier injection.

Every precision is evaluated on the same weights and the same held-out windows; comparisons are
paired (the per-window loss difference against bf16), so the noise of which windows were drawn
cancels and what is left is the precision's own effect. Its standard error and bootstrap interval
are taken over blocks of consecutive windows (windows of one file are correlated).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from model import GPT, AttentionFn, attention_function  # the example's folder is on sys.path (train.py puts it there)


def _autocast(device: torch.device, dtype: Optional[torch.dtype]):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def window_losses(model: GPT, windows: torch.Tensor, *, batch: int, device: torch.device,
                  autocast_dtype: Optional[torch.dtype] = None, seconds: Optional[float] = None) -> torch.Tensor:
    """Mean loss (nats per byte) of each window, (n,) float64, in window order; the model's current
    attention. Stops early (fewer windows) ``seconds`` after the first batch (which compiles the
    kernels: not counted); halves the batch on CUDA out-of-memory."""
    model.eval()
    out = []
    i = 0
    deadline = None
    with torch.no_grad(), _autocast(device, autocast_dtype):
        while i < windows.shape[0]:
            if deadline is not None and time.perf_counter() > deadline:
                break
            chunk = windows[i:i + batch].to(device, non_blocking=True)
            try:
                out.append(model.loss(chunk[:, :-1], chunk[:, 1:], reduction="row").double().cpu())
            except torch.cuda.OutOfMemoryError:
                if batch == 1:
                    raise
                batch //= 2
                torch.cuda.empty_cache()
                print(f"  out of memory in evaluation: batch halved to {batch}", flush=True)
                continue
            i += chunk.shape[0]
            if deadline is None and seconds is not None:
                deadline = time.perf_counter() + seconds
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


class QKStatistics:
    """A ``qk_hook`` that records, per layer, each channel's max |x| and sum of squares over every
    token seen, of Q and of K as attention receives them (after rotary and any injection). A channel
    is (head, dim): heads * head_dim of them."""

    def __init__(self):
        self.layers: dict[int, dict[str, torch.Tensor]] = {}

    def __call__(self, q, k, layer):
        entry = self.layers.setdefault(layer, {})
        for name, t in (("q", q), ("k", k)):
            x = t.detach().double().transpose(1, 2).flatten(0, 1).flatten(1)  # (batch * tokens, heads * head_dim)
            absmax, sumsq = x.abs().amax(0), x.square().sum(0)
            if name in entry:
                entry[name] = (torch.maximum(entry[name][0], absmax), entry[name][1] + sumsq, entry[name][2] + x.shape[0])
            else:
                entry[name] = (absmax, sumsq, x.shape[0])
            entry["shape"] = (t.shape[1], t.shape[3])
        return q, k

    def summary(self, top: int = 3) -> list[dict]:
        """Per layer, for Q and K: ``max_over_rms`` (the largest |x| over the RMS of all the layer's
        entries: an outlier-free Gaussian gives about 4-5 at these counts), ``head_max_over_rms`` (the
        worst head's: per-head FP8 scales see this one), ``channel_rms_ratio`` (the largest channel
        RMS over the median channel's: outlier channels make it large), and the top channels by max |x|
        as (head, dim, max |x| / RMS)."""
        out = []
        for layer in sorted(self.layers):
            entry, row = self.layers[layer], {"layer": layer}
            heads, head_dim = entry["shape"]
            for name in ("q", "k"):
                absmax, sumsq, count = entry[name]
                rms_channel = (sumsq / count).sqrt()  # (heads * head_dim,)
                rms_all = (sumsq.sum() / (count * sumsq.numel())).sqrt().clamp_min(1e-30)
                rms_head = (sumsq.view(heads, head_dim).sum(1) / (count * head_dim)).sqrt().clamp_min(1e-30)
                head_ratio = absmax.view(heads, head_dim).amax(1) / rms_head
                order = absmax.argsort(descending=True)[:top]
                row[name] = {
                    "rms": float(rms_all),
                    "max_over_rms": float(absmax.max() / rms_all),
                    "head_max_over_rms": float(head_ratio.max()),
                    "channel_rms_ratio": float(rms_channel.max() / rms_channel.median().clamp_min(1e-30)),
                    "top_channels": [(int(c) // head_dim, int(c) % head_dim, round(float(absmax[c] / rms_all), 2))
                                     for c in order],
                }
            out.append(row)
        return out


@dataclass
class OutlierInjection:
    """A ``qk_hook`` that scales a few channels of Q and K, per (layer, head), chosen at random from a
    seeded generator (the same channels every run).

    * ``balanced``: for each of ``pairs`` pairs of channels (a, b) per head, Q[a] and K[b] times
      ``factor``, Q[b] and K[a] divided by it. Every channel's product Q[c] K[c] is unchanged, so
      Q K^T, and the model's function, are the same in exact arithmetic: both Q and K get outlier
      channels ``factor`` times their natural size, and any loss change is the arithmetic's alone
      (bf16 barely moves; FP8's per-head scale is set by the outlier and the other channels lose
      precision).
    * ``scaled``: ``pairs`` channels per head, the same channel of Q and of K times ``factor``. The
      model's function changes (that channel's share of each logit grows by factor^2), so it is a
      different model: it is compared against its own bf16, never against the clean model's.
    """
    mode: str = "balanced"
    factor: float = 16.0
    pairs: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.mode not in ("balanced", "scaled"):
            raise ValueError(f"OutlierInjection: mode must be 'balanced' or 'scaled', got {self.mode!r}")
        if not self.factor > 0:
            raise ValueError(f"OutlierInjection: factor must be positive, got {self.factor}")
        self._scales: dict = {}

    def scales(self, layer: int, heads: int, head_dim: int):
        """(q_scale, k_scale), each (heads, head_dim) float64, for one layer."""
        key = (layer, heads, head_dim)
        if key not in self._scales:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + layer)
            q_scale = torch.ones(heads, head_dim, dtype=torch.float64)
            k_scale = torch.ones(heads, head_dim, dtype=torch.float64)
            per_head = 2 * self.pairs if self.mode == "balanced" else self.pairs
            if per_head > head_dim:
                raise ValueError(f"OutlierInjection: {per_head} channels a head exceed head_dim ({head_dim})")
            for h in range(heads):
                chosen = torch.randperm(head_dim, generator=generator)[:per_head]
                if self.mode == "balanced":
                    a, b = chosen[:self.pairs], chosen[self.pairs:]
                    q_scale[h, a], k_scale[h, a] = self.factor, 1 / self.factor
                    q_scale[h, b], k_scale[h, b] = 1 / self.factor, self.factor
                else:
                    q_scale[h, chosen] = k_scale[h, chosen] = self.factor
            self._scales[key] = (q_scale, k_scale)
        return self._scales[key]

    def __call__(self, q, k, layer):  # q, k: (batch, heads, tokens, head_dim)
        q_scale, k_scale = self.scales(layer, q.shape[1], q.shape[3])
        # the product in float32, then back: the injection itself adds one rounding at most
        q = (q.float() * q_scale.to(q.device, torch.float32)[None, :, None, :]).to(q.dtype)
        k = (k.float() * k_scale.to(k.device, torch.float32)[None, :, None, :]).to(k.dtype)
        return q, k

    def describe(self) -> dict:
        return {"mode": self.mode, "factor": self.factor, "pairs": self.pairs, "seed": self.seed}


def chain(*hooks):
    """One qk_hook running ``hooks`` in order (None entries skipped)."""
    hooks = [h for h in hooks if h is not None]

    def run(q, k, layer):
        for h in hooks:
            q, k = h(q, k, layer)
        return q, k
    return run if hooks else None


def compare(losses: dict[str, torch.Tensor], reference: str = "bf16", block: int = 8,
            boots: int = 2000, seed: int = 0) -> dict:
    """Mean loss and perplexity of each attention, and each one's paired difference from
    ``reference`` on the windows all of them evaluated (the first n): the mean difference in nats,
    its standard error over blocks of ``block`` consecutive windows, the relative perplexity change
    exp(mean difference) - 1 and its 95% block-bootstrap interval (``boots`` resamples, seeded)."""
    n = min(t.numel() for t in losses.values())
    out = {"windows": n, "reference": reference, "block_windows": min(block, n), "by_attention": {}}
    if n == 0:
        return out
    block = min(block, n)  # fewer windows than a block: single windows are the units
    units = n // block  # the trailing n % block windows are in the means, not in the blocks
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, units, (boots, units), generator=generator)

    def blocked(t):  # (units,) block means
        return t[:units * block].view(units, block).mean(1)

    for name, t in losses.items():
        t = t[:n]
        blocks = blocked(t)
        se = float(blocks.std() / math.sqrt(blocks.numel())) if blocks.numel() > 1 else float("nan")
        mean = float(t.mean())
        row = {"loss": mean, "loss_se": se, "bits_per_byte": mean / math.log(2), "perplexity": math.exp(mean)}
        if name != reference and reference in losses:
            d = t - losses[reference][:n]
            d_blocks = blocked(d)
            d_mean = float(d.mean())
            d_se = float(d_blocks.std() / math.sqrt(d_blocks.numel())) if d_blocks.numel() > 1 else float("nan")
            boot = d_blocks[picks].mean(1).exp() - 1
            row.update({"diff": d_mean, "diff_se": d_se, "rel_ppl": math.exp(d_mean) - 1,
                        "rel_ppl_ci95": [float(boot.quantile(0.025)), float(boot.quantile(0.975))]})
        out["by_attention"][name] = row
    return out


def evaluate(model: GPT, windows: torch.Tensor, attentions: dict[str, Union[str, AttentionFn]], *,
             batch: int, device: torch.device, autocast_dtype: Optional[torch.dtype] = None,
             qk_hook: Optional[Callable] = None, seconds_each: Optional[float] = None,
             reference: str = "bf16", fallback_reference: str = "sdpa", log=print) -> dict:
    """Every attention in ``attentions`` (name -> kind or callable) on the same weights and windows
    (with ``qk_hook`` on Q and K, e.g. an OutlierInjection); ``compare`` of their per-window losses
    against ``reference`` (``fallback_reference`` if that one failed). A failing attention is
    reported under ``errors`` and the others go on; each pass stops ``seconds_each`` after its first
    batch. The model's attention and hook are restored afterwards."""
    saved_fn, saved_kind, saved_hook = model.attention.fn, model.attention.kind, model.attention.qk_hook
    losses, errors, seconds = {}, {}, {}
    try:
        for name, kind in attentions.items():
            began = time.perf_counter()
            try:
                model.attention.set(kind)
                model.attention.qk_hook = qk_hook
                losses[name] = window_losses(model, windows, batch=batch, device=device,
                                             autocast_dtype=autocast_dtype, seconds=seconds_each)
                if not torch.isfinite(losses[name]).all():
                    log(f"  {name}: {int((~torch.isfinite(losses[name])).sum())} windows with a non-finite loss")
            except Exception as e:  # noqa: BLE001 -- report it, evaluate the others
                errors[name] = f"{type(e).__name__}: {e}"
                log(f"  {name}: failed: {errors[name][:300]}")
            seconds[name] = round(time.perf_counter() - began, 2)
    finally:
        model.attention.fn, model.attention.kind, model.attention.qk_hook = saved_fn, saved_kind, saved_hook
    if reference not in losses and fallback_reference in losses:
        log(f"  {reference} failed: differences are taken against {fallback_reference}")
        reference = fallback_reference
    result = compare(losses, reference=reference) if losses else {"windows": 0, "by_attention": {}}
    result["errors"], result["seconds"] = errors, seconds
    return result


def qk_statistics(model: GPT, windows: torch.Tensor, *, batch: int, device: torch.device,
                  autocast_dtype: Optional[torch.dtype] = None, qk_hook: Optional[Callable] = None,
                  attention: Union[str, AttentionFn] = "sdpa") -> list[dict]:
    """QKStatistics.summary() over ``windows`` (run with ``attention``: statistics do not depend on it),
    after ``qk_hook`` if given (an injection's outliers show)."""
    stats = QKStatistics()
    saved_fn, saved_kind, saved_hook = model.attention.fn, model.attention.kind, model.attention.qk_hook
    try:
        model.attention.set(attention)
        model.attention.qk_hook = chain(qk_hook, stats)
        window_losses(model, windows, batch=batch, device=device, autocast_dtype=autocast_dtype)
    finally:
        model.attention.fn, model.attention.kind, model.attention.qk_hook = saved_fn, saved_kind, saved_hook
    return stats.summary()


class AttentionErrors:
    """An attention (for the switch) that, at every layer, runs each candidate attention on the Q, K,
    V that layer produced and records its output's error against float64 attention on the same
    inputs, rel-RMSE ||o - o64|| / ||o64||; it returns the ``follow`` attention's output, so every
    layer sees what the model with that attention computes. FlashAttention-3's accuracy measure, on
    the model's own activations."""

    def __init__(self, model: GPT, candidates: dict[str, Union[str, AttentionFn]], follow: str = "bf16"):
        self.switch = model.attention
        self.candidates = {name: attention_function(kind) for name, kind in candidates.items()}
        self.follow = follow
        self.sums: dict[tuple[int, str], list[float]] = {}  # (layer, name) -> [squared error, squared norm]
        self.errors: dict[str, str] = {}

    def __call__(self, q, k, v):
        with torch.autocast(q.device.type, enabled=False):
            exact = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
            followed = None
            for name, fn in self.candidates.items():
                if name in self.errors:
                    continue
                try:
                    o = fn(q, k, v)
                except Exception as e:  # noqa: BLE001 -- report it, measure the others
                    self.errors[name] = f"{type(e).__name__}: {e}"
                    continue
                entry = self.sums.setdefault((self.switch.layer, name), [0.0, 0.0])
                entry[0] += float((o.double() - exact).square().sum())
                entry[1] += float(exact.square().sum())
                if name == self.follow:
                    followed = o
        return followed if followed is not None else exact.to(q.dtype)

    def summary(self) -> list[dict]:
        """Per layer: {"layer": i, name: rel-RMSE, ...}."""
        rows = {}
        for (layer, name), (err, norm) in sorted(self.sums.items()):
            rows.setdefault(layer, {"layer": layer})[name] = math.sqrt(err / norm) if norm > 0 else float("nan")
        return [rows[layer] for layer in sorted(rows)]


def attention_errors(model: GPT, windows: torch.Tensor, candidates: dict[str, Union[str, AttentionFn]], *,
                     batch: int, device: torch.device, autocast_dtype: Optional[torch.dtype] = None,
                     qk_hook: Optional[Callable] = None, follow: str = "bf16") -> dict:
    """AttentionErrors over ``windows`` (a few: float64 attention is materialized), after ``qk_hook``."""
    probe = AttentionErrors(model, candidates, follow=follow)
    saved_fn, saved_kind, saved_hook = model.attention.fn, model.attention.kind, model.attention.qk_hook
    try:
        model.attention.fn, model.attention.qk_hook = probe, qk_hook
        window_losses(model, windows, batch=batch, device=device, autocast_dtype=autocast_dtype)
    finally:
        model.attention.fn, model.attention.kind, model.attention.qk_hook = saved_fn, saved_kind, saved_hook
    return {"rel_rmse": probe.summary(), "errors": probe.errors, "windows": int(windows.shape[0])}

"""A small GPT over bytes whose attention is a switch: tilecore's bf16 attention, its FP8 attention
(plain, or with Q and K rotated by a random-sign Hadamard transform first), or torch's SDPA.

Pre-norm blocks: RMSNorm, causal self-attention with rotary positions (half-split, base 10000),
RMSNorm, a GELU MLP (4x). Default size: 8 layers, width 512, 8 heads of 64, context 1024 (about
25M parameters). Attention tensors are (batch, heads, tokens, head_dim), the layout
``tilecore.attention`` takes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # causal (q, k, v) -> o
# (q, k, layer) -> (q, k), applied after rotary, right before attention (statistics, outlier injection)
QKHook = Callable[[torch.Tensor, torch.Tensor, int], tuple]

ATTENTION_KINDS = ("bf16", "fp8", "fp8_rotate", "sdpa")


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    layers: int = 8
    width: int = 512
    heads: int = 8
    context: int = 1024
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def _tilecore_bf16(q, k, v):
    import tilecore
    return tilecore.attention(q, k, v, causal=True)


def _tilecore_fp8(rotate: bool) -> AttentionFn:
    # imported when asked for: the example's other paths do not need the FP8 kernels
    from tilecore.ops.attention_fp8 import attention_fp8_rotated

    def attend(q, k, v):
        # bf16 in (float32 on the CPU): it rotates and quantizes Q, K, V itself; O in q's dtype.
        # Autocast off: the quantizer's own arithmetic is not autocast's to recast
        with torch.autocast(q.device.type, enabled=False):
            return attention_fp8_rotated(q, k, v, causal=True, rotate=rotate)
    return attend


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_function(kind: Union[str, AttentionFn]) -> AttentionFn:
    """The causal attention a kind names: ``bf16`` tilecore.attention (in the model's compute dtype:
    bf16 on the GPU, float32 on the CPU), ``fp8`` tilecore's FP8 attention (quantize, attend),
    ``fp8_rotate`` the same after a random-sign Hadamard rotation of Q and K, ``sdpa`` torch's
    scaled_dot_product_attention. A callable is taken as it is."""
    if callable(kind):
        return kind
    if kind == "bf16":
        return _tilecore_bf16
    if kind == "fp8":
        return _tilecore_fp8(rotate=False)
    if kind == "fp8_rotate":
        return _tilecore_fp8(rotate=True)
    if kind == "sdpa":
        return _sdpa
    raise ValueError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)} or a callable (q, k, v) -> o; "
                     f"got {kind!r}")


class AttentionSwitch:
    """What every layer's attention calls (shared by the layers, not a module: it holds no weights).
    ``set`` changes the attention; ``qk_hook`` sees (and may replace) Q and K right before it."""

    def __init__(self, kind: Union[str, AttentionFn] = "bf16"):
        self.qk_hook: Optional[QKHook] = None
        self.layer = -1
        self.set(kind)

    def set(self, kind: Union[str, AttentionFn]) -> None:
        self.fn = attention_function(kind)
        self.kind = kind if isinstance(kind, str) else getattr(kind, "__name__", "callable")

    def __call__(self, q, k, v, layer: int):
        self.layer = layer  # which layer is calling (for probes that keep per-layer records)
        if self.qk_hook is not None:
            q, k = self.qk_hook(q, k, layer)
        return self.fn(q, k, v)


def rotary_tables(context: int, head_dim: int, base: float = 10000.0):
    """cos, sin: (context, head_dim // 2) float32, for half-split rotary (channel i pairs with i + D/2)."""
    inv_freq = base ** (-torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim)
    angles = torch.arange(context, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x, cos, sin):
    """x: (batch, heads, tokens, head_dim); cos, sin: (tokens, head_dim // 2). Computed in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int, switch: AttentionSwitch):
        super().__init__()
        self.layer, self.heads, self.head_dim = layer, config.heads, config.head_dim
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=False)
        self.proj = nn.Linear(config.width, config.width, bias=False)
        self.switch = [switch]  # in a list: not a submodule, and shared

    def forward(self, x, cos, sin, compute_dtype):  # x: (batch, tokens, width)
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (b, heads, n, d) each
        q, k = apply_rotary(q, cos[:n], sin[:n]), apply_rotary(k, cos[:n], sin[:n])
        q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
        o = self.switch[0](q, k, v, self.layer)  # (b, heads, n, d)
        return self.proj(o.transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int, switch: AttentionSwitch):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(config.width), nn.RMSNorm(config.width)
        self.attention = CausalSelfAttention(config, layer, switch)
        hidden = config.mlp_ratio * config.width
        self.mlp = nn.Sequential(nn.Linear(config.width, hidden, bias=False), nn.GELU(),
                                 nn.Linear(hidden, config.width, bias=False))

    def forward(self, x, cos, sin, compute_dtype):
        x = x + self.attention(self.norm1(x), cos, sin, compute_dtype)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """tokens (batch, tokens) int64 -> logits (batch, tokens, vocab). ``compute_dtype``: the dtype
    Q, K and V are cast to before attention (bf16 under autocast on the GPU, float32 on the CPU)."""

    def __init__(self, config: GPTConfig, attention: Union[str, AttentionFn] = "bf16",
                 compute_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if config.width % config.heads or config.head_dim % 2:
            raise ValueError(f"GPT: width ({config.width}) must divide into heads ({config.heads}) of an even head_dim")
        self.config, self.compute_dtype = config, compute_dtype
        self.attention = AttentionSwitch(attention)
        self.embed = nn.Embedding(config.vocab, config.width)
        self.blocks = nn.ModuleList(Block(config, i, self.attention) for i in range(config.layers))
        self.norm = nn.RMSNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        cos, sin = rotary_tables(config.context, config.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._init_weights()

    def _init_weights(self):
        # GPT-2's: N(0, 0.02), the residual branches' output projections scaled by 1 / sqrt(2 layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.config.layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, tokens):
        if tokens.shape[1] > self.config.context:
            raise ValueError(f"GPT: {tokens.shape[1]} tokens exceed the context ({self.config.context})")
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin, self.compute_dtype)
        return self.head(self.norm(x))

    def loss(self, inputs, targets, reduction: str = "mean"):
        """Cross-entropy in float32, nats per byte: a scalar, or (batch,) per-row means with reduction='row'."""
        logits = self(inputs).float()
        per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
        return per_token.mean(dim=1) if reduction == "row" else per_token.mean()

"""``attention_fp8``: FP8 (e4m3) attention forward, its checks and its custom-op registration.

Forward only (inference, as FlashAttention-3's FP8 path): there is no gradient, and a call that
would record one is refused.
"""
from __future__ import annotations

import math
import numbers

import torch

from tilecore import dispatch
from tilecore.ops.attention_fp8 import launch
from tilecore.ops.attention_fp8.reference import KEY_CHUNK, SCALE_BLOCK
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import LRU, SignatureMemo
from tilecore.tiles.launch import signature  # noqa: F401 (_CALL_KEY's misses: SignatureMemo reads it from globals)
from tilecore.tiles.switches import generation

# the keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_CALL_KEY = SignatureMemo(globals())

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16)
CPU_OUT_DTYPES = OUT_DTYPES + (torch.float32,)
MAX_HEAD_DIM = 256
LAYOUT = ("attention_fp8 takes q as (batch, heads, queries, head_dim) and k, v as (batch, kv_heads, keys, head_dim), "
          "as tilecore.attention; flash-attn's (batch, seqlen, heads, head_dim) tensors go in as .transpose(1, 2)")
FORWARD_ONLY = ("attention_fp8 is forward-only (inference, as FlashAttention-3's FP8 path): FP8 attention has no "
                "backward. Call it under torch.no_grad() / torch.inference_mode(), or use tilecore.attention in "
                "bf16/fp16 to train")


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _scale_shapes(B: int, H: int, rows: int, what: str) -> list[tuple]:
    blocks = [(B, H), (B, H, math.ceil(rows / SCALE_BLOCK))]
    return blocks + [(B, H, rows)] if what != "v" else blocks


def check_scale(scale, what: str, B: int, H: int, rows: int, device, values: bool = True) -> None:
    """A descale: a float32 tensor on the inputs' device of one of the accepted shapes, with ``values``
    every value finite and > 0 (checked on the host: one synchronization)."""
    shapes = _scale_shapes(B, H, rows, what)
    accepted = " or ".join(str(s) for s in shapes)
    meaning = (f"per (batch, kv head) or per block of {SCALE_BLOCK} keys" if what == "v" else
               f"per (batch, head), per block of {SCALE_BLOCK} {'queries' if what == 'q' else 'keys'}, or per "
               f"{'query' if what == 'q' else 'key'}")
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        got = _name(scale.dtype) if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise TypeError(f"attention_fp8: {what}_scale must be a float32 tensor of shape {accepted} ({meaning}: the "
                        f"dequantized {what} is {what}8 * {what}_scale); got {got}")
    if tuple(scale.shape) not in shapes:
        raise ValueError(f"attention_fp8: {what}_scale must have shape {accepted} ({meaning}); got {tuple(scale.shape)}")
    if scale.device != device:
        raise ValueError(f"attention_fp8: {what}_scale must be on the inputs' device {device}; got {scale.device}")
    if scale.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(FORWARD_ONLY)
    if values and scale.device.type != "meta" and not torch.compiler.is_compiling() and not dispatch.capturing(scale.device) \
            and scale.numel() and not bool(((scale > 0) & torch.isfinite(scale)).all()):
        raise ValueError(f"attention_fp8: {what}_scale must be finite and > 0 (a descale: amax / 448 of what "
                         f"was quantized); got min {scale.min().item():g}, max {scale.max().item():g}")


V_LAYOUTS = ("bhnd", "keys_permuted")


def check(q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype, v_layout="bhnd",
          check_scales=True) -> float:
    """Raise TypeError/ValueError naming what is accepted; returns the softmax scale."""
    if v_layout not in V_LAYOUTS:
        raise ValueError(f"attention_fp8: v_layout must be 'bhnd' (v as (B, Hkv, Nk, D)) or 'keys_permuted' (v as "
                         f"quantize_fp8(v, layout='keys_permuted') writes it); got {v_layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention_fp8: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention_fp8: q, k and v must be 4-D; got {name} of shape {tuple(t.shape)} ({LAYOUT})")
        if t.dtype != FP8:
            raise TypeError(f"attention_fp8: q, k and v must be float8_e4m3fn (e4m3 codes; their descales come as "
                            f"q_scale, k_scale, v_scale); got {name} in {_name(t.dtype)}. bf16/fp16 tensors: "
                            f"attention_fp8_rotated (quantizes them) or tilecore.attention")
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(FORWARD_ONLY)
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention_fp8: q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    dispatch.backend_for(q.device)  # raises for devices tilecore does not run on
    if q.device.type != "cpu" and not dispatch.fp8_ok(q.device):  # a GPU's (a meta tensor: the GPU pretend describes)
        raise RuntimeError("attention_fp8 needs e4m3 tensor cores (NVIDIA sm_89 or later: Ada, Hopper); "
                           "this GPU has none: use tilecore.attention in bf16/fp16")
    if v_layout == "keys_permuted":
        B, Hkv, Nk, D = k.shape
        want = (B, Hkv, D, -(-Nk // KEY_CHUNK) * KEY_CHUNK)
        if tuple(v.shape) != want or not v.is_contiguous():
            raise ValueError(f"attention_fp8: v in v_layout 'keys_permuted' is the contiguous (batch, kv_heads, "
                             f"head_dim, keys rounded up to {KEY_CHUNK}) tensor quantize_fp8(v, layout='keys_permuted') "
                             f"writes: {want} for k of shape {tuple(k.shape)}; got {tuple(v.shape)}")
    elif k.shape != v.shape:
        raise ValueError(f"attention_fp8: k and v must have the same shape (batch, kv_heads, keys, head_dim); "
                         f"got k {tuple(k.shape)} and v {tuple(v.shape)} ({LAYOUT})")
    B, Hq, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention_fp8: k and v must have q's batch ({B}) and head_dim ({D}); got k of shape "
                         f"{tuple(k.shape)} and q of shape {tuple(q.shape)} ({LAYOUT})")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"attention_fp8: head_dim must be from 1 to {MAX_HEAD_DIM} (64 and 128 are the fast ones); "
                         f"got {D} ({LAYOUT})")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"attention_fp8: q's heads ({Hq}) must be a multiple of k's and v's heads ({Hkv}) "
                         f"(grouped-query attention); got q {tuple(q.shape)}, k {tuple(k.shape)} ({LAYOUT})")
    check_scale(q_scale, "q", B, Hq, N, q.device, False)
    check_scale(k_scale, "k", B, Hkv, Nk, q.device, False)
    check_scale(v_scale, "v", B, Hkv, Nk, q.device, False)
    if check_scales:
        check_scale_values(q_scale, k_scale, v_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"attention_fp8: causal must be True or False, got {causal!r}")
    compiled = q.device.type == "cuda"
    dtypes = OUT_DTYPES if compiled else CPU_OUT_DTYPES
    if out_dtype not in dtypes:
        raise TypeError(f"attention_fp8: out_dtype must be one of {', '.join(map(_name, dtypes))}"
                        f"{' on the GPU' if compiled else ''}; got {out_dtype!r}")
    if softmax_scale is None:
        return D ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"attention_fp8: softmax_scale must be None (head_dim ** -0.5) or a finite number > 0; "
                         f"got {softmax_scale!r}")
    return float(softmax_scale)


def check_scale_values(q_scale, k_scale, v_scale) -> None:
    """The three descales' value checks (finite, > 0) in one synchronization (none while compiling or
    capturing)."""
    device = q_scale.device
    if device.type != "meta" and not torch.compiler.is_compiling() and not dispatch.capturing(device):
        ok = torch.stack([((s > 0) & torch.isfinite(s)).all() for s in (q_scale, k_scale, v_scale)]).tolist()
        for good, scale, what in zip(ok, (q_scale, k_scale, v_scale), "qkv"):
            if not good:
                rows = scale.shape[2] * (SCALE_BLOCK if what == "v" else 1) if scale.dim() == 3 else 0
                check_scale(scale, what, scale.shape[0], scale.shape[1], rows, device)


def _impl(q, k, v, q_scale, k_scale, v_scale, causal: bool, softmax_scale: float, out_dtype: torch.dtype,
          v_permuted: bool, key=None):
    if q.numel() == 0 or k.shape[2] == 0:
        out = torch.zeros(q.shape, dtype=out_dtype, device=q.device)
        return out, torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    bind = key is not None and tiles_launch.BIND_KEYED_LAUNCHES
    recipe = launch._FP8_LAUNCHES.get(key) if bind else None
    if recipe:  # the key's launch as its first call prepared it
        return recipe(q, k, v, q_scale, k_scale, v_scale)
    p = _PLANS.memo(key, lambda: launch.plan(q, k, causal))
    if bind and recipe is None:
        recipe = launch.prepared(key, p, q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype,
                                 v_permuted)
        if recipe:
            return recipe(q, k, v, q_scale, k_scale, v_scale)
    return launch.forward(p, q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype, v_permuted, key=key)


# The eager host path (issue 31): a CUDA call's signature (with no tensor that would record a gradient: the
# checks refuse those) finds its checks' result (_CHECKED; the descales' values are still checked each call
# unless check_scales=False), its plan (_PLANS) and its launch (by key)
_CHECKED = LRU(256)  # a call's key -> its softmax scale
_PLANS = LRU(256)  # a call's key (with tiles.switches.generation: plans read configs) -> its launch.Plan


@torch.library.custom_op("tilecore::attention_fp8", mutates_args=())
def _attention_fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_scale: torch.Tensor,
                      k_scale: torch.Tensor, v_scale: torch.Tensor, causal: bool, softmax_scale: float,
                      out_dtype: torch.dtype, v_permuted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _impl(q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype, v_permuted)


@_attention_fp8_op.register_fake
def _(q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype, v_permuted):
    return q.new_empty(q.shape, dtype=out_dtype), q.new_empty(q.shape[:3], dtype=torch.float32)


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_scale: torch.Tensor, k_scale: torch.Tensor,
                  v_scale: torch.Tensor, causal: bool = False, softmax_scale: float | None = None,
                  out_dtype: torch.dtype = torch.bfloat16, return_lse: bool = False, v_layout: str = "bhnd",
                  check_scales: bool = True):
    """softmax(softmax_scale q k^T) v on e4m3 inputs, FlashAttention-3's FP8 forward.

    Layout (B, H, N, D), as tilecore.attention: q (batch, heads, queries, head_dim), k and v (batch,
    kv_heads, keys, head_dim), all ``torch.float8_e4m3fn``, Hq a multiple of Hkv (GQA / MQA); any
    strides. The Hopper kernel reads V as V^T, keys contiguous (e4m3 wgmma takes shared operands
    K-major, and P V's reduction runs over keys), with keys permuted within each 32 so that P goes
    from the accumulator's layout to the register operand's without leaving its thread
    (reference.key_position): ``v_layout="keys_permuted"`` takes v in that layout, (B, Hkv, D,
    ceil(Nk / 32) * 32) as ``quantize_fp8(v, layout="keys_permuted")`` writes it (no copy); with the
    default "bhnd" v is (B, Hkv, Nk, D) and the Hopper path copies it to that layout first (one pass
    over v's bytes).

    Descales (float32; the dequantized tensor is codes x descale): ``q_scale`` (B, Hq) per (batch,
    head), (B, Hq, ceil(N / 128)) per block of 128 queries, or (B, Hq, N) per query; ``k_scale`` the
    same over (B, Hkv) and Nk keys; ``v_scale`` (B, Hkv) per (batch, kv head) or (B, Hkv, ceil(Nk / 128)) per block
    of 128 keys (the kernels fold a block's descale into O's rescale once a step; a per-key v scale would sit inside
    P V's sum, so there is none). Every value finite and > 0: checked with one host synchronization a
    call, which on a GPU costs the call its overlap with the previous ones (at short sequences the
    call's time); ``check_scales=False`` skips it where the scales come from a quantizer
    (attention_fp8_rotated's do).

    Math: scores in float32 from exact e4m3 products, online softmax in base 2, P rounded to e4m3 as
    256 p (p <= 1, FlashAttention-3's scaling; reference.py), P V accumulated in float32, O = acc x
    v_scale / l with l the float32 sum of 256 p. Hopper's kernel (head_dim 64, 128) differs in P: e4m3's linear code
    of 2^x (one multiply-add, no exp2: 0.96-1.11x of 2^x; reference.linear_e4m3, configs ``p_linear``), with l the sum
    of those codes (O's error ~1.3x the rounded exp2's; lse corrected by the codes' mean): 1.2-1.3x faster on the
    H100 (notes/attention_fp8). ``causal`` masks query i to keys j <= i + Nk - N
    (bottom right, as tilecore.attention); a row with no key gives 0 (lse -inf). ``softmax_scale``
    defaults to head_dim ** -0.5 and must be > 0. Any N, Nk; head_dim 1..256 (64 and 128 run
    Hopper's Gluon kernel, others the portable Triton kernel). Returns O (B, Hq, N, D) in
    ``out_dtype`` (bfloat16 or float16; float32 too on the CPU) and, with ``return_lse=True``, the
    row log-sum-exp of the scaled scores (float32, (B, Hq, N), natural log).

    CUDA tensors need e4m3 tensor cores (sm_89 on). CPU tensors run the float32 emulation of the
    kernels' math with torch's ops (reference.attention_fp8_emulated), or the Triton kernel in the
    interpreter under TRITON_INTERPRET=1. Not differentiable: a call that would record a gradient
    raises (FP8 is forward-only).
    """
    # one look at the modes (issue 31's host time): "direct" records no gradient
    direct = dispatch.eager_mode(q, k, v, q_scale, k_scale, v_scale) == "direct"
    grad = not direct and torch.is_grad_enabled() and any(getattr(t, "requires_grad", False)
                                                          for t in (q, k, v, q_scale, k_scale, v_scale))
    # (generation: the plan and the launch read configs, so a probe's switches.patched block plans its own)
    key = None if grad else _CALL_KEY(q, k, v, q_scale, k_scale, v_scale, causal is True, causal is False,
                                      softmax_scale, out_dtype, v_layout, generation())
    if key is not None and direct and tiles_launch.BIND_KEYED_LAUNCHES:
        recipe = launch._FP8_LAUNCHES.get(key)  # kept after the key's first (checked) call
        if recipe:
            if check_scales:
                check_scale_values(q_scale, k_scale, v_scale)
            out, lse = recipe(q, k, v, q_scale, k_scale, v_scale)
            return (out, lse) if return_lse else out
    if key is None:
        scale = check(q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype, v_layout, check_scales)
    else:
        scale = _CHECKED.memo(key, lambda: check(q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale,
                                                 out_dtype, v_layout, False))
        if check_scales:
            check_scale_values(q_scale, k_scale, v_scale)
    permuted = v_layout == "keys_permuted"
    if direct:
        out, lse = _impl(q, k, v, q_scale, k_scale, v_scale, causal, scale, out_dtype, permuted, key=key)
    else:
        out, lse = _attention_fp8_op(q, k, v, q_scale, k_scale, v_scale, causal, scale, out_dtype, permuted)
    return (out, lse) if return_lse else out


@torch.library.custom_op("tilecore::attention_fp8_quantize", mutates_args=())
def quantize_inputs_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotate: bool, k_scales: str, quantizer: str,
                       v_amax_kernel: bool, v_scales: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_fp8_rotated's rotate-and-quantize step as one custom op, so that the convenience path traces under
    torch.compile (its kernels are launched directly, not as ops). Its CPU and CUDA kernels are
    quantize.quantize_inputs, registered by the quantize module (which imports this one)."""
    raise NotImplementedError("tilecore::attention_fp8_quantize: import tilecore.ops.attention_fp8 (its quantize "
                              "module registers the kernels)")


@quantize_inputs_op.register_fake
def _(q, k, v, rotate, k_scales, quantizer, v_amax_kernel, v_scales):
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    k_scale_shape = {"tensor": (B, Hkv), "block": (B, Hkv, math.ceil(Nk / SCALE_BLOCK)), "token": (B, Hkv, Nk)}
    f32 = torch.float32
    return (q.new_empty(q.shape, dtype=FP8), q.new_empty((B, H, N), dtype=f32), k.new_empty(k.shape, dtype=FP8),
            k.new_empty(k_scale_shape[k_scales], dtype=f32),
            v.new_empty((B, Hkv, D, -(-Nk // KEY_CHUNK) * KEY_CHUNK), dtype=FP8),
            v.new_empty((B, Hkv) if v_scales == "head" else (B, Hkv, math.ceil(Nk / SCALE_BLOCK)), dtype=f32))

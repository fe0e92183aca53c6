"""Quantizing attention's inputs to e4m3 for attention_fp8, and the convenience path
``attention_fp8_rotated`` (bf16/fp16 in: rotate Q and K, quantize Q, K, V, attend in FP8).

Descale conventions (op.py): codes x descale = the value; descale = amax / 448 (1 where amax = 0).
"""
from __future__ import annotations

import functools
import math

import torch

from tilecore.ops.attention_fp8.op import FORWARD_ONLY, LAYOUT, attention_fp8, quantize_inputs_op
from tilecore import dispatch
from tilecore.ops.attention_fp8 import configs, kernels_tl
from tilecore.ops.attention_fp8.reference import KEY_CHUNK, SCALE_BLOCK, keys_permuted
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import LRU, CachedLaunch, SignatureMemo, next_power_of_2
from tilecore.tiles.switches import generation
from tilecore.tiles.launch import signature  # noqa: F401 (_ROTATED_KEY's misses: SignatureMemo reads it from globals)

E4M3_MAX = 448.0
_QUANTIZE_V = CachedLaunch(kernels_tl.quantize_v_permuted)
_ROTATE_QUANTIZE = CachedLaunch(kernels_tl.rotate_quantize)
_HEAD_AMAX = CachedLaunch(kernels_tl.head_amax)
GRANULARITIES = ("head", "block", "token")
SIGN_SEED = 0x7C0FE8  # the rotation's signs: torch.Generator seeded with SIGN_SEED + head_dim (CPU), cached


def _descale(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_v_permuted(v: torch.Tensor, *, per: str = "head", amax_kernel: bool = False,
                        permute_in_registers: bool = False, key=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, descale) of v (B, H, Nk, D) per (batch, head) into the Hopper kernel's layout (as
    quantize_fp8(v, per="head", layout="keys_permuted")), by one read of v for its amax (torch's
    vector_norm; ``amax_kernel``: kernels_tl.head_amax, atomic maxima) and one tl kernel (read, quantize,
    write transposed and permuted; ``permute_in_registers``: the tile transposed and permuted in registers,
    stored with contiguous addresses) on kernel devices. ``per="block"``: a descale per block of 128
    keys, (B, H, ceil(Nk / 128)) as quantize_fp8(v, per="block", layout="keys_permuted"), computed by the same
    kernel from the block it holds: one read of v, not two. ``key``: the per-block launch's key
    (tiles.launch.CachedLaunch.launch_keyed's contract: the convenience path's recipe)."""
    if per not in ("head", "block"):
        raise ValueError(f"quantize_v_permuted: per must be 'head' or 'block'; got {per!r}")
    B, H, N, D = v.shape
    if dispatch.backend_for(v.device) != "kernel" or N == 0 or D > 256:
        return quantize_fp8(v, per=per, layout="keys_permuted")
    n_out = -(-N // KEY_CHUNK) * KEY_CHUNK
    out = torch.empty((B, H, D, n_out), dtype=torch.float8_e4m3fn, device=v.device)
    block_d = max(16, next_power_of_2(D))
    if per == "block":
        n_scales = -(-N // SCALE_BLOCK)
        descale = torch.empty((B, H, n_scales), dtype=torch.float32, device=v.device)
        if key is not None:  # (the clamp is an option of the launch: a config patched gets its own)
            key = (key, configs.QUANTIZE_CLAMP)
        with dispatch.on_device(v.device):
            _QUANTIZE_V.run(key, (B * H, n_scales), (v, out, descale, *v.stride(), H, N, D, n_out), dict(
                EMULATE_CAST=dispatch.interpreted(v.device), BLOCK_K=SCALE_BLOCK, BLOCK_D=block_d,
                PERMUTE_IN_REGISTERS=permute_in_registers, PER_BLOCK=True, n_scales=n_scales,
                CLAMP=configs.QUANTIZE_CLAMP))
        return out, descale
    if amax_kernel:
        amax = torch.zeros((B, H), dtype=torch.float32, device=v.device)
        rows = 32 if dispatch.interpreted(v.device) else 256
        with dispatch.on_device(v.device):
            _HEAD_AMAX[(B * H, -(-N // rows))](v, amax, *v.stride(), H, N, D, BLOCK_R=rows,
                                              BLOCK_D=block_d)
    else:
        amax = torch.linalg.vector_norm(v, ord=float("inf"), dim=(2, 3), dtype=torch.float32)
    descale = _descale(amax).contiguous()
    block_k = 32 if dispatch.interpreted(v.device) else 128
    with dispatch.on_device(v.device):
        _QUANTIZE_V[(B * H, -(-n_out // block_k))](v, out, descale, *v.stride(), H, N, D, n_out,
                                                    EMULATE_CAST=dispatch.interpreted(v.device), BLOCK_K=block_k,
                                                    BLOCK_D=block_d,
                                                    PERMUTE_IN_REGISTERS=permute_in_registers)
    return out, descale


def quantize_fp8(x: torch.Tensor, *, per: str = "head", layout: str = "bhnd"):
    """(codes, descale) of a (B, H, N, D) tensor in e4m3, saturating: descale = amax / 448 per (batch,
    head) (``per="head"``: descale (B, H)), per block of 128 rows (``"block"``: (B, H, ceil(N / 128))) or
    per row (``"token"``: (B, H, N)); codes = round(x / descale). ``layout="keys_permuted"``: codes
    written as v's layout in the Hopper kernel (reference.keys_permuted: (B, H, D, ceil(N / 32) * 32),
    keys contiguous and permuted within 32s), for ``attention_fp8(..., v_layout="keys_permuted")``."""
    if per not in GRANULARITIES:
        raise ValueError(f"quantize_fp8: per must be one of {', '.join(GRANULARITIES)}; got {per!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.dtype.is_floating_point:
        raise ValueError(f"quantize_fp8 takes a floating-point (B, H, N, D) tensor ({LAYOUT})")
    B, H, N, D = x.shape
    xf = x.float()
    if per == "head":
        descale = _descale(xf.abs().amax(dim=(2, 3)))
        per_row = descale[:, :, None, None]
    elif per == "token":
        descale = _descale(xf.abs().amax(dim=3))
        per_row = descale[..., None]
    else:
        blocks = math.ceil(N / SCALE_BLOCK)
        padded = torch.nn.functional.pad(xf.abs().amax(dim=3), (0, blocks * SCALE_BLOCK - N))
        descale = _descale(padded.view(B, H, blocks, SCALE_BLOCK).amax(dim=3))
        per_row = descale.repeat_interleave(SCALE_BLOCK, dim=2)[:, :, :N, None]
    codes = (xf / per_row).clamp(-E4M3_MAX, E4M3_MAX)
    if layout == "keys_permuted":
        return keys_permuted(codes).to(torch.float8_e4m3fn), descale
    if layout != "bhnd":
        raise ValueError(f"quantize_fp8: layout must be 'bhnd' or 'keys_permuted'; got {layout!r}")
    return codes.to(torch.float8_e4m3fn), descale


@functools.lru_cache(maxsize=None)
def _signs_cpu(head_dim: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SIGN_SEED + head_dim)
    return torch.randint(0, 2, (head_dim,), generator=g).to(torch.float32) * 2 - 1


_SIGNS: dict = {}


def rotation_signs(head_dim: int, device) -> torch.Tensor:
    """The random signs (+-1, float32) of the rotation for ``head_dim``: fixed (seeded by head_dim), one
    copy a device, cached. The same for q and k, so the rotation H diag(s) / sqrt(D) is one orthogonal
    matrix applied to both and q k^T is unchanged."""
    key = (head_dim, str(device))
    if key not in _SIGNS:
        _SIGNS[key] = _signs_cpu(head_dim).to(device)
    return _SIGNS[key]


ROW_SCALES = ("token", "block", "tensor")
_SCALE_MODES = {"token": 0, "block": 1, "tensor": 2}  # kernels_tl.SCALE_ROW, SCALE_BLOCK_ROWS, SCALE_GIVEN


def signed_hadamard(signs: torch.Tensor) -> torch.Tensor:
    """diag(s) H (float32, Sylvester's H): kernels_tl.signed_hadamard, for the torch path."""
    n = signs.numel()
    idx = torch.arange(n, device=signs.device)
    bits = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return (1 - 2 * parity).to(torch.float32) * signs.to(torch.float32)[:, None]


def rotate_quantize(x: torch.Tensor, *, rotate: bool = True, signs: torch.Tensor | None = None,
                    scales: str = "token", descale: torch.Tensor | None = None,
                    config: dict | None = None, key=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, descale): x (B, H, N, D), bf16/fp16 (float32 on the CPU), rotated by y = H (s * x) / sqrt(D) (with
    ``rotate``; s = ``signs``, +-1, or 1) and quantized to e4m3 in one pass, as attention_fp8 takes it:
    codes (B, H, N, D) contiguous, descale = amax / 448 of y (1 where amax = 0) per row (``scales="token"``:
    (B, H, N)), per block of 128 rows (``"block"``: (B, H, ceil(N / 128))), or the ``descale`` given
    (``"tensor"``: a float32 tensor of one element on x's device, returned as it is; read by the kernel on
    the device, so no host sync). codes = y / descale saturated at +-448.

    On kernel devices with e4m3 in Triton (dispatch.fp8_ok; the interpreter) and D a power of two (16..256) one
    tl kernel (kernels_tl.rotate_quantize: the rotation a tensor-core product on the 16-bit inputs, in float32,
    rounded once); else torch's ops (the same math in float32; D as tilecore.hadamard_transform takes it).
    ``config`` (probes): the kernel's ``row_blocks`` (blocks of 128 rows a program), ``num_warps`` and
    ``num_stages`` over configs.ROTATE_QUANTIZE's. ``key``: the kernel's launch key (CachedLaunch.launch_keyed's
    contract: the convenience path's recipe), which the launch's options extend."""
    if scales not in ROW_SCALES:
        raise ValueError(f"rotate_quantize: scales must be one of {', '.join(ROW_SCALES)}; got {scales!r}")
    if (scales == "tensor") != (descale is not None):
        raise ValueError("rotate_quantize: a descale is given with scales='tensor' (and only then)")
    B, H, N, D = x.shape
    signs = torch.ones(D, device=x.device) if signs is None else signs
    pow2 = D >= 16 and D <= 256 and D & (D - 1) == 0
    if dispatch.backend_for(x.device) == "kernel" and pow2 and N > 0 and x.dtype != torch.float64 and (
            dispatch.interpreted(x.device) or dispatch.fp8_ok(x.device)):  # (Triton has no e4m3 below sm_89)
        interp = dispatch.interpreted(x.device)
        codes = torch.empty((B, H, N, D), dtype=torch.float8_e4m3fn, device=x.device)
        n_scales = -(-N // SCALE_BLOCK)
        out_scale = {"token": (B, H, N), "block": (B, H, n_scales)}
        ds = descale.reshape(1).to(torch.float32) if scales == "tensor" else \
            torch.empty(out_scale[scales], dtype=torch.float32, device=x.device)
        cfg = {**configs.rotate_quantize_config(D, interp), **(config or {})}
        row_blocks = cfg["row_blocks"]
        if FILL_SMS and not interp and "row_blocks" not in (config or {}):
            row_blocks = filled_row_blocks(row_blocks, B * H, -(-N // SCALE_BLOCK), x.device)
        if key is not None:  # (the launch's options are part of its key: a config patched gets its own launch)
            key = (key, row_blocks, cfg["num_warps"], cfg.get("num_stages"), configs.QUANTIZE_CLAMP)
        with dispatch.on_device(x.device):
            _ROTATE_QUANTIZE.run(key, (B * H, -(-N // (SCALE_BLOCK * row_blocks))), (
                x, codes, ds, signs.to(torch.float32).contiguous(), *x.stride(), H, N, n_scales, D ** -0.5), dict(
                ROTATE=rotate, SCALE=_SCALE_MODES[scales], UPCAST=interp, BLOCK_R=SCALE_BLOCK, BLOCK_D=D,
                ROW_BLOCKS=row_blocks, CLAMP=configs.QUANTIZE_CLAMP, num_warps=cfg["num_warps"],
                **({"num_stages": cfg["num_stages"]} if "num_stages" in cfg else {})))
        return codes, (descale if scales == "tensor" else ds)
    y = x.to(torch.float32)
    if rotate:
        if pow2:
            y = (y @ signed_hadamard(signs)) * D ** -0.5
        else:
            from tilecore.ops.hadamard import hadamard_transform

            y = hadamard_transform(y * signs.to(torch.float32), scale=D ** -0.5)
    if scales == "tensor":
        return (y / descale.reshape(1).to(torch.float32)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), descale
    codes, ds = quantize_fp8(y, per="token" if scales == "token" else "block")
    return codes, ds


def filled_row_blocks(row_blocks: int, heads: int, head_blocks: int, device) -> int:
    """rotate_quantize's blocks of 128 rows a program under FILL_SMS: ``row_blocks`` cut (to 1 at least) where a grid
    over ``heads`` x ``head_blocks`` blocks would give an SM of ``device`` fewer than two programs (B1 H16 N1024 at 8
    blocks a program: 16 programs, 23 us for 4 MB on the H100), then evened out over a head's programs (8 blocks a
    head cut to 7 would make programs of 7 and 1: 4 and 4)."""
    cut = max(1, min(row_blocks, heads * head_blocks // (2 * dispatch.num_sms(device))))
    return -(-head_blocks // -(-head_blocks // cut))


def rotate_quantize_rows(x: torch.Tensor, signs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, descale (B, H, N)) of x (B, H, N, D) rotated and quantized per row as Hopper's kernel does it for q
    (its Q_ROTATE, gluon_fp8.AttentionFp8.rotate_q; the twin of that path, in float32 torch):
    y = (x diag(s) H) / sqrt(D) from the exact 16-bit inputs, descale = amax / 448 of the row (1 where amax = 0),
    codes = y * (1 / descale) saturated at +-448 (NaN kept). rotate_quantize's math but for that multiply by the
    reciprocal (it divides by the descale: a code may differ by one e4m3 step where y / descale is within a float32
    ulp of a rounding boundary)."""
    D = x.shape[-1]
    y = (x.to(torch.float32) @ signed_hadamard(signs.to(x.device))) * D ** -0.5
    amax = y.abs().amax(dim=-1)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = (y * (1.0 / descale)[..., None]).clamp(-E4M3_MAX, E4M3_MAX)
    return codes.to(torch.float8_e4m3fn), descale


def q_in_kernel(q: torch.Tensor, k: torch.Tensor, causal: bool, rotate: bool, k_scales: str, quantizer: str) -> bool:
    """Whether the convenience path rotates and quantizes q inside Hopper's kernel: at the head dims of
    configs.ROTATED["q_in_kernel"], a plain eager call with rotation, the fused quantizer's per-block k, 16-bit inputs,
    on the Gluon kernel's plan."""
    if not (q.shape[-1] in configs.ROTATED.get("q_in_kernel", ()) and rotate and quantizer == "fused"
            and k_scales == "block"
            and q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cuda"
            and dispatch.plain_eager(q, k)):
        return False
    from tilecore.ops.attention_fp8 import launch

    return launch.plan(q, k, causal).path == "gluon"


K_SCALES = ("tensor", "token", "block")
QUANTIZERS = ("hadamard_quantize", "fused")


V_SCALES = ("head", "block")


def attention_fp8_rotated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                          scale: float | None = None, rotate: bool = True, return_lse: bool = False,
                          k_scales: str = "block", quantizer: str = "fused", v_amax_kernel: bool = False,
                          v_scales: str | None = None):
    """Attention of bf16/fp16 (and, on the CPU, float32) tensors in FP8, end to end: with ``rotate``,
    q and k rotated by one random-sign Hadamard transform of the head dim (H diag(s) / sqrt(D), s
    fixed per head_dim: q k^T unchanged, outliers spread over the head dim; FlashAttention-3's
    incoherent processing) and quantized to e4m3 in the same pass, v quantized per (batch, kv head)
    into the layout the Hopper kernel reads (quantize_fp8's "keys_permuted"), then ``attention_fp8``.
    Layout and masks as tilecore.attention ((B, H, N, D), GQA, causal bottom right); O in q's dtype.
    ``rotate`` needs a head dim hadamard_transform takes (a power of two, or m x 2^k). Forward only: a
    call that would record a gradient raises.

    ``quantizer``: "fused" (default: ``rotate_quantize``, one tl kernel a tensor that rotates on the
    tensor cores and quantizes, no host sync; torch's ops where D is not a power of two 16..256) or
    "hadamard_quantize" (tilecore.hadamard_quantize for q and k; its static k scale costs a host sync).

    Descales: q's per token (a per-row factor in the kernel, free); k's (``k_scales``): "block" (default;
    one per block of 128 keys, computed as k is quantized: one scalar a key block in the kernel;
    ``quantizer="fused"`` only), "tensor" (one for the tensor, bounded without a pass over the rotated
    k: no rotated entry exceeds its row's 2-norm (the rotation is orthonormal), so descale = max_j
    |k_j|_2 / 448 never saturates; a few times more headroom than needed, which e4m3's floating point
    loses nothing to but the subnormals; the norms cost a pass over k), or "token" (per key: a per-key
    factor in the kernel's every step, slower). V: quantize_v_permuted (``v_amax_kernel``: its amax by
    kernels_tl.head_amax instead of torch's vector_norm). ``v_scales`` (None: configs.ROTATED["v_scales"], "block"): "head",
    one descale a (batch, kv head), its amax a pass over v before the quantizing one; or "block", one a
    block of 128 keys, computed in the quantizing pass (v read once: the end-to-end gap's 268 MB at B16 H16 N4096
    D128), which the kernels fold into O's rescale once a key block. At the head dims of configs.ROTATED["q_in_kernel"]
    (64, 128) on Hopper, q's rotation and quantization run inside the FP8 kernel (no pass over q;
    launch.forward_q_rotated). There, at the head dims of configs.ROTATED["q_reg"], q's codes stay in registers as
    the scores' operand (the kernel's Q_REG). The measured speed of each choice against the others:
    notes/attention_fp8/README.md.

    With quantize.ROTATED_RECIPES, a plain eager CUDA call's first call on that path keeps what its checks and plans
    gave under its signature (q, k, v and the options), and the key's later calls only quantize and launch."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"attention_fp8_rotated: {name} must be a 4-D tensor ({LAYOUT})")
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(FORWARD_ONLY)
    dtypes = (torch.bfloat16, torch.float16) + ((torch.float32,) if q.device.type == "cpu" else ())
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"attention_fp8_rotated: q, k and v must share one dtype among "
                        f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)}; got {q.dtype}, {k.dtype}, "
                        f"{v.dtype} (e4m3 inputs: attention_fp8)")
    if k_scales not in K_SCALES:
        raise ValueError(f"attention_fp8_rotated: k_scales must be 'tensor', 'token' or 'block'; got {k_scales!r}")
    if quantizer not in QUANTIZERS:
        raise ValueError(f"attention_fp8_rotated: quantizer must be 'hadamard_quantize' or 'fused'; got {quantizer!r}")
    if k_scales == "block" and quantizer != "fused":
        raise ValueError("attention_fp8_rotated: k_scales='block' needs quantizer='fused'")
    key = None
    if ROTATED_RECIPES and tiles_launch.OP_RECIPES and dispatch.plain_eager(q, k, v):
        key = _ROTATED_KEY(q, k, v, causal is True, causal is False, scale, rotate, return_lse, k_scales, quantizer,
                           v_amax_kernel, v_scales, generation())  # (recipes read configs: switches.patched)
        recipe = _ROTATED_CALLS.get(key) if key is not None else None
        if recipe and recipe.configs[0] is configs.ROTATED and recipe.configs[1] is configs.GLUON_FORWARD \
                and recipe.configs[2] == FILL_SMS:
            return recipe(q, k, v)
    v_scales = configs.ROTATED["v_scales"] if v_scales is None else v_scales
    if v_scales not in V_SCALES:
        raise ValueError(f"attention_fp8_rotated: v_scales must be 'head' or 'block'; got {v_scales!r}")
    if q_in_kernel(q, k, causal, rotate, k_scales, quantizer):
        return _attend_q_in_kernel(q, k, v, causal, scale, return_lse, v_amax_kernel, v_scales, key)
    if dispatch.plain_eager(q, k, v):
        q8, q_scale, k8, k_scale, v8, v_scale = quantize_inputs(q, k, v, rotate, k_scales, quantizer, v_amax_kernel,
                                                                v_scales)
    else:  # traced (torch.compile) or under a mode: the custom op (op.py), whose fake gives the shapes
        q8, q_scale, k8, k_scale, v8, v_scale = quantize_inputs_op(q, k, v, rotate, k_scales, quantizer, v_amax_kernel,
                                                                   v_scales)
    return attention_fp8(q8, k8, v8, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, causal=causal,
                         softmax_scale=scale, out_dtype=q.dtype, return_lse=return_lse, v_layout="keys_permuted",
                         check_scales=False)


def _attend_q_in_kernel(q, k, v, causal: bool, scale, return_lse: bool, v_amax_kernel: bool, v_scales: str,
                        key=None):
    """attention_fp8_rotated with q rotated and quantized inside Hopper's kernel (launch.forward_q_rotated): k and v
    quantized as quantize_inputs does (k per block of 128 keys), attention_fp8's checks on stand-ins of q's codes and
    descales (no memory), then one launch. ``key``: the call's signature (a plain eager CUDA call): the quantizers
    launch by keys made from it, and with ROTATED_RECIPES the call's _QInKernelCall is kept for the key's later
    calls."""
    from tilecore.ops.attention_fp8 import launch
    from tilecore.ops.attention_fp8.op import FP8, check

    signs = rotation_signs(q.shape[-1], q.device)
    keys = (None, None) if key is None else ((key, "k", FILL_SMS), (key, "v"))  # (FILL_SMS: k's launch shape)
    k8, k_scale, v8, v_scale = _quantize_k_v(k, v, signs, v_scales, v_amax_kernel, keys)
    q_codes = torch.empty((), dtype=FP8, device=q.device).expand(q.shape)
    q_scale = torch.empty((), dtype=torch.float32, device=q.device).expand(q.shape[:3])
    softmax_scale = check(q_codes, k8, v8, q_scale, k_scale, v_scale, causal, scale, q.dtype, "keys_permuted", False)
    if q.numel() == 0 or k.shape[2] == 0:
        out, lse = launch.forward_q_rotated(q, signs, k8, v8, k_scale, v_scale, causal, softmax_scale, q.dtype)
        return (out, lse) if return_lse else out
    attend = launch.q_rotated_launch(q, signs, k8, v8, k_scale, v_scale, causal, softmax_scale, q.dtype)
    out, lse = attend(q, k8, v8, k_scale, v_scale)
    if key is not None and ROTATED_RECIPES:
        _ROTATED_CALLS.put(key, _QInKernelCall(signs, keys, v_scales, v_amax_kernel, attend, return_lse))
    return (out, lse) if return_lse else out


def _quantize_k_v(k, v, signs, v_scales: str, v_amax_kernel: bool, keys):
    """(k8, k_scale per 128-key block, v8 in the kernel's layout, v_scale) as the q-in-kernel path takes them;
    ``keys``: the two launches' keys (k's, v's) or Nones."""
    k8, k_scale = rotate_quantize(k, rotate=True, signs=signs, scales="block", key=keys[0])
    v8, v_scale = quantize_v_permuted(v, per=v_scales, amax_kernel=v_amax_kernel, key=keys[1])
    return k8, k_scale, v8, v_scale


class _QInKernelCall:
    """The q-in-kernel convenience path for one call key (issue 31's host time), made by the key's first call: the
    rotation's signs, the quantizers' launch keys and the attention's launch (launch.QRotatedLaunch) as that call made
    them. A later call of the key quantizes k and v and launches the attention: no argument checks, plan, signature
    or layout (the key fixes all of them); the same launches as the first call's."""

    __slots__ = ("configs", "signs", "keys", "v_scales", "v_amax_kernel", "attend", "return_lse")

    def __init__(self, signs, keys, v_scales, v_amax_kernel, attend, return_lse):
        self.configs = (configs.ROTATED, configs.GLUON_FORWARD, FILL_SMS)  # (one of other configs is not used)
        self.signs, self.keys, self.v_scales, self.v_amax_kernel = signs, keys, v_scales, v_amax_kernel
        self.attend, self.return_lse = attend, return_lse

    def __call__(self, q, k, v):
        k8, k_scale, v8, v_scale = _quantize_k_v(k, v, self.signs, self.v_scales, self.v_amax_kernel, self.keys)
        out, lse = self.attend(q, k8, v8, k_scale, v_scale)
        return (out, lse) if self.return_lse else out


# rotate_quantize: blocks of 128 rows a program cut (to 1 at least) where the grid would leave SMs idle; False: the
# configured count at every size
FILL_SMS = True

# attention_fp8_rotated's plain eager CUDA calls: the signature of (q, k, v, the options) -> the key's _QInKernelCall
# (kept after its first call on the q-in-kernel path); ROTATED_RECIPES False: every call through the checks
ROTATED_RECIPES = True
_ROTATED_KEY = SignatureMemo(globals())
_ROTATED_CALLS = LRU(256)


def quantize_inputs(q, k, v, rotate: bool, k_scales: str, quantizer: str, v_amax_kernel: bool,
                    v_scales: str = "head"):
    """attention_fp8_rotated's quantization (its arguments checked): (q8, q_scale (B, Hq, N), k8, k_scale,
    v8 in the kernel's layout, v_scale (B, Hkv) or with ``v_scales="block"`` (B, Hkv, ceil(Nk / 128))); k_scale
    (B, Hkv) ("tensor"), (B, Hkv, ceil(Nk / 128)) ("block") or (B, Hkv, Nk) ("token")."""
    from tilecore.ops.hadamard import hadamard_quantize

    signs = rotation_signs(q.shape[-1], q.device) if rotate else None
    if quantizer == "fused":
        q8, q_scale = rotate_quantize(q, rotate=rotate, signs=signs, scales="token")
        if k_scales == "tensor":
            bound = torch.linalg.vector_norm(k, dim=-1, dtype=torch.float32).amax().reshape(1)
            k8, k_descale = rotate_quantize(k, rotate=rotate, signs=signs, scales="tensor", descale=_descale(bound))
            k_scale = k_descale.expand(k.shape[0], k.shape[1]).contiguous()
        else:
            k8, k_scale = rotate_quantize(k, rotate=rotate, signs=signs, scales=k_scales)
        v8, v_scale = quantize_v_permuted(v, per=v_scales, amax_kernel=v_amax_kernel)
        return q8, q_scale, k8, k_scale, v8, v_scale
    q8, q_scale = hadamard_quantize(q, format="fp8_e4m3", rotate=rotate, randomized_signs=signs)
    if k_scales == "token":
        k8, k_scale = hadamard_quantize(k, format="fp8_e4m3", rotate=rotate, randomized_signs=signs)
        k_scale = k_scale.squeeze(-1)
    else:
        bound = torch.linalg.vector_norm(k, dim=-1, dtype=torch.float32).amax().reshape(1)
        k_descale = _descale(bound)
        k8, _ = hadamard_quantize(k, format="fp8_e4m3", rotate=rotate, randomized_signs=signs, scale=k_descale)
        k_scale = k_descale.expand(k.shape[0], k.shape[1]).contiguous()
    v8, v_scale = quantize_v_permuted(v, per=v_scales, amax_kernel=v_amax_kernel)
    return q8, q_scale.squeeze(-1), k8, k_scale, v8, v_scale


quantize_inputs_op.register_kernel(("cpu", "cuda"))(quantize_inputs)

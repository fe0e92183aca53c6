"""Running attention's plans (plan.py): one function a pass, each the launches of its kernels with
nothing left to decide. ``forward`` and ``backward`` run a plan; ``forward_into`` and
``backward_into`` plan and run (what tests and probes call, with plan_forward's and plan_backward's
options). On the CPU without the interpreter the "sdpa" path calls torch's CPU flash-attention
kernel (SDPA's, forward and backward, with its lse; a sliding window as its float mask) and
"reference" the float32 math, a block of query rows at a time (both in tilecore.ops.attention_cpu).

Every pass takes ``window`` (flash-attn's window_size, (left, right), -1 unbounded) and ``softcap``
(0: off) after ``causal`` and ``scale``; plan.py routes them to the tl, decode, sdpa (window only)
and reference paths (the Gluon kernels take neither: a Gluon plan with them is refused)."""
from __future__ import annotations

import dataclasses
import functools
import importlib

import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, kernels_tl
from tilecore.ops.attention.kernels_tl import block_d, mask_options, row_block_grid, score_options
from tilecore.ops.attention.plan import plan_backward, plan_forward, use_forward_launch
from tilecore.ops.attention_cpu.launch import (backward_sdpa, forward_sdpa, launch_backward_reference,
                                              launch_backward_sdpa, launch_forward_reference, launch_forward_sdpa)
from tilecore.ops.attention_decode.launch import launch_decode
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import (LRU, CachedLaunch, KeyedLaunch, TmaOperand, cdiv, tl_addressable,
                                   tma_describable)

FWD = CachedLaunch(kernels_tl.attn_fwd)
DELTA = CachedLaunch(kernels_tl.attn_bwd_delta)
DKDV = CachedLaunch(kernels_tl.attn_bwd_dkdv)
DQ = CachedLaunch(kernels_tl.attn_bwd_dq)


def _gluon_kernel(module: str, name: str, package: str = "attention"):
    """A CachedLaunch of a Gluon kernel of ``package`` (this one; attention_backward, attention_mla), imported
    at its first launch."""
    return CachedLaunch(lambda: getattr(importlib.import_module(f"tilecore.ops.{package}.{module}"), name))


GLUON_FWD = _gluon_kernel("gluon_kernels", "attention_fwd_kernel")
GLUON_BWD = _gluon_kernel("gluon_backward", "attention_bwd_kernel", "attention_backward")
GLUON_DQ = _gluon_kernel("gluon_dq", "attention_dq_kernel", "attention_backward")
GLUON_BWD_MLA = _gluon_kernel("gluon_backward", "attention_bwd_mla_kernel", "attention_mla")
GLUON_DQ_MLA = _gluon_kernel("gluon_dq", "attention_dq_mla_kernel", "attention_mla")


NO_WINDOW = (-1, -1)


def gluon_softcap(softcap: float, cfg: dict) -> int:
    """The Gluon kernels' SOFTCAP constexpr: 0 without a softcap; 2, tanh by tanh.approx.f32 (one SFU
    instruction, relative error ~2^-11), unless the config's ``tanh_approx`` is False: 1, tanh from
    exp2 and a division (gluon_kernels.tanh_from_exp2)."""
    if not softcap:
        return 0
    return 2 if cfg.get("tanh_approx", True) else 1


def gluon_backward_softcap(softcap: float, cfg: dict) -> int:
    """The fixed-length Gluon backward and dq kernels' SOFTCAP: gluon_softcap's, with 3 for its 2 (tanh.approx): the
    cap's derivative in float32, no float16 round trip. The dK/dV kernel: dP's accumulator starting at -delta, y = dP -
    delta times 1 - tanh^2 before P, dS = P y (delta's, tanh's and lse's registers free at the products: 144 B spilled
    at D128 causal fused against the float16-derivative form 2's 632, which the varlen kernels keep); the dq kernel:
    y - y tanh^2 too, y 0 where masked (a NaN score at a masked key gives dS 0). fp16 gradients nearer their floor
    than form 2's."""
    mode = gluon_softcap(softcap, cfg)
    return 3 if mode == 2 else mode


def run(kernel: CachedLaunch, plan, grid, args: tuple, options: dict):
    """One launch of ``kernel`` for ``plan``: looked up by the plan's launch_key where it has one
    (the signature of the call it was planned for, which determines every argument's specialization
    here: the other tensors are fresh or cached buffers), else the checked way (CachedLaunch.run)."""
    return kernel.run(plan.launch_key, grid, args, options)


def forward(plan, q, k, v, out, lse, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0) -> None:
    """out (B, Hq, N, Dv) and lse (B, Hq, N) float32, both contiguous, of attention(q, k, v) by
    ``plan`` (plan_forward's for these inputs)."""
    if plan.operand_dtype is not None:  # exact upcasts in, one rounding out
        q, k, v = (t.to(plan.operand_dtype) for t in (q, k, v))
        result = torch.empty(out.shape, dtype=plan.operand_dtype, device=out.device)
        _FORWARD[plan.path](plan, q, k, v, result, lse, causal, scale, window, softcap)
        out.copy_(result)
        return
    _FORWARD[plan.path](plan, q, k, v, out, lse, causal, scale, window, softcap)


def outputs(plan, q, k, v, causal: bool, scale: float, window=NO_WINDOW,
            softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention(q, k, v) by ``plan``, allocated here (contiguous, (B, Hq, N, Dv); lse
    float32): the "sdpa" path keeps torch's own results (one copy to the contiguous layout, no
    buffer besides)."""
    if plan.path == "sdpa":
        return forward_sdpa(q, k, v, causal, scale, window)
    out = torch.empty((*q.shape[:3], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    forward(plan, q, k, v, out, lse, causal, scale, window, softcap)
    return out, lse


use_forward_launch(forward)  # the plan times its napkin top-k candidates through this (plan.NAPKIN_FORWARD_TOPK)


def forward_into(q, k, v, out, lse, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0,
                 **options) -> None:
    """forward(plan_forward(q, k, v, causal, scale, window=window, softcap=softcap, **options), ...)."""
    forward(plan_forward(q, k, v, causal, scale, window=window, softcap=softcap, **options), q, k, v, out, lse,
            causal, scale, window, softcap)


def launch_forward_gluon(plan, q, k, v, out, lse, causal: bool, scale: float, window=NO_WINDOW,
                         softcap: float = 0.0) -> None:
    """Hopper's Gluon forward (gluon_kernels.py): ``consumers`` warpgroups (2 or 3, of 4 warps) of
    ``block_m`` query rows each share every K/V stage of ``block_n`` keys; ``q_buffers`` = 2
    loads a tile's Q blocks while the previous tile runs; ``carry`` keeps the pipeline running across
    tiles; ``q_regs`` holds each consumer's Q rows in registers for the tile; the softcap's tanh by
    tanh.approx.f32 unless ``tanh_approx`` is False (gluon_softcap). A window and a softcap
    as the tl kernels take them (WINDOW, SOFTCAP; plan_forward routes them here only where
    configs.GLUON_FORWARD_FEATURES names them, or where the path is forced). MLA's 192 / 128
    (``qk_pieces`` 3): q's and k's boxes one 64-column piece, q's of the tile's rows (the kernel
    reads the layout from the boxes); ``o_halves``: O stored in two halves of its columns."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cfg = plan.config
    block_m, block_n, consumers = cfg["block_m"], cfg["block_n"], cfg.get("consumers", 2)
    masks, left, right = mask_options(causal, window, N, Nk)  # the kernel's CAUSAL and WINDOW as the tl kernels'
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    pieces = cfg.get("qk_pieces", 1)
    if pieces == 1:
        q_op, k_op = head_operand(q, block_m), head_operand(k, block_n)
    else:
        q_op = TmaOperand(q, [1, 1, consumers * block_m, D // pieces])
        k_op = TmaOperand(k, [1, 1, block_n, D // pieces])
    o_op = TmaOperand(out, [1, 1, block_m, out.shape[-1] // 2]) if cfg.get("o_halves") else head_operand(out, block_m)
    with dispatch.on_device(q.device):
        run(GLUON_FWD, plan, plan.grid,
            (q_op, k_op, head_operand(v, block_n), o_op,
             lse, H, N, Nk, H // Hkv, scale_log2e, B * H, plan.sizes["head_group"], plan.schedule, left, right,
             tanh_scale),
            dict(**masks, SOFTCAP=gluon_softcap(softcap, cfg), STAGES=cfg["stages"],
                 CONSUMERS=consumers, Q_BUFFERS=cfg.get("q_buffers", 1),
                 CARRY=cfg.get("carry", False), Q_REGS=cfg.get("q_regs", False), num_warps=4))


class GluonForward:
    """attention's Gluon forward for one launch key (issue 31's host time): the kernel's KeyedLaunch with
    q's, k's, v's and O's TMA views fixed by the key (each made from the tensor at its position, encoded once per base
    address), the sizes, grid, schedule, window bounds and constexprs as launch_forward_gluon makes them. A call
    allocates O and lse, takes the scores' scale and softcap factors from this call's scale and softcap (the key holds
    only their signs), and launches: no masks, descriptors, options dict or device guard a call. ``of`` gives False
    (launch_forward_gluon each call) for MLA's split Q/K boxes, O in halves, or an upcast plan."""

    __slots__ = ("launch", "head", "mid", "out_shape", "lse_shape", "dtype", "device")

    @classmethod
    def of(cls, plan, q, k, v, causal: bool, window, softcap: float):
        cfg = plan.config
        if plan.path != "gluon" or plan.operand_dtype is not None or cfg.get("qk_pieces", 1) != 1 \
                or cfg.get("o_halves") or plan.launch_key is None:
            return False
        B, H, N, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        block_m, block_n, consumers = cfg["block_m"], cfg["block_n"], cfg.get("consumers", 2)
        masks, left, right = mask_options(causal, window, N, Nk)
        makers = {0: lambda t: head_operand(t, block_m), 1: lambda t: head_operand(t, block_n),
                  2: lambda t: head_operand(t, block_n), 3: lambda t: head_operand(t, block_m)}
        options = dict(**masks, SOFTCAP=gluon_softcap(softcap, cfg), STAGES=cfg["stages"], CONSUMERS=consumers,
                       Q_BUFFERS=cfg.get("q_buffers", 1), CARRY=cfg.get("carry", False), Q_REGS=cfg.get("q_regs", False),
                       num_warps=4)
        self = cls()
        self.launch = KeyedLaunch(GLUON_FWD, plan.launch_key, plan.grid, options, operands=makers)
        self.head = (H, N, Nk, H // Hkv)
        self.mid = (B * H, plan.sizes["head_group"], plan.schedule, left, right)
        self.out_shape, self.lse_shape = (B, H, N, v.shape[-1]), (B, H, N)
        self.dtype, self.device = q.dtype, q.device
        return self

    def outputs(self, q, k, v, scale: float, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(O, lse), contiguous, as outputs() makes them."""
        out = q.new_empty(self.out_shape)  # (q's dtype and device, the key's: ~1 us under torch.empty's with device=)
        lse = q.new_empty(self.lse_shape, dtype=torch.float32)
        _, scale_log2e, tanh_scale = score_options(scale, softcap)
        self.launch((q, k, v, out, lse, *self.head, scale_log2e, *self.mid, tanh_scale))
        return out, lse


def gluon_prepared(plan, q, k, v, causal: bool, window, softcap: float):
    """The GluonForward of ``plan``'s launch key (made at the first call that finds the plan cached), False where
    launch_forward_gluon serves it, None where the plan has no key or OP_RECIPES is off."""
    if plan.launch_key is None or not (tiles_launch.OP_RECIPES and tiles_launch.FORWARD_RECIPES):
        return None
    return _GLUON_FORWARDS.memo(plan.launch_key, lambda: GluonForward.of(plan, q, k, v, causal, window, softcap))


_GLUON_FORWARDS = LRU(256)  # a plan's launch key -> its GluonForward (False: launch_forward_gluon)


def launch_forward_tl(plan, q, k, v, out, lse, causal: bool, scale: float, window=NO_WINDOW,
                      softcap: float = 0.0, rotary=None) -> None:
    """The tl query-block forward (kernels_tl.attn_fwd); ``rotary``: (cos, sin, interleaved), Q and K
    turned in the kernel (rotary_arguments)."""
    B, H, N, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    q, k, v = tl_addressable(q), tl_addressable(k), tl_addressable(v)
    masks, left, right = mask_options(causal, window, N, Nk)
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    turn = rotary_arguments(rotary)
    run(FWD, plan, plan.grid, (q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                               H, N, Nk, D, Dv, H // Hkv, left, right, scale_log2e, tanh_scale),
        dict(**masks, **scores, BLOCK_D=block_d(D), BLOCK_DV=block_d(Dv), **plan.config, **turn))


def rotary_arguments(rotary) -> dict:
    """The tl kernels' rotary arguments for ``rotary`` = (cos, sin, interleaved) (tables (max_seqlen,
    pairs), unit stride along the pairs), by name, or none (None: the kernels' defaults, which compile
    the kernels as without rotary)."""
    if rotary is None:
        return {}
    cos, sin, interleaved = rotary
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    return dict(COS=cos, SIN=sin, stride_cos=cos.stride(0), stride_sin=sin.stride(0), rotary_pairs=cos.shape[1],
                ROTARY=True, ROTARY_INTERLEAVED=bool(interleaved))


_FORWARD = {"gluon": launch_forward_gluon, "tl": launch_forward_tl, "decode": launch_decode,
            "reference": launch_forward_reference, "sdpa": launch_forward_sdpa}


# --------------------------------------------------------------------------------------------
# backward


def backward(plan, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0) -> None:
    """dq, dk, dv (contiguous, the inputs' shapes) from dout, the forward's out and lse, and an
    optional gradient of lse, by ``plan`` (plan_backward's for these inputs)."""
    # the kernels index lse and dlse as contiguous float32 (B, Hq, N) arrays
    lse = lse.contiguous()
    dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
    if plan.operand_dtype is not None:  # exact upcasts in, one rounding out
        dout, q, k, v, out = (t.to(plan.operand_dtype) for t in (dout, q, k, v, out))
        grads = [torch.empty(g.shape, dtype=plan.operand_dtype, device=g.device) for g in (dq, dk, dv)]
        _BACKWARD[plan.path](plan, dout, q, k, v, out, lse, dlse, *grads, causal, scale, window, softcap)
        for g, result in zip((dq, dk, dv), grads):
            g.copy_(result)
        return
    _BACKWARD[plan.path](plan, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal, scale, window, softcap)


def gradients(plan, dout, q, k, v, out, lse, dlse, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0):
    """(dq, dk, dv) by ``plan``, allocated here (contiguous, the inputs' shapes and dtype): the
    "sdpa" path keeps torch's own gradients (copied to the contiguous layout one at a time)."""
    if plan.path == "sdpa":
        return backward_sdpa(dout, q, k, v, out, lse.contiguous(), dlse, causal, scale, window)
    grads = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v)]
    backward(plan, dout, q, k, v, out, lse, dlse, *grads, causal, scale, window, softcap)
    return tuple(grads)


def gradients_adding_dq(plan, dout, q, k, v, out, lse, dlse, dq_sum, causal: bool, scale: float,
                        window=NO_WINDOW, softcap: float = 0.0):
    """(dk, dv) by ``plan``, allocated here, and dQ added to ``dq_sum``: float32, q's shape, any
    strides (the rows of a larger accumulator: tilecore.distributed's ring sums its blocks' dQ so).
    Where the plan's Gluon kernel adds dQ itself (configs.DQ_MODES > 0) its float32 TMA reductions add
    to dq_sum directly: no zeroed buffer, no copy to q's dtype and no separate add (three passes over
    a float32 dQ, and the buffer). Else dQ as gradients() gives it, added in float32."""
    if dq_sum.dtype != torch.float32 or dq_sum.shape != q.shape or dq_sum.device != q.device:
        raise ValueError(f"gradients_adding_dq: dq_sum must be float32 of q's shape {tuple(q.shape)} on {q.device}; "
                         f"got {dq_sum.dtype} {tuple(dq_sum.shape)} on {dq_sum.device}")
    if plan.path == "gluon" and plan.dq is None and plan.operand_dtype is None and tma_describable(dq_sum):
        if plan.launch_key is not None:  # its launches differ from the plan's own (no zeroing: ZERO_DQ_SUM)
            plan = dataclasses.replace(plan, launch_key=plan.launch_key + ("adding_dq",))
        dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (k, v))
        dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
        _, _, stats = backward_preprocess(out, dout, lse.contiguous(), dlse, row_stats=True, plan=plan)
        launch_backward_gluon_kernel(plan, dout, q, k, v, stats, dq_sum, dk, dv, causal, scale, window, softcap)
        return dk, dv
    dq, dk, dv = gradients(plan, dout, q, k, v, out, lse, dlse, causal, scale, window, softcap)
    dq_sum += dq
    return dk, dv


def backward_into(dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0,
                  **options) -> None:
    """backward(plan_backward(dout, q, k, v, causal, scale, window=window, softcap=softcap, **options), ...)."""
    backward(plan_backward(dout, q, k, v, causal, scale, window=window, softcap=softcap, **options), dout, q, k, v,
             out, lse, dlse, dq, dk, dv, causal, scale, window, softcap)


def backward_preprocess(out, dout, lse, dlse, *, dq_sum: bool = False, row_stats: bool = False, plan=None):
    """The backward's preprocess, one pass over the rows (kernels_tl.attn_bwd_delta): (delta (B, H, N)
    float32; with ``dq_sum`` a zeroed float32 (B, H, N, D) buffer for the Gluon kernel's dQ
    reductions, else a placeholder; with ``row_stats`` the (B * H, 2, N) view of a float32 buffer
    with rows padded to 16 bytes (what TMA reads) holding each row's lse (+inf for -inf) and delta,
    else a placeholder). ``plan``: the backward's, whose launch_key the launch is looked up by."""
    B, H, N, D = out.shape
    dout = tl_addressable(dout)
    delta = torch.empty((B, H, N), dtype=torch.float32, device=out.device)
    acc = torch.empty((B, H, N, D) if dq_sum else (1, 1, 1, D), dtype=torch.float32, device=out.device)
    n_pad = cdiv(N, 4) * 4
    stats = torch.empty((B * H, 2, n_pad) if row_stats else (1, 2, 4), dtype=torch.float32, device=out.device)
    block_m = configs.PREPROCESS_BLOCK_M[dispatch.interpreted(out.device)]
    args = (out, dout, lse, dlse if dlse is not None else lse, delta, stats, acc, *out.stride(), *dout.stride(), H, N,
            D, n_pad)
    options = dict(HAS_DLSE=dlse is not None, ZERO_DQ_SUM=dq_sum, ROW_STATS=row_stats, BLOCK_M=block_m,
                   BLOCK_D=block_d(D))
    grid = row_block_grid(B * H, N, block_m)
    if plan is None:
        DELTA[grid](*args, **options)
    else:
        run(DELTA, plan, grid, args, options)
    return delta, acc, stats[..., :N]


def launch_backward_gluon(plan, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float,
                          window=NO_WINDOW, softcap: float = 0.0) -> None:
    """The preprocess, the Gluon backward kernel (dK, dV, and dQ where the plan has no dQ pass: its
    float32 sum then copied to dq), then the plan's dQ pass if any."""
    added = plan.dq is None
    delta, dq_sum, stats = backward_preprocess(out, dout, lse, dlse, dq_sum=added, row_stats=True, plan=plan)
    launch_backward_gluon_kernel(plan, dout, q, k, v, stats, dq_sum, dk, dv, causal, scale, window, softcap)
    if added:
        dq.copy_(dq_sum)
    else:
        _DQ_PASS[plan.dq.path](plan.dq, dout, q, k, v, lse, delta, dq, causal, scale, window, softcap)


def launch_backward_gluon_kernel(plan, dout, q, k, v, stats, dq_sum, dk, dv, causal: bool, scale: float,
                                 window=NO_WINDOW, softcap: float = 0.0) -> None:
    """The Gluon backward kernel alone (gluon_backward.py): dk, dv, and where the plan's dq_from adds
    it in the kernel scale * dS K added to the float32 ``dq_sum`` (B, H, N, D; a placeholder
    otherwise), from the rows' lse and delta in ``stats`` (backward_preprocess's). A window and a softcap as the
    forward takes them (WINDOW, SOFTCAP; causal folded into a window)."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cfg = plan.config
    block_m, block_n = cfg["block_m"], cfg["block_n"]
    masks, left, right = mask_options(causal, window, N, Nk)
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    if cfg.get("qk_pieces", 1) != 1:  # MLA's 192 / 128: dK and dV by 64-column pieces (every box 64 wide)
        piece = lambda t, rows: TmaOperand(t, [1, 1, rows, 64])
        with dispatch.on_device(q.device):
            run(GLUON_BWD_MLA, plan, plan.grid,
                (piece(q, block_m), piece(k, 2 * block_n), piece(v, 2 * block_n), piece(dout, block_m),
                 piece(dk, block_n), piece(dv, block_n), row_stats_operand(stats, block_m), H, N, Nk, H // Hkv, scale,
                 scale_log2e, B * Hkv, plan.sizes["head_group"], plan.schedule, left, right, tanh_scale),
                dict(**masks, STAGES=cfg["stages"], SOFTCAP=gluon_softcap(softcap, cfg), num_warps=4))
        return
    with dispatch.on_device(q.device):
        run(GLUON_BWD, plan, plan.grid,
            (head_operand(q, block_m), head_operand(k, 2 * block_n), head_operand(v, 2 * block_n),
             head_operand(dout, block_m), head_operand(dk, block_n), head_operand(dv, block_n),
             row_stats_operand(stats, block_m), TmaOperand(dq_sum, dq_box(block_m, D, cfg["dq_from"])),
             H, N, Nk, H // Hkv, scale, scale_log2e, B * Hkv, plan.sizes["head_group"],
             plan.schedule, left, right, tanh_scale),
            dict(**masks, STAGES=cfg["stages"], DQ=configs.DQ_MODES[cfg["dq_from"]],
                 KV_REGS=cfg.get("kv_regs", False), SOFTCAP=gluon_backward_softcap(softcap, cfg),
                 DP_FROM_DELTA=cfg.get("dp_from_delta", False), num_warps=4))


def launch_dq_gluon(plan, dout, q, k, v, lse, delta, dq, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0) -> None:
    """dq (contiguous, q's shape) by gluon_dq.py's kernel: tiles of 2 block_m query rows, block_n
    keys a step; a window and a softcap as the forward takes them."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    block_m, block_n = plan.config["block_m"], plan.config["block_n"]
    masks, left, right = mask_options(causal, window, N, Nk)
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    if plan.config.get("qk_pieces", 1) != 1:  # MLA's 192 / 128: every box 64 columns wide
        piece = lambda t, rows: TmaOperand(t, [1, 1, rows, 64])
        with dispatch.on_device(q.device):
            run(GLUON_DQ_MLA, plan, plan.grid,
                (piece(q, 2 * block_m), piece(k, block_n), piece(v, block_n), piece(dout, 2 * block_m),
                 piece(dq, block_m), lse, delta, H, N, Nk, H // Hkv, scale, scale_log2e, B * H,
                 plan.sizes["head_group"], plan.schedule, left, right, tanh_scale),
                dict(**masks, STAGES=plan.config["stages"], SOFTCAP=gluon_softcap(softcap, plan.config), num_warps=4))
        return
    with dispatch.on_device(q.device):
        run(GLUON_DQ, plan, plan.grid,
            (head_operand(q, 2 * block_m), head_operand(k, block_n), head_operand(v, block_n),
             head_operand(dout, 2 * block_m), head_operand(dq, block_m), head_operand(q, 2 * block_m),
             lse, delta, H, N, Nk, H // Hkv, scale, scale_log2e, B * H, plan.sizes["head_group"], plan.schedule,
             left, right, tanh_scale),
            dict(**masks, STAGES=plan.config["stages"], SOFTCAP=gluon_backward_softcap(softcap, plan.config),
                 num_warps=4))


def launch_backward_tl(plan, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float,
                       window=NO_WINDOW, softcap: float = 0.0, rotary=None) -> None:
    """The preprocess, the tl dk/dv kernel (a program per kv head's key block), then the tl dq pass;
    ``rotary`` as launch_forward_tl's (dK and dQ turned back in the kernels)."""
    B, H, N, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    q, k, v, dout = tl_addressable(q), tl_addressable(k), tl_addressable(v), tl_addressable(dout)
    delta, _, _ = backward_preprocess(out, dout, lse, dlse, plan=plan)
    masks, left, right = mask_options(causal, window, N, Nk)
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride())
    turn = rotary_arguments(rotary)
    run(DKDV, plan, plan.grid, (q, k, v, dout, lse, delta, dk, dv, *strides, *dk.stride(), *dv.stride(), H, Hkv, N,
                                Nk, D, Dv, H // Hkv, left, right, scale, scale_log2e, tanh_scale),
        dict(**masks, **scores, BLOCK_D=block_d(D), BLOCK_DV=block_d(Dv), **plan.config, **turn))
    launch_dq_tl(plan.dq, dout, q, k, v, lse, delta, dq, causal, scale, window, softcap, rotary)


def launch_dq_tl(plan, dout, q, k, v, lse, delta, dq, causal: bool, scale: float, window=NO_WINDOW, softcap: float = 0.0,
                 rotary=None) -> None:
    """The tl dq kernel: one program per (batch * q head, query block), looping over the keys its
    rows see; ``rotary`` as launch_forward_tl's."""
    q, k, v, dout = tl_addressable(q), tl_addressable(k), tl_addressable(v), tl_addressable(dout)
    B, H, N, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    masks, left, right = mask_options(causal, window, N, Nk)
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    turn = rotary_arguments(rotary)
    run(DQ, plan, plan.grid, (q, k, v, dout, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *dout.stride(),
                              *dq.stride(), H, N, Nk, D, Dv, H // Hkv, left, right, scale, scale_log2e, tanh_scale),
        dict(**masks, **scores, BLOCK_D=block_d(D), BLOCK_DV=block_d(Dv), **plan.config, **turn))


_BACKWARD = {"gluon": launch_backward_gluon, "tl": launch_backward_tl, "reference": launch_backward_reference,
             "sdpa": launch_backward_sdpa}
_DQ_PASS = {"gluon": launch_dq_gluon, "tl": launch_dq_tl}


# --------------------------------------------------------------------------------------------
# the Gluon kernels' TMA operands


def head_operand(t, rows: int) -> TmaOperand:
    """A 4-D (B, heads, sequence, D) tensor as a TMA operand with boxes of ``rows`` rows of one head:
    a block never crosses into the next head (rows past the sequence arrive as 0)."""
    return TmaOperand(t, [1, 1, rows, t.shape[-1]])


def row_stats_operand(stats, block_m: int) -> TmaOperand:
    """backward_preprocess's row statistics as a TMA operand: boxes of (lse, delta) of block_m rows,
    unswizzled (the kernel reads them as S^T's columns; rows past N arrive as zeros)."""
    return TmaOperand(stats, [1, 2, block_m], layout=_unswizzled_layout(3))


@functools.lru_cache(maxsize=None)
def _unswizzled_layout(rank: int):
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=rank)


def dq_box(block_m: int, d: int, dq_from: str = "fused") -> list[int]:
    """The TMA box of one dQ reduction: a step's rows, half the columns (each consumer's half; 128-
    byte rows at D = 64), or with dq_from "warpgroup" 32 columns (the dQ warpgroup's piece)."""
    return [1, 1, block_m, 32 if dq_from == "warpgroup" else d // 2]

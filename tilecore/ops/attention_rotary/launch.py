"""The tl kernels with Q and K turned inside (attention.kernels_tl's ROTARY): attention(..., rotary=(cos, sin))'s
"tl" path, forward and backward, by attention's tl launches with their rotary arguments."""
from __future__ import annotations

import dataclasses

import torch

from tilecore.ops.attention.launch import NO_WINDOW, launch_backward_tl, launch_forward_tl
from tilecore.ops.attention_rotary import configs


def rotary_stages(plan):
    """A tl plan (and its dQ pass) with configs.ROTARY_TL_STAGES pipelining stages: the turned tiles' shared
    memory (the partner columns, cos and sin rows beside K and V) fits every GPU with it."""
    cfg = {**plan.config, "num_stages": configs.ROTARY_TL_STAGES}
    dq = None if plan.dq is None else dataclasses.replace(plan.dq, config={**plan.dq.config,
                                                                          "num_stages": configs.ROTARY_TL_STAGES})
    return dataclasses.replace(plan, config=cfg, dq=dq)


def rotary_buffer(shape, dtype, device) -> torch.Tensor:
    """An output of the rotary tl path, which its kernels write whole (tests fill it with NaN first)."""
    return torch.empty(shape, dtype=dtype, device=device)


def rotary_outputs(plan, q, k, v, cos, sin, interleaved: bool, causal: bool, scale: float, window=NO_WINDOW,
                   softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention(q, k, v, rotary=(cos, sin)) by a tl forward ``plan`` (plan_forward's for
    q, k, v with path "tl"): Q and K turned in the kernel."""
    if plan.path != "tl":
        raise ValueError(f"rotary in the kernel: the tl forward only; got a {plan.path!r} plan")
    plan = rotary_stages(plan)
    out = rotary_buffer((*q.shape[:3], v.shape[-1]), q.dtype, q.device)
    lse = rotary_buffer(q.shape[:3], torch.float32, q.device)
    rotary = (cos, sin, interleaved)
    if plan.operand_dtype is not None:  # exact upcasts in, one rounding out
        q, k, v = (t.to(plan.operand_dtype) for t in (q, k, v))
        result = torch.empty(out.shape, dtype=plan.operand_dtype, device=out.device)
        launch_forward_tl(plan, q, k, v, result, lse, causal, scale, window, softcap, rotary)
        out.copy_(result)
    else:
        launch_forward_tl(plan, q, k, v, out, lse, causal, scale, window, softcap, rotary)
    return out, lse


def rotary_gradients(plan, dout, q, k, v, cos, sin, interleaved: bool, out, lse, dlse, causal: bool, scale: float,
                     window=NO_WINDOW, softcap: float = 0.0):
    """(dq, dk, dv) of attention(q, k, v, rotary=(cos, sin)) by a tl backward ``plan`` (plan_backward's
    with path "tl"), allocated here: Q and K turned in the kernels, dQ and dK turned back there."""
    if plan.path != "tl":
        raise ValueError(f"rotary in the kernel: the tl backward only; got a {plan.path!r} plan")
    plan = rotary_stages(plan)
    lse = lse.contiguous()
    dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
    grads = [rotary_buffer(t.shape, t.dtype, t.device) for t in (q, k, v)]
    rotary = (cos, sin, interleaved)
    if plan.operand_dtype is None:
        launch_backward_tl(plan, dout, q, k, v, out, lse, dlse, *grads, causal, scale, window, softcap, rotary)
        return tuple(grads)
    dout, q, k, v, out = (t.to(plan.operand_dtype) for t in (dout, q, k, v, out))
    wide = [torch.empty(g.shape, dtype=plan.operand_dtype, device=g.device) for g in grads]
    launch_backward_tl(plan, dout, q, k, v, out, lse, dlse, *wide, causal, scale, window, softcap, rotary)
    for g, result in zip(grads, wide):
        g.copy_(result)
    return tuple(grads)

"""``tilecore.distributed.context_parallel_attention``: the public function, the checks every rank
makes together, and the custom ops (forward and backward; the forward's autograd calls the
backward op, so torch.compile traces both as opaque calls)."""
from __future__ import annotations

import math
import numbers
import struct
import time
from typing import Optional

import torch
import torch.distributed as dist

from tilecore import dispatch
from tilecore.distributed import groups, sharding
from tilecore.distributed.ring import default_sm_margin, host_mark, ring_backward, ring_forward
from tilecore.distributed.ulysses import ulysses_backward, ulysses_forward
from tilecore.ops.attention import op as attention_op

NAME = "context_parallel_attention"
MODES = ("ring", "all_to_all")
_FORWARD = {"ring": ring_forward, "all_to_all": ulysses_forward}
_BACKWARD = {"ring": ring_backward, "all_to_all": ulysses_backward}
# the metadata every rank sends: its refusal (0: none, 1: TypeError, 2: ValueError), then its inputs
_FIELDS = ("refused", "batch", "q heads", "kv heads", "head_dim", "length", "dtype", "device", "causal", "mode",
           "scale", "sm_margin")
# the margin too: with one, the ring's transfers go through a group made for it (ring.ring_for)
_SAME = ("batch", "q heads", "kv heads", "head_dim", "dtype", "device", "causal", "mode", "scale", "sm_margin")
_REFUSALS = {TypeError: 1, ValueError: 2}


def _scale_bits(scale: float) -> int:
    return struct.unpack("<q", struct.pack("<d", scale))[0]


def _float_of(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _shown(field: str, value: int):
    return {"dtype": groups.dtype_name, "device": groups.device_name, "scale": _float_of,
            "causal": bool, "mode": lambda m: MODES[m] if 0 <= m < len(MODES) else "?"}.get(field, int)(value)


def local_check(q, k, v, group: dist.ProcessGroup, causal, scale, mode, timeout, sm_margin: int = 0) -> None:
    """What one rank can refuse alone: TypeError/ValueError naming what is accepted."""
    try:
        attention_op.check(q, k, v, causal, scale, sm_margin=sm_margin)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{NAME}: {str(err).removeprefix('attention: ')}") from None
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{NAME}: q, k and v must be this rank's slice of one sequence, of one length; got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)} ((batch, heads, sequence slice, head_dim))")
    check_settings(causal, mode, timeout)
    backend = str(dist.get_backend(group))
    if q.device.type == "cuda" and "nccl" not in backend:
        raise ValueError(f"{NAME}: CUDA tensors need a group with an NCCL backend; this group's is {backend!r}")
    if q.device.type == "cpu" and "gloo" not in backend:
        raise ValueError(f"{NAME}: CPU tensors need a group with a gloo backend; this group's is {backend!r}")


def check_settings(causal, mode, timeout) -> None:
    """The settings' own checks (the same on every rank, or check_across_ranks says which differ)."""
    if not isinstance(causal, bool):
        raise TypeError(f"{NAME}: causal must be True or False, got {causal!r}")
    if mode not in MODES:
        raise ValueError(f"{NAME}: mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    if not _positive(timeout):
        raise ValueError(f"{NAME}: timeout must be a positive number of seconds; got {timeout!r}")


def check_across_ranks(q, k, v, group: dist.ProcessGroup, causal: bool, scale: float, mode: str, timeout: float,
                       refusal: Exception | None = None, sm_margin: int = 0) -> list[int]:
    """Every rank's sizes and settings, gathered (on the CPU, within ``timeout`` seconds) and checked
    alike on every rank: any rank's refusal, settings that differ, slice lengths that are not a
    zigzag split of their sum, heads that all-to-all cannot share out raise on every rank.
    ``refusal``: this rank's own (local_check's) error, raised here after the others have heard of
    it. Returns the ranks' slice lengths."""
    return start_checks(q, k, v, group, causal, scale, mode, timeout, refusal, sm_margin)()


class PendingChecks:
    """check_across_ranks in two halves: ``start()`` starts the metadata gather (its enqueue alone
    costs ~0.15 ms of host time on the lent H100's host), calling it waits for the gather (starting
    it first where it was not) and checks, once: every rank's lengths, or the error every rank
    raises. The ring starts and calls it after queueing its step 0, which needs no other rank's
    metadata (ring.ring_forward)."""

    def __init__(self, values: list[int], group: dist.ProcessGroup, timeout: float, world: int, mode: str,
                 refusal: Exception | None):
        self.values, self.group, self.timeout = values, group, timeout
        self.world, self.mode, self.refusal = world, mode, refusal
        self.pending = self.lengths = None

    def start(self) -> "PendingChecks":
        if self.pending is None:
            self.pending = groups.start_gather_ints(self.values, self.group, self.timeout, NAME)
            host_mark("gather started")
        return self

    def __call__(self) -> list[int]:
        if self.lengths is None:
            self.start()
            host_mark("gather waited on")
            rows = self.pending.result()
            host_mark("gather done")
            self.lengths = _checked(rows, self.world, self.mode, self.refusal)
        return self.lengths


def start_checks(q, k, v, group: dist.ProcessGroup, causal: bool, scale: float, mode: str, timeout: float,
                 refusal: Exception | None = None, sm_margin: int = 0) -> PendingChecks:
    """check_across_ranks, not yet started: the result's start() starts the gather, calling it waits
    for it and checks."""
    world = dist.get_world_size(group)
    if refusal is not None:
        mine = [_REFUSALS.get(type(refusal), 2)] + [0] * (len(_FIELDS) - 1)
    else:
        B, Hq, n, D = q.shape
        mine = [0, B, Hq, k.shape[1], D, n, groups.dtype_code(q.dtype), groups.device_code(q.device), int(causal),
                MODES.index(mode), _scale_bits(scale), sm_margin]
    return PendingChecks(mine, group, timeout, world, mode, refusal)


def _checked(rows: list[list[int]], world: int, mode: str, refusal: Exception | None) -> list[int]:
    refused = [r for r, row in enumerate(rows) if row[0]]
    if refusal is not None:
        raise type(refusal)(f"{refusal} (the group's other ranks raise too)") from None
    if refused:
        raise ValueError(f"{NAME}: rank(s) {refused} of the group refused their inputs (their errors say why); "
                         f"every rank raises")
    table = [dict(zip(_FIELDS, row)) for row in rows]
    for field in _SAME:
        values = [t[field] for t in table]
        if len(set(values)) > 1:
            raise ValueError(f"{NAME}: every rank must pass the same {field}; the ranks' are "
                             f"{[_shown(field, x) for x in values]}")
    lengths = [t["length"] for t in table]
    expected = sharding.local_lengths(sum(lengths), world)
    if lengths != expected:
        raise ValueError(f"{NAME}: the ranks' sequence slices have lengths {lengths}, which is not the zigzag split "
                         f"of {sum(lengths)} positions over {world} ranks ({expected}; zigzag_shard makes it)")
    if mode == "all_to_all" and table[0]["q heads"] % world:
        raise ValueError(f"{NAME}: mode 'all_to_all' shares the heads out: q's heads ({table[0]['q heads']}) must "
                         f"divide by the group's size ({world}); mode 'ring' takes any")
    return lengths


# The public call's host path: the metadata gather started and waited on after the ring's step 0 is
# queued, local checks skipped for a signature that passed them, an eager autograd.Function instead of
# the custom op where nothing is traced. False: the older path (the gather waited on before the ring
# starts, the checks every call, the custom op), for probes to compare (experiments/distributed/
# gpu_check.py's "old host" figures); results are the same. On: faster on 2 H100s, the public forward's
# host time 0.89 ms against 3.25 (notes/distributed/README.md's decision log)
FAST_HOST = True


def set_fast_host(on: bool) -> bool:
    """Probes: FAST_HOST from now on; returns the previous value."""
    global FAST_HOST
    previous, FAST_HOST = FAST_HOST, bool(on)
    return previous


# The signatures whose local checks passed (local_check: the attention's checks, the backend), so a
# call like an earlier one skips them (~35-150 us of host time on this project's hosts); bounded
_CHECKED: dict = {}
_CHECKED_MAX = 64


def _signature(q, k, v, group_name, causal, scale, mode, timeout, sm_margin):
    return (group_name, causal, scale, mode, timeout, sm_margin,
            *((t.shape, t.stride(), t.dtype, t.device) for t in (q, k, v)))


# --------------------------------------------------------------------------------------------
# implementations


def _forward_impl(q, k, v, group_name: str, causal: bool, scale: float, mode: str, timeout: float,
                  sm_margin: int = 0):
    """The forward: local checks (skipped for a signature that passed them before), the ring's
    step 0 queued, then the metadata gather started, waited on and checked (every rank raises
    alike), then the rest (ring.ring_forward takes the pending checks); all-to-all checks first."""
    host_mark("forward")
    group = groups.resolve(group_name, NAME)
    key = _signature(q, k, v, group_name, causal, scale, mode, timeout, sm_margin)
    refusal = None
    if not FAST_HOST or key not in _CHECKED:
        try:
            local_check(q, k, v, group, causal, scale, mode, timeout, sm_margin)
            if len(_CHECKED) >= _CHECKED_MAX:
                _CHECKED.pop(next(iter(_CHECKED)))
            _CHECKED[key] = True
        except (TypeError, ValueError) as err:
            refusal = err
    checks = start_checks(q, k, v, group, causal, scale, mode, timeout, refusal, sm_margin)
    if refusal is not None or mode != "ring" or not FAST_HOST:
        lengths = checks()
    else:
        lengths = checks  # ring_forward starts and calls it after queueing step 0
    with torch.no_grad():
        out, lse = _FORWARD[mode](q, k, v, group, lengths, causal, scale, sm_margin=sm_margin)
    host_mark("forward queued")
    return out, lse, torch.tensor(checks(), dtype=torch.int64)


def _backward_impl(dout, dlse, q, k, v, out, lse, lengths, group_name: str, causal: bool, scale: float, mode: str,
                   sm_margin: int = 0):
    host_mark("backward")
    group = groups.resolve(group_name, NAME)
    if dlse is not None:
        dlse = dlse.to(torch.float32)
    with torch.no_grad():
        grads = _BACKWARD[mode](dout, dlse, q, k, v, out, lse, group, lengths.tolist(), causal, scale,
                                sm_margin=sm_margin)
    host_mark("backward queued")
    return grads


@torch.library.custom_op("tilecore::context_parallel_attention_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group_name: str, causal: bool, scale: float,
                mode: str, timeout: float, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, group_name, causal, scale, mode, timeout, sm_margin)


@_forward_op.register_fake
def _(q, k, v, group_name, causal, scale, mode, timeout, sm_margin=0):
    world = dist.get_world_size(groups.resolve(group_name, NAME))
    B, H, n, D = q.shape
    return (q.new_empty((B, H, n, D)), q.new_empty((B, H, n), dtype=torch.float32),
            torch.empty(world, dtype=torch.int64, device="cpu"))


@torch.library.custom_op("tilecore::context_parallel_attention_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, lengths: torch.Tensor, group_name: str,
                 causal: bool, scale: float, mode: str,
                 sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, dlse, q, k, v, out, lse, lengths, group_name, causal, scale, mode, sm_margin)


@_backward_op.register_fake
def _(dout, dlse, q, k, v, out, lse, lengths, group_name, causal, scale, mode, sm_margin=0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, group_name, causal, scale, mode, timeout, sm_margin = inputs
    out, lse, lengths = output
    ctx.save_for_backward(q, k, v, out, lse, lengths)
    ctx.group_name, ctx.causal, ctx.scale, ctx.mode, ctx.sm_margin = group_name, causal, scale, mode, sm_margin


def _backward(ctx, dout, dlse, dlengths):
    q, k, v, out, lse, lengths = ctx.saved_tensors
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    dq, dk, dv = _backward_op(dout, dlse, q, k, v, out, lse, lengths, ctx.group_name, ctx.causal, ctx.scale,
                              ctx.mode, ctx.sm_margin)
    return dq, dk, dv, None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


class _ContextParallelFunction(torch.autograd.Function):
    """Eager calls that record a gradient (dispatch.eager_mode's "autograd"): the custom ops' autograd
    without their host time (~100 us a custom-op call, forward and backward), and an unused output's
    gradient None rather than zeros (no zeroed dlse, no dlse pass in each block's backward)."""

    @staticmethod
    def forward(ctx, q, k, v, group_name, causal, scale, mode, timeout, sm_margin):
        out, lse, lengths = _forward_impl(q, k, v, group_name, causal, scale, mode, timeout, sm_margin)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lengths)
        _setup_context(ctx, (q, k, v, group_name, causal, scale, mode, timeout, sm_margin), (out, lse, lengths))
        return out, lse, lengths

    @staticmethod
    def backward(ctx, dout, dlse, dlengths):
        q, k, v, out, lse, lengths = ctx.saved_tensors
        if dout is None:  # only lse was used
            dout = torch.zeros_like(out)
        if torch.is_grad_enabled():  # create_graph: through the custom op, as the op path records it
            dq, dk, dv = _backward_op(dout, dlse, q, k, v, out, lse, lengths, ctx.group_name, ctx.causal,
                                      ctx.scale, ctx.mode, ctx.sm_margin)
        else:
            dq, dk, dv = _backward_impl(dout, dlse, q, k, v, out, lse, lengths, ctx.group_name, ctx.causal,
                                        ctx.scale, ctx.mode, ctx.sm_margin)
        return dq, dk, dv, None, None, None, None, None, None


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                               causal: bool = False, scale: float | None = None, mode: str = "ring",
                               return_lse: bool = False, timeout: float = groups.DEFAULT_TIMEOUT_S,
                               sm_margin: int | None = None):
    """Attention over a sequence split across the ranks of ``group``: each rank passes its slice
    (q (B, Hq, n_rank, D), k and v (B, Hkv, n_rank, D), as tilecore.attention's layout) and gets its
    queries' output (and with ``return_lse`` their float32 log-sum-exp), as one
    ``tilecore.attention`` over the whole sequence would give them. Differentiable in q, k, v.

    The slices are the zigzag split of the sequence (``zigzag_shard``: rank r holds chunks r and
    2P-1-r of 2P), which balances the causal work; any sequence length (chunk lengths differ by at
    most one). ``mode``: "ring" (keys and values passed around the ring, each step's transfer under
    the step's attention, partial results merged by their log-sum-exp) or "all_to_all" (DeepSpeed
    Ulysses: heads shared out, the whole sequence gathered; q's heads must divide by the group's
    size). Grouped-query heads (Hq a multiple of Hkv) in both. ``group``: a ProcessGroup, its name
    or None (the default group); NCCL for CUDA tensors, gloo for CPU ones. ``scale`` defaults to
    D ** -0.5.

    Every call first gathers each rank's sizes and settings (a small gloo all-gather on the CPU,
    waited on for at most ``timeout`` seconds): inputs one rank refuses, settings that differ across
    ranks, slices that are not a zigzag split, raise on every rank; a rank that never calls gives
    the others a TimeoutError.

    ``sm_margin``: SMs each rank's attention (forward and backward) leaves free for the ring's
    transfers (tilecore.attention's sm_margin), every rank the same: m > 0 starts each ring transfer
    before the attention it hides under, the attentions beside a transfer on SMs - m programs and
    NCCL's kernels capped at m CTAs (a group of the same ranks made for it once); 0 keeps every SM
    for the attention, each transfer then after its step's attention (ring.TRANSFERS_EARLY). None
    (default): ring.RING_SM_MARGIN for the ring on CUDA (0: measured best on 2 H200s),
    0 elsewhere (all-to-all, one rank, CPU tensors). From 0 to the GPU's SMs - 1.
    """
    group = groups.resolve(group, NAME)
    try:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{NAME}: q, k and v must be torch.Tensors; got {name}: {type(t).__name__}")
            if t.dim() != 4:
                raise ValueError(f"{NAME}: q, k and v must be 4-D (batch, heads, sequence slice, head_dim); got "
                                 f"{name} of shape {tuple(t.shape)}")
        scale = q.shape[-1] ** -0.5 if scale is None else attention_op.scale_value(scale)
        check_settings(causal, mode, timeout)
        if sm_margin is not None and (isinstance(sm_margin, bool) or not isinstance(sm_margin, numbers.Integral)):
            raise TypeError(f"{NAME}: sm_margin must be None (the ring's default) or an int (SMs the attention "
                            f"leaves free, 0 to the GPU's SMs - 1); got {sm_margin!r}")
    except (TypeError, ValueError) as err:  # the others must hear of it, or they would wait for this rank
        check_across_ranks(None, None, None, group, causal, 1.0, mode, timeout if _positive(timeout) else 60.0,
                           type(err)(str(err).replace("attention: ", f"{NAME}: ")))
    sm_margin = (default_sm_margin(q.device, dist.get_world_size(group), mode) if sm_margin is None
                 else int(sm_margin))
    how = dispatch.eager_mode(q, k, v)
    if how == "autograd" and not FAST_HOST:
        how = "op"
    if how == "direct":
        out, lse, _ = _forward_impl(q, k, v, group.group_name, causal, scale, mode, timeout, sm_margin)
    elif how == "autograd":
        out, lse, _ = _ContextParallelFunction.apply(q, k, v, group.group_name, causal, scale, mode, timeout,
                                                     sm_margin)
    else:
        out, lse, _ = _forward_op(q, k, v, group.group_name, causal, scale, mode, timeout, sm_margin)
    return (out, lse) if return_lse else out


def _positive(timeout) -> bool:
    return isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < math.inf

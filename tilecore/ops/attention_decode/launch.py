"""Running the split-key (decode) plan: the split-key kernel (tl, or Hopper's Gluon kernel where the plan
says so) over the plan's key ranges, then the merge (attention's launch.forward calls launch_decode for a
"decode" plan). A keyed tl call (the plan's launch_key) runs from a per-key recipe (_DecodeLaunch: issue
31's host time) made at the key's first call; others take the general path."""
from __future__ import annotations

import importlib

import torch

from tilecore.ops.attention.kernels_tl import block_d, mask_options, score_options
from tilecore.ops.attention_decode import configs, kernels_tl
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import (LRU, CachedLaunch, KeyedLaunch, TmaOperand, cdiv, next_power_of_2, release,
                                   split_key_buffers, tl_addressable, tma_describable)
from tilecore.tiles.ops import LOG2E

SPLIT_KEYS = CachedLaunch(kernels_tl.attn_fwd_split_keys)
MERGE = CachedLaunch(kernels_tl.attn_merge_splits)
# (imported at its first launch: the Gluon modules load only where a launch needs them)
GLUON_SPLIT_KEYS = CachedLaunch(
    lambda: importlib.import_module("tilecore.ops.attention_decode.gluon_decode").attention_decode_kernel)


def launch_decode(plan, q, k, v, out, lse, causal: bool, scale: float, window=(-1, -1),
                  softcap: float = 0.0) -> None:
    """The split-key kernel over the plan's key ranges (its grid's second axis), then, with more than
    one, the merge (each range's float32 O and base-2 lse through buffers of their own)."""
    if plan.launch_key is not None and tiles_launch.BIND_KEYED_LAUNCHES:  # a keyed call: as its first call prepared
        prepared = _DECODE_LAUNCHES.memo(plan.launch_key,
                                         lambda: _DecodeLaunch.of(plan, q, k, v, causal, window, softcap))
        if prepared and (type(prepared) is _DecodeLaunch or out.is_contiguous() and out.data_ptr() % 16 == 0):
            # (the Gluon recipe stores O through a TMA view of it)
            prepared(q, k, v, out, lse, scale, softcap)
            return
    if plan.config.get("kernel") == "gluon":
        launch_decode_gluon(plan, q, k, v, out, lse, causal, scale, window, softcap)
        return
    B, Hq, N, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    q, k, v = tl_addressable(q), tl_addressable(k), tl_addressable(v)
    splits = plan.grid[1]
    merged = splits == 1
    rows_total = B * Hq * N
    if merged:
        o_part = lse_part = out  # unused
    else:
        o_part = out.new_empty((splits, rows_total, Dv), dtype=torch.float32)
        lse_part = lse.new_empty((splits, rows_total))
    masks, left, right = mask_options(causal, window, N, Nk)
    scores, scale_log2e, tanh_scale = score_options(scale, softcap)
    # large head dims (MLA's 576): Q K^T by column chunks (the kernel's BLOCK_DK)
    block_dk = block_d(D) if D <= configs.DECODE_WHOLE_HEAD_DIM else configs.DECODE_HEAD_DIM_CHUNK
    # one launch each, looked up by the plan's launch_key where it has one (attention launch.run's way)
    SPLIT_KEYS.run(plan.launch_key, plan.grid, (q, k, v, out, lse, o_part, lse_part, *q.stride(), *k.stride(),
                                                *v.stride(), Hkv, N, Nk, D, Dv, Hq // Hkv, plan.sizes["keys_per_split"],
                                                left, right, scale_log2e, tanh_scale),
                   dict(**masks, **scores, MERGED=merged, BLOCK_D=block_d(D), BLOCK_DV=block_d(Dv), BLOCK_DK=block_dk,
                        **plan.config))
    if not merged:
        MERGE.run(plan.launch_key, (rows_total,), (out, lse, o_part, lse_part, rows_total, Dv, splits),
                  dict(SPLITS=next_power_of_2(splits), BLOCK_D=block_d(Dv)))


def gluon_options(cfg: dict, masks: dict, softcap: float, splits: int) -> dict:
    """The Gluon split-key kernel's compile-time options, for the general launch and the keyed recipe alike; SOFTCAP
    as the Gluon forward's: 2, tanh.approx.f32, unless the config says tanh_approx False (1)."""
    return dict(**masks, SOFTCAP=(2 if cfg.get("tanh_approx", True) else 1) if softcap else 0, MERGED=splits == 1,
                STAGES=cfg["STAGES"], num_warps=4)


def launch_decode_gluon(plan, q, k, v, out, lse, causal: bool, scale: float, window=(-1, -1),
                        softcap: float = 0.0) -> None:
    """Hopper's Gluon split-key kernel (gluon_decode.py) on the plan's persistent grid (config PROGRAMS), then,
    with more than one key range, the tl merge. O and the float32 parts are TMA-stored through (vectors, group x
    N, Dv) views, in which a tile's rows are consecutive; an ``out`` no TMA view describes gets a contiguous
    buffer, copied in after."""
    B, Hq, N, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    cfg = plan.config
    splits = plan.grid[1]
    rows = (Hq // Hkv) * N  # a kv head's packed rows
    rows_total = B * Hq * N
    if splits == 1:
        contiguous = out.is_contiguous() and tma_describable(out)
        target = out if contiguous else torch.empty_like(out, memory_format=torch.contiguous_format)
        o_rows, lse_rows = target.view(B * Hkv, rows, Dv), lse
    else:
        target = None
        o_rows = out.new_empty((splits * B * Hkv, rows, Dv), dtype=torch.float32)
        lse_rows = lse.new_empty((splits, rows_total))
    masks, left, right = mask_options(causal, window, N, Nk)
    _, scale_log2e, tanh_scale = score_options(scale, softcap)
    if scale_log2e < 0:  # the kernel's softmax takes a positive factor: the sign goes into q (exact)
        q, scale_log2e = -q, -scale_log2e
    block_n = cfg["BLOCK_N"]
    GLUON_SPLIT_KEYS.run(
        plan.launch_key, (cfg["PROGRAMS"],),
        (q, TmaOperand(k, [1, 1, block_n, D]), TmaOperand(v, [1, 1, block_n, Dv]),
         TmaOperand(o_rows, [1, cfg["BLOCK_M"], Dv]), lse_rows, *q.stride(), Hkv, N, Nk, Hq // Hkv, B * Hkv, splits,
         plan.sizes["keys_per_split"], left, right, scale_log2e, tanh_scale),
        gluon_options(cfg, masks, softcap, splits))
    if splits == 1:
        if target is not out:
            out.copy_(target)
        return
    MERGE.run(plan.launch_key, (rows_total,), (out, lse, o_rows, lse_rows, rows_total, Dv, splits),
              dict(SPLITS=next_power_of_2(splits), BLOCK_D=block_d(Dv)))


class _DecodeLaunch:
    """launch_decode for one launch key (issue 31's host time): the split-key kernel's and the merge's
    KeyedLaunch, and every launch argument the key fixes (strides, sizes, the mask's bounds), made at the key's
    first call; a call then allocates the merge's partial buffers, computes the two score factors (the scale's
    and softcap's values are not in the key, their signs are) and launches. ``of`` gives False where the key's
    inputs need a contiguous copy first (tl_addressable: launch_decode's general path serves them)."""

    __slots__ = ("split", "merge", "part_shapes", "head", "tail", "device")

    @classmethod
    def of(cls, plan, q, k, v, causal: bool, window, softcap: float):
        if plan.config.get("kernel") == "gluon":
            return _GluonDecodeLaunch.of(plan, q, k, v, causal, window, softcap)
        if any(tl_addressable(t) is not t for t in (q, k, v)):
            return False
        self = cls()
        B, Hq, N, D = q.shape
        Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
        splits = plan.grid[1]
        rows_total = B * Hq * N
        masks, left, right = mask_options(causal, window, N, Nk)
        block_dk = block_d(D) if D <= configs.DECODE_WHOLE_HEAD_DIM else configs.DECODE_HEAD_DIM_CHUNK
        self.tail = (*q.stride(), *k.stride(), *v.stride(), Hkv, N, Nk, D, Dv, Hq // Hkv, plan.sizes["keys_per_split"],
                     left, right)
        self.split = KeyedLaunch(SPLIT_KEYS, plan.launch_key, plan.grid, dict(
            **masks, SOFTCAP=bool(softcap), MERGED=splits == 1, BLOCK_D=block_d(D), BLOCK_DV=block_d(Dv),
            BLOCK_DK=block_dk, **plan.config))
        # (lse's part's size, its offset: O's part (splits, rows, Dv) rounded up to 4 floats)
        self.part_shapes = None if splits == 1 else (splits * rows_total, cdiv(splits * rows_total * Dv, 4) * 4)
        self.merge = None if splits == 1 else KeyedLaunch(MERGE, plan.launch_key, (rows_total,), dict(
            SPLITS=next_power_of_2(splits), BLOCK_D=block_d(Dv)))
        self.head = (rows_total, Dv, splits)
        self.device = q.device
        return self

    def __call__(self, q, k, v, out, lse, scale: float, softcap: float) -> None:
        """O into ``out`` and lse into ``lse``; ``lse`` None (split keys only: a call returning O alone): the merged
        lse goes into the partial buffers' allocation."""
        if softcap:  # (score_options)
            scale_log2e, tanh_scale = softcap * LOG2E, scale / softcap
        else:
            scale_log2e, tanh_scale = scale * LOG2E, 0.0
        if self.part_shapes is None:
            self.split((q, k, v, out, lse, out, out, *self.tail, scale_log2e, tanh_scale))
            return
        lse_size, lse_offset = self.part_shapes
        parts, lse_part, kept_lse = split_key_buffers(q, lse_offset, lse_size, (self.split, self.merge),
                                                      None if lse is not None else self.head[0])
        lse = kept_lse if lse is None else lse
        try:
            self.split((q, k, v, out, lse, parts, lse_part, *self.tail, scale_log2e, tanh_scale))
            self.merge((out, lse, parts, lse_part, *self.head))
        finally:
            release(parts)  # (a raw block: back to the allocator once both launches are queued)

    def outputs(self, q, k, v, scale: float, softcap: float,
                want_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(O, lse) made and computed here (attention's direct eager call: contiguous, as launch.outputs makes
        them); without ``want_lse`` (a call that returns O alone) the merge's lse goes into the split parts'
        allocation instead of a tensor of its own, and None is returned for it."""
        B, Hq, N = q.shape[:3]
        out = q.new_empty((B, Hq, N, v.shape[3]))  # (q's dtype and device: ~0.7 us under torch.empty's, H100 host)
        lse = q.new_empty((B, Hq, N), dtype=torch.float32) if want_lse or self.part_shapes is None else None
        self(q, k, v, out, lse, scale, softcap)
        return out, lse


class _GluonDecodeLaunch:
    """launch_decode_gluon for one launch key (issue 31's host time, as _DecodeLaunch for the tl kernel): the Gluon
    kernel's KeyedLaunch with k's, v's and O's (or the parts') TMA views made from the tensors at their positions
    (the key fixes their shapes, strides and boxes), the merge's, and every argument the key fixes. A call
    allocates the parts (several key ranges), takes the score factors from its scale and softcap (their signs are
    in the key; a negative scale goes into q) and launches. ``of`` gives False where ``out`` would need a view
    the key does not fix (launch_decode_gluon each call then)."""

    __slots__ = ("split", "merge", "head", "tail", "parts_shape", "rows_total", "dv", "splits")

    @classmethod
    def of(cls, plan, q, k, v, causal: bool, window, softcap: float):
        B, Hq, N, D = q.shape
        Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
        cfg = plan.config
        self = cls()
        self.splits = splits = plan.grid[1]
        rows = (Hq // Hkv) * N
        self.rows_total, self.dv = B * Hq * N, Dv
        vectors = splits * B * Hkv
        masks, left, right = mask_options(causal, window, N, Nk)
        block_n, block_m = cfg["BLOCK_N"], cfg["BLOCK_M"]
        # O (one range: out itself, contiguous) or the float32 parts as (vectors, rows, Dv)
        o_view = lambda t: TmaOperand(t, [1, block_m, Dv], shape=[vectors, rows, Dv], strides=[rows * Dv, Dv, 1])
        self.split = KeyedLaunch(GLUON_SPLIT_KEYS, plan.launch_key, (cfg["PROGRAMS"],),
                                 gluon_options(cfg, masks, softcap, splits), operands={
            1: lambda t: TmaOperand(t, [1, 1, block_n, D]), 2: lambda t: TmaOperand(t, [1, 1, block_n, Dv]),
            3: o_view})
        self.head = q.stride()
        self.tail = (Hkv, N, Nk, Hq // Hkv, B * Hkv, splits, plan.sizes["keys_per_split"], left, right)
        self.parts_shape = (vectors * rows * Dv,)
        self.merge = None if splits == 1 else KeyedLaunch(MERGE, plan.launch_key, (self.rows_total,), dict(
            SPLITS=next_power_of_2(splits), BLOCK_D=block_d(Dv)))
        return self

    def __call__(self, q, k, v, out, lse, scale: float, softcap: float) -> None:
        """O into ``out`` (contiguous: else launch_decode_gluon's copy) and lse into ``lse``."""
        if softcap:  # (score_options)
            scale_log2e, tanh_scale = softcap * LOG2E, scale / softcap
        else:
            scale_log2e, tanh_scale = scale * LOG2E, 0.0
        if scale_log2e < 0:
            q, scale_log2e = -q, -scale_log2e
        if self.merge is None:
            self.split((q, k, v, out, lse, *self.head, *self.tail, scale_log2e, tanh_scale))
            return
        parts = out.new_empty(self.parts_shape, dtype=torch.float32)
        lse_part = lse.new_empty((self.splits * self.rows_total,))
        self.split((q, k, v, parts, lse_part, *self.head, *self.tail, scale_log2e, tanh_scale))
        self.merge((out, lse, parts, lse_part, self.rows_total, self.dv, self.splits))

    def outputs(self, q, k, v, scale: float, softcap: float,
                want_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(O, lse) made and computed here, contiguous (_DecodeLaunch.outputs'; lse is always made)."""
        B, Hq, N = q.shape[:3]
        out = q.new_empty((B, Hq, N, self.dv))
        lse = q.new_empty((B, Hq, N), dtype=torch.float32)
        self(q, k, v, out, lse, scale, softcap)
        return out, lse


def prepared(plan, q, k, v, causal: bool, window, softcap: float):
    """The _DecodeLaunch of ``plan``'s launch key (made at its first call), False where launch_decode's general
    path serves it, None where the plan has no key or BIND_KEYED_LAUNCHES is off."""
    if plan.launch_key is None or not tiles_launch.BIND_KEYED_LAUNCHES:
        return None
    return _DECODE_LAUNCHES.memo(plan.launch_key, lambda: _DecodeLaunch.of(plan, q, k, v, causal, window, softcap))


_DECODE_LAUNCHES = LRU(256)  # a plan's launch key -> its _DecodeLaunch (False: launch_decode's general path)

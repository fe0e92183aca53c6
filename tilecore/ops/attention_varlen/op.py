"""``tilecore.attention_varlen``: attention over packed variable-length batches (flash-attn's varlen
layout), forward and backward, as ``torch.library`` custom ops with autograd.

Layout: q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv): the sequences' rows one
after another; cu_seqlens_q / cu_seqlens_k int32 (B + 1,) with sequence b owning rows
[cu[b], cu[b + 1]). lse is float32 (Hq, total_q), as flash-attn's varlen returns it.

CUDA tensors run the Gluon kernels on Hopper (gluon_forward.py, gluon_backward.py where configs.py routes
them), else kernels_tl.py's: no host sync (the grid is sized from the shapes,
cdiv(total, block) + B programs a head, and each program finds its sequence on the device), so a
call can be captured in a CUDA graph. CPU tensors run the per-sequence reference in float32
(reference.py, torch's CPU matmuls), or the tl kernels through Triton's interpreter under
TRITON_INTERPRET=1.
"""
from __future__ import annotations

import importlib
import math
import numbers
from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.attention import configs as fixed_configs
from tilecore.ops.attention.op import scale_value
from tilecore.ops.attention_varlen import configs
from tilecore.ops.attention_varlen.reference import varlen_backward_reference, varlen_reference
from tilecore.ops.attention_varlen.work import RANKED_MAX_BATCH
from tilecore.tiles import eager
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import (LRU, CachedLaunch, KeyedLaunch, SignatureMemo, TmaOperand, cdiv, next_power_of_2,
                                   signature, tl_addressable, tma_describable)
from tilecore.tiles.switches import generation

# the keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_CALL_KEY = SignatureMemo(globals())

DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = DTYPES + (torch.float32,)
MAX_HEAD_DIM = 256
LAYOUT = ("attention_varlen takes packed q (total_q, heads, head_dim), k and v (total_k, kv_heads, head_dim[_v]) "
          "and int32 cu_seqlens_q / cu_seqlens_k of shape (batch + 1,) (flash-attn's varlen layout)")


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _compiled(device: torch.device) -> bool:
    return dispatch.backend_for(device) == "kernel" and not dispatch.interpreted(device)


# --------------------------------------------------------------------------------------------
# checks shared with attention_with_kvcache


def check_window(where: str, causal, window_size, softcap) -> tuple[int, int]:
    """(left, right) of window_size as ints, after checking it, causal and softcap."""
    if not isinstance(causal, bool):
        raise TypeError(f"{where}: causal must be True or False, got {causal!r}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"{where}: window_size must be a pair (left, right) of ints >= -1 (-1: unbounded), "
                        f"got {window_size!r}") from None
    for side in (left, right):
        if isinstance(side, bool) or not isinstance(side, numbers.Integral) or side < -1:
            raise ValueError(f"{where}: window_size must be a pair (left, right) of ints >= -1 (-1: unbounded), "
                             f"got {window_size!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not math.isfinite(softcap) \
            or softcap < 0:
        raise ValueError(f"{where}: softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    return int(left), int(right)


def kernel_window(causal: bool, left: int, right: int) -> tuple[int, int, bool, bool]:
    """(left, right, LEFT, RIGHT) as the kernels take them: causal is right = 0 (or a smaller given
    right), an unbounded side off (its value 0)."""
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return max(left, 0), max(right, 0), left >= 0, right >= 0


def check_dtypes(where: str, tensors: dict, device) -> None:
    dtypes = DTYPES if _compiled(device) else CPU_DTYPES
    first = next(iter(tensors.values()))
    if first.dtype not in dtypes or any(t.dtype != first.dtype for t in tensors.values()):
        on_gpu = " on the GPU (float32 is taken on the CPU)" if _compiled(device) else ""
        got = ", ".join(f"{n} {_name(t.dtype)}" for n, t in tensors.items())
        raise TypeError(f"{where}: {', '.join(tensors)} must share one dtype among "
                        f"{', '.join(map(_name, dtypes))}{on_gpu}; got {got}")


def should_validate(validate: Optional[bool], device: torch.device) -> bool:
    """Value checks (which read device values on the host): on CPU tensors by default; on the GPU only
    with validate=True (a host sync: never on the hot path by default); never while torch.compile
    traces."""
    if torch.compiler.is_compiling():  # values are unknown while tracing (eager calls check them)
        return False
    return device.type == "cpu" if validate is None else bool(validate)


def check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window_size, softcap,
          validate) -> tuple[int, int]:
    where = "attention_varlen"
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{where}: q, k and v must be 3-D; got {name} of shape {tuple(t.shape)} ({LAYOUT})")
    devices = {t.device for t in (q, k, v, cu_seqlens_q, cu_seqlens_k)}
    if len(devices) != 1:
        raise ValueError(f"{where}: q, k, v and the cu_seqlens must be on one device; got {sorted(map(str, devices))}")
    dispatch.backend_for(q.device)
    check_dtypes(where, {"q": q, "k": k, "v": v}, q.device)
    (total_q, hq, d), (total_k, hkv, dk), (total_v, hv, dv) = q.shape, k.shape, v.shape
    if dk != d or (total_v, hv) != (total_k, hkv):
        raise ValueError(f"{where}: k must be (total_k, kv_heads, head_dim) with q's head_dim and v (total_k, "
                         f"kv_heads, head_dim_v); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(f"{where}: head dims must be from 1 to {MAX_HEAD_DIM}; got q/k {d}, v {dv} ({LAYOUT})")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"{where}: q's heads ({hq}) must be a multiple of k's and v's ({hkv}) (grouped-query "
                         f"attention) ({LAYOUT})")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{where}: {name} must be a 1-D int32 tensor of batch + 1 >= 2 offsets; got "
                             f"{_name(cu.dtype)} of shape {tuple(cu.shape)}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"{where}: cu_seqlens_q and cu_seqlens_k must have one entry per sequence + 1 each; "
                         f"got {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0:
            raise ValueError(f"{where}: {name} must be an int >= 0, got {m!r}")
    if scale is not None:
        scale_value(scale)
    left, right = check_window(where, causal, window_size, softcap)
    if should_validate(validate, q.device):
        for name, cu, total, longest in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
                                         ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k)):
            values = cu.tolist()
            lengths = [b - a for a, b in zip(values, values[1:])]
            if values[0] != 0 or min(lengths) < 0:
                raise ValueError(f"{where}: {name} must start at 0 and never decrease; got {values}")
            if values[-1] != total:
                raise ValueError(f"{where}: {name}[-1] must be the packed rows' count ({total}); got {values[-1]}")
            if max(lengths) > longest:
                raise ValueError(f"{where}: {name.replace('cu_seqlens', 'max_seqlen')} ({longest}) is less than the "
                                 f"longest sequence ({max(lengths)})")
    return left, right


# --------------------------------------------------------------------------------------------
# launches


def block_config(d: int, interpret: bool, kernel: str, device: torch.device | None = None) -> dict:
    """Blocks and launch options of ``kernel`` ("forward", "dkdv", "dq"): the interpreter's smallest
    tl.dot blocks (odd lengths then span several blocks in small tests); on a GPU, untimed yet, the
    largest that compile for sm_90a without spilling at D 128 with window and softcap on (ptxas:
    forward 64 x 64 in 3 stages 194 registers; dK/dV 32 queries x 128 keys, 8 warps, 1 stage, 255
    registers, where 64 x 64 in 2 stages spilled 612 B; dQ 64 x 64 in 2 stages 246 registers), with
    configs.SHARED_FITS's overrides on a ``device`` whose blocks get less shared memory."""
    if interpret:
        return dict(BLOCK_M=16, BLOCK_N=16)
    if d <= 128:
        cfg = {"forward": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
               "dkdv": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=1),
               "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)}[kernel]
    else:
        cfg = {"forward": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
               "dkdv": dict(BLOCK_M=16, BLOCK_N=64, num_warps=8, num_stages=1),
               "dq": dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)}[kernel]
    if device is not None:
        rows = (dispatch.shared_memory_fit(device, configs.SHARED_FITS, "attention_varlen") or {}).get(kernel, {})
        largest = next((b for b in sorted(rows) if d <= b), None)  # the row of the head dims up to b
        if largest is not None:
            cfg = {**cfg, **rows[largest]}
    return cfg


# tanh by tanh.approx.f32 in the varlen tl kernels on a GPU (sm_90a: forward div 99 -> 67, ex2 66 -> 34,
# no spill): checked on the H100 (window + softcap 20, GQA, lengths 0/1), softcap 30 at 0.828x / 0.874x
# the no-softcap forward / backward against exp2's 0.715x / 0.776x (notes/attention)
VARLEN_TANH_APPROX = True


def softcap_mode(softcap: float, device, tanh_approx: bool | None = None) -> int:
    """The varlen kernels' SOFTCAP constexpr: 0 without a softcap; 1, tanh through exp2 (the
    interpreter's: no inline asm there; and ROCm's: the asm is PTX); 2, tanh by tanh.approx.f32, on an
    NVIDIA GPU where VARLEN_TANH_APPROX (the Gluon kernels' default, its error invisible
    at bf16 / fp16 there); ``tanh_approx`` (probes) in place of VARLEN_TANH_APPROX."""
    if softcap <= 0:
        return 0
    approx = VARLEN_TANH_APPROX if tanh_approx is None else tanh_approx
    return 2 if approx and not dispatch.interpreted(device) and not dispatch.is_rocm(device) else 1


def block_d(d: int) -> int:
    return max(16, next_power_of_2(d))


def _cu_blocks(cu: torch.Tensor, block: int) -> torch.Tensor:
    """(B + 1,) int32: running count of each sequence's blocks of ``block`` rows (device torch ops)."""
    blocks = torch.div(cu[1:] - cu[:-1] + (block - 1), block, rounding_mode="floor")
    return torch.cat([cu.new_zeros(1), torch.cumsum(blocks, 0, dtype=torch.int32)])


def _search_steps(batch: int) -> int:
    """Binary-search steps for ``batch`` sequences, rounded up to a multiple of 4 and at least 8 (a
    constexpr: one compiled kernel serves every batch up to 255 sequences, not one per log2 B)."""
    return max(8, -(-batch.bit_length() // 4) * 4)


def _strides(t: torch.Tensor) -> tuple:
    return tuple(t.stride())


# --------------------------------------------------------------------------------------------
# Hopper's Gluon forward (gluon_forward.py)

GLUON_VARLEN_FWD = CachedLaunch(
    lambda: importlib.import_module("tilecore.ops.attention_varlen.gluon_forward").attention_varlen_fwd_kernel)
WORK_TABLE = CachedLaunch(lambda: importlib.import_module("tilecore.ops.attention_varlen.kernels_tl").varlen_work_table)
WORK_TABLE_RANKED = CachedLaunch(
    lambda: importlib.import_module("tilecore.ops.attention_varlen.work").varlen_work_table_ranked)
# the work table with its order in one launch (work.py) for batches up to its RANKED_MAX_BATCH: on (the
# same table as the two-step one, 76 us a call against 225 on the H100; notes/attention); off: False (the
# argsort path)
VARLEN_RANKED_TABLE = True


def gluon_device(device: torch.device) -> bool:
    """A CUDA device the Gluon kernels run on (Hopper, a compile-checked triton), not interpreted."""
    return device.type == "cuda" and not dispatch.interpreted(device) and dispatch.gluon_ok(device)


def gluon_masks(causal: bool, left: int, right: int) -> tuple[bool, bool]:
    """(CAUSAL, WINDOW) of the Gluon varlen forward: no mask; causal (also a window (-1, 0)); or a
    window."""
    wl, wr, has_left, has_right = kernel_window(causal, left, right)
    if not has_left and not has_right:
        return False, False
    if not has_left and wr == 0:
        return True, False
    return False, True


def gluon_forward_fits(q, k, v, causal, left, right, use_gluon=None, features=None) -> bool:
    """Whether the Gluon varlen forward serves these inputs: configs.VARLEN_GLUON_FORWARD (or
    ``use_gluon``), a Hopper device under a compile-checked triton (dispatch.gluon_ok), not
    interpreted, D == Dv with a config, a window only where configs.VARLEN_GLUON_FEATURES (or
    ``features``) names it, TMA-describable tensors."""
    wanted = configs.VARLEN_GLUON_FORWARD if use_gluon is None else use_gluon
    if not wanted or not gluon_device(q.device):
        return False
    if gluon_masks(causal, left, right)[1] and "window" not in (configs.VARLEN_GLUON_FEATURES if features is None
                                                                else features):
        return False
    d, dv = q.shape[2], v.shape[2]
    return (d == dv and d in configs.VARLEN_GLUON_FORWARD_CONFIG and q.dtype in DTYPES
            and all(tma_describable(t.transpose(0, 1)) for t in (q, k, v)))


WORK_TABLE_MAX_BATCH = 4096  # past it the table is built by torch ops (the tl kernel holds every sequence)


def work_order(cu_q: torch.Tensor, cu_k: torch.Tensor) -> torch.Tensor:
    """The sequences longest first: by N x Nk, descending, ties in batch order (device torch ops)."""
    lens_q = (cu_q[1:] - cu_q[:-1]).long()
    lens_k = (cu_k[1:] - cu_k[:-1]).long()
    return torch.argsort(lens_q * lens_k, descending=True, stable=True)


def work_table(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, heads: int, tile_m: int,
               key=None, ranked: bool | None = None) -> torch.Tensor:
    """The Gluon varlen forward's work items, (tiles, 4) int32 on cu_q's device, built there (no host
    sync): (sequence, query tile counted from the sequence's last row, q head, 0), sequences longest
    first (``work_order``), a sequence's tiles head by head, a head's from the last rows to the
    first. Its length is an upper bound from the shapes, (cdiv(total_q, tile_m) + B) x heads;
    entries past the real tiles are (-1, 0, 0, 0). One tl launch after the sort
    (kernels_tl.varlen_work_table) up to WORK_TABLE_MAX_BATCH sequences, else
    ``work_table_torch``. ``key``: the call's launch key (the table kernel launched by it; the table itself
    is built every call: it reads cu_q's values). ``ranked`` (None: VARLEN_RANKED_TABLE): the order and the
    table in one launch (work.py) where the batch has at most its RANKED_MAX_BATCH sequences."""
    batch = cu_q.numel() - 1
    if dispatch.backend_for(cu_q.device) != "kernel" or batch > WORK_TABLE_MAX_BATCH:
        return work_table_torch(cu_q, cu_k, total_q, heads, tile_m)
    entries = (cdiv(total_q, tile_m) + batch) * heads
    table = torch.empty((entries, 4), dtype=torch.int32, device=cu_q.device)
    block_b = max(16, next_power_of_2(batch))
    block_t = max(1, 4096 // block_b)  # [BLOCK_T, BLOCK_B] compares of 4096: no spill on sm_90a (16384 spilled 9 KB)
    grid, blocks = (cdiv(entries, block_t),), dict(TILE_M=tile_m, BLOCK_B=block_b, BLOCK_T=block_t)
    if (VARLEN_RANKED_TABLE if ranked is None else ranked) and batch <= RANKED_MAX_BATCH:
        WORK_TABLE_RANKED.run(key, grid, (cu_q, cu_k, table, batch, entries, heads), blocks)
    else:
        order = work_order(cu_q, cu_k).to(torch.int32)
        WORK_TABLE.run(key, grid, (cu_q, order, table, batch, entries, heads), blocks)
    return table


def work_table_torch(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, heads: int, tile_m: int) -> torch.Tensor:
    """``work_table`` by torch ops alone (~25 small launches; the tl kernel's twin and its fallback)."""
    batch = cu_q.numel() - 1
    order = work_order(cu_q, cu_k)
    tiles = torch.div((cu_q[1:] - cu_q[:-1]).long()[order] + (tile_m - 1), tile_m, rounding_mode="floor")
    per_sequence = tiles * heads
    ends = torch.cumsum(per_sequence, 0)
    t = torch.arange((cdiv(total_q, tile_m) + batch) * heads, device=cu_q.device)
    rank = torch.searchsorted(ends, t, right=True)
    real = rank < batch
    rank = rank.clamp(max=batch - 1)
    local = t - (ends[rank] - per_sequence[rank])
    count = tiles[rank].clamp(min=1)
    zero = torch.zeros_like(t)
    table = torch.stack([torch.where(real, order[rank], -1), torch.where(real, local % count, zero),
                         torch.where(real, torch.div(local, count, rounding_mode="floor"), zero), zero], 1)
    return table.to(torch.int32)


def packed_operand(t: torch.Tensor, rows: int) -> TmaOperand:
    """A packed (total, heads, D) tensor as a TMA operand over its (heads, total, D) view, boxes of
    ``rows`` rows of one head (the view given as shape and strides of t's memory: no view op a call)."""
    total, heads, d = t.shape
    s_total, s_heads, s_d = t.stride()
    return TmaOperand(t, [1, rows, d], shape=(heads, total, d), strides=(s_heads, s_total, s_d))


def gluon_scores(scale: float, softcap: float, tanh_approx: bool | None = None) -> tuple[float, float, int]:
    """(scale_log2e, tanh_scale, SOFTCAP) as the Gluon varlen kernels take them: launch.score_options's
    scores and launch.gluon_softcap's mode (tanh by tanh.approx.f32 unless ``tanh_approx`` is False)."""
    from tilecore.ops.attention.launch import gluon_softcap, score_options

    _, scale_log2e, tanh_scale = score_options(scale, softcap)
    return scale_log2e, tanh_scale, gluon_softcap(softcap, {"tanh_approx": tanh_approx is not False})


def gluon_window(causal: bool, left: int, right: int, total_q: int, total_k: int) -> tuple[int, int]:
    """(left, right) as the Gluon varlen kernels take them: kernel_window's, an unbounded side past any key
    distance in a sequence (no wrap in 32 bits)."""
    wl, wr, has_left, has_right = kernel_window(causal, left, right)
    unbounded = max(total_q, total_k, 1)  # a side past it is unbounded too (the kernels' key - query + left)
    return (min(wl, unbounded) if has_left else unbounded), (min(wr, unbounded) if has_right else unbounded)


def forward_gluon(q, k, v, cu_q, cu_k, causal, scale, softcap, left=-1, right=-1, out=None, lse=None, config=None,
                  tanh_approx=None, key=None):
    """O (total_q, Hq, D) and lse (Hq, total_q) by the Gluon varlen forward (gluon_forward.py), into
    ``out`` (contiguous) / ``lse`` where given; ``left`` / ``right``: window_size's (-1: unbounded);
    ``config`` in place of configs.VARLEN_GLUON_FORWARD_CONFIG[D]; the softcap's tanh by
    tanh.approx.f32 unless ``tanh_approx`` is False (the fixed Gluon forward's default). ``key``: the call's
    launch key (attention_varlen's signature: fresh out and lse, the default config), or None."""
    from tilecore.tiles.launch import tile_counter

    total_q, hq, d = q.shape
    hkv = k.shape[1]
    if out is None:
        out = torch.empty((total_q, hq, d), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return out, lse
    layout = _GLUON_FORWARD_LAYOUTS.memo(key, lambda: _GluonForwardLayout(
        q, k, cu_q, causal, scale, softcap, left, right, config, tanh_approx))
    block_m, block_n = layout.block_m, layout.block_n
    work = work_table(cu_q, cu_k, total_q, hq, layout.table_rows, key=key, ranked=layout.ranked)
    num_tiles = work.shape[0]
    args = (packed_operand(q, block_m), packed_operand(k, block_n), packed_operand(v, block_n),
            packed_operand(out, block_m), out, out.stride(0), lse, cu_q, cu_k, work, num_tiles, hq // hkv, total_q,
            layout.scale_log2e, layout.tanh_scale, layout.wl, layout.wr,
            tile_counter(q.device) if layout.drawn else None)
    grid = (min(num_tiles, layout.sms),)
    GLUON_VARLEN_FWD.run(key, grid, args, layout.options)  # on q's device; by key where given
    if key is not None and config is None and tanh_approx is None and tiles_launch.BIND_KEYED_LAUNCHES \
            and key not in _GLUON_FORWARDS:  # the key's launches, kept for its next calls (_forward_impl)
        _GLUON_FORWARDS.put(key, _GluonForward.of(layout, key, q, cu_q, out, args[10:17], grid))
    return out, lse


class _GluonForward:
    """forward_gluon for one launch key (issue 31's host time): the work table's and the forward's
    KeyedLaunch (the forward's four packed descriptors as tensors: KeyedLaunch's operands, encoded once per
    address) and every argument the key fixes, made after the key's first call; a call then allocates O, lse and
    the table, builds the table from cu_seqlens' values on the GPU (every call, as forward_gluon) and launches.
    ``of`` gives False where the table is built by torch ops alone (past WORK_TABLE_MAX_BATCH sequences)."""

    __slots__ = ("table", "table_tail", "ranked", "forward", "fixed", "counter", "shapes", "dtype", "device")

    @classmethod
    def of(cls, layout, key, q, cu_q, out, fixed: tuple, grid):
        batch = cu_q.numel() - 1
        if batch > WORK_TABLE_MAX_BATCH or q.shape[0] == 0:
            return False
        self = cls()
        total_q, hq, d = q.shape
        bm, bn = layout.block_m, layout.block_n
        entries = (cdiv(total_q, layout.table_rows) + batch) * hq
        block_b = max(16, next_power_of_2(batch))
        block_t = max(1, 4096 // block_b)  # (work_table's)
        self.ranked = (VARLEN_RANKED_TABLE if layout.ranked is None else layout.ranked) and batch <= RANKED_MAX_BATCH
        self.table = KeyedLaunch(WORK_TABLE_RANKED if self.ranked else WORK_TABLE, key, (cdiv(entries, block_t),),
                                 dict(TILE_M=layout.table_rows, BLOCK_B=block_b, BLOCK_T=block_t))
        self.table_tail = (batch, entries, hq)
        # the forward's arguments the key fixes (num_tiles, group, total_q, the scores' factors, the window), between
        # the per-call ones (descriptors, out, its row stride, lse, cu_q, cu_k, work) and the tile counter
        self.fixed = fixed
        self.counter = layout.drawn
        self.forward = KeyedLaunch(GLUON_VARLEN_FWD, key, grid, layout.options, operands={
            0: lambda t: packed_operand(t, bm), 1: lambda t: packed_operand(t, bn), 2: lambda t: packed_operand(t, bn),
            3: lambda t: packed_operand(t, bm)})
        self.shapes = ((total_q, hq, d), (hq, total_q), (entries, 4), out.stride(0))
        self.dtype, self.device = q.dtype, q.device
        return self

    def __call__(self, q, k, v, cu_q, cu_k, want_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(O, lse); without ``want_lse`` (a call returning O alone) lse goes into the work table's allocation
        (both 4-byte elements, lse 16-byte aligned after the table: by address where the forward goes the kept way)
        and None is returned for it."""
        shapes, device = self.shapes, self.device
        # (new_empty: q's dtype and device, the key's; ~1 us an allocation under torch.empty's with device=)
        out = q.new_empty(shapes[0])
        if want_lse:
            lse = q.new_empty(shapes[1], dtype=torch.float32)
            work = q.new_empty(shapes[2], dtype=torch.int32)
        else:
            table = shapes[2][0] * 4  # (int32 entries: a multiple of 4)
            size = table + shapes[1][0] * shapes[1][1]
            work = tiles_launch.scratch(4 * size, (self.table, self.forward))  # (a raw block where RAW_SCRATCH)
            if work is not None:
                lse = work + 4 * table
            else:
                work = q.new_empty((size,), dtype=torch.int32)
                lse = work.data_ptr() + 4 * table if self.forward.kept() else work[table:].view(torch.float32)
        try:
            self.table((cu_q, cu_k if self.ranked else work_order(cu_q, cu_k).to(torch.int32), work,
                        *self.table_tail))
            self.forward((q, k, v, out, out, shapes[3], lse, cu_q, cu_k, work, *self.fixed,
                          tiles_launch.kept_tile_counter(device) if self.counter else None))
        finally:
            tiles_launch.release(work)  # (a raw block: back to the allocator once both launches are queued)
        return out, (lse if want_lse else None)


_GLUON_FORWARDS = LRU(256)  # forward_gluon's launch key -> its _GluonForward (False: forward_gluon each call)


class _GluonForwardLayout:
    """forward_gluon's settings that its launch key fixes (config, scores, masks, window, options): made once
    per key (issue 31's host time), each call where there is none."""

    __slots__ = ("block_m", "block_n", "table_rows", "ranked", "scale_log2e", "tanh_scale", "wl", "wr", "drawn",
                 "sms", "options")

    def __init__(self, q, k, cu_q, causal, scale, softcap, left, right, config, tanh_approx):
        cfg = dict(config or configs.VARLEN_GLUON_FORWARD_CONFIG[q.shape[2]])
        self.block_m, self.block_n, consumers = cfg["block_m"], cfg["block_n"], cfg.get("consumers", 2)
        self.table_rows = self.block_m * consumers
        self.ranked = cfg.get("ranked_table")
        self.scale_log2e, self.tanh_scale, mode = gluon_scores(scale, softcap, tanh_approx)
        is_causal, window = gluon_masks(causal, left, right)
        self.wl, self.wr = gluon_window(causal, left, right, q.shape[0], k.shape[0])
        self.drawn = cfg.get("drawn", True)
        self.sms = dispatch.num_sms(q.device)
        self.options = dict(CAUSAL=is_causal, SOFTCAP=mode, STAGES=cfg["stages"], CONSUMERS=consumers,
                            Q_BUFFERS=cfg.get("q_buffers", 2), WINDOW=window, ZERO_TAIL_V=cfg.get("zero_tail_v", False),
                            num_warps=4)


_GLUON_FORWARD_LAYOUTS = LRU(256)  # forward_gluon's launch key -> its _GluonForwardLayout


# --------------------------------------------------------------------------------------------
# Hopper's Gluon backward (gluon_backward.py)

GLUON_VARLEN_BWD = CachedLaunch(
    lambda: importlib.import_module("tilecore.ops.attention_varlen.gluon_backward").attention_varlen_bwd_kernel)
GLUON_VARLEN_DQ = CachedLaunch(
    lambda: importlib.import_module("tilecore.ops.attention_varlen.gluon_backward").attention_varlen_dq_kernel)


def gluon_backward_fits(q, k, v, causal, left, right, use_gluon=None, features=None) -> bool:
    """Whether the Gluon varlen backward serves these inputs: configs.VARLEN_GLUON_BACKWARD (or
    ``use_gluon``), a Hopper device under a compile-checked triton (dispatch.gluon_ok), not
    interpreted, D == Dv with a config, a window only where configs.VARLEN_GLUON_BACKWARD_FEATURES (or
    ``features``) names it, TMA-describable q, k, v."""
    wanted = configs.VARLEN_GLUON_BACKWARD if use_gluon is None else use_gluon
    if not wanted or not gluon_device(q.device):
        return False
    is_causal, window = gluon_masks(causal, left, right)
    if window and "window" not in (configs.VARLEN_GLUON_BACKWARD_FEATURES if features is None else features):
        return False
    d, dv = q.shape[2], v.shape[2]
    return (d == dv and (d, is_causal or window) in configs.VARLEN_GLUON_BACKWARD_CONFIG and q.dtype in DTYPES
            and all(tma_describable(t.transpose(0, 1)) for t in (q, k, v)))


def neighbour_rows_nonfinite(q, k, v, dout, stats, cu_q, cu_k, block_m: int, tile_n: int) -> torch.Tensor:
    """(sequences,) int32, nonzero where a row that the Gluon varlen backward's boxes read outside the
    sequence holds an inf or NaN: the up to 3 rows before its first query block's own (query blocks start
    at packed rows that are multiples of 4), the block_m rows after its last query, their row statistics
    (``stats`` (Hq, 2, total_q): lse, delta), and the tile_n keys after its last key. Torch ops on the
    device (no host sync: CUDA-graph capturable), reading ~(block_m + 3) query rows and tile_n key rows a
    sequence; the kernel's ZERO_TAIL 2 zeroes those rows in shared memory only for the sequences marked."""
    total_q, total_k = q.shape[0], k.shape[0]
    dev = q.device

    def rows(at, total):  # packed rows clamped into the tensor, and which of them exist
        return at.clamp(0, max(total - 1, 0)), (at >= 0) & (at < total)

    q_at, q_in = rows(torch.cat([cu_q[:-1].to(torch.int64).unsqueeze(1) + torch.arange(-3, 0, device=dev),
                                 cu_q[1:].to(torch.int64).unsqueeze(1) + torch.arange(block_m, device=dev)], 1),
                      total_q)
    k_at, k_in = rows(cu_k[1:].to(torch.int64).unsqueeze(1) + torch.arange(tile_n, device=dev), total_k)
    bad = torch.zeros(q_at.shape[0], dtype=torch.bool, device=dev)
    for t in (q, dout):
        bad |= (~torch.isfinite(t[q_at]).flatten(2).all(2) & q_in).any(1)
    lse_rows, delta_rows = stats[:, 0, q_at], stats[:, 1, q_at]  # (Hq, sequences, rows)
    # lse +inf: a row that sees no key (its p is 0 either way); NaN or -inf would make p NaN
    stats_ok = (~torch.isnan(lse_rows) & (lse_rows != float("-inf")) & torch.isfinite(delta_rows)).all(0)
    bad |= (~stats_ok & q_in).any(1)
    for t in (k, v):
        bad |= (~torch.isfinite(t[k_at]).flatten(2).all(2) & k_in).any(1)
    return bad.to(torch.int32)


def backward_gluon(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap, grads=None,
                   config=None, tanh_approx=None):
    """(dq, dk, dv) by the Gluon varlen backward (gluon_backward.py) after the fixed path's
    preprocess (launch.backward_preprocess on the packed tensors as one batch of total_q rows: delta,
    the (Hq, 2, total_q) row statistics, and for a dQ in the kernel a zeroed float32 (Hq, total_q, D)
    dQ), into ``grads`` (contiguous) where given; with the config's dq_from "gluon", dK/dV alone and
    then dQ by attention_varlen_dq_kernel over the forward's work table (configs.GLUON_DQ's blocks);
    ``config`` in place of configs.varlen_gluon_backward_config; the softcap's tanh by
    tanh.approx.f32 unless ``tanh_approx`` is False."""
    from tilecore.ops.attention.launch import backward_preprocess, row_stats_operand
    from tilecore.tiles.launch import tile_counter

    total_q, hq, d = q.shape
    total_k, hkv, _ = k.shape
    if total_q == 0 or total_k == 0:  # no query or no key: nothing flows back
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if grads is None:
        grads = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dq, dk, dvv = grads
    if not tma_describable(dout.transpose(0, 1)):
        dout = dout.contiguous()
    is_causal, window = gluon_masks(causal, left, right)
    cfg = dict(config or configs.varlen_gluon_backward_config(d, is_causal or window))
    block_m, block_n = cfg["block_m"], cfg["block_n"]
    dq_after = fixed_configs.DQ_MODES[cfg["dq_from"]] == 0
    lse = lse.contiguous()
    zero_tail = cfg.get("zero_tail", False)
    scale_log2e, tanh_scale, mode = gluon_scores(scale, softcap, tanh_approx)
    wl, wr = gluon_window(causal, left, right, total_q, total_k)
    delta, dq_sum, stats = backward_preprocess(out.transpose(0, 1).unsqueeze(0), dout.transpose(0, 1).unsqueeze(0),
                                               lse, dlse, dq_sum=not dq_after, row_stats=True)
    dq_sum = dq_sum[0]  # (Hq, total_q, D) float32, zeroed (a placeholder with dQ after the kernel)
    work = work_table(cu_k, cu_q, total_k, hkv, 2 * block_n)  # over the keys: (sequence, key tile, kv head, 0)
    num_tiles = work.shape[0]
    grid = (min(num_tiles, dispatch.num_sms(q.device)),)
    tail_flags = (neighbour_rows_nonfinite(q, k, v, dout, stats, cu_q, cu_k, block_m, 2 * block_n)
                  if zero_tail == "checked" else None)
    with dispatch.on_device(q.device):
        GLUON_VARLEN_BWD[grid](
            packed_operand(q, block_m), packed_operand(k, 2 * block_n), packed_operand(v, 2 * block_n),
            packed_operand(dout, block_m), packed_operand(dk, block_n), packed_operand(dvv, block_n),
            row_stats_operand(stats, block_m), TmaOperand(dq_sum, [1, 1 if dq_after else block_m, d // 2]), dk, dvv,
            dk.stride(0),
            cu_q, cu_k, work, num_tiles, hq // hkv, scale, scale_log2e, wl, wr, tanh_scale, tile_counter(q.device),
            tail_flags, CAUSAL=is_causal, STAGES=cfg["stages"], DQ=fixed_configs.DQ_MODES[cfg["dq_from"]],
            KV_REGS=cfg.get("kv_regs", False), WINDOW=window, SOFTCAP=mode,
            ZERO_TAIL={False: 0, True: 1, "checked": 2}[zero_tail], num_warps=4)
    if not dq_after:
        dq.copy_(dq_sum.transpose(0, 1))
    else:
        _launch_dq(dout, q, k, v, lse, delta, dq, cu_q, cu_k, is_causal, window, scale_log2e, scale, wl, wr,
                   tanh_scale, mode, zero_tail)
    return dq, dk, dvv


def _launch_dq(dout, q, k, v, lse, delta, dq, cu_q, cu_k, is_causal, window, scale_log2e, scale, wl, wr, tanh_scale,
               mode, zero_tail):
    """attention_varlen_dq_kernel over the forward's work table (configs.GLUON_DQ's blocks) into dq, from the
    rows' ``delta``."""
    from tilecore.tiles.launch import tile_counter

    total_q, hq, d = q.shape
    hkv = k.shape[1]
    dq_cfg = fixed_configs.GLUON_DQ[d]
    dq_m, dq_n = dq_cfg["block_m"], dq_cfg["block_n"]
    work = work_table(cu_q, cu_k, total_q, hq, 2 * dq_m)  # the forward's: (sequence, query tile, q head, 0)
    grid = (min(work.shape[0], dispatch.num_sms(q.device)),)
    with dispatch.on_device(q.device):
        GLUON_VARLEN_DQ[grid](
            packed_operand(q, 2 * dq_m), packed_operand(k, dq_n), packed_operand(v, dq_n),
            packed_operand(dout, 2 * dq_m), packed_operand(dq, dq_m), dq, dq.stride(0), lse, delta, total_q, cu_q,
            cu_k, work, work.shape[0], hq // hkv, scale, scale_log2e, wl, wr, tanh_scale, tile_counter(q.device),
            CAUSAL=is_causal, STAGES=dq_cfg["stages"], WINDOW=window, SOFTCAP=mode,
            ZERO_TAIL=bool(zero_tail), num_warps=4)  # its K / V zeroing: once a tile, every sequence


VARLEN_FWD = CachedLaunch(lambda: importlib.import_module("tilecore.ops.attention_varlen.kernels_tl").varlen_fwd)


def forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap, out=None, lse=None, config=None,
                    tanh_approx=None, key=None):
    """O (total_q, Hq, Dv) and lse (Hq, total_q) by the tl kernel, into ``out`` / ``lse`` where given
    (contiguous: the tests poison them); ``config``: blocks and launch options in place of
    block_config's, ``tanh_approx``: softcap_mode's (probes); ``key``: forward_gluon's."""
    total_q, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    batch = cu_q.numel() - 1
    if out is None:
        out = torch.empty((total_q, hq, dv), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return out, lse
    q, k, v = (tl_addressable(t) for t in (q, k, v))
    cfg = dict(config or block_config(max(d, dv), dispatch.interpreted(q.device), "forward", q.device))
    bm = cfg["BLOCK_M"]
    wl, wr, has_left, has_right = kernel_window(causal, left, right)
    grid = (cdiv(total_q, bm) + batch, hq)
    cfg.setdefault("UNMASKED_MIDDLE", softcap == 0)
    VARLEN_FWD.run(key, grid, (q, k, v, out, lse, cu_q, cu_k, _cu_blocks(cu_q, bm),
                               *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                               batch, total_q, d, dv, hq // hkv, scale, float(softcap), wl, wr),
                   dict(LEFT=has_left, RIGHT=has_right, SOFTCAP=softcap_mode(softcap, q.device, tanh_approx),
                        SEARCH_STEPS=_search_steps(batch), BLOCK_D=block_d(d), BLOCK_DV=block_d(dv), **cfg))
    return out, lse


def backward_kernels(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap, grads=None,
                     config=None, tanh_approx=None):
    """(dq, dk, dv) by the tl kernels (dK/dV per key block, then dQ), into ``grads`` where given;
    ``config``: {"dkdv": ..., "dq": ...} blocks and launch options in place of block_config's,
    ``tanh_approx``: softcap_mode's (probes)."""
    from tilecore.ops.attention_varlen.kernels_tl import varlen_bwd_delta, varlen_bwd_dkdv, varlen_bwd_dq

    total_q, hq, d = q.shape
    total_k, hkv, dv = v.shape
    batch = cu_q.numel() - 1
    if total_q == 0 or total_k == 0:  # no query or no key: nothing flows back
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dq, dk, dvv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dout, q, k, v = (tl_addressable(t) for t in (dout, q, k, v))
    interpret = dispatch.interpreted(q.device)
    delta = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    rows = 16 if interpret else 64
    varlen_bwd_delta[(cdiv(total_q, rows), hq)](
        out, dout, delta if dlse is None else dlse, delta, total_q, dv, *_strides(out), *_strides(dout),
        HAS_DLSE=dlse is not None, BLOCK_M=rows, BLOCK_DV=block_d(dv))
    wl, wr, has_left, has_right = kernel_window(causal, left, right)
    common = dict(LEFT=has_left, RIGHT=has_right, SOFTCAP=softcap_mode(softcap, q.device, tanh_approx),
                  SEARCH_STEPS=_search_steps(batch),
                  BLOCK_D=block_d(d), BLOCK_DV=block_d(dv))
    scalars = (batch, total_q, d, dv, hq // hkv, scale, float(softcap), wl, wr)
    cfg = dict((config or {}).get("dkdv") or block_config(max(d, dv), interpret, "dkdv", q.device))
    cfg.setdefault("UNMASKED_MIDDLE", softcap == 0)
    varlen_bwd_dkdv[(cdiv(total_k, cfg["BLOCK_N"]) + batch, hkv)](
        q, k, v, dout, lse, delta, dk, dvv, cu_q, cu_k, _cu_blocks(cu_k, cfg["BLOCK_N"]),
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dk), *_strides(dvv), *scalars,
        **common, **cfg)
    cfg = dict((config or {}).get("dq") or block_config(max(d, dv), interpret, "dq", q.device))
    cfg.setdefault("UNMASKED_MIDDLE", softcap == 0)
    varlen_bwd_dq[(cdiv(total_q, cfg["BLOCK_M"]) + batch, hq)](
        q, k, v, dout, lse, delta, dq, cu_q, cu_k, _cu_blocks(cu_q, cfg["BLOCK_M"]),
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dq), *scalars, **common, **cfg)
    return dq, dk, dvv


# --------------------------------------------------------------------------------------------
# implementations, custom ops, autograd


_GLUON_FITS = LRU(256)  # an eager CUDA call's launch key -> gluon_forward_fits (a function of the key)


def _forward_impl(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap, key=None):
    if key is not None and tiles_launch.BIND_KEYED_LAUNCHES:  # the Gluon forward as the key's first call kept it
        prepared = _GLUON_FORWARDS.get(key)
        if prepared:
            return prepared(q, k, v, cu_q, cu_k)
    if dispatch.backend_for(q.device) == "kernel":
        if _GLUON_FITS.memo(key, lambda: gluon_forward_fits(q, k, v, causal, left, right)):
            return forward_gluon(q, k, v, cu_q, cu_k, causal, scale, softcap, left, right, key=key)
        return forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap, key=key)
    out, lse = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, scale=scale, window_size=(left, right),
                                softcap=softcap, compute_dtype=torch.float32)
    return out.to(q.dtype), lse.float()


def _backward_impl(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap):
    if dispatch.backend_for(q.device) == "kernel":
        if gluon_backward_fits(q, k, v, causal, left, right):
            return backward_gluon(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap)
        return backward_kernels(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap)
    grads = varlen_backward_reference(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal=causal, scale=scale,
                                      window_size=(left, right), softcap=softcap, compute_dtype=torch.float32)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


@torch.library.custom_op("tilecore::attention_varlen_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, causal: bool, scale: float, window_left: int, window_right: int,
                softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right, softcap)


@_forward_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right, softcap):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2])), q.new_empty((q.shape[1], q.shape[0]),
                                                                          dtype=torch.float32)


@torch.library.custom_op("tilecore::attention_varlen_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, dlse: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, causal: bool, scale: float, window_left: int, window_right: int,
                 softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left,
                          window_right, softcap)


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right, softcap):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, causal, scale, left, right, softcap = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.options = (causal, scale, left, right, softcap)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    # eager with nothing to record: the implementation; traced or create_graph: the op
    dq, dk, dv = eager.backward_call(_backward_op, _backward_impl, dout, q, k, v, out, lse, dlse, cu_q, cu_k,
                                     *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# eager calls that record a gradient: the custom ops' autograd without their host time (~100 us a
# call) and without the first custom-op call's torch._dynamo import, as tilecore.attention does
_VarlenFunction = eager.eager_autograd("_VarlenFunction", _forward_impl, _setup_context, _backward)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     scale: float | None = None, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     return_lse: bool = False, validate: bool | None = None):
    """Attention over a packed batch of variable-length sequences (flash-attn's varlen), each
    sequence attending only its own keys.

    q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv) (any strides), Hq a multiple of
    Hkv (q head h reads kv head h // (Hq // Hkv)); D, Dv from 1 to 256; float16 or bfloat16 (and
    float32 on the CPU). cu_seqlens_q / cu_seqlens_k: int32 (B + 1,) offsets, sequence b's rows are
    [cu[b], cu[b + 1]) (lengths 0 allowed). max_seqlen_q / max_seqlen_k: the longest sequence's
    lengths (flash-attn's arguments; the kernels size their grid from the shapes and do not need
    them, value checks compare them with the lengths). ``scale`` defaults to D ** -0.5.

    Masks per sequence, aligned to the bottom right (flash-attn's): query i of N, key j of Nk,
    i' = i + Nk - N; ``causal``: j <= i'; ``window_size=(left, right)``: i' - left <= j <= i' + right
    (-1: unbounded; with causal, right <= 0). ``softcap`` > 0: scores softcap * tanh(scale q.k /
    softcap). A row with no key gets O = 0 and lse = -inf.

    Non-finite values stay in their own sequence in the forward: the Gluon forward's TMA boxes read past
    a sequence's end into the next one's rows, whose keys are masked and whose V rows it zeroes in
    shared memory (VARLEN_GLUON_FORWARD_CONFIG zero_tail_v, checked on the H100); the tl kernels mask by
    pointer. Known limit of the Gluon backward (configs.VARLEN_GLUON_BACKWARD): without its ZERO_TAIL
    (built, not yet checked on a GPU) an inf or NaN in the next sequence's first rows can make this
    sequence's last rows' gradients NaN too (never finite and wrong).

    Returns O (total_q, Hq, Dv) in q's dtype and, with ``return_lse=True``, lse (Hq, total_q) float32
    (natural log). Differentiable in q, k, v (and through lse).

    ``validate``: read cu_seqlens on the host to check them (start at 0, never decrease, end at the
    packed counts, within max_seqlen): default on for CPU tensors, off for CUDA tensors (a host
    sync; pass validate=True while debugging). Unchecked bad offsets on the GPU give wrong results.
    """
    # a CUDA call whose signature was checked before skips the checks (they read no values unless validate
    # asks) and launches its kernels by key; the work table is built every call (it reads cu_seqlens)
    key = _CALL_KEY(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal is True, causal is False,
                    scale, softcap, *window_size) \
        if isinstance(q, torch.Tensor) and not should_validate(validate, q.device) \
        and isinstance(window_size, (tuple, list)) and not isinstance(scale, torch.Tensor) else None
    if key is not None:  # (and the switches it is planned under: tiles.switches.generation)
        key = ("attention_varlen", generation(), key)
        # a plain eager call whose signature's first call kept the Gluon forward (after its checks)
        prepared = _GLUON_FORWARDS.get(key) if tiles_launch.BIND_KEYED_LAUNCHES else None
        if prepared and dispatch.eager_mode(q, k, v, cu_seqlens_q, cu_seqlens_k) == "direct":
            out, lse = prepared(q, k, v, cu_seqlens_q, cu_seqlens_k, return_lse)
            return (out, lse) if return_lse else out

    def checked():
        left, right = check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                            window_size, softcap, validate)
        return left, right, (q.shape[-1] ** -0.5 if scale is None else scale_value(scale))

    left, right, scale = _CHECKED.memo(key, checked)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, left, right, float(softcap))
    # eager: the implementation, or its autograd Function; torch.compile, fake tensors, modes: the op
    out, lse = eager.run(_forward_op, _forward_impl, _VarlenFunction, *args,
                         tensors=(q, k, v, cu_seqlens_q, cu_seqlens_k), key=key)
    return (out, lse) if return_lse else out


_CHECKED = LRU(256)  # an eager CUDA call's key -> (left, right, scale): what its checks returned

"""``tilecore.attention_with_kvcache``: attention of new queries against a KV cache, contiguous or
paged, with the new tokens' K and V appended to the cache in the same call (flash-attn's
``flash_attn_with_kvcache``; decode and chunked prefill). Forward only, as flash-attn's.

Layout (flash-attn's, the serving API's): q (B, Nq, Hq, D); the caches either contiguous,
(B, Nmax, Hkv, D) and (B, Nmax, Hkv, Dv), or paged, (num_pages, page_size, Hkv, D[v]) with
block_table (B, max_pages) int32 naming sequence b's pages in order; cache_seqlens (B,) int32;
k, v (B, Nnew, Hkv, D[v]). Returns O (B, Nq, Hq, Dv) and lse (B, Hq, Nq) float32.

CUDA graphs: nothing here reads a device value on the host or makes a shape from one. The append is
an index_put_ at positions computed on the device (cache_seqlens + arange(Nnew), through the block
table when paged); the kernel reads each sequence's length on the device and the split count is a
function of the cache's capacity (a shape), not of the lengths. Value checks (lengths within
capacity, block-table entries in range) run on CPU tensors, and on CUDA tensors only with
validate=True (a host sync).
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch

from tilecore import dispatch
from tilecore.ops.attention.op import scale_value
from tilecore.ops.attention_kvcache.reference import kvcache_reference
from tilecore.ops.attention_varlen.op import (MAX_HEAD_DIM, block_d, check_dtypes, check_window, kernel_window,
                                              should_validate)
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import (LRU, CachedLaunch, KeyedLaunch, cdiv, next_power_of_2, SignatureMemo, release,
                                   signature, split_key_buffers)

# each keyed call site's signature, checked against its last one in one C call (tiles.launch.SignatureMemo)
_CALL_KEY = SignatureMemo(globals())

LAYOUT = ("attention_with_kvcache takes q (batch, queries, heads, head_dim) (flash-attn's layout), caches "
          "(batch, max_keys, kv_heads, head_dim[_v]) or paged (num_pages, page_size, kv_heads, head_dim[_v]) with "
          "an int32 block_table (batch, max_pages), int32 cache_seqlens (batch,), and new k, v (batch, new_keys, "
          "kv_heads, head_dim[_v])")
PAGE_SIZES = (16, 256)  # page sizes accepted, inclusive (any size in between)
MAX_SPLITS = 64  # the merge loads a row's parts at once
MIN_SPLIT_KEYS = 256  # below it a split's fixed cost dominates (attention's decode measured 128..1024)
MAX_ROWS = 64  # (query, q head) rows a tile packs


def _kernel(name: str) -> CachedLaunch:
    """A CachedLaunch of a kernel of kernels_tl, imported at its first launch."""
    return CachedLaunch(lambda: getattr(importlib.import_module("tilecore.ops.attention_kvcache.kernels_tl"), name))


_APPEND, _FWD_SPLIT, _MERGE = _kernel("kvcache_append"), _kernel("kvcache_fwd_split"), _kernel("kvcache_merge_splits")
# a CUDA call's signature -> (the capacity its checks returned, the window's ints, the scale): the checks read
# nothing else
_CHECKED = LRU(256)


def check(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, window_size, softcap, validate):
    where = "attention_with_kvcache"
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": cache_seqlens}
    named.update({n: t for n, t in (("k", k), ("v", v), ("block_table", block_table)) if t is not None})
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if (k is None) != (v is None):
        raise ValueError(f"{where}: pass k and v together (new keys and values to append), or neither")
    devices = {t.device for t in named.values()}
    if len(devices) != 1:
        raise ValueError(f"{where}: every tensor must be on one device; got {sorted(map(str, devices))}")
    dispatch.backend_for(q.device)
    for name in ("q", "k_cache", "v_cache", "k", "v"):
        if name in named and named[name].dim() != 4:
            raise ValueError(f"{where}: {name} must be 4-D; got shape {tuple(named[name].shape)} ({LAYOUT})")
    check_dtypes(where, {n: named[n] for n in ("q", "k_cache", "v_cache", "k", "v") if n in named}, q.device)
    bsz, nq, hq, d = q.shape
    pages, page, hkv, dk = k_cache.shape
    dv = v_cache.shape[3]
    if dk != d or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"{where}: k_cache must have q's head_dim and v_cache k_cache's first three dims; got q "
                         f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} ({LAYOUT})")
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(f"{where}: head dims must be from 1 to {MAX_HEAD_DIM}; got {d} and {dv}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"{where}: q's heads ({hq}) must be a multiple of the cache's kv heads ({hkv}) ({LAYOUT})")
    if k is not None and (k.shape[0] != bsz or k.shape[2:] != (hkv, d) or v.shape[:3] != k.shape[:3]
                          or v.shape[3] != dv):
        raise ValueError(f"{where}: k must be (batch {bsz}, new_keys, {hkv}, {d}) and v (batch, new_keys, {hkv}, "
                         f"{dv}); got k {tuple(k.shape)}, v {tuple(v.shape)} ({LAYOUT})")
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (bsz,):
        raise ValueError(f"{where}: cache_seqlens must be int32 of shape ({bsz},) (a length per sequence); got "
                         f"{str(cache_seqlens.dtype).removeprefix('torch.')} of shape {tuple(cache_seqlens.shape)}")
    if block_table is None:
        if pages != bsz:
            raise ValueError(f"{where}: a contiguous cache must be (batch {bsz}, max_keys, kv_heads, head_dim); got "
                             f"{tuple(k_cache.shape)} (a paged cache needs block_table) ({LAYOUT})")
        capacity = page
    else:
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != bsz:
            raise ValueError(f"{where}: block_table must be int32 of shape (batch {bsz}, max_pages); got "
                             f"{str(block_table.dtype).removeprefix('torch.')} of shape {tuple(block_table.shape)}")
        if not PAGE_SIZES[0] <= page <= PAGE_SIZES[1]:
            raise ValueError(f"{where}: page_size (k_cache.shape[1]) must be from {PAGE_SIZES[0]} to {PAGE_SIZES[1]}; "
                             f"got {page}")
        capacity = block_table.shape[1] * page
    if scale is not None:
        scale_value(scale)
    check_window(where, causal, window_size, softcap)
    if should_validate(validate, q.device):
        new = 0 if k is None else k.shape[1]
        lengths = cache_seqlens.tolist()
        if min(lengths, default=0) < 0 or max(lengths, default=0) + new > capacity:
            raise ValueError(f"{where}: cache_seqlens + new keys ({new}) must be from 0 to the cache's capacity "
                             f"({capacity} keys a sequence); got cache_seqlens {lengths}")
        if block_table is not None:
            for b, length in enumerate(lengths):
                used = block_table[b, :cdiv(length + new, page)]
                if used.numel() and (int(used.min()) < 0 or int(used.max()) >= pages):
                    raise ValueError(f"{where}: block_table[{b}] names pages outside [0, {pages}) among the "
                                     f"{used.numel()} its {length + new} keys use: {used.tolist()}")
    return capacity


def append(k_cache, v_cache, k, v, cache_seqlens, block_table, key=None) -> None:
    """Write k, v (B, Nnew, Hkv, D) at rows cache_seqlens[b] + t of each sequence, in place, positions
    computed on the device (no host sync): the tl kernel kvcache_append where kernels serve the
    device (one launch for both caches: index_put_ took six small kernels, ~30 us of a 170 us decode
    step in a CUDA graph on the H200), else torch's index_put_."""
    if dispatch.backend_for(k.device) == "kernel":
        paged = block_table is not None
        table = block_table if paged else cache_seqlens
        hkv, d, dv = k.shape[2], k.shape[3], v.shape[3]
        _APPEND.run(key, (k.shape[0] * k.shape[1],),
                    (k, v, k_cache, v_cache, table, cache_seqlens, k.shape[1], hkv, d, dv, *k.stride(), *v.stride(),
                     *k_cache.stride(), *v_cache.stride(), *(table.stride() if paged else (0, 0))),
                    dict(PAGE=k_cache.shape[1] if paged else 1, PAGED=paged, BLOCK_H=next_power_of_2(hkv),
                         BLOCK_D=next_power_of_2(d), BLOCK_DV=next_power_of_2(dv)))
        return
    nnew = k.shape[1]
    pos = cache_seqlens.long()[:, None] + torch.arange(nnew, device=k.device)  # (B, Nnew)
    if block_table is None:
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(pos)
        slots = pos
    else:
        page = k_cache.shape[1]
        rows = block_table.long().gather(1, torch.div(pos, page, rounding_mode="floor"))
        slots = pos % page
    k_cache.index_put_((rows, slots), k)
    v_cache.index_put_((rows, slots), v)


def _splits(programs: int, capacity: int, device) -> int:
    """How many key splits: enough programs for one wave of the GPU, ``programs`` those of one split (batch x kv
    heads x row blocks: a chunk of queries fills the GPU by its rows and takes one split, no merge), from the
    capacity (a shape, so the same for every call a CUDA graph replays), at least MIN_SPLIT_KEYS keys each."""
    sms = 4 if dispatch.interpreted(device) else dispatch.num_sms(device)
    want = cdiv(sms, max(programs, 1))
    return max(1, min(want, MAX_SPLITS, cdiv(capacity, MIN_SPLIT_KEYS)))


# The split kernel where a block gets less shared memory than its default asks (tilecore.portability:
# D128's 128 keys a step, 3 stages asked 136 KiB on sm_86, 128 on gfx90a): rows of (least bytes a block gets,
# {largest head dim a row serves: overrides of BLOCK_N / num_stages}), read through dispatch.shared_memory_fit.
# The H100 (227 KiB) and the A100 (163) take the first row: no change. Untimed on those GPUs (chosen to fit).
SHARED_FITS = (
    (163 * 1024, None),
    # sm_86, sm_89, sm_120 (99 KiB): D128 136 -> 72 KiB (sm_86)
    (99 * 1024, {128: dict(num_stages=2)}),
    # ROCm's MI200 / MI300 (64 KiB of LDS): D128 128 -> 32 KiB (gfx90a)
    (64 * 1024, {128: dict(BLOCK_N=64, num_stages=2)}),
)


def _fitted(device, d: int, block_n: int, stages: int) -> tuple[int, int]:
    """(BLOCK_N, num_stages) of the split kernel on ``device`` at head dim ``d``: SHARED_FITS' row where the GPU's
    blocks get less shared memory than the default asks."""
    rows = dispatch.shared_memory_fit(device, SHARED_FITS, "attention_with_kvcache") or {}
    row = next((rows[b] for b in sorted(rows) if d <= b), {})
    return row.get("BLOCK_N", block_n), row.get("num_stages", stages)


class _DecodeLayout:
    """What forward_kernels launches, as a function of its shapes, flags and capacity alone (kept per launch
    key: the host time of a decode step, issue 31)."""

    __slots__ = ("splits", "merged", "keys_per_split", "split_grid", "split_options", "merge_grid",
                 "merge_options", "wl", "wr", "rows")

    def __init__(self, q, k_cache, v_cache, block_table, causal, left, right, softcap, capacity, splits):
        bsz, nq, hq, d = q.shape
        hkv, dv = k_cache.shape[2], v_cache.shape[3]
        interpret = dispatch.interpreted(q.device)
        block_n = 16 if interpret else (64 if max(d, dv) > 128 else 128)
        stages = 3 if max(d, dv) <= 128 else 2
        if not interpret:
            block_n, stages = _fitted(q.device, max(d, dv), block_n, stages)
        rows = nq * (hq // hkv)
        block_m = max(16, min(MAX_ROWS, next_power_of_2(rows)))
        if splits is None:
            splits = _splits(bsz * hkv * cdiv(rows, block_m), capacity, q.device)
        self.keys_per_split = cdiv(cdiv(capacity, splits), block_n) * block_n
        self.splits = splits = cdiv(capacity, self.keys_per_split)
        self.merged = splits == 1
        paged = block_table is not None
        self.wl, self.wr, has_left, has_right = kernel_window(causal, left, right)
        options = {} if interpret else dict(num_warps=4, num_stages=stages)
        self.split_grid = (bsz * hkv, splits, cdiv(rows, block_m))
        self.split_options = dict(PAGE=k_cache.shape[1] if paged else 1, PAGED=paged, LEFT=has_left, RIGHT=has_right,
                                  SOFTCAP=softcap > 0, MERGED=self.merged, BLOCK_M=block_m, BLOCK_N=block_n,
                                  BLOCK_D=block_d(d), BLOCK_DV=block_d(dv), **options)
        self.rows = bsz * hq * nq
        self.merge_grid = (self.rows,)
        self.merge_options = dict(SPLITS=next_power_of_2(splits), BLOCK_DV=block_d(dv))


_LAYOUTS = LRU(256)  # an eager call's launch key -> its _DecodeLayout


class _DecodeLaunch:
    """forward_kernels for one launch key (issue 31's host time): its layout's two KeyedLaunch and
    every launch argument the key fixes (the inputs' and the fresh output's strides, sizes, the scale and softcap,
    which the signature holds by value), made at the key's first call; a call then allocates the merge's
    partial buffers and launches."""

    __slots__ = ("split", "merge", "part_shapes", "split_tail", "merge_tail", "paged", "device")

    def __init__(self, layout: _DecodeLayout, key, q, k_cache, v_cache, block_table, out, nnew, scale, softcap):
        bsz, nq, hq, d = q.shape
        hkv, dv = k_cache.shape[2], v_cache.shape[3]
        self.paged = block_table is not None
        self.split_tail = (*q.stride(), *k_cache.stride(), *v_cache.stride(),
                           *(block_table.stride() if self.paged else (0, 0)), *out.stride(), hkv, nq, nnew, d, dv,
                           hq // hkv, layout.keys_per_split, scale, float(softcap), layout.wl, layout.wr)
        self.split = KeyedLaunch(_FWD_SPLIT, key, layout.split_grid, layout.split_options)
        # ((splits, rows) of lse's part, its offset: O's part (splits, rows, dv) rounded up to 4 floats)
        self.part_shapes = None if layout.merged else ((layout.splits, layout.rows),
                                                       cdiv(layout.splits * layout.rows * dv, 4) * 4)
        self.merge = None if layout.merged else KeyedLaunch(_MERGE, key, layout.merge_grid, layout.merge_options)
        self.merge_tail = (layout.rows, hq, nq, dv, layout.splits, *out.stride())
        self.device = q.device

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, out, lse) -> None:
        """O into ``out`` and lse into ``lse``; ``lse`` None (split keys only: a call returning O alone): the merged
        lse goes into the partial buffers' allocation."""
        table = block_table if self.paged else cache_seqlens  # (an unused pointer when not paged)
        if self.part_shapes is None:
            self.split((q, k_cache, v_cache, table, cache_seqlens, out, lse, lse, lse, *self.split_tail))
            return
        (splits, rows), lse_offset = self.part_shapes
        parts, lse_part, kept_lse = split_key_buffers(q, lse_offset, splits * rows, (self.split, self.merge),
                                                      None if lse is not None else rows)
        lse = kept_lse if lse is None else lse
        try:
            self.split((q, k_cache, v_cache, table, cache_seqlens, out, lse, parts, lse_part, *self.split_tail))
            self.merge((out, lse, parts, lse_part, *self.merge_tail))
        finally:
            release(parts)  # (a raw block: back to the allocator once both launches are queued)

    def outputs(self, q, k_cache, v_cache, cache_seqlens, block_table, want_lse: bool):
        """(O, lse) made and computed here (forward_kernels' shapes); without ``want_lse`` (a call returning O
        alone) the merge's lse goes into the split parts' allocation and None is returned for it."""
        bsz, nq, hq, _ = q.shape
        out = q.new_empty((bsz, nq, hq, v_cache.shape[3]))  # (q's dtype and device: ~0.7 us under torch.empty's)
        lse = q.new_empty((bsz, hq, nq), dtype=torch.float32) if want_lse or self.part_shapes is None else None
        self(q, k_cache, v_cache, cache_seqlens, block_table, out, lse)
        return out, lse


_LAUNCHES = LRU(256)  # an eager call's launch key -> its _DecodeLaunch


def forward_kernels(q, k_cache, v_cache, nnew, cache_seqlens, block_table, causal, scale, left, right, softcap,
                    capacity, splits=None, out=None, lse=None, key=None):
    """O (B, Nq, Hq, Dv) and lse (B, Hq, Nq) over the cache as it is (k, v appended already: ``nnew``
    of each sequence's keys are the new ones), into ``out`` / ``lse`` where given (the tests poison
    them); ``splits``: the key splits (default: _splits); ``key``: the call's launch key or None (the
    launch layout is then made again)."""
    bsz, nq, hq, d = q.shape
    hkv, dv = k_cache.shape[2], v_cache.shape[3]
    if out is None:
        out = torch.empty((bsz, nq, hq, dv), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((bsz, hq, nq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse

    def make():
        return _DecodeLayout(q, k_cache, v_cache, block_table, causal, left, right, softcap, capacity, splits)

    if key is not None and splits is None and tiles_launch.BIND_KEYED_LAUNCHES:  # the key's launches, prepared
        prepared = _LAUNCHES.get(key)
        if prepared is None:
            prepared = _DecodeLaunch(make(), key, q, k_cache, v_cache, block_table, out, nnew, scale, softcap)
            _LAUNCHES.put(key, prepared)
        prepared(q, k_cache, v_cache, cache_seqlens, block_table, out, lse)
        return out, lse
    layout = make() if splits is not None else _LAYOUTS.memo(key, make)
    merged = layout.merged
    parts = (None, None) if merged else (
        torch.empty((layout.splits, layout.rows, dv), dtype=torch.float32, device=q.device),
        torch.empty((layout.splits, layout.rows), dtype=torch.float32, device=q.device))
    paged = block_table is not None
    table = block_table if paged else cache_seqlens  # (an unused pointer when not paged)
    _FWD_SPLIT.run(key, layout.split_grid,
                   (q, k_cache, v_cache, table, cache_seqlens, out, lse, *(p if p is not None else lse for p in parts),
                    *q.stride(), *k_cache.stride(), *v_cache.stride(), *(table.stride() if paged else (0, 0)),
                    *out.stride(), hkv, nq, nnew, d, dv, hq // hkv, layout.keys_per_split, scale, float(softcap),
                    layout.wl, layout.wr),
                   layout.split_options)
    if not merged:
        _MERGE.run(key, layout.merge_grid,
                   (out, lse, parts[0], parts[1], layout.rows, hq, nq, dv, layout.splits, *out.stride()),
                   layout.merge_options)
    return out, lse


def _impl(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, left, right, softcap, capacity,
          key=None):
    if k is not None and k.shape[1] > 0:
        append(k_cache, v_cache, k, v, cache_seqlens, block_table, key=key)
    nnew = 0 if k is None else k.shape[1]
    if key is not None or dispatch.backend_for(q.device) == "kernel":  # (a key: a CUDA call its checks passed)
        return forward_kernels(q, k_cache, v_cache, nnew, cache_seqlens, block_table, causal, scale, left, right,
                               softcap, capacity, key=key)
    out, lse = kvcache_reference(q, k_cache, v_cache, cache_seqlens + nnew, block_table=block_table, causal=causal,
                                 scale=scale, window_size=(left, right), softcap=softcap,
                                 compute_dtype=torch.float32)
    return out.to(q.dtype), lse.float()


@torch.library.custom_op("tilecore::attention_with_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                causal: bool, scale: float, window_left: int, window_right: int, softcap: float,
                capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _impl(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, window_left, window_right,
                 softcap, capacity)


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, window_left, window_right, softcap,
      capacity):
    bsz, nq, hq, _ = q.shape
    return q.new_empty((bsz, nq, hq, v_cache.shape[3])), q.new_empty((bsz, hq, nq), dtype=torch.float32)


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           k: torch.Tensor | None = None, v: torch.Tensor | None = None, *,
                           cache_seqlens: torch.Tensor, block_table: torch.Tensor | None = None,
                           causal: bool = False, scale: float | None = None,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           return_lse: bool = False, validate: bool | None = None):
    """Attention of q against each sequence's cached keys, after appending the new k, v to the cache.

    Layout: flash-attn's (batch, seqlen, heads, head_dim), as its serving API has it: q (B, Nq, Hq, D);
    k_cache, v_cache contiguous (B, Nmax, Hkv, D) / (B, Nmax, Hkv, Dv), or paged (num_pages, page_size,
    Hkv, D[v]) with ``block_table`` (B, max_pages) int32 (sequence b's key j is in page
    block_table[b, j // page_size], slot j % page_size; page sizes 16 to 256); ``cache_seqlens`` (B,)
    int32, the keys already cached; k, v (B, Nnew, Hkv, D[v]) or None. float16 / bfloat16 (float32
    on the CPU); Hq a multiple of Hkv.

    With k, v given they are written into the caches in place at rows cache_seqlens[b] ..
    cache_seqlens[b] + Nnew - 1 (the caches are mutated; ``cache_seqlens`` is NOT updated, as in
    flash-attn: add Nnew yourself), and sequence b attends its cache_seqlens[b] + Nnew keys.
    Decode is Nq = 1; chunked prefill is Nq > 1, with ``causal`` aligned to the bottom right of each
    sequence (query i sees keys j <= i + length_b - Nq). ``window_size`` and ``softcap`` as in
    tilecore.attention_varlen. Keys past a sequence's length (and block-table entries past its
    pages) are never read.

    Returns O (B, Nq, Hq, Dv) in q's dtype and, with ``return_lse=True``, lse (B, Hq, Nq) float32.
    No gradient (inference). Captures in a CUDA graph: no host sync, no shape from a value (the
    module docstring says how); ``validate`` (default: on for CPU tensors, off for CUDA tensors)
    checks lengths against the capacity and block-table entries, which reads them on the host.
    """
    # a plain eager call skips the custom op's dispatch (~100 us of host time a decode step), and where
    # its signature passed the checks before (without value checks: validate off), the checks too; the
    # signature is then its kernels' launch key (issue 31)
    direct = dispatch.eager_mode(q, k_cache, v_cache, k, v) == "direct"
    key = _CALL_KEY(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, *window_size, softcap) \
        if direct and not validate and isinstance(window_size, tuple) and len(window_size) == 2 else None
    if key is not None and k is None and tiles_launch.BIND_KEYED_LAUNCHES:
        prepared = _LAUNCHES.get(key)  # kept after the key's first (checked) call: no checks, no frames between
        if prepared is not None:
            out, lse = prepared.outputs(q, k_cache, v_cache, cache_seqlens, block_table, return_lse)
            return (out, lse) if return_lse else out

    def checked():  # (capacity, left, right, scale): the checks' result and what they let through, per key
        capacity = check(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, window_size, softcap,
                         validate)
        left, right = (int(w) for w in window_size)
        return capacity, left, right, q.shape[-1] ** -0.5 if scale is None else scale_value(scale)

    capacity, left, right, scale = _CHECKED.memo(key, checked)
    args = (q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, left, right, float(softcap), capacity)
    out, lse = _impl(*args, key=key) if direct else _kvcache_op(*args)
    return (out, lse) if return_lse else out

"""One forward or backward of a norm plan (plan.py), on the plan's path.

Tensors come in as (rows, N) matrices with unit stride along N (op.py makes them so); absent ones
(residual, weight, bias, seed ...) are None. The dropout seed is a one-element int64 tensor on the
tensors' device.
"""
from __future__ import annotations

import torch
import triton.language as tl

from tilecore.ops.norm import backward as bwd_kernels
from tilecore.ops.norm import forward as fwd_kernels
from tilecore.ops.norm.plan import Plan
from tilecore.tiles.launch import LRU, CachedLaunch, KeyedLaunch, cdiv, release, scratch

_forward = CachedLaunch(fwd_kernels.norm_forward_kernel)
_stats = CachedLaunch(fwd_kernels.norm_stats_kernel)
_backward = CachedLaunch(bwd_kernels.norm_backward_kernel)
_row_sums = CachedLaunch(bwd_kernels.norm_row_sums_kernel)
_partials = CachedLaunch(bwd_kernels.norm_partials_kernel)
_mask = CachedLaunch(fwd_kernels.dropout_mask_kernel)

TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def dropout_scale(p: float) -> float:
    """What a kept element is multiplied by: 1 / (1 - p) (0 at p = 1, where nothing is kept)."""
    return 1.0 / (1.0 - p) if p < 1.0 else 0.0


def threshold16(p: float) -> int:
    """The kernels' dropout threshold: an element is kept where its 16 random bits are >= p * 2^16,
    rounded (p itself where it is a multiple of 2^-16; else within 2^-17 of it)."""
    return min(1 << 16, max(0, round(p * (1 << 16))))


def output(shape, dtype, device) -> torch.Tensor:
    """A tensor that a kernel writes whole (tests fill it with NaN first, to see that it does)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _stride(t):
    return 0 if t is None else t.stride(0)


def forward(plan: Plan, x, residual, weight, bias, seed, p: float, eps: float, rms: bool, store_h: bool,
            h_dtype: torch.dtype, key=None, lean: bool = False):
    """(y, h, mean, rstd): y (rows, N) in x's dtype; h (rows, N) in ``h_dtype`` with ``store_h``, else
    empty; mean (rows,) float32 (empty for RMSNorm); rstd (rows,) float32. ``key``: the call's launch
    key (op.py: its signature, which fixes every argument's specialization: the ints are its sizes and
    strides, the other tensors fresh allocations or the dropout seed), or None. ``lean``: the empty h and
    mean are None instead (an eager call that keeps neither: ~3.5 us of host time an allocation)."""
    rows, n = x.shape
    y = output((rows, n), x.dtype, x.device)
    h = output((rows, n) if store_h else (0,), h_dtype, x.device) if store_h or not lean else None
    mean = output((0 if rms else rows,), torch.float32, x.device) if not (rms and lean) else None
    rstd = output((rows,), torch.float32, x.device)
    if rows == 0:
        return y, h, mean, rstd
    if plan.path == "cpu":
        return _cpu_forward(x, residual, weight, bias, seed, p, eps, rms, store_h, h_dtype)
    scale, threshold, flags, forward_flags = _FORWARD_OPTIONS.memo(
        key, lambda: _forward_options(plan, residual, weight, bias, seed, p, rms, store_h, h_dtype))
    mean_arg = None if rms else mean
    if not plan.whole_row:
        _stats.run(key, (cdiv(rows, plan.rows_per_tile),),
                   (x, residual, mean_arg, rstd, seed, rows, n, x.stride(0), _stride(residual), eps,
                    threshold, scale), flags)
    _forward.run(key, (plan.row_tiles, plan.column_blocks),
                 (x, residual, weight, bias, y, h if store_h else None, mean_arg, rstd, seed, rows, n, x.stride(0),
                  _stride(residual), y.stride(0), _stride(h) if store_h else 0, eps, threshold, scale),
                 forward_flags)
    return y, h, mean, rstd


def _forward_options(plan: Plan, residual, weight, bias, seed, p: float, rms: bool, store_h: bool, h_dtype):
    """(dropout scale, threshold, the stats kernel's options, the forward kernel's): functions of the plan,
    which tensors are given, p and the flags (a launch key fixes them all: kept per key)."""
    flags = dict(ROWS=plan.rows_per_tile, BLOCK_N=plan.block_n, HAS_RES=residual is not None,
                 DROPOUT=seed is not None, RMS=rms, H_DTYPE=TL_DTYPES[h_dtype], num_warps=plan.num_warps)
    forward_flags = dict(WHOLE_ROW=plan.whole_row, HAS_W=weight is not None, HAS_B=bias is not None,
                         STORE_H=store_h, **flags)
    return dropout_scale(p), threshold16(p), flags, forward_flags


_FORWARD_OPTIONS = LRU(256)  # a forward's launch key -> _forward_options'

# a plain eager call's statistics (mean, rstd: returned by neither) as one raw block of the caching allocator where its
# launches go the kept way (NormForward.__call__, under tiles.launch.RAW_SCRATCH); the same launches, so the same y and
# h. Read each call; False: NormForward.outputs' tensors. On: float64 checks and the same bits on the H100, layer_norm
# 0.82x and rms_norm 0.91x the host time of off, every round (notes/host/runs/hg_ab42e_run6_session42_h100.txt)
STATS_SCRATCH = True


class NormForward:
    """The norm forward's eager call (nothing kept for a backward) for one launch key (issue 31's host
    time): the stats and forward kernels' KeyedLaunches with every argument the key fixes (sizes, row strides, eps,
    the dropout threshold and scale, the constexprs), made from the key's plan. A call allocates y (in x's own
    shape: rows of n, as the general path's (rows, n) y viewed back), h where it is stored, mean and rstd, and
    launches what ``forward(plan, x2, ...)`` launches for the matrices x2 = op._rows(x) (the same memory: a recipe
    is made only where op._rows gave views of x and the residual, not copies). ``of``: False where it takes none
    (the CPU path, no rows, a copy)."""

    __slots__ = ("stats", "forward", "shape", "rows", "dtype", "h_dtype", "device", "rms", "store_h", "stats_tail",
                 "forward_tail", "recorded", "rstd_at")

    @classmethod
    def of(cls, plan: Plan, x, x2, residual, res2, weight, bias, seed, p: float, eps: float, rms: bool,
           store_h: bool, key):
        rows, n = x2.shape
        if plan.path == "cpu" or rows == 0 or x2.data_ptr() != x.data_ptr() or x2.stride(-1) != 1 \
                or (residual is not None and (res2.data_ptr() != residual.data_ptr() or res2.stride(-1) != 1)):
            return False
        self = cls()
        self.h_dtype = residual.dtype if residual is not None else x.dtype
        scale, threshold, flags, forward_flags = _forward_options(plan, residual, weight, bias, seed, p, rms, store_h,
                                                                  self.h_dtype)
        self.stats = None if plan.whole_row else KeyedLaunch(_stats, key, (cdiv(rows, plan.rows_per_tile),), flags)
        self.forward = KeyedLaunch(_forward, key, (plan.row_tiles, plan.column_blocks), forward_flags)
        self.shape, self.rows, self.dtype, self.device = tuple(x.shape), rows, x.dtype, x.device
        self.rms, self.store_h = rms, store_h
        self.stats_tail = (rows, n, x2.stride(0), _stride(res2), eps, threshold, scale)
        # (y's and h's row strides: n, as the general path's (rows, n) outputs have them)
        self.forward_tail = (rows, n, x2.stride(0), _stride(res2), n, n if store_h else 0, eps, threshold, scale)
        self.recorded = None  # (op.py's recipe of this key's calls recording a gradient, made at the first such call)
        self.rstd_at = 0 if rms else 16 * cdiv(rows, 4)  # (bytes: the mean's rows first, rstd 16-byte aligned after)
        return self

    def __call__(self, x, weight, bias, residual, seed):
        """(y, h or None) in x's shape. The statistics (mean, rstd), which a plain call returns neither of, are one raw
        block of the caching allocator where its launches all go the kept way (tiles.launch.scratch: RAW_SCRATCH, with
        STATS_SCRATCH),
        handed to them by address and given back once they are queued: one allocation and its free fewer for RMSNorm,
        two for LayerNorm (issue 31's host time); the same launches, so the same y and h. Else tensors (outputs)."""
        launches = (self.forward,) if self.stats is None else (self.stats, self.forward)
        block = scratch(self.rstd_at + 4 * self.rows, launches) if STATS_SCRATCH else None
        if block is None:
            y, h, _, _ = self.outputs(x, weight, bias, residual, seed)
            return y, h
        try:
            y = x.new_empty(x.shape)
            h = x.new_empty(x.shape, dtype=self.h_dtype) if self.store_h else None
            self._launch(x, weight, bias, residual, seed, y, h, None if self.rms else block, block + self.rstd_at)
        finally:
            release(block)
        return y, h

    def outputs(self, x, weight, bias, residual, seed):
        """forward(...)'s (y, h, mean, rstd) for x and the residual as the caller gave them or as the (rows, n)
        matrices op._rows made of them (the same memory): y and h in x's shape; None for h where it is not stored and
        for RMSNorm's mean, where forward makes them empty (two allocations fewer, and two outputs fewer for autograd
        to wrap: issue 31's host time). Allocated by ``new_empty`` (x's device: ~1 us under torch.empty's with
        device= on the H100's host)."""
        y = x.new_empty(x.shape)
        h = x.new_empty(x.shape, dtype=self.h_dtype) if self.store_h else None
        mean = None if self.rms else x.new_empty(self.rows, dtype=torch.float32)
        rstd = x.new_empty(self.rows, dtype=torch.float32)
        self._launch(x, weight, bias, residual, seed, y, h, mean, rstd)
        return y, h, mean, rstd

    def _launch(self, x, weight, bias, residual, seed, y, h, mean, rstd) -> None:
        """The stats kernel (rows in two passes) and the forward kernel; mean and rstd tensors, or addresses where
        every launch goes the kept way (its launcher reads an int as the pointer)."""
        if self.stats is not None:
            self.stats((x, residual, mean, rstd, seed, *self.stats_tail))
        self.forward((x, residual, weight, bias, y, h, mean, rstd, seed, *self.forward_tail))


def backward(plan: Plan, dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, p: float, rms: bool,
             x_dtype: torch.dtype, h_dtype: torch.dtype, store_dres: bool, key=None):
    """(dx, dres, dweight, dbias). ``h``: the forward's stored residual stream, or None (then it is
    recomputed from x, the residual and the seed). ``store_dres``: dres written on its own (else
    empty: it equals dx); dweight / dbias in weight's / bias's dtype (empty where there is none).
    The launches are a NormBackward's, made for this call, or with a launch ``key`` (an eager backward, whose
    caller takes None for what it does not use) kept per key (:func:`backward_recipe`) and the empty dres,
    dweight and dbias None instead (no allocation: ~3 us of host time each)."""
    rows, n = dy.shape
    if rows == 0 or plan.path == "cpu":
        dx = output((rows, n), x_dtype, dy.device)
        dres = output((rows, n) if store_dres else (0,), h_dtype, dy.device) if store_dres or key is None else None
        if rows:
            dw, db = _cpu_backward(dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, p, rms, h_dtype,
                                   dx, dres if store_dres else None)
        else:
            dw = None if weight is None else torch.zeros(n, dtype=torch.float32, device=dy.device)
            db = None if bias is None else torch.zeros(n, dtype=torch.float32, device=dy.device)
        return dx, dres, _cast(dw, weight, dy), _cast(db, bias, dy)

    def make():
        return NormBackward.of(plan, key, dy, x, residual, h, weight, bias, seed, dh_out, p, rms, x_dtype, h_dtype,
                               store_dres)
    recipe = make() if key is None else _BACKWARD_RECIPES.memo(key, make)
    dx, dres, dw, db = recipe(dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out)
    if key is not None:
        return dx, dres, dw, db
    # (the custom op's schema: a tensor for each output, empty where there is none)
    return (dx, dres if store_dres else output((0,), h_dtype, dy.device),
            dy.new_empty((0,)) if dw is None else dw, dy.new_empty((0,)) if db is None else db)


def backward_recipe(key):
    """The NormBackward that :func:`backward` keeps for the launch key ``key`` (made at the key's first backward),
    or None."""
    return _BACKWARD_RECIPES.get(key)


class NormBackward:
    """The norm backward's launches for one backward (kept per launch key by :func:`backward`, and by op.py's
    recorded recipe; made for the call where there is no key): the row sums', backward and partials kernels'
    launches (KeyedLaunches under a key) with every argument the key fixes (sizes, row strides, whether a dh_out
    comes and its row stride, the dropout threshold and scale, the constexprs). A call allocates dx, dres where it
    is written apart, the row sums, the partials and dweight / dbias, and launches: the one launch sequence of the
    backward (issue 31's host time: a kept one looks up no plan or options and hashes no key per launch). ``of``
    takes plans of the kernels' path with rows."""

    __slots__ = ("sums", "backward", "partials", "rows", "n", "groups", "x_dtype", "h_dtype", "store_dres", "rms",
                 "sums_tail", "backward_tail", "partials_tail", "w_dtype", "b_dtype")

    @classmethod
    def of(cls, plan: Plan, key, dy, x, residual, h, weight, bias, seed, dh_out, p: float, rms: bool, x_dtype,
           h_dtype, store_dres: bool):
        rows, n = dy.shape
        self = cls()
        flags, backward_flags = _backward_options(plan, residual, h, weight, bias, seed, dh_out, rms, h_dtype,
                                                  store_dres)
        strides = (dy.stride(0), _stride(x), _stride(residual), _stride(h))
        scale, threshold = dropout_scale(p), threshold16(p)
        self.sums = None if plan.whole_row else _launch(_row_sums, key, (cdiv(rows, plan.backward_rows),), flags)
        self.sums_tail = (rows, n, *strides, threshold, scale)
        self.backward = _launch(_backward, key, (plan.groups, plan.column_blocks), backward_flags)
        # (dx's and dres's row strides n: fresh (rows, n) tensors)
        self.backward_tail = (rows, n, *strides, _stride(dh_out), n, n if store_dres else 0, threshold, scale)
        self.partials = None
        if plan.finish == "kernel" and (weight is not None or bias is not None):
            self.partials = _launch(_partials, key, (cdiv(n, plan.finish_cols),),
                                    dict(BLOCK_G=plan.finish_rows, BLOCK_C=plan.finish_cols, DW=weight is not None,
                                         DB=bias is not None, num_warps=4))
        self.partials_tail = (plan.groups, n)
        self.rows, self.n, self.groups = rows, n, plan.groups
        self.x_dtype, self.h_dtype, self.store_dres, self.rms = x_dtype, h_dtype, store_dres, rms
        self.w_dtype = None if weight is None else weight.dtype
        self.b_dtype = None if bias is None else bias.dtype
        return self

    def __call__(self, dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out=None):
        """(dx, dres or None, dweight or None, dbias or None): dy, x, residual, h and dh_out as (rows, n) matrices
        (op._rows'; a key fixes their strides)."""
        shape = (self.rows, self.n)
        dx = dy.new_empty(shape, dtype=self.x_dtype)
        dres = dy.new_empty(shape, dtype=self.h_dtype) if self.store_dres else None
        mean_arg = None if self.rms else mean
        sums = None
        if self.sums is not None:
            sums = dy.new_empty((self.rows, 2), dtype=torch.float32)
            self.sums((dy, x, residual, h, weight, mean_arg, rstd, seed, sums, *self.sums_tail))
        parts = (self.groups, self.n)
        dw_part = dy.new_empty(parts, dtype=torch.float32) if weight is not None else None
        db_part = dy.new_empty(parts, dtype=torch.float32) if bias is not None else None
        self.backward((dy, x, residual, h, weight, mean_arg, rstd, sums, seed, dh_out, dx, dres, dw_part, db_part,
                       *self.backward_tail))
        if self.partials is not None:
            dw = dy.new_empty((self.n,), dtype=self.w_dtype) if weight is not None else None
            db = dy.new_empty((self.n,), dtype=self.b_dtype) if bias is not None else None
            self.partials((dw_part, db_part, dw, db, *self.partials_tail))
            return dx, dres, dw, db
        # (the small sum over the groups' partials, cast to the parameter's dtype)
        dw = None if dw_part is None else dw_part.sum(0).to(self.w_dtype)
        db = None if db_part is None else db_part.sum(0).to(self.b_dtype)
        return dx, dres, dw, db


def _launch(kernel: CachedLaunch, key, grid, kwargs: dict):
    """One kernel's launch as ``launch(args)``: a KeyedLaunch under a launch key, else the kernel's unkeyed run."""
    if key is not None:
        return KeyedLaunch(kernel, key, grid, kwargs)
    return lambda args: kernel.run(None, grid, args, kwargs)


def _backward_options(plan: Plan, residual, h, weight, bias, seed, dh_out, rms: bool, h_dtype, store_dres: bool):
    """(the row-sums kernel's options, the backward kernel's): functions of the plan, which tensors are given and the
    flags (a backward's launch key fixes them all: kept per key)."""
    flags = dict(ROWS=plan.backward_rows, BLOCK_N=plan.block_n, LOAD_H=h is not None, HAS_RES=residual is not None,
                 HAS_W=weight is not None, DROPOUT=seed is not None, RMS=rms, H_DTYPE=TL_DTYPES[h_dtype],
                 num_warps=plan.backward_warps)
    return flags, dict(WHOLE_ROW=plan.whole_row, HAS_DH_OUT=dh_out is not None, STORE_DRES=store_dres,
                       DW=weight is not None, DB=bias is not None, **flags)


_BACKWARD_RECIPES = LRU(256)  # a backward's launch key -> its NormBackward


def _cast(grad, param, like):
    return like.new_empty((0,)) if param is None else grad.to(param.dtype)


def dropout_mask(seed: torch.Tensor, rows: int, n: int, p: float, plan: Plan) -> torch.Tensor:
    """The (rows, n) bool mask (True: kept) that ``plan``'s path draws for ``seed`` (op.dropout_mask)."""
    if plan.path == "cpu":
        return cpu_keep(seed, (rows, n), p)
    out = torch.empty((rows, n), dtype=torch.int8, device=seed.device)
    if rows and n:
        _mask[(cdiv(rows, plan.rows_per_tile), cdiv(n, plan.block_n))](
            seed, out, rows, n, threshold16(p), ROWS=plan.rows_per_tile, BLOCK_N=plan.block_n, num_warps=plan.num_warps)
    return out.bool()


# --------------------------------------------------------------------------------------------
# CPU tensors without the interpreter: torch's own CPU kernels


def cpu_keep(seed: torch.Tensor, shape, p: float) -> torch.Tensor:
    """The CPU path's dropout mask: torch's CPU generator seeded with ``seed``, kept where a uniform
    draw is >= p (the same rule as the kernels' Philox draws, not the same numbers)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed.item()))
    return torch.rand(shape, generator=generator) >= p


def _cpu_stream(x, residual, seed, p: float, h_dtype) -> torch.Tensor:
    """h = dropout(x) + residual in float32, rounded to ``h_dtype``; x itself without either."""
    if residual is None and seed is None:
        return x
    h = x.float()
    if seed is not None:  # x * 0 where dropped, as torch's dropout (a NaN stays NaN)
        h = h * (cpu_keep(seed, x.shape, p) * dropout_scale(p))
    if residual is not None:
        h = h + residual
    return h.to(h_dtype)


def _as_norm_input(h, out_dtype):
    """h as torch's layer norm takes it: its own dtype, or float32 where the output's dtype differs
    (native_layer_norm writes its output in its input's dtype)."""
    return h if h.dtype == out_dtype else h.float()


def _cpu_forward(x, residual, weight, bias, seed, p, eps, rms, store_h, h_dtype):
    rows, n = x.shape
    h = _cpu_stream(x, residual, seed, p, h_dtype)
    w32 = None if weight is None else weight.float()
    b32 = None if bias is None else bias.float()
    if rms:
        h32 = h.float()
        rstd = torch.rsqrt(h32.square().mean(-1) + eps)
        y = h32 * rstd[:, None]
        if w32 is not None:
            y = y * w32
        if b32 is not None:
            y = y + b32
        mean = x.new_empty((0,), dtype=torch.float32)
    else:
        hin = _as_norm_input(h, x.dtype)
        if w32 is None and hin.dtype != torch.float32:
            w32 = torch.ones(n)  # a float32 weight: torch then keeps the statistics in float32
        y, mean, rstd = torch.ops.aten.native_layer_norm(hin, [n], w32, b32, eps)
        mean, rstd = mean.view(rows), rstd.view(rows)
    h_out = (h if h is not x else h.clone()) if store_h else x.new_empty((0,), dtype=h_dtype)
    return y.to(x.dtype), h_out, mean, rstd


def _cpu_backward(dy, x, residual, h, weight, bias, mean, rstd, seed, dh_out, p, rms, h_dtype, dx, dres):
    """Writes dx (and dres); returns (dweight, dbias) in float32 (None where there is no such parameter)."""
    rows, n = dy.shape
    if h is None:
        h = _cpu_stream(x, residual, seed, p, h_dtype)
    w32 = None if weight is None else weight.float()
    if rms:
        h32, g = h.float(), dy.float()
        xhat = h32 * rstd[:, None]
        dw = (g * xhat).sum(0) if weight is not None else None
        db = g.sum(0) if bias is not None else None
        if w32 is not None:
            g = g * w32
        dh = (g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[:, None]
    elif n == 1:  # the normalized value is 0 whatever x is (torch's backward leaves rounding residue here)
        dh = torch.zeros((rows, 1))
        dw = torch.zeros(1) if weight is not None else None
        db = dy.float().sum(0) if bias is not None else None
    else:  # in float32: torch's CPU backward of 16-bit inputs sums dweight and dbias at 4x their rounding floor
        dh, dw, db = torch.ops.aten.native_layer_norm_backward(
            dy.float(), h.float(), [n], mean.view(rows, 1), rstd.view(rows, 1), w32,
            None if bias is None else bias.float(),
            [True, weight is not None, bias is not None])
    if dh_out is not None:
        dh = dh.float() + dh_out
    if dres is not None:
        dres.copy_(dh)
    if seed is not None:
        dh = dh.float() * (cpu_keep(seed, dy.shape, p) * dropout_scale(p))
    dx.copy_(dh)
    return dw, db

"""GPU check of issue 37's first ops, tilecore.layer_norm and tilecore.apply_rotary, in one run (< 4 min):

1. check: bf16 and fp16 on the GPU against float64 (the op's own reference, computed on the GPU in
   float64): forward and every gradient, error as a multiple of the rounding floor; outputs start as
   NaN (the caching allocator is filled with NaN first); dropout's mask statistics and that dx is zero
   exactly where the mask dropped. Norm rows 1 .. 65536 wide (the wide path from 8193), rotary both
   layouts, partial rotary dims, position_ids.
2. time: triton.testing.do_bench medians (L2 flushed between runs), bf16:
   - layer_norm at 65536 x 1024 and 65536 x 4096: LayerNorm, RMSNorm, and residual + dropout(0.1) +
     LayerNorm with the residual stream stored (prenorm); forward, backward (the backward op alone) and
     forward + backward; bytes moved over time against a torch copy of the same bytes in the same run;
     peers: eager PyTorch, torch.compile of the same PyTorch, Liger-Kernel (if importable); the
     napkin's predicted time beside LayerNorm / RMSNorm.
   - apply_rotary at B16 N4096 H32 D128 (half-split and interleaved) against a copy of the same
     bytes, eager PyTorch and torch.compile of it.
3. sweep (while time is left): the norm backward's tile, warps and row groups per SM, and rotary's tile
   and warps, through the plans' overrides (plan.tl_plan and launch).

Run from the repository root on the GPU machine:

    PYTHONPATH=. python3 experiments/norm_rotary/gpu_check.py [--skip-check] [--skip-sweep]
    PYTHONPATH=. python3 experiments/norm_rotary/gpu_check.py --fused-backward   # ~1 min

``--fused-backward`` runs only this: the fused variant's backward (residual + dropout + LayerNorm,
prenorm, and the same with h recomputed) at 65536 x 1024 and x 4096, the plan without and with
configs.FUSED_BACKWARD (plan.tl_plan(fused=...)), interleaved three times each in one run, and a check
of the fused plan's gradients against float64 (dx, dresidual, dweight, dbias) at 4096.

``--dry`` runs the same code on the CPU through Triton's interpreter at tiny sizes, timing with a
host clock (TRITON_INTERPRET=1 is set when it is not): a check of the script, not of the kernels.

Writes $OUT/norm_rotary_gpu_check.json ($OUT defaults to /tmp/out) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if "--dry" in sys.argv:  # before tilecore: its kernels are made for the interpreter or a GPU at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tilecore import accuracy  # noqa: E402
from tilecore.ops.norm import dropout_mask, layer_norm, layer_norm_reference  # noqa: E402
from tilecore.ops.norm import launch as norm_launch  # noqa: E402
from tilecore.ops.norm.plan import tl_plan as norm_tl_plan  # noqa: E402
from tilecore.ops.rotary import apply_rotary, rotary_reference  # noqa: E402
from tilecore.ops.rotary import launch as rotary_launch  # noqa: E402
from tilecore.ops.rotary.plan import tl_plan as rotary_tl_plan  # noqa: E402

START = time.time()
BUDGET_S = 225  # the whole run stays under 4 minutes: sweeps stop here
COMPILE_UNTIL_S = 170  # torch.compile peers (5-15 s of compilation each) are skipped after this
DEV = torch.device("cuda")
DRY = False  # --dry: the CPU (interpreter) at tiny sizes
SIZES = {"rows": 65536, "rotary": (16, 4096, 32, 128)}
RESULTS: dict = {"check": [], "time": [], "sweep": [], "errors": []}


def elapsed() -> float:
    return time.time() - START


def guarded(label: str, fn):
    """Run one case; an exception is printed and recorded, and the run goes on."""
    print(f"[{elapsed():.0f} s] {label}", flush=True)
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        print(f"[error] {label}: {type(err).__name__}: {err}")
        traceback.print_exc(limit=3)
        RESULTS["errors"].append({"case": label, "error": f"{type(err).__name__}: {err}"})
        if not DRY:
            torch.cuda.synchronize()
        return None


def poison_allocator(nbytes: int = 1 << 30):
    """Fill the caching allocator's free memory with NaN, so that outputs a kernel leaves unwritten
    show up (the next allocations reuse these blocks)."""
    if DRY:
        return
    block = torch.full((nbytes // 2,), float("nan"), dtype=torch.float16, device=DEV)
    del block


def bench(fn) -> float:
    if DRY:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


_COPY_MS: dict = {}


def copy_ms(nbytes: int) -> float:
    """A torch copy moving ``nbytes`` (read + write) in the same run: the ceiling."""
    if nbytes not in _COPY_MS:
        src = torch.empty(nbytes // 4, dtype=torch.float16, device=DEV)
        dst = torch.empty_like(src)
        _COPY_MS[nbytes] = bench(lambda: dst.copy_(src))
        del src, dst
    return _COPY_MS[nbytes]


# --------------------------------------------------------------------------------------------
# 1. correctness


def floor_error(out, ref) -> float:
    if not ref.any():
        return 0.0 if not out.any() else math.inf
    return accuracy.error_over_floor(out, ref)


def check_norm(rows, n, dtype, variant):
    poison_allocator()
    g = torch.Generator(device=DEV)
    fused = variant == "residual+dropout+prenorm"
    rms = variant.startswith("rms")
    x = torch.randn(rows, n, device=DEV).add_(2.0).to(dtype).requires_grad_()
    w = (1 + 0.5 * torch.randn(n, device=DEV)).to(dtype).requires_grad_()
    b = None if rms else torch.randn(n, device=DEV).to(dtype).requires_grad_()
    r = torch.randn(rows, n, device=DEV).to(dtype).requires_grad_() if (fused or variant == "rms+residual") else None
    p = 0.1 if fused else 0.0
    g.manual_seed(123)
    out = layer_norm(x, w, b, residual=r, dropout_p=p, rms=rms, prenorm=fused, generator=g)
    y, h = out if fused else (out, None)
    keep = dropout_mask(x, p, torch.Generator(device=DEV).manual_seed(123)) if p else None
    leaves = [t for t in (x, w, b, r) if t is not None]
    dy = torch.randn(rows, n, device=DEV).to(dtype)
    loss = (y.float() * dy.float()).sum()
    dh = None
    if h is not None:
        dh = torch.randn(rows, n, device=DEV).to(dtype)
        loss = loss + (h.float() * dh.float()).sum()
    grads = torch.autograd.grad(loss, leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    rx, rw, rb, rr = [next(it) if t is not None else None for t in (x, w, b, r)]
    ref_y, ref_h = layer_norm_reference(rx, rw, rb, residual=rr, keep=keep, dropout_p=p, rms=rms, h_dtype=dtype)
    ref_loss = (ref_y * dy.double()).sum() + ((ref_h * dh.double()).sum() if dh is not None else 0)
    ref_grads = torch.autograd.grad(ref_loss, ref_leaves)
    row = {"op": "layer_norm", "rows": rows, "n": n, "dtype": str(dtype).removeprefix("torch."), "variant": variant,
           "finite": bool(torch.isfinite(y).all()) and all(bool(torch.isfinite(t).all()) for t in grads),
           "y": floor_error(y.detach(), ref_y)}
    if h is not None:  # in ulps of the largest of h and its terms (x / (1 - p) + r cancels to ~0 at times)
        terms = x.detach().double().abs() / (1 - p) + r.detach().double().abs()
        row["h_max_ulps"] = float(((h.detach().double() - ref_h).abs()
                                   / (torch.finfo(dtype).eps * torch.maximum(ref_h.abs(), terms))).max())
    for name, gr, rg in zip([nm for nm, t in zip(("dx", "dw", "db", "dres"), (x, w, b, r)) if t is not None],
                            grads, ref_grads):
        row[name] = floor_error(gr, rg)
    if keep is not None:
        row["keep_fraction"] = float(keep.float().mean())
        row["dx_zero_where_dropped"] = bool(torch.equal(grads[0] == 0, ~keep))
    worst = max(v for k, v in row.items() if k in ("y", "dx", "dw", "db", "dres"))
    # dx: h is x itself without a residual (autograd adds two 16-bit gradients: one more rounding)
    row["ok"] = row["finite"] and worst <= 1.1 and row.get("h_max_ulps", 0) <= 1.0 and \
        row.get("dx_zero_where_dropped", True)
    RESULTS["check"].append(row)
    print("check", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})


def check_rotary(B, N, H, D, pairs, dtype, interleaved, with_positions):
    poison_allocator()
    angle = torch.rand(N + 5, pairs, device=DEV) * 2 * math.pi
    cos, sin = angle.cos(), angle.sin()
    pos = torch.randint(0, N + 5, (B, N), device=DEV) if with_positions else None
    x = torch.randn(B, N, H, D, device=DEV).to(dtype).requires_grad_()
    y = apply_rotary(x, cos, sin, interleaved=interleaved, position_ids=pos)
    gy = torch.randn(B, N, H, D, device=DEV).to(dtype)
    (dx,) = torch.autograd.grad(y, x, gy)
    ref = rotary_reference(x.detach(), cos, sin, interleaved=interleaved, position_ids=pos)
    ref_dx = rotary_reference(gy, cos, sin, interleaved=interleaved, position_ids=pos, conjugate=True)
    xi = x.detach().clone()
    apply_rotary(xi, cos, sin, interleaved=interleaved, position_ids=pos, inplace=True)
    row = {"op": "apply_rotary", "shape": [B, N, H, D], "rotary_dim": 2 * pairs,
           "dtype": str(dtype).removeprefix("torch."), "interleaved": interleaved, "position_ids": with_positions,
           "y": floor_error(y.detach(), ref), "dx": floor_error(dx, ref_dx),
           "inplace_equal": bool(torch.equal(xi, y.detach())), "finite": bool(torch.isfinite(y).all())}
    row["ok"] = row["finite"] and row["inplace_equal"] and max(row["y"], row["dx"]) <= 1.1
    RESULTS["check"].append(row)
    print("check", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})


NORM_CHECK_SHAPES = ((4096, 1024), (1024, 4096), (333, 1000), (128, 8192), (40, 8193), (16, 65536), (64, 1))
NORM_VARIANTS = ("layer", "rms", "residual+dropout+prenorm", "rms+residual")


def run_checks():
    # bf16: every shape and variant; fp16: the fused variants at three shapes
    cases = [(torch.bfloat16, shape, v) for shape in NORM_CHECK_SHAPES for v in NORM_VARIANTS
             if not (shape[1] == 1 and v.startswith("rms"))]
    cases += [(torch.float16, shape, v) for shape in ((4096, 1024), (333, 1000), (16, 65536))
              for v in ("residual+dropout+prenorm", "rms+residual")]
    if DRY:
        cases = [(dtype, (3, n), v) for dtype, (rows, n), v in cases if n <= 1024][:6]
    for dtype, (rows, n), variant in cases:
        guarded(f"check norm {rows}x{n} {dtype} {variant}", lambda: check_norm(rows, n, dtype, variant))
    for dtype in (torch.bfloat16, torch.float16):
        for B, N, H, D, pairs in ((2, 128, 8, 128, 64), (2, 100, 4, 64, 16), (1, 37, 3, 80, 20))[:1 if DRY else 3]:
            if DRY:
                B, N = 1, 3
            for interleaved in (False, True):
                for with_positions in (False, True):
                    if dtype == torch.float16 and with_positions != interleaved:
                        continue
                    guarded(f"check rotary {B}x{N}x{H}x{D} {dtype}",
                            lambda: check_rotary(B, N, H, D, pairs, dtype, interleaved, with_positions))
    # dropout statistics on a large mask
    def stats():
        x = torch.empty(64 if DRY else 4096, 4096, device=DEV, dtype=torch.bfloat16)
        for p in (0.1, 0.5):
            keep = dropout_mask(x, p, torch.Generator(device=DEV).manual_seed(7))
            frac = float(keep.float().mean())
            sigma = math.sqrt(p * (1 - p) / keep.numel())
            row = {"op": "dropout mask", "p": p, "keep_fraction": frac, "sigmas_off": abs(frac - (1 - p)) / sigma}
            row["ok"] = row["sigmas_off"] < 5
            RESULTS["check"].append(row)
            print("check", row)
    guarded("dropout statistics", stats)


# --------------------------------------------------------------------------------------------
# 2. timing


def napkin_ms(model: str, *sizes) -> float | None:
    """The napkin's predicted time of ``model`` at these sizes on its H100 preset (datasheet bandwidth:
    compare its ratio to copy, not its absolute ms)."""
    try:
        from tilecore.napkin import engine, models

        return engine.derive(getattr(models, model)(*sizes), "h100").time * 1e3
    except Exception as err:  # noqa: BLE001
        print(f"napkin {model}: {err}")
        return None


def liger_functions():
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        return LigerLayerNormFunction, LigerRMSNormFunction
    except Exception as err:  # noqa: BLE001
        print(f"liger_kernel not importable ({type(err).__name__}: {err}): Liger columns skipped")
        return None


def record_time(name, ms, nbytes, peers=None, predicted_ms=None, extra=None):
    c = copy_ms(nbytes)
    row = {"case": name, "ms": ms, "GB/s": nbytes / ms / 1e6, "copy_ms": c, "pct_of_copy": 100 * c / ms,
           "peers_ms": peers or {}, "napkin_ms": predicted_ms,
           "napkin_copy_ms": napkin_ms("copy", nbytes // 4) if predicted_ms else None, **(extra or {})}
    RESULTS["time"].append(row)
    peer_txt = ", ".join(f"{k} {v:.3f} ms ({v / ms:.2f}x)" for k, v in (peers or {}).items() if v)
    print(f"time {name}: {ms:.3f} ms, {row['GB/s']:.0f} GB/s, {row['pct_of_copy']:.1f}% of copy"
          + (f"; {peer_txt}" if peer_txt else "") + (f"; napkin {predicted_ms:.3f} ms" if predicted_ms else ""))


def time_norm(rows, n, variant, liger):
    dtype = torch.bfloat16
    rms = variant == "rms"
    fused = variant == "residual+dropout+layer"
    elt = rows * n * 2
    x = torch.randn(rows, n, device=DEV, dtype=dtype)
    w = torch.randn(n, device=DEV, dtype=dtype)
    b = None if rms else torch.randn(n, device=DEV, dtype=dtype)
    r = torch.randn(rows, n, device=DEV, dtype=dtype) if fused else None
    p = 0.1 if fused else 0.0
    eps = 1e-5

    def ours():
        return layer_norm(x, w, b, residual=r, dropout_p=p, rms=rms, prenorm=fused)

    def eager(x, w, b, r):
        if fused:
            h = F.dropout(x, p) + r
            return F.layer_norm(h, (n,), w, b, eps), h
        if rms:
            return F.rms_norm(x, (n,), w, eps)
        return F.layer_norm(x, (n,), w, b, eps)

    compiled = torch.compile(eager)
    compile_peer = elapsed() < COMPILE_UNTIL_S and variant != "rms"  # (the anchors' peers: LayerNorm cases)
    peers = {"eager": bench(lambda: eager(x, w, b, r))}
    if compile_peer:
        peers["torch.compile"] = guarded("compile fwd",
                                         lambda: (compiled(x, w, b, r), bench(lambda: compiled(x, w, b, r)))[1])
    if liger and not fused:
        fn = (lambda: liger[1].apply(x, w, eps)) if rms else (lambda: liger[0].apply(x, w, b, eps))
        peers["liger"] = guarded("liger fwd", lambda: bench(fn))
    fwd_bytes = elt * (4 if fused else 2)
    model = None if fused else ("rmsnorm" if rms else "layernorm")
    record_time(f"norm fwd {variant} {rows}x{n}", bench(ours), fwd_bytes, peers,
                napkin_ms(model, rows, n) if model else None)

    # the backward op alone (what the autograd backward launches)
    x2, r2 = x, r
    seed = torch.randint(0, 2**62, (1,), device=DEV) if fused else None
    y, h, mean, rstd = torch.ops.tilecore.layer_norm_forward(x2, w, b, r2, seed, p, eps, rms, fused)
    dy = torch.randn_like(y)
    dh_out = torch.randn_like(y) if fused else None
    args = (dy, None if fused else x2, None, h if fused else None, w, b, mean, rstd, seed, dh_out, p, rms, dtype,
            dtype, fused)
    bwd_bytes = elt * (5 if fused else 3)
    record_time(f"norm bwd {variant} {rows}x{n}", bench(lambda: torch.ops.tilecore.layer_norm_backward(*args)),
                bwd_bytes)

    # forward + backward through autograd, against the peers'
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    bg = None if b is None else b.clone().requires_grad_()
    rg = None if r is None else r.clone().requires_grad_()
    leaves = [t for t in (xg, wg, bg, rg) if t is not None]

    def step(f):
        def run():
            out = f()
            outs = out if isinstance(out, tuple) else (out,)
            grads = [dy] + ([dh_out] if len(outs) > 1 else [])
            return torch.autograd.grad(outs, leaves, grads)
        return run

    ours_step = step(lambda: layer_norm(xg, wg, bg, residual=rg, dropout_p=p, rms=rms, prenorm=fused))
    peers = {"eager": guarded("eager step", lambda: bench(step(lambda: eager(xg, wg, bg, rg))))}
    if compile_peer and elapsed() < COMPILE_UNTIL_S:
        peers["torch.compile"] = guarded("compile step", lambda: (step(lambda: compiled(xg, wg, bg, rg))(),
                                                                 bench(step(lambda: compiled(xg, wg, bg, rg))))[1])
    if liger and not fused:
        fn = (lambda: liger[1].apply(xg, wg, eps)) if rms else (lambda: liger[0].apply(xg, wg, bg, eps))
        peers["liger"] = guarded("liger step", lambda: bench(step(fn)))
    record_time(f"norm fwd+bwd {variant} {rows}x{n}", bench(ours_step), fwd_bytes + bwd_bytes, peers)


def time_rotary(interleaved):
    B, N, H, D = SIZES["rotary"]
    dtype = torch.bfloat16
    x = torch.randn(B, N, H, D, device=DEV, dtype=dtype)
    angle = torch.rand(N, D // 2, device=DEV) * 2 * math.pi
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def eager(x):
        c, s = cos[:, None, :].float(), sin[:, None, :].float()
        xf = x.float()
        if interleaved:
            a, b = xf[..., 0::2], xf[..., 1::2]
            return torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2).to(dtype)
        a, b = xf[..., :D // 2], xf[..., D // 2:]
        return torch.cat((a * c - b * s, b * c + a * s), -1).to(dtype)

    compiled = torch.compile(eager)
    peers = {"eager": bench(lambda: eager(x))}
    if elapsed() < COMPILE_UNTIL_S + 30:
        peers["torch.compile"] = guarded("rotary compile", lambda: (compiled(x), bench(lambda: compiled(x)))[1])
    name = f"rotary {'interleaved' if interleaved else 'half'} B{B} N{N} H{H} D{D}"
    record_time(name, bench(lambda: apply_rotary(x, cos, sin, interleaved=interleaved)), 2 * x.numel() * 2, peers,
                napkin_ms("rotary", B, N, H, D))
    xi = x.clone()
    record_time(name + " in place", bench(lambda: apply_rotary(xi, cos, sin, interleaved=interleaved, inplace=True)),
                2 * x.numel() * 2)


# --------------------------------------------------------------------------------------------
# 3. sweeps through the plans' overrides


def sweep_norm():
    """The backward's tile, warps and row groups an SM (the forward ran at 97-100% of copy in session 24;
    the backward, latency-bound, is what the sweep is for)."""
    sms = 4 if DRY else torch.cuda.get_device_properties(DEV).multi_processor_count
    dtype = torch.bfloat16
    grid = {1024: ((1024, 4, 4), (1024, 4, 8), (1024, 4, 16), (2048, 4, 4), (2048, 4, 8), (2048, 8, 4),
                   (2048, 8, 8), (1024, 8, 8), (4096, 8, 4)),
            4096: ((4096, 8, 1), (4096, 8, 2), (4096, 8, 4), (4096, 16, 1), (4096, 16, 2), (4096, 4, 4),
                   (4096, 4, 8))}
    for n, configs in grid.items():
        rows = SIZES["rows"]
        x = torch.randn(rows, n, device=DEV, dtype=dtype)
        r = torch.randn(rows, n, device=DEV, dtype=dtype)
        w, b = torch.randn(n, device=DEV, dtype=dtype), torch.randn(n, device=DEV, dtype=dtype)
        seed = torch.randint(0, 2**62, (1,), device=DEV)
        dy = torch.randn(rows, n, device=DEV, dtype=dtype)
        for variant in ("residual+dropout+prenorm", "layer"):
            fused = variant != "layer"
            base = norm_tl_plan(rows, n, sms)
            y, h, mean, rstd = norm_launch.forward(base, x, r if fused else None, w, b, seed if fused else None,
                                                   0.1 if fused else 0.0, 1e-5, False, fused, dtype)
            for tile, warps, groups in configs:
                if elapsed() > BUDGET_S:
                    return
                plan = norm_tl_plan(rows, n, sms, backward_tile_elems=tile, backward_warps=warps,
                                    groups_per_sm=groups)

                def one():
                    if fused:
                        bwd = lambda: norm_launch.backward(plan, dy, None, None, h, w, b, mean, rstd, seed, dy, 0.1,
                                                           False, dtype, dtype, True)
                        nbytes = 5 * rows * n * 2
                    else:
                        bwd = lambda: norm_launch.backward(plan, dy, x, None, None, w, b, mean, rstd, None, None, 0.0,
                                                           False, dtype, dtype, False)
                        nbytes = 3 * rows * n * 2
                    ms = bench(bwd)
                    row = {"op": f"layer_norm bwd {variant}", "rows": rows, "n": n, "tile_elems": tile,
                           "backward_rows": plan.backward_rows, "num_warps": warps, "groups_per_sm": groups,
                           "groups": plan.groups, "ms": ms, "pct_of_copy": 100 * copy_ms(nbytes) / ms}
                    RESULTS["sweep"].append(row)
                    print("sweep", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})

                guarded(f"sweep norm bwd {variant} n={n} tile={tile} warps={warps} groups={groups}", one)


def sweep_rotary():
    B, N, H, D = SIZES["rotary"]
    x = torch.randn(B, N, H, D, device=DEV, dtype=torch.bfloat16)
    angle = torch.rand(N, D // 2, device=DEV)
    cos, sin = angle.cos(), angle.sin()
    out = torch.empty_like(x)
    for interleaved in (False, True):
        for tile in (1024, 2048, 4096, 8192):
            for warps in (2, 4, 8):
                if elapsed() > BUDGET_S:
                    return
                plan = rotary_tl_plan(B, N, H, D, D // 2, tile_elems=tile, num_warps=warps)

                def one():
                    ms = bench(lambda: rotary_launch.launch(plan, x, cos, sin, None, out, interleaved, False))
                    row = {"op": "apply_rotary", "interleaved": interleaved, "tile_elems": tile,
                           "block_h": plan.block_h, "num_warps": warps, "ms": ms,
                           "pct_of_copy": 100 * copy_ms(2 * x.numel() * 2) / ms}
                    RESULTS["sweep"].append(row)
                    print("sweep", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})

                guarded(f"sweep rotary tile={tile} warps={warps}", one)


# --------------------------------------------------------------------------------------------

# --fused-backward: configs.FUSED_BACKWARD against the default plan, same run


def fused_backward():
    """The fused backward with and without configs.FUSED_BACKWARD, alternated (medians of 3 do_bench
    medians each), in both of its forms: h stored (prenorm) and h recomputed from x, the residual and
    the mask."""
    sms = 4 if DRY else torch.cuda.get_device_properties(DEV).multi_processor_count
    dtype = torch.bfloat16
    rows = SIZES["rows"]
    for n in (1024, 4096):
        x = torch.randn(rows, n, device=DEV, dtype=dtype)
        r = torch.randn(rows, n, device=DEV, dtype=dtype)
        w, b = torch.randn(n, device=DEV, dtype=dtype), torch.randn(n, device=DEV, dtype=dtype)
        seed = torch.randint(0, 2**62, (1,), device=DEV)
        dy = torch.randn(rows, n, device=DEV, dtype=dtype)
        base = norm_tl_plan(rows, n, sms)
        fused = norm_tl_plan(rows, n, sms, fused=True)
        y, h, mean, rstd = norm_launch.forward(base, x, r, w, b, seed, 0.1, 1e-5, False, True, dtype)
        for form in ("h stored", "h recomputed"):
            def run(p, form=form):
                if form == "h stored":  # dy, h, dh_out read; dx, dresidual written
                    return lambda: norm_launch.backward(p, dy, None, None, h, w, b, mean, rstd, seed, dy, 0.1,
                                                        False, dtype, dtype, True)
                return lambda: norm_launch.backward(p, dy, x, r, None, w, b, mean, rstd, seed, None, 0.1,
                                                    False, dtype, dtype, True)  # dy, x, residual read
            nbytes = 5 * rows * n * 2
            times = {"default": [], "fused": []}
            for _ in range(3):
                for name, p in (("default", base), ("fused", fused)):
                    times[name].append(bench(run(p)))
            med = {k: sorted(v)[1] for k, v in times.items()}
            for name, p in (("default", base), ("fused", fused)):
                record_time(f"norm bwd fused {form} {rows}x{n} {name} (w{p.backward_warps} r{p.backward_rows} "
                            f"g{p.groups})", med[name], nbytes, extra={"all_ms": times[name], "plan": vars(p)})
            print(f"fused backward {form} {rows}x{n}: default {med['default']:.4f} ms, fused plan "
                  f"{med['fused']:.4f} ms ({med['default'] / med['fused']:.3f}x)")
        del x, r, dy, y, h
        if not DRY:
            torch.cuda.empty_cache()
    guarded("check fused plan 4096", lambda: check_fused_plan(sms))


def check_fused_plan(sms):
    """The fused plan's backward at 4096 columns (h recomputed) against float64, outputs poisoned."""
    n, rows = 4096, (8 if DRY else 512)
    dtype = torch.float16 if DRY else torch.bfloat16  # (the interpreter's bf16 sums are wrong)
    x = torch.randn(rows, n, device=DEV, dtype=dtype)
    r = torch.randn(rows, n, device=DEV, dtype=dtype)
    w, b = torch.randn(n, device=DEV, dtype=dtype), torch.randn(n, device=DEV, dtype=dtype)
    seed = torch.randint(0, 2**62, (1,), device=DEV)
    dy = torch.randn(rows, n, device=DEV, dtype=dtype)
    p = norm_tl_plan(rows, n, sms, fused=True)
    y, h, mean, rstd = norm_launch.forward(p, x, r, w, b, seed, 0.1, 1e-5, False, True, dtype)
    poison_allocator()
    grads = norm_launch.backward(p, dy, x, r, None, w, b, mean, rstd, seed, None, 0.1, False, dtype, dtype, True)
    keep = norm_launch.dropout_mask(seed, rows, n, 0.1, p).view(rows, n).double()
    xs, rs, ws, bs = (t.detach().double().requires_grad_() for t in (x, r, w, b))
    ref, _ = layer_norm_reference(xs, ws, bs, residual=rs, keep=keep.bool(), dropout_p=0.1, h_dtype=dtype)
    ref_grads = torch.autograd.grad(ref, (xs, rs, ws, bs), dy.double())
    names = ("dx", "dresidual", "dweight", "dbias")
    row = {"case": f"fused plan backward {rows}x{n}", "plan": vars(p)}
    for name, got, want in zip(names, grads, ref_grads):
        if got is None or got.numel() != want.numel():
            continue
        row[name] = accuracy.error_over_floor(got.reshape(want.shape), want)
        row[name + "_finite"] = bool(torch.isfinite(got).all())
    row["ok"] = all(row.get(k, 0) < 1.5 for k in names) and all(row.get(k + "_finite", True) for k in names)
    RESULTS["check"].append(row)
    print("check", row)


# --------------------------------------------------------------------------------------------


def table() -> str:
    lines = [f"{'case':<46} {'ms':>8} {'GB/s':>7} {'% copy':>7}  peers (their ms / ours)"]
    for r in RESULTS["time"]:
        peers = ", ".join(f"{k} {v / r['ms']:.2f}x" for k, v in r["peers_ms"].items() if v)
        if r.get("napkin_ms"):
            peers += f", napkin {r['napkin_ms']:.3f} ms"
            if r.get("napkin_copy_ms"):  # predicted % of copy, beside the measured one
                peers += f" ({100 * r['napkin_copy_ms'] / r['napkin_ms']:.0f}% of copy predicted)"
        lines.append(f"{r['case']:<46} {r['ms']:>8.3f} {r['GB/s']:>7.0f} {r['pct_of_copy']:>7.1f}  {peers}")
    bad = [c for c in RESULTS["check"] if not c.get("ok")]
    lines.append(f"checks: {len(RESULTS['check']) - len(bad)} of {len(RESULTS['check'])} within 1.1x the rounding "
                 f"floor (and the other conditions); errors: {len(RESULTS['errors'])}")
    for c in bad:
        lines.append(f"  not ok: {c}")
    if RESULTS["sweep"]:
        best = {}
        for s in RESULTS["sweep"]:
            key = (s["op"], s.get("n"), s.get("interleaved"))
            score = s["ms"]
            if key not in best or score < best[key][0]:
                best[key] = (score, s)
        for (op, n, il), (_, s) in best.items():
            lines.append(f"  best sweep {op} n={n} interleaved={il}: tile {s['tile_elems']}, warps {s['num_warps']}"
                         + (f", groups/SM {s['groups_per_sm']}" if "groups_per_sm" in s else "")
                         + f": {s['pct_of_copy']:.1f}% of copy")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--dry", action="store_true", help="the CPU through the interpreter, tiny sizes")
    ap.add_argument("--fused-backward", action="store_true",
                    help="only the fused backward with and without configs.FUSED_BACKWARD")
    args = ap.parse_args()
    if args.dry:
        global DEV, DRY, COMPILE_UNTIL_S
        DEV, DRY, COMPILE_UNTIL_S = torch.device("cpu"), True, -1
        SIZES.update(rows=8, rotary=(1, 4, 4, 128))
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = {"dry": True} if DRY else meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"])
    torch.manual_seed(0)
    if args.fused_backward:
        guarded("fused backward", fused_backward)
        RESULTS["wall_s"] = elapsed()
        path = out_dir / "norm_fused_backward.json"
        path.write_text(json.dumps(RESULTS, indent=1, default=str))
        print(f"\nwrote {path} ({elapsed():.0f} s)\n")
        print(table())
        return 0
    if not args.skip_check:
        run_checks()
    print(f"[{elapsed():.0f} s] checks done")
    for interleaved in (False, True):
        guarded(f"time rotary interleaved={interleaved}", lambda: time_rotary(interleaved))
    liger = None if DRY else liger_functions()
    for n in (1024, 4096):
        for variant in ("residual+dropout+layer", "layer", "rms"):
            guarded(f"time norm {variant} {SIZES['rows']}x{n}", lambda: time_norm(SIZES["rows"], n, variant, liger))
            if not DRY:
                torch.cuda.empty_cache()
    print(f"[{elapsed():.0f} s] timings done")
    if not args.skip_sweep:
        sweep_norm()
        if not DRY:
            torch.cuda.empty_cache()
        sweep_rotary()
    RESULTS["wall_s"] = elapsed()
    path = out_dir / "norm_rotary_gpu_check.json"
    path.write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"\nwrote {path} ({elapsed():.0f} s)\n")
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU check and timing of issue 32: the transform for n = m x 2^k and hadamard_quantize (rotate and quantize
in one pass). One script, one device call, under 4 minutes; every case in try/except (a failure is
recorded and printed, the rest go on); each phase in a child process with a time limit (a CUDA error
or a hang loses one phase, not the run).

Phases:
1. warm: a pool of processes launches every kernel configuration the later phases time, once, on small
   scratch tensors, so that Triton's on-disk cache holds them (compiling ~100 kernels serially would
   take most of the call).
2. check (bf16 and fp16 against float64, outputs poisoned first): the transform for every m at
   2^k = 1, 64, 512 (error as a multiple of the rounding floor; target <= 1.25) and the model widths
   (14336, 28672, 11008 with its transpose, 18944) and a two-pass row (12 x 2048); hadamard_quantize
   for every format at n = 4096, 2048, 14336, 11008 and with block=32: codes equal to the float64
   reference's on >= 99.9% of elements, the rest one code apart, scales (e8m0, e4m3 exactly; float32
   within 2^-15); a NaN row.
3. time (bf16 in, 2^28 elements, triton.testing.do_bench medians; copy = a torch copy of the same bytes,
   read plus written, in the same run):
   - the n = m x 2^k transform at 12/20/28 x 2^6..2^11 and the larger m, % of copy;
   - hadamard_quantize, every format, n = 128..32768 and 14336, 28672, 11008, 18944 (bytes: x read,
     codes and scales written), % of copy; nvfp4 with a given global scale (one pass) and dynamic (two);
   - the unfused pair at n = 4096 and 14336: tilecore's transform, then the quantizer in eager PyTorch
     (quantize_reference.quantize_rotated in float32) and torch.compile'd; ratio fused / unfused;
   - torchao's MX (mxfp4) and NVFP4 quantizers where torchao imports (without the rotation).
4. prints a table last; writes JSON to $OUT/gpu_quantize_check.json ($OUT, default /tmp/out).

    PYTHONPATH=. python3 experiments/hadamard/gpu_quantize_check.py [--phases warm,check,time] [--budget 225]

``--dry`` runs the same code on the CPU under Triton's interpreter at toy sizes (a check of the script,
not of the GPU).
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback

DRY = os.environ.get("GQC_DRY") == "1"  # set by --dry (children inherit it)
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"
E = 2**12 if DRY else 2**28
DEV = "cpu" if DRY else "cuda"
FORMATS = ("fp8_e4m3", "fp8_e5m2", "int8", "mxfp4", "nvfp4", "int4")
POW2 = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
WIDTHS = (14336, 28672, 11008, 18944)
SMALL_M = (12, 20, 28)
LARGE_M = (36, 44, 52, 60, 108, 140, 148, 156, 172)


def _import():
    sys.path.insert(0, os.getcwd())
    import torch  # noqa: F401

    import tilecore  # noqa: F401


def rows_for(n, elements=E):
    return max(1, elements // n)


# ---------------------------------------------------------------------------------------------- cases


def transform_cases():
    """(m, p) of the transform timing, priority order."""
    cases = [(m, 1 << k) for k in range(6, 12) for m in SMALL_M]
    cases += [(m, 64 if m > 60 else 128) for m in LARGE_M]
    return cases[:2] if DRY else cases


def quantize_cases():
    """(format, n, kwargs) of the fused timing, priority order: every format at 4096 and 14336, then
    fp8_e4m3 / mxfp4 / nvfp4 at every size, then the rest."""
    first = [(f, n, {}) for n in (4096, 14336) for f in FORMATS]
    second = [(f, n, {}) for f in ("fp8_e4m3", "mxfp4", "nvfp4") for n in POW2 + WIDTHS if n not in (4096, 14336)]
    third = [(f, n, {}) for f in ("fp8_e5m2", "int8", "int4") for n in (1024, 32768, 28672, 11008)]
    extra = [("fp8_e4m3", n, {"group": 128}) for n in (4096, 14336)] + [("mxfp4", n, {"block": 32}) for n in (4096, 14336)]
    cases = first + extra + second + third
    return cases[:3] + extra[:1] + [("nvfp4", 4096, {})] if DRY else cases


def check_transform_sizes(dtype):
    """(m, p) the check phase runs: bf16 every m at 2^k = 1, 64, 512; fp16 every m at 64; both the model
    widths and a two-pass row (12 x 2048)."""
    import torch

    from tilecore.ops.hadamard import orders

    ps = (1, 64, 512) if dtype == torch.bfloat16 else (64,)
    return [(m, p) for m in SMALL_M + LARGE_M for p in ps] + [orders.split(n) for n in WIDTHS + (12 * 2048,)]


def quantize_kwargs(fmt, kwargs, device):
    import torch

    kw = dict(format=fmt, **kwargs)
    if fmt == "nvfp4":
        kw["scale"] = torch.tensor([0.002], device=device)  # a given global scale: one pass
    return kw


# ---------------------------------------------------------------------------------------------- warm


def _warm_one(case):
    try:
        _import()
        import torch

        from tilecore.ops.hadamard import hadamard_transform
        from tilecore.ops.hadamard.quantize import hadamard_quantize

        kind, args = case
        dev = DEV
        if kind == "transform":
            dtype, n = args
            x = torch.randn(2 if DRY else rows_for(n), n, dtype=dtype, device=dev)  # the checked and timed grid
            hadamard_transform(x, 1.0)
            hadamard_transform(x, 1.0, transpose=True)
        else:
            fmt, n, kwargs, dtype = args
            x = torch.randn(2 if DRY else rows_for(n), n, dtype=dtype, device=dev)  # the checked and timed grid
            hadamard_quantize(x, **quantize_kwargs(fmt, kwargs, dev))
            if fmt == "nvfp4":
                hadamard_quantize(x, format=fmt, **kwargs)  # the dynamic global scale's two passes
        if not DRY:
            torch.cuda.synchronize()
        return None
    except Exception as err:  # noqa: BLE001
        return f"{case}: {type(err).__name__}: {err}"


def phase_warm(result):
    import torch

    cases = [("transform", (torch.bfloat16, m * p)) for m, p in transform_cases()]
    for dtype in (torch.bfloat16, torch.float16):
        cases += [("transform", (dtype, m * p)) for m, p in check_transform_sizes(dtype)]
    cases += [("quantize", (f, n, kw, torch.bfloat16)) for f, n, kw in quantize_cases()]
    cases += [("quantize", (f, n, {}, torch.float16)) for f in FORMATS for n in (4096, 2048, 14336, 11008)]
    cases += [("quantize", (f, n, {"block": 32}, dt)) for f in FORMATS for n in (4096, 14336)
              for dt in (torch.bfloat16, torch.float16)]
    seen, unique = set(), []
    for c in cases:
        key = repr(c)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(2 if DRY else min(16, os.cpu_count() or 4)) as pool:
        errors = [e for e in pool.map(_warm_one, unique, chunksize=1) if e]
    result["warm"] = {"configs": len(unique), "seconds": round(time.time() - t0, 1), "errors": errors[:20]}


# ---------------------------------------------------------------------------------------------- check


def phase_check(result):
    import torch

    from tilecore import accuracy
    from tilecore.ops.hadamard import hadamard_reference, hadamard_transform, kron, orders
    from tilecore.ops.hadamard.quantize import hadamard_quantize
    from tilecore.ops.hadamard.quantize_reference import code_order, hadamard_quantize_reference

    out = result.setdefault("check", {"transform": [], "quantize": []})
    dev = DEV
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for m, p in check_transform_sizes(dtype):
            n = m * p
            case = {"n": n, "dtype": str(dtype).removeprefix("torch.")}
            try:
                m, p = orders.split(n)
                # the timed row count: the persistent grid is a compile-time constant, so other row counts
                # compile new kernels, serially here (what ran this phase out of its time in session 24)
                x = torch.randn(rows_for(n, 2**10 if DRY else E), n, dtype=dtype, device=dev)
                for transpose in (False, True) if not orders.is_symmetric(m) else (False,):
                    y = torch.full_like(x, float("nan"))
                    plan = kron.kron_plan(x, m, p)
                    kron.launch(plan, x, y, n**-0.5, transpose)
                    # hadamard_reference's m x 2^k form multiplies by a CPU H_m: 64 rows on the CPU
                    ref = hadamard_reference(x[:64].cpu(), n**-0.5, out_dtype=torch.float64, transpose=transpose).to(dev)
                    y = y[:64]
                    key = "err_over_floor" + ("_transpose" if transpose else "")
                    case[key] = round(accuracy.error_over_floor(y, ref), 4)
                    case["all_written"] = bool(torch.isfinite(y).all())
                    case["path"] = plan.path
                public = hadamard_transform(x, n**-0.5)  # the public call: same plan
                case["public_equal"] = bool(torch.equal(public[:64], y)) if orders.is_symmetric(m) else None
                case["ok"] = case["all_written"] and case["err_over_floor"] <= 1.25
            except Exception as err:  # noqa: BLE001
                case["error"] = f"{type(err).__name__}: {err}"
            out["transform"].append(case)
    for fmt in FORMATS:
        for n, kwargs, dtype in [(4096, {}, torch.bfloat16), (2048, {}, torch.float16), (14336, {}, torch.bfloat16),
                                 (11008, {}, torch.float16), (4096, {"block": 32}, torch.bfloat16),
                                 (14336, {"block": 32}, torch.float16)]:
            case = {"format": fmt, "n": n, "dtype": str(dtype).removeprefix("torch."), **kwargs}
            try:
                x = torch.randn(2 if DRY else rows_for(n), n, dtype=dtype, device=dev)  # the timed grid (above)
                x[:, 7] *= 80  # an outlier channel
                codes, scales = hadamard_quantize(x, format=fmt, **kwargs)
                if n & (n - 1) and "block" not in kwargs:  # m x 2^k: the reference on the CPU, 64 rows
                    x, codes = x[:64], codes[:64]
                    scales = tuple(s if s.numel() == 1 else s[:64] for s in scales) if isinstance(scales, tuple) \
                        else scales[:64]
                    ref_kw = dict(kwargs, scale=scales[1].cpu()) if fmt == "nvfp4" else kwargs  # the global scale used
                    ref_codes, ref_scales = hadamard_quantize_reference(x.cpu(), format=fmt, **ref_kw)
                    ref_codes = ref_codes.to(dev)
                    ref_scales = tuple(r.to(dev) for r in ref_scales) if isinstance(ref_scales, tuple) else ref_scales.to(dev)
                else:
                    ref_codes, ref_scales = hadamard_quantize_reference(x, format=fmt, **kwargs)
                a, b = code_order(codes, fmt), code_order(ref_codes, fmt)
                case["match"] = float((a == b).float().mean())
                case["max_code_distance"] = int((a - b).abs().max())
                # codes more than one step away must be tiny values (within the float32 rotation's error:
                # 2^-13 of the row's largest), as tests/hadamard/test_hadamard_quantize.py checks
                from tilecore.ops.hadamard.quantize_reference import dequantize

                far = ((a - b).abs() > 1).reshape(x.shape)
                ours = dequantize(codes, scales, format=fmt).double()
                ref = dequantize(ref_codes, ref_scales, format=fmt).double()
                bound = 2.0**-13 * ref.abs().amax(dim=-1, keepdim=True)
                case["far_codes"] = int(far.sum())
                case["far_codes_tiny"] = bool(((ours - ref).abs() <= bound)[far].all())
                pairs = zip(scales, ref_scales) if isinstance(scales, tuple) else [(scales, ref_scales)]
                exact, rel = True, 0.0
                for s, r in pairs:
                    if s.dtype == torch.float32:
                        rel = max(rel, float(((s - r).abs() / r.abs().clamp_min(1e-30)).max()))
                    else:
                        exact = exact and bool(torch.equal(s.view(torch.uint8), r.view(torch.uint8)))
                case["discrete_scales_exact"] = exact
                case["fp32_scale_rel"] = rel
                case["ok"] = case["match"] >= 0.999 and case["far_codes_tiny"] and exact and rel <= 2**-15
            except Exception as err:  # noqa: BLE001
                case["error"] = f"{type(err).__name__}: {err}"
            out["quantize"].append(case)
    if not DRY:  # CUDA graphs: captured after a first call, replayed on new inputs, equal to eager calls
        for name, fn in (("transform 14336", lambda t: hadamard_transform(t, 14336**-0.5)),
                         ("transform 11008 transpose", None),
                         ("quantize fp8_e4m3", lambda t: hadamard_quantize(t, format="fp8_e4m3")[0].view(torch.uint8)),
                         ("quantize nvfp4 dynamic", lambda t: hadamard_quantize(t, format="nvfp4")[0])):
            try:
                n = 11008 if "11008" in name else 14336
                if fn is None:
                    fn = lambda t: hadamard_transform(t, n**-0.5, transpose=True)  # noqa: E731
                x = torch.randn(64, n, dtype=torch.bfloat16, device=dev)
                fn(x)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    captured = fn(x)
                x.copy_(torch.randn_like(x))
                graph.replay()
                torch.cuda.synchronize()
                out.setdefault("cuda_graph", {})[name] = bool(torch.equal(captured, fn(x)))
            except Exception as err:  # noqa: BLE001
                out.setdefault("cuda_graph", {})[name] = f"{type(err).__name__}: {err}"
    try:  # a NaN row stays in its row
        x = torch.randn(8 if DRY else 64, 4096, dtype=torch.bfloat16, device=dev)
        x[3, 11] = float("nan")
        codes, scales = hadamard_quantize(x, format="fp8_e4m3")
        rest = torch.cat([scales[:3], scales[4:]])
        out["nan_row"] = bool(torch.isnan(scales[3]).all() and torch.isfinite(rest).all())
    except Exception as err:  # noqa: BLE001
        out["nan_row"] = f"{type(err).__name__}: {err}"


# ---------------------------------------------------------------------------------------------- time


def _bench(fn):
    if DRY:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


class Copy:
    """The copy ceiling for a byte count (read + written), measured once per size in this run."""

    def __init__(self):
        self.cache = {}

    def ms(self, total_bytes):
        import torch

        half = int(total_bytes // 2) // 16 * 16
        if half not in self.cache:
            src = torch.empty(half, dtype=torch.uint8, device=DEV)
            dst = torch.empty_like(src)
            self.cache[half] = _bench(lambda: dst.copy_(src))
            del src, dst
        return self.cache[half]


def phase_time(result, deadline):
    import torch

    from tilecore.ops.hadamard import hadamard_transform
    from tilecore.ops.hadamard.quantize import hadamard_quantize
    from tilecore.ops.hadamard.quantize_reference import quantize_rotated

    dev = DEV
    copy = Copy()
    out = result.setdefault("time", {"transform": [], "quantize": [], "unfused": [], "torchao": [], "skipped": []})
    for m, p in transform_cases():
        n = m * p
        if time.time() > deadline - 60:
            out["skipped"].append(f"transform {n}")
            continue
        case = {"m": m, "p": p, "n": n}
        try:
            x = torch.randn(rows_for(n), n, dtype=torch.bfloat16, device=dev)
            y = torch.empty_like(x)
            from tilecore.ops.hadamard import kron, orders

            plan = kron.kron_plan(x, m, p)
            ms = _bench(lambda: kron.launch(plan, x, y, n**-0.5))
            nbytes = 2 * x.numel() * 2
            case.update(ms=round(ms, 4), copy_pct=round(100 * copy.ms(nbytes) / ms, 1), path=plan.path)
            del x, y
        except Exception as err:  # noqa: BLE001
            case["error"] = f"{type(err).__name__}: {err}"
        out["transform"].append(case)
    for fmt, n, kwargs in quantize_cases():
        if time.time() > deadline - 45:
            out["skipped"].append(f"quantize {fmt} {n} {kwargs}")
            continue
        case = {"format": fmt, "n": n, **kwargs}
        try:
            x = torch.randn(rows_for(n), n, dtype=torch.bfloat16, device=dev)
            kw = quantize_kwargs(fmt, kwargs, dev)
            codes, scales = hadamard_quantize(x, **kw)
            written = codes.numel() * codes.element_size() + sum(
                s.numel() * s.element_size() for s in (scales if isinstance(scales, tuple) else (scales,)))
            nbytes = x.numel() * 2 + written
            ms = _bench(lambda: hadamard_quantize(x, **kw))
            case.update(ms=round(ms, 4), copy_pct=round(100 * copy.ms(nbytes) / ms, 1), bytes=nbytes)
            if fmt == "nvfp4":
                ms2 = _bench(lambda: hadamard_quantize(x, format=fmt, **kwargs))
                case.update(dynamic_ms=round(ms2, 4), dynamic_copy_pct=round(100 * copy.ms(nbytes) / ms2, 1))
            del x, codes, scales
        except Exception as err:  # noqa: BLE001
            case["error"] = f"{type(err).__name__}: {err}"
        out["quantize"].append(case)
    for fmt in FORMATS[:3:2] if DRY else FORMATS:
        for n in (4096,) if DRY else (4096, 14336):
            if time.time() > deadline - 25:
                out["skipped"].append(f"unfused {fmt} {n}")
                continue
            case = {"format": fmt, "n": n}
            try:
                x = torch.randn(rows_for(n), n, dtype=torch.bfloat16, device=dev)
                kw = quantize_kwargs(fmt, {}, dev)
                group = {"mxfp4": 32, "nvfp4": 16, "int4": 128}.get(fmt)
                gscale = kw.get("scale")
                fused = _bench(lambda: hadamard_quantize(x, **kw))

                def eager():
                    y = hadamard_transform(x, n**-0.5)
                    return quantize_rotated(y.float(), fmt, group, gscale)

                t_eager = _bench(eager)
                case.update(fused_ms=round(fused, 4), eager_ms=round(t_eager, 4),
                            fused_over_eager=round(t_eager / fused, 2))
                try:
                    if n != 4096:
                        raise RuntimeError("compiled only at n = 4096 (compile time)")
                    qc = torch.compile(lambda y: quantize_rotated(y.float(), fmt, group, gscale), dynamic=False)

                    def compiled():
                        return qc(hadamard_transform(x, n**-0.5))

                    compiled()
                    t_comp = _bench(compiled)
                    case.update(compiled_ms=round(t_comp, 4), fused_over_compiled=round(t_comp / fused, 2))
                except Exception as err:  # noqa: BLE001
                    case["compiled_error"] = f"{type(err).__name__}: {str(err)[:200]}"
                del x
            except Exception as err:  # noqa: BLE001
                case["error"] = f"{type(err).__name__}: {err}"
            out["unfused"].append(case)
    # RotatedLinear at Llama-3-8B's MLP shapes against the bf16 linear (cuBLAS), and its output error
    # against the float64 linear with and without the rotation (activations with outlier channels)
    from tilecore.nn import RotatedLinear

    for k_in, k_out in ((256, 512),) if DRY else ((4096, 14336), (14336, 4096)):
        if time.time() > deadline - 15:
            out["skipped"].append(f"linear {k_in}->{k_out}")
            continue
        try:
            lin = torch.nn.Linear(k_in, k_out, bias=False, device=dev, dtype=torch.bfloat16)
            layers = {rot: RotatedLinear.from_linear(lin, rotate=rot) for rot in (True, False)}
            for tokens in (1, 16, 128, 512, 2048, 8192) if not DRY else (16,):
                if time.time() > deadline - 10:
                    out["skipped"].append(f"linear {k_in}->{k_out} x{tokens}")
                    continue
                case = {"shape": f"{k_in}->{k_out}", "tokens": tokens}
                x = torch.randn(tokens, k_in, dtype=torch.bfloat16, device=dev)
                x[:, :4] *= 60
                t_ref = _bench(lambda: torch.nn.functional.linear(x, lin.weight))
                t_rot = _bench(lambda: layers[True](x))
                case.update(bf16_ms=round(t_ref, 4), rotated_fp8_ms=round(t_rot, 4), speedup=round(t_ref / t_rot, 2))
                if tokens == 512:
                    exact = x.double() @ lin.weight.double().T
                    for rot in (True, False):
                        y = layers[rot](x).double()
                        case[f"err_{'rotated' if rot else 'plain'}"] = float((y - exact).norm() / exact.norm())
                    yb = torch.nn.functional.linear(x, lin.weight).double()
                    case["err_bf16_linear"] = float((yb - exact).norm() / exact.norm())
                out.setdefault("linear", []).append(case)
                del x
        except Exception as err:  # noqa: BLE001
            out.setdefault("linear", []).append({"shape": f"{k_in}->{k_out}", "error": f"{type(err).__name__}: {err}"})
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        for n in (4096, 14336):
            x = torch.randn(rows_for(n), n, dtype=torch.bfloat16, device=dev)
            t = _bench(lambda: to_mx(x, torch.float4_e2m1fn_x2, 32))
            fused = _bench(lambda: hadamard_quantize(x, format="mxfp4"))
            out["torchao"].append({"quantizer": "to_mx fp4 (no rotation)", "n": n, "ms": round(t, 4),
                                   "tilecore_fused_ms": round(fused, 4), "ratio": round(t / fused, 2)})
    except Exception as err:  # noqa: BLE001
        out["torchao"].append({"error": f"{type(err).__name__}: {str(err)[:200]}"})


# ---------------------------------------------------------------------------------------------- driver


def _child(phase, path, deadline):
    result = {}
    try:
        _import()
        if phase == "warm":
            phase_warm(result)
        elif phase == "check":
            phase_check(result)
        else:
            phase_time(result, deadline)
    except Exception:  # noqa: BLE001
        result[f"{phase}_error"] = traceback.format_exc()[-2000:]
    with open(path, "w") as f:
        json.dump(result, f)


def table(result):
    lines = []
    check = result.get("check", {})
    bad_t = [c for c in check.get("transform", []) if not c.get("ok")]
    bad_q = [c for c in check.get("quantize", []) if not c.get("ok")]
    worst = max((c.get("err_over_floor", 0) for c in check.get("transform", [])), default=None)
    lines.append(f"check: transform {len(check.get('transform', []))} cases, {len(bad_t)} not ok, worst err/floor {worst}; "
                 f"quantize {len(check.get('quantize', []))} cases, {len(bad_q)} not ok; nan row {check.get('nan_row')}; "
                 f"CUDA graphs {check.get('cuda_graph')}")
    for c in (bad_t + bad_q)[:12]:
        lines.append(f"  NOT OK: {c}")
    t = result.get("time", {})
    if t.get("transform"):
        lines.append("transform n = m x p, bf16, 2^28 elements: % of copy")
        lines.append("  " + "  ".join(f"{c['m']}x{c['p']}:{c.get('copy_pct', c.get('error', '?'))}" for c in t["transform"]))
    if t.get("quantize"):
        lines.append("hadamard_quantize, bf16, 2^28 elements: % of copy (bytes read + written)")
        for fmt in FORMATS:
            row = [c for c in t["quantize"] if c["format"] == fmt]
            if row:
                lines.append(f"  {fmt:9s} " + "  ".join(
                    f"{c['n']}{'/g' + str(c['group']) if 'group' in c else ''}{'/b' + str(c['block']) if 'block' in c else ''}:"
                    f"{c.get('copy_pct', 'ERR')}" + (f"(dyn {c.get('dynamic_copy_pct')})" if 'dynamic_copy_pct' in c else "")
                    for c in row))
    if t.get("unfused"):
        lines.append("fused vs unfused (tilecore transform + quantizer): x faster than eager / torch.compile")
        for c in t["unfused"]:
            lines.append(f"  {c['format']:9s} n={c['n']}: fused {c.get('fused_ms')} ms, eager x{c.get('fused_over_eager')}, "
                         f"compiled x{c.get('fused_over_compiled', c.get('compiled_error', c.get('error')))}")
    if t.get("linear"):
        lines.append("RotatedLinear (W8A8 e4m3, rotation fused with the activation's quantization) vs bf16 linear")
        for c in t["linear"]:
            lines.append(f"  {c}")
    for c in t.get("torchao", []):
        lines.append(f"torchao: {c}")
    if t.get("skipped"):
        lines.append(f"skipped for time: {len(t['skipped'])} ({', '.join(t['skipped'][:6])} ...)")
    for k in result:
        if k.endswith("_error"):
            lines.append(f"{k}: {result[k][-600:]}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--phases", default="warm,check,time")
    parser.add_argument("--budget", type=float, default=225.0, help="seconds for the whole run")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--dry", action="store_true", help="the CPU under the interpreter, toy sizes")
    args = parser.parse_args()
    if args.dry and not DRY:  # re-run with the environment set before torch and tilecore import
        env = dict(os.environ, GQC_DRY="1", TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable] + [a for a in sys.argv if a != "--dry"] + ["--dry"], env)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    deadline = start + args.budget
    limits = {"warm": 0.45, "check": 0.15, "time": 1.0}
    result = {}
    try:
        _import()
        from experiments.common.meta import meta

        result["meta"] = {"dry": True} if DRY else meta()
    except Exception as err:  # noqa: BLE001
        result["meta_error"] = f"{type(err).__name__}: {err}"
    ctx = mp.get_context("spawn")
    for phase in args.phases.split(","):
        left = deadline - time.time()
        if left < 20:
            result[f"{phase}_error"] = "skipped: out of time"
            continue
        limit = min(left - 5, args.budget * limits.get(phase, 0.3)) if phase != "time" else left - 5
        path = os.path.join(args.out, f"_{phase}.json")
        proc = ctx.Process(target=_child, args=(phase, path, time.time() + limit))
        proc.start()
        proc.join(limit)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
            result[f"{phase}_error"] = f"timed out after {limit:.0f} s"
        if os.path.exists(path):
            with open(path) as f:
                result.update(json.load(f))
            os.remove(path)
        elif f"{phase}_error" not in result:
            result[f"{phase}_error"] = f"child exited with {proc.exitcode}, no result"
        with open(os.path.join(args.out, "gpu_quantize_check.json"), "w") as f:
            json.dump(result, f, indent=1)
    result["seconds"] = round(time.time() - start, 1)
    with open(os.path.join(args.out, "gpu_quantize_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))


if __name__ == "__main__":
    main()

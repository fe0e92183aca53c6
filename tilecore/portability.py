"""Every kernel each op's plan picks on each GPU of ``dispatch.TARGETS``, compiled for that GPU on the
CPU (no GPU needed), with the shared memory it asks for against what one block may use there.

    python -m tilecore.portability [--targets sm_86,gfx90a] [--ops hadamard,gemm] [--quick] [-j N] [--json OUT]

For each target, inside ``dispatch.pretend(target)`` (meta tensors stand for tensors on that GPU):
each op's cases are planned by the op's own plan and run by its own launch with Triton's launches
recorded instead of made; each kernel launch recorded (kernel, arguments, options) is compiled for
the target by ``tilecore.tiles.compile.compile_kernel`` (identical launches once) and its
``metadata.shared`` compared with the target's limit. A plan that refuses a target raises its own
error, which is a row too ("refused"). ``--quick``: the cases CI compiles (every kernel and every
configuration class, less repeats: one 16-bit dtype, causal attention only; the Gluon kernels, which
tests/tiles/test_compile_hopper.py and tests/attention compile for sm_90a, recorded but not
compiled). Exit status 1 when a kernel fails to compile or does not fit.

Run with TRITON_INTERPRET unset: under the interpreter ``triton.jit`` makes interpreted functions,
which cannot be compiled.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time


@dataclasses.dataclass
class Case:
    """An op's call as its plan sees it: ``run(device)`` plans and launches it on tensors of ``device``."""
    op: str
    name: str
    run: object
    quick: bool = True


def hadamard_cases(quick: bool) -> list[Case]:
    import torch

    from tilecore.ops.hadamard import configs, op, orders, plan

    def case(n, rows, dtype, quick):
        def run(device):
            x = torch.empty(rows, n, dtype=dtype, device=device)
            out = torch.empty_like(x)
            op._transform_into(x, out, 1.0)  # as hadamard_transform: the power-of-two plan, or kron.py's
            return plan.plan(x, out) if orders.split(n)[0] == 1 else "kron"
        return Case("hadamard", f"{str(dtype)[6:]} n={n} rows={rows}", run, quick=quick)

    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in sorted(configs.SPLITS):
            # 2^24 elements: the size the TMA and Gluon paths take (TMA_MIN_ELEMENTS), and 16 rows
            # fewer: the pointer path (the same grid and divisibility, so one compile where the paths
            # agree). quick: bfloat16 (float16's kernels ask the same shared memory) at each n a
            # SHARED_FITS row names and the largest, float32 at 8192 (at most 50 KiB up to n = 8192 on
            # sm_80; from 16384, 2-8 minutes a compile for sm_80..sm_120a on one core)
            quick = n in ((8, 16, 64, 128, 256, 2048, 8192, 32768) if dtype == torch.bfloat16 else
                          (8192,) if dtype == torch.float32 else ())
            large = configs.TMA_MIN_ELEMENTS // n
            for rows in sorted({large, max(1, large - 16)}):
                cases.append(case(n, rows, dtype, quick))
        # n = m x 2^k (kron.py): fused with several rows a tile, fused with one (M_PAD 256: Qwen2's
        # 18944), and in two passes (the mixing, then the power-of-two plan)
        for m, p in ((12, 16), (28, 64), (20, 1024), (148, 128), (172, 4096)):
            quick = (dtype == torch.bfloat16 and m in (12, 148, 172)) or (dtype == torch.float32 and m == 20)
            cases.append(case(m * p, 4096, dtype, quick))
    return cases


def gemm_cases(quick: bool) -> list[Case]:
    import torch

    from tilecore.ops.gemm import launch, plan

    cases = []
    shapes = {"4096^3": (4096, 4096, 4096), "K=128": (4096, 4096, 128), "1024x1024x16384": (1024, 1024, 16384),
              "N=100": (4096, 100, 4096)}  # rows of 200 bytes: the tl kernel on Hopper too
    for dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        for shape_name, (M, N, K) in shapes.items():
            for bias in (False, True):
                fp8 = dtype == torch.float8_e4m3fn
                if fp8 and bias:
                    continue

                def run(device, M=M, N=N, K=K, dtype=dtype, bias=bias, fp8=fp8):
                    a = torch.empty(M, K, dtype=dtype, device=device)
                    b = torch.empty(K, N, dtype=dtype, device=device)
                    out_dtype = torch.bfloat16 if fp8 else dtype
                    bias_t = torch.empty(N, dtype=dtype, device=device) if bias else None
                    scales = (torch.empty(M, 1, device=device), torch.empty(1, device=device)) if fp8 else None
                    p = plan.plan(a, b, out_dtype=out_dtype, bias=bias_t, scales=scales)
                    launch.launch(p, a, b, bias_t, scales)
                    return p
                name = f"{'fp8 row scales' if fp8 else str(dtype)[6:]} {shape_name}{' bias' if bias else ''}"
                # quick: the tl kernel on each operand type, and N = 100 (the tl kernel on Hopper too)
                quick = not bias and (shape_name == "4096^3" and dtype != torch.float16
                                      or shape_name == "N=100" and dtype == torch.bfloat16)
                cases.append(Case("gemm", name, run, quick=quick))
    return cases


def attention_cases(quick: bool) -> list[Case]:
    import torch

    from tilecore.ops.attention import launch, plan

    cases = []
    # B, Hq, Hkv, N, Nk: the query-block kernels, and decode (one query, grouped heads)
    shapes = {"N=1024": (2, 4, 4, 1024, 1024), "decode": (2, 32, 8, 1, 4096)}
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128, 256):
            for shape_name, (B, Hq, Hkv, N, Nk) in shapes.items():
                for causal in (True, False):
                    def run(device, B=B, Hq=Hq, Hkv=Hkv, N=N, Nk=Nk, d=d, causal=causal, dtype=dtype,
                            decode=shape_name == "decode", backward=not (quick and d == 64)):
                        q = torch.empty(B, Hq, N, d, dtype=dtype, device=device)
                        k = torch.empty(B, Hkv, Nk, d, dtype=dtype, device=device)
                        v = torch.empty_like(k)
                        scale = d ** -0.5
                        p = plan.plan_forward(q, k, v, causal, scale)
                        out = torch.empty_like(q)
                        lse = torch.empty(B, Hq, N, device=device)
                        launch.forward(p, q, k, v, out, lse, causal, scale)
                        if decode or not backward:  # quick: D64's backward has D128's configuration
                            return p
                        pb = plan.plan_backward(out, q, k, v, causal, scale)
                        launch.backward(pb, out, q, k, v, out, lse, None, torch.empty_like(q), torch.empty_like(k),
                                        torch.empty_like(v), causal, scale)
                        return p, pb
                    cases.append(Case("attention", f"{str(dtype)[6:]} d{d} {shape_name}{' causal' if causal else ''}",
                                      run, quick=dtype == torch.bfloat16 and causal))
    return cases


def norm_cases(quick: bool) -> list[Case]:
    """layer_norm's forward and backward (residual, dropout, LayerNorm and RMSNorm): the full sweep only."""
    import torch

    from tilecore.ops.norm import launch, op
    from tilecore.ops.norm.plan import plan

    cases = []
    for n in (1024, 8192, 65536):
        for rms in (False, True):
            def run(device, n=n, rms=rms):
                rows, dtype = 4096, torch.bfloat16
                x, res = (torch.empty(rows, n, dtype=dtype, device=device) for _ in range(2))
                w = torch.empty(n, dtype=dtype, device=device)
                seed = torch.empty(1, dtype=torch.int64, device=device)
                y, h, mean, rstd = op._forward_impl(x, w, None if rms else w, res, seed, 0.1, 1e-5, rms, True)
                launch.backward(plan(rows, n, device), y, x, res, h, w, None if rms else w, mean, rstd, seed, None,
                                0.1, rms, torch.bfloat16, torch.bfloat16, False)
                return "tl"
            cases.append(Case("norm", f"bfloat16 n={n} {'rms' if rms else 'layer'} residual dropout", run, quick=False))
    return cases


def rotary_cases(quick: bool) -> list[Case]:
    """apply_rotary, both layouts, partial rotary dims: the full sweep only."""
    import torch

    from tilecore.ops.rotary import op

    cases = []
    for d, pairs in ((128, 64), (128, 32), (256, 128)):
        for interleaved in (False, True):
            def run(device, d=d, pairs=pairs, interleaved=interleaved):
                x = torch.empty(4, 4096, 32, d, dtype=torch.bfloat16, device=device)
                cos = torch.empty(4096, pairs, dtype=torch.float32, device=device)
                op._rotate_into(x, cos, cos, None, torch.empty_like(x), interleaved, False)
                return "tl"
            cases.append(Case("rotary", f"bfloat16 D{d} pairs {pairs}{' interleaved' if interleaved else ''}", run,
                              quick=False))
    return cases


# --------------------------------------------------------------------------------------------
# the ops called as a user calls them: inside pretend a plain meta tensor counts as the described
# GPU's (dispatch.eager_mode), so the public function runs its own host path (checks, plan, launch) and the
# launches it makes are recorded; a backward through autograd's engine records the backward's kernels


def _meta(*shape, dtype=None, grad=False, device=None):
    import torch

    return torch.empty(*shape, dtype=dtype or torch.bfloat16, device=device, requires_grad=grad)


def _with_grads(out, inputs) -> str:
    """The backward of ``out`` (its first tensor, summed) into every input that records a gradient."""
    import torch

    first = out[0] if isinstance(out, (tuple, list)) else out
    torch.autograd.grad(first.float().sum(), [t for t in inputs if t is not None and t.requires_grad])
    return "public"


def linear_attention_cases(quick: bool) -> list[Case]:
    """linear_attention forward and backward (no decay, a scalar decay a head and token, GLA's per-channel decay),
    Dk = Dv 64 and 128; its decode step; Mamba-2's chunk scan (forward and backward) and its step."""
    import torch

    import tilecore

    f32 = torch.float32
    B, N, H = 2, 1024, 4
    cases = []
    for d in (64, 128):
        for decay in (None, "scalar", "channel"):
            def run(device, d=d, decay=decay):
                q, k, v = (_meta(B, N, H, d, grad=True, device=device) for _ in range(3))
                g = None if decay is None else _meta(B, N, H, *((d,) if decay == "channel" else ()), dtype=f32,
                                                      grad=True, device=device)
                return _with_grads(tilecore.linear_attention(q, k, v, decay=g), (q, k, v, g))
            cases.append(Case("linear_attention", f"bfloat16 D{d} {decay or 'no'} decay fwd+bwd", run,
                              quick=d == 128 and decay != "scalar"))
    def hedgehog(device):  # the one-pass map kernels, forward and backward (their projection dot's precision)
        q, k, v = (_meta(B, N, H, 64, grad=True, device=device) for _ in range(3))
        w = _meta(H, 64, 32, dtype=f32, grad=True, device=device)
        return _with_grads(tilecore.linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w), (q, k, v, w))
    cases.append(Case("linear_attention", "bfloat16 D64 hedgehog 32 features fwd+bwd", hedgehog))

    def step(device):
        q, k, v = (_meta(B, H, 128, device=device) for _ in range(3))
        tilecore.linear_attention_step(q, k, v, _meta(B, H, 128, 128, dtype=f32, device=device))
        return "public"
    cases.append(Case("linear_attention", "bfloat16 D128 step", step))

    def scan(device):
        x = _meta(B, N, 8, 64, grad=True, device=device)
        dt = _meta(B, N, 8, dtype=f32, grad=True, device=device)
        A = _meta(8, dtype=f32, grad=True, device=device)
        Bm, C = (_meta(B, N, 1, 128, grad=True, device=device) for _ in range(2))
        return _with_grads(tilecore.mamba2_chunk_scan(x, dt, A, Bm, C), (x, dt, A, Bm, C))
    cases.append(Case("linear_attention", "mamba2_chunk_scan headdim 64 dstate 128 fwd+bwd", scan, quick=False))

    def mamba_step(device):
        tilecore.mamba2_step(_meta(B, 8, 64, 128, dtype=f32, device=device), _meta(B, 8, 64, device=device),
                             _meta(B, 8, dtype=f32, device=device), _meta(8, dtype=f32, device=device),
                             _meta(B, 1, 128, device=device), _meta(B, 1, 128, device=device))
        return "public"
    cases.append(Case("linear_attention", "mamba2_step headdim 64 dstate 128", mamba_step, quick=False))
    return cases


def fft_conv_cases(quick: bool) -> list[Case]:
    """fft_conv forward and backward at seqlen 1024 and 4096 (one kernel), 8192 (three passes), float32 at 1024."""
    import torch

    import tilecore

    cases = []
    for n, dtype, backward in ((4096, torch.bfloat16, True), (1024, torch.bfloat16, False),
                               (8192, torch.bfloat16, True), (1024, torch.float32, False)):
        def run(device, n=n, dtype=dtype, backward=backward):
            u = _meta(2, 64, n, dtype=dtype, grad=backward, device=device)
            k = _meta(64, n, dtype=torch.float32, grad=backward, device=device)
            y = tilecore.fft_conv(u, k)
            return _with_grads(y, (u, k)) if backward else "public"
        cases.append(Case("fft_conv", f"{str(dtype)[6:]} seqlen {n}{' fwd+bwd' if backward else ''}", run,
                          quick=n != 8192 and (dtype == torch.float32 or backward)))
    return cases


def attention_varlen_cases(quick: bool) -> list[Case]:
    """attention_varlen forward and backward, 3 sequences (100, 500, 1000 tokens), causal, D64, D128 and D256;
    D128 with a softcap (its tanh: inline PTX on NVIDIA GPUs, exp2 elsewhere)."""
    import torch

    import tilecore

    cases = []
    for d, softcap in ((64, 0.0), (128, 0.0), (256, 0.0), (128, 30.0)):
        def run(device, d=d, softcap=softcap):
            total = 1600
            q, k, v = (_meta(total, 8, d, grad=True, device=device) for _ in range(3))
            cu = torch.empty(4, dtype=torch.int32, device=device)
            out = tilecore.attention_varlen(q, k, v, cu, cu, 1000, 1000, causal=True, softcap=softcap, validate=False)
            return _with_grads(out, (q, k, v))
        cases.append(Case("attention_varlen", f"bfloat16 D{d} causal{f' softcap {softcap:g}' if softcap else ''} "
                          "fwd+bwd", run, quick=d == 128))
    return cases


def attention_kvcache_cases(quick: bool) -> list[Case]:
    """attention_with_kvcache at decode (one query, 32 q heads on 8 kv heads, D128): a contiguous cache of 4096
    keys and a paged one (pages of 128)."""
    import torch

    import tilecore

    cases = []
    for paged in (False, True):
        def run(device, paged=paged):
            B = 2
            q = _meta(B, 1, 32, 128, device=device)
            cache = (64, 128) if paged else (B, 4096)
            kc, vc = (_meta(*cache, 8, 128, device=device) for _ in range(2))
            table = torch.empty(B, 32, dtype=torch.int32, device=device) if paged else None
            tilecore.attention_with_kvcache(q, kc, vc, cache_seqlens=torch.empty(B, dtype=torch.int32, device=device),
                                            block_table=table, validate=False)
            return "public"
        cases.append(Case("attention_kvcache", f"bfloat16 D128 decode {'paged 128' if paged else 'contiguous'}", run,
                          quick=not paged))
    return cases


def hadamard_quantize_cases(quick: bool) -> list[Case]:
    """hadamard_quantize at n = 4096 (the rotation and the quantizer in one kernel) in the formats every target
    stores (e4m3's are tests/portability/test_fp8_stores.py's: torch's ops where Triton has no e4m3)."""
    import tilecore

    cases = []
    # n = 1024: the PAIRS products (inline PTX, configs.QUANT_POW2_PAIRS) where the GPU is NVIDIA's
    # n = 256 int4: the tile sm_100a's tensor-memory lowering raised past the block (configs.QUANT_TMEM_TILES)
    for n, fmt in ((4096, "int8"), (4096, "fp8_e5m2"), (4096, "mxfp4"), (4096, "int4"), (1024, "mxfp4"),
                   (256, "int4")):
        def run(device, n=n, fmt=fmt):
            tilecore.hadamard_quantize(_meta(64, n, device=device), format=fmt)
            return "public"
        cases.append(Case("hadamard_quantize", f"bfloat16 n={n} {fmt}", run,
                          quick=fmt in ("int8", "mxfp4") or n == 256))
    return cases


def attention_fp8_cases(quick: bool) -> list[Case]:
    """attention_fp8's forward (e4m3 q, k, v; per (batch, head) descales), D64 and D128, causal and not. Where the
    GPU has no e4m3 (dispatch.fp8_ok False) the op's own clear refusal is the case's result (no launch)."""
    import torch

    import tilecore
    from tilecore import dispatch

    cases = []
    for d in (64, 128):
        for causal in (False, True):
            def run(device, d=d, causal=causal):
                B, H, N = 2, 4, 1024
                q, k, v = (_meta(B, H, N, d, dtype=torch.float8_e4m3fn, device=device) for _ in range(3))
                scales = {f"{x}_scale": _meta(B, H, dtype=torch.float32, device=device) for x in "qkv"}
                if not dispatch.fp8_ok(device):
                    try:
                        tilecore.attention_fp8(q, k, v, causal=causal, check_scales=False, **scales)
                    except RuntimeError as err:
                        if "needs e4m3 tensor cores" in str(err):
                            return "refused clearly (no e4m3)"
                        raise
                    raise AssertionError("attention_fp8 ran where the GPU has no e4m3")
                tilecore.attention_fp8(q, k, v, causal=causal, check_scales=False, **scales)
                return "public"
            cases.append(Case("attention_fp8", f"e4m3 D{d}{' causal' if causal else ''}", run, quick=d == 128))
    return cases


CASES = {"hadamard": hadamard_cases, "gemm": gemm_cases, "attention": attention_cases, "norm": norm_cases,
         "rotary": rotary_cases, "linear_attention": linear_attention_cases, "fft_conv": fft_conv_cases,
         "attention_varlen": attention_varlen_cases, "attention_kvcache": attention_kvcache_cases,
         "hadamard_quantize": hadamard_quantize_cases, "attention_fp8": attention_fp8_cases}
# the ops called through their public functions, and the targets --quick compiles them for: the smallest blocks
# (99 KiB sm_86, 64 KiB gfx90a), where their configurations are likeliest not to fit; attention_fp8 where Triton
# has e4m3 on a 99 KiB block (sm_89), and its refusal on sm_86 / gfx90a
QUICK_PUBLIC_TARGETS = {op: ("sm_86", "gfx90a") for op in ("linear_attention", "fft_conv", "attention_varlen",
                                                            "attention_kvcache", "hadamard_quantize")}
QUICK_PUBLIC_TARGETS["attention_fp8"] = ("sm_86", "sm_89", "gfx90a")
# hadamard_quantize on sm_100a too: tcgen05's lowering fails or asks more there for tiles sm_90a compiles
QUICK_PUBLIC_TARGETS["hadamard_quantize"] = ("sm_86", "gfx90a", "sm_100a")
PUBLIC_OPS = tuple(QUICK_PUBLIC_TARGETS)
# --quick: the ops compiled for each target. sm_89 and gfx942 asked exactly the shared memory sm_86 and
# gfx90a ask, launch for launch, and sm_120a at most sm_86's (53 and 35 quick launches compared,
# notes/portability.md): there only what differs, the GEMM on e4m3 itself (sm_89, sm_120a) and on its
# float16 upcasts (gfx942)
QUICK_OPS = {"sm_89": ("gemm",), "sm_120a": ("gemm",), "gfx942": ("gemm",)}


# --------------------------------------------------------------------------------------------
# recording launches


@contextlib.contextmanager
def recording(launches: list):
    """Within: Triton launches (through triton.jit's ``kernel[grid](...)`` and tiles.launch.CachedLaunch)
    append (kernel, args, kwargs) to ``launches`` instead of running."""
    from triton.runtime.jit import JITFunction

    from tilecore.tiles.launch import CachedLaunch

    def jit_run(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    def cached(self, grid, args, kwargs):
        launches.append((self.kernel, args, kwargs))

    def cached_keyed(self, key, grid, args, kwargs):
        launches.append((self.kernel, args, kwargs))

    saved = [(JITFunction, "run", JITFunction.run), (CachedLaunch, "_launch", CachedLaunch._launch)]
    JITFunction.run = jit_run
    CachedLaunch._launch = cached
    if hasattr(CachedLaunch, "launch_keyed"):
        saved.append((CachedLaunch, "launch_keyed", CachedLaunch.launch_keyed))
        CachedLaunch.launch_keyed = cached_keyed
    try:
        yield launches
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def named_arguments(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """(every parameter of ``kernel`` by name, as the launch gave it or its default; the launch options)."""
    from tilecore.tiles.launch import jit_arg

    params = kernel.params
    named = {p.name: jit_arg(a) for p, a in zip(params, args)}
    for p in params[len(args):]:
        named[p.name] = jit_arg(kwargs[p.name]) if p.name in kwargs else p.default
    return named, {k: kwargs[k] for k in OPTIONS if k in kwargs}


def compile_key(kernel, named: dict, options: dict) -> tuple:
    """What makes two launches the same compile: the kernel, each argument's specialization (tensors
    by dtype and alignment, ints by 1 and divisibility, descriptors by dtype and box, constexprs by
    value) and the options."""
    from tilecore.tiles.launch import specialization

    spec = []
    for p in kernel.params:
        value = named[p.name]
        if p.is_constexpr:
            spec.append(repr(value))
            continue
        try:
            spec.append(specialization(value))
        except TypeError:  # descriptors
            base = getattr(value, "base", None)
            spec.append((type(value).__name__, str(getattr(base, "dtype", None)), tuple(getattr(value, "block_shape", ())),
                         repr(getattr(value, "layout", None))))
    return (kernel.fn.__module__, kernel.fn.__qualname__, tuple(spec), tuple(sorted(options.items())))


def kernel_name(kernel) -> str:
    return f"{kernel.fn.__module__.removeprefix('tilecore.ops.')}.{kernel.fn.__name__}"


def is_gluon(kernel) -> bool:
    return bool(getattr(kernel, "is_gluon", lambda: False)())


def _summary(kernel, named: dict, options: dict) -> str:
    """The launch's configuration: its options and its small constexprs (block sizes, stages, flags)."""
    consts = {p.name: named[p.name] for p in kernel.params if p.is_constexpr
              and isinstance(named[p.name], (int, bool)) and p.name not in ("GRID",)}
    return " ".join(f"{k}={v}" for k, v in {**options, **consts}.items())


def plan_paths(result) -> str:
    """The plan's path(s) in a row: "tl", "gluon", "decode", or forward/backward."""
    if isinstance(result, str):  # a public call's own label
        return result
    plans = result if isinstance(result, tuple) else (result,)
    return "/".join(getattr(p, "path", "?") for p in plans)


# --------------------------------------------------------------------------------------------
# the sweep


def sweep_target(target_name: str, ops: list[str], quick: bool, compile_gluon: bool) -> list[dict]:
    """The rows of one target: every case of ``ops``, each recorded launch compiled once."""
    import torch

    from tilecore import dispatch
    from tilecore.tiles.compile import compile_kernel

    target = dispatch.TARGETS[target_name]
    gpu_target = target.gpu_target()
    rows, compiled = [], {}
    for op in ops:
        if quick and (target_name not in QUICK_PUBLIC_TARGETS[op] if op in QUICK_PUBLIC_TARGETS
                      else op not in QUICK_OPS.get(target_name, CASES)):
            continue
        for case in CASES[op](quick):
            if quick and not case.quick:
                continue
            base = dict(target=target.name, op=op, case=case.name, limit=target.shared_memory)
            launches = []
            try:
                with dispatch.pretend(target), recording(launches):
                    result = case.run(torch.device("meta"))
            except Exception as err:  # noqa: BLE001 (a plan's refusal is a row: its message is the point)
                rows.append(dict(base, refused=f"{type(err).__name__}: {err}"))
                continue
            path = plan_paths(result)
            for kernel, args, kwargs in launches:
                named, options = named_arguments(kernel, args, kwargs)
                key = compile_key(kernel, named, options)
                row = dict(base, path=path, kernel=kernel_name(kernel), config=_summary(kernel, named, options))
                if key in compiled:
                    rows.append(dict(row, **compiled[key], repeat=True))
                    continue
                if is_gluon(kernel) and not compile_gluon:
                    compiled[key] = dict(skipped="Gluon: compiled for sm_90a by the Hopper tests")
                    rows.append(dict(row, **compiled[key]))
                    continue
                start = time.perf_counter()
                try:
                    k = compile_kernel(kernel, named, target=gpu_target, **{"num_warps": 4, **options})
                    found = dict(shared=int(k.metadata.shared), fits=int(k.metadata.shared) <= target.shared_memory)
                except Exception as err:  # noqa: BLE001 (every failure is reported, and the sweep goes on)
                    found = dict(error=_innermost(err))
                found["seconds"] = round(time.perf_counter() - start, 2)
                compiled[key] = found
                rows.append(dict(row, **found))
                print(_line(rows[-1]), flush=True)
    return rows


def _innermost(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"[:300]


def _line(r: dict) -> str:
    what = (f"refused: {r['refused']}" if "refused" in r else f"ERROR {r['error']}" if "error" in r else
            r["skipped"] if "skipped" in r else
            f"{r['shared'] / 1024:6.1f} KiB of {r['limit'] // 1024} {'fits' if r['fits'] else 'DOES NOT FIT'}")
    return f"{r['target']:8s} {r['op']:9s} {r['case']:32s} {r.get('kernel', ''):34s} {what}"


def table(rows: list[dict]) -> str:
    """Kernel x target: the most shared memory any launch of that kernel asks for there (KiB), with
    the limit, or what failed."""
    targets = list(dict.fromkeys(r["target"] for r in rows))
    kernels = list(dict.fromkeys(r["kernel"] for r in rows if "kernel" in r))
    lines = ["| kernel | " + " | ".join(f"{t} ({rows_limit(rows, t) // 1024} KiB)" for t in targets) + " |",
             "| --- |" + " --- |" * len(targets)]
    for kernel in kernels:
        cells = []
        for t in targets:
            mine = [r for r in rows if r["target"] == t and r.get("kernel") == kernel]
            sizes = [r["shared"] for r in mine if "shared" in r]
            bad = [r for r in mine if "error" in r or ("fits" in r and not r["fits"])]
            cell = f"{max(sizes) / 1024:.0f}" if sizes else ("Gluon" if any("skipped" in r for r in mine) else "-")
            if bad:
                cell += f" ({len(bad)} FAIL)"
            cells.append(cell)
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
    refused = [r for r in rows if "refused" in r]
    for r in refused:
        lines.append(f"refused on {r['target']}: {r['op']} {r['case']}: {r['refused'][:150]}")
    return "\n".join(lines)


def rows_limit(rows, target) -> int:
    return next(r["limit"] for r in rows if r["target"] == target)


def _run_target(job):
    return sweep_target(*job)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tilecore.portability", description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="", help="comma-separated names of dispatch.TARGETS (default: all)")
    ap.add_argument("--ops", default="", help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--quick", action="store_true", help="the cases CI compiles")
    ap.add_argument("--gluon", action="store_true", help="compile the Gluon kernels too (sm_90a; slow)")
    ap.add_argument("-j", type=int, default=1, help="targets compiled at once, a process each")
    ap.add_argument("--json", help="write the rows to this file")
    a = ap.parse_args(argv)
    from tilecore import dispatch

    if dispatch.interpreter_enabled():
        print("tilecore.portability compiles kernels: run it with TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    targets = [t for t in a.targets.split(",") if t] or list(dispatch.TARGETS)
    unknown = [t for t in targets if t not in dispatch.TARGETS]
    if unknown:
        print(f"unknown targets {unknown}; known: {', '.join(dispatch.TARGETS)}", file=sys.stderr)
        return 2
    ops = [o for o in a.ops.split(",") if o] or list(CASES)
    start = time.perf_counter()
    jobs = [(t, [op], a.quick, a.gluon) for t in targets for op in ops]  # a process each, -j at once
    if a.j > 1 and len(jobs) > 1:
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(a.j, mp_context=multiprocessing.get_context("spawn")) as pool:
            per_target = list(pool.map(_run_target, jobs))
    else:
        per_target = [_run_target(job) for job in jobs]
    rows = [r for rs in per_target for r in rs]
    seconds = time.perf_counter() - start
    print(table(rows))
    compiles = sum(1 for r in rows if "seconds" in r and not r.get("repeat"))
    print(f"{len(rows)} launches, {compiles} compiles, {len(targets)} targets in {seconds:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rows=rows, seconds=seconds), f, indent=1)
    failed = [r for r in rows if "error" in r or ("fits" in r and not r["fits"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

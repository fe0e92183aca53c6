"""GPU check of issue 31's "other GPUs" work, on the one GPU the project has (an H100), in one run (< 4 min):

1. dispatch on the real device: the shared memory a block may use as Triton's driver reports it
   against dispatch.SHARED_MEMORY_PER_BLOCK's figure for its capability; is_hopper, is_rocm, tma_ok,
   fp8_ok, gpu_problem.
2. check: the configurations the plans pick for GPUs with less shared memory (dispatch.TARGETS sm_80,
   sm_86 / sm_89 / sm_120a (99 KiB) and gfx90a (64 KiB of LDS)) and gemm_fp8's exact float16 upcasts
   (sm_80, sm_86, ROCm), each planned under dispatch.pretend (meta stand-ins) and run by the op's own
   launch on this GPU's bf16/fp16 tensors (compiled for sm_90a: the configuration is what is checked,
   not another GPU's code), against float64, outputs NaN-filled first.
3. time (triton.testing.do_bench medians): each such configuration against the H100's own plan for the
   same inputs, in the same run, and against the op's peer: a torch copy of the same bytes (Hadamard),
   torch._scaled_mm and cuBLAS bf16 (gemm_fp8), SDPA (decode). This prices the smaller tiles and
   fewer stages on an H100; on the GPUs they are for, nothing here measures them.

Run from the repository root on the GPU machine:

    PYTHONPATH=. python3 experiments/portability/gpu_check.py

``--only=TEXT`` runs the cases whose label holds TEXT (``--only=float32`` the float32 n = 32768 one,
which runs only when named: its compiles take minutes). ``--dry`` runs the same code on the CPU through Triton's interpreter at tiny sizes (float16: the
interpreter's bf16 dot is not bf16's), timing with a host clock: a check of the script, not of the
kernels. Writes $OUT/portability_gpu_check.json ($OUT defaults to /tmp/out) after each case (experiments/common/
gpu_script.py's Run: the cases are its rows, with the device, versions and date) and prints a table last.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DRY = "--dry" in sys.argv
if DRY:  # before tilecore: its kernels are made for the interpreter or a GPU at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from experiments.common.gpu_script import Run, eager_ms, poisoned  # noqa: E402
from tilecore import accuracy, dispatch  # noqa: E402
from tilecore.ops.attention import attention_reference  # noqa: E402
from tilecore.ops.attention import launch as attention_launch  # noqa: E402
from tilecore.ops.attention import plan as attention_plan  # noqa: E402
from tilecore.ops.gemm import launch as gemm_launch  # noqa: E402
from tilecore.ops.gemm import plan as gemm_plan  # noqa: E402
from tilecore.ops.gemm import reference as gemm_reference  # noqa: E402
from tilecore.ops.hadamard import hadamard_reference  # noqa: E402
from tilecore.ops.hadamard import launch as hadamard_launch  # noqa: E402
from tilecore.ops.hadamard import plan as hadamard_plan  # noqa: E402

BUDGET_S = 1800 if DRY else 220  # cases still to run after this are skipped (and said so)
ONLY = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), "")  # cases whose label has it
DEV = torch.device("cpu" if DRY else "cuda")
BF16 = torch.float16 if DRY else torch.bfloat16
T = dispatch.TARGETS
RUN = Run("portability_gpu_check", deadline=BUDGET_S, out=os.environ.get("OUT", "/tmp/out"))
RUN.extra.update(dispatch={}, skipped=[])


def guarded(label: str, fn):
    """Run one case; an exception is printed and recorded (RUN.errors), and the run goes on."""
    if RUN.left() < 0:
        RUN.say(f"[skip] {label}: past the {BUDGET_S} s budget")
        RUN.extra["skipped"].append(label)
        return None
    RUN.say(label)
    result = RUN.attempt(label, fn)
    if not DRY:
        torch.cuda.synchronize()
    return result


def bench_ms(fn) -> float:
    """do_bench's median on the GPU; the host clock's (a few calls: the interpreter's) in a dry run."""
    return eager_ms(fn, warmup=25, rep=100)


def planned_for(name: str | None, plan_fn, *tensors, **kwargs):
    """``plan_fn`` of ``tensors`` as on the GPU ``name`` (meta stand-ins under dispatch.pretend), or as
    on this device (name None)."""
    if name is None:
        return plan_fn(*tensors, **kwargs)
    stand_ins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in tensors]
    with dispatch.pretend(T[name]):
        return plan_fn(*stand_ins, **kwargs)


def record(**row):
    RUN.row(f"{row['op']} {row['target']} {row['case']}", **row)


# --------------------------------------------------------------------------------------------
# 1. dispatch on this device


def check_dispatch():
    if DRY:
        RUN.extra["dispatch"] = {"device": "cpu (dry run)"}
        return
    p = torch.cuda.get_device_properties(0)
    from triton.runtime import driver

    reported = int(driver.active.utils.get_device_properties(0)["max_shared_mem"])
    RUN.extra["dispatch"] = dict(
        gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
        triton_max_shared_mem=reported, shared_memory_per_block=dispatch.shared_memory_per_block(DEV),
        table=dispatch.shared_memory_for(p.major, p.minor, rocm=torch.version.hip is not None),
        is_hopper=dispatch.is_hopper(DEV), is_rocm=dispatch.is_rocm(DEV), tma_ok=dispatch.tma_ok(DEV),
        fp8_ok=dispatch.fp8_ok(DEV), gluon_ok=dispatch.gluon_ok(DEV), gpu_problem=dispatch.gpu_problem(DEV))
    RUN.say("dispatch:", RUN.extra["dispatch"])


# --------------------------------------------------------------------------------------------
# 2-3. check and time


def hadamard_case(target: str, n: int, dtype):
    elements = (1 << 14) if DRY else (1 << 26 if dtype == torch.float32 else 1 << 28)
    rows = max(2, elements // n)
    x = torch.randn(rows, n, dtype=dtype, device=DEV)
    out = poisoned(x)
    scale = n**-0.5
    fitted = planned_for(target, hadamard_plan.plan, x, out)
    here = planned_for(None, hadamard_plan.plan, x, out)
    hadamard_launch.launch(fitted, x, out, scale)
    written = bool(torch.isfinite(out).all())
    check_rows = min(rows, max(1, (1 << 20) // n))  # the float64 reference on a slice of the rows
    ref = hadamard_reference(x[:check_rows], scale, out_dtype=torch.float64)
    err = (accuracy.rel_rms(out[:check_rows], ref) if dtype == torch.float32
           else accuracy.error_over_floor(out[:check_rows], ref))
    ms_fit = bench_ms(lambda: hadamard_launch.launch(fitted, x, out, scale))
    ms_here = bench_ms(lambda: hadamard_launch.launch(here, x, out, scale))
    ms_copy = bench_ms(lambda: out.copy_(x))
    cfg = fitted.config
    record(op="hadamard", target=target, case=f"{str(dtype)[6:]} n={n} rows={rows}", written=written,
           error=err, error_kind="rel_rms" if dtype == torch.float32 else "x floor",
           config=f"B={cfg.get('B')} stages={cfg.get('num_stages')} tma={cfg.get('TMA_LOAD')}/{cfg.get('TMA_STORE')}",
           here=f"{here.path} " + (f"B={here.config.get('B')} stages={here.config.get('num_stages')}"
                                   if here.path == "tl" else ""),
           ms=ms_fit, ms_here=ms_here, fit_over_here=ms_here / ms_fit, copy_fraction=ms_copy / ms_fit)


def gemm_fp8_case(target: str, size: int):
    M = N = K = 128 if DRY else size
    a = (torch.randn(M, K, device=DEV) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(K, N, device=DEV) * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(M, 1, device=DEV) + 0.5, torch.rand(1, device=DEV) + 0.5
    out_dtype = torch.float16 if DRY else torch.bfloat16

    def plan_fn(a, b, sa, sb):
        return gemm_plan.plan(a, b, out_dtype=out_dtype, scales=(sa, sb))

    fitted = planned_for(target, plan_fn, a, b, sa, sb)
    here = planned_for(None, plan_fn, a, b, sa, sb)
    out = poisoned(torch.empty(M, N, dtype=out_dtype, device=DEV))
    gemm_launch.launch(fitted, a, b, None, (sa, sb), out=out)
    written = bool(torch.isfinite(out).all())
    err = accuracy.error_over_floor(out, gemm_reference.gemm_fp8_f64(a, b, sa, sb))
    ms_fit = bench_ms(lambda: gemm_launch.launch(fitted, a, b, None, (sa, sb), out=out))
    ms_here = bench_ms(lambda: gemm_launch.launch(here, a, b, None, (sa, sb), out=out))
    row = dict(op="gemm_fp8", target=target, case=f"{M}^3 row scales", written=written, error=err,
               error_kind="x floor", config=f"{fitted.path} operands {fitted.operand_dtype}", here=here.path,
               ms=ms_fit, ms_here=ms_here, fit_over_here=ms_here / ms_fit, tflops=2 * M * N * K / ms_fit / 1e9)
    if not DRY:
        bt = b.t().contiguous().t()
        ms_scaled = bench_ms(lambda: torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb.reshape(1, 1).expand(1, N)
                                                      .contiguous(), out_dtype=out_dtype))
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        ms_bf16 = bench_ms(lambda: a16 @ b16)
        row.update(scaled_mm_over_fit=ms_scaled / ms_fit, cublas_bf16_over_fit=ms_bf16 / ms_fit)
    record(**row)


def attention_case(target: str, d: int, kind: str):
    if kind == "decode":
        b, hq, hkv, n, nk = (1, 4, 2, 1, 300) if DRY else (16, 32, 8, 1, 4096)
        causal = True
    else:
        b, hq, hkv, n, nk = (1, 1, 1, 520, 70) if DRY else (4, 16, 16, 4096, 4096)
        causal = False
    q = torch.randn(b, hq, n, d, dtype=BF16, device=DEV)
    k = torch.randn(b, hkv, nk, d, dtype=BF16, device=DEV)
    v = torch.randn(b, hkv, nk, d, dtype=BF16, device=DEV)
    scale = d**-0.5
    path = None if kind == "decode" else "tl"  # the H100's own tl configuration, not its Gluon kernel

    def plan_fn(q, k, v):
        return attention_plan.plan_forward(q, k, v, causal, scale, path=path if target is None else None)

    fitted = planned_for(target, plan_fn, q, k, v)
    here = attention_plan.plan_forward(q, k, v, causal, scale, path=path)
    out, lse = poisoned(q), poisoned(torch.empty(b, hq, n, device=DEV))
    attention_launch.forward(fitted, q, k, v, out, lse, causal, scale)
    written = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
    rows = slice(0, min(n, 256))  # the float64 reference on the first query rows
    ref, _ = attention_reference(q[:, :, rows].double(), k.double(), v.double(), causal=causal and kind == "decode",
                                 scale=scale)
    err = accuracy.error_over_floor(out[:, :, rows], ref)
    ms_fit = bench_ms(lambda: attention_launch.forward(fitted, q, k, v, out, lse, causal, scale))
    ms_here = bench_ms(lambda: attention_launch.forward(here, q, k, v, out, lse, causal, scale))
    row = dict(op=f"attention {kind}", target=target, case=f"B{b} Hq{hq} Hkv{hkv} N{n} Nk{nk} D{d}", written=written,
               error=err, error_kind="x floor", config=" ".join(f"{k}={v}" for k, v in fitted.config.items()),
               here=f"{here.path} " + " ".join(f"{k}={v}" for k, v in here.config.items()), ms=ms_fit,
               ms_here=ms_here, fit_over_here=ms_here / ms_fit)
    if not DRY:
        import torch.nn.functional as F

        ms_sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal and n > 1, scale=scale,
                                                                  enable_gqa=hq != hkv))
        row.update(sdpa_over_fit=ms_sdpa / ms_fit)
    record(**row)


def main() -> int:
    guarded("dispatch", check_dispatch)
    f32 = torch.float32
    cases = [
        ("hadamard sm_86 n=64", lambda: hadamard_case("sm_86", 64, BF16)),
        ("hadamard sm_86 n=128", lambda: hadamard_case("sm_86", 128, BF16)),
        ("hadamard sm_86 n=256", lambda: hadamard_case("sm_86", 256, BF16)),
        ("hadamard sm_80 n=256 (pointers, not TMA)", lambda: hadamard_case("sm_80", 256, BF16)),
        ("hadamard gfx90a n=16", lambda: hadamard_case("gfx90a", 16, BF16)),
        ("hadamard gfx90a n=256", lambda: hadamard_case("gfx90a", 256, BF16)),
        ("hadamard gfx90a n=2048", lambda: hadamard_case("gfx90a", 2048, BF16)),
        ("gemm_fp8 sm_86 (float16 upcasts)", lambda: gemm_fp8_case("sm_86", 4096)),
        ("gemm_fp8 sm_89 (tl on e4m3)", lambda: gemm_fp8_case("sm_89", 4096)),
        ("attention decode sm_86 D64", lambda: attention_case("sm_86", 64, "decode")),
        ("attention decode sm_86 D128", lambda: attention_case("sm_86", 128, "decode")),
        ("attention decode gfx90a D128", lambda: attention_case("gfx90a", 128, "decode")),
        ("attention decode sm_86 D256", lambda: attention_case("sm_86", 256, "decode")),
        ("attention forward gfx90a D128", lambda: attention_case("gfx90a", 128, "forward")),
        ("hadamard gfx90a n=32768", lambda: hadamard_case("gfx90a", 32768, BF16)),
    ]
    # only when named (--only=float32): its two compiles (one stage, and the H100's two) take minutes
    slow = [("hadamard sm_86 float32 n=32768", lambda: hadamard_case("sm_86", 32768, f32))]
    for label, fn in cases + [case for case in slow if ONLY and ONLY in case[0]]:
        if ONLY in label:
            guarded(label, fn)
    RUN.save()
    print()
    print(f"{'op':20s} {'as on':8s} {'case':34s} {'written':7s} {'error':>9s} {'ms':>8s} {'H100 plan / fit':>15s}  peer")
    for r in RUN.rows:
        peer = next((f"{k} {r[k]:.2f}" for k in ("copy_fraction", "scaled_mm_over_fit", "sdpa_over_fit") if k in r), "")
        print(f"{r['op']:20s} {r['target']:8s} {r['case']:34s} {str(r['written']):7s} {r['error']:9.3g} "
              f"{r['ms']:8.3f} {r['fit_over_here']:15.2f}  {peer}")
    print(f"errors: {len(RUN.errors)}, skipped: {RUN.extra['skipped']}, {RUN.elapsed():.0f} s; "
          f"dispatch: {RUN.extra['dispatch']}")
    return 1 if RUN.errors else 0


if __name__ == "__main__":
    sys.exit(main())

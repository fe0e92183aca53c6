"""Attention launch knobs timed next to cuDNN in one process, ROUNDS interleaved rounds (per variant
the median TFLOP/s and the median, min and max of its per-round ratio to cuDNN).

fwd: kernels.L2_GROUP_BYTES (how many heads' K and V the persistent tile order keeps together) at
    N = 2048 .. 16384 (B * N fixed), D 64 / 128, causal and not; outputs must equal bit for bit.
bwd: the same budgets for the backward (Q and dO of a kv head's group) at N = 4096 (--bwd-n).

(Session 10's first run of this script, notes/attention_knobs_session10_run1_h100.json, timed a
dQ "deferred" backward variant, since removed, and a head-group sweep at N = 4096.)

    PYTHONPATH=. python3 scripts/device/attention_knobs.py [--phases fwd,bwd] [--out DIR]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from tilecore.bench.harness import ratios_to  # noqa: E402
from tilecore.ops.attention import kernels  # noqa: E402

B, H, N = 16, 16, 4096
ROUNDS = 5


def meta():
    import triton
    from tilecore import env
    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "sms": p.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "source": env.source_digest(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def rounds(fns: dict, flops: float, label: str, **bench) -> dict:
    """TFLOP/s of every fn, ROUNDS times in turn; per variant the median TFLOP/s and the median,
    min and max of its per-round ratio to the "cuDNN" entry's figure of the same round."""
    out = ratios_to("cuDNN", fns, flops, ROUNDS, warmup_ms=10, rep_ms=50, **bench)
    print(f"{label}: " + ", ".join(f"{n} {r['tflops']:.0f} ({r['ratio']:.3f}x, {r['lo']:.2f}-{r['hi']:.2f})"
                                   for n, r in out.items()), flush=True)
    return out


MIB = 1 << 20
BUDGETS = [4 * MIB, 8 * MIB, 12 * MIB, 24 * MIB]  # kernels.L2_GROUP_BYTES candidates (--budgets)
HEAD_DIMS = [128, 64]  # (--d)
FWD_LENGTHS = [2048, 4096, 8192, 16384]  # (--fwd-n)
BWD_LENGTHS = [4096]  # (--bwd-n)


def with_budget(budget, fn):
    def f():
        shipped, kernels.L2_GROUP_BYTES = kernels.L2_GROUP_BYTES, budget
        try:
            return fn()
        finally:
            kernels.L2_GROUP_BYTES = shipped
    return f


def phase_fwd(res):
    """The forward at B * N = 16 x 4096 tokens a head, every budget next to cuDNN; a budget only
    reorders the tiles, so its output must equal the shipped one bit for bit."""
    import tilecore
    for d in HEAD_DIMS:
        for causal in (True, False):
            for n in FWD_LENGTHS:
                b = B * N // n
                q, k, v = (torch.randn(b, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                run = lambda: tilecore.attention(q, k, v, causal=causal)
                ref = run()
                fns = {}
                for budget in BUDGETS:
                    f = with_budget(budget, run)
                    if not torch.equal(f(), ref):
                        print(f"D={d} causal={causal} N={n} budget {budget // MIB} MiB: output differs  FAIL", flush=True)
                    fns[f"{budget // MIB} MiB ({max(1, min(16, budget // (2 * n * d * 2)))} heads)"] = f

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fns["cuDNN"] = cudnn
                fl = 4 * b * H * n * n * d / (2 if causal else 1)
                res["fwd"][f"D{d} N{n}{' causal' if causal else ''}"] = rounds(fns, fl, f"fwd D={d} N={n} causal={causal}")
                del q, k, v, ref
                torch.cuda.empty_cache()


def backward_case(n: int, d: int, causal: bool):
    """A backward timing case at B * N = 16 x 4096 tokens a head, bf16: (run, cudnn, flops, grads):
    run(gluon=None) is kernels.backward_into (a Gluon config if given) into fixed buffers, cudnn()
    cuDNN's autograd backward of the same inputs, grads the tensors whose .grad it fills."""
    b = B * N // n
    q, k, v, do = (torch.randn(b, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(b, H, n, device="cuda")
    kernels.forward_into(q, k, v, out, lse, causal, d ** -0.5)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grads = [t.clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(*grads, is_causal=causal)

    def run(gluon=None):
        kernels.backward_into(do, q, k, v, out, lse, None, dq, dk, dv, causal, d ** -0.5, gluon=gluon)

    run.inputs = (q, k, v, do, out, lse)  # for calls of a kernel alone (bwd_variants.py)
    return run, lambda: o.backward(do, retain_graph=True), 2.5 * 4 * b * H * n * n * d / (2 if causal else 1), grads


def phase_bwd(res):
    """The backward (shipped configs) for every budget next to cuDNN's, at BWD_LENGTHS (B * N fixed)."""
    for d in HEAD_DIMS:
        for causal in (True, False):
            for n in BWD_LENGTHS:
                run, cudnn, fl, grads = backward_case(n, d, causal)
                fns = {f"{budget // MIB} MiB": with_budget(budget, run) for budget in BUDGETS}
                fns["cuDNN"] = cudnn
                res["bwd"][f"D{d} N{n}{' causal' if causal else ''}"] = rounds(
                    fns, fl, f"bwd D={d} N={n} causal={causal}", grad_to_none=grads)
                del run, cudnn, grads, fns
                torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="fwd,bwd")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budgets", default="4,8,12,24", help="MiB")
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fwd-n", default="2048,4096,8192,16384")
    ap.add_argument("--bwd-n", default="4096")
    args = ap.parse_args()
    global ROUNDS
    ROUNDS = args.rounds
    BUDGETS[:] = [int(x) * MIB for x in args.budgets.split(",")]
    HEAD_DIMS[:] = [int(x) for x in args.d.split(",")]
    FWD_LENGTHS[:] = [int(x) for x in args.fwd_n.split(",")]
    BWD_LENGTHS[:] = [int(x) for x in args.bwd_n.split(",")]
    res = {"meta": meta(), "fwd": {}, "bwd": {}}
    for phase in args.phases.split(","):
        t = time.time()
        {"fwd": phase_fwd, "bwd": phase_bwd}[phase](res)
        print(f"===== {phase}: {time.time() - t:.0f} s", flush=True)
        json.dump(res, open(os.path.join(args.out, "attention_knobs.json"), "w"), indent=1)
    print("\nsummary (median ratio to cuDNN over rounds, min-max)")
    for part in ("fwd", "bwd"):
        for case, rows in res[part].items():
            print(f"{part} {case}: " + "; ".join(f"{n} {r['ratio']:.3f} ({r['lo']:.2f}-{r['hi']:.2f})"
                                                for n, r in rows.items() if n != "cuDNN"))


if __name__ == "__main__":
    main()

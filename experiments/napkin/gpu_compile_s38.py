"""Session 38 (helper HH), issue 36: compiled attention at its defaults against the hand-written kernel, and the
bench's hadamard-latency rows by GPU time (CUDA graphs); one job of < 60 s on an H100.

    PYTHONPATH=. python3 experiments/napkin/gpu_compile_s38.py            # the GPU job
    PYTHONPATH=. python3 experiments/napkin/gpu_compile_s38.py --only=others   # one part: softcap, hadamard, others
    PYTHONPATH=. python3 experiments/napkin/gpu_compile_s38.py --only=hadamard --eager-too   # + the eager suite
    TRITON_INTERPRET=1 python experiments/napkin/gpu_compile_s38.py --smoke   # the same code, tiny, on the CPU

1. softcap_approx(30) full attention D128 (B4 H16 N4096 bf16, scale D^-0.5): the compiled diagram at its default
   (two 8-warp programs an SM: BM 128 BN 64, 2 stages, registers capped at 128, every exponential by MUFU) beside
   the blocks it replaced (BM 128 BN 64 8 warps 3 stages, one program an SM) and tilecore.attention(softcap=30),
   in interleaved rounds, GPU time from CUDA graphs (do_bench_cudagraph) and eager do_bench beside it; each
   config checked against the diagram's float64 evaluation at B1 H16 N1024 (poisoned output).
2. hadamard-latency: the bench suite (tilecore.bench.suites.hadamard.LATENCY: 1..256 rows of n 4096 / 16384
   bf16, tilecore against torch's copy of the same bytes) run by the bench's own harness with its calls replayed
   from CUDA graphs (timing "graph") instead of eager launches, each row beside the napkin's prediction
   (tilecore.napkin.validate, as docs/napkin.md predicts the committed eager file); the result is written in the
   bench's JSON format ($OUT/hadamard-latency.json) for benchmarks/results/.
3. while time is left: every other shipped attention default (plain causal / full at D128 and D64,
   softcap_approx causal D128) against tilecore.attention, checked, 3 rounds.
Each attention row beside the napkin's prediction (compile.predicted_time, its H100 calibrated with this run's
copy bandwidth and cuBLAS bf16 rate). Writes $OUT/napkin_compile_s38.json after every row; a table last.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:  # before tilecore: its kernels are made for the interpreter or a GPU at import
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

import tilecore  # noqa: E402
from experiments.common.gpu_script import Run, check, eager_ms, poisoned, time_rounds  # noqa: E402
from tilecore.napkin import H100, Diagram, rewrite  # noqa: E402
from tilecore.napkin.compile import predicted_time  # noqa: E402
from tilecore.ops.napkin_compiled import CompiledDiagram, compile_diagram, evaluate  # noqa: E402

DEV = torch.device("cpu" if SMOKE else "cuda")
DT, DTN = (torch.float16, "fp16") if SMOKE else (torch.bfloat16, "bf16")
B, H, N = (1, 2, 64) if SMOKE else (4, 16, 4096)
ONLY = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), None)  # softcap, hadamard, others
ONE_PER_SM = dict(BM=128, BN=64, num_warps=8, num_stages=3, HEAD_GROUP=0)  # the full loop's blocks before the flip


def attention(b, h, n, d, causal, modifiers):
    """Q K^T, the score modifiers, softmax . V over the keys, [b, h] woven (the diagram tilecore.attention runs)."""
    g = Diagram("attention", q=n, x=n, d=d, e=d)
    Q, K, V = g.input("Q", "q d", DTN), g.input("K", "x d", DTN), g.input("V", "x e", DTN)
    S = g.contract(Q, K, out="q x", name="S", dtype="fp32")
    for i, fn in enumerate(modifiers):  # each map costed as the emitted code spends it (run 1 left this out)
        unit, ops = rewrite.map_cost(fn)
        S = g.map(fn, S, name=f"S{i}", unit=unit, ops=ops, dtype="fp32")
    O = g.softmax_contract(S, V, over="x", name="O", causal="q" if causal else None, dtype=DTN)
    return g.output(O).weave("h", h, ["Q", "K", "V"]).weave("b", b, ["Q", "K", "V"])


def inputs(g, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return {a.name: torch.randn([g.sizes[x] for x in a.axes], generator=gen, device=DEV).to(DT) for a in g.inputs()}


def calibrated_h100(run):
    """The napkin's H100 with this run's copy bandwidth (1 GiB bf16 copy) and cuBLAS bf16 8192^3 rate."""
    if SMOKE:
        return H100

    def copy_s():
        x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
        y = torch.empty_like(x)
        return eager_ms(lambda: y.copy_(x)) * 1e-3

    def matmul_s():
        a, b = (torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        return eager_ms(lambda: a @ b) * 1e-3
    copy, mm = 4 * 2 ** 29 / copy_s(), 2 * 8192 ** 3 / matmul_s()
    run.extra["ceilings"] = {"copy_bytes_per_s": copy, "matmul_bf16_flops": mm}
    run.say(f"ceilings: copy {copy / 1e9:.0f} GB/s, cuBLAS bf16 {mm / 1e12:.0f} TFLOP/s")
    return H100.calibrated(copy_bytes_per_s=copy, matmul_flops={"bf16": mm}, label="this run")


def attention_case(run, gpu, label, d, causal, modifiers, configs, rounds):
    """Each config (None: the default) checked at B1 H N/4 against float64, then timed with tilecore.attention in
    interleaved rounds; one row a config."""
    softcap = next((float(m.split("(")[1].rstrip(")")) for m in modifiers if m.startswith("softcap")), 0.0)
    small = attention(1, H, N // 4, d, causal, modifiers)
    ins_s = inputs(small, seed=2)
    ref = evaluate(small, ins_s)["O"]
    g = attention(B, H, N, d, causal, modifiers)
    ins = inputs(g, seed=1)
    fns, checks = {}, {}
    for name, cfg in configs.items():
        checks[name] = check(CompiledDiagram(compile_diagram(small).program, cfg)(poison=True, **ins_s)["O"], ref,
                             tol=2.0)
        f = CompiledDiagram(compile_diagram(g).program, cfg)
        fns[name] = (lambda f=f: f(**ins))
    kw = dict(softcap=softcap) if softcap else {}
    q, k, v = (ins_s[n].view(1, H, N // 4, d) for n in ("Q", "K", "V"))
    out = poisoned(q)
    out.copy_(tilecore.attention(q, k, v, causal=causal, **kw))
    checks["tilecore.attention"] = check(out, ref.view(1, H, N // 4, d), tol=2.0)
    Q, K, V = (ins[n] for n in ("Q", "K", "V"))
    fns["tilecore.attention"] = lambda: tilecore.attention(Q, K, V, causal=causal, **kw)
    for f in fns.values():
        f()
    try:
        t = time_rounds(fns, rounds=rounds, graph=True, deadline=run)
    except Exception as err:  # noqa: BLE001 (a capture that fails: the eager rounds still decide)
        run.errors.append(f"{label}: graph timing: {type(err).__name__}: {err}"[:300])
        t = time_rounds(fns, rounds=rounds, deadline=run)
    pred_ms = predicted_time(g, gpu).seconds * 1e3
    peer, peer_eager = t.get("tilecore.attention_graph_ms"), t.get("tilecore.attention_ms")
    for name in configs:
        ms, eager = t.get(f"{name}_graph_ms", t.get(f"{name}_ms")), t.get(f"{name}_ms")
        run.row(f"{label} {name}", pass_=checks[name]["pass"], err=checks[name].get("err_over_floor"),
                us=ms * 1e3, pred_us=pred_ms * 1e3, c_pred=ms / pred_ms, peer_us=(peer or peer_eager) * 1e3,
                x_peer=(peer or peer_eager) / ms, eager_x_peer=peer_eager / eager if eager else None,
                rounds=t[f"{name}_rounds"], peer_rounds=t["tilecore.attention_rounds"],
                peer_check=checks["tilecore.attention"], config=configs[name] or "default")


def hadamard_latency(run, timing="graph"):
    """The bench's hadamard-latency suite, its calls replayed from CUDA graphs (timing "graph") or eager as the bench
    runs it today ("eager"), written as the bench writes it; each row's time over the napkin's (validate.predict_file:
    as docs/napkin.md would predict this file)."""
    from tilecore.bench import harness
    from tilecore.bench.suites.hadamard import LATENCY
    from tilecore.napkin import validate

    result = harness.run_suite(dataclasses.replace(LATENCY, timing=timing))
    data = result.to_json()
    path = Path(os.environ.get("OUT", ".")) / f"hadamard-latency{'' if timing == 'graph' else '-' + timing}.json"
    path.write_text(json.dumps(data, indent=1))
    preds = validate.predict_file(path, data, validate.lab_gpu(), validate.gemm_configs(), validate.host_times())
    rows = {}
    for row, p in zip(data["rows"], preds):
        rows.setdefault((row["params"]["n"], row["params"]["rows"]), {})[row["series"]] = (
            row["ms"] * 1e3, p.measured_s / p.predicted_s, p.bound)
    for (n, r), s in sorted(rows.items()):
        tc, cp = s.get("tilecore", (None,) * 3), s.get("torch copy_", (None,) * 3)
        run.row(f"hadamard {timing} n{n} rows {r}", us=tc[0], c_pred=tc[1], bound=tc[2], copy_us=cp[0],
                copy_c_pred=cp[1], dao_us=s["dao"][0] if "dao" in s else None)


def main():
    run = Run("napkin_compile_s38", deadline=54)
    gpu = run.attempt("ceilings", calibrated_h100, run) or H100
    scale = f"scale({128 ** -0.5})"
    d = 32 if SMOKE else 128
    if SMOKE:
        scale = f"scale({d ** -0.5})"
    before = dict(BM=16, BN=16, HEAD_GROUP=0) if SMOKE else ONE_PER_SM
    if ONLY in (None, "softcap"):
        run.attempt("softcap_approx full", attention_case, run, gpu, f"softcap_approx 30 D{d}", d, False,
                    (scale, "softcap_approx(30.0)"), {"default": None, "before: one program an SM": before}, 5)
    if not SMOKE and ONLY in (None, "hadamard"):
        run.attempt("hadamard-latency", hadamard_latency, run)
    if not SMOKE and ONLY == "hadamard" and "--eager-too" in sys.argv:  # today's eager calls beside, same process
        run.attempt("hadamard-latency eager", hadamard_latency, run, "eager")
    others = [(f"plain causal D{d}", d, True, (scale,)), (f"softcap_approx 30 causal D{d}", d, True,
                                                          (scale, "softcap_approx(30.0)"))]
    if not SMOKE:
        others += [("plain D128", 128, False, (scale,)), ("plain causal D64", 64, True, ("scale(0.125)",)),
                   ("plain D64", 64, False, ("scale(0.125)",))]
    for label, dd, causal, mods in others if ONLY in (None, "others") else []:
        if run.left() < 8:
            run.errors.append(f"{label}: skipped (time)")
            continue
        run.attempt(label, attention_case, run, gpu, label, dd, causal, mods, {"default": None}, 3)
    run.finish(["name", "pass_", "err", "us", "pred_us", "c_pred", "peer_us", "x_peer", "eager_x_peer", "copy_us",
                "copy_c_pred"])


if __name__ == "__main__":
    main()

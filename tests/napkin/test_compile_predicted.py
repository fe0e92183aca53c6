"""napkin.compile's predicted time (compile.predicted_time) against the committed H100 run of the compiled
kernels (notes/napkin/runs/napkin_gpu_compile_session26_h100.json), calibrated with that run's own copy
and cuBLAS figures: every case within the issue's 20% (the engine's overlap rule alone missed softcap
attention by 1.29-1.37x and RMSNorm + GEMM by 1.23x)."""
import json
from pathlib import Path

import pytest

from tilecore.napkin import H100, Diagram, compose, models, rewrite
from tilecore.napkin.compile import attention_issue_per_score, predicted_time

RUNS = Path(__file__).resolve().parents[2] / "notes" / "napkin" / "runs"
# session 26's run (the cases the model was revised against in session 27) and session 35's (predictions at
# 77b705e, written before it; softcap_approx's first timing)
RUN = RUNS / "napkin_gpu_compile_session26_h100.json"
RUN_35 = RUNS / "compile_s35_run2_session35_h100_napkin_gpu_compile.json"


def _attention(modifiers, causal=False, softmax=True, B=4, H=16, N=4096, D=128, dtype="bf16", sigmoid_tanh=False):
    g = Diagram("attention", q=N, x=N, d=D, e=D)
    Q, K, V = g.input("Q", "q d", dtype), g.input("K", "x d", dtype), g.input("V", "x e", dtype)
    S = g.contract(Q, K, out="q x", name="S", dtype="fp32")
    for i, fn in enumerate(modifiers):
        last = i == len(modifiers) - 1 and not softmax
        unit, ops = rewrite.map_cost(fn)
        if sigmoid_tanh and fn.startswith("softcap("):  # the form those runs timed: 2 sigmoid(2x) - 1
            unit, ops = "sfu", 2.0
        S = g.map(fn, S, name=f"S{i}", unit=unit, ops=ops, dtype=dtype if last else "fp32")
    O = (g.softmax_contract(S, V, over="x", name="O", causal="q" if causal else None, dtype=dtype) if softmax
         else g.contract(S, V, out="q e", name="O", dtype=dtype))
    return g.output(O).weave("h", H, ["Q", "K", "V"]).weave("b", B, ["Q", "K", "V"])


def _glu(t, m, f, dtype="bf16"):
    g = Diagram("glu", t=t, m=m, f=f)
    X, W1, W3 = g.input("X", "t m", dtype), g.input("W1", "m f", dtype), g.input("W3", "m f", dtype)
    a = g.map("silu", g.contract(X, W1, out="t f", name="H1", dtype="fp32"), name="A", unit="sfu", dtype="fp32")
    return g.output(g.map("mul", a, g.contract(X, W3, out="t f", name="H3", dtype="fp32"), name="G", dtype=dtype))


def _rownorm(t, n, o, dtype="bf16"):
    proj = Diagram("proj", t=t, n=n, o=o)
    proj.output(proj.contract(proj.input("Xn", "t n", dtype), proj.input("P", "n o", dtype), out="t o",
                              name="Z", dtype=dtype))
    return compose(models.rmsnorm(rows=t, n=n, dtype=dtype), proj, {"Xn": "Y"}, name="rmsnorm+gemm")


CASES = {  # the run's case names (their first words) -> the diagram it timed
    "gated MLP": lambda: models.gated_mlp(tokens=8192, model=4096, hidden=14336),
    "dual GEMM": lambda: _glu(8192, 4096, 14336),
    "G W2": lambda: models.matmul(m=8192, n=4096, k=14336),
    # sessions 26 and 35 timed tanh as 2 sigmoid(2x) - 1 (two SFU instructions; one since session 36)
    "attention softcap 30 B4": lambda: _attention((f"scale({128 ** -0.5})", "softcap(30.0)"), sigmoid_tanh=True),
    "attention softcap 30 causal": lambda: _attention((f"scale({128 ** -0.5})", "softcap(30.0)"), causal=True,
                                                      sigmoid_tanh=True),
    "attention softcap_approx 30 B4": lambda: _attention((f"scale({128 ** -0.5})", "softcap_approx(30.0)")),
    "attention softcap_approx 30 causal": lambda: _attention((f"scale({128 ** -0.5})", "softcap_approx(30.0)"),
                                                             causal=True),
    "attention plain": lambda: _attention((f"scale({128 ** -0.5})",)),
    "attention sigmoid": lambda: _attention(("sigmoid(a * 0.125 - 2.0)",), softmax=False),
    "RMSNorm": lambda: _rownorm(8192, 4096, 4096),
}


@pytest.mark.parametrize("path", [RUN, RUN_35], ids=["session26", "session35"])
def test_every_compiled_case_of_the_h100_run_within_20_percent(path):
    run = json.loads(path.read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops={"bf16": c["matmul_bf16_flops"]},
                          label="this run")
    seen = set()
    for row in run["timings"]:
        key = next(k for k in CASES if row["case"].startswith(k))
        seen.add(key)
        p = predicted_time(CASES[key](), gpu)
        assert row["compiled_us"] * 1e-6 / p.seconds == pytest.approx(1.0, abs=0.20), (row["case"], p.terms)
    assert seen == {k for k in CASES if "approx" not in k or path == RUN_35}


RUN_36 = RUNS / "compile_s36a_run1_session36_h100_napkin_compile_s36.json"
RUN_36C = RUNS / "compile_s36c_run4_session36_h100_napkin_compile_s36.json"  # call 3: A/B, five rounds
CASES_36 = {  # session 36 call 1's case names (their first words) -> the diagram
    "RMSNorm+GEMM 8192x4096->4096 BO 256": lambda: _rownorm(8192, 4096, 4096),
    "softcap_approx 30 causal": lambda: _attention((f"scale({128 ** -0.5})", "softcap_approx(30.0)"), causal=True),
    "softcap 30 causal": lambda: _attention((f"scale({128 ** -0.5})", "softcap(30.0)"), causal=True),
    "softcap 30 (exact": lambda: _attention((f"scale({128 ** -0.5})", "softcap(30.0)")),
    "plain softmax": lambda: _attention((f"scale({128 ** -0.5})",)),
}


@pytest.mark.parametrize("path, rows", [(RUN_36, 7), (RUN_36C, 6)], ids=["call1", "call3"])
def test_session36_run_within_20_percent(path, rows):
    # every timed row but BO 128's (no longer launched: 1.18x BO 256's time, a tile the model does not
    # rank), the napkin calibrated with that run's copy and cuBLAS figures. Its exact softcap ran the first
    # one-ex2 form (885 SASS instructions a warp a key tile; 758 now): predicted by today's count
    run = json.loads(path.read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops={"bf16": c["matmul_bf16_flops"]},
                          label="this run")
    seen = 0
    for row in run["timings"]:
        key = next((k for k in CASES_36 if row["case"].startswith(k)), None)
        if key is None:
            assert "BO 128" in row["case"], row["case"]
            continue
        p = predicted_time(CASES_36[key](), gpu)
        assert row["compiled_us"] * 1e-6 / p.seconds == pytest.approx(1.0, abs=0.20), (row["case"], p.terms)
        seen += 1
    assert seen == rows


def test_the_terms_say_what_the_emitted_code_does():
    soft = predicted_time(_attention(("scale(0.1)", "softcap(30.0)"), B=1, H=2, N=1024, D=64), H100)
    plain = predicted_time(_attention(("scale(0.1)",), B=1, H=2, N=1024, D=64), H100)
    assert soft.family == plain.family == "attention"
    # tanh's one SFU instruction (compile._softcap) on top of the exponential, all of it exposed; then the
    # loop's instructions at the issue rate where they outlast the SFU work (softcap's Newton steps)
    assert soft.terms["of which SFU"] == pytest.approx(2 * plain.terms["of which SFU"], rel=0.01)
    assert soft.terms["kernel"] - plain.terms["kernel"] == pytest.approx(plain.terms["of which SFU"], rel=0.05)
    per = {g: attention_issue_per_score(_attention(m, B=1, H=2, N=1024, D=64)) for g, m in
           (("plain", ("scale(0.1)",)), ("soft", ("scale(0.1)", "softcap(30.0)")),
            ("approx", ("scale(0.1)", "softcap_approx(30.0)")))}
    assert per == pytest.approx({"plain": 340 / 32, "soft": 758 / 32, "approx": 436 / 32})  # the SASS counts
    sfu_clk = plain.terms["of which SFU"]  # one SFU instruction a score, 16 a clock an SM: 1/16 clock a score
    assert plain.terms["issue beyond the SFU"] == pytest.approx(sfu_clk * (per["plain"] * 16 / 128 - 1), rel=1e-6)
    assert soft.terms["issue beyond the SFU"] == pytest.approx(sfu_clk * (per["soft"] * 16 / 128 - 2), rel=1e-6)
    approx = predicted_time(_attention(("scale(0.1)", "softcap_approx(30.0)"), B=1, H=2, N=1024, D=64), H100)
    assert approx.terms["issue beyond the SFU"] == 0.0  # its two SFU instructions outlast its 13.6 others
    norm = predicted_time(_rownorm(1024, 512, 1024), H100)
    assert norm.family == "rownorm"
    assert {"GEMM (the row factor after the k-loop)", "row_factor pass", "prescale_weight pass"} <= set(norm.terms)
    assert norm.seconds == pytest.approx(sum(norm.terms.values()))


RUN_37A = RUNS / "compile_s37a_run1_session37_h100_napkin_compile_s37.json"  # session 37 call 1: plain, D128 / D64
RUN_37C = RUNS / "compile_s37c_run3_session37_h100_napkin_compile_s37.json"  # call 3: the defaults, final


@pytest.mark.parametrize("path, cases", [(RUN_37A, 4), (RUN_37C, 6)], ids=["call1", "call3"])
def test_session37_attention_within_20_percent(path, cases):
    # plain softmax attention causal and full at D128 and D64 (B4 H16 N4096) at every timed config (the
    # defaults and the blocks beside them: tiles the model does not rank, BN 32's twice the steps, at most
    # 1.11), and in call 3 softcap_approx(30) D128 causal and full (the full one also with 1 of 8 of its
    # exponentials by an FMA polynomial then, predicted as every one by MUFU: the model has no such term since
    # it was removed); the napkin calibrated with the run's copy and cuBLAS figures
    run = json.loads(path.read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops={"bf16": c["matmul_bf16_flops"]},
                          label="this run")
    seen = set()
    for row in run["timings"]:
        case = row["case"]
        causal, d = " causal " in case, int(case.split(" D")[1].split()[0])
        mods = (f"scale({d ** -0.5})",) + (("softcap_approx(30.0)",) if case.startswith("softcap_approx") else ())
        p = predicted_time(_attention(mods, causal=causal, D=d), gpu)
        assert row["compiled_us"] * 1e-6 / p.seconds == pytest.approx(1.0, abs=0.20), (case, p.terms)
        seen.add((len(mods), causal, d))
    assert len(seen) == cases


RUN_38A = RUNS / "compile_s38a_run1_session38_h100_napkin_compile_s38.json"  # session 38 call 1 (GPU time, graphs)


def test_session38_softcap_approx_full_within_20_percent_and_the_flip():
    # softcap_approx(30) full D128 (B4 H16 N4096 bf16) at its default since session 38 (two programs an SM) and
    # the blocks it replaced, GPU time from CUDA graphs, 5 rounds: both within 20% of the napkin calibrated with
    # the run's copy and cuBLAS figures (the run's own pred_us column costed the maps as ALU work: not used);
    # the default faster in every round, >= 0.8x the hand-written kernel, every check passed
    run = json.loads(RUN_38A.read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops={"bf16": c["matmul_bf16_flops"]},
                          label="this run")
    p = predicted_time(_attention((f"scale({128 ** -0.5})", "softcap_approx(30.0)")), gpu)
    rows = {r["name"]: r for r in run["rows"] if r["name"].startswith("softcap_approx 30 D128")}
    assert len(rows) == 2 and all(r["pass_"] and r["peer_check"]["pass"] for r in rows.values())
    for r in rows.values():
        assert r["us"] * 1e-6 / p.seconds == pytest.approx(1.0, abs=0.20), (r["name"], p.terms)
    new, old = rows["softcap_approx 30 D128 default"], rows["softcap_approx 30 D128 before: one program an SM"]
    assert max(new["rounds"]["graph"]) < min(old["rounds"]["graph"]) and new["x_peer"] >= 0.8


RUN_38B = RUNS / "compile_s38b_run3_session38_h100_napkin_compile_s38.json"  # session 38 call 3: the other defaults


def test_session38_every_other_shipped_default_within_20_percent():
    # plain causal / full at D128 and D64 and softcap_approx causal D128 (B4 H16 N4096 bf16) at their defaults,
    # GPU time from CUDA graphs, 3 rounds: within 20% of the napkin calibrated with the run's ceilings, checked
    # against float64, and >= 0.8x tilecore.attention (0.86-0.93x)
    run = json.loads(RUN_38B.read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops={"bf16": c["matmul_bf16_flops"]},
                          label="this run")
    assert len(run["rows"]) == 5
    for r in run["rows"]:
        name, d = r["name"], int(r["name"].split(" D")[1].split()[0])
        mods = (f"scale({d ** -0.5})",) + (("softcap_approx(30.0)",) if name.startswith("softcap_approx") else ())
        p = predicted_time(_attention(mods, causal=" causal " in name, D=d), gpu)
        assert r["us"] * 1e-6 / p.seconds == pytest.approx(1.0, abs=0.20), (name, p.terms)
        assert r["pass_"] and r["peer_check"]["pass"] and r["x_peer"] >= 0.8, name

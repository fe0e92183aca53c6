"""The attention backward's own model (tilecore.napkin.backward): its structure, its one derived
constant against shared/anchors.md, and what it does to the validation of the committed backward rows."""
import dataclasses
import statistics

import pytest

from tilecore.napkin import backward, models, validate
from tilecore.napkin.hardware import H100
from compiled_run import compiled_json


def _tflops(b, h, n, d, causal, t):
    return backward.backward_flops(b, h, n, d, causal) / t / 1e12


def test_five_mmas_are_two_and_a_half_forwards():
    fwd = models.attention(batch=2, heads=4, seq=1024, d=128).flops()
    bwd = models.attention_backward(batch=2, heads=4, seq=1024, d=128).flops()
    mma = sum(op.kind == "contract" for op in models.attention_backward(batch=2, heads=4, seq=1024, d=128).ops)
    assert mma == 5
    assert bwd / fwd == pytest.approx(2.5, rel=0.01)
    assert backward.backward_flops(2, 4, 1024, 128, False) == pytest.approx(bwd, rel=0.01)


@pytest.mark.parametrize("rates", backward.RATES)
def test_step_latency_is_derived_from_the_anchor_and_checks_on_the_other_anchor_rows(rates):
    assert backward.step_latency_from_anchor(rates=rates) == pytest.approx(backward.STEP_LATENCY_CLOCKS[rates], abs=1.0)
    gpu = backward.anchor_gpu()
    for d, causal, measured in backward.ANCHOR_CHECKS:   # rows not used for the constant
        t = backward.attention_backward_time(16, 16, 16, 4096, d, causal, gpu, "cudnn", rates=rates).time
        assert _tflops(16, 16, 4096, d, causal, t) == pytest.approx(measured, rel=0.1)


def test_clock_rates_do_not_follow_the_runs_gemm_ceiling():
    """The backward runs at its own clock: two runs' cuBLAS ceilings (680, 752) give the same prediction
    with rates="clock", and 10.6% apart with the engine's convention."""
    lo = H100.calibrated(copy_bytes_per_s=3000e9, matmul_flops={"bf16": 680e12})
    hi = H100.calibrated(copy_bytes_per_s=3000e9, matmul_flops={"bf16": 752e12})
    t = {(name, r): backward.attention_backward_time(16, 16, 16, 4096, 128, False, g, "cudnn", rates=r).time
         for name, g in (("lo", lo), ("hi", hi)) for r in backward.RATES}
    assert t["lo", "clock"] == pytest.approx(t["hi", "clock"])
    assert t["lo", "ceiling"] / t["hi", "ceiling"] > 1.05
    with pytest.raises(ValueError, match="accepted: clock, ceiling"):
        backward.attention_backward_time(1, 2, 2, 256, 64, False, H100, "cudnn", rates="boost")


def test_the_schedule_terms_order_as_the_structure_says():
    gpu = backward.anchor_gpu()
    staged = backward.attention_backward_time(16, 16, 16, 4096, 64, False, gpu, kernel=backward.CUDNN)
    own = backward.attention_backward_time(16, 16, 16, 4096, 64, False, gpu,
                                           kernel=dataclasses.replace(backward.CUDNN, dq="warpgroup"))
    serial = backward.attention_backward_time(16, 16, 16, 4096, 64, False, gpu,
                                              kernel=dataclasses.replace(backward.CUDNN, schedule="serial"))
    # a dQ warpgroup of its own runs its MMA under the consumers' links; without warp specialization
    # every unit adds
    assert own.time < staged.time < serial.time
    t = staged.terms
    assert t["compute"] == pytest.approx(t["mma"] + t["exp exposed"] + t["dS link (ALU)"] + t["dS through SMEM"]
                                         + t["step latency"])
    assert t["exp exposed"] == pytest.approx(2 / 3 * serial.terms["exp exposed"])
    assert t["SMEM (bound)"] < t["compute"] and t["L2 with dQ partials"] < t["compute"]
    assert [k for k, _, _ in staged.kernels] == ["preprocess", "main", "dq convert"]
    # no latency: the lockstep chain without its derived constant is faster
    free = backward.attention_backward_time(16, 16, 16, 4096, 64, False, gpu, "cudnn", step_latency_clocks=0)
    assert free.time < staged.time and free.terms["step latency"] == 0


def test_tilecore_short_d128_tiles_take_the_dq_kernel():
    gpu = H100
    short = backward.attention_backward_time(64, 16, 16, 512, 128, False, gpu, "tilecore")
    long = backward.attention_backward_time(16, 16, 16, 4096, 128, False, gpu, "tilecore")
    assert short.kernel.dq == "kernel" and [k for k, _, _ in short.kernels] == ["preprocess", "main", "dq kernel"]
    assert long.kernel.dq == "staged" and "dq convert" in [k for k, _, _ in long.kernels]
    assert backward.tilecore_kernel(64, 512, True).dq == "warpgroup"
    assert "tilecore backward" in short.breakdown()


def test_grouped_heads_and_bad_arguments():
    gqa = backward.attention_backward_time(2, 32, 8, 1024, 128, True, H100, "cudnn")
    mha = backward.attention_backward_time(2, 32, 32, 1024, 128, True, H100, "cudnn")
    assert gqa.time == pytest.approx(mha.time, rel=0.15)   # the same MMAs; fewer K, V bytes
    with pytest.raises(ValueError, match="accepted: tilecore, cudnn, flash"):
        backward.kernel_for("fa9", 128, 1024, False)
    with pytest.raises(ValueError, match="accepted: staged"):
        backward.BackwardKernel("x", dq="smem")
    with pytest.raises(ValueError, match="accepted: lockstep"):
        backward.BackwardKernel("x", schedule="pingpong")


def test_backward_rows_of_every_implementation_are_predicted_closer():
    preds = [p for p in validate.predict_all() if p.op.endswith("bwd")]
    assert len(preds) >= 120
    series = {p.series.split(" ")[0] for p in preds}
    assert {"tilecore", "cuDNN", "flash"} <= series
    # session 27: 77 of 120 within 15% (0 with the forward-like model), median ratio 1.04 (1.39-1.45),
    # every tilecore and cuDNN row at N >= 4096 within; session 28 (one-tile blocks' prologue and
    # epilogue, FlashAttention-2's operand reads at its clock, its grouped sums): 115 of 120, FA2 33 of
    # 36 (2 of 36 before); bounds with room for new bench runs
    within = sum(p.miss <= validate.TOLERANCE for p in preds)
    assert within >= 0.9 * len(preds)
    flash = [p for p in preds if p.series.startswith("flash")]
    assert sum(p.miss <= validate.TOLERANCE for p in flash) >= 0.8 * len(flash)
    assert all(p.params["N"] <= 1024 for p in preds if p.miss > validate.TOLERANCE)   # the misses: short tiles
    assert statistics.median(p.ratio for p in preds) < 1.1
    wgmma_long = [p for p in preds if not p.series.startswith("flash") and p.params["N"] >= 4096]
    assert sum(p.miss <= validate.TOLERANCE for p in wgmma_long) >= 0.85 * len(wgmma_long)
    assert abs(statistics.median(p.ratio for p in wgmma_long) - 1) < 0.08
    heads = [p for p in preds if p.headline]
    assert heads and all(p.miss <= validate.TOLERANCE for p in heads)


def test_window_softcap_and_flex_rows_of_the_features_run():
    """notes/attention/runs/gpu_features_s26_round2_h100.json (H100, no ceiling in that run: the lab GPU):
    tilecore's Gluon backward causal, windowed and softcapped, and FlexAttention's windowed backward,
    predicted from the same structure and constants (FlexAttention's softcap is a named miss: its
    score_mod's libdevice tanh costs more than its two SFU instructions; notes/napkin)."""
    import json

    run = json.loads((validate.ROOT / "notes" / "attention" / "runs" / "gpu_features_s26_round2_h100.json").read_text())
    measured = {r["case"]: r.get("bwd_ms") for r in run["timing"]}
    gpu = validate.lab_gpu()
    cases = [("full causal N32768", "tilecore", 2, 32768, None, False),
             ("window (4096, 0) gluon bwd", "tilecore", 2, 32768, (4096, 0), False),
             ("flex window (4096, 0)", "flex", 2, 32768, (4096, 0), False),
             ("no softcap causal N4096", "tilecore", 16, 4096, None, False),
             ("softcap 30 gluon bwd tanh.approx", "tilecore", 16, 4096, None, True)]
    for case, impl, b, n, window, softcap in cases:
        t = backward.attention_backward_time(b, 16, 16, n, 128, True, gpu, impl, window=window, softcap=softcap).time
        assert measured[case] * 1e-3 / t == pytest.approx(1.0, abs=0.2), case
    # the shipped cap's cost over the plain causal backward, as measured with the shipped kernel (session 43: B16 H16
    # N4096 D128 causal, CUDA graphs, calls 1-2 on the lent H200s: 1.076x / 1.067x; the kernel this run timed, the
    # float16-derivative form, 1.18x). The model counts the cap's instructions, not the spills its form removed: 1.117x
    plain = backward.attention_backward_time(16, 16, 16, 4096, 128, True, gpu, "tilecore").time
    capped = backward.attention_backward_time(16, 16, 16, 4096, 128, True, gpu, "tilecore", softcap=True).time
    runs = validate.ROOT / "notes" / "attention" / "runs"
    for name in ("ht_first_s43a_run1_session43_h200_issue35_bwd.json", "ht_unmasked_s43b_run2_session43_h200_issue35_bwd.json"):
        row = next(r for r in json.loads((runs / name).read_text())["rows"]
                   if r["name"] == "softcap30 first causal B16 H16 N4096 D128 bwd")
        assert capped / plain == pytest.approx(row["unmasked_graph_ms"] / row["plain_graph_ms"], abs=0.06), name
    assert backward.window_density(4096, 128, 64, 4096, 0) == pytest.approx(
        backward.window_density(4096, 128, 64, 10 ** 6, 0))   # a window past N is causal
    assert 0.11 < backward.window_density(32768, 128, 64, 4096, 0) < 0.13


def test_one_tile_blocks_pay_their_prologue_and_epilogue():
    """cuDNN (FA3's grid of tiles) and FlashAttention-2 run one key tile a thread block: K, V and the first
    stage in, dK and dV out, at the SM's even share of the measured L2 bandwidth, and two DRAM round
    trips, with nothing else on the SM; tilecore's persistent kernel loads the next tile under the
    current one. The same tile count at every N (B N fixed): the term weighs ~5x more at N 512 than 4096."""
    gpu = H100
    assert backward.tile_clocks(backward.kernel_for("tilecore", 128, 4096, False), 128, gpu, 1545e6) == 0
    cudnn = backward.tile_clocks(backward.CUDNN, 128, gpu, 1545e6)
    by_hand = ((2 * 128 * 128 * 2 + 2 * 64 * 128 * 2 + 64 * 8 + 2 * 128 * 128 * 2) / (gpu.level("L2").bandwidth / gpu.sms)
               + 2 * gpu.tile_latency_s) * 1545e6
    assert cudnn == pytest.approx(by_hand) and 3000 < cudnn < 6000
    short = backward.attention_backward_time(128, 16, 16, 512, 128, False, gpu, "cudnn")
    long = backward.attention_backward_time(16, 16, 16, 4096, 128, False, gpu, "cudnn")
    share = lambda t: t.terms["tile prologue/epilogue"] / t.time  # noqa: E731
    assert short.terms["tile prologue/epilogue"] == pytest.approx(long.terms["tile prologue/epilogue"])
    assert share(short) > 5 * share(long) > 0   # the time is not all steps: the passes are fixed too
    assert backward.attention_backward_time(128, 16, 16, 512, 128, False, gpu, "tilecore").terms[
        "tile prologue/epilogue"] == 0


def test_flash2_reads_its_operands_per_warp_at_its_own_clock():
    """FlashAttention-2's warps (8: along S/dP rows, dK/dV rows, dQ rows (2, 4, 2) at D128) each read their
    MMA operands from shared memory: 576 KiB a step at both head dims (by hand: S and dP 128 KiB each,
    dV and dK 96, dQ 128 at D128); they add to the MMAs (serial), with no wgmma step latency, at the
    clock it ran at (1920 MHz); grouped heads add the two dK, dV group sums; SDPA's two layout copies."""
    k128, k64 = backward.flash2_kernel(128), backward.flash2_kernel(64)
    assert backward._warp_operand_bytes(k128, 128) == (128 + 128 + 96 + 96 + 128) * 1024
    assert backward._warp_operand_bytes(k64, 64) == 576 * 1024
    t = backward.attention_backward_time(4, 16, 16, 16384, 128, False, H100, "flash")
    assert t.terms["step latency"] == 0 and t.terms["operand reads (mma.sync)"] > t.terms["mma"]
    assert t.terms["compute"] == pytest.approx(sum(t.terms[k] for k in (
        "mma", "operand reads (mma.sync)", "exp exposed", "dS link (ALU)", "dS through SMEM")))
    slow = backward.attention_backward_time(4, 16, 16, 16384, 128, False, H100,
                                            kernel=dataclasses.replace(k128, clock_hz=1545e6))
    assert slow.time / t.time == pytest.approx(1920 / 1545, rel=0.05)
    gqa = backward.attention_backward_time(8, 32, 8, 4096, 128, True, H100, "flash")
    assert [k for k, _, _ in gqa.kernels][-2:] == ["dK group sum", "dV group sum"]
    # through SDPA, dO and O made contiguous in FA2's layout first: two copies the size of Q
    assert [k for k, _, _ in gqa.kernels][:2] == ["layout copy 1", "layout copy 2"]
    assert "dK group sum" not in [k for k, _, _ in backward.attention_backward_time(
        8, 32, 8, 4096, 128, True, H100, "cudnn").kernels]


def test_the_session28_clock_run_is_predicted_within_twelve_percent():
    """notes/napkin/runs/napkin_gpu_backward_clock_session28_h100.json (H100, its own ceilings): tilecore,
    cuDNN and FlashAttention-2, D128 N4096, causal and not. Only FA2's clock is taken from this run."""
    import json

    run = json.loads((validate.ROOT / "notes" / "napkin" / "runs" /
                      "napkin_gpu_backward_clock_session28_h100.json").read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"],
                          matmul_flops={"bf16": c["matmul_bf16_flops"], "fp16": c["matmul_bf16_flops"]})
    impls = {"tilecore": "tilecore", "cuDNN (SDPA)": "cudnn", "flash (SDPA)": "flash"}
    assert len(run["backward"]) == 6
    for r in run["backward"]:
        t = backward.attention_backward_time(r["B"], r["H"], r["H"], r["N"], r["d"], r["causal"], gpu, impls[r["impl"]]).time
        assert r["ms"] * 1e-3 / t == pytest.approx(1.0, abs=0.12), r["impl"]   # FA2 0.89: its main kernel


def test_each_kernel_of_the_run5_backwards():
    """notes/napkin/runs/napkin_gpu_backward_tiles_run5_session28_h100.json (H100, its own ceilings; not
    used for any constant): every backward kernel timed by the profiler, cuDNN, FA2 and tilecore at D64
    and D128, N 512 and 4096, causal and not, FA2 grouped 32 / 8. The passes as predicted; the main
    kernel within 17% but where named: causal N 512 on the warp-specialized kernels (cuDNN, tilecore)
    runs slower than the model (1.12-1.27), and FA2's main kernel is over-predicted (0.84-0.90: the
    serial sum of its MMAs, operand reads and softmax overlaps some in its 8 warps; its SDPA layout
    copies, 2x the model's copy time, make up the totals)."""
    import json

    run = json.loads((validate.ROOT / "notes" / "napkin" / "runs" /
                      "napkin_gpu_backward_tiles_run5_session28_h100.json").read_text())
    c = run["ceilings"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"],
                          matmul_flops={"bf16": c["matmul_bf16_flops"], "fp16": c["matmul_bf16_flops"]})
    impls = {"tilecore": "tilecore", "cuDNN (SDPA)": "cudnn", "flash (SDPA)": "flash"}
    assert len(run["cases"]) == 25
    within = 0
    for r in run["cases"]:
        t = backward.attention_backward_time(r["B"], r["H"], r["Hkv"], r["N"], r["d"], r["causal"], gpu, impls[r["impl"]])
        kernels = {name: s for name, s, _ in t.kernels}
        measured = {k["name"]: k["us"] * 1e-6 for k in r["kernels"]}
        pre = next(v for k, v in measured.items() if "dot_do_o" in k or "attn_bwd_delta" in k)
        assert pre / kernels["preprocess"] == pytest.approx(1.0, abs=0.1), r
        main = r["main_kernel_us"] * 1e-6 / kernels["main"]
        if r["impl"].startswith("flash"):
            assert 0.8 < main < 0.95, r
        elif not (r["causal"] and r["N"] == 512):
            assert main == pytest.approx(1.0, abs=0.12), r
        within += abs(r["ms"] * 1e-3 / t.time - 1) <= validate.TOLERANCE
    assert within >= 23   # the two misses: cuDNN D128 and tilecore D64, causal N 512


def test_softcap_keeps_the_order_and_pays_its_instructions():
    # session 38 (notes/attention, HD): the capped softmax under dP's wgmma measured 1.001x the order that waits
    # for S and dP together, so the cap is not charged for its order: the exponentials stay exposed at the
    # paper's share; what it costs is its tanh (one SFU instruction) and its instructions on the dS link
    # (backward.SOFTCAP_LINK_OPS, from the SASS counts that test_softcap_sass_counts_are_the_shipped_kernels' reads)
    assert backward.kernel_for("tilecore", 128, 4096, True, softcap=True) == backward.kernel_for("tilecore", 128, 4096, True)
    assert backward.SOFTCAP_LINK_OPS == pytest.approx(2 * (3320 - 3088 - (140 - 76)) / 64)
    gpu = validate.lab_gpu()
    plain = backward.attention_backward_time(8, 16, 16, 4096, 128, True, gpu, "tilecore")
    capped = backward.attention_backward_time(8, 16, 16, 4096, 128, True, gpu, "tilecore", softcap=True)
    assert capped.terms["exp exposed"] == pytest.approx(2 * plain.terms["exp exposed"])  # exp and tanh, same share
    assert capped.terms["dS link (ALU)"] == pytest.approx(plain.terms["dS link (ALU)"] * (4 + backward.SOFTCAP_LINK_OPS) / 4)
    # the shipped cap's measured cost (session 43, B16 H16 D128 N4096 causal, CUDA graphs, H200): 6.317 / 5.873 ms
    # (call 1) and 6.330 / 5.932 (call 2), 1.067-1.076x; predicted 1.117 (session 41's form, 9.0 ops: 1.143, measured
    # 1.108-1.122x; the float16-derivative form's 11.25 ops: 1.159)
    assert 1.10 < capped.time / plain.time < 1.16


_SOFTCAP_SASS = """
import collections, json, os, re, subprocess, tempfile
import triton
from tilecore.bench.reports import attention as report
from tilecore.ops.attention import configs, launch
cfg = dict(configs.GLUON_BACKWARD[128, True])
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
out = {}
for name, mode in (("plain", 0), ("capped", launch.gluon_backward_softcap(30.0, cfg))):
    compiled, _ = report.compile_gluon_backward(128, True, cfg=cfg, softcap=mode)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ops = [re.sub(r"^@!?U?P\\w+\\s+", "", m.group(1).strip()).split(None, 1)[0]
           for line in sass.splitlines() if (m := re.match(r"\\s+/\\*[0-9a-f]{4,}\\*/\\s+(.*?);", line))]
    out[name] = [len(ops), sum(op.startswith("MUFU") for op in ops)]
print(json.dumps(out))
"""


def test_softcap_sass_counts_are_the_shipped_kernels():
    """backward.SOFTCAP_SASS is what the shipped D128 causal fused backward compiles to for sm_90a, without and with
    the softcap mode its launcher picks (gluon_backward_softcap): a change of either kernel fails here until the
    counts, and so SOFTCAP_LINK_OPS, are read again (about 25 s: two compiles in a process of their own)."""

    counts = {k: tuple(v) for k, v in compiled_json(_SOFTCAP_SASS, timeout=600).items()}
    assert counts == backward.SOFTCAP_SASS
    assert backward.softcap_link_ops(counts) == backward.SOFTCAP_LINK_OPS

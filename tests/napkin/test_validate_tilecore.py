"""The validation reads every bench JSON's rows, tilecore's and the peers', with the run's own ceiling."""
import json

import pytest

from tilecore.napkin import validate


def _suite(tmp_path, name, rows, ceiling=None, timing="eager"):
    d = tmp_path / "x" / "h100"
    d.mkdir(parents=True, exist_ok=True)
    data = {"suite": name, "metric": "TFLOP/s" if name == "gemm" else "GB/s", "rows": rows,
            "meta": {"timing": timing}}
    if ceiling:
        data["ceiling"] = ceiling
    (d / f"{name}.json").write_text(json.dumps(data))


def test_tilecore_and_peer_rows_are_both_predicted(tmp_path):
    rows = [{"params": {"case": "bf16 M=N=K", "K": 8192}, "series": s, "ms": 1.55, "value": 709.0, "ratio": 1.0}
            for s in ("tilecore", "cuBLAS (torch.matmul)")]
    _suite(tmp_path, "gemm", rows, {"name": "torch.matmul bfloat16 8192^3 (cuBLAS)", "value": 729.0, "unit": "TFLOP/s"})
    preds = validate.predict_all(tmp_path)
    assert [p.series for p in preds] == ["tilecore", "cuBLAS (torch.matmul)"]
    for p in preds:
        assert p.op == "gemm" and p.ratio == pytest.approx(1.0, abs=0.15)
        assert p.predicted == pytest.approx(p.measured * p.measured_s / p.predicted_s)


def test_the_runs_ceiling_sets_the_tensor_rate(tmp_path):
    rows = [{"params": {"case": "bf16 M=N=K", "K": 8192}, "series": "cuBLAS (torch.matmul)", "ms": 1.55,
             "value": 709.0, "ratio": 1.0}]
    out = []
    for ceiling in (600.0, 750.0):
        _suite(tmp_path, "gemm", rows, {"name": "torch.matmul bfloat16 8192^3 (cuBLAS)", "value": ceiling,
                                         "unit": "TFLOP/s"})
        out.append(validate.predict_all(tmp_path)[0].predicted)
    assert out[1] / out[0] == pytest.approx(750 / 600, rel=0.02)


def test_graph_timing_drops_the_host_launch(tmp_path):
    rows = [{"params": {"B": 1, "Nk": 1024}, "series": "tilecore", "ms": 0.0074, "value": 566.0, "ratio": 0.19}]
    _suite(tmp_path, "attention-decode", rows, timing="graph")
    graph = validate.predict_all(tmp_path)[0].predicted_s
    _suite(tmp_path, "attention-decode", rows, timing="eager")
    eager = validate.predict_all(tmp_path)[0].predicted_s
    assert eager > graph


def test_hadamard_latency_by_gpu_time_is_never_named_host_time():
    # session 38's hadamard-latency suite replayed from CUDA graphs (the bench's JSON, as the bench writes it):
    # read as graph-timed (no host floor, the graph launch), every row predicted and every miss named, none of
    # them "host time" (the eager file's 12 tilecore misses were the host path of 2026-11-23); its GPU times
    # grow with the rows (the eager file's were bimodal: 8.4 / 51.3 / 9.2 / 31.5 us over 1 / 2 / 16 / 64 rows)
    from pathlib import Path
    path = (Path(__file__).resolve().parents[2] / "notes" / "napkin" / "runs"
            / "compile_s38a_run1_session38_h100_hadamard-latency.json")
    data = json.loads(path.read_text())
    preds = validate.predict_file(path, data, validate.lab_gpu(), validate.gemm_configs(), validate.host_times())
    assert len(preds) == 36 and all(p.graph and p.bound != "host" for p in preds)
    for p in preds:
        cause = validate.name_cause(p) if p.miss > validate.TOLERANCE else ""
        assert "host" not in cause and cause != "unexplained", (p.params, p.series, cause)
    for n in (4096, 16384):
        t = [p.measured_s for p in preds if p.series == "tilecore" and p.params["n"] == n]
        assert t == sorted(t) and len(t) == 9

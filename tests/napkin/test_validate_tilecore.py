"""tilecore's own benchmark results join the napkin's predicted-over-measured table."""
import json

from tilecore.napkin import validate


def test_tilecore_results_join_the_table(tmp_path):
    (tmp_path / "hadamard.json").write_text(json.dumps({"rows": [
        {"params": {"n": 4096, "dtype": "bf16"}, "series": "tilecore", "ratio": 0.93, "value": 2790},
        {"params": {"n": 4096, "dtype": "fp16"}, "series": "tilecore", "ratio": 0.5, "value": 1500},
        {"params": {"n": 64, "dtype": "bf16"}, "series": "tilecore", "ratio": 0.95, "value": 2850}]}))
    (tmp_path / "gemm.json").write_text(json.dumps({"rows": [
        {"params": {"case": "bf16 M=N=K", "K": 8192}, "series": "tilecore", "value": 700.0, "ratio": 1.0},
        {"params": {"case": "bf16 M=N=K", "K": 8192}, "series": "cuBLAS (torch.matmul)", "value": 690.0, "ratio": 1.0}]}))
    rows = {r[0]: r for r in validate.rows(results=tmp_path) if r[0].startswith("tilecore")}
    assert set(rows) == {"tilecore hadamard_transform bf16 n=4096 (2^28 elements)", "tilecore gemm 8192^3"}
    label, unit, measured, p_ds, p_cal, bound = rows["tilecore hadamard_transform bf16 n=4096 (2^28 elements)"]
    assert unit == "% of copy" and measured == 93.0 and 90 < p_cal <= 100.5 and bound == "HBM"
    assert rows["tilecore gemm 8192^3"][2] == 700.0


def test_missing_results_leave_only_the_anchor_rows(tmp_path):
    assert not [r for r in validate.rows(results=tmp_path) if r[0].startswith("tilecore")]

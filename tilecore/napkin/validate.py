"""Predictions against measurements: the H100 figures in shared/anchors.md, and tilecore's own
kernels as committed by `tilecore bench` (benchmarks/results/h100-80gb-hbm3/*.json), predicted by
the napkin.

`table()` builds the markdown table; `write_docs()` puts it between markers in docs/napkin.md.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from . import models
from .engine import plan
from .hardware import H100

SOURCE = ("shared/anchors.md: NVIDIA H100 80GB HBM3 (SXM, 132 SMs), torch 2.11 / triton 3.6 / CUDA 13.0, "
          "triton.testing.do_bench medians, 2026-11-22")

# Ceilings used to calibrate: copy bandwidth (bytes read + written per second), bf16 matmul at 8192^3
CALIBRATION = {"copy_bytes_per_s": 2997e9, "matmul_flops": {"bf16": 680e12}}

HADAMARD_ELEMENTS = 2 ** 28
# (n, HadaCore % of copy, Dao % of copy), midpoints of the ranges anchors.md gives
HADAMARD = [(128, 100, 29), (256, 100, 57), (512, 100, 100), (1024, 100, 72), (2048, 100, 78),
            (4096, 100, 79), (8192, 93, 78), (16384, 89, 72), (32768, 65, 44)]

# (label, model, sizes, dtype, measured value, unit): unit "GB/s" for copy, else TFLOP/s
MEASURED = [
    ("copy 1 GiB (read + write)", "copy", {"n": 2 ** 29}, "bf16", 2997, "GB/s"),
    ("cuBLAS bf16 GEMM 8192^3", "matmul", {"m": 8192, "n": 8192, "k": 8192}, "bf16", 680, "TFLOP/s"),
    ("cuBLAS bf16 GEMM 4096^3", "matmul", {"m": 4096, "n": 4096, "k": 4096}, "bf16", 713, "TFLOP/s"),
    ("cuBLAS fp8 GEMM 8192^3 (_scaled_mm)", "matmul", {"m": 8192, "n": 8192, "k": 8192}, "fp8", 1230, "TFLOP/s"),
] + [
    (f"cuDNN attention fwd d={d}{' causal' if c else ''} (B16 H16 N4096)", "attention",
     {"batch": 16, "heads": 16, "seq": 4096, "d": d, "causal": c}, "bf16", v, "TFLOP/s")
    for d, c, v in ((64, False, 452), (64, True, 424), (128, False, 596), (128, True, 544))
]


def _predict(model, sizes, dtype, gpu, unit):
    sched = plan(models.build(model, dtype=dtype, **sizes), gpu)
    if unit == "GB/s":
        d = sched.diagram
        moved = sum(d.nbytes(a) for a in d.inputs()) + sum(d.nbytes(o) for o in d.outputs)
        return moved / sched.time / 1e9, sched.bound
    return sched.tflops, sched.bound


# tilecore's committed H100 results, read when the repository's benchmark folder is at hand
RESULTS = Path("benchmarks/results/h100-80gb-hbm3")


def _tilecore_measured(results: Path) -> tuple[list, list]:
    """(Hadamard rows (n, % of copy), GEMM rows (label, model, sizes, dtype, TFLOP/s, unit))."""
    hadamard, gemm = [], []
    path = results / "hadamard.json"
    if path.exists():
        for r in json.loads(path.read_text())["rows"]:
            if r["series"] == "tilecore" and r["params"]["dtype"] == "bf16" and r["params"]["n"] >= 128:
                hadamard.append((r["params"]["n"], 100 * r["ratio"]))
    path = results / "gemm.json"
    if path.exists():
        for r in json.loads(path.read_text())["rows"]:
            case, k = r["params"]["case"], r["params"]["K"]
            if r["series"] == "tilecore" and case.endswith("M=N=K") and k >= 4096:
                dtype = "fp8" if case.startswith("fp8") else "bf16"
                gemm.append((f"tilecore gemm{'_fp8' if dtype == 'fp8' else ''} {k}^3", "matmul",
                             {"m": k, "n": k, "k": k}, dtype, r["value"], "TFLOP/s"))
    return hadamard, gemm


def rows(calibrated: bool = True, results: Path = RESULTS) -> list:
    gpus = {"datasheet": H100, "calibrated": H100.calibrated(**CALIBRATION)}
    out = []
    tilecore_hadamard, tilecore_gemm = _tilecore_measured(Path(results))
    for label, model, sizes, dtype, measured, unit in MEASURED + tilecore_gemm:
        p_ds, bound = _predict(model, sizes, dtype, gpus["datasheet"], unit)
        p_cal, bound_cal = _predict(model, sizes, dtype, gpus["calibrated"], unit)
        out.append((label, unit, measured, p_ds, p_cal, bound_cal))
    copy_ds = _predict("copy", {"n": HADAMARD_ELEMENTS}, "bf16", gpus["datasheet"], "GB/s")[0]
    copy_cal = _predict("copy", {"n": HADAMARD_ELEMENTS}, "bf16", gpus["calibrated"], "GB/s")[0]
    for n, hadacore, dao in HADAMARD:
        for peer, radix, measured in (("HadaCore", 16, hadacore), ("Dao", 2, dao)):
            sizes = {"rows": HADAMARD_ELEMENTS // n, "n": n, "radix": radix}
            p_ds, _ = _predict("hadamard", sizes, "bf16", gpus["datasheet"], "GB/s")
            p_cal, bound_cal = _predict("hadamard", sizes, "bf16", gpus["calibrated"], "GB/s")
            out.append((f"{peer} Hadamard n={n} (2^28 elements)", "% of copy", measured,
                        100 * p_ds / copy_ds, 100 * p_cal / copy_cal, bound_cal))
    for n, measured in tilecore_hadamard:  # tensor-core stages, as the radix-16 model
        sizes = {"rows": HADAMARD_ELEMENTS // n, "n": n, "radix": 16}
        p_ds, _ = _predict("hadamard", sizes, "bf16", gpus["datasheet"], "GB/s")
        p_cal, bound_cal = _predict("hadamard", sizes, "bf16", gpus["calibrated"], "GB/s")
        out.append((f"tilecore hadamard_transform bf16 n={n} (2^28 elements)", "% of copy", measured,
                    100 * p_ds / copy_ds, 100 * p_cal / copy_cal, bound_cal))
    return out


def table() -> str:
    lines = ["| figure | unit | measured | predicted (datasheet) | pred/meas | predicted (calibrated) "
             "| pred/meas | bound (calibrated) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, unit, measured, p_ds, p_cal, bound in rows():
        lines.append(f"| {label} | {unit} | {measured:,.0f} | {p_ds:,.0f} | {p_ds / measured:.2f} | "
                     f"{p_cal:,.0f} | {p_cal / measured:.2f} | {bound} |")
    lines.append("")
    lines.append(f"Measured: {SOURCE}; tilecore rows: `tilecore bench` results in {RESULTS} (same machine kind, "
                 "2026-11-22). Calibrated: H100 preset with HBM = the measured copy "
                 "(2,997 GB/s) and tensor cores scaled to the measured bf16 GEMM at 8192^3 (680 TFLOP/s); "
                 "so those two rows match by construction. Regenerate: `tilecore napkin --validate`.")
    return "\n".join(lines)


BEGIN, END = "<!-- napkin-validate:begin -->", "<!-- napkin-validate:end -->"


def write_docs(path, text: str) -> None:
    path = Path(path)
    doc = path.read_text() if path.exists() else f"# The napkin\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}\n{END}", doc, flags=re.S)
    path.write_text(doc)

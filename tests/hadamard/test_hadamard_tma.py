"""The Hadamard kernel's TMA path: Triton's interpreter runs descriptor loads and stores (zero-filled
and clipped past the last row, as the copy engine does), so every side-through-TMA mode is checked
here against float64; a compile for sm_90a (no GPU) checks that the PTX really uses the copy engine."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.hadamard import configs, hadamard_reference, hadamard_transform, launch, plan

TMA_N = [2**k for k in range(4, 16)]
ROOT = Path(__file__).resolve().parents[2]


def transform(x, tma, **tuning):
    out = torch.full_like(x, float("nan"))  # poisoned: an unwritten element shows as NaN
    launch.launch(plan.plan(x, out, tma=tma, **tuning), x, out, x.shape[1] ** -0.5)
    assert torch.isfinite(out).all(), "some outputs were never written"
    return out


@pytest.mark.parametrize("n", TMA_N)
@pytest.mark.parametrize("tma", ["both", "load", "store"])
def test_tma_paths_compute_the_transform(n, tma):
    x = torch.randn(max(2, 2**13 // n) + 1, n, dtype=torch.float16)  # + 1: rows past the end of a box
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(transform(x, tma), ref) <= 1.05


@pytest.mark.parametrize("n", [16, 512, 4096, 32768])
def test_tma_float32_within_1e6(n):
    x = torch.randn(5, n, dtype=torch.float32)
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.rel_rms(transform(x, "both"), ref) <= 1e-6


@pytest.mark.parametrize("n", sorted(configs.TMA_TUNING))
def test_default_dispatch_tuning_computes_the_transform(n):
    # the splits and tunings the GPU takes by default for 16-bit inputs (configs.TMA_TUNING)
    x = torch.randn(3, n, dtype=torch.float16)
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(transform(x, None), ref) <= 1.05


def test_tma_fits_only_16_byte_aligned_rows():
    base = torch.randn(8 * 1024 + 8, dtype=torch.float16)
    assert plan.tma_fits(base[: 8 * 1024].view(8, 1024))
    assert not plan.tma_fits(base[1 : 8 * 1024 + 1].view(8, 1024))  # data_ptr 2 bytes off
    assert not plan.tma_fits(torch.randn(8, 1028, dtype=torch.float16)[:, :1024])  # row stride 2056 bytes
    assert not plan.tma_fits(torch.randn(8, 8, dtype=torch.float16))  # n < 16: padded in registers


def test_tensors_tma_cannot_describe_take_the_pointer_path(monkeypatch):
    seen = []
    real = launch._descriptor
    monkeypatch.setattr(launch, "_descriptor", lambda t, cfg: seen.append(t) or real(t, cfg))
    monkeypatch.setattr(configs, "TMA_MIN_ELEMENTS", 0)  # as if these few rows were many
    n = 1024
    assert configs.TMA_TUNING[n][0] == "both"
    base = torch.randn(5 * n + 1, dtype=torch.float16)
    x = base[1:].view(5, n)  # misaligned by one element
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    assert accuracy.error_over_floor(hadamard_transform(x), ref) <= 1.05
    assert not seen
    hadamard_transform(base[: 5 * n].view(5, n))  # aligned: descriptors for input and output
    assert len(seen) == 2


def test_small_inputs_take_the_pointer_path(monkeypatch):
    # few rows are launch-bound: the pointer path's launch is the cheaper one (configs.TMA_MIN_ELEMENTS)
    seen = []
    real = launch._descriptor
    monkeypatch.setattr(launch, "_descriptor", lambda t, cfg: seen.append(t) or real(t, cfg))
    x = torch.randn(5, 1024, dtype=torch.float16)
    assert configs.TMA_TUNING[1024][0] == "both" and x.numel() < configs.TMA_MIN_ELEMENTS
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    assert accuracy.error_over_floor(hadamard_transform(x), ref) <= 1.05
    assert not seen
    assert plan.tma_sides(1024, False, None, {}, configs.TMA_MIN_ELEMENTS)[:2] == (True, True)


def test_inplace_through_tma():
    n = 2048
    x = torch.randn(9, n, dtype=torch.float16)
    expected = transform(x.clone(), "none")
    launch.launch(plan.plan(x, x, tma="both"), x, x, n**-0.5)
    assert torch.equal(x, expected)


@pytest.fixture(scope="module")
def sm90_report():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # every n the GPU sends through TMA by default, and one it does not; bf16 compiles as fp16 does
    ns = [str(n) for n in [128, *sorted(configs.TMA_TUNING)]]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "hadamard_resources.py"), "--json", "fp16", "fp32", *ns],
                       capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_tma_ptx_uses_the_copy_engine_for_sm90a(sm90_report):
    assert all("error" not in r for r in sm90_report), [r for r in sm90_report if "error" in r]
    for r in sm90_report:
        assert r["shared"] <= 227 * 1024, r
        assert r["mma"] == "wgmma" or r["dtype"] == "float32", r
        assert (r["bulk_copies"] > 0) == (r["path"] != "pointer"), r


def test_gluon_kernel_is_warp_specialized_wgmma_and_tma_without_spills(sm90_report):
    rows = [r for r in sm90_report if r["path"] == "gluon"]
    assert {r["n"] for r in rows} == set(configs.GLUON_SIZES), rows
    for r in rows:
        assert r["mma"] == "wgmma" and r["bulk_copies"] > 0 and r["warp_specialized"], r
        assert not r["wgmma_serialized"] and r["spill"] == 0 and r["shared"] <= 227 * 1024, r


def test_large_inputs_on_hopper_take_the_gluon_kernel(monkeypatch):
    """The plan only, with dispatch answering as an H100 with 2 SMs: Gluon cannot run here (its math
    is the tl kernel's split (S, 128, 64), which the interpreter checks above)."""
    monkeypatch.setattr(dispatch, "interpreted", lambda device: False)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 2)
    monkeypatch.setattr(configs, "TMA_MIN_ELEMENTS", 0)
    assert set(configs.GLUON_TUNING) <= set(configs.GLUON_SIZES)
    for n in configs.GLUON_TUNING:
        x = torch.randn(2, n, dtype=torch.float16)
        p = plan.plan(x, torch.empty_like(x))
        stages, lookahead = configs.GLUON_TUNING[n]  # the Gluon kernel takes GLUON_TUNING's ring
        assert p == plan.Plan("gluon", dict(stages=stages, lookahead=lookahead, dynamic=True), (2,))
        for kw in (dict(tma="both"), dict(gluon=False)):  # an explicit choice wins: the tl kernel runs
            assert plan.plan(x, torch.empty_like(x), **kw).path == "tl", kw
        assert plan.plan(x.float(), torch.empty_like(x.float())).path == "tl"  # float32: not Gluon's
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    x = torch.randn(2, 32768, dtype=torch.float16)
    assert plan.plan(x, torch.empty_like(x)).path == "tl"


def test_default_dispatch_does_not_spill(sm90_report):
    for r in sm90_report:
        if r["path"].startswith("default"):
            assert r["spill"] == 0 and r["registers"] <= 255, r


def test_gluon_grid_fills_the_last_round_of_rows():
    """One program per SM unless up to 4% fewer leave no near-empty last round of rows."""
    assert plan.gluon_programs(8192, 132) == 128  # 64 full rounds, not 62 and a round of 8 rows
    assert plan.gluon_programs(264, 132) == 132  # already full rounds
    assert plan.gluon_programs(100, 132) == 100  # one round, a program per row
    for rows in (133, 200, 8195, 10000, 16384):
        p = plan.gluon_programs(rows, 132)
        assert 127 <= p <= 132
        fill = lambda q: (rows % q or q) / q  # noqa: E731
        assert fill(p) >= max(fill(q) for q in range(127, 133)), rows

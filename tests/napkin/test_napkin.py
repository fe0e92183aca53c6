"""Diagrams, hardware, derivation on real GPUs, bad input, outputs and the command line."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tilecore.napkin import (A100, H100, CapacityError, Diagram, ShapeMismatchError, UnknownAxisError,
                             UnknownGPUError, UnknownModelError, UnsupportedDtypeError, abstract_level,
                             closed_forms as cf, compose, derive, get_gpu, group, models, relabel, stream)
from tilecore.napkin.cli import main as napkin_main
from tilecore.napkin.engine import plan
from tilecore.napkin import render

ROOT = Path(__file__).resolve().parents[2]


def test_napkin_modules_import_no_gpu_code():
    # load tilecore.napkin without running tilecore/__init__.py (which imports the torch ops)
    code = ("import sys, types; pkg = types.ModuleType('tilecore'); pkg.__path__ = [%r]; "
            "sys.modules['tilecore'] = pkg; import tilecore.napkin, tilecore.napkin.cli, "
            "tilecore.napkin.validate, tilecore.napkin.render; "
            "bad = [m for m in ('torch', 'triton', 'matplotlib') if m in sys.modules]; assert not bad, bad"
            % str(ROOT / "tilecore"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_user_writes_a_new_model_in_a_few_lines():
    # a gated linear unit: two contractions, an elementwise map; the fused kernel reads X once
    d = Diagram("glu", t=4096, m=1024, f=1024)
    X, W, V = d.input("X", "t m"), d.input("W", "m f"), d.input("V", "m f")
    d.output(d.map("a*sigmoid(b)", d.contract(X, W, out="t f", name="A"),
                   d.contract(X, V, out="t f", name="B"), name="Y", unit="sfu"))
    r = derive(d, "h100")
    assert r.flops == 2 * 2 * 4096 * 1024 * 1024
    assert r.H["HBM"] >= r.compulsory_bytes and r.time > 0


def test_weave_broadcasts_inputs_without_the_axis():
    g = models.attention(batch=2, heads=8, kv_heads=2, seq=256, d=64)
    assert g.arrays["Q"].axes == ("b", "h", "r", "q", "d")
    assert g.arrays["K"].axes == ("b", "h", "x", "d")        # shared by the r query heads
    assert g.arrays["O"].axes == ("b", "h", "r", "q", "e")
    assert g.flops() == 4 * 2 * 8 * 256 * 256 * 64


def test_compose_feeds_outputs_to_inputs_and_checks_sizes():
    norm = models.rmsnorm(rows=1024, n=512)
    mm = Diagram("proj", t=1024, n=512, o=256)
    mm.output(mm.contract(mm.input("Xn", "t n"), mm.input("P", "n o"), out="t o", name="Z"))
    both = compose(norm, mm, {"Xn": "Y"})
    assert [op.name for op in both.ops][-1] == "Z" and both.outputs == ["Z"]
    bad = Diagram("proj", t=1024, n=256, o=256)
    bad.output(bad.contract(bad.input("Xn", "t n"), bad.input("P", "n o"), out="t o", name="Z"))
    with pytest.raises(ShapeMismatchError, match="axis 'n'"):
        compose(norm, bad, {"Xn": "Y"})


def test_streamability_follows_the_accumulators():
    att = models.attention(batch=1, heads=1, seq=512, d=64)
    assert att.splittable("x")                       # softmax-then-contract accumulator
    ln = models.layernorm(rows=64, n=1024)
    assert not ln.splittable("n")                    # normalize uses the row after its statistics
    assert models.matmul(64, 64, 64).splittable("k")


def test_hardware_presets_cite_sources_and_calibrate():
    for g in (A100, H100, get_gpu("h200")):
        assert all(lv.source for lv in g.levels) and all(u.source for u in g.units.values())
    assert H100.per_sm_per_clock(H100.rate("tensor", "fp16")) == pytest.approx(4096, rel=1e-3)
    assert H100.per_sm_per_clock(H100.rate("tensor", "fp8")) == pytest.approx(8192, rel=1e-3)
    assert H100.per_sm_per_clock(H100.rate("sfu", "fp32")) == 16
    assert get_gpu("h200").levels[0].bandwidth == 4.8e12
    cal = H100.calibrated(copy_bytes_per_s=2997e9, matmul_flops={"bf16": 680e12})
    assert cal.levels[0].bandwidth == 2997e9
    assert cal.rate("tensor", "fp8") == pytest.approx(H100.rate("tensor", "fp8") * 680 / 989.4, rel=1e-3)


def test_matmul_on_h100_is_compute_bound_with_l2_supertile():
    r = derive(models.matmul(8192, 8192, 8192), "h100")
    assert r.bound.startswith(("tensor", "L2"))
    assert r.supertile and r.H["HBM"] < r.H["L2"] / 5        # L2 catches most re-sends
    assert r.M["SMEM"] <= 227 * 1024 and r.tflops <= 989.4


def test_attention_on_h100_streams_keys_and_groups_queries():
    r = derive(models.attention(batch=4, heads=8, seq=2048, d=128), "h100")
    assert r.parts["x"].kind == "stream" and r.parts["q"].kind == "group"
    assert r.parts["d"].kind == "none"
    causal = derive(models.attention(batch=4, heads=8, seq=2048, d=128, causal=True), "h100")
    assert 0.5 < causal.causal_density < 0.6
    assert causal.time < 0.65 * r.time


def test_memory_bound_ops_move_only_compulsory_bytes():
    for diag in (models.layernorm(rows=8192, n=4096), models.hadamard(rows=2 ** 14, n=1024),
                 models.copy(2 ** 24)):
        r = derive(diag, "h100")
        assert r.bound == "HBM" and r.H["HBM"] == pytest.approx(r.compulsory_bytes, rel=0.01)


def test_linear_attention_is_split_into_two_kernels():
    s = plan(models.linear_attention(batch=4, heads=8, seq=4096, d=128), "h100")
    assert len(s.kernels) == 2                          # state K^T V first, then Q (K^T V)


@settings(max_examples=25, deadline=None)
@given(a=st.integers(64, 4096), b=st.integers(64, 4096), c=st.integers(64, 4096),
       ga=st.integers(1, 256), gc=st.integers(1, 256), sb=st.integers(1, 64))
def test_matmul_never_beats_the_lower_bound(a, b, c, ga, gc, sb):
    r = relabel(models.matmul(a, c, b, dtype="fp16"), abstract_level(1e12),
                {"m": group(ga), "n": group(gc), "k": stream(sb)})
    used = r.M["SMEM"] / 2
    assert r.H["HBM"] / 2 >= cf.matmul_lower_bound(a, c, b, used) * (1 - 1e-9)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(128, 8192), d=st.sampled_from([16, 32, 64, 128]), gq=st.integers(1, 512),
       sx=st.integers(1, 128))
def test_attention_never_beats_the_lower_bound(n, d, gq, sx):
    r = relabel(models.attention(batch=1, heads=1, seq=n, d=d, dtype="fp16"), abstract_level(1e12),
                {"q": group(gq), "x": stream(sx)})
    used = r.M["SMEM"] / 2
    assert r.H["HBM"] / 2 >= cf.attention_lower_bound(n, d, used)


@settings(max_examples=5, deadline=None)
@given(m=st.sampled_from([512, 1024, 3072]), n=st.sampled_from([512, 2048]), k=st.sampled_from([256, 4096]))
def test_derived_gpu_plans_respect_capacity_and_bounds(m, n, k):
    r = derive(models.matmul(m, n, k), "h100")
    smem_values = r.M["SMEM"] / 2
    assert r.M["SMEM"] <= r.capacity["SMEM"] and r.M["RF"] <= r.capacity["RF"]
    assert r.H["L2"] / 2 >= cf.matmul_lower_bound(m, n, k, smem_values) * 0.999
    assert r.H["HBM"] / 2 >= cf.matmul_lower_bound(m, n, k, 50 * 2 ** 20 / 2) * 0.999


def test_bad_input_names_the_problem():
    with pytest.raises(UnknownAxisError, match="unknown axis 'z'.*axes are"):
        Diagram("x", a=4).input("A", "a z")
    with pytest.raises(KeyError):
        Diagram("x", a=4).input("A", "a z")
    with pytest.raises(ShapeMismatchError, match="already has size 4"):
        Diagram("x", a=4).axis("a", 8)
    with pytest.raises(UnsupportedDtypeError, match="accepted: fp32, tf32, bf16, fp16, fp8"):
        models.matmul(dtype="int3")
    with pytest.raises(UnsupportedDtypeError, match="no fp8 tensor cores"):
        derive(models.matmul(512, 512, 512, dtype="fp8"), "a100")
    with pytest.raises(UnknownGPUError, match="accepted: a100, h100, h200"):
        get_gpu("v100")
    with pytest.raises(UnknownModelError, match="accepted: matmul"):
        models.build("resnet")
    with pytest.raises(UnknownModelError, match="no size 'seq'"):
        models.build("matmul", seq=4)
    with pytest.raises(CapacityError, match="shared memory"):
        derive(models.layernorm(rows=64, n=2 ** 20), "h100")   # a row cannot be split or held
    with pytest.raises(ShapeMismatchError):
        models.attention(heads=6, kv_heads=4)


def test_pseudocode_table_and_picture(tmp_path):
    r = derive(models.attention(batch=2, heads=4, seq=1024, d=64), "h100")
    code = render.pseudocode(r)
    assert "for x0 in range(0, 1024," in code and "<- HBM" in code and "exp(" in code
    assert "divisibility" in code
    table = render.cost_table(r)
    assert "HBM -> L2" in table and "tensor cores bf16" in table and "bound by" in table
    files = render.draw(r, tmp_path / "att")
    assert {f.suffix for f in files} == {".svg", ".png"}
    assert files[1].read_bytes()[:4] == b"\x89PNG" and b"<svg" in files[0].read_bytes()[:400]


def test_cli_side_by_side_and_usage(tmp_path, capsys):
    rc = napkin_main(["matmul", "--gpu", "a100,h100,h200", "--dtype", "bf16,fp8", "m=1024", "n=1024",
                      "k=1024", "--quiet", "--no-picture"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("matmul") == 0 or True
    lines = [ln for ln in out.splitlines() if ln.split()[:1] in (["a100"], ["h100"], ["h200"])]
    assert len(lines) == 6 and "fp8 tensor cores" in [ln for ln in lines if ln.startswith("a100") and "fp8" in ln][0]
    rc = napkin_main(["attention", "seq=512", "d=64", "--picture", str(tmp_path / "a")])
    out = capsys.readouterr().out
    assert rc == 0 and "parallel for each thread block" in out and (tmp_path / "a.png").exists()
    for bad in (["resnet"], ["matmul", "--bogus"], ["matmul", "--gpu", "v100"], ["matmul", "seq=4"],
                ["matmul", "--dtype", "int3"]):
        with pytest.raises(SystemExit) as e:
            napkin_main(bad)
        assert e.value.code == 2
        assert "usage:" in capsys.readouterr().err


def test_validate_writes_the_table(tmp_path, capsys):
    from tilecore.napkin import validate

    doc = tmp_path / "napkin.md"
    doc.write_text("# x\n\n" + validate.BEGIN + "\nold\n" + validate.END + "\ntail\n")
    assert napkin_main(["--validate", "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and "tail" in text
    assert "### Distribution of |predicted / measured - 1|, by op" in text and "| all | " in text
    assert validate.docs_section(doc) == validate.table()

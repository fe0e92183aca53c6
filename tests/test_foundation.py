"""The package's plumbing: command line, dispatch, accuracy measures, benchmark output."""
import json
import subprocess
import sys

import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.bench import harness
from tilecore.bench.suites import SUITES


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tilecore", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [["bogus"], ["bench", "nosuch-op"], ["bench", "copy", "--bogus-flag"], []])
def test_bad_usage_exits_2_with_usage(args):
    r = run_cli(*args)
    assert r.returncode == 2
    assert "usage:" in r.stderr


def test_bench_without_gpu_is_one_sentence_not_a_traceback():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_cli("bench", "copy")
    assert r.returncode == 1
    assert "needs a CUDA GPU" in r.stderr
    assert "Traceback" not in r.stderr


def test_env_reports_versions_and_paths():
    r = run_cli("env")
    assert r.returncode == 0
    import triton

    # the installed triton (any release: the suite runs under the compat matrix's too), named against the tested ones
    assert f"triton {triton.__version__}" in r.stdout and "torch" in r.stdout
    assert "Gluon" in r.stdout and "compile-checked" in r.stdout


def test_results_name_the_source_that_ran(tmp_path):
    from tilecore import env

    (tmp_path / "ops").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "ops" / "b.py").write_text("y = 2\n")
    first = env.source_digest(tmp_path)
    assert len(first) == 12 and first == env.source_digest(tmp_path)
    (tmp_path / "ops" / "b.py").write_text("y = 3\n")  # any edit changes it
    assert env.source_digest(tmp_path) != first
    assert env.metadata()["source"] == env.source_digest()


def test_dispatch_picks_by_device(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.backend_for(cpu) == "kernel"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert dispatch.backend_for(cpu) == "reference"
    assert dispatch.select(cpu, kernel=1, reference=2) == 2
    assert dispatch.backend_for(torch.device("cuda")) == "kernel"
    with pytest.raises(TypeError, match="CUDA and CPU"):
        dispatch.backend_for(torch.device("meta"))


def test_rounding_floor_is_the_error_of_rounding():
    ref = torch.randn(10000, dtype=torch.float64)
    assert accuracy.error_over_floor(ref.to(torch.bfloat16), ref) == pytest.approx(1.0)
    floor = accuracy.rounding_floor(ref, torch.float16)
    assert 1e-4 < floor < 4e-4  # fp16 has 11 significant bits
    noisy = (ref * (1 + 3 * floor * torch.randn_like(ref))).to(torch.float16)
    assert accuracy.error_over_floor(noisy, ref) > 2


def test_results_json_and_png(tmp_path):
    meta = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "versions": {"torch": "t", "triton": "3.6.0"}, "date": "2026-11-22T00:00:00"}
    result = harness.Result("copy", "GB/s", "bytes", harness.Ceiling("copy", 3000.0, "GB/s"), meta)
    for b in (2**20, 2**21):
        result.rows.append(harness.Row({"bytes": b}, "torch copy_", 0.01, 2500.0, 2500 / 3000))
    json_path, png_path = harness.save(result, tmp_path)
    assert json_path.parent.name == "h100-80gb-hbm3"
    data = json.loads(json_path.read_text())
    assert data["ceiling"]["value"] == 3000.0 and len(data["rows"]) == 2
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "83.3" in harness.table(result)


def test_suite_series_are_timed_in_turn_and_each_figure_is_a_median(monkeypatch):
    """A case's series alternate (a drifting clock moves them alike); each row is the median of
    its REPEATS timings; a peer that is not installed (ImportError) is skipped."""
    calls = []
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0])}

    def fake_median_ms(fn, **_):
        calls.append(fn())
        return next(times[calls[-1]])

    def missing():
        raise ImportError("peer")

    monkeypatch.setattr(harness, "median_ms", fake_median_ms)
    monkeypatch.setitem(harness.CEILINGS, "copy", lambda: harness.Ceiling("copy", 10.0, "GB/s"))
    monkeypatch.setattr(harness.env, "metadata", lambda: {})
    monkeypatch.setattr(harness.torch.cuda, "empty_cache", lambda: None)
    case = harness.Case({"bytes": 1}, {"a": lambda: lambda: "a", "peer": missing, "b": lambda: lambda: "b"}, bytes=10**6)
    suite = harness.Suite("t", "copy", "GB/s", "bytes", lambda quick: [case])
    result = harness.run_suite(suite)
    assert calls == ["a", "b"] * harness.REPEATS
    assert {r.series: r.ms for r in result.rows} == {"a": 2.0, "b": 5.0}
    assert [r.ratio for r in result.rows] == [1e6 / 2.0 / 1e6 / 10.0, 1e6 / 5.0 / 1e6 / 10.0]


def test_graph_timed_suites_divide_a_replay_by_its_calls(monkeypatch):
    """Suite(timing="graph"): each series is timed as a CUDA graph replay of several calls
    (graph_replay), and a figure is the replay's time over its number of calls."""
    replays = {}

    def fake_graph_replay(fn):
        replays[fn()] = fn
        return (lambda: fn() + " replay"), 4

    monkeypatch.setattr(harness, "graph_replay", fake_graph_replay)
    monkeypatch.setattr(harness, "median_ms", lambda fn, **_: {"a replay": 8.0, "b replay": 2.0}[fn()])
    monkeypatch.setitem(harness.CEILINGS, "copy", lambda: harness.Ceiling("copy", 10.0, "GB/s"))
    monkeypatch.setattr(harness.env, "metadata", lambda: {})
    monkeypatch.setattr(harness.torch.cuda, "empty_cache", lambda: None)
    case = harness.Case({"bytes": 1}, {"a": lambda: lambda: "a", "b": lambda: lambda: "b"}, bytes=10**6)
    result = harness.run_suite(harness.Suite("t", "copy", "GB/s", "bytes", lambda quick: [case], timing="graph"))
    assert set(replays) == {"a", "b"}
    assert {r.series: r.ms for r in result.rows} == {"a": 2.0, "b": 0.5}
    assert result.meta["timing"] == "graph"


def test_plain_eager_only_for_plain_tensors_without_grad():
    x = torch.randn(2, 2)
    assert dispatch.plain_eager(x, None)
    assert not dispatch.plain_eager(torch.randn(2, 2, requires_grad=True))
    with torch.no_grad():
        assert dispatch.plain_eager(torch.randn(2, 2, requires_grad=True))
    assert not dispatch.plain_eager(torch.empty(2, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not dispatch.plain_eager(torch.empty(2))


def test_ratios_are_taken_within_each_round(monkeypatch):
    """ratios_to: a variant's ratio to the reference is the median of per-round ratios (both timed
    in the same round), with their min and max; TFLOP/s from the flops and each round's time."""
    times = {"ref": iter([1.0, 2.0, 1.0]), "x": iter([0.5, 2.0, 1.25])}
    monkeypatch.setattr(harness, "median_ms", lambda fn, **_: next(times[fn()]))
    out = harness.ratios_to("ref", {"ref": lambda: "ref", "x": lambda: "x"}, 1e9, 3)
    assert out["x"]["ratio"] == 1.0 and out["x"]["lo"] == 0.8 and out["x"]["hi"] == 2.0
    assert out["x"]["all"] == [2.0, 0.5, 0.8] and out["x"]["tflops"] == 0.8
    assert out["ref"]["ratio"] == out["ref"]["lo"] == out["ref"]["hi"] == 1.0


def test_every_suite_lists_cases_with_its_x_and_their_work():
    """Listing a suite's cases builds nothing (no GPU): each names the suite's x parameter and the
    bytes or FLOPs its metric divides by."""
    for name, suite in SUITES.items():
        cases = suite.cases(True)
        assert cases, name
        for case in cases:
            assert suite.x in case.params and case.series, (name, case.params)
            assert (case.bytes if suite.metric == "GB/s" else case.flops) > 0, (name, case.params)


def test_gqa_suite_does_the_attention_suites_work_per_q_head():
    """B * Hq * N is the attention suite's B16 H16 N4096, so its causal figures compare with it."""
    suites = SUITES
    mha = {(c.params["pass"], c.params["D"], c.params["causal"]): c.flops for c in suites["attention"].cases(True)}
    for case in suites["attention-gqa"].cases(True):
        d = int(case.params["model"].rsplit("D", 1)[1])
        assert case.flops == mha[case.params["pass"], d, True], case.params


def test_attention_suites_time_a_forward_or_one_forwards_backward_and_skip_refusing_backends():
    import torch.nn.functional as F

    from tilecore.bench.suites.attention import timed_pass

    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
    forward = timed_pass("math", F.scaled_dot_product_attention, q, k, v, backward=False)
    assert forward().shape == q.shape
    backward = timed_pass("math", F.scaled_dot_product_attention, q, k, v, backward=True)
    assert [g.shape for g in backward()] == [q.shape, k.shape, v.shape]

    def refuses(q, k, v):
        raise RuntimeError("No available kernel")

    with pytest.raises(ImportError, match="peer: No available kernel"):
        timed_pass("peer", refuses, q, k, v, backward=False)


# ---- package plumbing: version, license, op registration, TRITON_INTERPRET (issue 31)

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _declared_ops() -> dict[str, str]:
    """torch.ops.tilecore op name -> the module that declares it, from the source."""
    import re

    out = {}
    for path in sorted((ROOT / "tilecore").rglob("*.py")):
        for name in re.findall(r"""custom_op\(\s*["']tilecore::(\w+)["']""", path.read_text()):
            out[name] = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return out


def test_version_on_the_command_line():
    import tilecore

    for args in (["--version"], ["--help"]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert (f"tilecore {tilecore.__version__}" in r.stdout) == (args == ["--version"])
        assert "--version" in r.stdout or args == ["--version"]
    r = subprocess.run([sys.executable, "-m", "tilecore.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == f"tilecore {tilecore.__version__}"


def test_license_is_mit_and_pyproject_says_so():
    import tilecore

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) the tilecore authors\n")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "version" in project["dynamic"] and tilecore.__version__


@pytest.mark.parametrize("order", ["tilecore first", "torch first"])
def test_import_registers_every_op(order):
    """A bare ``import tilecore`` in a fresh process registers every torch.ops.tilecore op declared in
    the source (at once if torch is loaded, else when it is), and loads no torch by itself."""
    import tilecore

    ops = _declared_ops()
    assert {"gemm", "gemm_fp8", "hadamard_transform", "attention_forward"} <= set(ops)
    assert set(ops.values()) <= set(tilecore.OP_MODULES), "a module declaring ops is missing from OP_MODULES"
    imports = "import tilecore\nassert 'torch' not in sys.modules\nimport torch\n" if order == "tilecore first" \
        else "import torch\nimport tilecore\n"
    code = ("import sys\n" + imports + "print(sorted(n for n in %r if not hasattr(torch.ops.tilecore, n)))\n"
            "print(sorted(m for m in sys.modules if m.startswith('tilecore.')))" % sorted(ops))
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    missing, loaded = r.stdout.strip().splitlines()
    assert missing == "[]", f"not registered after import: {missing}"
    assert all(m in loaded for m in tilecore.OP_MODULES)


INTERPRET_CALLS = """
import os, sys, torch, tilecore
a = torch.randn(8, 8, dtype=torch.bfloat16)
x = torch.randn(4, 64)
ok = (tilecore.gemm(a, a).float() - a.double() @ a.double()).abs().max() < 0.1
ok &= torch.allclose(tilecore.hadamard_transform(x, 0.125), tilecore.nn.HadamardRotation(64)(x))
print("first", bool(ok), flush=True)
if len(sys.argv) > 1:
    os.environ["TRITON_INTERPRET"] = sys.argv[1]
    try:
        tilecore.hadamard_transform(x)
        print("second ok")
    except RuntimeError as err:
        print("refused:", err)
"""


@pytest.mark.parametrize("value", ["2", "abc", "0", ""])
def test_triton_interpret_values_triton_reads_as_off(value):
    """Triton reads only 1/true/on/yes/y as on: any other value leaves its kernels compiled, so CPU
    tensors take the PyTorch path (once: 'TRITON_INTERPRET=2' crashed with '0 active drivers')."""
    env = dict(__import__("os").environ, TRITON_INTERPRET=value)
    r = subprocess.run([sys.executable, "-c", INTERPRET_CALLS], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=env)
    assert r.returncode == 0 and r.stdout.startswith("first True"), r.stderr[-3000:]
    assert ("not a value Triton reads as on" in r.stderr) == (value in ("2", "abc")), r.stderr


def test_triton_interpret_set_after_import_is_refused_clearly():
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", INTERPRET_CALLS, "1"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == "first True"
    assert r.stdout.splitlines()[1].startswith("refused: TRITON_INTERPRET=1 was set after tilecore was imported")
    assert "active drivers" not in r.stdout + r.stderr
    # the other way (interpreted at import, turned off later) is honoured: CPU tensors take the PyTorch path
    r = subprocess.run([sys.executable, "-c", INTERPRET_CALLS, "0"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=dict(env, TRITON_INTERPRET="1"))
    assert r.returncode == 0 and r.stdout.splitlines() == ["first True", "second ok"], r.stderr[-3000:]

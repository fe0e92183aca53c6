"""experiments/common/gpu_script.py, the scaffold of the experiments' GPU scripts, on the CPU: the float64 check
finds an unwritten (poisoned) element, a wrong NaN or inf and an error over the tolerance; the Run's JSON holds meta
and rows; timing gives medians of interleaved rounds."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common import gpu_script as gs  # noqa: E402


def test_check_passes_a_rounded_answer_and_finds_what_is_wrong():
    torch.manual_seed(0)
    ref = torch.randn(64, 32, dtype=torch.float64)
    good = ref.to(torch.bfloat16)
    r = gs.check(good, ref)
    assert r["pass"] and r["written"] and r["nonfinite_ok"] and abs(r["err_over_floor"] - 1.0) < 1e-6
    out = gs.poisoned(good)
    assert torch.isnan(out).all() and out.dtype == torch.bfloat16
    out[:, :31] = good[:, :31]  # one column never written
    assert not gs.check(out, ref)["written"] and not gs.check(out, ref)["pass"]
    noisy = (ref + 0.05 * torch.randn_like(ref)).to(torch.bfloat16)
    r = gs.check(noisy, ref)
    assert r["written"] and r["err_over_floor"] > 2.5 and not r["pass"]
    assert gs.check(noisy, ref, tol=1e9)["pass"]
    assert not gs.check(good[:, :16], ref)["pass"]  # a shape mismatch


def test_check_wants_nan_and_inf_where_the_reference_has_them():
    ref = torch.tensor([[1.0, float("nan"), float("inf")], [2.0, 3.0, -float("inf")]], dtype=torch.float64)
    out = ref.to(torch.float16)
    assert gs.check(out, ref)["pass"]
    wrong = out.clone()
    wrong[0, 1] = 0.0  # a NaN row lost (issue 31's silent NaN loss)
    assert not gs.check(wrong, ref)["nonfinite_ok"] and not gs.check(wrong, ref)["pass"]
    wrong = out.clone()
    wrong[1, 2] = float("inf")  # the wrong sign of inf
    assert not gs.check(wrong, ref)["pass"]
    assert gs.poisoned(torch.zeros(3, dtype=torch.int32)).eq(-1).all()


def test_run_writes_meta_rows_and_errors_and_a_short_table(tmp_path, capsys):
    run = gs.Run("probe", deadline=30, out=tmp_path)
    run.extra["shape"] = [2, 3]
    run.row("a", ours_ms=0.5, ok=True)
    assert run.attempt("boom", lambda: 1 / 0) is None
    assert run.attempt("fine", lambda x: x + 1, 1) == 2
    run.row("b", ours_ms=0.25)
    path = run.finish(["name", "ours_ms", "ok"])
    data = json.loads(Path(path).read_text())
    assert data["name"] == "probe" and data["shape"] == [2, 3] and data["meta"]["gpu"] == "cpu"
    assert {"torch", "triton", "date", "source"} <= set(data["meta"])
    assert [r["name"] for r in data["rows"]] == ["a", "b"] and "ZeroDivisionError" in data["errors"][0]
    printed = capsys.readouterr().out.splitlines()
    assert printed[-4].split() == ["name", "ours_ms", "ok"] and printed[-2].split() == ["b", "0.25", "-"]
    assert 0 < run.left() <= 30


def test_interleaved_rounds_give_medians_on_the_host_clock():
    calls = []
    res = gs.time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, graph=True,
                         warmup=1, rep=1)
    assert set(res) == {"a_ms", "b_ms", "a_rounds", "b_rounds"}  # (no CUDA: no graph times)
    assert len(res["a_rounds"]["eager"]) == 3 and res["a_ms"] >= 0
    # every round both, the order reversed every other round (4 calls a figure: the host clock's warm-up and 3)
    assert "".join(calls[::4]) == "abbaab"
    host = gs.host_rounds({"x": lambda: None}, rounds=2, calls=5)
    assert len(host["x_us_rounds"]) == 2 and host["x_us"] >= 0


def test_same_bits():
    x = torch.tensor([0.0, 1.5, float("nan")])
    assert gs.same_bits(x, x.clone()) and gs.same_bits([x, None], [x.clone(), None])
    assert not gs.same_bits(x, torch.tensor([-0.0, 1.5, float("nan")]))
    assert not gs.same_bits(x, x.half()) and not gs.same_bits([x], [x, x])
    assert gs.same_bits(torch.arange(3), torch.arange(3))


def test_sync_and_allocator_probes_answer_empty_without_cuda():
    if torch.cuda.is_available():  # (the GPU machine: a plain add neither syncs nor, after warm-up, allocates anew)
        x = torch.ones(4, device="cuda")
        assert gs.sync_warnings(lambda: x + 1) == {}
        return
    assert gs.sync_warnings(lambda: None) == {} and gs.allocator_counts(lambda: None) == {}

"""examples/fp8_attention_accuracy: the corpus split and loaders, the model's training step on the CPU,
the evaluation (three finite numbers, paired statistics), the outlier injection, and the command's
CPU smoke run.

The FP8 attentions in the in-process tests are this file's stand-ins (``fp8_stand_in``: quantize to
e4m3 per (batch, head) with torch, dequantize, attend), so that the tests do not wait for (or run
in Triton's interpreter) tilecore's FP8 kernel; the shipped example calls tilecore's.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fp8_attention_accuracy"
sys.path.insert(0, str(EXAMPLE))

import data  # noqa: E402
import evaluate  # noqa: E402
from model import GPT, GPTConfig, attention_function  # noqa: E402

assert Path(data.__file__).parent == Path(evaluate.__file__).parent == EXAMPLE  # not another 'data' module

E4M3_MAX = 448.0


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny shapes on one thread: on a busy 2-core machine two OpenMP threads made a step 40x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fp8_stand_in(rotate: bool):
    """A CPU stand-in for tilecore's FP8 attention (tests only): optionally rotate Q and K by one
    random-sign Hadamard matrix (the same for both, so Q K^T is unchanged), quantize Q, K, V to e4m3
    with one scale per (batch, head), dequantize, attend with SDPA."""
    def quantized(x):  # (batch, heads, tokens, head_dim)
        scale = x.abs().amax(dim=(2, 3), keepdim=True).clamp_min(1e-12) / E4M3_MAX
        return (x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale

    def attend(q, k, v):
        if rotate:
            d = q.shape[-1]
            hadamard = torch.ones(1, 1)
            while hadamard.shape[0] < d:
                hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
            signs = torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(0)) * 2 - 1
            rotation = (signs[:, None] * hadamard / math.sqrt(d)).to(q.dtype)
            q, k = q @ rotation, k @ rotation
        return F.scaled_dot_product_attention(quantized(q), quantized(k), quantized(v), is_causal=True)
    return attend


TINY = GPTConfig(layers=2, width=32, heads=2, context=32)


def _write_tree(root: Path, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"# {name}\nx = {len(name)}\n".encode() + bytes(range(200, 256)))


# -- data ----------------------------------------------------------------------------------------------

def test_split_of_the_stdlib_is_disjoint_deterministic_and_about_5_percent():
    files = data.source_files(data.stdlib_root())
    assert len(files) > 100 and files == sorted(files)
    assert not any("site-packages" in f or "dist-packages" in f for f in files)
    held = {f for f in files if data.is_held_out(f)}
    train = {f for f in files if not data.is_held_out(f)}
    assert held and train and not held & train and held | train == set(files)
    assert 0.02 < len(held) / len(files) < 0.09, len(held) / len(files)
    assert held == {f for f in sorted(files, reverse=True) if data.is_held_out(f)}  # the order does not matter


def test_the_split_depends_on_the_path_alone(tmp_path):
    names = [f"pkg{i % 7}/mod{i}.py" for i in range(300)] + ["site-packages/third_party.py"]
    _write_tree(tmp_path / "a", names)
    _write_tree(tmp_path / "b", list(reversed(names)))
    a, b = data.load_corpus(tmp_path / "a"), data.load_corpus(tmp_path / "b")
    assert a.held_out_files == b.held_out_files and a.train_files == b.train_files and a.digest == b.digest
    assert "site-packages/third_party.py" not in a.train_files + a.held_out_files
    assert all(data.is_held_out(f) for f in a.held_out_files) and not any(data.is_held_out(f) for f in a.train_files)
    # the streams are the files in sorted order, each followed by one NUL
    expected = b"".join((tmp_path / "a" / f).read_bytes() + b"\0" for f in a.held_out_files)
    assert a.held_out.dtype == torch.uint8 and a.held_out.numpy().tobytes() == expected
    assert a.describe()["held_out_files"] == len(a.held_out_files)


def test_load_corpus_refuses_a_folder_without_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.py files"):
        data.load_corpus(tmp_path)


def test_train_batches_are_deterministic_shifted_and_in_range():
    tokens = torch.randint(0, 256, (5000,), dtype=torch.uint8)
    first, again = data.train_batches(tokens, 4, 64, seed=3), data.train_batches(tokens, 4, 64, seed=3)
    other = data.train_batches(tokens, 4, 64, seed=4)
    for _ in range(3):
        (x, y), (x2, y2), (x3, _) = next(first), next(again), next(other)
        assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x, x2) and torch.equal(y, y2) and not torch.equal(x, x3)
        assert torch.equal(x[:, 1:], y[:, :-1]) and 0 <= int(x.min()) and int(x.max()) < data.VOCAB
    with pytest.raises(ValueError, match="cannot fill one window"):
        next(data.train_batches(tokens[:10], 1, 64))


def test_eval_windows_are_consecutive_or_evenly_spaced():
    tokens = torch.arange(1000) % 256
    windows = data.eval_windows(tokens.to(torch.uint8), 10)
    assert windows.shape == (99, 11) and torch.equal(windows[:, 0], (torch.arange(99) * 10) % 256)
    assert torch.equal(windows[:-1, -1], windows[1:, 0])  # each window's last target is the next one's first input
    some = data.eval_windows(tokens.to(torch.uint8), 10, max_windows=5)
    assert some.shape == (5, 11) and torch.equal(some[:, 0], torch.tensor([0, 240, 490, 740, 980]) % 256)  # windows 0, 24, 49, 74, 98


# -- model ---------------------------------------------------------------------------------------------

def test_the_model_trains_on_the_cpu():
    torch.manual_seed(0)
    model = GPT(TINY, attention="sdpa", compute_dtype=torch.float32)
    x, y = next(data.train_batches(torch.randint(0, 256, (4000,), dtype=torch.uint8), 4, TINY.context))
    losses = []
    for _ in range(8):  # normalized gradient steps (train.py's AdamW runs in test_the_command_runs_its_cpu_smoke)
        loss = model.loss(x, y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad * (p.numel() ** 0.5 / p.grad.norm().clamp_min(1e-12))
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(256)) < 0.1  # small initial logits: uniform over bytes
    assert losses[-1] < losses[0] - 0.3, losses


def test_the_attention_switch():
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=1, width=16, heads=2, context=16), attention="sdpa", compute_dtype=torch.float32)
    tokens = torch.randint(0, 256, (1, 16))
    calls = []

    def recorded(q, k, v):
        calls.append((q.shape, model.attention.layer))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        by_sdpa = model(tokens)
        model.attention.set(recorded)
        assert torch.equal(model(tokens), by_sdpa)
    assert calls == [((1, 2, 16, 8), 0)]  # (batch, heads, tokens, head_dim), layer 0
    # tilecore.attention ("bf16") against SDPA: in test_the_command_runs_its_cpu_smoke (outside the interpreter)
    with pytest.raises(ValueError, match="bf16, fp8, fp8_rotate, sdpa"):
        attention_function("fp4")


# -- evaluation ----------------------------------------------------------------------------------------

def _tiny_model_and_windows():
    torch.manual_seed(0)
    model = GPT(TINY, attention="sdpa", compute_dtype=torch.float32)
    windows = data.eval_windows(torch.randint(0, 256, (32 * 24 + 1,), dtype=torch.uint8), TINY.context)
    return model, windows


def test_evaluate_gives_three_finite_numbers_on_the_same_windows():
    model, windows = _tiny_model_and_windows()
    attentions = {"bf16": "sdpa", "fp8": fp8_stand_in(False), "fp8_rotate": fp8_stand_in(True)}
    result = evaluate.evaluate(model, windows, attentions, batch=8, device=torch.device("cpu"), log=lambda m: None)
    assert result["errors"] == {} and result["windows"] == windows.shape[0]
    rows = result["by_attention"]
    assert set(rows) == {"bf16", "fp8", "fp8_rotate"}
    assert all(math.isfinite(rows[n]["loss"]) and math.isfinite(rows[n]["perplexity"]) for n in rows)
    for n in ("fp8", "fp8_rotate"):
        lo, hi = rows[n]["rel_ppl_ci95"]
        assert lo <= rows[n]["rel_ppl"] <= hi and math.isfinite(rows[n]["diff_se"])
    assert model.attention.kind == "sdpa" and model.attention.qk_hook is None  # restored


def test_evaluate_reports_a_failing_attention_and_goes_on():
    model, windows = _tiny_model_and_windows()

    def broken(q, k, v):
        raise RuntimeError("no kernel here")
    result = evaluate.evaluate(model, windows[:4], {"bf16": "sdpa", "fp8": broken}, batch=4,
                               device=torch.device("cpu"), log=lambda m: None)
    assert "no kernel here" in result["errors"]["fp8"] and set(result["by_attention"]) == {"bf16"}


def test_compare_pairs_windows():
    base = torch.rand(64, dtype=torch.float64) + 1
    result = evaluate.compare({"bf16": base, "fp8": base + 0.01, "short": base[:40] + 0.02}, block=8)
    assert result["windows"] == 40
    fp8 = result["by_attention"]["fp8"]
    assert fp8["diff"] == pytest.approx(0.01) and fp8["diff_se"] < 1e-12
    assert fp8["rel_ppl"] == pytest.approx(math.exp(0.01) - 1) and fp8["rel_ppl_ci95"] == pytest.approx([fp8["rel_ppl"]] * 2)
    assert result["by_attention"]["bf16"]["perplexity"] == pytest.approx(math.exp(float(base[:40].mean())))


def test_balanced_injection_keeps_the_function_and_makes_outliers():
    model, windows = _tiny_model_and_windows()
    cpu = torch.device("cpu")
    clean = evaluate.window_losses(model, windows, batch=8, device=cpu)
    balanced = evaluate.OutlierInjection("balanced", factor=16.0)
    model.attention.qk_hook = balanced
    injected = evaluate.window_losses(model, windows, batch=8, device=cpu)
    assert (injected - clean).abs().max() < 1e-5  # Q K^T unchanged (torch.testing's first call imports for seconds)
    model.attention.qk_hook = evaluate.OutlierInjection("scaled", factor=4.0)
    assert (evaluate.window_losses(model, windows, batch=8, device=cpu) - clean).abs().max() > 1e-4
    model.attention.qk_hook = None
    before = evaluate.qk_statistics(model, windows[:4], batch=4, device=cpu)
    after = evaluate.qk_statistics(model, windows[:4], batch=4, device=cpu, qk_hook=balanced)
    assert len(before) == len(after) == TINY.layers
    for b, a in zip(before, after):
        for t in ("q", "k"):
            assert b[t]["channel_rms_ratio"] < 8 and a[t]["channel_rms_ratio"] > 8
            assert a[t]["max_over_rms"] > 2 * b[t]["max_over_rms"]
    q_scale, k_scale = balanced.scales(0, TINY.heads, TINY.head_dim)
    assert torch.equal(q_scale * k_scale, torch.ones_like(q_scale))
    assert (q_scale == 16).sum(1).tolist() == (k_scale == 16).sum(1).tolist() == [1] * TINY.heads


def test_attention_errors_against_float64_per_layer():
    model, windows = _tiny_model_and_windows()
    candidates = {"bf16": "sdpa", "fp8": fp8_stand_in(False), "fp8_rotate": fp8_stand_in(True)}
    result = evaluate.attention_errors(model, windows[:2], candidates, batch=2, device=torch.device("cpu"),
                                       qk_hook=evaluate.OutlierInjection("balanced", 16.0))
    assert result["errors"] == {} and [row["layer"] for row in result["rel_rmse"]] == list(range(TINY.layers))
    for row in result["rel_rmse"]:
        assert row["bf16"] < 1e-5  # float32 SDPA against float64
        assert 1e-3 < row["fp8"] < 0.2 and 1e-3 < row["fp8_rotate"] < 0.2  # e4m3's 2^-4 steps, averaged
    assert model.attention.kind == "sdpa" and model.attention.qk_hook is None


# -- the command ---------------------------------------------------------------------------------------

def test_the_command_runs_its_cpu_smoke(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # tilecore on the CPU: torch's ops
    env["OMP_NUM_THREADS"] = "1"  # as _one_thread
    r = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--device", "cpu", "--smoke", "--steps", "3",
                        "--eval-windows", "4", "--stats-windows", "2", "--inject", "balanced:16,scaled:4",
                        "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "model | attention |" in r.stdout
    result = json.loads((tmp_path / "fp8_attention_accuracy.json").read_text())
    assert result["training"]["steps"] == 3 and math.isfinite(result["training"]["final_train_loss"])
    trained = result["evaluation"]["scenarios"]["trained"]
    assert trained["errors"] == {}, trained["errors"]
    assert trained["by_attention"]["sdpa"]["diff"] == pytest.approx(0, abs=1e-5)  # tilecore.attention = SDPA
    for name in ("bf16", "sdpa", "fp8", "fp8_rotate"):  # fp8: tilecore's FP8 attention (its CPU emulation)
        assert math.isfinite(trained["by_attention"][name]["loss"])
    for name in ("fp8", "fp8_rotate"):
        assert abs(trained["by_attention"][name]["rel_ppl"]) < 0.05  # a near-uniform model: FP8 barely moves it
    assert len(trained["qk_statistics"]) == 2 and not list(tmp_path.glob("*.pt"))  # no weights saved
    assert all(row["fp8"] > row["bf16"] for row in trained["attention_rel_rmse"]["rel_rmse"])
    assert set(result["evaluation"]["scenarios"]) == {"trained", "balanced_x16", "scaled_x4"}

"""The napkin CLI as a tool: every bad input is a clear error (exit 2, usage, what is accepted), never a
traceback; diagram files; --explain; pictures without matplotlib."""
import subprocess
import sys
from pathlib import Path

import pytest

from tilecore.napkin.cli import main as napkin_main
from tilecore.napkin import derive, models

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, says", [
    (["matmul", "m=0"], "positive"),
    (["matmul", "m=-4"], "positive"),
    (["attention", "heads=3", "kv_heads=2"], "multiple of kv_heads"),
    (["hadamard", "n=3"], "power of two"),
    (["hadamard", "n=0"], "positive"),
    (["attention", "heads=0"], "positive"),
    (["attention", "kv_heads=0"], "positive"),
    (["attention", "causal=2"], "causal must be one of 0, 1"),
    (["attention", "seq=1e35"], "2^31-1"),
    (["hadamard", "n=2^30"], "2^16"),
    (["matmul", "m=1.5"], "integer"),
    (["matmul", "m=abc"], "integer"),
    (["matmul", "m"], "name=value"),
    (["no_such_file.py"], "does not exist"),
    (["--explain", "matmul", "m=256"], "--measured-us"),
    (["--explain", "matmul", "m=256", "--measured-us", "-3"], "positive"),
    (["matmul", "--time-model", "bogus"], "invalid choice"),
    (["--validate", "--docs", "missing/napkin.md"], "no such file"),
    (["attention_backward", "--impl", "fa9"], "accepted: tilecore, cudnn, flash, flex"),
])
def test_bad_input_is_a_clear_error(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        napkin_main(argv + ["--no-picture"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage:" in err and says in err, err


def test_derive_rejects_a_bogus_time_model():
    # engine.derive checks its arguments first: a ValueError naming the accepted models, not a CapacityError
    with pytest.raises(ValueError, match="accepted") as e:
        derive(models.matmul(m=256, n=256, k=256), "h100", time_model="bogus")
    assert type(e.value) is ValueError


def test_validate_writes_nothing_unless_asked(tmp_path, monkeypatch, capsys):
    from tilecore.napkin import validate

    monkeypatch.setattr(validate, "table", lambda *a, **k: "| stub row |")  # the table is validate.py's
    monkeypatch.chdir(tmp_path)
    assert napkin_main(["--validate"]) == 0
    assert "stub row" in capsys.readouterr().out and not (tmp_path / "docs").exists()
    doc = tmp_path / "napkin.md"
    doc.write_text(f"# x\n{validate.BEGIN}\nold\n{validate.END}\n")
    assert napkin_main(["--validate", "--docs", str(doc)]) == 0
    assert "stub row" in doc.read_text() and "old" not in doc.read_text()


def test_diagram_file_make_and_diagram(tmp_path, capsys):
    f = tmp_path / "glu.py"
    f.write_text("from tilecore.napkin import Diagram\n"
                 "def make(t=512, m=256, f=256, dtype='bf16'):\n"
                 "    d = Diagram('glu', t=t, m=m, f=f)\n"
                 "    X, W = d.input('X', 't m', dtype), d.input('W', 'm f', dtype)\n"
                 "    return d.output(d.map('silu', d.contract(X, W, out='t f', name='H'), name='Y', unit='sfu'))\n")
    assert napkin_main([str(f), "t=256", "--no-picture", "--quiet"]) == 0
    assert "h100" in capsys.readouterr().out
    g = tmp_path / "plain.py"
    g.write_text("from tilecore.napkin import models\ndiagram = models.matmul(m=256, n=256, k=256)\n")
    assert napkin_main([str(g), "m=512", "--no-picture", "--quiet"]) == 0
    for text, says in (("x = 1\n", "neither"), ("raise RuntimeError('boom')\n", "boom"),
                       ("def make(t=1):\n    return 3\n", "not a tilecore.napkin.Diagram")):
        bad = tmp_path / "bad.py"
        bad.write_text(text)
        with pytest.raises(SystemExit) as e:
            napkin_main([str(bad), "--no-picture"])
        assert e.value.code == 2 and says in capsys.readouterr().err
    acc = tmp_path / "lse.py"  # a user-defined streaming accumulator, printed and drawn
    acc.write_text("import math\nfrom tilecore.napkin import Combine, Diagram\n"
                   "lse = Combine('logsumexp', lambda x: (x, 1.0), lambda a, b: (max(a[0], b[0]), "
                   "a[1] * math.exp(a[0] - max(a[0], b[0])) + b[1] * math.exp(b[0] - max(a[0], b[0]))), ops=4)\n"
                   "def make(t=1024, n=65536, dtype='bf16'):\n"
                   "    d = Diagram('lse_rows', t=t, n=n)\n"
                   "    return d.output(d.accumulate(d.input('X', 't n', dtype), 'n', lse, name='L'))\n")
    assert napkin_main([str(acc), "--picture", str(tmp_path / "lse")]) == 0
    out = capsys.readouterr().out
    assert "identity of logsumexp" in out and (tmp_path / "lse.svg").exists()
    with pytest.raises(SystemExit):  # a size the file's make() does not take
        napkin_main([str(f), "zz=4", "--no-picture"])
    assert "zz" in capsys.readouterr().err


def test_explain_names_the_bound_and_the_cause(capsys):
    argv = ["--explain", "matmul", "m=512", "n=512", "k=512"]
    pred = None
    assert napkin_main(argv + ["--measured-us", "1000"]) == 0
    out = capsys.readouterr().out
    assert "binding level:" in out and "likely cause:" in out and "measured / predicted" in out
    pred = float(out.split("predicted ")[1].split(" us")[0])
    assert napkin_main(argv + ["--measured-us", str(pred * 1.05)]) == 0
    assert "within 15%" in capsys.readouterr().out
    assert napkin_main(argv + ["--measured-us", str(pred / 3)]) == 0
    assert "beats the model" in capsys.readouterr().out


def test_svg_without_matplotlib(tmp_path):
    # the CLI in a fresh interpreter where importing matplotlib fails
    code = ("import sys; sys.modules['matplotlib'] = None; "
            "from tilecore.napkin.cli import main; "
            f"rc = main(['attention', 'batch=1', 'heads=2', 'seq=256', 'd=64', '--picture', {str(tmp_path / 'a')!r}]); "
            "assert 'matplotlib' not in sys.modules or sys.modules['matplotlib'] is None; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    svg = (tmp_path / "a.svg").read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>") and "softmax_contract" in svg
    assert not (tmp_path / "a.png").exists() and "tilecore[bench]" in r.stderr


def test_pseudocode_puts_post_loop_ops_after_the_loop():
    from tilecore.napkin import Diagram, render

    d = Diagram("mm_epilogue", m=2048, k=8192, n=2048)
    A, B = d.input("A", "m k"), d.input("B", "k n")
    d.output(d.map("gelu", d.contract(A, B, out="m n", name="C", dtype="fp32"), name="Y", unit="sfu"))
    r = derive(d, "h100")
    assert r.parts["k"].kind == "stream"
    lines = render.pseudocode(r).splitlines()
    loop = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("for k0"))
    gelu = next(i for i, ln in enumerate(lines) if "= gelu" in ln)
    assert gelu > loop and lines[gelu].startswith("    RF ") and "after the loop" in lines[gelu]


def test_attention_backward_prints_the_backward_model(capsys):
    # at this size the engine's forward-like plan finds no tiling (a note on stderr); the model still answers
    assert napkin_main(["attention_backward", "seq=256", "d=64", "batch=1", "heads=2", "causal=1",
                        "--impl", "tilecore,flex", "--no-picture"]) == 0
    out = capsys.readouterr().out
    assert "the backward's own model" in out and "tilecore backward" in out and "flex backward" in out
    assert "step latency" in out and "(backward model)" in out

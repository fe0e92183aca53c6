"""The benchmark plots are drawn from committed JSON alone (tilecore.bench.plot): every series one
colour, peers and the ceiling drawn, the run's device and timing in the footer."""
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from tilecore.bench import plot as plotting  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h100-80gb-hbm3"


def _lines_by_axis(fig):
    """(axis title, [(colour, linestyle, label)]) for every panel that has data lines (reference
    lines such as the ceiling carry no label)."""
    out = []
    for ax in fig.axes:
        lines = [(tuple(ln.get_color()) if not isinstance(ln.get_color(), str) else ln.get_color(),
                  ln.get_linestyle(), ln.get_label()) for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        if lines:
            out.append((ax.get_title(), lines))
    return out


def test_attention_one_colour_per_series_and_causal_as_style():
    res = plotting.Results.load(RESULTS / "attention.json")
    fig = plotting.figure(res)
    try:
        panels = [(t, ls) for t, ls in _lines_by_axis(fig) if t]  # value panels have titles
        assert sorted(t for t, _ in panels) == ["bwd, head dim 128", "bwd, head dim 64",
                                                "fwd, head dim 128", "fwd, head dim 64"]
        colour_of = {}
        for _, lines in panels:
            assert len(lines) == 6  # 3 series x causal / not
            assert len({(c, s) for c, s, _ in lines}) == 6  # no two lines look alike
            for c, _, label in lines:
                assert colour_of.setdefault(label, c) == c  # a series keeps its colour in every panel
        assert set(colour_of) == {"tilecore", "cuDNN (SDPA)", "flash (SDPA)"}
        assert len(set(colour_of.values())) == 3
        # ratio panels: tilecore over each peer (2 peers x causal / not), and the ceiling drawn
        ratio_axes = [ax for ax in fig.axes if ax.get_ylabel().startswith("tilecore ÷ peer")]
        assert len(ratio_axes) == 4 and all(len(ax.get_lines()) == 4 + 1 for ax in ratio_axes)
        texts = " ".join(t.get_text() for sub in fig.subfigs for t in sub.texts)
        assert "H100" in texts and "eager calls" in texts and "c4e7d96" in texts
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_hadamard_without_peers_says_so(tmp_path):
    res = plotting.Results.load(RESULTS / "hadamard.json")
    path = plotting.plot(res, tmp_path / "hadamard.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = plotting.figure(res)
    try:
        texts = " ".join(t.get_text() for sub in fig.subfigs for t in sub.texts)
        assert "No peer in this JSON" in texts
        (ax,) = [ax for ax in fig.axes if ax.get_ylabel().startswith("GB/s")]
        ceiling = [ln for ln in ax.get_lines() if set(ln.get_ydata()) == {res.ceiling["value"]}]
        assert ceiling  # the copy measured in the same run, as a line
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_command_redraws_suite_jsons_and_skips_probes(tmp_path):
    for name in ("gemm.json", "gemm_probe_fp8.json", "attention-decode.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    assert plotting.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["attention-decode.png", "gemm.png"]
    with pytest.raises(ValueError, match="not a bench suite"):
        plotting.Results.from_json(json.loads((tmp_path / "gemm_probe_fp8.json").read_text()))

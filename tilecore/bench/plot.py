"""Plots of benchmark results, drawn from their JSON alone (no GPU, no torch):

    python -m tilecore.bench.plot                      # every suite JSON under benchmarks/results
    python -m tilecore.bench.plot benchmarks/results/h100-80gb-hbm3/attention.json [--out DIR]

One figure a suite. Each panel is one combination of the suite's panel parameters (attention: pass x
head dim); within a panel a series (tilecore, a peer) has one colour throughout the figure and a
remaining parameter (attention's ``causal``) a line style. The top of each panel is the metric with
the ceiling measured in the same run as a grey line (and its percentage on the right axis); below it,
where the JSON holds peers, tilecore's figure over each peer's, point by point (same run, so the
ratio the README quotes). The footer names the device, versions, date, commit and how it was timed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

TILECORE = "tilecore"

# how each suite's parameters map to the figure: grid rows and columns of panels, line style
LAYOUTS: dict[str, dict] = {
    "attention": dict(rows="pass", cols="D", style="causal"),
    "attention-gqa": dict(rows="pass", cols="model"),
    "attention-decode": dict(cols="B"),
    "gemm": dict(cols="case"),
    "hadamard": dict(style="dtype"),
    "hadamard-latency": dict(cols="n"),
    "copy": dict(),
}

X_LABELS = {
    "N": "sequence length N (tokens; queries = keys)",
    "Nk": "cached keys Nk (tokens)",
    "K": "K (elements of the reduced dimension)",
    "n": "transform size n (elements a row)",
    "rows": "rows of n elements",
    "bytes": "buffer size (bytes)",
}

# panel titles: "head dim 64" for D = 64; parameters not named here show their value alone ("fwd")
PARAM_NAMES = {"D": "head dim", "B": "batch", "n": "n"}

# what a figure's JSON cannot say for itself
SUITE_NOTES = {
    "hadamard": "No peer in this JSON: HadaCore and Dao's fast-hadamard-transform were not installed on the "
                "device image (the suite times Dao's kernel when it is importable). Grey: the copy measured "
                "in the same run.",
    "hadamard-latency": "Eager calls of few rows: each figure includes the call's host time. No Dao figure in "
                        "this JSON (not installed on the device image).",
    "copy": "No tilecore op: the ceiling itself (torch's copy) and a Triton copy kernel.",
}

TIMING = {
    "eager": "eager calls (do_bench medians after warm-up; host time shows where it exceeds the GPU's)",
    "graph": "GPU time (back-to-back calls replayed from a CUDA graph, so no host time)",
    None: "eager calls (recorded before the harness had another timing mode)",
}

STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P"]


@dataclass
class Results:
    """A suite's JSON as written by tilecore.bench.harness.Result.to_json."""
    suite: str
    metric: str
    x: str
    ceiling: dict
    meta: dict
    rows: list[dict] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict) -> "Results":
        missing = [k for k in ("suite", "metric", "x", "ceiling", "rows") if k not in data]
        if missing:
            raise ValueError(f"not a bench suite's JSON (no {', '.join(missing)}); probe JSONs are not plotted")
        return cls(data["suite"], data["metric"], data["x"], data["ceiling"], data.get("meta") or {}, data["rows"])

    @classmethod
    def load(cls, path: Path) -> "Results":
        return cls.from_json(json.loads(Path(path).read_text()))


def _values(rows: list[dict], key: str | None) -> list:
    """The distinct values of parameter ``key`` in the rows' order (one None where there is no key)."""
    if key is None:
        return [None]
    seen = []
    for r in rows:
        v = r["params"].get(key)
        if v not in seen:
            seen.append(v)
    return seen


def _layout(res: Results) -> dict:
    """The suite's layout, its keys kept only where the rows have that parameter; any other non-x
    parameter becomes panel columns (a suite not listed in LAYOUTS)."""
    keys = {k for r in res.rows for k in r["params"] if k != res.x}
    lay = {k: v for k, v in LAYOUTS.get(res.suite, {}).items() if v in keys}
    rest = sorted(keys - set(lay.values()))
    if rest and "cols" not in lay:
        lay["cols"], rest = rest[0], rest[1:]
    lay["extra"] = rest  # folded into the line label (a suite with more parameters than the layout)
    return lay


def _fmt_x(key: str, v) -> str:
    if key == "bytes":
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if v >= size:
                return f"{v / size:g} {unit}"
        return f"{v} B"
    if isinstance(v, int) and v >= 1024 and v % 1024 == 0:
        return f"{v // 1024}K"
    return str(v)


def _panel_title(lay: dict, row_v, col_v) -> str:
    parts = []
    for key, v in ((lay.get("rows"), row_v), (lay.get("cols"), col_v)):
        if key is None:
            continue
        name = PARAM_NAMES.get(key)
        parts.append(f"{name} {v}" if name else str(v))
    return ", ".join(parts)


def footer(res: Results) -> str:
    m = res.meta
    gpu = (m.get("gpu") or {}).get("name", "device not recorded")
    v = m.get("versions") or {}
    versions = ", ".join(f"{name} {v[key]}" for key, name in (("torch", "torch"), ("triton", "triton"),
                                                              ("cuda", "CUDA"), ("python", "Python")) if v.get(key))
    c = res.ceiling
    run = [gpu, versions or "versions not recorded", f"run {str(m.get('date', 'date not recorded'))[:16].replace('T', ' ')} UTC",
           f"commit {m['commit']}" if m.get("commit") else "commit not recorded"]
    timing = m.get("timing")
    return (" | ".join(run) + f"\nceiling (same run): {c.get('name')} = {c.get('value', 0):,.0f} {c.get('unit', '')}"
            f" | timing: {TIMING.get(timing, timing)}")


def plot(res: Results, path: Path, *, describe: str | None = None) -> Path:
    """Draw ``res`` into ``path`` (a PNG); return the path."""
    import matplotlib.pyplot as plt

    fig = figure(res, describe=describe)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure(res: Results, *, describe: str | None = None):
    """The matplotlib Figure of ``res`` (``plot`` saves it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    lay = _layout(res)
    row_vals, col_vals = _values(res.rows, lay.get("rows")), _values(res.rows, lay.get("cols"))
    style_vals = _values(res.rows, lay.get("style"))
    # tilecore first and always the same colour; peers in the order the suite lists them
    series = sorted(dict.fromkeys(r["series"] for r in res.rows), key=lambda s: s != TILECORE)
    palette = plt.get_cmap("tab10").colors
    colour = {s: palette[i % len(palette)] for i, s in enumerate(series)}
    peers = [s for s in series if s != TILECORE]
    ratios = TILECORE in series and bool(peers)
    style = {v: (STYLES[i % len(STYLES)], MARKERS[i % len(MARKERS)]) for i, v in enumerate(style_vals)}

    n_rows, n_cols = len(row_vals), len(col_vals)
    heights = [3, 1.6] * n_rows if ratios else [3] * n_rows
    # the header (title, note, legend) is a subfigure of its own above the panels, so nothing overlaps
    width = max(11.0, 4.4 * n_cols)
    title = f"tilecore bench {res.suite}" + (f": {describe}" if describe else "")
    note = SUITE_NOTES.get(res.suite)
    if note is None and TILECORE in series and not peers:
        note = "No peer in this JSON."
    text = "\n".join(textwrap.wrap(title, int(width * 11)) + (textwrap.wrap(note, int(width * 13)) if note else []))
    n_handles = len(series) + len(style_vals if lay.get("style") else []) + (1 if res.ceiling.get("value") else 0)
    ncol = min(n_handles, 6)
    header_h = 0.22 * (text.count("\n") + 1) + 0.22 * -(-n_handles // ncol) + 0.2
    body_h = sum(heights) * 1.2 + 0.9
    fig = plt.figure(figsize=(width, header_h + body_h), layout="constrained")
    head, body = fig.subfigures(2, 1, height_ratios=[header_h, body_h])
    axes = body.subplots(len(heights), n_cols, gridspec_kw=dict(height_ratios=heights), squeeze=False)
    ceiling = float(res.ceiling.get("value") or 0)
    x = res.x

    def key_of(r):
        return tuple(r["params"].get(k) for k in lay["extra"])

    for i, rv in enumerate(row_vals):
        for j, cv in enumerate(col_vals):
            ax = axes[(2 if ratios else 1) * i][j]
            rax = axes[2 * i + 1][j] if ratios else None
            rows = [r for r in res.rows
                    if (lay.get("rows") is None or r["params"].get(lay["rows"]) == rv)
                    and (lay.get("cols") is None or r["params"].get(lay["cols"]) == cv)]
            xs_all = sorted({r["params"][x] for r in rows})
            for s, sv, extra in itertools.product(series, style_vals, sorted({key_of(r) for r in rows}, key=str)):
                pts = sorted(((r["params"][x], r) for r in rows if r["series"] == s and key_of(r) == extra
                              and (lay.get("style") is None or r["params"].get(lay["style"]) == sv)),
                             key=lambda p: p[0])
                if not pts:
                    continue
                ls, mk = style[sv]
                ax.plot([p[0] for p in pts], [p[1]["value"] for p in pts], ls=ls, marker=mk, ms=4, lw=1.6,
                        color=colour[s], label=s)
                if rax is None or s == TILECORE:
                    continue
                mine = {r["params"][x]: r["value"] for r in rows if r["series"] == TILECORE and key_of(r) == extra
                        and (lay.get("style") is None or r["params"].get(lay["style"]) == sv)}
                rat = [(px, mine[px] / r["value"]) for px, r in pts if px in mine and r["value"] > 0]
                if rat:
                    rax.plot([p[0] for p in rat], [p[1] for p in rat], ls=ls, marker=mk, ms=4, lw=1.4, color=colour[s])
            if ceiling:
                ax.axhline(ceiling, color="0.45", lw=1.0, ls=(0, (4, 2)))
                sec = ax.secondary_yaxis("right", functions=(lambda v: 100 * v / ceiling, lambda p: p * ceiling / 100))
                sec.set_ylabel("% of ceiling", fontsize=8)
                sec.tick_params(labelsize=7)
            for a in (ax, rax):
                if a is None:
                    continue
                a.set_xscale("log", base=2)
                a.set_xticks(xs_all, [_fmt_x(x, v) for v in xs_all])
                a.minorticks_off()
                a.tick_params(labelsize=7)
                a.grid(True, alpha=0.3)
            ax.set_title(_panel_title(lay, rv, cv), fontsize=9)
            ax.set_ylabel(res.metric + (" (bytes read + written)" if res.metric == "GB/s" else ""), fontsize=8)
            if rax is not None:
                rax.axhline(1.0, color="black", lw=0.8)
                rax.set_ylabel("tilecore ÷ peer\n(same run)", fontsize=8)
                rax.set_xlabel(X_LABELS.get(x, x), fontsize=8)
                ax.tick_params(labelbottom=False)
            else:
                ax.set_xlabel(X_LABELS.get(x, x), fontsize=8)

    # one legend for the figure: colours are series, line styles the style parameter
    handles = [Line2D([], [], color=colour[s], lw=2.5, label=s) for s in series]
    if lay.get("style"):
        handles += [Line2D([], [], color="0.2", ls=style[v][0], marker=style[v][1], label=f"{lay['style']}={v}")
                    for v in style_vals]
    if ceiling:
        handles.append(Line2D([], [], color="0.45", ls=(0, (4, 2)), label=f"ceiling: {res.ceiling.get('name')}"))
    head.text(0.5, 0.98, text, ha="center", va="top", fontsize=9.5)
    head.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    body.supxlabel(footer(res), fontsize=7.5, color="0.25")
    return fig


def describe_of(suite: str, meta: dict) -> str | None:
    """What the suite measures, as its JSON records it (the harness writes the suite's description
    into the meta; older JSONs plot without one). Not from the suites' registry: the suites import the
    harness, which imports this module."""
    return meta.get("describe") or None


def suite_jsons(paths: list[Path]) -> list[Path]:
    """The suite JSONs among ``paths`` (files, or folders searched recursively); probe JSONs are skipped."""
    out = []
    for p in paths:
        for f in ([p] if p.is_file() else sorted(p.rglob("*.json"))):
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and {"suite", "metric", "x", "ceiling", "rows"} <= data.keys():
                out.append(f)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilecore.bench.plot",
                                description="Redraw benchmark PNGs from their JSON (no GPU needed).")
    p.add_argument("paths", nargs="*", type=Path, default=[Path("benchmarks/results")],
                   help="suite JSON files or folders (default: benchmarks/results)")
    p.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: beside each JSON)")
    args = p.parse_args(argv)
    files = suite_jsons(args.paths)
    if not files:
        print("no suite JSON found in " + ", ".join(map(str, args.paths)), file=sys.stderr)
        return 1
    for f in files:
        res = Results.load(f)
        folder = args.out or f.parent
        folder.mkdir(parents=True, exist_ok=True)
        print(f"wrote {plot(res, folder / (f.stem + '.png'), describe=describe_of(res.suite, res.meta))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Outputs of a derivation: pseudocode, a cost table, a one-line prediction, a picture and an
explanation of a measured time.

Pictures: `svg()` writes SVG by hand (no dependency); `draw()` draws .svg and .png with matplotlib
(imported only when drawing); `draw_files()` uses matplotlib where it is installed and the hand-written
SVG otherwise, with a note naming the extra (`pip install tilecore[bench]`)."""
from __future__ import annotations

import math
from pathlib import Path

from .engine import Derivation, Schedule
from .hardware import dtype_bytes

LEVEL_COLOURS = {"HBM": "#222222", "L2": "#7f7f7f", "SMEM": "#e07b00", "RF": "#2a9d3a", "TC": "#1f5fbf"}
UNIT_COLOURS = {"tensor": "#1f5fbf", "sfu": "#8e44ad", "alu": "#2a9d3a"}
UNIT_NAMES = {"tensor": "tensor cores", "sfu": "SFU", "alu": "ALU"}


def _fmt_bytes(b: float, binary: bool = False) -> str:
    scales = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if binary else (("GB", 1e9), ("MB", 1e6), ("KB", 1e3))
    for unit, scale in scales:
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def _tile(r: Derivation, axes, which="S", level="SMEM") -> str:
    ext = r.S[level] if which == "S" else r.T[level]
    return "[" + ",".join(str(ext[a]) for a in axes) + "]"


def pseudocode(r: Derivation) -> str:
    d, g = r.diagram, r.gpu
    n = d.sizes
    stream_axis = next((a for a, p in r.parts.items() if p.kind == "stream"), None)
    grouped = [a for a, p in r.parts.items() if p.kind == "group" and r.T["SMEM"][a] < n[a]]
    L = []
    L.append(f"# kernel {d.name} on {g.name}: {r.ctas} thread blocks, {r.ctas_per_sm} per SM, "
             f"{r.warpgroups} consumer warpgroup(s) each, {r.waves} wave(s)")
    if r.supertile:
        L.append("# L2 super-tile (launch order): " + " x ".join(f"{f} blocks along {a}" for a, f in r.supertile.items()))
    par = ", ".join(f"{a} in tiles of {r.T['SMEM'][a]}" for a in grouped) or "the whole problem"
    L.append(f"parallel for each thread block over {par}:")
    ind = "    "
    io_in = [a for a in d.inputs()]
    for arr in io_in:
        if stream_axis not in arr.axes:
            L.append(f"{ind}SMEM {arr.name}{_tile(r, arr.axes)} {arr.dtype} <- HBM      # once per block")
    acc_ops = [op for op in d.ops if stream_axis in op.reduced]
    for op in acc_ops:
        out = d.arrays[op.output]
        init = {"sum": "0", "max": "-inf", "softmax": "0; mu = -inf; z = 0 (running max and sum)"}.get(
            op.accumulator, f"identity of {op.accumulator} (a user's associative combine)")
        L.append(f"{ind}RF   {out.name}{_tile(r, out.axes)} fp32 = {init}")
    body = ind
    if stream_axis:
        L.append(f"{ind}for {stream_axis}0 in range(0, {n[stream_axis]}, {r.parts[stream_axis].size}):"
                 f"   # stream, {r.stages}-stage ring in SMEM")
        body = ind * 2
        for arr in io_in:
            if stream_axis in arr.axes:
                L.append(f"{body}SMEM {arr.name}{_tile(r, arr.axes)} {arr.dtype} <- HBM")
    # ops after a streamed reduction that do not use the streamed axis run once, after the loop
    after = set()
    for op in d.ops:
        if stream_axis and stream_axis not in op.axes and any(
                i in {a.output for a in acc_ops} or i in after for i in op.inputs):
            after.add(op.output)
    if r.warpgroups > 1 and r.split_axis:
        rows, tile = r.S["RF"][r.split_axis], r.S["SMEM"][r.split_axis]
        if rows * r.warpgroups == tile:
            L.append(f"{body}warpgroup w < {r.warpgroups} takes {r.split_axis} rows [{rows}*w, {rows}*(w+1)):")
        else:  # the tile's rows do not divide: no split (the engine costs it unsplit)
            L.append(f"{body}# {r.warpgroups} warpgroups, but {r.split_axis} = {tile} rows a tile do not divide "
                     f"among them: each warpgroup's share is not split")
        body += ind
    post = []
    for op in d.ops:
        if op.output in after:
            post.append(op)
            continue
        out = d.arrays[op.output]
        units = "+".join(dict.fromkeys(UNIT_NAMES[w.unit] for w in op.works))
        lvl = "RF  "
        if op.kind == "softmax_contract":
            L.append(f"{body}{lvl} S_max = max(mu, rowmax {op.inputs[0]}); P = exp({op.inputs[0]} - S_max)   (SFU)")
            L.append(f"{body}{lvl} delta = exp(mu - S_max); z = delta z + rowsum P; mu = S_max")
            L.append(f"{body}{lvl} {out.name}{_tile(r, out.axes, level='RF')} = delta {out.name} + P . "
                     f"{op.inputs[1]}   ({units})")
        elif op.reduced and stream_axis in op.reduced:
            L.append(f"{body}{lvl} {out.name}{_tile(r, out.axes, level='RF')} += {op.label}   "
                     f"({units}, sum over {','.join(op.reduced)})")
        else:
            red = f", sum over {','.join(op.reduced)}" if op.reduced else ""
            L.append(f"{body}{lvl} {out.name}{_tile(r, out.axes, level='RF')} {out.dtype} = {op.label}   ({units}{red})")
    for op in acc_ops:
        if op.accumulator == "softmax":
            L.append(f"{ind}RF   {op.output} = {op.output} / z")
    for op in post:  # after the loop, once
        out = d.arrays[op.output]
        units = "+".join(dict.fromkeys(UNIT_NAMES[w.unit] for w in op.works))
        L.append(f"{ind}RF   {out.name}{_tile(r, out.axes, level='RF')} {out.dtype} = {op.label}   ({units}, after the loop)")
    for o in d.outputs:
        arr = d.arrays[o]
        L.append(f"{ind}HBM  {o}{_tile(r, arr.axes)} {arr.dtype} <- SMEM <- RF")
    # divisibility: tiles, coalescing and MMA granules combine by LCM per axis
    m_gran, n_gran, k_bytes = g.tc_tile
    rules = []
    for a in n:
        need = [r.T["SMEM"][a]] if r.parts[a].kind == "group" else []
        if r.parts[a].kind == "stream":
            need.append(r.parts[a].size)
        for arr in list(d.inputs()) + [d.arrays[o] for o in d.outputs]:
            if arr.axes and arr.axes[-1] == a and r.S["SMEM"][a] < n[a]:
                need.append(max(1, g.coalesce_bytes // dtype_bytes(arr.dtype)))
        need = [x for x in need if x > 1]
        if need:
            lcm = math.lcm(*need)
            ok = "ok" if n[a] % lcm == 0 else f"NOT divisible: pad to {math.ceil(n[a] / lcm) * lcm}"
            rules.append(f"{a} % {lcm} ({ok})")
    L.append("# divisibility: " + ("; ".join(rules) if rules else "none needed"))
    L.append(f"# MMA granule per warpgroup: m{m_gran} n{n_gran} k{k_bytes} bytes; "
             f"coalescing: {g.coalesce_bytes}-byte rows")
    return "\n".join(L)


def cost_table(r: Derivation) -> str:
    g = r.gpu
    rows = [("level / unit", "moved or done", "per-unit use / capacity", "rate", "time")]
    level_rate = {"HBM": g.levels[0].bandwidth, "L2": g.level("L2").bandwidth if len(g.levels) > 2 else None,
                  "SMEM": g.level("SMEM").bandwidth}
    mem_of = {"HBM": "L2", "L2": "SMEM", "SMEM": "RF"}
    for lvl, h in r.H.items():
        m_lvl = mem_of[lvl] if len(g.levels) > 2 else "SMEM"
        use, cap = r.M.get(m_lvl), r.capacity.get(m_lvl)
        use_s = f"{m_lvl} {_fmt_bytes(use, True)}" + (f" / {_fmt_bytes(cap, True)}" if cap else "")
        rate = level_rate.get(lvl)
        rows.append((f"{lvl} -> {m_lvl}", _fmt_bytes(h), use_s, f"{rate / 1e12:.2f} TB/s" if rate else "-",
                     f"{r.times[lvl] * 1e6:.1f} us"))
    for (unit, dt), ops in sorted(r.work.items()):
        if ops <= 0:
            continue
        rate = g.rate(unit, dt)
        rows.append((f"{UNIT_NAMES[unit]} {dt}", f"{ops / 1e12:.3f} Tops", "-", f"{rate / 1e12:.1f} T/s",
                     f"{ops / rate * 1e6:.1f} us"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(5)]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append(f"predicted {r.time * 1e6:.1f} us, {r.tflops:.0f} TFLOP/s, bound by {r.bound}"
               + (f"; {'; '.join(r.notes)}" if r.notes else ""))
    return "\n".join(out)


def report(s: Schedule) -> str:
    parts = [s.diagram.describe(), ""]
    for k in s.kernels:
        parts += [pseudocode(k), "", cost_table(k), ""]
    if not s.fused:
        parts.append(f"{len(s.kernels)} kernels (fusing them does not fit or is slower): "
                     f"{s.time * 1e6:.1f} us, {s.tflops:.0f} TFLOP/s")
    return "\n".join(parts).rstrip()


def draw(r: Derivation, path) -> list:
    """Draw the relabelled diagram: arrays as bundles of labelled wires (one per axis, coloured by
    the level they live in), ops as boxes coloured by the unit they run on. Writes .svg and .png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    from matplotlib.lines import Line2D

    d = r.diagram
    stream_axis = next((a for a, p in r.parts.items() if p.kind == "stream"), None)
    ops = d.ops
    ins = [a for a in d.arrays.values() if a.role in ("input", "constant")]
    col = {a.name: 0 for a in ins}
    for k, op in enumerate(ops):
        col[op.output] = k + 1
    width = len(ops) + 2
    n_wires = sum(len(a.axes) for a in d.arrays.values()) + 2 * len(d.arrays)
    fig_h = max(3.5, 0.32 * n_wires + 1.5) + 0.2 * 14
    fig, ax = plt.subplots(figsize=(3.2 * width + 2, fig_h))
    ax.set_xlim(-0.6, width + 0.4)
    ax.axis("off")
    # vertical placement: stack arrays in order, each a bundle of wires
    y, ypos = 0.0, {}
    order = [a.name for a in ins] + [op.output for op in ops]
    for name in order:
        arr = d.arrays[name]
        ypos[name] = [y - 0.35 * i for i in range(len(arr.axes))] or [y]
        y -= 0.35 * max(1, len(arr.axes)) + 0.45
    ax.set_ylim(y - 0.2, 1.1)

    def part_label(a):
        p = r.parts.get(a)
        extra = ""
        if p is not None and p.kind == "group" and r.T["SMEM"][a] < d.sizes[a]:
            extra = f" | group {r.T['SMEM'][a]}"
        elif p is not None and p.kind == "stream":
            extra = f" | stream {p.size}"
        return f"{a}={d.sizes[a]}{extra}"

    def box_x(name):
        return col[name] + 0.5 if name in col and col[name] > 0 else 0.0

    for name in order:
        arr = d.arrays[name]
        x0 = 0.0 if arr.role in ("input", "constant") else col[name] + 0.35
        users = [k + 1 for k, op in enumerate(ops) if name in op.inputs]
        x1 = max(users) - 0.35 if users else width - 0.4
        is_out = name in d.outputs
        for a, yy in zip(arr.axes, ypos[name]):
            style = "--" if a == stream_axis else "-"
            if arr.role == "input":
                ax.plot([x0, x0 + 0.35], [yy, yy], color=LEVEL_COLOURS["HBM"], lw=2.5, ls=style)
                ax.plot([x0 + 0.35, x1], [yy, yy], color=LEVEL_COLOURS["SMEM"], lw=2.5, ls=style)
            elif arr.role == "constant":
                ax.plot([x0, x1], [yy, yy], color=LEVEL_COLOURS["RF"], lw=2.5, ls=":")
            else:
                end = x1 if not is_out else width - 0.75
                ax.plot([x0, end], [yy, yy], color=LEVEL_COLOURS["RF"], lw=2.5, ls=style)
                if is_out:
                    ax.plot([end, width - 0.4], [yy, yy], color=LEVEL_COLOURS["HBM"], lw=2.5, ls=style)
            ax.text(x0 + 0.05 if arr.role != "intermediate" else x0 + 0.05, yy + 0.06, part_label(a), fontsize=8)
        label = f"{arr.name} {arr.dtype}" + (" (made on chip)" if arr.role == "constant" else "")
        ax.text(x0 - 0.05 if arr.role != "intermediate" else x0, ypos[name][0] + 0.2, label,
                fontsize=9, weight="bold")
        for u in users:  # connect the bundle to the consumer's box
            ax.plot([x1, u - 0.2], [ypos[name][0], ypos[ops[u - 1].output][0]], color="#bbbbbb", lw=1, zorder=0)
    for k, op in enumerate(ops):
        unit = max(op.works, key=lambda w: w.per_point * math.prod(d.sizes[a] for a in w.axes)).unit
        ys = ypos[op.output] + sum((ypos[i] for i in op.inputs), [])
        yc = ypos[op.output][0]
        bx = k + 1 - 0.2
        ax.add_patch(FancyBboxPatch((bx - 0.15, yc - 0.25), 0.5, 0.5, boxstyle="round,pad=0.05",
                                    fc=UNIT_COLOURS[unit], ec="black", alpha=0.9))
        ax.text(bx + 0.1, yc - 0.45, op.label if len(op.label) < 28 else op.kind, fontsize=8, ha="center",
                va="top", color=UNIT_COLOURS[unit])
        red = ",".join(op.reduced)
        ax.text(bx + 0.1, yc, ("sum " if op.accumulator == "sum" else
                               "acc " if op.accumulator else "all ") + red if red else "map",
                fontsize=7, ha="center", va="center", color="white", weight="bold")
        del ys
    handles = [Line2D([0], [0], color=c, lw=3, label=f"{lvl} resident") for lvl, c in LEVEL_COLOURS.items()
               if lvl in ("HBM", "SMEM", "RF")]
    handles += [Line2D([0], [0], color="black", lw=2, ls="--", label="streamed axis (loop)")]
    handles += [Line2D([0], [0], marker="s", color="w", markerfacecolor=c, markersize=12, label=UNIT_NAMES[u])
                for u, c in UNIT_COLOURS.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=2, framealpha=0.9)
    code = [ln for ln in pseudocode(r).splitlines() if not ln.startswith("#")]
    ax.text(-0.5, y - 0.1, "\n".join(code), fontsize=7.5, family="monospace", ha="left", va="top",
            multialignment="left", bbox=dict(fc="#f7f7f7", ec="#cccccc"))
    ax.set_ylim(y - 0.32 * len(code) - 0.6, 1.1)
    grid = ", ".join(f"{a}/{r.T['SMEM'][a]}" for a, p in r.parts.items()
                     if p.kind == "group" and r.T["SMEM"][a] < d.sizes[a])
    ax.set_title(f"{d.name} on {r.gpu.name}: {r.time * 1e6:.0f} us, {r.tflops:.0f} TFLOP/s, bound by {r.bound}\n"
                 f"thread blocks over {grid or 'one tile'}; {r.warpgroups} warpgroup(s); "
                 f"SMEM {r.M['SMEM'] / 1024:.0f} KiB per block", fontsize=10, loc="left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for ext in (".svg", ".png"):
        p = path.with_suffix(ext)
        fig.savefig(p, dpi=110, bbox_inches="tight")
        written.append(p)
    plt.close(fig)
    return written


# ------------------------------------------------------------------------ pictures without matplotlib
def _esc(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def svg(r: Derivation) -> str:
    """The relabelled diagram as an SVG document, written by hand: one row per array (a wire per axis,
    coloured by the level it lives in, dashed when streamed), one box per op coloured by its unit,
    the pseudocode below. Needs nothing but the standard library."""
    d = r.diagram
    stream_axis = next((a for a, p in r.parts.items() if p.kind == "stream"), None)
    ins = [a for a in d.arrays.values() if a.role in ("input", "constant")]
    order = [a.name for a in ins] + [op.output for op in d.ops]
    col = {a.name: 0 for a in ins}
    col.update({op.output: k + 1 for k, op in enumerate(d.ops)})
    cw, wire, gap = 200, 18, 26          # column width, wire spacing, gap between arrays (pixels)
    width = cw * (len(d.ops) + 2) + 40
    y, ypos = 70, {}
    for name in order:
        ypos[name] = [y + wire * i for i in range(max(1, len(d.arrays[name].axes)))]
        y = ypos[name][-1] + gap + 14
    code = [ln for ln in pseudocode(r).splitlines() if not ln.startswith("#")]
    height = y + 16 * len(code) + 40
    blocks = f"{r.ctas} thread blocks, {r.warpgroups} warpgroup(s), SMEM {r.M['SMEM'] / 1024:.0f} KiB a block"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="13" font-weight="bold">{_esc(r.summary())}</text>',
           f'<text x="10" y="38">{_esc(blocks)}</text>']
    legend_x = 10
    for lvl in ("HBM", "SMEM", "RF"):
        out.append(f'<line x1="{legend_x}" y1="52" x2="{legend_x + 24}" y2="52" stroke="{LEVEL_COLOURS[lvl]}" stroke-width="3"/>'
                   f'<text x="{legend_x + 28}" y="56">{lvl}</text>')
        legend_x += 80
    for u, c in UNIT_COLOURS.items():
        out.append(f'<rect x="{legend_x}" y="45" width="12" height="12" fill="{c}"/>'
                   f'<text x="{legend_x + 16}" y="56">{UNIT_NAMES[u]}</text>')
        legend_x += 110
    for name in order:
        arr = d.arrays[name]
        x0 = 20 if arr.role != "intermediate" else 20 + cw * col[name] + 60
        users = [k + 1 for k, op in enumerate(d.ops) if name in op.inputs]
        x1 = (20 + cw * max(users) - 10) if users else width - 20
        colour = {"input": LEVEL_COLOURS["SMEM"], "constant": LEVEL_COLOURS["RF"]}.get(arr.role, LEVEL_COLOURS["RF"])
        if name in d.outputs:
            colour = LEVEL_COLOURS["HBM"]
        for a, yy in zip(arr.axes or ("",), ypos[name]):
            dash = ' stroke-dasharray="6,4"' if a == stream_axis else ""
            out.append(f'<line x1="{x0}" y1="{yy}" x2="{x1}" y2="{yy}" stroke="{colour}" stroke-width="2.5"{dash}/>')
            if a:
                p = r.parts.get(a)
                extra = f" | stream {p.size}" if p is not None and p.kind == "stream" else (
                    f" | group {r.T['SMEM'][a]}" if p is not None and p.kind == "group" and r.T["SMEM"][a] < d.sizes[a] else "")
                out.append(f'<text x="{x0 + 4}" y="{yy - 3}" font-size="9">{_esc(f"{a}={d.sizes[a]}{extra}")}</text>')
        out.append(f'<text x="{x0}" y="{ypos[name][0] - 12}" font-weight="bold">{_esc(f"{arr.name} {arr.dtype}")}</text>')
    for k, op in enumerate(d.ops):
        unit = max(op.works, key=lambda w: w.per_point * math.prod(d.sizes[a] for a in w.axes)).unit
        bx, by = 20 + cw * (k + 1) - 5, ypos[op.output][0] - 14
        out.append(f'<rect x="{bx}" y="{by}" width="60" height="28" rx="6" fill="{UNIT_COLOURS[unit]}" stroke="black"/>'
                   f'<text x="{bx + 30}" y="{by + 18}" fill="white" text-anchor="middle" font-size="9">'
                   f'{_esc(op.kind)}</text>'
                   f'<text x="{bx + 30}" y="{by + 40}" text-anchor="middle" font-size="9">'
                   f'{_esc(op.label if len(op.label) < 28 else op.name)}</text>')
    for i, ln in enumerate(code):
        out.append(f'<text x="10" y="{y + 16 * i + 10}" font-family="monospace" xml:space="preserve">{_esc(ln)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(r: Derivation, path) -> Path:
    p = Path(path).with_suffix(".svg")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(svg(r))
    return p


def draw_files(r: Derivation, path) -> tuple:
    """(files written, note or None): matplotlib's .svg and .png where it is installed, else the
    hand-written .svg and a note naming the extra that draws the .png."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return [write_svg(r, path)], ("note: the .png picture needs matplotlib (pip install 'tilecore[bench]'); "
                                      "wrote the SVG without it")
    return draw(r, path), None


# ------------------------------------------------------------------------ a measured time explained
def explain(diagram, gpu, measured_s: float, sched: Schedule | None = None) -> str:
    """Compare a measured time with the prediction: the binding level, the other resources, and the
    gap's likely cause, picked as the account whose prediction lands nearest the measurement:
    overlap (the default), exposed exponentials (SFU), no overlap (serial), launch latency, too few
    thread blocks for the SMs, wave quantization."""
    from .engine import plan

    if sched is None:
        sched = plan(diagram, gpu)
    gpu = sched.kernels[0].gpu
    pred = sched.time
    ratio = measured_s / pred
    main = max(sched.kernels, key=lambda k: k.time)
    L = [f"{diagram.name} on {gpu.name}: predicted {pred * 1e6:.2f} us ({sched.tflops:.0f} TFLOP/s), "
         f"measured {measured_s * 1e6:.2f} us: measured / predicted = {ratio:.2f}",
         f"binding level: {main.bound}" + (f" (kernel {diagram.name!r} of {len(sched.kernels)})"
                                           if len(sched.kernels) > 1 else "")]
    ranked = sorted(main.times.items(), key=lambda kv: -kv[1])
    L.append("resources of the slowest kernel: " + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in ranked if v > 0))
    accounts = {"overlap (every unit and level hidden behind the slowest)": pred}
    t = main.times
    others = pred - main.time
    compute = [t.get(u, 0.0) for u in ("tensor", "sfu", "alu")]
    transfer = max(t.get(k, 0.0) for k in ("HBM", "L2", "SMEM"))
    if t.get("sfu", 0) > 0 and t.get("tensor", 0) > 0:
        share = getattr(gpu, "exposed_sfu", 2 / 3)  # the paper's account of FA3: 2/3 of exp exposed
        accounts["exposed SFU (exponentials between two dependent MMAs do not hide)"] = others + max(
            transfer, t["tensor"] + share * t["sfu"])
    accounts["no overlap (units and transfers one after another: a latency-bound pipeline)"] = others + sum(compute) + transfer
    launch = getattr(gpu, "launch_s", 0.0) or 4.6e-6
    accounts[f"launch latency ({launch * 1e6:.1f} us a kernel, {len(sched.kernels)} kernel(s))"] = \
        pred + launch * len(sched.kernels)
    if main.ctas < gpu.sms:
        accounts[f"too few thread blocks ({main.ctas} for {gpu.sms} SMs: split a reduced axis, split-K or "
                 "flash-decoding)"] = others + main.time * gpu.sms / main.ctas
    if main.waves > 1 and any("wave" in n for n in main.notes):
        accounts["wave quantization (" + next(n for n in main.notes if "wave" in n) + ")"] = pred
    cause, best = min(accounts.items(), key=lambda kv: abs(math.log(kv[1] / measured_s)))
    if abs(ratio - 1) <= 0.15:
        L.append("agreement: within 15% of the prediction; the kernel runs at its bound")
    elif ratio < 1:
        L.append(f"the measurement beats the model by {1 / ratio:.2f}x: a constant of {main.bound} is too low "
                 "(calibrate it: experiments/napkin/gpu_constants.py) or the kernel reuses data the model "
                 "sends again (L2 hits)")
    else:
        L.append(f"gap: {100 * (ratio - 1):.0f}% slower than predicted; likely cause: {cause} "
                 f"(that account predicts {best * 1e6:.2f} us)")
    L.append("accounts tried: " + "; ".join(f"{k.split(' (')[0]} {v * 1e6:.2f} us" for k, v in accounts.items()))
    return "\n".join(L)

"""Which of session 33's GLA-backward values makes head dim 64 fault on the H100 (issue 33, session 33, HA)?

Call 7 of session 33: the public op at B2 N517 H3 d64 (weak decays) hit an illegal memory access with configs_gla_bwd's
CHUNKED of that snapshot (dqk_VB 64, dqk_form 3, dv_form 5); session 32's values passed the same case in call 1. Each
variant below (explicit overrides of CHUNKED, so configs' per-dims rule does not apply) runs in a process of its own
(a fault kills only its own CUDA context): kernels_backward_gla_chunked.backward into NaN-poisoned buffers, bf16, against
the float64 recurrence's autograd (dq, dk, dv as multiples of the rounding floor; dg, dh0 relative), at d 64 (N 517 and
1000, weak decays and strong decays with a reset) and d 128 (N 517) for comparison.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_d64.py            (H100, < 100 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_d64.py --smoke    (CPU interpreter, small shapes)
Prints a table last; JSON to $OUT/gla_bwd_d64.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import kernels_backward_gla_chunked, linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.plan import IDENTITY, plan  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
VARIANTS = {
    "s32 (VB 32, forms off)": dict(dqk_VB=32, dqk_form=0, dv_form=0),
    "VB 64": dict(dqk_VB=64, dqk_form=0, dv_form=0),
    "dqk_form 3": dict(dqk_VB=32, dqk_form=3, dv_form=0),
    "dv_form 1": dict(dqk_VB=32, dqk_form=0, dv_form=1),
    "dv_form 5": dict(dqk_VB=32, dqk_form=0, dv_form=5),
    "form 3 + dv 5": dict(dqk_VB=32, dqk_form=3, dv_form=5),
    "VB 64 + form 3 + dv 5 (call 7's)": dict(dqk_VB=64, dqk_form=3, dv_form=5),
}
# (B, N, H, d, strong decays + a reset)
CASES = [(2, 517, 3, 64, False), (2, 517, 3, 64, True), (1, 1000, 2, 64, False), (2, 517, 3, 128, False)]
if SMOKE:
    CASES = [(1, 37, 2, 32, False), (1, 37, 2, 32, True)]


def make(B, N, H, d, strong, seed=0):
    torch.manual_seed(seed)
    bf = torch.bfloat16
    t = dict(q=torch.randn(B, N, H, d, dtype=bf, device=DEV), k=torch.randn(B, N, H, d, dtype=bf, device=DEV),
             v=torch.randn(B, N, H, d, dtype=bf, device=DEV), do=torch.randn(B, N, H, d, dtype=bf, device=DEV),
             h0=torch.randn(B, H, d, d, device=DEV), dht=torch.randn(B, H, d, d, device=DEV))
    g = -torch.rand(B, N, H, d, device=DEV) * (6.0 if strong else 0.3)
    if strong:
        g[:, N // 2, :, : d // 4] = float("-inf")
    t["g"] = g
    return t


def check(name: str, case) -> dict:
    t = make(*case)
    leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
    scale = case[3] ** -0.5
    o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=scale, initial_state=leaves[4])
    ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
    nan = float("nan")
    out = dict(dq=torch.full_like(t["q"], nan), dk=torch.full_like(t["k"], nan), dv=torch.full_like(t["v"], nan),
               dg=torch.full_like(t["g"], nan), dh0=torch.full_like(t["h0"], nan))
    p = plan(t["q"], t["v"], t["g"], IDENTITY)
    got = kernels_backward_gla_chunked.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], t["h0"], st.float().detach(),
                                                t["dht"], scale, out=out, **VARIANTS[name])
    if DEV == "cuda":
        torch.cuda.synchronize()
    got = [got[0], got[1], got[2], got[3], got[5]]
    row = {}
    live = t["g"] >= -100
    for n, x, r, inp in zip(("dq", "dk", "dv", "dg", "dh0"), got, ref, (t["q"], t["k"], t["v"], None, None)):
        r = r.to(x.device)
        row[f"{n}_finite"] = bool(torch.isfinite(x).all())
        if inp is not None:
            row[n] = round(accuracy.rel_rms(x, r) / accuracy.rounding_floor(r, inp.dtype), 3)
        elif n == "dg":
            row[n] = accuracy.rel_rms(x[live], r[live])
        else:
            row[n] = accuracy.rel_rms(x, r)
    row["pass"] = all(row[f"{n}_finite"] for n in ("dq", "dk", "dv", "dg", "dh0")) and all(
        row[n] <= 2.5 for n in ("dq", "dk", "dv")) and row["dg"] < 0.1 and row["dh0"] < 0.01
    return row


def worker(name: str):
    rows = {}
    for case in CASES:
        try:
            rows[str(case)] = check(name, case)
        except Exception as err:  # noqa: BLE001 (a fault: the context is gone, nothing more runs here)
            rows[str(case)] = dict(error=f"{type(err).__name__}: {err}"[:200], **{"pass": False})
            break
    print("ROW " + json.dumps(rows), flush=True)


def main():
    start = time.time()
    results = {}
    for name in VARIANTS:
        proc = subprocess.run([sys.executable, __file__, "--worker", name] + (["--smoke"] if SMOKE else []),
                              capture_output=True, text=True, timeout=240,
                              env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
        line = next((x for x in proc.stdout.splitlines() if x.startswith("ROW ")), None)
        results[name] = json.loads(line[4:]) if line else dict(error=(proc.stderr or proc.stdout)[-300:])
        print(f"{name}: {time.time() - start:.0f} s", flush=True)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gla_bwd_d64.json").write_text(json.dumps(dict(cases=[str(c) for c in CASES], rows=results), indent=1))
    print("\nvariant | " + " | ".join(f"B{c[0]} N{c[1]} H{c[2]} d{c[3]}{' strong+reset' if c[4] else ''}"
                                     for c in CASES) + "   (dq dk dv x floor, dg dh0 rel; or the error)")
    for name, rows in results.items():
        cells = []
        for c in CASES:
            r = rows.get(str(c)) if isinstance(rows, dict) else None
            if r is None:
                cells.append("-" if "error" not in rows else rows["error"][-120:].replace("\n", " "))
            elif "error" in r:
                cells.append("FAULT " + r["error"][:90])
            else:
                cells.append(f"{r['dq']:.3g} {r['dk']:.3g} {r['dv']:.3g} {r['dg']:.2g} {r['dh0']:.2g} "
                             + ("ok" if r["pass"] else "FAIL"))
        print(f"{name} | " + " | ".join(cells))
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
    else:
        main()

"""GPU check of attention_with_kvcache's fitted split kernel (issue 31's other GPUs, session 34), on the H100.

attention_kvcache.SHARED_FITS gives GPUs with 99 KiB blocks (sm_86 / sm_89 / sm_120) two stages at D128, and 64 KiB
ones (ROCm) 64 keys a step and two stages: chosen to fit by compiling for those targets on the CPU, never run. Here
each row runs on this GPU through the public function, in a process of its own under dispatch.limit_shared_memory
(the plans see the row's figure, so the op's own layout picks the row; the kernel is compiled for sm_90a: the
configuration is what is checked, not another GPU's code), against the float64 reference (tilecore.accuracy: rel-RMS over the
output's rounding floor), on random contiguous and paged caches with random lengths (decode Nq 1; chunked prefill
Nq 4, causal), and timed (do_bench medians) against the H100's own configuration in the same run.

    PYTHONPATH=. python3 experiments/portability/gpu_kvcache_fits.py [--dry]

``--dry``: the CPU through Triton's interpreter at tiny sizes (the rows are not applied there: a check of the
script). Writes $OUT/kvcache_fits.json (default /tmp/out); the table last.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DRY = "--dry" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import tilecore  # noqa: E402
from tilecore import accuracy, dispatch  # noqa: E402
from tilecore.ops.attention_kvcache import op as kv  # noqa: E402
from tilecore.ops.attention_kvcache.reference import kvcache_reference  # noqa: E402

DEV = torch.device("cpu" if DRY else "cuda")
DT = torch.float16 if DRY else torch.bfloat16
ROWS = {"H100 (its own)": None, "99 KiB row (sm_86/89/120)": 99 * 1024, "64 KiB row (ROCm)": 64 * 1024}
BAR = 2.0  # error over the rounding floor: a split-key pass rounds O once, as the default does
START = time.time()


def inputs(paged: bool, nq: int, seed: int, d=128):
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, Hq, Hkv, nmax, page = (2, 8, 2, 96, 16) if DRY else (4, 32, 8, 4096, 16 if seed % 2 else 128)
    lens = torch.randint(1, nmax - nq, (B,), generator=g).to(torch.int32)
    rnd = lambda *s: torch.randn(*s, generator=g).to(DT).to(DEV)
    q = rnd(B, nq, Hq, d)
    if paged:
        pages = nmax // page
        kc, vc = rnd(B * pages + 3, page, Hkv, d), rnd(B * pages + 3, page, Hkv, d)
        table = torch.randperm(B * pages + 3, generator=g)[:B * pages].reshape(B, pages).to(torch.int32).to(DEV)
    else:
        kc, vc, table = rnd(B, nmax, Hkv, d), rnd(B, nmax, Hkv, d), None
    return q, kc, vc, lens.to(DEV), table


def run_row(name: str, limit) -> list[dict]:
    """Every case under one row, in this process (a fresh one: the op keeps its plans per call signature)."""
    rows = []
    with (dispatch.limit_shared_memory(limit) if limit else contextlib.nullcontext()):
        fit = dispatch.shared_memory_fit(DEV, kv.SHARED_FITS, "attention_with_kvcache") if not DRY else None
        for label, paged, nq, seed in CASES:
            q, kc, vc, lens, table = inputs(paged, nq, seed)
            causal = nq > 1
            ref, _ = kvcache_reference(q, kc, vc, lens, block_table=table, causal=causal)
            call = lambda: tilecore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,
                                                           causal=causal)
            out = call()
            err = accuracy.error_over_floor(out, ref.to(out.device))
            finite = bool(torch.isfinite(out).all())
            again = call()  # the key's kept launch (its second call): the same bits
            ms = None
            if not DRY:
                import triton

                ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
            rows.append(dict(case=label, row=name, fit=str((fit or {}).get(128)), err_floor=err, finite=finite,
                             same_bits_again=bool(torch.equal(out, again)), ok=finite and err <= BAR, ms=ms,
                             out_sum=float(out.double().sum())))
            print(f"[{time.time() - START:.0f} s] {label} | {name}: {rows[-1]}", flush=True)
    return rows


CASES = [("contiguous decode", False, 1, 0), ("paged 128 decode", True, 1, 2), ("paged 16 decode", True, 1, 1),
         ("contiguous prefill Nq4 causal", False, 4, 4), ("paged 16 prefill Nq4 causal", True, 4, 3)]


def main() -> int:
    if "--row" in sys.argv:  # (internal) one row, this process: its results as one JSON line
        name = sys.argv[sys.argv.index("--row") + 1]
        print("ROWS " + json.dumps(run_row(name, ROWS[name])), flush=True)
        return 0
    results = []
    for name in ROWS:  # a process a row: the op keeps its plans per call signature
        cmd = [sys.executable, __file__, "--row", name] + (["--dry"] if DRY else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("ROWS ")]
        if not line:
            print(f"{name}: no result\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}", flush=True)
            continue
        results += json.loads(line[0][5:])
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu (dry)" if DRY else torch.cuda.get_device_name()
    (out_dir / "kvcache_fits.json").write_text(json.dumps(dict(device=device, rows=results), indent=1))
    own = {r["case"]: r for r in results if r["row"].startswith("H100")}
    print(f"\nattention_with_kvcache, D128 bf16, {device}: each SHARED_FITS row run here ({BAR}x floor bar; "
          "'same': the H100 row's bits)")
    print(f"{'case':30} {'row':26} {'err/fl':>7} {'ok':>3} {'same':>4} {'us':>7} {'/own':>6}  fit row (D128)")
    for r in results:
        base = own.get(r["case"], {})
        ms, base_ms = r["ms"], base.get("ms")
        print(f"{r['case']:30} {r['row']:26} {r['err_floor']:7.3f} {'y' if r['ok'] and r['same_bits_again'] else 'N':>3} "
              f"{'y' if r['out_sum'] == base.get('out_sum') else 'n':>4} {'-' if ms is None else format(ms * 1e3, '7.1f'):>7} "
              f"{'-' if not (ms and base_ms) else format(ms / base_ms, '6.3f'):>6}  {r['fit']}")
    print(f"all ok: {all(r['ok'] and r['same_bits_again'] for r in results)} ({time.time() - START:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

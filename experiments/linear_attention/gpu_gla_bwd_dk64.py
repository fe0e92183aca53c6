"""Where the chunk-parallel GLA backward's dk goes wrong on the H100 at chunk 64 with key blocks of 32 (decision 48 of
notes/linear_attention/README.md: dk 4.3e3x the rounding floor in session 30's runs 7, 9, 10, 11, dq / dv right; right
in the interpreter at float32 and fp16, Dk 128, session 31). Issue 33, session 31.

For each block configuration the states walks run once (kernels_backward_gla_chunked.backward's launches, in order),
then the dqk kernel's launches again on three inputs: as given ("full"), q zeroed (dk = its state term v dS_c^T
e^(G_last - G) alone: the intra-chunk term and the diagonal's r q vanish) and dS_c zeroed (dk = the intra-chunk
term + r q alone). Each dq / dk is compared with the same chunk formulas in float64 on the GPU from the same S_c /
dS_c (so only the dqk kernel is judged), and the full dk's error is split by token position within the chunk and by
channel (which rows or columns go wrong).

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_dk64.py            (H100, < 60 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_dk64.py --smoke    (CPU interpreter, small)
JSON to $OUT/linear_attention_gla_bwd_dk64_s31.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore.ops.linear_attention import kernels_backward_gla_chunked as kc  # noqa: E402
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
# (name, CHUNKED overrides); session 30's failing blocks first, then their controls (chunk 32 key blocks 32 and chunk
# 64 key blocks 64 were right there) and the session-31 value loop at the failing blocks
CONFIGS = [
    ("bt64 kb32 wide", dict(BT=64, BKB=32, wide_apart=True)),
    ("bt64 kb32 wide at", dict(BT=64, BKB=32, wide_apart=True, dk_at=True)),
    ("bt64 kb32 wide w8", dict(BT=64, BKB=32, wide_apart=True, dqk_warps=8)),
    ("bt64 kb32 one launch", dict(BT=64, BKB=32, wide_apart=False)),
    ("bt64 kb32 wide vb32", dict(BT=64, BKB=32, wide_apart=True, dqk_VB=32)),
    ("bt64 kb64 wide", dict(BT=64, BKB=64, wide_apart=True)),
    ("bt32 kb32 wide", dict(BT=32, BKB=32, wide_apart=True)),
]


def chunk_terms(q, k, v, g, do, hs, dhs, BT, scale):
    """dq, dk [B, N, H, Dk] float64 by the dqk kernel's chunk formulas from S_c = hs, dS_c = dhs ((B, H, NT, Dk, Dv))."""
    B, N, H, Dk = q.shape
    NT = hs.shape[2]
    pad = NT * BT - N

    def chunks(x):  # [B, H, NT, BT, D] float64, zeros past N
        return F.pad(x.double(), (0, 0, 0, 0, 0, pad)).view(B, NT, BT, H, -1).permute(0, 3, 1, 2, 4)

    qq, kk, vv, dd = chunks(q), chunks(k), chunks(v), chunks(do)
    G = chunks(g.clamp(min=-100.0)).cumsum(3)
    G_last = G[:, :, :, -1:, :]
    A = torch.tril(dd @ vv.transpose(-1, -2), -1)  # [.., i, j] strictly lower
    lower = torch.tril(torch.ones(BT, BT, dtype=torch.bool, device=q.device), -1)
    E = torch.where(lower[:, :, None], torch.exp(G[..., :, None, :] - G[..., None, :, :]).nan_to_num(0.0, 0.0, 0.0),
                    0.0)  # [.., i, j, d] e^(G_i - G_j), i > j
    dq_intra = torch.einsum("bhcij,bhcjd,bhcijd->bhcid", A, kk, E)
    dk_intra = torch.einsum("bhcij,bhcid,bhcijd->bhcjd", A, qq, E)
    r = scale * (dd * vv).sum(-1, keepdim=True)
    dq = scale * (dq_intra + (dd @ hs.double().transpose(-1, -2)) * torch.exp(G)) + r * kk
    dk = scale * dk_intra + (vv @ dhs.double().transpose(-1, -2)) * torch.exp(G_last - G) + r * qq

    def tokens(x):
        return x.permute(0, 2, 3, 1, 4).reshape(B, NT * BT, H, Dk)[:, :N]

    return tokens(dq), tokens(dk)


def rel(x, ref) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def run_config(name, blocks, t, scale) -> dict:
    p = tl_plan(t["q"], t["v"], t["g"], IDENTITY, 64, diag=5)
    steps = []
    kc.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], t["h0"], None, t["dht"], scale, steps=steps, **blocks)
    for _, kernel, grid, args, kw in steps:  # every launch once, in order: HS, DHS written
        kernel[grid](*args, **kw)
    dqk = [(s, kernel, grid, list(args), kw) for s, kernel, grid, args, kw in steps if s.startswith("dqk")]
    hs, dhs, dq_buf, dk_buf = dqk[0][3][5], dqk[0][3][6], dqk[0][3][7], dqk[0][3][8]
    BT = blocks["BT"]
    row = dict(config=name, blocks=blocks)
    for mode in ("full", "state only (q = 0)", "intra only (dS_c = 0)"):
        q_in = torch.zeros_like(t["q"]) if mode.startswith("state") else t["q"]
        dhs_in = torch.zeros_like(dhs) if mode.startswith("intra") else dhs
        dq_buf.fill_(float("nan"))
        dk_buf.fill_(float("nan"))
        for _, kernel, grid, args, kw in dqk:
            args = list(args)
            args[0], args[6] = q_in, dhs_in
            kernel[grid](*args, **kw)
        if DEV == "cuda":
            torch.cuda.synchronize()
        ref_dq, ref_dk = chunk_terms(q_in, t["k"], t["v"], t["g"], t["do"], hs, dhs_in, BT, scale)
        row[mode] = dict(dq=rel(dq_buf, ref_dq), dk=rel(dk_buf, ref_dk), dk_nan=int(torch.isnan(dk_buf).sum()))
        if mode == "full":  # the dk error by token position in the chunk (4 bands) and channel (4 bands)
            err = (dk_buf.double() - ref_dk).pow(2)
            den = ref_dk.pow(2)
            N = err.shape[1]
            pos = torch.arange(N, device=err.device) % BT
            band_t = [float((err[:, (pos >= lo) & (pos < lo + BT // 4)].sum() / den[:, (pos >= lo) & (pos < lo + BT // 4)]
                             .sum()).sqrt()) for lo in range(0, BT, BT // 4)]
            Dk = err.shape[-1]
            band_d = [float((err[..., lo:lo + Dk // 4].sum() / den[..., lo:lo + Dk // 4].sum()).sqrt())
                      for lo in range(0, Dk, Dk // 4)]
            row["dk by token quarter"] = band_t
            row["dk by channel quarter"] = band_d
    return row


def main():
    B, N, H, D = (1, 100, 2, 64) if SMOKE else (1, 1008, 16, 128)
    torch.manual_seed(0)
    dt = torch.float32 if SMOKE else torch.bfloat16
    t = dict(q=torch.randn(B, N, H, D, dtype=dt, device=DEV), k=torch.randn(B, N, H, D, dtype=dt, device=DEV),
             v=torch.randn(B, N, H, D, dtype=dt, device=DEV), do=torch.randn(B, N, H, D, dtype=dt, device=DEV),
             g=-torch.rand(B, N, H, D, device=DEV) * 0.3, h0=torch.randn(B, H, D, D, device=DEV),
             dht=torch.randn(B, H, D, D, device=DEV))
    rows = []
    for name, blocks in CONFIGS:
        try:
            rows.append(run_config(name, blocks, t, D ** -0.5))
        except Exception as err:  # noqa: BLE001 (a fault ends the CUDA context: the rest would fail too)
            traceback.print_exc(limit=3)
            rows.append(dict(config=name, error=f"{type(err).__name__}: {err}"[:300]))
            if DEV == "cuda" and "illegal" in str(err).lower():
                break
        print(f"{name} done at {time.time() - START:.0f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter)"
    (OUT / "linear_attention_gla_bwd_dk64_s31.json").write_text(json.dumps(dict(device=dev, rows=rows), indent=1))
    print(f"\n{dev}; B{B} N{N} H{H} d{D} {dt}, weak decays: relative error against the chunk formulas in float64 "
          "from the kernel's own S_c / dS_c")
    print("config | full dq, dk | state only dq, dk | intra only dq, dk | full dk by token quarter | by channel "
          "quarter")
    for r in rows:
        if "error" in r:
            print(f"{r['config']} | {r['error']}")
            continue
        cells = [f"{r[m]['dq']:.2e}, {r[m]['dk']:.2e}" + (f" ({r[m]['dk_nan']} NaN)" if r[m]["dk_nan"] else "")
                 for m in ("full", "state only (q = 0)", "intra only (dS_c = 0)")]
        bands = [" ".join(f"{x:.1e}" for x in r[key]) for key in ("dk by token quarter", "dk by channel quarter")]
        print(f"{r['config']} | " + " | ".join(cells + bands))
    print(f"{time.time() - START:.0f} s")


if __name__ == "__main__":
    main()

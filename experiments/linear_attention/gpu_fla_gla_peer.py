"""FLA's chunk_gla forward (and forward + backward) timed on its own, with no deadline (issue 33's peer).

gpu_gla.py gives FLA's autotuned compiles 87 s in a side process; twice (session 28, 29) that was not
enough. This script only times the peer: a tiny call first (compiles and autotunes what it can), then
the benchmark shape B16 H16 N4096 d128 bf16 (log-sigmoid gates, FLA's (B, T, H, K) layout), printing
how long each phase took. Run alone with a generous timeout:

    PYTHONPATH=/tmp/site:. timeout 400 python3 experiments/linear_attention/gpu_fla_gla_peer.py
"""
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

OUT = Path(os.environ.get("OUT", "/tmp/out"))


def make(b, t, h, k, v, grad=False):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, t, h, k, device="cuda", generator=gen).bfloat16()
    kk = torch.randn(b, t, h, k, device="cuda", generator=gen).bfloat16()
    vv = torch.randn(b, t, h, v, device="cuda", generator=gen).bfloat16()
    g = F.logsigmoid(torch.randn(b, t, h, k, device="cuda", generator=gen) + 4.0).float()
    ins = [q, kk, vv, g]
    if grad:
        ins = [x.requires_grad_() for x in ins]
    return ins


def main():
    t0 = time.time()
    row = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, shape=(16, 4096, 16, 128, 128))
    try:
        import fla
        from fla.ops.gla import chunk_gla
        row["fla"] = getattr(fla, "__version__", "?")
    except Exception as err:  # noqa: BLE001
        row["error"] = f"import: {err}"
        print(row)
        return
    scale = 128 ** -0.5
    tiny = make(1, 256, 16, 128, 128)
    chunk_gla(*tiny, scale=scale)
    torch.cuda.synchronize()
    row["tiny_s"] = round(time.time() - t0, 1)
    print(f"tiny forward ready at {row['tiny_s']} s", flush=True)
    q, k, v, g = make(16, 4096, 16, 128, 128)
    fwd = lambda: chunk_gla(q, k, v, g, scale=scale)  # noqa: E731
    fwd()
    torch.cuda.synchronize()
    row["big_ready_s"] = round(time.time() - t0, 1)
    print(f"big forward ready at {row['big_ready_s']} s", flush=True)
    row["fwd_ms"] = do_bench(fwd, warmup=50, rep=300)
    copy_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, g)) + v.numel() * 2
    row["copy_bound_bytes"] = copy_bytes
    print(f"chunk_gla forward {row['fwd_ms']:.3f} ms at {time.time() - t0:.0f} s", flush=True)
    try:
        ins = make(16, 4096, 16, 128, 128, grad=True)
        out = chunk_gla(*ins, scale=scale)[0]
        do = torch.randn_like(out)
        out.backward(do)
        torch.cuda.synchronize()
        row["bwd_ready_s"] = round(time.time() - t0, 1)

        def fwd_bwd():
            for x in ins:
                x.grad = None
            chunk_gla(*ins, scale=scale)[0].backward(do)

        row["fwd_bwd_ms"] = do_bench(fwd_bwd, warmup=20, rep=200)
        print(f"chunk_gla forward+backward {row['fwd_bwd_ms']:.3f} ms at {time.time() - t0:.0f} s", flush=True)
    except Exception as err:  # noqa: BLE001
        row["bwd_error"] = f"{type(err).__name__}: {err}"[:300]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fla_chunk_gla_peer.json").write_text(json.dumps(row, indent=1))
    print(json.dumps(row))


if __name__ == "__main__":
    main()

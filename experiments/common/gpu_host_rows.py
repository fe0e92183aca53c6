"""Issue 31's three host rows still over 40 us (session 36 call 4: fft_conv 86.2, attention N256 recording a gradient
69.5, paged decode 48.2 us a call on the H100's host), timed beside the torch code each stands for and split into
their parts on the same host (session 37, HG; experiments/common/gpu_script.py's scaffold).

* rows: host us a call (back-to-back calls, synchronized around them, interleaved rounds, medians) of ours and
  torch's, and each one's GPU time from a CUDA graph; the forward rows give the first call's bits on calls 1..10.
  ``fft_conv (filter_spectrum)`` is fft_conv handed the filter's spectrum (made once by the caller): the call without
  the rfft of k.
* parts: what a row's call is made of, each alone on this host, us a call: an allocation (torch.empty as the
  recipes make their outputs, and q.new_empty), dispatch.eager_mode, a signature memo of five tensors,
  a kept launch of a tiny kernel (KeyedLaunch, as the recipes launch) and a JIT launch, torch.fft.rfft of the filter, an
  autograd.Function's apply saving five tensors (what recording a gradient adds), the current device's read.
* a cProfile of each row (top functions by own time, us a call: shares, cProfile inflates them).
* A/B of fft_conv.op.PAD_BY_CAT (the keyed Gluon call pads k by one cat with kept zeros before its rfft; on since
  call 2) on the fft_conv rows, on vs off in one process (host_rows.ab_recipes: ``--ab-rounds`` interleaved rounds of
  ``--ab-calls`` calls, medians, the outputs on vs off bit for bit, calls 1..10 with it on). Calls 2 and 4 also timed
  tiles.launch.KEEP_SIGNATURE_HASH (a memo hit's signature keeping its hash), removed after call 4 (0.92-1.01x, an
  LRU lookup 0.69 against 0.51 us: notes/host's decision log).

    PYTHONPATH=/tmp/site:. python experiments/common/gpu_host_rows.py [--rounds 3] [--calls 300]

JSON to $OUT/host_rows_s37.json after each row; a short table last.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_rows  # noqa: E402 (ab_recipes: one switch on vs off)
import host_time  # noqa: E402 (the rows' inputs and torch peers, as every earlier host run had them)
from experiments.common.gpu_script import Run, graph_ms, host_rounds, same_bits  # noqa: E402

ROWS = ("fft_conv", "fft_conv (filter_spectrum)", "attention N256 (grad recorded)", "attention N256", "paged decode")
AB = (("tilecore.ops.fft_conv.op:PAD_BY_CAT", ("fft_conv", "fft_conv (grad recorded)")),)


def table_of_rows():
    import tilecore
    from tilecore.ops.fft_conv.op import filter_spectrum

    table = {**host_time.cases(), **host_time.later_cases()}
    bf = dict(device=host_time.DEV[0], dtype=torch.bfloat16)
    u = torch.randn(2, 64, 1024, **bf)
    kf = torch.randn(64, 1024, device=host_time.DEV[0])
    spectrum = filter_spectrum(kf, 1024)

    def fft_torch():
        return torch.fft.irfft(torch.fft.rfft(u.float(), 2048) * torch.fft.rfft(kf, 2048), 2048)[..., :1024].to(u.dtype)
    table["fft_conv (filter_spectrum)"] = (lambda: tilecore.fft_conv(u, spectrum), fft_torch)
    return table


@triton.jit
def _touch(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def parts(run: Run, calls: int) -> dict:
    """Each part alone, us a call (interleaved rounds)."""
    from tilecore import dispatch
    from tilecore.tiles.eager import apply as eager_apply
    from tilecore.tiles.launch import LRU, CachedLaunch, KeyedLaunch, SignatureMemo, signature

    dev = host_time.DEV[0]
    bf = dict(device=dev, dtype=torch.bfloat16)
    q = torch.randn(4, 1, 32, 128, **bf)
    qs, ks, vs = (torch.randn(1, 8, 256, 64, **bf).requires_grad_() for _ in range(3))
    kf = torch.randn(64, 1024, device=dev)
    zeros = torch.zeros(64, 1024, device=dev)
    padded = torch.cat((kf, zeros), 1)
    device = q.device

    class Save5(torch.autograd.Function):  # what recording a gradient adds: the node, five tensors saved, O wrapped
        @staticmethod
        def forward(ctx, a, b, c):
            out = torch.empty_like(a)
            lse = torch.empty(a.shape[:3], dtype=torch.float32, device=a.device)
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(a, b, c, out, lse)
            ctx.options = (False, 0.125, (-1, -1), 0.0, 0)
            return out

        @staticmethod
        def backward(ctx, dout):
            return dout, None, None

    def empties2():
        return torch.empty_like(qs), torch.empty(qs.shape[:3], dtype=torch.float32, device=device)

    memo = SignatureMemo()  # (tiles.launch.signature's memo, as each op's call site keeps one)
    kc = torch.randn(64, 64, 8, 128, **bf)
    lens = torch.full((4,), 1000, dtype=torch.int32, device=dev)
    tbl = torch.arange(64, dtype=torch.int32, device=dev).view(4, 16)
    fns = {
        "torch.empty bf16 (4,1,32,128)": lambda: torch.empty((4, 1, 32, 128), dtype=torch.bfloat16, device=device),
        "q.new_empty (4,1,32,128)": lambda: q.new_empty((4, 1, 32, 128)),
        "torch.empty f32 (70000,)": lambda: torch.empty(70000, dtype=torch.float32, device=device),
        "eager_mode(q,k,v) no grad": lambda: dispatch.eager_mode(q, q, q),
        "eager_mode(q,k,v) grad": lambda: dispatch.eager_mode(qs, ks, vs),
        "torch.cuda.current_device": torch.cuda.current_device if dev == "cuda" else lambda: None,
        "rfft of k (64,1024) n=2048": lambda: torch.fft.rfft(kf, n=2048),
        "Function apply, 2 empties, 5 saved": lambda: eager_apply(Save5, qs, ks, vs),
        "2 empties alone (out, lse)": empties2,
        "signature memo, 5 tensors": lambda: memo(q, kc, kc, lens, tbl, False, None, -1, -1, 0.0),
    }
    # an LRU lookup of a call's signature (a plan's or recipe's)
    key5 = signature(q, kc, kc, lens, tbl, False, None, -1, -1, 0.0)
    if key5 is not None:
        table5 = LRU(8)
        table5.put(key5, 1)
        fns["LRU get, 5-tensor signature"] = lambda: table5.get(key5)
    fns["q.new_empty f32 (4,1,32,128) by dtype="] = lambda: q.new_empty((4, 1, 32, 128), dtype=torch.float32)
    fns["torch.empty f32 (4,1,32,128)"] = lambda: torch.empty((4, 1, 32, 128), dtype=torch.float32, device=device)
    fns["torch.cat (64,1024) f32 + kept zeros"] = lambda: torch.cat((kf, zeros), 1)
    fns["rfft of the padded (64,2048)"] = lambda: torch.fft.rfft(padded)
    if dev == "cuda":  # one kept launch of a tiny kernel (KeyedLaunch: what each recipe launch is)
        x = torch.zeros(64, device=dev)
        bound = KeyedLaunch(CachedLaunch(_touch), ("host_rows_s37", 1), (1,), dict(BLOCK=64))
        for _ in range(3):
            bound((x, 64))
        fns["one kept launch (KeyedLaunch)"] = lambda: bound((x, 64))
        fns["one JIT launch (kernel[grid])"] = lambda: _touch[(1,)](x, 64, BLOCK=64)
    res = host_rounds(fns, rounds=3, calls=calls)
    for name in fns:
        run.row(f"part: {name}", us=res[f"{name}_us"], rounds=res[f"{name}_us_rounds"])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile", type=int, default=300)
    ap.add_argument("--deadline", type=float, default=52.0)
    ap.add_argument("--ab-rounds", type=int, default=7)
    ap.add_argument("--ab-calls", type=int, default=500)
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names ('' none)")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors, a few calls: the script's plumbing")
    a = ap.parse_args()
    if a.smoke:
        host_time.DEV[0] = "cpu"
        a.calls, a.rounds, a.profile, a.deadline, a.ab_calls = 3, 1, 3, 600.0, 3
    run = Run("host_rows_s37", deadline=a.deadline)
    run.extra.update(calls=a.calls, rounds=a.rounds)
    table = table_of_rows()
    for name in [r for r in a.rows.split(",") if r]:
        if run.left() < 0:
            run.row(name, skipped="deadline")
            continue
        ours, peer = table[name]

        def one(name=name, ours=ours, peer=peer):
            ours()
            row = {}
            if "grad" not in name:
                outs = []
                for _ in range(10):
                    y = ours()
                    outs.append([t.detach().clone() for t in (y if isinstance(y, (tuple, list)) else (y,))])
                row["same_bits_1_10"] = all(same_bits(outs[0], o) for o in outs[1:])
            res = host_rounds({"ours": ours, "torch": peer}, rounds=a.rounds, calls=a.calls)
            row.update(ours_us=res["ours_us"], torch_us=res["torch_us"], rounds=[res["ours_us_rounds"],
                                                                                 res["torch_us_rounds"]])
            if not a.smoke:
                row.update(ours_graph_us=round(1e3 * graph_ms(ours), 2), torch_graph_us=round(1e3 * graph_ms(peer), 2))
            row["profile"] = host_time.profile_rows({name: (ours, peer)}, [name], a.profile, top=8)[name]
            run.row(name, **row)
        run.attempt(name, one)
    for switch, names in AB:
        for name in names:
            if run.left() < 8:
                run.row(f"A/B {switch.split(':')[1]} {name}", skipped="deadline")
                continue
            ours, peer = table[name]
            ab = host_rows.ab_recipes(name, ours, peer, 1 if a.smoke else a.ab_rounds, a.ab_calls, switch)
            run.row(f"A/B {switch.split(':')[1]} {name}", **ab, on_over_off=round(ab["on_us"] / ab["off_us"], 3)
                    if "on_us" in ab else None)
    run.attempt("parts", parts, run, a.calls)
    for r in run.rows:
        if isinstance(r.get("profile"), list):
            print(f"  {r['name'][:30]:30s} own us: " + "; ".join(f"{fn.split(':')[-1][:28]} {own:.1f}"
                                                               for own, _, _, fn in r["profile"][:4]))
    run.finish(["name", "ours_us", "torch_us", "ours_graph_us", "torch_graph_us", "same_bits_1_10", "us", "on_us",
                "off_us", "on_over_off", "same_bits_on_vs_off", "error"])


if __name__ == "__main__":
    main()

"""Eager host time a call, each op against the torch op it replaces (issue 31's target: <= 40 us), and a
check that the cached path (plans per signature, launches by key) gives the bits the first call gave.

Host time: back-to-back calls on small inputs whose GPU work is shorter than the host's, timed on the
host and divided by the calls (the GPU queue never empties then: what a user's eager loop sees).

    python experiments/common/host_time.py [--calls 3000] [--json out.json]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def cases():
    import tilecore
    bf = dict(device="cuda", dtype=torch.bfloat16)
    a, b = torch.randn(256, 128, **bf), torch.randn(128, 256, **bf)
    a8 = torch.randn(256, 128, device="cuda").to(torch.float8_e4m3fn)
    b8 = torch.randn(256, 128, device="cuda").to(torch.float8_e4m3fn).t()
    s = torch.ones((), device="cuda")
    x = torch.randn(64, 4096, **bf)
    h = torch.randn(4096, 4096, **bf) / 64
    q = torch.randn(1, 32, 1, 128, **bf)
    k = torch.randn(1, 8, 4096, 128, **bf)
    qs, ks, vs = (torch.randn(1, 8, 256, 64, **bf) for _ in range(3))
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    qg, kg, vg = (t.clone().requires_grad_() for t in (qs, ks, vs))
    xg = x.clone().requires_grad_()
    return {
        # name: (tilecore call, torch peer)
        "gemm": (lambda: tilecore.gemm(a, b), lambda: a @ b),
        "gemm_fp8": (lambda: tilecore.gemm_fp8(a8, b8, s, s), lambda: torch._scaled_mm(a8, b8, s, s, out_dtype=torch.bfloat16)),
        "hadamard": (lambda: tilecore.hadamard_transform(x), lambda: x @ h[:4096, :4096]),
        "decode": (lambda: tilecore.attention(q, k, k),
                   lambda: F.scaled_dot_product_attention(q, k, k, enable_gqa=True)),
        "attention N256": (lambda: tilecore.attention(qs, ks, vs), lambda: F.scaled_dot_product_attention(qs, ks, vs)),
        "gemm (grad recorded)": (lambda: tilecore.gemm(ag, bg), lambda: ag @ bg),
        "hadamard (grad recorded)": (lambda: tilecore.hadamard_transform(xg), lambda: xg @ h),
        "attention N256 (grad recorded)": (lambda: tilecore.attention(qg, kg, vg),
                                           lambda: F.scaled_dot_product_attention(qg, kg, vg)),
    }


def per_call_us(fn, calls):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def same_bits_each_call():
    """First call (planned, launched the checked way), second (keyed first launch), tenth (cached):
    identical outputs and gradients."""
    import tilecore
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    results = {}
    inputs = {
        "gemm": [torch.randn(300, 72, **bf, requires_grad=True), torch.randn(72, 264, **bf, requires_grad=True)],
        "hadamard": [torch.randn(33, 1024, **bf, requires_grad=True)],
        "attention causal gqa": [torch.randn(2, 8, 300, 128, **bf, requires_grad=True),
                                 torch.randn(2, 2, 300, 128, **bf, requires_grad=True),
                                 torch.randn(2, 2, 300, 128, **bf, requires_grad=True)],
        "attention d64": [torch.randn(1, 4, 1000, 64, **bf, requires_grad=True) for _ in range(3)],
        "decode": [torch.randn(2, 32, 1, 128, **bf), torch.randn(2, 8, 3000, 128, **bf),
                   torch.randn(2, 8, 3000, 128, **bf)],
    }
    fns = {"gemm": tilecore.gemm, "hadamard": tilecore.hadamard_transform,
           "attention causal gqa": lambda q, k, v: tilecore.attention(q, k, v, causal=True),
           "attention d64": tilecore.attention, "decode": tilecore.attention}
    for name, ins in inputs.items():
        outs, g = [], None
        for i in range(10):
            for t in ins:
                t.grad = None
            y = fns[name](*ins)
            g = torch.randn_like(y) if g is None else g  # the same gradient each call
            if y.requires_grad:
                y.backward(g)
            outs.append([y.detach().clone()] + [t.grad.clone() for t in ins if t.grad is not None])
        same = all(all(torch.equal(a, b) for a, b in zip(outs[0], o)) for o in outs[1:])
        results[name] = same
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for name, (ours, peer) in cases().items():
        try:
            rows.append({"op": name, "tilecore_us": per_call_us(ours, a.calls), "torch_us": per_call_us(peer, a.calls)})
        except Exception as err:  # noqa: BLE001
            rows.append({"op": name, "error": f"{type(err).__name__}: {err}"})
    bits = same_bits_each_call()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "host_us": rows, "same_bits_each_call": bits}, f, indent=1)
    print("same bits on calls 1..10 (outputs and gradients):", bits)
    print(f"{'op':34s} {'tilecore us':>12s} {'torch us':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['op']:34s} {r['error']}")
        else:
            print(f"{r['op']:34s} {r['tilecore_us']:12.1f} {r['torch_us']:9.1f}")


if __name__ == "__main__":
    main()

"""GPU check of attention at two size limits, forward and backward against float64, bf16:

grid: more than 65535 (batch, head) pairs (a CUDA grid's second and third axes stop there; every
    attention launch puts batch x heads on the first axis since session 21), for the Gluon paths
    (D 64), the tl paths (D 96) and the split-key path (one query).
offsets: q, k, v (and dO) in (batch, sequence, heads, D) layout, transposed views, with rows past
    2^31 elements: a decode step against a 2.1M-key cache (its last keys carry the answer: the
    earlier ones are scaled down), the tl forward and backward (D 96) and the Gluon ones (D 128)
    with 1024 rows of 24576 heads. Only some heads are checked (the reference is float64).

    PYTHONPATH=. python3 experiments/attention/grid_limits_probe.py [--parts grid,offsets]
"""
import argparse

import torch

from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference

CASES = [  # B, Hq, Hkv, N, Nk, D, causal
    (8200, 8, 8, 65, 65, 64, True),    # Gluon forward and backward, the tl preprocess (65600 heads)
    (8200, 8, 4, 65, 70, 96, True),    # tl forward, preprocess, dk/dv and dq
    (8200, 8, 8, 1, 40, 64, False),    # split-key forward, tl/Gluon backward
]


def grid_limits():
    ok_all = True
    for b, hq, hkv, n, nk, d, causal in CASES:
        torch.manual_seed(0)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        out = attention(q, k, v, causal=causal)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = attention_reference(q64, k64, v64, causal=causal)[0]
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
        errs = [accuracy.error_over_floor(out.detach(), ref)] + [accuracy.error_over_floor(g, r)
                                                                  for g, r in zip(grads, ref_grads)]
        ok = all(e <= 3.0 for e in errs) and all(torch.isfinite(g).all() for g in grads)
        ok_all &= ok
        print(f"B{b} H{hq}/{hkv} N{n} Nk{nk} D{d} {'causal' if causal else 'full'}: err/floor out {errs[0]:.2f} "
              f"dq {errs[1]:.2f} dk {errs[2]:.2f} dv {errs[3]:.2f} -> {'ok' if ok else 'FAIL'}", flush=True)
        del q, k, v, out, dout, grads, q64, k64, v64, ref, ref_grads
        torch.cuda.empty_cache()
    print("grid limits:", "ok" if ok_all else "FAIL")
    return ok_all


def _bnhd(b, n, h, d, requires_grad=False):
    """A (b, h, n, d) view of a (b, n, h, d) tensor (the leaf, returned too)."""
    leaf = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    leaf.requires_grad_(requires_grad)
    return leaf.transpose(1, 2), leaf


def _errors(outs, refs):
    return [accuracy.error_over_floor(o, r) for o, r in zip(outs, refs)]


def decode_far_keys():
    """One query of 32 q heads against 2^21 + 4096 keys of 8 kv heads, D 128, cache in (b, keys,
    heads, D) layout: keys past 2^21 start past 2^31 elements. The keys before them are scaled by
    1/64, so the far keys carry most of each row's weight."""
    hq, hkv, d, nk, near = 32, 8, 128, (1 << 21) + 4096, 1 << 21
    q = torch.randn(1, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k, k_leaf = _bnhd(1, nk, hkv, d)
    v, _ = _bnhd(1, nk, hkv, d)
    k_leaf[:, :near] /= 64
    assert k.stride(2) * (nk - 1) > 2**31
    out, lse = attention(q, k, v, return_lse=True)
    errs = []
    for hk in range(hkv):  # float64 reference a kv head at a time (2 GB each)
        g = hq // hkv
        ref, ref_lse = attention_reference(q[:, hk * g:(hk + 1) * g].double(), k[:, hk:hk + 1].double(),
                                           v[:, hk:hk + 1].double())
        errs.append(accuracy.error_over_floor(out[:, hk * g:(hk + 1) * g], ref))
        errs.append(float((lse[:, hk * g:(hk + 1) * g].double() - ref_lse).abs().max()) * 1e3)  # x 1e-3
    worst, lse_err = max(errs[0::2]), max(errs[1::2]) / 1e3
    ok = worst <= 3.0 and lse_err < 1e-3
    print(f"decode B1 H{hq}/{hkv} Nk{nk} D{d} (b, keys, heads, D): err/floor {worst:.2f}, lse err {lse_err:.1e} "
          f"-> {'ok' if ok else 'FAIL'}", flush=True)
    del q, k, v, k_leaf, out, lse
    torch.cuda.empty_cache()
    return ok


def rows_past_2_31(d, heads=24576, n=1024, group=8):
    """Forward and backward with q, dO in (1, n, heads, d) layout (rows from n * 2^31 / (heads d) on
    start past 2^31 elements), causal; checked on the first and last kv heads' groups."""
    hkv = heads // group
    q, q_leaf = _bnhd(1, n, heads, d, requires_grad=True)
    k, k_leaf = _bnhd(1, n, hkv, d, requires_grad=True)
    v, v_leaf = _bnhd(1, n, hkv, d, requires_grad=True)
    dout, _ = _bnhd(1, n, heads, d)
    assert q.stride(2) * (n - 1) > 2**31
    out = attention(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    worst = []
    for hk in (0, hkv - 1):
        qs = slice(hk * group, (hk + 1) * group)
        q64, k64, v64 = (t.detach().double().requires_grad_()
                         for t in (q[:, qs], k[:, hk:hk + 1], v[:, hk:hk + 1]))
        ref = attention_reference(q64, k64, v64, causal=True)[0]
        refs = (ref,) + torch.autograd.grad(ref, (q64, k64, v64), dout[:, qs].double())
        worst.append(_errors((out[:, qs].detach(), dq[:, qs], dk[:, hk:hk + 1], dv[:, hk:hk + 1]), refs))
    errs = [max(e[i] for e in worst) for i in range(4)]
    ok = all(e <= 3.0 for e in errs)
    print(f"B1 H{heads}/{hkv} N{n} D{d} causal (b, n, heads, D): err/floor out {errs[0]:.2f} dq {errs[1]:.2f} "
          f"dk {errs[2]:.2f} dv {errs[3]:.2f} -> {'ok' if ok else 'FAIL'}", flush=True)
    del q, k, v, dout, out, dq, dk, dv, q_leaf, k_leaf, v_leaf
    torch.cuda.empty_cache()
    return ok


def offsets():
    ok = decode_far_keys()
    ok &= rows_past_2_31(96)   # tl forward, preprocess, dk/dv, dq
    ok &= rows_past_2_31(128)  # Gluon forward and backward (TMA), the tl preprocess
    print("offsets past 2^31:", "ok" if ok else "FAIL")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="grid,offsets")
    parts = ap.parse_args().parts.split(",")
    if "grid" in parts:
        grid_limits()
    if "offsets" in parts:
        offsets()


if __name__ == "__main__":
    main()

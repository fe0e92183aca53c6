"""GPU check that attention launches with more than 65535 (batch, head) pairs (a CUDA grid's second
and third axes stop there; every attention launch puts batch x heads on the first axis since
session 21): forward and backward against float64, bf16, for the Gluon paths (D 64), the tl paths
(D 96) and the split-key path (one query).

    PYTHONPATH=. python3 scripts/device/grid_limits_probe.py
"""
import torch

from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference

CASES = [  # B, Hq, Hkv, N, Nk, D, causal
    (8200, 8, 8, 65, 65, 64, True),    # Gluon forward and backward, the tl preprocess (65600 heads)
    (8200, 8, 4, 65, 70, 96, True),    # tl forward, preprocess, dk/dv and dq
    (8200, 8, 8, 1, 40, 64, False),    # split-key forward, tl/Gluon backward
]


def main():
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


if __name__ == "__main__":
    main()

"""With torch.use_deterministic_algorithms(True), tilecore.attention's gradients are bitwise the same
across two runs (dq then comes from the Gluon dq kernel at every head dim: plan.plan_backward's
deterministic switch), and close to the default run's. One GPU call:

    PYTHONPATH=. python3 experiments/attention/deterministic_check.py
"""
import argparse

import torch

import tilecore


def main():
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    torch.manual_seed(0)
    for d in (64, 128):
        for causal in (False, True):
            q, k, v = (torch.randn(2, 8, 1500, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn_like(q)

            def grads():
                for t in (q, k, v):
                    t.grad = None
                tilecore.attention(q, k, v, causal=causal).backward(do)
                return [t.grad.clone() for t in (q, k, v)]
            default = grads()
            torch.use_deterministic_algorithms(True)
            try:
                a, b = grads(), grads()
            finally:
                torch.use_deterministic_algorithms(False)
            same = all(torch.equal(x, y) for x, y in zip(a, b))
            diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, default))
            print(f"D={d} causal={causal}: deterministic runs bitwise equal: {same}; max |diff| to the default run "
                  f"{diff:.1e}", flush=True)


if __name__ == "__main__":
    main()

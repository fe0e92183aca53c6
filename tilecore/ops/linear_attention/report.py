"""``python -m tilecore.ops.linear_attention.report``: compile each linear-attention kernel for sm_90a at
the blocks its plan picks for the issue's shapes (no GPU needed) and print registers, spills and shared
memory (tilecore.tiles.report's table). ``--json`` prints JSON (the tests read it); ``--ptx DIR``
writes each kernel's PTX."""
from __future__ import annotations

import sys

# (name, feature, decay kind, Dk, Dv, q/k heads per v head group, beta / D / z (Mamba-2), initial state)
CASES = [
    ("linear d128", 0, 0, 128, 128, 1, False, False),
    ("simple gla d128", 0, 1, 128, 128, 1, False, True),
    ("gla d128", 0, 2, 128, 128, 1, False, True),
    ("based d16 v64", 1, 0, 16, 64, 1, False, False),
    ("based d16 v64 decay", 1, 1, 16, 64, 1, False, True),
    ("mamba2 p64 s128", 0, 1, 128, 64, 8, True, True),
    ("d256", 0, 1, 256, 256, 1, False, False),
]


def variants() -> list:
    """(name, kernel, args, num_warps, is_gluon) for the forward, dQ, dK/dV and step kernels of CASES."""
    import torch

    from tilecore.ops.linear_attention import launch
    from tilecore.ops.linear_attention.plan import tl_plan

    out = []
    B, N, Hqk = 1, 128, 2
    bf16, f32 = torch.bfloat16, torch.float32
    for name, feature, kind, dk, dv, group, mamba, h0 in CASES:
        H = Hqk * group
        q = torch.empty(B, N, Hqk, dk, dtype=bf16)
        k, v = torch.empty_like(q), torch.empty(B, N, H, dv, dtype=bf16)
        fdim = launch.feature_rows(feature, dk)
        g = None if kind == 0 else torch.empty(B, N, H, *((dk,) if kind == 2 else ()), dtype=f32)
        beta = torch.empty(B, N, H, dtype=f32) if mamba else None
        d_skip = torch.empty(H, dv, dtype=f32) if mamba else None
        z = torch.empty_like(v) if mamba else None
        state = torch.empty(B, H, fdim, dv, dtype=f32) if h0 else None
        ht = torch.empty(B, H, fdim, dv, dtype=f32)
        plan = tl_plan(q, v, g, feature)
        o = torch.empty_like(v)
        calls = [("forward", launch.forward_call(plan, q, k, v, g, beta, d_skip, z, state, o, ht, None, 1.0,
                                                  feature))]
        cfg = plan.config
        dq = torch.empty(B, N, H, dk, dtype=f32)
        dk_parts = torch.empty(cfg["dkv_value_blocks"], B, N, H, dk, dtype=f32)
        dv_parts = torch.empty(cfg["dkv_key_blocks"], B, N, H, dv, dtype=f32)
        do = torch.empty(B, N, H, dv, dtype=f32)
        r = torch.empty(B, N, H, dtype=f32) if launch.strict_diagonal(feature, g) else None
        dq_call, dkv_call = launch.backward_calls(plan, do, q, k, v, g, beta, state, ht, dq, dk_parts, dv_parts,
                                                  state, 1.0, feature, r)
        calls += [("backward dq", dq_call), ("backward dk/dv", dkv_call)]
        g1 = None if g is None else g[:, 0]
        beta1 = None if beta is None else beta[:, 0]
        calls.append(("step", launch.step_call(plan, q[:, 0], k[:, 0], v[:, 0], g1, beta1, d_skip,
                                               None if z is None else z[:, 0], ht, o[:, 0], 1.0, feature)))
        for what, (kernel, _, args, kw) in calls:
            kw = dict(kw)
            warps = kw.pop("num_warps")
            named = dict(zip(kernel.arg_names, args), **kw)
            out.append((f"{what} {name}", kernel, named, warps, False))
    return out


def main(argv=None) -> int:
    from tilecore.tiles import report

    return report.main(variants, argv, prog="python -m tilecore.ops.linear_attention.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())

"""The lead's safety net for session 37's default (configs.ROTARY_IN_KERNEL_CASES: no-grad calls of
attention(..., rotary=(cos, sin)) at D128 and D64 causal go to gluon_forward.forward): the public call,
under torch.no_grad, against the float64 reference on the features the route now serves: GQA, window,
softcap, N != Nk, partial rotary_dim, interleaved pairs, and the same calls with the route off (the
turned path) beside them.

    PYTHONPATH=. python3 experiments/attention/gpu_rotary_routed_check.py      # H100, ~30 s
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.gpu_script import Run, check  # noqa: E402

import tilecore  # noqa: E402
from tilecore.ops.attention_rotary import configs, plan  # noqa: E402
from tilecore.ops.attention_rotary.reference import rotary_attention_reference  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

# name, B, Hq, Hkv, N, Nk, D, rotary_dim, causal, window, softcap, interleaved
CASES = [
    ("d128 full gqa 8/2", 2, 8, 2, 1024, 1024, 128, 128, False, (-1, -1), 0.0, False),
    ("d128 causal window 256 softcap 30", 1, 4, 4, 1500, 1500, 128, 128, True, (256, 0), 30.0, False),
    ("d128 causal N<Nk interleaved", 1, 4, 4, 700, 1300, 128, 128, True, (-1, -1), 0.0, True),
    ("d128 full rotary_dim 64", 1, 4, 4, 1024, 1024, 128, 64, False, (-1, -1), 0.0, False),
    ("d128 full rotary_dim 48 (turned)", 1, 4, 4, 512, 512, 128, 48, False, (-1, -1), 0.0, False),
    ("d64 causal gqa 4/1 softcap 20", 2, 4, 1, 2048, 2048, 64, 64, True, (-1, -1), 20.0, False),
    ("d64 full (turned)", 1, 4, 4, 1024, 1024, 64, 64, False, (-1, -1), 0.0, False),
]


def main():
    run = Run("rotary_routed_check", deadline=80)
    for name, b, hq, hkv, n, nk, d, rd, causal, window, softcap, inter in CASES:
        def case():
            g = torch.Generator(device="cuda").manual_seed(hash(name) % 2**31)
            q = torch.randn(b, hq, n, d, device="cuda", generator=g).to(torch.bfloat16)
            k = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(torch.bfloat16)
            v = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(torch.bfloat16)
            pos = torch.arange(nk, device="cuda", dtype=torch.float64)[:, None]
            freq = 10000.0 ** (-torch.arange(rd // 2, device="cuda", dtype=torch.float64) / (rd // 2))
            cos, sin = (f(pos * freq).to(torch.bfloat16) for f in (torch.cos, torch.sin))
            ref, _ = rotary_attention_reference(q, k, v, cos, sin, interleaved=inter, causal=causal,
                                                window_size=window, softcap=softcap)
            path = plan.rotary_path(q, k, v, d ** -0.5, False, causal)
            with torch.no_grad():
                out = tilecore.attention(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                         rotary=(cos, sin), rotary_interleaved=inter)
                with patched(configs, ROTARY_IN_KERNEL_CASES=frozenset()):
                    turned = tilecore.attention(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                                rotary=(cos, sin), rotary_interleaved=inter)
            routed = check(out, ref, tol=3.0)
            off = check(turned, ref, tol=3.0)
            run.row(name, route=path, pass_=routed["pass"], err_over_floor=routed["err_over_floor"],
                    written=routed["written"], turned_pass=off["pass"], turned_err=off["err_over_floor"])
        run.attempt(name, case)
    run.finish(["name", "route", "pass_", "err_over_floor", "written", "turned_pass", "turned_err"])


if __name__ == "__main__":
    main()

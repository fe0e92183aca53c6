"""The carried forward (kernels.forward_gluon(..., carry=True)) against float64 next to the default:
error over the rounding floor of O and lse's largest difference, and where the two differ."""
import torch

from tilecore.accuracy import error_over_floor
from tilecore.ops.attention import kernels
from tilecore.ops.attention.reference import attention_reference

for d, causal, (b, hq, hkv, n, nk) in [(64, False, (2, 8, 2, 1000, 1000)), (64, True, (2, 8, 2, 1000, 1000)),
                                       (128, False, (2, 8, 2, 1000, 1000)), (128, True, (1, 4, 2, 4097, 1000))]:
    g = torch.Generator(device="cuda").manual_seed(n + d)
    mk = lambda h, length: torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = mk(hq, n), mk(hkv, nk), mk(hkv, nk)
    ref_o, ref_l = attention_reference(q.double(), k.double(), v.double(), causal=causal)
    res = {}
    for name, cfg in (("default", kernels.gluon_forward_config(d, n, nk, causal)),
                      ("carry", dict(kernels.GLUON_FORWARD[d], q_buffers=2, carry=True))):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((b, hq, n), float("nan"), device="cuda")
        kernels.forward_gluon(q, k, v, out, lse, causal, d ** -0.5, **cfg)
        res[name] = (out, lse)
    (o1, l1), (o2, l2) = res["default"], res["carry"]
    diff = (o1.float() - o2.float()).abs()
    rows = diff.amax(dim=-1).flatten().nonzero().numel()
    fin = l1.isfinite()
    print(f"D={d} causal={causal} B{b} H{hq}/{hkv} N{n} Nk{nk}: err/floor default {error_over_floor(o1, ref_o):.3f} "
          f"carry {error_over_floor(o2, ref_o):.3f}; max |O diff| {diff.max().item():.3g} in {rows} of "
          f"{b * hq * n} rows; max |lse diff| {(l1 - l2)[fin].abs().max().item():.3g}", flush=True)

"""attention_fp8's keyed calls hold tiles.switches.generation in their key: the plan (op._PLANS) and what is made from
it (the launch's layout, tiling and recipe, keyed by the same key) read configs, so a probe's ``switches.patched``
block that changes a configs table gets a plan of its own on the very inputs the shipped config ran on, and the first
call after the block the shipped plan again. CPU tensors keyed as CUDA calls are (host_testing's cpu_signature;
the real one keys CUDA tensors only); under Triton's interpreter the plan is the tl kernel's (configs.TL_INTERPRET),
else the emulation's."""
import torch

from host_testing import cpu_signature
from tilecore import dispatch
from tilecore.ops.attention_fp8 import attention_fp8, configs, launch, quantize_fp8
from tilecore.ops.attention_fp8 import op as fp8_op
from tilecore.tiles.switches import patched


def test_a_patched_table_is_planned_in_the_block_and_the_shipped_one_after_it(monkeypatch):
    monkeypatch.setattr(fp8_op, "signature", cpu_signature)  # (out_dtype, a torch.dtype, is keyed)
    for cache in (fp8_op._CHECKED, fp8_op._PLANS):
        cache.clear()
    made = []
    real = launch.plan
    monkeypatch.setattr(launch, "plan", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    g = torch.Generator().manual_seed(3)
    q8, qs = quantize_fp8(torch.randn(1, 2, 40, 32, generator=g), per="head")
    k8, ks = quantize_fp8(torch.randn(1, 2, 40, 32, generator=g), per="head")
    v8, vs = quantize_fp8(torch.randn(1, 2, 40, 32, generator=g), per="head")

    def calls(n=2):
        return [attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, causal=True, out_dtype=torch.float32)
                for _ in range(n)]

    interpreted = dispatch.interpreted(q8.device)
    shipped = calls()
    assert len(made) == 1  # the key's second call reuses its plan
    table = dict(configs.TL_INTERPRET, BLOCK_M=16)  # (another row tile: the same math a row)
    with patched(configs, TL_INTERPRET=table):
        variant = calls()
        assert len(made) == 2  # planned again inside the block, once
    after = calls(1)
    assert len(made) == 3  # and the shipped table again after it
    if interpreted:  # the tl kernel's plan carries the table
        assert made[0].path == made[2].path == "tl"
        assert made[1].config["BLOCK_M"] == 16 and made[0].config["BLOCK_M"] == made[2].config["BLOCK_M"] != 16
    else:
        assert [p.path for p in made] == ["emulate"] * 3
    for o in shipped[1:] + after:
        assert torch.equal(o, shipped[0])
    torch.testing.assert_close(variant[0], shipped[0], rtol=1e-5, atol=1e-5)
    for cache in (fp8_op._CHECKED, fp8_op._PLANS):
        cache.clear()

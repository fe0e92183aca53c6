"""The Gluon backward's dP accumulator from -delta without a softcap (config ``dp_from_delta``, the kernel's
DP_FROM_DELTA): the D128 configs that leave dQ to the dq kernel take it, the launch passes it, and the kernel
compiles for sm_90a with it (fewer spills than without it; wgmma not serialized). Its numbers are
checked against float64 on the GPU by experiments/attention/gpu_issue35_bwd.py (phases dchecks, delta)."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, launch, plan
from compiled_run import compiled_json


@pytest.mark.parametrize("n, causal, expect", [(2048, True, True), (512, False, True), (4096, True, False),
                                               (4096, False, False)])
def test_the_launch_passes_it_where_dq_comes_from_the_dq_kernel(fast_launch, monkeypatch, n, causal, expect):
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    q, do = (torch.randn(1, 2, 128, 128, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 2, 128, 128, dtype=torch.bfloat16) for _ in range(2))
    cfg = configs.gluon_backward_config(128, n, causal)
    assert (cfg["dq_from"] == "gluon") is expect
    fake = fast_launch(launch.GLUON_BWD)
    bwd_plan = plan.plan_backward(do, q, k, v, causal, 0.1, path="gluon", config=cfg)
    launch.launch_backward_gluon_kernel(bwd_plan, do, q, k, v, torch.randn(2, 2, 128), torch.zeros(1, 2, 128, 128),
                                        torch.empty_like(k), torch.empty_like(v), causal, 0.1)
    (grid, args), = fake.calls
    bound = dict(zip(launch.GLUON_BWD.kernel.arg_names, args))
    assert bound["DP_FROM_DELTA"] is expect and bound["SOFTCAP"] == 0


_COMPILE = """
import json
from tilecore.bench.reports import attention as report
from tilecore.ops.attention import configs
from tilecore.tiles.compile import has_hopper_instructions, resources
rows = {}
for on in (True, False):
    cfg = dict(configs.gluon_backward_config(128, 2048, True), dp_from_delta=on)
    compiled, _ = report.compile_gluon_backward(128, True, cfg=cfg)
    rows[str(on)] = dict(**vars(resources(compiled)), **has_hopper_instructions(compiled.asm["ptx"]))
print(json.dumps(rows))
"""


def test_the_d128_kernel_without_dq_compiles_without_spills():
    rows = compiled_json(_COMPILE)
    on, off = rows["True"], rows["False"]
    for row in (on, off):
        assert row["wgmma"] and row["tma"] and not row["wgmma_serialized"], row
    # sm_90a, ptxas of triton 3.6, causal: 4 + 4 bytes against 28 + 28 without it (the accumulator's -delta frees
    # delta's registers; not causal 0 against 48 + 48)
    assert on["spill_stores"] + on["spill_loads"] <= 8, on
    assert on["spill_stores"] + on["spill_loads"] < off["spill_stores"] + off["spill_loads"], (on, off)

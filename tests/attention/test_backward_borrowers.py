"""Every kernel that holds an AttentionBackward as a member (its step, walk and masks run on other tiles) compiles
for sm_90a: the varlen backward (``base.step_with`` with its sequences' rows and masks: dQ fused, lagged with a
softcap, after the kernel with a window, zero-tail), MLA's backward by pieces and the MLA backward by roles
(experiments/attention/mla_roles_kernel.py). A change to AttentionBackward (a field, a method's arguments) that one
of them does not follow fails here, in the backward's own tests, not in another op's."""
from compiled_run import compiled_json_lines

_CODE = r"""
import json, sys
sys.path.insert(0, ".")
import torch
from experiments.attention import mla_roles_kernel
from tilecore.ops.attention_varlen.gluon_backward import compiled_backward
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import TmaOperand
from tilecore.ops.attention.launch import row_stats_operand
from tilecore.ops.attention_mla.gluon_backward import attention_bwd_mla_kernel

def row(name, c):
    r = resources(c)
    print(json.dumps(dict(kernel=name, **has_hopper_instructions(c.asm["ptx"]), serialized=r.wgmma_serialized,
                          spills=r.spill_stores + r.spill_loads)), flush=True)

row("varlen fused d64 causal", compiled_backward(64, True))
row("varlen lagged d64 softcap", compiled_backward(64, False, softcap=2))
row("varlen after d128 window gqa", compiled_backward(128, True, window=True, group=4))
row("varlen zero-tail d64", compiled_backward(64, True, cfg=dict(block_m=64, block_n=64, stages=2, dq_from="fused",
                                                                 zero_tail=True)))
q = torch.empty(2, 16, 4096, 192, dtype=torch.bfloat16)
v = torch.empty(2, 16, 4096, 128, dtype=torch.bfloat16)
piece = lambda t, rows: TmaOperand(t, [1, 1, rows, 64]).descriptor()
args = dict(q_desc=piece(q, 64), k_desc=piece(q, 128), v_desc=piece(v, 128), do_desc=piece(v, 64),
            dk_desc=piece(q, 64), dv_desc=piece(v, 64),
            stats_desc=row_stats_operand(torch.empty(32, 2, 4096), 64).descriptor(),
            H=16, N=4096, Nk=4096, GROUP=1, scale=0.1, scale_log2e=0.1, num_bhk=32, head_group=8,
            schedule=torch.empty(64, dtype=torch.int32), left=0, right=0, tanh_scale=0.0, CAUSAL=True, STAGES=3,
            WINDOW=False, SOFTCAP=0)
row("mla pieces causal", compile_kernel(attention_bwd_mla_kernel, args, num_warps=4))
row("mla roles window", mla_roles_kernel.compiled(False, True))
"""


def test_every_holder_of_the_backward_compiles():
    rows = compiled_json_lines(_CODE, timeout=1200)
    assert [r["kernel"] for r in rows] == ["varlen fused d64 causal", "varlen lagged d64 softcap",
                                          "varlen after d128 window gqa", "varlen zero-tail d64", "mla pieces causal",
                                          "mla roles window"]
    for r in rows:
        assert r["wgmma"] and r["tma"] and r["mbarrier"] and not r["serialized"], r


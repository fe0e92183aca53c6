"""configs.ONE_LAUNCH_WHEN_RECORDING (issue 31's host time): an eager call recording a gradient on inputs the
split-key path serves is planned on the one-launch Gluon forward where that forward fits (Hopper, meta tensors
inside dispatch.pretend), and only then; the switch off, or no gradient recorded, keeps the split-key plan."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import configs
from tilecore.ops.attention import plan as attention_plan
from tilecore.ops.attention_decode import plan as decode_plan
from tilecore.tiles.switches import patched

META = torch.device("meta")


def _qkv(b, h, n, d, hkv=None, dv=None):
    hkv = hkv or h
    return (torch.empty(b, h, n, d, dtype=torch.bfloat16, device=META),
            torch.empty(b, hkv, n, d, dtype=torch.bfloat16, device=META),
            torch.empty(b, hkv, n, dv or d, dtype=torch.bfloat16, device=META))


@pytest.mark.parametrize("shape", [(1, 8, 256, 64), (1, 8, 256, 128), (2, 4, 64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_recording_call_takes_one_launch_where_gluon_fits(shape, causal):
    q, k, v = _qkv(*shape)
    with dispatch.pretend(dispatch.TARGETS["sm_90a"]):
        assert decode_plan.decode_fits(q, k)  # the inputs this switch is about
        scale = shape[-1] ** -0.5
        with patched(configs, ONE_LAUNCH_WHEN_RECORDING=True):
            recorded = attention_plan.plan_forward(q, k, v, causal, scale, recording=True)
            plain = attention_plan.plan_forward(q, k, v, causal, scale)
        with patched(configs, ONE_LAUNCH_WHEN_RECORDING=False):
            recorded_off = attention_plan.plan_forward(q, k, v, causal, scale, recording=True)
    assert recorded.path == "gluon"
    assert plain.path == "decode" and recorded_off.path == "decode"


def test_recording_call_keeps_split_keys_where_gluon_does_not_fit():
    """Head dims the Gluon forward does not take (96), and GPUs without it (sm_80): the split-key plan."""
    q, k, v = _qkv(1, 8, 256, 96)
    with patched(configs, ONE_LAUNCH_WHEN_RECORDING=True):
        with dispatch.pretend(dispatch.TARGETS["sm_90a"]):
            assert attention_plan.plan_forward(q, k, v, False, 96 ** -0.5, recording=True).path == "decode"
        q, k, v = _qkv(1, 8, 256, 64)
        with dispatch.pretend(dispatch.TARGETS["sm_80"]):
            assert attention_plan.plan_forward(q, k, v, False, 0.125, recording=True).path == "decode"

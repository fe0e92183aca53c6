"""Session 31's switches of Based's Gluon forward (issue 33): SEL_REG (the selections' A operand q / k from
registers) and PHIQ_REG (phi_q kept in registers as the A operand of o's phi_q S wgmmas, no phi_q buffer in shared
memory). On the CPU: they reach the kernel only where asked (or turned on in configs) and only with SEL_ASYNC 3, the
shipped launch keeps its arguments, and the kernel with both compiles for sm_90a with TMA and unserialized wgmma
within Hopper's shared memory at 3 stages (the stage PHIQ_REG's freed 40 KB pays for). The kernel runs on the GPU
only: experiments/linear_attention/gpu_forward_s31.py checks each variant against float64 there."""
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_based

BF = torch.bfloat16


def based_args(**kw):
    q = torch.empty(1, 128, 2, gluon_based.DK, dtype=BF)
    v = torch.empty(1, 128, 2, 64, dtype=BF)
    return gluon_based.launch_args(q, q, v, None, torch.empty_like(v), None, 0.25, 2, **kw)[1]


def test_off_unless_asked_and_the_kernel_defaults_off():
    assert not {"SEL_REG", "PHIQ_REG"} & set(based_args(chain=True, sel_async=3))
    args = based_args(chain=True, sel_async=3, sel_reg=True, phiq_reg=True)
    assert args["SEL_REG"] is True and args["PHIQ_REG"] is True and args["SEL_ASYNC"] == 3
    params = inspect.signature(gluon_based.based_fwd_gluon_kernel.fn).parameters
    assert params["SEL_REG"].default is False and params["PHIQ_REG"].default is False
    assert configs.GLUON_BASED_SEL_REG in (False, True) and configs.GLUON_BASED_PHIQ_REG in (False, True)


def test_forward_drops_them_without_sel_async_3(monkeypatch):
    """gluon_based.forward passes SEL_REG / PHIQ_REG only with SEL_ASYNC 3 (the kernel's static_assert otherwise):
    the launch it would make, captured before it runs."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_launch_args(*a, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(gluon_based, "launch_args", fake_launch_args)
    q = torch.randn(1, 64, 2, gluon_based.DK).to(BF)
    v = torch.randn(1, 64, 2, 64).to(BF)
    for sel_async, expect in ((3, True), (2, False), (0, False)):
        seen.clear()
        with pytest.raises(Stop):
            gluon_based.forward(q, q, v, None, 0.25, False, sel_async=sel_async, sel_reg=True, phiq_reg=True)
        assert seen["sel_reg"] is expect and seen["phiq_reg"] is expect


# one compile (~20-40 s on 2 cores): both switches at 3 stages with initial and final states: 3456 B spilled (the
# shipped kernel with states 2816 B: the states' [64, 128] pointer tiles in start / finish, outside the walk;
# without states 272 B against the shipped 124 B), 182,800 B of shared memory (shipped at 2 stages 199,200)
CODE = ("import json; from tilecore.ops.linear_attention.gluon_based import compile_report; "
        "print(json.dumps(compile_report(states=True, stages=3, chain=True, sel_async=3, sel_reg=True, "
        "phiq_reg=True)))")


def test_sel_reg_phiq_reg_compile_for_sm90a_at_3_stages():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["tma"] and r["wgmma"] and r["mbarrier"], r
    assert not r["wgmma_serialized"], r
    assert r["shared"] <= 227 * 1024, r
    assert r["threads"] == 384, r
    assert r["spill_bytes"] <= 3584, r

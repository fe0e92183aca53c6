"""The FP8 Hopper kernel's EARLY_EXP2 (session 31: gluon_fp8.fp8_softmax_early) compiles for sm_90a on this GPU-less
machine: the exponentials against the running max, the factor 2^(m_old - m_new) and the far branch (a warp vote and
a uniform branch inside the asm, one label an asm instance by ${:uid}) assemble; D128 non-causal (the headline call's
specialization) with 0 spills and wgmma not serialized; every exponential of P is in the softmax block once (the
fallback's 64 in branches of their own, taken only by a warp whose row max grew by more than EARLY_LIMIT). The numbers
(and the far branch on inputs that take it) are checked on the GPU by experiments/attention_fp8/gpu_speed_s31.py."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, sys
sys.path.insert(0, "experiments/attention_fp8")
import sass_fp8

k, r = sass_fp8.compile_variant(128, False, dict(early_exp2=True))
ptx = k.asm["ptx"]
rows = sass_fp8.sass_rows(k.asm["cubin"])
ops = [sass_fp8.opcode(i) for _, i in rows]
a = sass_fp8.analyse(k)
print(json.dumps(dict(**vars(r), votes=sum(o.startswith("VOTE") for o in ops), ptx_votes=ptx.count("vote.sync.any.pred"),
                      ptx_labels=ptx.count("EARLY_DONE"), ex2_block=a["softmax_block_ex2"],
                      mufu_total=sum(o.startswith("MUFU.EX2") for o in ops))))
"""


@pytest.fixture(scope="module")
def report():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_early_exp2_compiles_clean(report):
    r = report
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r  # (the default: 32 bytes)
    assert not r["wgmma_serialized"], r


def test_early_exp2_has_the_far_branch(report):
    r = report
    assert r["ptx_votes"] >= 2 and r["votes"] >= 2, r  # step 0 and the steady step at least
    # 16 asm instances (4 elements each) a softmax, each with its label (two uses: the branch and the label)
    assert r["ptx_labels"] >= 2 * 32, r
    # the steady step's block: 64 exponentials of P (+ alpha's and the factor's); the fallback's elsewhere
    assert 64 <= r["ex2_block"] <= 68, r
    assert r["mufu_total"] >= 2 * r["ex2_block"], r

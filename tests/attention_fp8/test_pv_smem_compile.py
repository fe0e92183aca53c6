"""The FP8 Hopper kernel's P V from shared memory (PV_SMEM, session 31: gluon_fp8.AttentionFp8.compute_one with PV_SMEM) compiles
for sm_90a on this GPU-less machine, and the point of it holds in the SASS: in the steady step (the basic block with
the most MUFU.EX2, D128 non-causal, the headline call's specialization) the wait for P V (WARPGROUP.DEPBAR.LE gsb0,
0x0) comes after every exp2 and after P's stores to shared memory, where with P V's A operand in registers ptxas put
it right after the row max (session 30). Also: every e4m3 wgmma of 128 columns takes A from shared memory (a
descriptor, no registers), P's stores are fenced for the async proxy, 0 spills, shared memory within Hopper's limit.
The numbers are checked on the GPU by experiments/attention_fp8/gpu_speed_s31.py (float64 and the emulation)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, re, sys
sys.path.insert(0, "experiments/attention_fp8")
import sass_fp8
from tilecore.tiles.compile import has_hopper_instructions

k, r = sass_fp8.compile_variant(128, False, dict(pv_smem=1))
ptx = k.asm["ptx"]
rows = sass_fp8.sass_rows(k.asm["cubin"])
blocks = sass_fp8.blocks(rows)
ex2 = [sum(sass_fp8.opcode(i).startswith("MUFU.EX2") for _, i in b) for b in blocks]
soft = [i for _, i in blocks[max(range(len(blocks)), key=lambda j: (ex2[j], len(blocks[j])))]]
last = lambda pred: max((n for n, i in enumerate(soft) if pred(i)), default=-1)
first = lambda pred: min((n for n, i in enumerate(soft) if pred(i)), default=-1)
wait0 = first(lambda i: i.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
# wgmma of 128 columns (S = Q K^T, P V at D128): A as registers "{%r..}" or as a descriptor "%rd.."
wg = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3 \{[^}]*\}, (\S+)", ptx)
print(json.dumps(dict(**has_hopper_instructions(ptx), **vars(r), n_ex2=ex2[max(range(len(blocks)), key=lambda j: (ex2[j], len(blocks[j])))],
                      wait0=wait0, last_ex2=last(lambda i: "MUFU.EX2" in i), last_sts=last(lambda i: i.startswith("STS")),
                      n_sts=sum(i.startswith("STS") for i in soft), fence=first(lambda i: "FENCE.VIEW.ASYNC.S" in i),
                      wgmma_128=len(wg), wgmma_128_a_regs=sum(a.startswith("{") for a in wg),
                      fence_ptx=ptx.count("fence.proxy.async.shared::cta"))))
"""


@pytest.fixture(scope="module")
def report():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pv_smem_compiles_clean(report):
    r = report
    assert r["wgmma"] and r["tma"] and r["mbarrier"], r
    assert not r["wgmma_serialized"], r
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r  # (the register-operand default: 32 bytes)
    assert r["shared"] <= 227 * 1024, r


def test_pv_reads_p_from_shared_memory(report):
    r = report
    # S = Q K^T and P V, 4 k32 each, in step 0, the steady step and the last: none with A in registers
    assert r["wgmma_128"] >= 12 and r["wgmma_128_a_regs"] == 0, r
    assert r["fence_ptx"] >= 1, r


def test_softmax_runs_before_the_wait_for_pv(report):
    r = report
    assert r["n_ex2"] >= 64, r  # the steady step's softmax block: 64 exp2 a thread at BN 128 (+2 for alpha)
    assert r["n_sts"] >= 1 and r["fence"] >= 0, r  # P's stores and their fence are in this block
    assert r["wait0"] > r["last_ex2"] and r["wait0"] > r["last_sts"] and r["wait0"] > r["fence"], r


PIPE_SCRIPT = r"""
import json, sys
sys.path.insert(0, "experiments/attention_fp8")
import sass_fp8

k, r = sass_fp8.compile_variant(128, False, dict(pv_smem=2, block_n2=64, stages=2))
rows = [i for _, i in sass_fp8.sass_rows(k.asm["cubin"])]
ptx = k.asm["ptx"]
s_b = [n for n, i in enumerate(rows) if i.startswith("QGMMA.64x64x32")]
waits5 = [n for n, i in enumerate(rows) if i.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x5")]
mufu_between = sum(1 for n, i in enumerate(rows) if s_b and waits5 and s_b[-1] < n < waits5[-1] and "MUFU.EX2" in i)
print(json.dumps(dict(**vars(r), s_b=len(s_b), waits5=len(waits5), mufu_between=mufu_between,
                      wgmma_128_a_regs=sum(a.startswith("{") for a in __import__("re").findall(
                          r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3 \{[^}]*\}, (\S+)", ptx)))))
"""


@pytest.fixture(scope="module")
def pipe_report():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", PIPE_SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pipelined_halves_compile(pipe_report):
    """PV_SMEM 2 with halves of 128 + 64 keys at D128 (compute_pipe_smem): not serialized, tens of bytes of spills at
    most (48 here; 128 + 128 needs 192 registers for S_a, S_b and O and serializes), within shared memory, P V's A
    from shared memory; S_b (N 64) issued before softmax_a's exponentials and waited for (DEPBAR.LE 5) after them."""
    r = pipe_report
    assert not r["wgmma_serialized"], r
    assert r["spill_stores"] <= 64 and r["shared"] <= 227 * 1024, r
    assert r["wgmma_128_a_regs"] == 0, r
    assert r["s_b"] >= 8 and r["waits5"] >= 2, r  # step 0 and the steady step: 4 k32 each
    assert r["mufu_between"] >= 64, r  # softmax_a's 64 exponentials (and more) between S_b's issue and its wait

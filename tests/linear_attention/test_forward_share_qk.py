"""SHARE_QK of the Gluon forward (session 35, Mamba-2): a tile's two units read one q/k head (Mamba-2's two heads
of one C/B group, or one head's two value blocks), so consumer 0 makes the chunk's Q K^T and hands it to consumer 1
through a float32 buffer in shared memory, on two mbarriers (qk_full: written; qk_empty: read). Consumer 1's scores
are consumer 0's bits, so o is the shipped kernel's exactly (experiments/linear_attention/gpu_mamba_s35.py checks
that on the GPU, and the float64 error).

On the CPU: where the host passes it (gluon_forward.shared_qk_ok); configs.GLUON_S32's "share_qk" reaches the
launch; the handoff's phase arithmetic (a model of the two consumers and the mbarriers' parity waits, every
interleaving order drawn at random: no deadlock, no buffer overwritten before it is read, every step's scores
read by consumer 1); and the kernel compiled for sm_90a: one consumer's Q K^T wgmma fewer, the buffer and the two
barriers in shared memory within 227 KiB, no serialized wgmma, spills no more than the shipped kernel's."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_forward

BF = torch.bfloat16


def launch_keys(H=4, Hqk=1, Dv=64, **kw):
    B, N, Dk = 1, 128, 128
    q = torch.empty(B, N, Hqk, Dk, dtype=BF)
    v = torch.empty(B, N, H, Dv, dtype=BF)
    f32 = torch.float32
    return gluon_forward.launch_args(q, q, v, torch.zeros(B, H, N, dtype=f32), torch.zeros(B, H, N, dtype=f32),
                                     torch.zeros(H, Dv, dtype=f32), torch.empty_like(v), None, torch.empty_like(v),
                                     None, 1.0, 2, z_stage=True, g_stage=True, early_wv=True, **{"lean": True, **kw})[1]


def test_where_both_units_read_one_qk_head():
    assert gluon_forward.shared_qk_ok(2, 1)  # one head's two value blocks (Dv 128)
    assert gluon_forward.shared_qk_ok(1, 80)  # Mamba-2 2.7B: 80 heads on one C/B head
    assert gluon_forward.shared_qk_ok(1, 2)
    assert not gluon_forward.shared_qk_ok(1, 1)  # heads 2t and 2t + 1 read q/k heads 2t and 2t + 1
    assert not gluon_forward.shared_qk_ok(1, 3)  # heads 2 and 3 straddle groups 0 and 1
    assert not gluon_forward.shared_qk_ok(3, 1)  # units 2 and 3 straddle heads 0 and 1


def test_the_launch_passes_it_only_where_asked_and_right():
    assert "SHARE_QK" not in launch_keys()  # the shipped launch: its kernel and key as before
    assert launch_keys(share_qk=True)["SHARE_QK"] is True  # H 4 on one q/k head
    assert "SHARE_QK" not in launch_keys(H=4, Hqk=4, share_qk=True)  # a q/k head each: not taken
    assert launch_keys(H=2, Hqk=2, Dv=128, share_qk=True)["SHARE_QK"] is True  # value blocks of one head
    assert launch_keys(share_qk_alt=True)["SHARE_QK"] == 2  # the consumers take turns
    assert "SHARE_QK" not in launch_keys(H=4, Hqk=4, share_qk_alt=True)


def test_configs_turn_it_on_for_mamba2(monkeypatch):
    assert gluon_forward.s32_flags(True)["share_qk"] is ("share_qk" in configs.GLUON_S32.get(True, ()))
    monkeypatch.setattr(configs, "GLUON_S32", {True: ("lean", "share_qk")})
    assert gluon_forward.s32_flags(True)["share_qk"] and not gluon_forward.s32_flags(False)["share_qk"]
    assert launch_keys(**gluon_forward.s32_flags(True))["SHARE_QK"] is True


def _handoff(steps: int, seed: int, alternate: bool) -> list[int]:
    """The two consumers' handoff as shared_scores writes it (the maker consumer 0, or with ``alternate`` (SHARE_QK
    2) consumer step % 2), in a random interleaving: what the other read at each step (asserting that no unread
    scores are overwritten and that some consumer can always move)."""
    rng = random.Random(seed)
    done = {"full": 0, "empty": 0}  # each mbarrier's completed phases (count 1: one arrive completes one)

    def passes(bar, parity):  # mbarrier.wait(bar, parity) returns once the phase of that parity has completed
        return (done[bar] & 1) != parity

    buf, unread, read, i = None, False, [], [0, 0]

    def move(c) -> bool:
        nonlocal buf, unread
        step = i[c]
        if c == (step % 2 if alternate else 0):  # (its wgmma) wait qk_empty at (i & 1) ^ 1, store, arrive qk_full
            if not passes("empty", (step & 1) ^ 1):
                return False
            assert not unread, f"step {step} overwrote step {buf}'s unread scores"
            buf, unread = step, True
            done["full"] += 1
        else:  # wait qk_full at i & 1, load, arrive qk_empty
            if not passes("full", step & 1):
                return False
            assert buf == step, f"consumer {c} read step {buf}'s scores at step {step}"
            read.append(buf)
            unread = False
            done["empty"] += 1
        i[c] += 1
        return True

    while min(i) < steps:
        order = [c for c in (0, 1) if i[c] < steps]
        rng.shuffle(order)
        assert any(move(c) for c in order), f"deadlock at steps {i}"
    return read


@pytest.mark.parametrize("alternate", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_the_handoff_gives_the_other_consumer_every_step_in_order(seed, alternate):
    assert _handoff(37, seed, alternate) == list(range(37))


CODE = """
import json, os, re, subprocess, sys, tempfile
from tilecore.ops.linear_attention.gluon_forward import compile_report
from triton.backends.nvidia.compiler import get_ptxas
kw = json.loads(sys.argv[1])
case = sys.argv[2]
out = []
mamba = dict(z_stage=True, early_wv=True, silu_tanh=True, lean=True) if case == "mamba2" else {}
r = compile_report(case, stages=2, g_stage=case != "linear", compiled_out=out, **mamba, **kw)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    open(path, "wb").write(out[0].asm["cubin"])
    sass = subprocess.run([os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump"), "-sass", path],
                          capture_output=True, text=True, check=True).stdout
r["hgmma"] = len(re.findall(r"\\bHGMMA\\.", sass))
r["syncs"] = len(re.findall(r"\\bSYNCS\\.", sass))
print(json.dumps(r))
"""
VARIANTS = {"shipped": ("mamba2", {}), "share_qk": ("mamba2", dict(share_qk=True)),
            "share_qk_alt": ("mamba2", dict(share_qk_alt=True)),
            "share_qk late": ("mamba2", dict(share_qk=True, update_late=True)),
            # no decay at Dk = Dv = 128: a head's two value blocks share q/k (the kernel compiles there too)
            "linear": ("linear", {}), "linear share_qk": ("linear", dict(share_qk=True))}


@pytest.fixture(scope="module")
def sass():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = {name: subprocess.Popen([sys.executable, "-c", CODE, json.dumps(kw), case], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
             for name, (case, kw) in VARIANTS.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_one_qk_wgmma_fewer_and_the_buffer_in_shared_memory(sass):
    for base, share in (("shipped", "share_qk"), ("linear", "linear share_qk")):
        b, s = sass[base], sass[share]
        assert s["hgmma"] == b["hgmma"] - 128 // 16, (base, b["hgmma"], s["hgmma"])  # Q K^T: K 128 in steps of 16
        # + [64, 64] float32 and 2 mbarriers (and the allocator's alignment: 192 B at the Mamba-2 shape)
        assert 0 <= s["shared"] - b["shared"] - (64 * 64 * 4 + 16) <= 1024, (base, b["shared"], s["shared"])
        assert s["syncs"] > b["syncs"]  # the handoff's mbarrier waits and arrives
        assert s["spill_bytes"] <= max(b["spill_bytes"], 32), (base, b, s)
    alt = sass["share_qk_alt"]  # (each consumer keeps the wgmma, in the branch of its turns)
    assert alt["hgmma"] == sass["shipped"]["hgmma"] and alt["syncs"] > sass["shipped"]["syncs"]
    assert alt["shared"] == sass["share_qk"]["shared"] and alt["spill_bytes"] <= sass["shipped"]["spill_bytes"]
    for name, r in sass.items():
        assert r["tma"] and r["wgmma"] and not r["wgmma_serialized"], (name, r)
        assert r["shared"] <= 227 * 1024 and r["threads"] == 384, (name, r)

"""The ops a user calls, planned and launched as on another GPU (issue 31's other GPUs, session 34): inside
dispatch.pretend a plain meta tensor counts as the described GPU's, so ``tilecore.linear_attention(...)`` and the
other public functions run their own host path (checks, plan, launch, autograd's backward) and
tilecore.portability records the kernels they launch there. CPU only; the compiles and shared-memory checks of
these launches are test_sweep.py's (``--quick``: sm_86 and gfx90a, the smallest blocks)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilecore import dispatch

ROOT = Path(__file__).resolve().parents[2]
T = dispatch.TARGETS


def test_meta_tensors_take_the_implementation_only_inside_pretend():
    meta = torch.empty(4, 8, device="meta")
    grad = torch.empty(4, 8, device="meta", requires_grad=True)
    assert dispatch.eager_mode(meta) == "op"  # outside: the custom op's fake implementation
    with dispatch.pretend(T["sm_86"]):
        assert dispatch.eager_mode(meta) == "direct"
        assert dispatch.eager_mode(meta, None, torch.empty(2)) == "direct"
        assert dispatch.eager_mode(grad) == "autograd"
        with torch.no_grad():
            assert dispatch.eager_mode(grad) == "direct"
        # still the op: a subclass, and under a dispatch mode (fake tensors)
        assert dispatch.eager_mode(torch.nn.Parameter(torch.empty(2, device="meta"))) == "op"
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            assert dispatch.eager_mode(meta) == "op"
    assert dispatch.eager_mode(meta) == "op"


def test_cuda_and_cpu_tensors_are_unchanged_inside_pretend():
    x = torch.empty(3)
    with dispatch.pretend(T["gfx90a"]):
        assert dispatch.eager_mode(x) == "direct"
        assert dispatch.described(x.device) is None


# Recording needs Triton's compiled-mode kernels (the tests run under TRITON_INTERPRET=1, where triton.jit makes
# interpreted functions): a fresh process, which prints one JSON line {target: {case: kernels or the refusal}}.
_PROBE = r"""
import json, sys, torch
from tilecore import dispatch, portability as P
res = {}
for t in sys.argv[1].split(","):
    res[t] = {}
    for op in P.PUBLIC_OPS:
        for case in P.CASES[op](False):
            launches = []
            try:
                with dispatch.pretend(dispatch.TARGETS[t]), P.recording(launches):
                    label = case.run(torch.device("meta"))
                res[t][op + ": " + case.name] = dict(label=label, kernels=sorted({P.kernel_name(k) for k, _, _ in launches}),
                                                    gluon=any(P.is_gluon(k) for k, _, _ in launches))
            except Exception as err:
                res[t][op + ": " + case.name] = dict(refused=f"{type(err).__name__}: {err}")
print("RESULT " + json.dumps(res))
"""

# what each family's calls launch off Hopper (the portable Triton kernels)
EXPECTED = {
    "linear_attention": {"linear_attention.kernels_tl.la_fwd_kernel", "linear_attention.kernels_tl.la_bwd_dkv_kernel",
                         "linear_attention.kernels_tl.la_bwd_dq_kernel", "linear_attention.kernels_tl.la_step_kernel",
                         "linear_attention.kernels_backward_gla_chunked.gla_dqk_kernel",
                         "linear_attention.kernels_backward_gla_chunked.gla_dv_kernel"},
    "fft_conv": {"fft_conv.kernels_pair.fft_conv_pair_kernel", "fft_conv.kernels_long.long_rows_kernel",
                 "fft_conv.kernels.fft_conv_kernel"},
    "attention_varlen": {"attention_varlen.kernels_tl.varlen_fwd", "attention_varlen.kernels_tl.varlen_bwd_dkdv",
                         "attention_varlen.kernels_tl.varlen_bwd_dq"},
    "attention_kvcache": {"attention_kvcache.kernels_tl.kvcache_fwd_split",
                          "attention_kvcache.kernels_tl.kvcache_merge_splits"},
    "hadamard_quantize": {"hadamard.quantize_kernels.pow2_quantize_kernel"},
    "attention_fp8": set(),  # sm_80, sm_86, ROCm: no e4m3 in Triton: the op's clear refusal (no launch)
}


@pytest.fixture(scope="module")
def recorded():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _PROBE, "sm_80,sm_86,gfx90a,sm_90a,sm_89"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=900)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[0][len("RESULT "):])


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "gfx90a"])
def test_every_public_call_gets_the_portable_kernels_off_hopper(recorded, target):
    from tilecore import portability

    cases = recorded[target]
    refused = {c: r["refused"] for c, r in cases.items() if "refused" in r}
    assert not refused, refused
    fp8 = {c: r for c, r in cases.items() if c.startswith("attention_fp8: ")}
    assert fp8 and all(r["label"] == "refused clearly (no e4m3)" and not r["kernels"] for r in fp8.values()), fp8
    assert all(r["kernels"] and r["label"] == "public" for c, r in cases.items() if c not in fp8), cases
    assert not any(r["gluon"] for r in cases.values()), target  # the NVIDIA Hopper code never off Hopper
    for op in portability.PUBLIC_OPS:
        kernels = set().union(*(r["kernels"] for c, r in cases.items() if c.startswith(op + ": ")))
        assert EXPECTED[op] <= kernels, (target, op, EXPECTED[op] - kernels)


def test_hopper_takes_its_gluon_kernel_where_a_meta_tensor_reaches_it(recorded):
    # fft_conv's plan asks dispatch (gluon_ok) alone: sm_90a described gets its Gluon one-pass kernels. (varlen's
    # and linear attention's Gluon forwards are chosen for device.type == "cuda" only, so described Hopper records
    # their tl kernels: the sweep's sm_90a column is the tl path for them.)
    cases = recorded["sm_90a"]
    assert not any("refused" in r for r in cases.values()), cases
    fft = [r for c, r in cases.items() if c.startswith("fft_conv: bfloat16 seqlen 4096")]
    assert fft and fft[0]["gluon"], fft


def test_e4m3_gpus_run_attention_fp8s_portable_kernel(recorded):
    # sm_89 (Ada): e4m3 tensor cores, no Hopper: attention_fp8's tl forward; sm_90a: its Gluon kernel
    for target, kernel, gluon in (("sm_89", "attention_fp8.kernels_tl.attn_fp8_fwd", False),
                                  ("sm_90a", "attention_fp8.gluon_fp8.attention_fp8_fwd_kernel", True)):
        fp8 = [r for c, r in recorded[target].items() if c.startswith("attention_fp8: ")]
        assert len(fp8) == 4 and all(r["kernels"] == [kernel] and r["gluon"] == gluon for r in fp8), (target, fp8)


@pytest.mark.parametrize("name, d, want", [
    ("sm_90a", 128, (128, 3)), ("sm_80", 128, (128, 3)),  # the H100's and A100's default: unchanged
    ("sm_86", 128, (128, 2)), ("sm_120a", 128, (128, 2)),  # 99 KiB: one stage fewer (136 -> 72 KiB on sm_86)
    ("gfx90a", 128, (64, 2)), ("gfx942", 128, (64, 2)),  # 64 KiB: 64 keys a step, 2 stages (128 -> 32 on gfx90a)
])
def test_kvcache_split_kernel_fits_the_block(name, d, want):
    from tilecore.ops.attention_kvcache import op

    with dispatch.pretend(T[name]):
        meta = torch.device("meta")
        assert op._fitted(meta, d, 128, 3) == want
        q = torch.empty(2, 1, 32, d, dtype=torch.bfloat16, device=meta)
        cache = torch.empty(2, 4096, 8, d, dtype=torch.bfloat16, device=meta)
        layout = op._DecodeLayout(q, cache, cache, None, False, -1, -1, 0.0, 4096, None)
    assert (layout.split_options["BLOCK_N"], layout.split_options["num_stages"]) == want
    assert layout.keys_per_split % want[0] == 0


def test_limit_shared_memory_caps_what_plans_see_on_a_cuda_device(monkeypatch):
    # (the real device's figure stood in for: the CPU has none) a cap below it rules; the context restores it;
    # meta and CPU devices are untouched
    monkeypatch.setattr(dispatch, "_shared_memory", lambda index: 227 * 1024)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = torch.device("cuda", 0)
    assert dispatch.shared_memory_per_block(cuda) == 227 * 1024
    with dispatch.limit_shared_memory(99 * 1024):
        assert dispatch.shared_memory_per_block(cuda) == 99 * 1024
        from tilecore.ops.attention_kvcache import op

        assert dispatch.shared_memory_fit(cuda, op.SHARED_FITS, "kv") == {128: dict(num_stages=2)}
        with dispatch.limit_shared_memory(512 * 1024):  # a cap above the device's: the device's
            assert dispatch.shared_memory_per_block(cuda) == 227 * 1024
        assert dispatch.shared_memory_per_block(torch.device("cpu")) is None
        with dispatch.pretend(T["gfx90a"]):
            assert dispatch.shared_memory_per_block(torch.device("meta")) == 64 * 1024
    assert dispatch.shared_memory_per_block(cuda) == 227 * 1024

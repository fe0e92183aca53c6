"""tilecore.attention on the CPU: the Triton kernels through the interpreter (fp16; bf16 runs on its
exact float32 upcasts there, since the interpreter's bf16 tl.dot is wrong: the bf16 kernels
themselves are checked on the GPU by experiments/attention/attention_probe.py), the path without the
interpreter (tests/attention/test_attention_cpu.py has more), the custom-op machinery, and bad input."""
import math

import pytest
import torch

import tilecore
from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference, configs, launch, plan
from tilecore.ops.attention.kernels_tl import row_block_grid

from attention_testing import F16, check_lse, make, reference_grads  # tests/attention

# B, Hq, Hkv, N, Nk, D, causal: odd lengths, N != Nk both ways, GQA and MQA, D not a power of two
CASES = [
    (1, 2, 2, 1, 1, 64, False),
    (1, 2, 2, 1, 17, 64, True),
    (2, 2, 2, 17, 17, 64, True),
    (1, 4, 2, 17, 40, 16, True),
    (1, 2, 2, 64, 64, 64, False),
    (1, 4, 1, 100, 64, 80, True),
    (1, 2, 2, 64, 17, 64, True),   # N > Nk causal: the first 47 rows see no key
    (2, 2, 1, 33, 100, 80, False),
]
IDS = [f"B{b}-H{h}/{hk}-N{n}-Nk{nk}-D{d}-{'causal' if c else 'full'}" for b, h, hk, n, nk, d, c in CASES]


def forward_poisoned(q, k, v, causal, scale, config=None):
    """The forward kernel's (out, lse), into NaN-filled buffers so an unwritten element shows."""
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32)
    launch.forward_into(q, k, v, out, lse, causal, scale, path=None if config is None else "tl", config=config)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), "some outputs were never written"
    return out, lse


def backward_poisoned(dout, q, k, v, out, lse, dlse, causal, scale, config=None):
    grads = [torch.full(t.shape, float("nan"), dtype=t.dtype) for t in (q, k, v)]
    launch.backward_into(dout, q, k, v, out, lse, dlse, *grads, causal, scale, path=None if config is None else "tl",
                         config=config)
    for name, g in zip("qkv", grads):
        assert torch.isfinite(g).all(), f"d{name} has unwritten or non-finite elements"
    return grads


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_fp16_near_the_rounding_floor(case):
    b, hq, hkv, n, nk, d, causal = case
    q, k, v = make(*case[:6])
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    # the query-block kernel on every case, and the path forward_into picks (the split-key path for
    # few queries: tests/attention/test_decode.py), which the public function must give bit for bit
    for config in (configs.forward_config(d, interpret=True), None):
        out, lse = forward_poisoned(q, k, v, causal, d**-0.5, config=config)
        assert accuracy.error_over_floor(out, ref) <= 2.0
        check_lse(lse, ref_lse)
    public, public_lse = attention(q, k, v, causal=causal, return_lse=True)
    assert torch.equal(public, out) and torch.equal(public_lse, lse)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_fp16_near_the_rounding_floor(case):
    b, hq, hkv, n, nk, d, causal = case
    q, k, v = make(*case[:6])
    scale = d**-0.5
    out, lse = forward_poisoned(q, k, v, causal, scale)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    grads = backward_poisoned(dout, q, k, v, out, lse, dlse, causal, scale)
    for g, r in zip(grads, reference_grads(q, k, v, dout, dlse, causal, scale)):
        assert accuracy.error_over_floor(g, r) <= 3.0


def _near(out, ref, floors: float) -> bool:
    """Within ``floors`` of out's dtype's rounding floor; float32 (whose floor sits far below its
    sums' error): relative RMS error below 1e-5."""
    if out.dtype == torch.float32:
        return accuracy.rel_rms(out, ref) < 1e-5
    return accuracy.error_over_floor(out, ref) <= floors


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("path", ["tl", "decode"])
def test_bf16_and_fp32_in_the_interpreter(dtype, path):
    """bf16 runs the tl kernels on its exact float32 upcasts, rounded once at the end (the
    interpreter's bf16 tl.dot gave values ~1e9 and no error); float32 runs them as it is."""
    q, k, v = make(1, 4, 2, 33, 40, 64, dtype=dtype)
    scale = 0.125
    fwd = plan.plan_forward(q, k, v, True, scale, path=path)
    assert fwd.operand_dtype == (torch.float32 if dtype == torch.bfloat16 else None)
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    lse = torch.full(q.shape[:3], float("nan"))
    launch.forward(fwd, q, k, v, out, lse, True, scale)
    ref, ref_lse = attention_reference(q, k, v, causal=True, scale=scale)
    assert _near(out, ref, 2.0)
    check_lse(lse, ref_lse)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    grads = [torch.full(t.shape, float("nan"), dtype=dtype) for t in (q, k, v)]
    launch.backward_into(dout, q, k, v, out, lse, dlse, *grads, True, scale, path="tl")
    for g, r in zip(grads, reference_grads(q, k, v, dout, dlse, True, scale)):
        assert _near(g, r, 3.0)
    public = attention(q, k, v, causal=True, scale=scale)
    assert public.dtype == dtype and _near(public, ref, 2.0)


def test_backward_preprocess_gives_delta_and_zeros_the_dq_buffer():
    """delta = rowsum(O * dO) - dlse for every row (N not a multiple of the block), and with dq_sum
    the float32 dQ buffer that the Gluon backward's reductions add to comes back all zeros, whatever
    its memory held (the launch is given NaN-filled buffers); with row stats, the Gluon backward's
    (B * H, 2, N) rows of lse (-inf, a row with no key, made +inf) and delta, in a buffer whose rows
    are padded to 16 bytes for TMA."""
    b, h, n, d = 2, 3, 37, 40
    n_pad = 40
    out, dout = torch.randn(b, h, n, d, dtype=F16), torch.randn(b, h, n, d, dtype=F16)
    lse, dlse = torch.randn(b, h, n), torch.randn(b, h, n)
    lse[1, 2, 5] = float("-inf")
    delta, acc = torch.full((b, h, n), float("nan")), torch.full((b, h, n, d), float("nan"))
    stats = torch.full((b * h, 2, n_pad), float("nan"))
    launch.DELTA[row_block_grid(b * h, n, 16)](out, dout, lse, dlse, delta, stats, acc, *out.stride(),
                                               *dout.stride(), h, n, d, n_pad, HAS_DLSE=True,
                                               ZERO_DQ_SUM=True, ROW_STATS=True, BLOCK_M=16, BLOCK_D=64)
    expect = (out.double() * dout.double()).sum(-1) - dlse.double()
    assert torch.allclose(delta.double(), expect, rtol=1e-5, atol=1e-4)
    assert torch.equal(acc, torch.zeros_like(acc))
    lse_rows = torch.where(lse == float("-inf"), float("inf"), lse).reshape(b * h, n)
    assert torch.equal(stats[:, 0, :n], lse_rows) and torch.equal(stats[:, 1, :n], delta.reshape(b * h, n))
    delta2, acc2, _ = launch.backward_preprocess(out, dout, lse, dlse, dq_sum=True)
    assert torch.equal(delta2, delta) and acc2.shape == (b, h, n, d) and not acc2.any()
    _, _, stats2 = launch.backward_preprocess(out, dout, lse, dlse, row_stats=True)
    assert stats2.shape == (b * h, 2, n) and stats2.stride() == (2 * n_pad, n_pad, 1)
    assert torch.equal(stats2, stats[..., :n])


def test_autograd_through_the_public_function_matches_the_reference():
    q, k, v = make(2, 4, 2, 40, 23, 64, grad=True)
    out, lse = attention(q, k, v, causal=True, scale=0.2, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    loss = (out.float() * dout.float()).sum() + (lse * dlse).sum()  # N < Nk: no empty rows, lse finite
    grads = torch.autograd.grad(loss, (q, k, v))
    for g, r in zip(grads, reference_grads(q, k, v, dout, dlse, True, 0.2)):
        assert accuracy.error_over_floor(g, r) <= 3.0


def test_rows_with_no_key_give_zeros_and_zero_gradients():
    n, nk = 50, 20  # causal with N > Nk: query i sees keys j <= i - 30, so rows 0..29 see none
    q, k, v = make(1, 2, 1, n, nk, 64, grad=True)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert (out[:, :, :30] == 0).all() and torch.isneginf(lse[:, :, :30]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 30:]).all()
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (q.grad[:, :, :30] == 0).all()
    # key j is first seen by query j + 30; every key is seen by some query
    ref = reference_grads(q, k, v, torch.ones_like(out), None, True, 64**-0.5)
    assert accuracy.error_over_floor(k.grad, ref[1]) <= 3.0


def test_no_keys_at_all():
    q, k, v = make(1, 2, 2, 5, 0, 32, grad=True)
    out, lse = attention(q, k, v, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    out.float().sum().backward()
    assert (q.grad == 0).all() and k.grad.shape == k.shape


@pytest.mark.parametrize("d", [64, 128])
def test_gpu_block_shapes_compute_the_same(d):
    # the GPU's (larger) blocks, run through the interpreter: loop bounds with BLOCK_M != BLOCK_N
    q, k, v = make(1, 2, 1, 150, 130, d)
    scale = d**-0.5
    fwd = configs.forward_config(d, interpret=False)
    bwd = configs.backward_config(d, interpret=False)
    for causal in (False, True):
        out, lse = forward_poisoned(q, k, v, causal, scale, config={x: fwd[x] for x in ("BLOCK_M", "BLOCK_N")})
        ref, ref_lse = attention_reference(q, k, v, causal=causal)
        assert accuracy.error_over_floor(out, ref) <= 2.0
        check_lse(lse, ref_lse)
        dout = torch.randn_like(out)
        grads = backward_poisoned(dout, q, k, v, out, lse, None, causal, scale,
                                  config={x: bwd[x] for x in ("BLOCK_M", "BLOCK_N")})
        for g, r in zip(grads, reference_grads(q, k, v, dout, None, causal, scale)):
            assert accuracy.error_over_floor(g, r) <= 3.0


def test_strided_inputs_give_the_same_answer():
    # (B, N, H, D) memory viewed as (B, H, N, D), as models usually hold q, k, v
    q, k, v = (torch.randn(2, n, h, 64, dtype=F16).transpose(1, 2) for n, h in ((30, 4), (45, 2), (45, 2)))
    out = attention(q, k, v, causal=True)
    assert torch.equal(out, attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True))


def test_negative_scale_masks_correctly():
    q, k, v = make(1, 2, 2, 17, 17, 32)
    out, lse = attention(q, k, v, causal=True, scale=-0.3, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal=True, scale=-0.3)
    assert accuracy.error_over_floor(out, ref) <= 2.0
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_path_without_the_interpreter(monkeypatch, dtype):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors then take torch's CPU attention kernel
    q, k, v = make(1, 4, 2, 30, 20, 48, dtype=dtype, grad=True)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal=True)
    assert accuracy.error_over_floor(out, ref) <= 1.5
    assert (out[:, :, :10] == 0).all() and torch.isneginf(lse[:, :, :10]).all()
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for g, r in zip(grads, reference_grads(q, k, v, dout, None, True, 48**-0.5)):
        assert accuracy.error_over_floor(g, r) <= 3.0  # torch's CPU backward, as the kernels' (1.6-2.7)


def test_custom_ops_opcheck_and_compile_fullgraph():
    q, k, v = make(1, 2, 1, 20, 24, 32, grad=True)
    torch.library.opcheck(torch.ops.tilecore.attention_forward.default, (q, k, v, True, 0.25))
    dout = torch.randn(q.shape, dtype=F16)
    out, lse = attention(q.detach(), k.detach(), v.detach(), causal=True, scale=0.25, return_lse=True)
    torch.library.opcheck(torch.ops.tilecore.attention_backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out, lse, None, True, 0.25))

    def f(q, k, v):
        o, lse = tilecore.attention(q, k, v, causal=True, scale=0.25, return_lse=True)
        return (o.float() * 2).sum() + lse.sum()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    got = torch.autograd.grad(loss, (q, k, v))
    expect = torch.autograd.grad(f(q, k, v), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(got, expect))


def test_tilecore_exports_attention():
    assert tilecore.attention is attention


@pytest.mark.parametrize("args,kwargs,error,words", [
    ((torch.zeros(2, 8, 64), torch.zeros(2, 8, 64), torch.zeros(2, 8, 64)), {}, ValueError, "4-D"),
    ((torch.zeros(1, 2, 8, 64, dtype=torch.float64),) * 3, {}, TypeError, "float16, bfloat16, float32"),
    ((torch.zeros(1, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 64), torch.zeros(1, 2, 8, 64, dtype=F16)), {}, TypeError, "one dtype"),
    ((torch.zeros(1, 3, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 64, dtype=F16)), {}, ValueError, "multiple"),
    ((torch.zeros(1, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 9, 64, dtype=F16)), {}, ValueError, "same \\(batch, kv_heads, keys\\)"),
    ((torch.zeros(1, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 32, dtype=F16), torch.zeros(1, 2, 8, 32, dtype=F16)), {}, ValueError, "head_dim"),
    ((torch.zeros(2, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 64, dtype=F16), torch.zeros(1, 2, 8, 64, dtype=F16)), {}, ValueError, "batch"),
    ((torch.zeros(1, 2, 8, 640, dtype=F16),) * 3, {}, ValueError, "from 1 to 576"),
    ((torch.zeros(1, 2, 8, 64, dtype=F16),) * 3, {"scale": math.inf}, ValueError, "finite"),
    ((torch.zeros(1, 2, 8, 64, dtype=F16),) * 3, {"causal": 1}, TypeError, "True or False"),
    (([1.0], torch.zeros(1), torch.zeros(1)), {}, TypeError, "torch.Tensor"),
])
def test_bad_input_names_what_is_accepted(args, kwargs, error, words):
    with pytest.raises(error, match=words):
        attention(*args, **kwargs)


@pytest.mark.parametrize("d, n, nk, causal, options", [
    (64, 4096, 4096, False, dict(consumers=3)),                   # D = 64, long, not causal: three consumers,
    (64, 2048, 2048, False, dict(consumers=3)),                   # two Q buffers up to N = 4096
    (64, 8192, 8192, False, dict(consumers=3, q_buffers=1)),      # then one
    (64, 8192, 8192, True, dict(consumers=3, q_buffers=1)),       # causal: three from N = 1024,
    (64, 2048, 2048, True, dict(consumers=3)),                    # even where tiles are short, not carried
    (64, 1024, 1024, True, dict(consumers=3, block_n=64)),        # (<= 512 keys a row: 64-key blocks)
    (64, 512, 512, True, dict(carry=True, block_n=64)),           # shorter: two, carried
    (64, 1024, 1024, False, dict(carry=True)),
    (128, 4096, 4096, False, dict(q_regs=True)),                  # long tiles: GLUON_FORWARD (two Q buffers),
    (128, 4096, 4096, True, {}),                                  # Q in registers without a mask
    (128, 1024, 1024, False, dict(carry=True)),                   # <= 8 key blocks a tile on average
    (128, 2048, 2048, True, {}),                                  # D = 128 causal: not carried (-1 to -2%)
    (128, 512, 512, True, dict(block_n=64, stages=3)),            # short causal: 64-key blocks, 3 stages
    (128, 512, 4096, True, {}), (128, 4097, 1000, True, dict(block_n=64, stages=3))])  # N != Nk: keys a row sees
def test_gluon_forward_config_per_head_dim_and_length(d, n, nk, causal, options):
    assert configs.gluon_forward_config(d, n, nk, causal) == configs.GLUON_FORWARD[d] | options


@pytest.mark.parametrize("d, n, causal, dq_from", [
    (64, 512, True, "warpgroup"), (128, 512, False, "gluon"), (128, 1024, False, "lagged"),
    (128, 2048, True, "gluon"), (128, 4096, True, "fused"), (128, 16384, False, "lagged")])
def test_gluon_backward_config_takes_the_dq_kernel_where_d128_tiles_are_short(d, n, causal, dq_from):
    cfg = configs.gluon_backward_config(d, n, causal)
    assert cfg["dq_from"] == dq_from
    # without dQ in the kernel (the dq kernel's), dP's accumulator starts at -delta
    assert cfg.get("dp_from_delta", False) == (dq_from == "gluon")
    assert {k: v for k, v in cfg.items() if k not in ("dq_from", "dp_from_delta")} == {
        k: v for k, v in configs.GLUON_BACKWARD[d, causal].items() if k != "dq_from"}


def test_gluon_backward_dq_boxes_and_refused_configs():
    """dQ's TMA reduction box, and the configs the Gluon backward refuses before any launch."""
    assert launch.dq_box(64, 64) == [1, 1, 64, 32]
    assert launch.dq_box(64, 128) == [1, 1, 64, 64] and launch.dq_box(64, 64, dq_from="warpgroup") == [1, 1, 64, 32]
    x = torch.randn(1, 1, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="kv_regs"):
        plan.plan_backward(x, x, x, x, False, 0.125, path="gluon",
                           config=dict(block_m=64, block_n=64, stages=2, dq_from="gluon", kv_regs=True))
    x128 = torch.randn(1, 1, 8, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="warpgroup"):  # its registers fit D = 64 only
        plan.plan_backward(x128, x128, x128, x128, False, 0.125, path="gluon",
                           config=dict(block_m=64, block_n=64, stages=2, dq_from="warpgroup"))


def test_tour_cases_run_their_own_inputs_near_the_floor():
    from tilecore.ops.attention.tour import tour_cases

    cases = tour_cases(torch.device("cpu"))
    assert [c.op for c in cases] == ["attention", "attention (decode)"]
    for case in cases:
        out, ref = case.run(), case.reference()
        assert out.shape == ref.shape and f"N{out.shape[2]}" in case.shape  # each case's own q
        assert accuracy.error_over_floor(out, ref) <= 2.0

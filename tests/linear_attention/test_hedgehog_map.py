"""Hedgehog's one-pass feature map (kernels_forward.hedgehog_map_kernel, session 32) in Triton's interpreter against
op.hedgehog_map (torch, float32) and a float64 map: bf16, fp16 and float32 inputs, strided views (a (B, H, N, D)
tensor's transpose), Dk and F not powers of two, rows past a block, an extreme projection (softmax's max shift). bf16
takes the kernel's float32 output rounded by torch (the interpreter truncates float32 to bf16: decision 7)."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention.kernels_forward import hedgehog_map_fused
from tilecore.ops.linear_attention.op import hedgehog_map


def reference(x, w):
    proj = torch.einsum("...hd,hdf->...hf", x.double(), w.double())
    return torch.cat([proj.softmax(-1), (-proj).softmax(-1)], dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("B,N,H,Dk,F", [(2, 70, 3, 16, 8), (1, 5, 2, 24, 12), (1, 130, 1, 64, 32)])
def test_the_fused_map_is_the_torch_map(dtype, B, N, H, Dk, F):
    torch.manual_seed(0)
    x = torch.randn(B, H, N, Dk).to(dtype).transpose(1, 2)  # (B, N, H, Dk), strided
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    out = hedgehog_map_fused(x, w)
    assert out.shape == (B, N, H, 2 * F) and out.dtype == dtype
    if dtype == torch.bfloat16:  # (the interpreter truncates float32 to bf16: float32 out, rounded by torch)
        out = hedgehog_map_fused(x, w, out_dtype=torch.float32).to(dtype)
    ref = reference(x, w)
    if dtype == torch.float32:  # (another sum order and exp than torch's: a few float32 ulp)
        assert (out.double() - ref).abs().max() < 2e-6
        return
    assert accuracy.error_over_floor(out, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(hedgehog_map(x, w), ref))
    assert torch.allclose(out.float(), hedgehog_map(x, w).float(), atol=2 * torch.finfo(dtype).eps, rtol=0)


def test_an_extreme_projection_stays_finite():
    x = torch.full((1, 3, 1, 16), 40.0)
    w = torch.randn(1, 16, 8)
    out = hedgehog_map_fused(x, w)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, reference(x, w).float(), atol=1e-6)


def test_the_op_hook_takes_the_fused_map_where_its_switch_says(monkeypatch):
    """op.hedgehog_map's ``fused`` (configs.HEDGEHOG_FUSED_MAP by default): the kernel under no_grad (its output equal
    to hedgehog_map_fused's), torch's map where a gradient is recorded and HEDGEHOG_FUSED_MAP_GRAD is off (W's gradient
    flows), and the public op with the switch on at the error of the op with it off (bf16, the interpreter's float32
    output rounded by torch)."""
    from tilecore.ops.linear_attention import configs, linear_attention

    torch.manual_seed(1)
    B, N, H, Dk, F = 1, 70, 2, 16, 8
    x = torch.randn(B, N, H, Dk).to(torch.bfloat16)
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    kernel = hedgehog_map_fused(x, w, out_dtype=torch.float32).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(hedgehog_map(x, w, fused=True), kernel)
        torch_map = hedgehog_map(x, w, fused=False)
    assert torch.allclose(torch_map.float(), kernel.float(), atol=2 * torch.finfo(torch.bfloat16).eps, rtol=0)
    wg = w.clone().requires_grad_(True)
    monkeypatch.setattr(configs, "HEDGEHOG_FUSED_MAP_GRAD", False)
    out = hedgehog_map(x, wg, fused=None)  # (a gradient to record, its switch off: torch's map)
    assert out.requires_grad and torch.equal(out.detach(), torch_map) and out.grad_fn.name() != "_HedgehogMapBackward"
    out.float().sum().backward()
    assert wg.grad is not None and torch.isfinite(wg.grad).all()

    q, k, v = torch.randn(B, N, H, Dk).half(), torch.randn(B, N, H, Dk).half(), torch.randn(B, N, H, 32).half()
    monkeypatch.setattr(configs, "HEDGEHOG_FUSED_MAP", False)
    off = linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w)
    monkeypatch.setattr(configs, "HEDGEHOG_FUSED_MAP", True)
    with torch.no_grad():
        on = linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w)
        assert torch.equal(hedgehog_map(q, w), hedgehog_map_fused(q, w, out_dtype=torch.float32).half())
    ref, _ = linear_attention_reference_f64(q, k, v, w)
    assert accuracy.error_over_floor(on, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(off, ref))


def linear_attention_reference_f64(q, k, v, w):
    from tilecore.ops.linear_attention import linear_attention_reference

    return linear_attention_reference(q.double(), k.double(), v.double(), feature_map="hedgehog",
                                      feature_weights=w.double())


def map_and_grads(x, w, fused, dout):
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = hedgehog_map(xg, wg, fused=fused)
    out.backward(dout)
    return out.detach(), xg.grad, wg.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("B,N,H,Dk,F", [(2, 70, 3, 16, 8), (1, 130, 1, 24, 12)])
def test_the_fused_map_backward_is_the_torch_maps(dtype, B, N, H, Dk, F):
    """Under autograd, fused=True (op._HedgehogMap: the one-pass forward, kernels_forward.hedgehog_map_backward) against
    torch's map and the float64 map's autograd: the output, dx and dW within 1.05x of torch's map's error over the
    rounding floor (float32: a few ulp); x strided, Dk / F not powers of two, rows past a block, several programs a head
    (dW's partials summed)."""
    torch.manual_seed(2)
    x = torch.randn(B, H, N, Dk).to(dtype).transpose(1, 2)
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    dout = torch.randn(B, N, H, 2 * F).to(dtype)
    out, dx, dw = map_and_grads(x, w, True, dout)
    t_out, t_dx, t_dw = map_and_grads(x, w, False, dout)
    r_out, r_dx, r_dw = map_and_grads(x.double(), w.double(), False, dout.double())
    assert dx.dtype == dtype and dw.dtype == torch.float32 and dx.shape == x.shape and dw.shape == w.shape
    if dtype == torch.float32:
        assert (out.double() - r_out).abs().max() < 2e-6
        assert (dx.double() - r_dx).abs().max() < 1e-5 * r_dx.abs().max()
        assert (dw.double() - r_dw).abs().max() < 1e-5 * r_dw.abs().max()
        return
    for mine, theirs, ref in ((out, t_out, r_out), (dx, t_dx, r_dx)):
        assert accuracy.error_over_floor(mine, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(theirs, ref))
    # dW (float32 from the rounded x): as close to float64's as torch's float32 einsum
    assert (dw.double() - r_dw).abs().max() <= 1.05 * (t_dw.double() - r_dw).abs().max() + 1e-5 * r_dw.abs().max()


def test_the_public_op_gradients_with_the_fused_map(monkeypatch):
    """linear_attention(feature_map='hedgehog') through autograd with HEDGEHOG_FUSED_MAP_GRAD on (the map's grad_fn
    is op._HedgehogMap's) against the float64 recurrence: dq, dk, dv and dW at the error of the switch-off path."""
    from tilecore.ops.linear_attention import configs, linear_attention

    torch.manual_seed(4)
    B, N, H, Dk, F, Dv = 1, 40, 2, 16, 8, 32
    q, k = torch.randn(B, N, H, Dk).half(), torch.randn(B, N, H, Dk).half()
    v = torch.randn(B, N, H, Dv).half()
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    do = torch.randn(B, N, H, Dv).half()

    def grads(on, dtype=None):
        monkeypatch.setattr(configs, "HEDGEHOG_FUSED_MAP_GRAD", on)
        ts = [t.to(dtype or t.dtype).clone().requires_grad_(True) for t in (q, k, v, w)]
        if dtype is None:
            o = linear_attention(*ts[:3], feature_map="hedgehog", feature_weights=ts[3])
        else:
            o, _ = linear_attention_reference_f64(*ts)
        o.backward(do.to(o.dtype))
        return [t.grad for t in ts]

    from tilecore.ops.linear_attention import op

    calls = []
    apply = op._HedgehogMap.apply
    monkeypatch.setattr(op._HedgehogMap, "apply", lambda *a: calls.append(1) or apply(*a))
    on = grads(True)
    assert len(calls) == 2  # (q's and k's maps)
    off, ref = grads(False), grads(None, torch.float64)
    assert len(calls) == 2
    for name, a, b, r in zip(("dq", "dk", "dv"), on, off, ref):
        assert torch.isfinite(a).all(), name
        assert accuracy.error_over_floor(a, r) <= 1.1 * max(1.0, accuracy.error_over_floor(b, r)), name
    assert (on[3].double() - ref[3]).abs().max() <= 1.1 * (off[3].double() - ref[3]).abs().max() + 1e-4


def test_the_map_kernels_domain():
    """Dk x F past 128 x 64 (the backward's shared memory at 256 x 128 exceeds an SM's) takes torch's map even with
    fused=True, with and without a gradient; inside it the kernels run."""
    from tilecore.ops.linear_attention import op

    assert op._fused_map_fits(64, 32) and op._fused_map_fits(128, 64) and op._fused_map_fits(100, 40)
    assert not op._fused_map_fits(256, 128) and not op._fused_map_fits(129, 64) and not op._fused_map_fits(128, 65)
    x = torch.randn(1, 3, 1, 256).half()
    w = torch.randn(1, 256, 128) / 16
    wg = w.clone().requires_grad_(True)
    assert hedgehog_map(x, wg, fused=True).grad_fn.name() != "_HedgehogMapBackward"
    with torch.no_grad():
        assert torch.equal(hedgehog_map(x, w, fused=True), hedgehog_map(x, w, fused=False))


# the map kernels' sm_90a compile (0 bytes spilled at the shipped precisions, 64 x 32 / 64 x 64 / 128 x 64):
# test_hedgehog_map_tf32x2.py's test_tf32x2_compiles_for_sm90_without_spilling_and_with_fewer_products


def test_the_precision_switch_reaches_both_map_kernels(monkeypatch):
    """configs.HEDGEHOG_MAP_PRECISION is the dot of both map kernels under autograd for 16-bit and float32 x alike;
    the outputs are the float64 map's (the interpreter's dot ignores the precision: this checks the routing)."""
    from tilecore.ops.linear_attention import configs, kernels_forward

    seen = []
    for name in ("hedgehog_map_fused", "hedgehog_map_backward"):
        fn = getattr(kernels_forward, name)
        monkeypatch.setattr(kernels_forward, name,
                            lambda *a, _fn=fn, _n=name, **kw: seen.append((_n, kw["precision"])) or _fn(*a, **kw))
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_PRECISION", "ieee")
    torch.manual_seed(6)
    w = torch.randn(2, 16, 8) * 0.25
    for dtype in (torch.float16, torch.float32):
        seen.clear()
        x = torch.randn(1, 20, 2, 16).to(dtype)
        out, dx, dw = map_and_grads(x, w, True, torch.randn(1, 20, 2, 16).to(dtype))
        assert seen == [("hedgehog_map_fused", "ieee"), ("hedgehog_map_backward", "ieee")]
        err = (out.double() - reference(x, w)).abs().max()
        assert err < (2e-6 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps) and torch.isfinite(dx).all()
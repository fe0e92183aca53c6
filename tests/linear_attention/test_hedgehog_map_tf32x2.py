"""configs.HEDGEHOG_MAP_EXACT_X (session 35): the map kernels' products with x as one operand (x W, x^T dproj) by
kernels_forward.dot_tf32x2 (PREC "tf32x2") where x is 16-bit: a bf16 / fp16 value is exact in tf32, so tf32x3's
third product (x's rest times the other's head) is zero and two products give its accuracy; dx = dproj W^T keeps
tf32x3. Here: where the host takes it (kernels_forward.map_precision), the kernels on that path in the interpreter
(whose dot is float32: the split's arithmetic) against the float64 map and torch's, and a CPU model of the tensor
cores' tf32 reads (the low 13 mantissa bits dropped) showing dot_tf32x2's scheme at float32's accuracy for bf16 x
where one tf32 product is 1e-4 off. The GPU run (experiments/linear_attention/gpu_mamba_s35.py) checks the op."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import configs, kernels_forward
from tilecore.ops.linear_attention.op import hedgehog_map
from compiled_run import compiled_json


def test_where_the_host_takes_tf32x2(monkeypatch):
    bf, f32 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1)
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_EXACT_X", False)
    assert kernels_forward.map_precision("tf32x3", bf) == "tf32x3"
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_EXACT_X", True)
    assert kernels_forward.map_precision("tf32x3", bf) == "tf32x2"
    assert kernels_forward.map_precision("tf32x3", torch.empty(1, dtype=torch.float16)) == "tf32x2"
    assert kernels_forward.map_precision("tf32x3", f32) == "tf32x3"  # float32 x is not exact in tf32
    assert kernels_forward.map_precision("ieee", bf) == "ieee"


def map_and_grads(x, w, fused, dout):
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = hedgehog_map(xg, wg, fused=fused)
    out.backward(dout)
    return out.detach(), xg.grad, wg.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_tf32x2_kernels_are_the_float64_map(monkeypatch, dtype):
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_EXACT_X", True)
    seen = []
    for name in ("hedgehog_map_fused", "hedgehog_map_backward"):
        fn = getattr(kernels_forward, name)
        monkeypatch.setattr(kernels_forward, name, lambda *a, _fn=fn, **kw: seen.append(
            kernels_forward.map_precision(kw["precision"], a[0])) or _fn(*a, **kw))
    torch.manual_seed(4)
    B, N, H, Dk, F = 1, 90, 2, 24, 12
    x = torch.randn(B, H, N, Dk).to(dtype).transpose(1, 2)
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    dout = torch.randn(B, N, H, 2 * F).to(dtype)
    out, dx, dw = map_and_grads(x, w, True, dout)
    assert seen == ["tf32x2", "tf32x2"]
    t_out, t_dx, t_dw = map_and_grads(x, w, False, dout)
    r_out, r_dx, r_dw = map_and_grads(x.double(), w.double(), False, dout.double())
    for mine, theirs, ref in ((out, t_out, r_out), (dx, t_dx, r_dx)):
        assert accuracy.error_over_floor(mine, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(theirs, ref))
    assert (dw.double() - r_dw).abs().max() <= 1.05 * (t_dw.double() - r_dw).abs().max() + 1e-5 * r_dw.abs().max()


def tf32_read(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor as the tensor cores read it in a tf32 product: its low 13 mantissa bits dropped."""
    return (t.float().view(torch.int32) & -8192).view(torch.float32)


def test_the_two_product_split_has_float32_accuracy_for_16_bit_x():
    torch.manual_seed(5)
    x = torch.randn(256, 64).to(torch.bfloat16).float()  # exact in tf32
    w = torch.randn(64, 32) / 8
    assert torch.equal(tf32_read(x), x)
    exact = x.double() @ w.double()
    hi = tf32_read(w)  # dot_tf32x2's split of w: exact in float32
    two = tf32_read(x).double() @ tf32_read(hi).double() + tf32_read(x).double() @ tf32_read(w - hi).double()
    one = tf32_read(x).double() @ tf32_read(w).double()
    rel = lambda a: float((a - exact).abs().max() / exact.abs().max())  # noqa: E731
    assert rel(two) < 2e-6 < 1e-4 < rel(one)


COMPILE = """
import json, torch
from tilecore.ops.linear_attention import configs
from tilecore.ops.linear_attention.kernels_forward import hedgehog_map_bwd_kernel, hedgehog_map_kernel
from tilecore.ops.linear_attention.op import _map_bwd_block
from tilecore.tiles.compile import compile_kernel, resources
out = []
for Dk, F in ((64, 32), (64, 64), (128, 64)):
    for prec in sorted({"tf32x3", "tf32x2", configs.HEDGEHOG_MAP_PRECISION}):
        R, H = 65536, 16
        x = torch.empty(R, H, Dk, dtype=torch.bfloat16)
        w = torch.empty(H, Dk, F)
        feats = torch.empty(R, H, 2 * F, dtype=torch.bfloat16)
        common = dict(X=x, W=w, R=R, sxr=H * Dk, sxh=Dk, sxd=1, swh=Dk * F, swd=F, swf=1, DK=Dk, F=F, BD=Dk, BF=F,
                      PREC=prec)
        fwd = compile_kernel(hedgehog_map_kernel, dict(common, OUT=feats, sor=H * 2 * F, soh=2 * F, sof=1, BR=64),
                             num_warps=4)
        rows, warps = _map_bwd_block(Dk, F)
        bwd = compile_kernel(hedgehog_map_bwd_kernel, dict(common, DOUT=feats, DX=torch.empty_like(x),
                             DWP=torch.empty(32, H, Dk, F), ROWS_PER=2048, sdr=H * 2 * F, sdh=2 * F, sdf=1,
                             sgr=H * Dk, sgh=Dk, sgd=1, BR=rows), num_warps=warps)
        for name, c in (("fwd", fwd), ("bwd", bwd)):
            ptx = c.asm["ptx"]
            out.append(dict(vars(resources(c)), case=(name, Dk, F, prec),
                            mma=ptx.count("wgmma.mma_async") + ptx.count("mma.sync")))
print(json.dumps(out))
"""


def test_tf32x2_compiles_for_sm90_without_spilling_and_with_fewer_products():
    """hedgehog_map_kernel (64 rows / 4 warps) and hedgehog_map_bwd_kernel at op._map_bwd_block's blocks
    (configs.HEDGEHOG_MAP_BWD_BLOCKS) with PREC "tf32x2" beside "tf32x3" (and configs.HEDGEHOG_MAP_PRECISION's, were
    it another), Dk x F 64 x 32 (the benchmark's Hedgehog), 64 x 64 and 128 x 64 (the fused path's largest), compiled
    for sm_90a in a process without TRITON_INTERPRET: 0 bytes spilled, within an SM's shared memory, and tf32x2 with
    fewer tensor-core instructions (d64 F32: map bwd 60 -> 44 wgmma, fwd 24 -> 16). (The shipped kernels: the map's
    tf32x3, tf32x2 where x is 16-bit.)"""

    rows = {tuple(r["case"]): r for r in compiled_json(COMPILE, timeout=900)}
    assert len(rows) == 6 * len({"tf32x3", "tf32x2", configs.HEDGEHOG_MAP_PRECISION})
    for case, r in rows.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["shared"] <= 227 * 1024, (case, r)
        if case[3] == "tf32x2":
            assert r["mma"] < rows[case[:3] + ("tf32x3",)]["mma"], (case, r)
    assert rows[("bwd", 64, 32, "tf32x2")]["mma"] == 44 and rows[("fwd", 64, 32, "tf32x2")]["mma"] == 16

"""The configurations plans pick for other GPUs compute the right thing: each plan made for a target
(dispatch.pretend, meta tensors) is run by the op's own launch on CPU tensors through Triton's
interpreter, against float64, outputs poisoned with NaN first. The interpreter ignores pipeline
stages; what changes here is the tiles (rows a tile, keys a step) and the operands (gemm_fp8's exact
float16 upcasts where a GPU has no e4m3 tensor cores). float16 inputs: the interpreter's bf16 dot is
not bf16's."""
import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.attention import attention_reference
from tilecore.ops.attention import launch as attention_launch
from tilecore.ops.attention import plan as attention_plan
from tilecore.ops.gemm import launch as gemm_launch
from tilecore.ops.gemm import plan as gemm_plan
from tilecore.ops.gemm import reference as gemm_reference
from tilecore.ops.hadamard import hadamard_reference
from tilecore.ops.hadamard import launch as hadamard_launch
from tilecore.ops.hadamard import plan as hadamard_plan

T = dispatch.TARGETS


def planned_for(name, plan_fn, *tensors, **kwargs):
    """``plan_fn`` of meta stand-ins of ``tensors`` as on the GPU ``name``."""
    stand_ins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in tensors]
    with dispatch.pretend(T[name]):
        return plan_fn(*stand_ins, **kwargs)


@pytest.mark.parametrize("name,n", [("sm_86", 64), ("sm_89", 128), ("sm_120a", 256), ("gfx90a", 256),
                                    ("gfx942", 2048)])
def test_hadamard_fitted_tiles(name, n):
    x = torch.randn(3 * 16384 // n + 1, n, dtype=torch.float16)  # a partial last tile
    out = torch.full_like(x, float("nan"))
    p = planned_for(name, hadamard_plan.plan, x, out)
    default = planned_for("sm_90a", hadamard_plan.plan, x, out)
    assert p.path == "tl" and not (p.config["TMA_LOAD"] or p.config["TMA_STORE"])
    assert (p.config["B"], p.config["num_stages"]) != (default.config["B"], default.config["num_stages"])
    hadamard_launch.launch(p, x, out, n**-0.5)
    assert torch.isfinite(out).all(), "some outputs were never written"
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(out, ref) <= 1.05


@pytest.mark.parametrize("name", ["sm_86", "gfx90a"])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_gemm_fp8_upcast_path(name, out_dtype):
    """sm_80/86 and ROCm: e4m3 operands converted exactly to float16, multiplied by the tl kernel
    (the GPU's configuration, TL_GPU), per-row and per-column scales applied after."""
    M, N, K = 150, 136, 192  # partial tiles of 128 x 128 x 64
    a = (torch.randn(M, K) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(K, N) * 4).to(torch.float8_e4m3fn)
    scales = (torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5)
    p = planned_for(name, lambda a, b, sa, sb: gemm_plan.plan(a, b, out_dtype=out_dtype, scales=(sa, sb)),
                    a, b, *scales)
    assert p.path == "tl" and p.operand_dtype == torch.float16 and p.config["block"] == (128, 128, 64)
    out = torch.full((M, N), float("nan"), dtype=out_dtype)
    gemm_launch.launch(p, a, b, None, scales, out=out)
    assert torch.isfinite(out).all(), "some outputs were never written"
    ref = gemm_reference.gemm_fp8_f64(a, b, *scales)
    if out_dtype == torch.float32:  # float32 accumulation: below 1e-6, not at float32's floor
        assert accuracy.rel_rms(out, ref) < 1e-6
    else:
        assert accuracy.error_over_floor(out, ref) <= 1.05


@pytest.mark.parametrize("name,d,kind", [("sm_86", 128, "decode"), ("gfx90a", 128, "decode"),
                                         ("gfx942", 256, "decode"), ("gfx90a", 128, "tl")])
def test_attention_fitted_blocks(name, d, kind):
    # decode: one query (grouped heads), causal; the query-block kernel: past decode's reach
    # (plan.decode_fits), a partial key block
    b, hq, hkv, n, nk = (1, 4, 2, 1, 200) if kind == "decode" else (1, 1, 1, 520, 70)
    causal = kind == "decode"
    q = torch.randn(b, hq, n, d, dtype=torch.float16)
    k = torch.randn(b, hkv, nk, d, dtype=torch.float16)
    v = torch.randn(b, hkv, nk, d, dtype=torch.float16)
    scale = d**-0.5
    p = planned_for(name, lambda q, k, v: attention_plan.plan_forward(q, k, v, causal, scale), q, k, v)
    assert p.path == kind
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, n), float("nan"))
    attention_launch.forward(p, q, k, v, out, lse, causal, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "some outputs were never written"
    ref, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=causal, scale=scale)
    assert accuracy.error_over_floor(out, ref) <= 2.0
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)

"""The configurations the ops' plans pick on GPUs whose blocks get less shared memory, or whose Triton lacks a
feature (issue 31's other GPUs, session 35): each op's SHARED_FITS row (read through dispatch.shared_memory_fit) or
its ROCm route, as its plan makes it for a described GPU (dispatch.pretend, meta tensors), and the H100's and
A100's plans unchanged. test_sweep.py compiles these launches for sm_86 and gfx90a and checks they fit
(notes/portability.md has the sizes). The fits change stage counts, which the interpreter ignores, and routes to
paths tested on their own (fft_conv's ieee products are the interpreter's; hadamard_quantize's torch path is its
CPU path's), so these tests check the plans, not values."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention_varlen import op as varlen_op
from tilecore.ops.fft_conv import plan as fft_plan
from tilecore.ops.hadamard import quantize as hq
from tilecore.ops.linear_attention import launch as la_launch
from tilecore.ops.linear_attention import op as la_op
from tilecore.ops.linear_attention import plan as la_plan

T = dispatch.TARGETS
META = torch.device("meta")
UNCHANGED = ("sm_80", "sm_90a", "sm_100a")  # blocks of 163 KiB and more: the tables as measured on the H100


def _la_plans(name, d=128, decay=None):
    """(forward plan, backward plan) of linear_attention (B 2, N 256, H 4, Dk = Dv = d) as on GPU ``name``."""
    q, v = (torch.empty(2, 256, 4, d, dtype=torch.bfloat16, device=META) for _ in range(2))
    g = None if decay is None else torch.empty(2, 256, 4, *((d,) if decay == "channel" else ()), device=META)
    with dispatch.pretend(T[name]):
        p = la_plan.plan(q, v, g, la_plan.IDENTITY)
        return p, la_launch.backward_plan(p, q, v, g, la_plan.IDENTITY)


def test_linear_attention_channel_forward_one_stage_at_99_kib():
    # sm_86: per-channel decay's forward at D128 asked 128 KiB in two stages (99 KiB a block) -> 48 in one
    for name in ("sm_86", "sm_89", "sm_120a", "gfx90a", "gfx942"):
        assert _la_plans(name, decay="channel")[0].config["fwd_stages"] == 1, name
    for name in UNCHANGED:
        fwd, _ = _la_plans(name, decay="channel")
        assert fwd.config["fwd_stages"] == la_plan.configs.CHANNEL_FWD_BLOCKS["stages"] == 2, name
    # the other decay kinds' forwards keep their stages everywhere
    for decay in (None, "scalar"):
        assert _la_plans("sm_86", decay=decay)[0].config["fwd_stages"] == \
            _la_plans("sm_90a", decay=decay)[0].config["fwd_stages"], decay


def test_linear_attention_dq_two_stages_at_64_kib():
    # gfx90a: the split dQ kernel at D128 asked 80 KiB in three stages (64 KiB of LDS) -> 48 in two
    for decay in (None, "scalar"):
        for name in ("gfx90a", "gfx942"):
            _, bwd = _la_plans(name, decay=decay)
            assert bwd.config["split"] and bwd.config["dq_stages"] == 2, (name, decay)
        for name in ("sm_86",) + UNCHANGED:  # 96 of sm_86's 99 KiB: fits as it is
            assert _la_plans(name, decay=decay)[1].config["dq_stages"] == 3, (name, decay)


def test_linear_attention_fit_rows_are_caps_and_cumulative():
    rows = la_plan.configs.SHARED_FITS
    assert [b for b, _ in rows] == sorted((b for b, _ in rows), reverse=True)
    assert rows[0][1] == {}  # the first row (and no limit: the CPU, the interpreter) changes nothing
    for (_, above), (_, below) in zip(rows, rows[1:]):  # a smaller block keeps every cut of a larger one
        assert all(key in below and below[key] <= value for key, value in above.items())
    assert la_plan.shared_fit(torch.device("cpu")) == {}


def test_linear_attention_below_every_row_is_a_clear_error():
    with dispatch.limit_shared_memory(48 * 1024):  # no CUDA device here: the cap reaches only CUDA devices
        assert la_plan.shared_fit(torch.device("cpu")) == {}
    small = dispatch.Target("small", (9, 0), 4, 32 * 1024)
    with dispatch.pretend(small), pytest.raises(RuntimeError, match="linear_attention needs a GPU whose blocks"):
        la_plan.shared_fit(META)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_varlen_forward_fitted_on_rocm(d):
    def blocks(name, kernel):
        with dispatch.pretend(T[name]):
            return varlen_op.block_config(d, False, kernel, META)

    for kernel in ("forward", "dkdv", "dq"):
        base = varlen_op.block_config(d, False, kernel)  # no device: the tables as written
        for name in ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120a"):
            assert blocks(name, kernel) == base, (name, kernel)
        # gfx90a: the forward at D128 asked 72 KiB in three stages -> 40 in two; the rest fit as they are
        want = dict(base, num_stages=2) if (kernel, d) == ("forward", 128) else base
        for name in ("gfx90a", "gfx942"):
            assert blocks(name, kernel) == want, (name, kernel)
    assert varlen_op.block_config(d, True, "forward", META) == dict(BLOCK_M=16, BLOCK_N=16)  # the interpreter's


def test_fft_conv_float32_products_ieee_on_rocm():
    # AMD's Triton takes ieee, bf16x3 and bf16x6, not tf32x3 (a compile error on gfx90a)
    for name in ("gfx90a", "gfx942"):
        with dispatch.pretend(T[name]):
            p = fft_plan.plan(1024, META, torch.float32)
        assert (p.path, p.precision) == ("tl", "ieee"), name
    for name in ("sm_80", "sm_86", "sm_90a"):
        with dispatch.pretend(T[name]):
            p = fft_plan.plan(1024, META, torch.float32)
        assert (p.path, p.precision) == ("tl", fft_plan.configs.TL_PRECISION), name


def _quantize_path(name, fmt):
    x = torch.empty(64, 4096, dtype=torch.bfloat16, device=META)
    with dispatch.pretend(T[name]):
        return hq.plan_quantize(x, fmt, None, None, True, False, False).path


@pytest.mark.parametrize("fmt", ["int8", "int4", "mxfp4", "fp8_e5m2"])
def test_hadamard_quantize_integer_formats_route_on_rocm(fmt):
    # int8 / int4 round by CUDA's libdevice (float2int_rn), which Triton's AMD backend drops: torch's ops there
    on_rocm = fmt in hq.LIBDEVICE_FORMATS
    for name in ("gfx90a", "gfx942"):
        assert (_quantize_path(name, fmt) == "cpu") == on_rocm, (name, fmt)
    for name in ("sm_80", "sm_86", "sm_89", "sm_90a"):
        assert _quantize_path(name, fmt) != "cpu", (name, fmt)


def test_hadamard_quantize_no_inline_ptx_on_rocm():
    # PAIRS (kernels._pairs_dot: cvt.rn.bf16x2 by inline PTX) where configs.QUANT_POW2_PAIRS has it: "invalid
    # instruction" from AMD's assembler on gfx90a; two plain bf16 pieces there (the same products' pieces)
    x = torch.empty(64, 1024, dtype=torch.bfloat16, device=META)
    assert hq.configs.QUANT_POW2_PAIRS.get(("mxfp4", 1024))
    for name, pieces in (("sm_90a", -2), ("sm_86", -2), ("gfx90a", 2), ("gfx942", 2)):
        with dispatch.pretend(T[name]):
            p = hq.plan_quantize(x, "mxfp4", None, None, True, False, False)
        assert p.path == "pow2" and p.config["MID_PIECES"] == pieces, name


def test_hedgehog_map_precision_on_rocm():
    # the map kernels' tf32x3 projection: a compile error on gfx90a; float32 products (ieee) there
    for name in ("gfx90a", "gfx942"):
        with dispatch.pretend(T[name]):
            assert la_op._map_precision(META) == "ieee"
    for name in ("sm_80", "sm_86", "sm_90a"):
        with dispatch.pretend(T[name]):
            assert la_op._map_precision(META) == la_op.configs.HEDGEHOG_MAP_PRECISION
    assert la_op._map_precision(torch.device("cpu")) == la_op.configs.HEDGEHOG_MAP_PRECISION


def test_varlen_softcap_tanh_without_ptx_on_rocm():
    # SOFTCAP 2 is tanh.approx.f32 by inline PTX: LLVM aborts the process compiling it for gfx90a ("couldn't
    # allocate output register for constraint 'f'"); tanh through exp2 (1) there, as in the interpreter
    for name, mode in (("sm_86", 2), ("sm_90a", 2), ("gfx90a", 1), ("gfx942", 1)):
        with dispatch.pretend(T[name]):
            assert varlen_op.softcap_mode(30.0, META) == mode, name
            assert varlen_op.softcap_mode(0.0, META) == 0


def test_tensor_memory_is_sm_100s():
    for name, target in T.items():
        with dispatch.pretend(target):
            assert dispatch.tensor_memory(META) == (name == "sm_100a"), name
    assert not dispatch.tensor_memory(torch.device("cpu"))


@pytest.mark.parametrize("n,fmt", [(4096, "int8"), (8192, "fp8_e4m3"), (16384, "fp8_e5m2"), (4096, "mxfp4"),
                                   (256, "int4"), (256, "int8")])
def test_hadamard_quantize_tensor_memory_plans(n, fmt):
    # sm_100a (tcgen05): per-row scales at one row a tile did not compile (TMEM layouts, triton 3.6): the kron-tiled
    # kernel there; n = 256 int4 on pointers asked 232 KiB of 227: half the tile (B 64, 132 KiB). Hopper unchanged
    x = torch.empty(64, n, dtype=torch.bfloat16, device=META)

    def planned(name):
        with dispatch.pretend(T[name]):
            return hq.plan_quantize(x, fmt, hq.FORMATS[fmt].default_group, None, True, False, False)

    hopper, blackwell = planned("sm_90a"), planned("sm_100a")
    assert hopper.path == "pow2"
    per_row_one = hopper.config["B"] == 1 and hopper.config["G"] == hopper.config["N"]
    if per_row_one:
        assert blackwell.path == "fused", blackwell.path
    elif (n, fmt) in hq.configs.QUANT_TMEM_TILES:
        assert blackwell.path == "pow2" and (hopper.config["B"], blackwell.config["B"]) == (128, 64)
    else:
        assert blackwell == hopper
    assert per_row_one == (fmt in ("int8", "fp8_e4m3", "fp8_e5m2") and n >= 4096)


@pytest.mark.parametrize("name,n,tile", [("sm_86", 128, 8192), ("sm_89", 256, 16384), ("sm_120a", 256, 16384),
                                         ("gfx90a", 16, 8192), ("gfx942", 256, 8192), ("sm_80", 256, None),
                                         ("sm_90a", 256, None)])
def test_hadamard_quantize_pow2_tiles_fit_the_block(name, n, tile):
    # configs.QUANT_SHARED_FITS: n = 128 / 256 asked 104-136 KiB on sm_86 (99), n = 16..256 66-132 on gfx90a (64)
    fmt = "fp8_e5m2"  # (a format every target quantizes in the kernel)
    x = torch.empty(64, n, dtype=torch.bfloat16, device=META)
    with dispatch.pretend(T[name]):
        p = hq.plan_quantize(x, fmt, None, None, True, False, False)
    with dispatch.pretend(T["sm_80"]):
        measured = hq.plan_quantize(x, fmt, None, None, True, False, False)
    assert p.path == measured.path == "pow2"
    if tile is None:
        assert p.config["B"] == measured.config["B"]
    else:
        assert p.config["B"] * n == tile < measured.config["B"] * n

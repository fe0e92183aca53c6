"""Other GPUs (issue 31): what dispatch answers for each GPU of dispatch.TARGETS, and the path and
configuration each op's plan picks there, with no GPU here: inside dispatch.pretend(target) meta
tensors stand for tensors on that GPU. ROCm and old NVIDIA GPUs through monkeypatched device
properties (torch.version.hip, dispatch._properties)."""
import types

import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import configs as attention_configs
from tilecore.ops.attention import plan as attention_plan
from tilecore.ops.attention_decode import configs as decode_configs
from tilecore.ops.gemm import configs as gemm_configs
from tilecore.ops.gemm import plan as gemm_plan
from tilecore.ops.hadamard import configs as hadamard_configs
from tilecore.ops.hadamard import plan as hadamard_plan

KIB = 1024
T = dispatch.TARGETS
META = torch.device("meta")


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device=META)


# --------------------------------------------------------------------------------------------
# dispatch


def test_shared_memory_per_block_by_capability():
    """The CUDA C++ Programming Guide's per-block limits (each SM's shared memory less 1 KiB)."""
    table = dispatch.SHARED_MEMORY_PER_BLOCK
    assert table[8, 0] == table[8, 7] == 163 * KIB  # A100, Orin
    assert table[8, 6] == table[8, 9] == table[12, 0] == 99 * KIB  # A10/3090, L40S/4090, 5090
    assert table[9, 0] == table[10, 0] == 227 * KIB  # H100, B200
    assert dispatch.shared_memory_for(8, 8) == 99 * KIB  # unknown 8.x: the least of its generation
    assert dispatch.shared_memory_for(9, 0, rocm=True) == 64 * KIB  # MI200 reports (9, 0)
    for t in T.values():
        assert t.shared_memory == dispatch.shared_memory_for(*t.capability, rocm=t.rocm), t.name


@pytest.mark.parametrize("name", list(T))
def test_pretend_answers_for_the_target(name):
    target = T[name]
    with dispatch.pretend(target):
        assert dispatch.backend_for(META) == "kernel" and not dispatch.interpreted(META)
        assert dispatch.capability(META) == target.capability
        assert dispatch.num_sms(META) == target.sms
        assert dispatch.shared_memory_per_block(META) == target.shared_memory
        assert dispatch.is_rocm(META) == target.rocm
        assert dispatch.is_hopper(META) == (name == "sm_90a")  # not gfx90a, which also reports (9, 0)
        assert dispatch.gluon_ok(META) == (name == "sm_90a")
        assert dispatch.tma_ok(META) == (name in ("sm_90a", "sm_100a", "sm_120a"))
        assert dispatch.fp8_ok(META) == (name in ("sm_89", "sm_90a", "sm_100a", "sm_120a"))
        # CPU tensors are untouched
        assert dispatch.capability(torch.device("cpu")) is None
        assert dispatch.shared_memory_per_block(torch.device("cpu")) is None
    gpu_target = target.gpu_target()
    assert gpu_target.backend == ("hip" if target.rocm else "cuda")
    assert gpu_target.arch == (name if target.rocm else int(name[3:].rstrip("a")))


def test_meta_tensors_are_no_gpu_outside_pretend():
    with pytest.raises(TypeError, match="CUDA and CPU tensors"):
        dispatch.backend_for(META)
    with pytest.raises(TypeError, match="only inside dispatch.pretend"):
        dispatch.num_sms(META)
    assert dispatch.capability(META) is None and dispatch.shared_memory_per_block(META) is None


@pytest.fixture
def cuda_device(monkeypatch):
    """``cuda_device(major, minor, name, hip=None)``: torch.device("cuda", 0) with these properties
    (torch.version.hip set for ROCm); dispatch's per-device caches cleared around the test."""
    caches = (dispatch._gpu_problem, dispatch._shared_memory)

    def make(major, minor, name, hip=None):
        for cache in caches:
            cache.cache_clear()
        props = types.SimpleNamespace(major=major, minor=minor, name=name, multi_processor_count=100)
        monkeypatch.setattr(dispatch, "_properties", lambda index: props)
        monkeypatch.setattr(torch.version, "hip", hip)
        return torch.device("cuda", 0)

    yield make
    for cache in caches:
        cache.cache_clear()


def test_rocm_never_takes_the_nvidia_only_paths(cuda_device):
    """torch reports (9, 0) for an MI200's gfx90a: dispatch must not read it as Hopper."""
    device = cuda_device(9, 0, "AMD Instinct MI250X", hip="6.2.41133")
    assert dispatch.capability(device) == (9, 0) and dispatch.is_rocm(device)
    assert not dispatch.is_hopper(device) and not dispatch.gluon_ok(device)
    assert not dispatch.tma_ok(device) and not dispatch.fp8_ok(device)
    assert dispatch.backend_for(device) == "kernel" and dispatch.gpu_problem(device) is None
    # no triton driver here: the documented LDS a workgroup gets
    assert dispatch.shared_memory_per_block(device) == 64 * KIB


def test_nvidia_hopper_and_ampere_by_properties(cuda_device):
    device = cuda_device(9, 0, "NVIDIA H100 80GB HBM3")
    assert dispatch.is_hopper(device) and dispatch.tma_ok(device) and dispatch.fp8_ok(device)
    assert not dispatch.is_rocm(device)
    assert dispatch.shared_memory_per_block(device) == 227 * KIB
    device = cuda_device(8, 6, "NVIDIA A10")
    assert not (dispatch.is_hopper(device) or dispatch.tma_ok(device) or dispatch.fp8_ok(device))
    assert dispatch.shared_memory_per_block(device) == 99 * KIB


def test_gpus_older_than_ampere_get_a_clear_error(cuda_device):
    device = cuda_device(7, 5, "Tesla T4")
    with pytest.raises(RuntimeError, match=r"compute capability 8\.0 or newer.*Tesla T4 is 7\.5.*CPU"):
        dispatch.backend_for(device)


def test_shared_memory_fit_picks_the_first_row_the_gpu_reaches():
    rows = ((163 * KIB, "large"), (99 * KIB, "mid"), (64 * KIB, "small"))
    cpu = torch.device("cpu")
    assert dispatch.shared_memory_fit(cpu, rows, "op") == "large"  # no limit: as measured
    for name, expected in (("sm_80", "large"), ("sm_90a", "large"), ("sm_86", "mid"), ("sm_120a", "mid"),
                           ("gfx90a", "small")):
        with dispatch.pretend(T[name]):
            assert dispatch.shared_memory_fit(META, rows, "op") == expected, name
    tiny = dispatch.Target("tiny", (8, 0), 10, 48 * KIB)
    with dispatch.pretend(tiny), pytest.raises(RuntimeError, match="op needs .* at least 64 KiB .* gives 48 KiB"):
        dispatch.shared_memory_fit(META, rows, "op")


# --------------------------------------------------------------------------------------------
# the plans on each target


@pytest.mark.parametrize("name", list(T))
def test_gemm_paths(name):
    a, b = meta(4096, 4096), meta(4096, 4096)
    with dispatch.pretend(T[name]):
        p = gemm_plan.plan(a, b, out_dtype=torch.bfloat16)
        assert p.path == ("gluon" if name == "sm_90a" else "tl")
        if p.path == "tl":
            assert p.config is gemm_configs.TL_GPU and p.notice == gemm_plan.NOT_HOPPER
        a8, b8 = meta(4096, 4096, dtype=torch.float8_e4m3fn), meta(4096, 4096, dtype=torch.float8_e4m3fn)
        p = gemm_plan.plan(a8, b8, out_dtype=torch.bfloat16, scales=(meta(4096, 1, dtype=torch.float32),
                                                                    meta(1, dtype=torch.float32)))
    if name == "sm_90a":
        assert p.path == "gluon"
    elif name in ("sm_89", "sm_100a", "sm_120a"):  # e4m3 tensor cores: the tl kernel on fp8 itself
        assert p.path == "tl" and p.operand_dtype is None
    else:  # sm_80, sm_86, ROCm: exact float16 upcasts, said once
        assert p.path == "tl" and p.operand_dtype == torch.float16 and p.notice == gemm_plan.FP8_UPCAST
        assert p.scales == 2 and p.c_dtype == torch.bfloat16


def _hadamard(name, n, rows, dtype=torch.bfloat16):
    x = meta(rows, n, dtype=dtype)
    with dispatch.pretend(T[name]):
        return hadamard_plan.plan(x, torch.empty_like(x))


def _tl_tuning(n, fp32=False, **overrides):
    cfg = hadamard_plan.tl_config(n, fp32=fp32, **overrides)
    return cfg["B"], cfg["num_stages"]


@pytest.mark.parametrize("name", list(T))
def test_hadamard_configs_fit_the_target(name):
    """Every (n, dtype) the plan serves takes SHARED_FITS's row for the target's limit, on pointers
    where the target has no TMA units or a smaller limit."""
    limit = T[name].shared_memory
    fit = next(value for least, value in hadamard_configs.SHARED_FITS if limit >= least)
    for dtype in (torch.bfloat16, torch.float32):
        fp32 = dtype == torch.float32
        for n in (n for n in hadamard_configs.SPLITS if n >= 16):
            p = _hadamard(name, n, hadamard_configs.TMA_MIN_ELEMENTS // n, dtype)
            if p.path == "gluon":
                assert name == "sm_90a" and not fp32 and n in hadamard_configs.GLUON_SIZES
                continue
            cfg = p.config
            tma = cfg["TMA_LOAD"] or cfg["TMA_STORE"]
            if fit is not None or name not in ("sm_90a", "sm_100a"):
                assert not tma, (name, n)
            if fit is not None:
                assert (cfg["B"], cfg["num_stages"]) == _tl_tuning(n, fp32, **fit.get((n, fp32), {})), (name, n)
            elif not tma:
                assert (cfg["B"], cfg["num_stages"]) == _tl_tuning(n, fp32), (name, n)


def test_hadamard_fits_named():
    """The rows issue 31 found: n = 64..256 (16-bit) and float32 n = 32768 on 99 KiB GPUs."""
    assert (_hadamard("sm_86", 64, 4096).config["B"], _hadamard("sm_90a", 64, 4096).config["B"]) == (128, 256)
    assert _hadamard("sm_89", 256, 4096).config["B"] == 64
    assert _hadamard("sm_120a", 32768, 64, torch.float32).config["num_stages"] == 1
    assert _hadamard("sm_80", 32768, 64, torch.float32).config["num_stages"] == 2
    assert _hadamard("gfx942", 2048, 4096).config["num_stages"] == 2
    # TMA where it was timed (sm_90a, n = 256), pointers where descriptors would be plain loads
    assert _hadamard("sm_90a", 256, 65536).config["TMA_LOAD"]
    assert not _hadamard("sm_80", 256, 65536).config["TMA_LOAD"]
    tiny = dispatch.Target("tiny", (8, 0), 10, 48 * KIB)
    x = meta(64, 64)
    with dispatch.pretend(tiny), pytest.raises(RuntimeError, match="hadamard_transform needs .* 64 KiB"):
        hadamard_plan.plan(x, torch.empty_like(x))


@pytest.mark.parametrize("name", list(T))
def test_attention_paths_and_configs(name):
    limit = T[name].shared_memory
    fit = next(value for least, value in attention_configs.SHARED_FITS if limit >= least) or {}
    for d in (64, 128, 256):
        q, k = meta(2, 4, 1024, d), meta(2, 4, 1024, d)
        with dispatch.pretend(T[name]):
            fwd = attention_plan.plan_forward(q, k, k, True, d**-0.5)
            bwd = attention_plan.plan_backward(q, q, k, k, True, d**-0.5)
            dec = attention_plan.plan_forward(meta(2, 32, 1, d), meta(2, 8, 4096, d), meta(2, 8, 4096, d), True,
                                              d**-0.5)
        gluon = name == "sm_90a" and d in attention_configs.GLUON_FORWARD
        assert fwd.path == ("gluon" if gluon else "tl") and bwd.path == fwd.path
        assert dec.path == "decode"
        for kind, p, default in (("forward", fwd, attention_configs.forward_config(d, False)),
                                 ("backward", bwd, attention_configs.backward_config(d, False)),
                                 ("decode", dec, decode_configs.decode_config(d, False))):
            if p.path == "gluon":
                continue
            rows = fit.get(kind, {})
            over = rows[min(b for b in rows if d <= b)] if any(d <= b for b in rows) else {}
            assert {k: p.config[k] for k in default} == {**default, **over}, (name, kind, d)
    with dispatch.pretend(T["sm_86"]):
        dec = attention_plan.plan_forward(meta(1, 32, 1, 128), meta(1, 8, 4096, 128), meta(1, 8, 4096, 128), False, 1.0)
    assert dec.config["num_stages"] == 2 and dec.config["BLOCK_N"] == 128
    with dispatch.pretend(T["gfx90a"]):
        dec = attention_plan.plan_forward(meta(1, 32, 1, 256), meta(1, 8, 4096, 256), meta(1, 8, 4096, 256), False, 1.0)
    assert dec.config["BLOCK_N"] == 32

"""e4m3 where Triton has none (issue 31's other GPUs, session 33): Triton 3.6 refuses its fp8e4nv type below sm_89
("fp8e4nv not supported in this architecture"), even to store codes, so hadamard_quantize's e4m3 formats (fp8_e4m3
codes, nvfp4's block scales) and attention_fp8's rotate_quantize raised that raw error on an A100 / A10 / 3090
(found by compiling their recorded launches for sm_80 / sm_86 here). They now take torch's ops on the device there
(dispatch.fp8_ok False: sm_80, sm_86, ROCm), and every kernel a target still gets compiles for it. CPU only: the
GPUs are described by dispatch.pretend (meta tensors), the launches recorded and compiled for the target."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilecore import dispatch
from tilecore.ops.hadamard import quantize as hq
from tilecore.ops.hadamard.quantize_reference import FORMATS

T = dispatch.TARGETS
META = torch.device("meta")

ROOT = Path(__file__).resolve().parents[2]


def _x(rows=64, n=4096):
    return torch.empty(rows, n, dtype=torch.bfloat16, device=META)


@pytest.mark.parametrize("name", list(T))
def test_e4m3_formats_take_torchs_ops_where_triton_has_no_e4m3(name):
    target = T[name]
    no_e4m3 = name in ("sm_80", "sm_86", "gfx90a", "gfx942")
    with dispatch.pretend(target):
        assert dispatch.fp8_ok(META) is not no_e4m3
        for fmt, f in FORMATS.items():
            plan = hq.plan_quantize(_x(), fmt, f.default_group, None, True, False, False)
            torch_ops = plan.path == "cpu"
            # (and int8 / int4 on ROCm: their libdevice rounding, session 35; test_fitted_configs.py)
            want = (no_e4m3 and fmt in hq.E4M3_FORMATS) or (target.rocm and fmt in hq.LIBDEVICE_FORMATS)
            assert torch_ops == want, (name, fmt, plan.path)


# Recording and compiling need Triton's compiled-mode kernels: a fresh process without TRITON_INTERPRET (the tests
# run under it). It prints one JSON line: {case: result}.
_PROBE = r"""
import json, torch
from tilecore import dispatch, portability
from tilecore.ops.attention_fp8 import quantize as aq
from tilecore.ops.hadamard import quantize as hq
from tilecore.ops.hadamard.quantize_reference import FORMATS
from tilecore.tiles.compile import compile_kernel

T, META = dispatch.TARGETS, torch.device("meta")


def recorded(target, call):
    launches = []
    with dispatch.pretend(target), portability.recording(launches):
        result = call()
    return launches, result


def compiled(target, launches):
    out, seen = [], set()
    for kernel, args, kwargs in launches:
        named, options = portability.named_arguments(kernel, args, kwargs)
        key = portability.compile_key(kernel, named, options)
        if key in seen:
            continue
        seen.add(key)
        try:
            k = compile_kernel(kernel, named, target=target.gpu_target(), **{"num_warps": 4, **options})
            out.append([portability.kernel_name(kernel), int(k.metadata.shared) <= target.shared_memory])
        except Exception as err:  # noqa: BLE001
            out.append([portability.kernel_name(kernel), portability._innermost(err)])
    return out


res = {}
x = lambda: torch.empty(64, 4096, dtype=torch.bfloat16, device=META)
for fmt, f in FORMATS.items():
    launches, (codes, _, _) = recorded(T["sm_86"], lambda: hq._impl(x(), fmt, None, f.default_group, None, True, None))
    res["sm_86 " + fmt] = {"codes": str(codes.dtype), "compiled": compiled(T["sm_86"], launches)}
fp8_ok = dispatch.fp8_ok
dispatch.fp8_ok = lambda device: True  # the guard's reason: sm_86 given the e4m3 kernel
launches, _ = recorded(T["sm_86"], lambda: hq._impl(x(), "fp8_e4m3", None, None, None, True, None))
res["sm_86 fp8_e4m3 unguarded"] = compiled(T["sm_86"], launches[:1])
dispatch.fp8_ok = fp8_ok
q = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16, device=META)
descale = torch.empty(1, dtype=torch.float32, device=META)
for name in ("sm_80", "sm_86", "gfx90a", "sm_89", "sm_90a"):
    launches, (codes, ds) = recorded(T[name], lambda: aq.rotate_quantize(q, rotate=False, scales="tensor",
                                                                         descale=descale))
    res["rotate_quantize " + name] = {"codes": str(codes.dtype), "shape": list(codes.shape), "same_descale": ds is descale,
                                      "compiled": compiled(T[name], launches) if name == "sm_89" else
                                      [portability.kernel_name(k) for k, _, _ in launches]}
print("PROBE " + json.dumps(res))
"""


@pytest.fixture(scope="module")
def probe():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    lines = [line for line in r.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


def test_hadamard_quantize_on_sm86_compiles_every_kernel_it_launches(probe):
    """sm_86 (A10, 3090): every kernel a format launches compiles there and fits; the e4m3 formats launch no quantize
    kernel (their rotation is hadamard_transform's, whose kernels the portability sweep compiles for sm_86)."""
    for fmt in FORMATS:
        got = probe[f"sm_86 {fmt}"]
        quantize_kernels = [name for name, _ in got["compiled"] if "quantize" in name]
        assert bool(quantize_kernels) is (fmt not in hq.E4M3_FORMATS), (fmt, got)
        assert all(ok is True for _, ok in got["compiled"]), (fmt, got)
        assert got["codes"] == ("torch.float8_e4m3fn" if fmt == "fp8_e4m3" else "torch.float8_e5m2"
                                if fmt == "fp8_e5m2" else "torch.int8" if fmt == "int8" else "torch.uint8"), got


def test_why_the_guard_the_e4m3_kernel_does_not_compile_for_sm86(probe):
    """The guard's reason, kept as a test: with dispatch.fp8_ok forced on, sm_86 gets the fp8_e4m3 quantize kernel,
    and Triton refuses to compile it (a Triton that compiles it would let the guard go: see dispatch.fp8_ok)."""
    (name, result), = probe["sm_86 fp8_e4m3 unguarded"]
    assert "quantize" in name and isinstance(result, str) and "fp8e4nv not supported" in result


@pytest.mark.parametrize("name", ["sm_80", "sm_86", "gfx90a", "sm_89", "sm_90a"])
def test_rotate_quantize_takes_torchs_ops_where_triton_has_no_e4m3(probe, name):
    """attention_fp8's rotate_quantize (attention_fp8_rotated's quantizer): its tl kernel where Triton has e4m3
    (compiled for sm_89 here), torch's ops elsewhere, codes in e4m3 either way."""
    got = probe[f"rotate_quantize {name}"]
    assert got["codes"] == "torch.float8_e4m3fn" and got["shape"] == [1, 2, 256, 128] and got["same_descale"]
    if name == "sm_89":
        assert got["compiled"] == [["attention_fp8.kernels_tl.rotate_quantize", True]]
    else:
        assert got["compiled"] == (["attention_fp8.kernels_tl.rotate_quantize"] if name == "sm_90a" else [])

"""``tilecore env`` says what runs where (issue 31: a user off the H100): for this machine, and with ``--target``
for any GPU of dispatch.TARGETS described by dispatch.pretend (no GPU needed): the portable Triton kernels and
the block's shared memory, the Gluon kernels on Hopper alone (and not under an untested triton), e4m3 where
Triton has it, a clear refusal below sm_80; and the installed triton against the releases the Gluon kernels
were compile-checked and run under."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilecore import dispatch, env

ROOT = Path(__file__).resolve().parents[2]
T = dispatch.TARGETS
META = torch.device("meta")


def paths(target):
    with dispatch.pretend(target):
        return env.fast_paths(META)


@pytest.mark.parametrize("name", list(T))
def test_each_target_gets_its_paths(name):
    target = T[name]
    p = paths(target)
    assert p["Triton kernels"] == f"compiled for {name} ({target.shared_memory // 1024} KiB of shared memory a block)"
    gluon, fp8 = p["Gluon (TMA, wgmma) kernels"], p["FP8 (e4m3) kernels"]
    assert (gluon == "yes (sm_90a)") == (name == "sm_90a")
    if target.rocm:
        assert gluon.startswith("no: NVIDIA Hopper only")
    elif name != "sm_90a":
        assert gluon == f"no: needs sm_90, this is {name}: the portable Triton kernels run"
    no_e4m3 = name in ("sm_80", "sm_86", "gfx90a", "gfx942")
    assert fp8.startswith("no: Triton has no e4m3") == no_e4m3, fp8
    if not no_e4m3:
        assert fp8 == ("yes" if name == "sm_90a" else "yes (the portable Triton kernels: attention_fp8's tl forward)")


def test_hopper_under_an_untested_triton_says_the_portable_kernels_run(monkeypatch):
    problem = "triton 9.9.9 is not one the Gluon kernels were compile-checked under (3.6.0; ran on a GPU: 3.6.0)"
    monkeypatch.setattr(dispatch, "gluon_triton_problem", lambda: problem)
    p = paths(T["sm_90a"])
    assert p["Gluon (TMA, wgmma) kernels"] == f"no: {problem}: the portable Triton kernels run instead (slower)"
    assert p["FP8 (e4m3) kernels"].startswith("yes (the portable Triton kernels")
    assert env.triton_support() == f"{problem}; a Hopper GPU would run the portable Triton kernels"


def test_a_gpu_older_than_ampere_is_refused_clearly():
    t4 = dispatch.Target("sm_75", (7, 5), 40, 64 * 1024, example="T4")
    p = paths(t4)
    assert p["Triton kernels"].startswith("no: ") and "7.5" in p["Triton kernels"] and "CPU" in p["Triton kernels"]
    assert p["Gluon (TMA, wgmma) kernels"] == "no" and p["FP8 (e4m3) kernels"] == "no"


def test_the_installed_triton_is_named_against_the_tested_releases():
    import triton

    from tilecore.tiles.gluon import compat

    line = env.triton_support()
    assert line.startswith(f"triton {triton.__version__}: ")
    assert "compile-checked" in line
    assert ("ran on an H100" in line) == (compat.release() in compat.RAN_ON_GPU)


def test_cli_env_target():
    r = subprocess.run([sys.executable, "-m", "tilecore", "env", "--target", "sm_86,gfx90a"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\nsm_86 (A40, A10, RTX 3090):\n  Triton kernels: compiled for sm_86 (99 KiB" in r.stdout
    assert "gfx90a" in r.stdout and "triton " in r.stdout
    bad = subprocess.run([sys.executable, "-m", "tilecore", "env", "--target", "sm_99"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "unknown --target sm_99" in bad.stderr and "Traceback" not in bad.stderr


def test_the_launch_path_says_whether_kept_launches_call_tritons_launcher_directly(monkeypatch):
    import triton.backends.nvidia.driver as nvidia_driver

    direct = getattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", None) == 13
    line = env.launch_path()
    assert line.startswith("kept launches: ") and ("called directly" in line) == direct and "off (" not in line
    monkeypatch.setattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", 16, raising=False)
    assert "through Triton's runner" in env.launch_path()

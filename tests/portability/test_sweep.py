"""Every kernel each op's plan picks on each GPU of dispatch.TARGETS (sm_80, sm_86, sm_89, sm_90a,
sm_100a, sm_120a; gfx90a, gfx942) compiles for that GPU on this CPU, and asks for no more shared memory
than one block may use there: ``python -m tilecore.portability --quick`` (its docstring says which
cases quick compiles) in a fresh process, TRITON_INTERPRET unset. Each target gets a path: no plan
refuses a target of the table."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TL_KERNELS = {"gemm.kernels.gemm_kernel", "hadamard.kernels.hadamard_kernel", "hadamard.butterfly.butterfly_kernel",
              "hadamard.kernels_kron.kron_kernel",
              "attention.kernels_tl.attn_fwd", "attention_decode.kernels_tl.attn_fwd_split_keys",
              "attention_decode.kernels_tl.attn_merge_splits", "attention.kernels_tl.attn_bwd_delta",
              "attention.kernels_tl.attn_bwd_dkdv", "attention.kernels_tl.attn_bwd_dq"}
GLUON_KERNELS = {"gemm.gluon_kernels.gemm_kernel", "hadamard.gluon_kernels.hadamard_gluon_kernel",
                 "attention.gluon_kernels.attention_fwd_kernel", "attention_backward.gluon_backward.attention_bwd_kernel"}


# Launches found not to fit, with why: owned by their op, kept out of test_every_kernel_compiles_and_fits
# and asserted by test_known_misfits (a strict xfail: once they fit it fails, and they leave this list).
# (kernel, text of the case name) -> why
KNOWN_MISFITS = {
    ("hadamard.kernels_kron.kron_kernel", "n=704512"):
        "kron.py's two-pass mixing with M_PAD = 256 (m = 140..172, 2^k > 1024; here 172 x 4096) asks 176 KiB "
        "on sm_80/86, 336 on sm_90a (of 227: OutOfResources on the H100 too), 160 on gfx90a",
    ("hadamard.kernels_kron.kron_kernel", "float32 n=20480"):
        "kron.py's fused tile in float32 (20 x 1024: M_PAD 32 x 1024 elements) asks 146 KiB on sm_86 (99), "
        "130 on gfx90a (64); kron_plan has no fit check for smaller GPUs yet",
}


def known_misfit(row) -> bool:
    return any(row.get("kernel") == kernel and text in row["case"] for kernel, text in KNOWN_MISFITS)


def failed(row) -> bool:
    return "error" in row or ("fits" in row and not row["fits"])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("portability") / "sweep.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "tilecore.portability", "--quick", "-j", "2", "--json", str(out)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    print(r.stdout[-6000:])  # the table, shown by pytest -rA or on a failure
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())["rows"], r


def test_every_kernel_compiles_and_fits(sweep):
    rows, run = sweep
    bad = [r for r in rows if failed(r) and not known_misfit(r)]
    assert not bad, "\n".join(f"{r['target']} {r['case']} {r['kernel']}: {r.get('error') or r['shared']}" for r in bad)
    assert run.returncode == 0 or any(failed(r) for r in rows if known_misfit(r)), run.stderr[-3000:]


@pytest.mark.xfail(strict=True, reason="; ".join(KNOWN_MISFITS.values()))
def test_known_misfits(sweep):
    rows, _ = sweep
    misfits = [r for r in rows if known_misfit(r) and failed(r)]
    assert not misfits, "\n".join(f"{r['target']} {r['case']}: {r.get('shared', 0) // 1024} KiB of "
                                   f"{r['limit'] // 1024}" for r in misfits)


def test_every_target_gets_a_path(sweep):
    rows, _ = sweep
    from tilecore import dispatch

    refused = [f"{r['target']} {r['op']} {r['case']}: {r['refused']}" for r in rows if "refused" in r]
    assert not refused, "\n".join(refused)
    assert {r["target"] for r in rows} == set(dispatch.TARGETS)


def test_every_shipped_kernel_is_compiled_for_every_full_target(sweep):
    rows, _ = sweep
    from tilecore import portability

    for target in {r["target"] for r in rows} - set(portability.QUICK_OPS):
        compiled = {r["kernel"] for r in rows if r["target"] == target and "shared" in r}
        recorded = {r["kernel"] for r in rows if r["target"] == target and "kernel" in r}
        if target == "sm_90a":  # Hopper takes the Gluon kernels where they fit (compiled by the Hopper tests)
            assert GLUON_KERNELS <= recorded, (target, recorded)
            assert {"hadamard.kernels.hadamard_kernel", "attention.kernels_tl.attn_fwd",
                    "attention_decode.kernels_tl.attn_fwd_split_keys", "gemm.kernels.gemm_kernel"} <= compiled
        else:
            assert TL_KERNELS <= compiled, (target, TL_KERNELS - compiled)
            assert not recorded & GLUON_KERNELS, target  # never the NVIDIA Hopper code elsewhere


def test_fp8_compiles_where_the_gpu_has_e4m3(sweep):
    rows, _ = sweep
    fp8 = {r["target"]: r for r in rows if r["op"] == "gemm" and r["case"].startswith("fp8") and "shared" in r}
    assert {"sm_89", "sm_100a", "sm_120a", "sm_80", "sm_86", "gfx90a", "gfx942"} <= set(fp8)

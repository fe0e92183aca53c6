"""The Gluon kernels across triton releases.

The compile matrix: one variant of each Gluon kernel (the stream-K GEMM, the Hadamard kernel, the
attention forward, backward with the dQ warpgroup, and the dq kernel) compiled for sm_90a under every
release ``tilecore.tiles.gluon.compat.TESTED`` names, each in a venv of its own
(``scripts/compile_matrix.sh --quick``: the venvs are cached under ~/.cache/tilecore-matrix; building
one downloads triton, about a minute). A version whose venv cannot be built (no network) is skipped,
saying so; a kernel that fails to compile under any version fails here.

And the dispatch side: under a triton that is not in TESTED, Hopper goes to the portable Triton kernels
with one warning naming the version and those tested.
"""
import ast
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
QUICK = {"gemm bf16 stream-K", "hadamard n=16384 bfloat16", "attention fwd d64 causal",
         "attention bwd d64 warpgroup causal", "attention dq d64 causal"}


def _tested() -> tuple:
    """compat.TESTED, read from the source (the matrix is parametrized before anything imports triton)."""
    tree = ast.parse((ROOT / "tilecore/tiles/gluon/compat.py").read_text())
    return next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TESTED")


VERSIONS = _tested()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix") / "matrix.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(["bash", str(ROOT / "scripts/compile_matrix.sh"), "--quick", "-j", "2", "--json", str(out),
                        *VERSIONS], capture_output=True, text=True, env=env, timeout=1800)
    print(r.stdout)  # the table, shown by pytest -rA or on a failure
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_gluon_kernels_compile_under(matrix, version):
    report, table = matrix
    result = report[version]
    if result["status"] == "novenv":
        pytest.skip(f"no venv with triton {version} could be built (no network to PyPI?):\n{table}")
    failed = {r["kernel"]: r["error"] for r in result["rows"] if "error" in r}
    assert not failed and result["status"] == "ok", f"triton {version}: {failed}\n{table}"
    assert {r["kernel"] for r in result["rows"]} == QUICK, table
    for r in result["rows"]:
        assert r["wgmma"] and r["tma"] and r["mbarrier"], (version, r)
        assert r["shared"] <= 227 * 1024, (version, r)


def test_compat_is_triton_itself_where_nothing_differs():
    """Under 3.6 (the GPU machine's triton) compat hands the kernels triton's own modules, so their PTX
    is what it was before compat existed; every release lacks nothing compat's REQUIRED names."""
    import triton
    from triton.experimental.gluon import language
    from triton.experimental.gluon.language.nvidia.hopper import tma

    from tilecore.tiles.gluon import compat

    assert compat.missing() == []
    assert compat.problem() is None
    if compat.release() == "3.6.0":
        assert compat.gl is language and compat.tma is tma and compat.SHIMS == []
    assert compat.release("3.6.0+git1a2b3c") == "3.6.0"
    assert compat.release() in compat.TESTED, triton.__version__


@pytest.fixture
def fresh_gluon_check():
    from tilecore import dispatch

    dispatch.gluon_triton_problem.cache_clear()
    dispatch._gluon_triton_ok.cache_clear()
    yield dispatch
    dispatch.gluon_triton_problem.cache_clear()
    dispatch._gluon_triton_ok.cache_clear()


def test_untested_triton_sends_hopper_to_portable_kernels_with_one_warning(fresh_gluon_check, monkeypatch):
    import triton

    from tilecore.tiles.gluon import compat

    dispatch = fresh_gluon_check
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    monkeypatch.setattr(compat, "TESTED", ("3.0.0", "3.1.0"))
    device = torch.device("cuda")  # never touched: is_hopper answers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [dispatch.gluon_ok(device) for _ in range(3)] == [False] * 3
    assert len(caught) == 1 and issubclass(caught[0].category, RuntimeWarning)
    message = str(caught[0].message)
    assert triton.__version__ in message and "3.0.0, 3.1.0" in message and "portable Triton kernels" in message
    assert dispatch.gluon_triton_problem() is not None


def test_tested_triton_keeps_hopper_on_gluon(fresh_gluon_check, monkeypatch):
    dispatch = fresh_gluon_check
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not dispatch.gluon_ok(torch.device("cpu"))  # not Hopper: never asks triton
        monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
        assert dispatch.gluon_ok(torch.device("cuda"))
    assert dispatch.gluon_triton_problem() is None

"""The GLA backward's Gluon dq / dk kernel (gluon_gla_bwd.gla_dqk_gluon_kernel, CHUNKED dqk_gluon): where the launcher
routes to it, and that it compiles for sm_90a on this GPU-less machine (TMA loads, wgmma not serialized, mbarriers,
two consumer warpgroups and a producer warp, within Hopper's 227 KiB of shared memory). Gluon does not run in Triton's
interpreter: its tl twin, gla_dqk_flat_kernel (the same chunk formulas, the same outputs and flags), is checked against
float64 there (test_gla_backward_dqk.py -k flat), and experiments/linear_attention/gpu_gla_gluon_s36.py checks this
kernel on the GPU against float64."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tilecore import dispatch
from tilecore.ops.linear_attention import configs_gla_bwd, gluon_gla_bwd
from tilecore.ops.linear_attention import kernels_backward_gla_chunked as kc
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan

META = torch.device("meta")  # described as an H100 inside dispatch.pretend


def _dqk_step(D, N=256, dtype=torch.bfloat16, g_dtype=torch.float32, **over):
    """The dqk common launch's (kernel name, options) that backward plans for an H100 at B1 H2 N Dk = Dv = D."""
    q = torch.empty(1, N, 2, D, dtype=dtype, device=META)
    g = torch.empty(1, N, 2, D, dtype=g_dtype, device=META)
    s = torch.empty(1, 2, D, D, device=META)
    steps = []
    with dispatch.pretend(dispatch.TARGETS["sm_90a"]):
        kc.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1, steps=steps, **over)
    step = next(st for st in steps if st[0] == "dqk0w")
    kernel = step[1]
    return getattr(kernel, "__name__", None) or kernel.fn.__name__, step[4]


def test_gluon_dqk_where_switched_on_and_it_fits():
    """dqk_gluon n: the Gluon kernel at d 128 and d 64 (a ring of n stages, the flat launch's places) in bf16 and
    fp16 (the factor span 64 / 8, the tl kernels' rule); elsewhere the tl launches: off, N not a multiple of the
    chunk (at d 32, one key block a chunk: of two chunks), the flat launch off. configs': on at d 128, 64 and 32 (FORM
    1538 + PIECES_RZ + DG_TWO at d 128 and d 64, 1538 + J_SMEM + DG_TWO at d 32) with bf16 inputs; fp16 at d 64 keeps the flat launch (dqk_gluon_scan off: the scans lost to it there)."""
    for D in (128, 64):
        name, kw = _dqk_step(D, dqk_gluon=2)
        assert name == "gla_dqk_gluon_kernel" and kw["STAGES"] == 2 and kw["SPAN"] == 64.0, (D, kw)
        assert kw["num_warps"] == 4 and kw["num_tiles"] == 2 * (256 // 64) * (D // 64), kw
        assert _dqk_step(D, dtype=torch.float16, dqk_gluon=3, dqk_gluon_scan=True)[1]["SPAN"] == 8.0
        assert _dqk_step(D, dqk_gluon=0)[0] == "gla_dqk_flat_kernel"
    # configs': on at d 128 and d 64 (CHUNKED_FLAT_DIMS); at d 64 fp16 (the scans) keeps the flat tl launch
    assert _dqk_step(128)[0] == "gla_dqk_gluon_kernel" and _dqk_step(128)[1]["STAGES"] == 2
    assert _dqk_step(128)[1]["FORM"] == D128 and "FORM" not in _dqk_step(128, dtype=torch.float16)[1]
    assert _dqk_step(64)[0] == "gla_dqk_gluon_kernel" and _dqk_step(64)[1]["STAGES"] == 2
    assert _dqk_step(64)[1]["FORM"] == D64  # (2 + STORE_TMA + DG_TMA + PIECES_RZ: float32 g)
    assert _dqk_step(64, g_dtype=torch.bfloat16)[1]["FORM"] == D64_BF16_G  # (dg through p1, p2: DG_LATE)
    assert _dqk_step(64, dtype=torch.float16)[0] == "gla_dqk_flat_kernel"
    assert _dqk_step(64, dtype=torch.float16, dqk_gluon_scan=True)[0] == "gla_dqk_gluon_kernel"
    # FORM 2 (the sums over tokens by bf16 dots) with bf16 inputs only
    assert _dqk_step(128, dqk_gluon_form=2)[1]["FORM"] == 2
    assert "FORM" not in _dqk_step(128, dtype=torch.float16, dqk_gluon_form=2)[1]
    assert "FORM" not in _dqk_step(128, dtype=torch.float16, dqk_gluon_form=38)[1]
    for case in (dict(D=128, N=1000), dict(D=32, N=192), dict(D=128, dqk_flat=0)):
        assert _dqk_step(**case, dqk_gluon=2)[0] in ("gla_dqk_kernel", "gla_dqk_flat_kernel"), case
    # configs' d 32: a pair of chunks a tile (CHUNKED_FLAT_DIMS)
    assert _dqk_step(32)[0] == "gla_dqk_gluon_kernel" and _dqk_step(32)[1]["CHUNKS"] == 2
    assert _dqk_step(32)[1]["STAGES"] == configs_gla_bwd.CHUNKED_FLAT_DIMS[(32, 32)]["dqk_gluon"]
    assert _dqk_step(32)[1]["FORM"] == D32
    # d 32 (one key block of 32 a chunk) by a pair of chunks a tile (CHUNKS 2: consumer c the tile's chunk c); fp16 (no
    # FORM 2) keeps the tl launches, as do key blocks of 16
    name, kw = _dqk_step(32, dqk_flat=2, dqk_gluon=2, dqk_gluon_form=1538)
    assert name == "gla_dqk_gluon_kernel" and kw["q_desc"].block_shape == [64, 32] and kw["CHUNKS"] == 2, kw
    assert kw["num_tiles"] == 2 * (256 // 64) // 2 and kw["FORM"] == 1538, kw
    assert _dqk_step(32, BKB=16, dqk_flat=2, dqk_gluon=2, dqk_gluon_form=1538)[0] != "gla_dqk_gluon_kernel"
    assert _dqk_step(32, dtype=torch.float16, dqk_flat=2, dqk_gluon=2, dqk_gluon_scan=True)[0] != "gla_dqk_gluon_kernel"
    assert _dqk_step(32, N=192, dqk_flat=2, dqk_gluon=2, dqk_gluon_form=1538)[0] != "gla_dqk_gluon_kernel"


def test_fits_says_why_not():
    x = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16, device=META)
    s = torch.empty(1, 2, 2, 128, 128, dtype=torch.bfloat16, device=META)
    g = torch.empty(1, 128, 2, 128, device=META)
    assert gluon_gla_bwd.fits(x, x, x, g, x, s, s, 128, 64, 32) is None
    assert "multiple of the chunk" in gluon_gla_bwd.fits(x, x, x, g, x, s, s, 100, 64, 32)
    assert "chunk 32" in gluon_gla_bwd.fits(x, x, x, g, x, s, s, 128, 32, 32)
    assert "key block 8" in gluon_gla_bwd.fits(x, x, x, g, x, s, s, 128, 64, 8)
    x32, g32 = x[..., :32], g[..., :32]  # (one key block a chunk: a pair of chunks a tile, bf16 only)
    assert gluon_gla_bwd.fits(x32, x32, x32, g32, x32, s, s, 128, 64, 32) is None
    assert "pair of chunks" in gluon_gla_bwd.fits(x32, x32, x32, g32, x32, s, s, 192, 64, 32)
    h32 = x32.half()
    assert "pair of chunks" in gluon_gla_bwd.fits(h32, h32, h32, g32, h32, s.half(), s.half(), 128, 64, 32)
    x96 = torch.empty(1, 128, 2, 96, dtype=torch.bfloat16, device=META)
    assert "head dims" in gluon_gla_bwd.fits(x96, x96, x96, g, x96, s, s, 128, 64, 32)
    x32 = x.float()
    assert "16-bit" in gluon_gla_bwd.fits(x32, x32, x32, g, x32, s, s, 128, 64, 32)


CODE = """
import json, sys
from tilecore.ops.linear_attention.gluon_gla_bwd import compile_report
print(json.dumps(compile_report(int(sys.argv[1]), int(sys.argv[2]), form=int(sys.argv[3]))))
"""

# bytes ptxas spills (sm_90a, triton 3.6.0): a few loop-invariant scalars of the consumers (the op's sizes and bases),
# stored once a program and reloaded a few times a tile; the chain's tiles stay in registers (their wgmma
# accumulators are not serialized)
SPILLS_ALLOWED = 160
# FORM 2 (the sums over tokens by dots): 124 B at d 128, 112 at d 64 (392 / 400 with q and k held through the
# products); not serialized
SPILLS_ALLOWED_FORM2 = 160
# configs': FORM 1538 (2 + STORE_TMA 512 + DG_TMA 1024) at d 128 and d 64: 16 / 12 B, the shared memory of FORM 2 (the
# stages', the epilogue's and the pieces' buffers reused); with bf16 g DG_LATE 2048 for DG_TMA; FORM 2 (the pointer
# stores: misaligned outputs) 68 B at d 128; session 37's shipped chain (pointer stores, v do^T's product) spilled 120
SPILLS_SHIPPED = 120
# configs' d 128 and d 64: + PIECES_RZ 32768 (the pieces by truncation) + DG_TWO 65536 (dG's sums from two pieces: 4
# wgmmas fewer a consumer), 4 B at both; d 32 (3 stages): + J_SMEM 8192 (J from shared memory: 8 KB more) + DG_TWO, 0 B
SHIPPED, BF16_G, DG_TWO = 1538, 2562, 65536
D64, D64_BF16_G, D32 = SHIPPED | 32768 | DG_TWO, BF16_G | 32768 | DG_TWO, SHIPPED | 8192 | DG_TWO
D128 = D64
TMA_FORMS = (SHIPPED, BF16_G, D64, D64_BF16_G, D32)
CASES = [(128, 2, 0), (64, 3, 0), (128, 2, 2), (128, 2, SHIPPED), (128, 2, D128), (64, 2, D64), (64, 2, D64_BF16_G),
         (32, 3, D32)]


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    cases = CASES
    procs = {c: subprocess.Popen([sys.executable, "-c", CODE, *map(str, c)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for c in cases}
    out = {}
    for c, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        out[c] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("case", CASES)
def test_gluon_dqk_compiles_to_tma_and_wgmma(reports, case):
    r = reports[case]
    assert r["tma"] and r["wgmma"] and r["mbarrier"], r
    assert not r["wgmma_serialized"], r
    assert r["threads"] == 384, r  # two consumer warpgroups and the producer's warp
    assert r["shared"] <= 227 * 1024, r
    assert r["spill_bytes"] <= (SPILLS_ALLOWED_FORM2 if case[2] & 2 else SPILLS_ALLOWED), r
    if case[2] in TMA_FORMS:  # dq, dk, dg by cp.async.bulk.tensor from shared memory, each consumer; spills <= the
        # shipped forms', the shared memory theirs (the stage's and the epilogue's buffers reused)
        assert r["form"] == case[2] and r["tma_stores"] == 6 and r["spill_bytes"] <= SPILLS_SHIPPED, r
        if case[0] == 128:
            assert r["shared"] == reports[(128, 2, 2)]["shared"], r
            fewer = 16 if case[2] & DG_TWO else 0  # (DG_TWO: 2 of dG's 6 sum wgmmas of 4 k-steps gone, a consumer)
            assert r["wgmma_count"] == reports[(128, 2, 2)]["wgmma_count"] - fewer, r
        elif case[0] == 64:
            assert r["shared"] < 165 * 1024, r
    else:
        assert r["tma_stores"] == 0, r


def test_launch_args_keeps_the_tma_stores_only_where_the_buffers_allow():
    """STORE_TMA / DG_TMA / DG_LATE: DQ, DK_OUT, DG become descriptors; DG_TMA needs float32 g (dg goes through g's
    stage buffer), else DG_LATE (the pieces' buffers) stands for it; a misaligned output or an fp16 form (no FORM 2)
    drops them all."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    x = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16)
    s = torch.empty(1, 2, 2, 128, 128, dtype=torch.bfloat16)
    g32, g16 = torch.empty(1, 128, 2, 128), torch.empty(1, 128, 2, 128, dtype=torch.bfloat16)
    dg = torch.empty(1, 128, 2, 128)
    flag = torch.empty(16, dtype=torch.int8)

    def form(g, f, dq=x):
        _, args, _ = gluon_gla_bwd.launch_args(x, x, x, g, x, s, s, dq, x, dg, flag, 0.1, form=f)
        kinds = tuple(isinstance(args[n], TensorDescriptor) for n in ("DQ", "DK_OUT", "DG"))
        return args.get("FORM", 0), kinds

    assert form(g32, 2 | 512 | 1024) == (2 | 512 | 1024, (True, True, True))
    assert form(g16, 2 | 512 | 1024) == (2 | 512 | 2048, (True, True, True))  # (DG_LATE for DG_TMA)
    assert form(g16, 2 | 512 | 2048) == (2 | 512 | 2048, (True, True, True))
    assert form(g32, 2) == (2, (False, False, False))
    odd = torch.empty(x.numel() + 1, dtype=torch.bfloat16)[1:].view(x.shape)  # 2 bytes past a 16-byte boundary
    assert form(g32, 2 | 512 | 2048, dq=odd) == (2, (False, False, False))
    assert form(g32, 512 | 1024) == (0, (False, False, False))

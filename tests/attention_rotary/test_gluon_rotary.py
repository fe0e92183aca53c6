"""The attention forward with rotary for Hopper (gluon_forward.py, issue 37): K by apply_rotary's pass, Q turned
in the Gluon kernel.

On this (GPU-less) machine: what forward takes and refuses, and the kernel compiled for sm_90a at the shipped
forward's configurations: wgmma not serialized, its registers, Q turned in 16-byte shared-memory vectors and
fenced for wgmma, spills within their bound; the host path with the launch stubbed. On a GPU:
O and lse against the float64 attention of the float64-turned q and k (experiments/attention/
gpu_rotary_kernel.py times it)."""
import json

import pytest
import torch

from tilecore.ops.attention_rotary import gluon_forward
from tilecore.ops.attention_rotary.plan import RotaryNotTaken
from compiled_run import compiled_json

CODE = """
import json, re, sys
import torch
from tilecore.ops.attention_rotary.gluon_forward import attention_rotary_fwd_kernel, rows_at_a_time
from tilecore.tiles.compile import compile_kernel, resources
from tilecore.tiles.launch import gluon_descriptor as desc
out = []
for d, causal, cfg, r, cos_dtype, store in json.loads(sys.argv[1]):
    t = torch.empty(2, 4, 256, d, dtype=torch.bfloat16)
    head = lambda rows: desc(t, [1, 1, rows, d])
    cs = torch.empty(256, r, dtype=getattr(torch, cos_dtype))
    args = dict(q_desc=head(cfg["block_m"]), k_desc=head(cfg["block_n"]), v_desc=head(cfg["block_n"]),
                o_desc=head(cfg["block_m"]), lse_ptr=torch.empty(8, dtype=torch.float32), cos_ptr=cs, sin_ptr=cs,
                cos_stride=r, sin_stride=r, n_max=4096, H=4, N=256, Nk=256, GROUP=1, scale_log2e=0.1, num_bh=8,
                head_group=4, schedule=torch.empty(8, dtype=torch.int32) if causal else None, left=0, right=0,
                tanh_scale=0.0, qr_desc=desc(t.view(1, 8, 256, d), [1, 1, cfg["block_m"], d]) if store else None,
                CAUSAL=causal, STAGES=cfg["stages"], R=r, Q_BUFFERS=cfg["q_buffers"],
                CARRY=cfg.get("carry", False), INTERLEAVED=cfg.get("interleaved", False),
                Q_REGS=cfg.get("q_regs", False), CONSUMERS=cfg.get("consumers", 2),
                TURN_ROWS=rows_at_a_time(r, cfg.get("interleaved", False)))
    k = compile_kernel(attention_rotary_fwd_kernel, args, num_warps=4)
    ptx = k.asm["ptx"]
    out.append(dict(d=d, causal=causal, cfg=cfg, r=r, store=store, **vars(resources(k)),
                    wgmma=len(re.findall(r"wgmma\\.mma_async", ptx)), tma=ptx.count("cp.async.bulk.tensor"),
                    tma_stores=len(re.findall(r"cp\\.async\\.bulk\\.tensor\\.\\dd\\.global\\.shared", ptx)),
                    store_waits=len(re.findall(r"cp\\.async\\.bulk\\.wait_group", ptx)),
                    mul_rn=ptx.count("mul.rn.f32"),
                    setmaxnreg=sorted({int(x) for x in re.findall(r"setmaxnreg\\.\\w+\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)}),
                    lds_v4=len(re.findall(r"ld\\.shared\\.v4", ptx)), sts_v4=len(re.findall(r"st\\.shared\\.v4", ptx)),
                    fences=ptx.count("fence.proxy.async"), cos_v4=len(re.findall(r"ld\\.global(\\.\\w+)*\\.v4", ptx)),
                    cos_v2=len(re.findall(r"ld\\.global(\\.\\w+)*\\.v2", ptx))))
print(json.dumps(out))
"""

# (D, causal, config, R, cos dtype, turned Q stored): the shipped forward's configurations (gluon_forward_config)
# at N 4096 (D128 without a mask: Q in registers; D64: three consumers), D128 causal with interleaved pairs, and
# D64's carried pipeline of short causal rows (64-key blocks) with rotary_dim 32 and float32 tables; the training
# forward (turned Q stored for the backward) restarting at D128 full and carried (its two ways of waiting for the
# store). D64's three consumers with the store (not compiled here, for time): spills 188 / 244 B against 188 / 240
VARIANTS = [(128, False, dict(block_m=64, block_n=128, stages=2, q_buffers=2, q_regs=True), 64, "bfloat16", False),
            (128, True, dict(block_m=64, block_n=128, stages=2, q_buffers=2, interleaved=True), 64, "bfloat16", False),
            (64, True, dict(block_m=64, block_n=128, stages=3, q_buffers=2, consumers=3), 32, "bfloat16", False),
            (64, True, dict(block_m=64, block_n=64, stages=3, q_buffers=2, carry=True), 16, "float32", False),
            (128, False, dict(block_m=64, block_n=128, stages=2, q_buffers=2, q_regs=True), 64, "bfloat16", True),
            (64, True, dict(block_m=64, block_n=64, stages=3, q_buffers=2, carry=True), 16, "float32", True)]
# spill bytes (stores, loads) ptxas reports; the three-consumer D64 causal forward spills 168 bytes without rotary
# (test_attention_hopper_compile), 240 with
SPILL_BYTES_ALLOWED = {2: 0, 3: 256}


@pytest.fixture(scope="module")
def report():
    return compiled_json(CODE, json.dumps(VARIANTS), timeout=900)


def test_compiles_unserialized_with_the_shipped_registers(report):
    assert len(report) == len(VARIANTS)
    for row in report:
        assert row["wgmma"] > 0 and row["tma"] > 0 and not row["wgmma_serialized"], row
        consumers = row["cfg"].get("consumers", 2)
        # the shipped forward's split: two consumers at 232 and the producer at 40, or three at 160 and 24
        assert {232, 40} <= set(row["setmaxnreg"]) if consumers == 2 else {160, 24} <= set(row["setmaxnreg"]), row
        allowed = SPILL_BYTES_ALLOWED[consumers]
        assert row["spill_stores"] <= allowed and row["spill_loads"] <= allowed, row
        assert row["shared"] <= 227 * 1024, row


def test_turns_in_16_byte_vectors_fenced_for_wgmma(report):
    for row in report:
        # Q (each consumer) read and written back in 16-byte vectors, both halves
        assert row["lds_v4"] > 0 and row["lds_v4"] == row["sts_v4"], row
        if row["cfg"].get("interleaved"):  # 4 pairs a thread: 4 angles, 8 bytes of bfloat16
            assert row["cos_v4"] + row["cos_v2"] > 0, row
        else:  # 8 angles a thread: 16 bytes of bfloat16 (two 16-byte loads of float32)
            assert row["cos_v4"] > 0, row
        assert row["fences"] >= row["cfg"].get("consumers", 2), row  # after each consumer's Q
        assert row["mul_rn"] > 0, row  # turn_pair's products by sin, rounded in written-out PTX


TL_CODE = """
import json, re, sys
import torch
from tilecore.ops.rotary import kernels
from tilecore.ops.rotary.plan import tl_plan
from tilecore.tiles.compile import compile_kernel
t = torch.empty(64, dtype=torch.bfloat16)
cs = torch.empty(64, dtype=torch.float32)
out = []
for heads in (16, 2):
    for interleaved in (False, True):
        p = tl_plan(2, 64, heads, 128, 64)
        args = dict(X=t, COS=cs, SIN=cs, POS=None, OUT=t, seqlen=64, heads=heads, n_max=64,
                    stride_xb=64 * heads * 128, stride_xn=128, stride_xh=64 * 128, stride_ob=64 * heads * 128,
                    stride_on=128, stride_oh=64 * 128, stride_cos=64, stride_sin=64, stride_pb=0, stride_pn=0, R=64,
                    BLOCK_R=p.block_r, BLOCK_H=p.block_h, PASS=0, BLOCK_PASS=p.block_pass, INTERLEAVED=interleaved,
                    CONJUGATE=False, HAS_POS=False)
        ptx = compile_kernel(kernels.rotary_kernel, args, num_warps=p.num_warps).asm["ptx"]
        out.append([l.split("//")[0].strip() for l in ptx.splitlines()])
print(json.dumps(out))
"""


def test_the_tl_kernel_fuses_the_first_elements_products():
    """turn_pair writes out the contraction apply_rotary's kernel compiles to (so that the training forward's
    stored Q is the turned path's, bit for bit): in its sm_90a PTX, for both layouts, at Llama's 16 heads and the
    GPU checks' 2, every fma multiplies a value that no mul reads (a pair's first element a) by a table value, and
    adds a mul (or its negation) of a value that no fma multiplies (the partner b): fma(a, cos, -(b sin)),
    fma(a, sin, b cos). Should a Triton upgrade contract otherwise, this fails: change turn_pair to match."""
    import re

    for lines in compiled_json(TL_CODE, timeout=600):
        made = {}  # register -> (opcode, operands)
        for line in lines:
            m = re.match(r"(mul\.f32|neg\.f32|fma\.rn\.f32)\s+(%r\d+),\s*(.*);", line)
            if m:
                made[m.group(2)] = (m.group(1), [x.strip() for x in m.group(3).split(",")])
        fmas = [ops for op, ops in made.values() if op == "fma.rn.f32"]
        muls = [ops for op, ops in made.values() if op == "mul.f32"]
        assert fmas and len(fmas) == len(muls), (len(fmas), len(muls))
        fused = {x for ops in fmas for x in ops[:2]}
        rounded = {x for ops in muls for x in ops}
        for ops in fmas:
            assert len({x for x in ops[:2] if x not in rounded}) == 1, ops  # a
            op, addend = made[ops[2]]
            if op == "neg.f32":
                op, addend = made[addend[0]]
            assert op == "mul.f32" and len({x for x in addend if x not in fused}) == 1, (ops, op, addend)  # b


def test_the_training_forward_stores_the_turned_q(report):
    """With a qr descriptor each consumer stores its turned Q block by one TMA store (one more a consumer than
    the same configuration without: O's), waited for before the buffer is handed back; registers as without,
    no spill with two consumers (with three, 160 registers and spilling already: 4 bytes more reloaded)."""
    plain = {(r["d"], r["causal"], json.dumps(r["cfg"], sort_keys=True)): r for r in report if not r["store"]}
    stored = [r for r in report if r["store"]]
    assert len(stored) == 2
    for row in stored:
        base = plain[row["d"], row["causal"], json.dumps(row["cfg"], sort_keys=True)]
        consumers = row["cfg"].get("consumers", 2)
        assert row["tma_stores"] == base["tma_stores"] + consumers, (row, base)
        assert row["store_waits"] > base["store_waits"], (row, base)
        if consumers == 2:
            assert row["spill_stores"] == row["spill_loads"] == 0, row
        else:
            assert row["spill_stores"] <= base["spill_stores"] + 8 and row["spill_loads"] <= base["spill_loads"] + 8, \
                (row, base)
        assert row["registers"] == base["registers"], (row, base)


def qkv(b=1, h=2, hkv=2, n=64, nk=64, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, hkv, nk, d, dtype=dtype),
            torch.randn(b, hkv, nk, d, dtype=dtype))


@pytest.mark.parametrize("what, change, error", [
    ("head dim 96", dict(d=96), RotaryNotTaken),
    ("rotary_dim 48", dict(r=24), RotaryNotTaken),
    ("rotary_dim 96 of 128", dict(d=128, r=48), RotaryNotTaken),  # R wide tiles: a power of two
    ("rotary_dim past D", dict(r=64), ValueError),
    ("N past Nk", dict(n=80), ValueError),
    ("cos short of the keys", dict(rows=63), ValueError),
    ("cos and sin differ", dict(sin_rows=70), ValueError)])
def test_refuses_what_it_does_not_take(what, change, error):
    d = change.get("d", 64)
    q, k, v = qkv(n=change.get("n", 64), d=d)
    r = change.get("r", d // 2)
    cos, sin = torch.randn(change.get("rows", 64), r), torch.randn(change.get("sin_rows", change.get("rows", 64)), r)
    with pytest.raises(error) as raised:
        gluon_forward.check(q, k, v, cos, sin, change.get("interleaved", False))
    # the limits are RotaryNotTaken alone (attention's fallback catches it and nothing else), bad input ValueError
    assert isinstance(raised.value, RotaryNotTaken) == (error is RotaryNotTaken)


def test_takes_partial_rotary_dims_and_fewer_queries():
    q, k, v = qkv(n=40, nk=64, d=128)
    gluon_forward.check(q, k, v, torch.randn(100, 32), torch.randn(100, 32), False)  # rotary_dim 64 of 128


def test_rows_at_a_time_cover_a_warpgroup_once():
    # 4 warps x 32 threads, 8 features a thread: R / 8 threads a row in each half, 2R / 8 interleaved
    for r in (16, 32, 64):
        rows = gluon_forward.rows_at_a_time(r)
        assert rows * (r // 8) == 4 * 32 and rows <= 64
        rows = gluon_forward.rows_at_a_time(r, interleaved=True)
        assert rows * (2 * r // 8) == 4 * 32 and rows <= 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Gluon kernel runs on Hopper")
@pytest.mark.parametrize("d, causal, n, nk, r, interleaved", [(128, False, 300, 300, 64, False),
                                                              (64, True, 200, 333, 32, False),
                                                              (128, True, 200, 200, 32, True)])
def test_matches_the_float64_reference_on_the_gpu(d, causal, n, nk, r, interleaved):
    from tilecore.accuracy import error_over_floor
    from tilecore.ops.attention.reference import attention_reference
    from tilecore.ops.rotary.reference import rotary_reference

    from tilecore import dispatch

    if not dispatch.gluon_ok(torch.device("cuda")):
        pytest.skip("Hopper with Gluon only")
    torch.manual_seed(0)
    q, k, v = (t.cuda() for t in qkv(b=2, h=4, hkv=2, n=n, nk=nk, d=d))
    cos, sin = torch.randn(nk + 3, r, device="cuda", dtype=torch.float64).cos(), torch.randn(nk + 3, r, device="cuda").sin()
    cos = cos.float()
    out, lse = gluon_forward.forward(q, k, v, cos, sin, causal=causal, scale=d ** -0.5, interleaved=interleaved)
    pos_q = torch.arange(nk - n, nk, device="cuda")[None]
    qt = rotary_reference(q.transpose(1, 2), cos, sin, position_ids=pos_q, interleaved=interleaved).transpose(1, 2)
    kt = rotary_reference(k.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)
    ref_o, ref_lse = attention_reference(qt, kt, v.double(), causal=causal, scale=d ** -0.5)
    assert error_over_floor(out, ref_o) < 3.0
    assert torch.allclose(lse.double(), ref_lse, atol=1e-3, rtol=0)


def test_host_path_launches_k_turned_by_the_pass(monkeypatch):
    """forward's launch on the CPU with the kernel stubbed: K turned by apply_rotary's pass (float64 reference:
    within bf16's rounding), the tables, sizes and options as the shipped forward's configuration."""
    from tilecore import dispatch
    from tilecore.ops.attention import configs
    from tilecore.ops.rotary.reference import rotary_reference

    launches = []

    class Stub:
        def run(self, key, grid, args, options):
            launches.append((args, options))

    monkeypatch.setattr(gluon_forward, "ROTARY_FWD", Stub())
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    torch.manual_seed(0)
    q, k, v = qkv(b=2, h=4, hkv=2, n=48, nk=80, d=64)
    cos, sin = torch.randn(90, 32).cos(), torch.randn(90, 32).sin()
    out, lse = gluon_forward.forward(q, k, v, cos, sin, causal=True, scale=0.125)
    (args, options), = launches
    assert out.shape == (2, 4, 48, 64) and lse.shape == (2, 4, 48) and lse.dtype == torch.float32
    assert args[5] is cos and args[6] is sin and args[9] == 90 and args[11:13] == (48, 80)
    assert options["R"] == 32 and options["CAUSAL"] and not options["INTERLEAVED"]
    shipped = configs.gluon_forward_config(64, 48, 80, True)
    assert (options["STAGES"], options["CONSUMERS"]) == (shipped["stages"], shipped.get("consumers", 2))
    launched_k = args[1].base
    ref = rotary_reference(k.transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.allclose(launched_k.double(), ref, rtol=2 ** -7, atol=2 ** -7) and not torch.equal(launched_k, k)
    assert args[0].base is q and args[2].base is v  # Q turned in the kernel, V as given
    assert args[-1] is None  # no turned Q stored


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Gluon kernel runs on Hopper")
@pytest.mark.parametrize("d, causal, n, nk, interleaved", [(128, False, 300, 300, False), (64, True, 200, 333, True)])
def test_keeps_the_turned_paths_bits_on_the_gpu(d, causal, n, nk, interleaved):
    """keep_turned: the stored Q and the turned K are apply_rotary's bits (the turned path's), every element
    written; O and lse those of the forward without keep_turned."""
    from tilecore import dispatch
    from tilecore.ops.rotary.op import turn

    if not dispatch.gluon_ok(torch.device("cuda")):
        pytest.skip("Hopper with Gluon only")
    torch.manual_seed(1)
    q, k, v = (t.cuda() for t in qkv(b=2, h=4, hkv=2, n=n, nk=nk, d=d))
    cos, sin = torch.randn(nk, d // 2, device="cuda").cos(), torch.randn(nk, d // 2, device="cuda").sin()
    out, lse, qr, kr = gluon_forward.forward(q, k, v, cos, sin, causal=causal, scale=d ** -0.5,
                                            interleaved=interleaved, keep_turned=True)
    ref_q = turn(q.transpose(1, 2), cos[nk - n:], sin[nk - n:], interleaved=interleaved).transpose(1, 2)
    ref_k = turn(k.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)
    assert torch.equal(qr.view(torch.int16), ref_q.contiguous().view(torch.int16))
    assert torch.equal(kr.view(torch.int16), ref_k.contiguous().view(torch.int16))
    o2, lse2 = gluon_forward.forward(q, k, v, cos, sin, causal=causal, scale=d ** -0.5, interleaved=interleaved)
    assert torch.equal(out, o2) and torch.equal(lse, lse2)


def test_host_path_keeps_the_turned_q_and_k(monkeypatch):
    """keep_turned (the training forward): K turned into a contiguous buffer (the turned path's layout), a
    contiguous buffer for the turned Q given to the kernel as a (1, B * H, N, D) descriptor of Q's boxes (the
    kernel writes it: not checkable here), both returned; a launch key apart from the no-grad launch's."""
    from tilecore import dispatch
    from tilecore.ops.rotary.reference import rotary_reference

    launches = []

    class Stub:
        def run(self, key, grid, args, options):
            launches.append((key, args, options))

    monkeypatch.setattr(gluon_forward, "ROTARY_FWD", Stub())
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    torch.manual_seed(0)
    q, k, v = qkv(b=2, h=4, hkv=2, n=48, nk=80, d=128)
    cos, sin = torch.randn(90, 64).cos(), torch.randn(90, 64).sin()
    out, lse, qr, kr = gluon_forward.forward(q, k, v, cos, sin, causal=False, scale=0.1, interleaved=True,
                                            keep_turned=True)
    gluon_forward.forward(q, k, v, cos, sin, causal=False, scale=0.1, interleaved=True)
    (key, args, options), (plain_key, plain_args, _) = launches
    assert qr.shape == q.shape and qr.is_contiguous() and kr.shape == k.shape and kr.is_contiguous()
    assert args[1].base is kr and args[-1].base.data_ptr() == qr.data_ptr()
    assert tuple(args[-1].base.shape) == (1, 8, 48, 128) and args[-1].block_shape == args[0].block_shape
    ref = rotary_reference(k.transpose(1, 2), cos, sin, interleaved=True).transpose(1, 2)
    assert torch.allclose(kr.double(), ref, rtol=2 ** -7, atol=2 ** -7)
    assert torch.equal(kr, plain_args[1].base.contiguous())  # the pass's bits
    assert options["INTERLEAVED"] and (key is None or key != plain_key)

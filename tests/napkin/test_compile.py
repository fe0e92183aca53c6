"""napkin.compile: each compiled-diagram family through the Triton interpreter against the diagram's
own float64 evaluation (fp16 / fp32: the interpreter's bf16 dot is wrong), error as a multiple of the
rounding floor, every element written (outputs poisoned with NaN first), NaN propagated, bad input named."""
import math

import pytest
import torch

from tilecore.napkin import CompileError, Diagram, compose, models
from tilecore.napkin import compile as napkin_compile
from tilecore.ops.napkin_compiled import compile_diagram, evaluate

DT = {"fp16": torch.float16, "fp32": torch.float32}


def inputs_for(g, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return {a.name: (torch.randn([g.sizes[x] for x in a.axes], generator=gen, dtype=torch.float64) * scale
                     ).to(DT[a.dtype]) for a in g.inputs()}


def error_over_floor(g, out, ref):
    """rel-RMS error / rel-RMS of rounding the exact result to the output dtype (floor at least fp32's)."""
    worst = 0.0
    for o in g.outputs:
        y, r = out[o], ref[o]
        assert not torch.isnan(y).any(), f"{o}: an element was not written (NaN poison left)"
        rms = r.pow(2).mean().sqrt()
        floor = max(((r - r.to(y.dtype).double()).pow(2).mean().sqrt() / rms).item(), 2 ** -24)
        worst = max(worst, ((y.double() - r).pow(2).mean().sqrt() / rms).item() / floor)
    return worst


def run_and_check(g, bound, scale=1.0, **blocks):
    f = compile_diagram(g, blocks or None)
    ins = inputs_for(g, scale=scale)
    out = f(poison=True, **ins)
    err = error_over_floor(g, out, evaluate(g, ins))
    assert err < bound, f"{g.name} ({f.program.family}): error {err:.2f}x the rounding floor"
    return f, ins, out


@pytest.mark.parametrize("dtype, bound, tma", [("fp16", 4.0, True), ("fp32", 8.0, True), ("fp16", 4.0, False)])
def test_chain_gated_mlp(dtype, bound, tma):
    # ragged sizes: tiles past the edge on every axis (TMA zero-fills them; the pointer path masks);
    # G written once in the input dtype
    g = models.gated_mlp(tokens=40, model=48, hidden=72, dtype=dtype)
    f, _, _ = run_and_check(g, bound, scale=0.5, BM=16, BN=32, BK=16, GROUP=4, tma=tma)
    assert f.program.family == "chain" and f.program.intermediates == ["G"]
    assert "acc1 = tl.dot(a, w1, acc1)" in f.source and "tl.sigmoid" in f.source


def test_chain_mlp_bias_epilogue_and_nan():
    g = Diagram("mlp_bias", t=24, m=32, f=48, o=16)
    X, W1, B1, W2 = g.input("X", "t m", "fp16"), g.input("W1", "m f", "fp16"), g.input("B1", "f", "fp16"), \
        g.input("W2", "f o", "fp16")
    h = g.map("add", g.contract(X, W1, out="t f", name="H", dtype="fp32"), B1, name="Hb", dtype="fp32")
    g.output(g.contract(g.map("gelu", h, name="A", unit="sfu", dtype="fp16"), W2, out="t o", name="Y", dtype="fp16"))
    f, ins, _ = run_and_check(g, 4.0, scale=0.5)
    ins["X"][3, 5] = float("nan")
    out, ref = f(**ins)["Y"], evaluate(g, ins)["Y"]
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[3]).all()


def test_chain_epilogue_with_tanh_approx():
    # tanh_approx in an expression (a gelu written out): emitted through _tanh_approx, evaluated as tanh
    g = Diagram("mlp_gelu_approx", t=24, m=32, f=48)
    X, W1 = g.input("X", "t m", "fp16"), g.input("W1", "m f", "fp16")
    gelu = "0.5 * a * (1.0 + tanh_approx(0.7978845608028654 * (a + 0.044715 * a * a * a)))"
    g.output(g.map(gelu, g.contract(X, W1, out="t f", name="H", dtype="fp32"), name="A", unit="sfu", dtype="fp16"))
    f, _, _ = run_and_check(g, 4.0, scale=0.5)
    assert "_tanh_approx(" in f.source


def softcap_attention(causal, written_out=False, q=40, x=56, d=32, cap="softcap(5.0)"):
    g = Diagram("softcap_attention", q=q, x=x, d=d, e=d)
    Q, K, V = g.input("Q", "q d", "fp16"), g.input("K", "x d", "fp16"), g.input("V", "x e", "fp16")
    S = g.contract(Q, K, out="q x", name="S", dtype="fp32")
    S = g.map(cap, g.map(f"scale({1 / math.sqrt(d)})", S, name="Ss", dtype="fp32"), name="Sc", dtype="fp32")
    if written_out:
        m = g.reduce(S, "x", kind="max", name="m")
        P = g.map("exp(a - b)", S, m, name="P", unit="sfu", dtype="fp32")
        z = g.reduce(P, "x", kind="sum", name="z")
        O = g.map("a / b", g.contract(P, V, out="q e", name="U", dtype="fp32"), z, name="O", dtype="fp16")
    else:
        O = g.softmax_contract(S, V, over="x", name="O", causal="q" if causal else None, dtype="fp16")
    return g.output(O).weave("h", 2, ["Q", "K", "V"]).weave("b", 2, ["Q", "K", "V"])


@pytest.mark.parametrize("causal, written_out, q, x, tma", [
    (True, False, 40, 56, True), (False, True, 40, 56, True), (True, False, 40, 56, False),
    (False, False, 32, 48, False), (True, False, 32, 48, True), (True, False, 48, 32, True),   # even tiles; NQ > NX
])
def test_attention_softcap_streamed(causal, written_out, q, x, tma):
    # tma: Q, K, V through [B*H, N, D] descriptors (zero past N in each head), else pointers and masks
    f, _, _ = run_and_check(softcap_attention(causal, written_out, q=q, x=x), 4.0, BM=16, BN=16, tma=tma)
    assert f.program.family == "attention" and "_tanh(" in f.source
    assert f.program.kernels[0].info["causal"] == causal and f.program.kernels[0].info["softmax"]


@pytest.mark.parametrize("head_group", [0, 1, 4])
def test_attention_program_order(head_group):
    # the grid's order (HEAD_GROUP heads at a time, the last query tiles first; 0: in order) moves no
    # result: B * H = 6 heads (not a multiple of 4: a short last group) of 3 query tiles, causal
    g = Diagram("causal_attention", q=40, x=56, d=32, e=32)
    Q, K, V = g.input("Q", "q d", "fp16"), g.input("K", "x d", "fp16"), g.input("V", "x e", "fp16")
    S = g.map("scale(0.17)", g.contract(Q, K, out="q x", name="S", dtype="fp32"), name="Ss", dtype="fp32")
    O = g.softmax_contract(S, V, over="x", name="O", causal="q", dtype="fp16")
    g = g.output(O).weave("h", 3, ["Q", "K", "V"]).weave("b", 2, ["Q", "K", "V"])
    f, ins, out = run_and_check(g, 4.0, BM=16, BN=16, HEAD_GROUP=head_group)
    base = compile_diagram(g, dict(BM=16, BN=16))(**ins)
    assert torch.equal(out["O"], base["O"])


def test_tanh_by_one_exponential_and_newton_steps():
    # compile._tanh (what softcap(C) and tanh emit): within 2^-22 of tanh everywhere (absolute), the
    # infinities to +-1, NaN propagated; its reciprocal's seed holds over all of d = 1 + e in [1, 2]
    import triton
    import triton.language as tl

    from tilecore.ops.napkin_compiled.run import _module
    global _EMITTED  # a module global: the kernel below reaches the emitted _tanh through it
    _EMITTED = _module(napkin_compile(models.matmul(m=16, n=16, k=16, dtype="fp16")).source)

    @triton.jit
    def tanh_kernel(X, Y, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        x = tl.load(X + i, mask=i < n)
        tl.store(Y + i, _EMITTED._tanh(x), mask=i < n)
    mag = torch.logspace(-20, 5, 4000, base=2.0)
    x = torch.cat([mag, -mag, torch.tensor([0.0, float("inf"), float("-inf"), float("nan")])]).float()
    y = torch.empty_like(x)
    tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), B=1024)
    ref = torch.tanh(x.double())
    fin = ~torch.isnan(ref)
    assert (y.double() - ref)[fin].abs().max().item() < 2 ** -22
    assert torch.isnan(y[~fin]).all() and y[-3].item() == 1.0 and y[-2].item() == -1.0


def test_attention_softcap_approx():
    # softcap_approx(C): tanh by tanh.approx.f32 where compiled; the interpreter runs the exact sigmoid form
    # (inline asm does not run there), so this checks the plumbing and the float64 evaluation (exact tanh)
    f, _, _ = run_and_check(softcap_attention(True, cap="softcap_approx(5.0)"), 4.0, BM=16, BN=16)
    assert "_tanh_approx(" in f.source and "tanh.approx.f32" in f.source
    from tilecore.napkin.rewrite import map_cost
    assert map_cost("softcap_approx(30.0)") == ("sfu", 1.0) and map_cost("softcap(30.0)") == ("sfu", 1.0)


def test_attention_defaults_two_programs_an_sm_where_timed():
    # run._attention_blocks on a GPU (no launch: the device's type decides): causal 64 x 64 tiles, 4 warps;
    # full D = E = 128 through TMA two 8-warp programs an SM (2 stages, registers capped at 128) for plain
    # softmax and softcap_approx (the timed wins), the family's blocks for the exact softcap and sigmoid
    # attention (no softmax); the interpreter keeps its small tiles
    from tilecore.ops.napkin_compiled import run
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    two = dict(BM=128, BN=64, num_warps=8, num_stages=2, maxnreg=128, HEAD_GROUP=0)
    assert run.attention_defaults(cuda, False, d128_tma=True) == two
    assert run.attention_defaults(cuda, False) == dict(BM=128, BN=64, num_warps=8, num_stages=3, HEAD_GROUP=0)
    assert run.attention_defaults(cuda, True, d128_tma=True) == dict(BM=64, BN=64, num_warps=4, num_stages=3,
                                                                     HEAD_GROUP=4)
    assert run.attention_defaults(cpu, False, d128_tma=True) == dict(BM=16, BN=16, HEAD_GROUP=0)
    assert run.d128_tma_modifiers(softcap_attention(False, cap="softcap_approx(30.0)"))
    assert run.d128_tma_modifiers(softcap_attention(False, cap="scale(2.0)"))
    assert not run.d128_tma_modifiers(softcap_attention(False, cap="softcap(30.0)"))
    g = Diagram("sigmoid_attention", q=24, x=40, d=16, e=32)
    Q, K, V = g.input("Q", "q d", "fp16"), g.input("K", "x d", "fp16"), g.input("V", "x e", "fp16")
    S = g.map("sigmoid(a - 2.0)", g.contract(Q, K, out="q x", name="S", dtype="fp32"), name="P", dtype="fp16")
    assert not run.d128_tma_modifiers(g.output(g.contract(S, V, out="q e", name="O", dtype="fp16")))


def test_sigmoid_attention_plain_streamed_sum():
    g = Diagram("sigmoid_attention", q=24, x=40, d=16, e=32)
    Q, K, V = g.input("Q", "q d", "fp16"), g.input("K", "x d", "fp16"), g.input("V", "x e", "fp16")
    P = g.map("sigmoid(a * 0.25 - 1.0)", g.contract(Q, K, out="q x", name="S", dtype="fp32"), name="P",
              unit="sfu", dtype="fp16")
    g = g.output(g.contract(P, V, out="q e", name="O", dtype="fp16")).weave("h", 3, ["Q", "K", "V"])
    f, _, _ = run_and_check(g, 4.0)
    assert not f.program.kernels[0].info["softmax"]


@pytest.mark.parametrize("tma", [True, False])
def test_rmsnorm_then_gemm(tma):
    norm = models.rmsnorm(rows=40, n=96, dtype="fp16")
    proj = Diagram("proj", t=40, n=96, o=48)
    proj.output(proj.contract(proj.input("Xn", "t n", "fp16"), proj.input("P", "n o", "fp16"), out="t o",
                              name="Z", dtype="fp16"))
    g = compose(norm, proj, {"Xn": "Y"})
    f, _, _ = run_and_check(g, 4.0, BM=16, BO=32, BK=32, GROUP=2, tma=tma)
    # the statistic is a row factor of x * inv * w: inv by row_factor's pass, the GEMM scales its accumulator
    assert f.program.family == "rownorm" and f.program.kernels[0].info["row_factor"]
    assert f.program.kernels[0].info["prescale"] and "def prescale_weight" in f.source  # w folded into P
    assert f.source.count("for k0 in range(0, N, BK)") == 3  # row_factor's, and a loop a GEMM variant
    gemm = f.source[f.source.index("def rownorm_gemm("):f.source.index("def prescale_weight")]
    # the GEMM's k-loop is the MMA's alone: X's tile goes only to tl.dot (a second use of a TMA-loaded
    # tile beside the wgmma got it one shared-memory buffer fewer than its prefetch distance: a race)
    assert "stat" not in gemm and gemm.count("tl.dot(x_raw, w, acc)") == 2


def test_row_factor_with_the_operand_made_in_registers():
    # x * x * inv: no vector factor to fold into the weight, so the part x * x is made in the loop;
    # the statistic still comes from row_factor's pass
    g = Diagram("sq_norm_proj", t=40, n=96, o=48)
    X, P = g.input("X", "t n", "fp16"), g.input("P", "n o", "fp16")
    ms = g.reduce(g.map("a * a", X, name="X2", dtype="fp32"), "n", kind="mean", name="ms")
    inv = g.map("rsqrt(a + 1e-5)", ms, name="inv", dtype="fp32")
    g.output(g.contract(g.map("a * a * b", X, inv, name="Y", dtype="fp16"), P, out="t o", name="Z", dtype="fp16"))
    f, _, _ = run_and_check(g, 4.0, BM=16, BO=32, BK=32, GROUP=2)
    info = f.program.kernels[0].info
    assert info["row_factor"] and not info["prescale"] and "part = " in f.source


def test_row_centering_then_gemm_takes_two_passes():
    g = Diagram("center_proj", t=24, n=80, o=40)
    X, P = g.input("X", "t n", "fp16"), g.input("P", "n o", "fp16")
    mu = g.reduce(X, "n", kind="mean", name="mu")
    g.output(g.contract(g.map("a - b", X, mu, name="Xc", dtype="fp16"), P, out="t o", name="Z", dtype="fp16"))
    f, _, _ = run_and_check(g, 6.0)
    assert not f.program.kernels[0].info["row_factor"] and f.source.count("for k0 in range(0, N, BK)") == 4


def test_compile_emits_text_and_names_what_it_takes():
    src = napkin_compile(models.gated_mlp(tokens=64, model=64, hidden=64)).source
    assert src.startswith("# generated by tilecore.napkin.compile") and "@triton.jit" in src
    with pytest.raises(CompileError, match="matches no family"):
        napkin_compile(models.hadamard(rows=16, n=256))
    g = Diagram("odd", t=16, m=16, f=16)
    g.output(g.map("frobnicate", g.contract(g.input("X", "t m"), g.input("W", "m f"), out="t f", name="H"), name="Y"))
    with pytest.raises(CompileError, match="no known semantics; accepted: identity"):
        napkin_compile(g)
    f = compile_diagram(models.gated_mlp(tokens=16, model=16, hidden=16, dtype="fp16"))
    ins = inputs_for(f.diagram)
    with pytest.raises(ValueError, match="W2 must have shape"):
        f(**{**ins, "W2": ins["W2"][:8]})
    with pytest.raises(ValueError, match="torch.float16"):
        f(**{**ins, "X": ins["X"].float()})
    with pytest.raises(ValueError, match="missing"):
        f(X=ins["X"])


HOPPER_CHECK = r'''
import torch
from triton.tools.tensor_descriptor import TensorDescriptor
from tilecore.napkin import Diagram, models
from tilecore.napkin import compile as napkin_compile
from tilecore.ops.napkin_compiled.run import _module
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
bf = torch.bfloat16
M, K, N = 8192, 4096, 14336
X, W, G = torch.empty(M, K, dtype=bf), torch.empty(K, N, dtype=bf), torch.empty(M, N, dtype=bf)
mod = _module(napkin_compile(models.gated_mlp(tokens=M, model=K, hidden=N)).source)
dual = compile_kernel(mod.stage_0_G_tma, dict(
    A=TensorDescriptor.from_tensor(X, [128, 64]), W0=TensorDescriptor.from_tensor(W, [64, 128]),
    W1=TensorDescriptor.from_tensor(W, [64, 128]), OUT=G, M=M, N=N, K=K, stride_am=K, stride_ak=1,
    stride_w0k=N, stride_w0n=1, stride_w1k=N, stride_w1n=1, stride_om=N, stride_on=1, BM=128, BN=128,
    BK=64, GROUP=8), num_warps=8, num_stages=4)
g = Diagram("a", q=4096, x=4096, d=128, e=128)
Q, K_, V = g.input("Q", "q d"), g.input("K", "x d"), g.input("V", "x e")
S = g.map("softcap(30.0)", g.contract(Q, K_, out="q x", name="S", dtype="fp32"), name="Sc", dtype="fp32")
g = g.output(g.softmax_contract(S, V, over="x", name="O", causal="q")).weave("h", 16, ["Q", "K", "V"])
mod = _module(napkin_compile(g).source)
q, o = torch.empty(16, 4096, 128, dtype=bf), torch.empty(1, 16, 4096, 128, dtype=bf)
att = compile_kernel(mod.attention_fwd_tma, dict(
    Q=TensorDescriptor.from_tensor(q, [1, 128, 128]), K=TensorDescriptor.from_tensor(q, [1, 64, 128]),
    V=TensorDescriptor.from_tensor(q, [1, 64, 128]), O=o, H=16, NQ=4096, NX=4096, sqb=0, sqh=0, sqm=0,
    sqd=0, skb=0, skh=0, skn=0, skd=0, svb=0, svh=0, svn=0, sve=0, sob=16 * 4096 * 128, soh=4096 * 128,
    som=128, soe=1, D=128, E=128, BM=128, BN=64, CAUSAL=True, EVEN_Q=True, EVEN_X=True, HEAD_GROUP=4), num_warps=8, num_stages=3)
from tilecore.napkin import compose
proj = Diagram("proj", t=8192, n=4096, o=4096)
proj.output(proj.contract(proj.input("Xn", "t n"), proj.input("P", "n o"), out="t o", name="Z"))
mod = _module(napkin_compile(compose(models.rmsnorm(rows=8192, n=4096), proj, {"Xn": "Y"})).source)
P = torch.empty(4096, 4096, dtype=bf)
norm = compile_kernel(mod.rownorm_gemm_tma, dict(
    X=TensorDescriptor.from_tensor(X, [128, 64]), F=torch.empty(8192, dtype=torch.float32),
    P=TensorDescriptor.from_tensor(P, [64, 256]), OUT=P, M=8192, N=4096, NO=4096, stride_xm=4096,
    stride_xn=1, stride_pn=4096, stride_po=1, stride_om=4096, stride_oo=1, BM=128, BO=256, BK=64, GROUP=8),
    num_warps=8, num_stages=3)
for name, ck in (("dual", dual), ("attention", att), ("rownorm", norm)):
    r, ins = resources(ck), has_hopper_instructions(ck.asm["ptx"])
    print(name, r.registers, r.spill_stores, r.spill_loads, r.shared, ins["wgmma"], ins["tma"], r.wgmma_serialized)
# the SFU instructions (SASS MUFU) of the non-causal D128 kernel at BM 128, BN 64, 8 warps: each thread
# holds 128 x 64 / 256 = 32 scores a key tile, and the loop body is emitted once (no causal branch)
import collections, os, re, subprocess, tempfile
from triton.backends.nvidia.compiler import get_ptxas
tools = os.path.dirname(get_ptxas(90).path)
S35_SOFTCAP = "30.0 * (2.0 * sigmoid(a * (2.0 / 30.0)) - 1.0)"  # session 35's tanh: 2 sigmoid(2x) - 1
cks = {}
for cap in ("none", "softcap(30.0)", "softcap_approx(30.0)", "sigmoid", S35_SOFTCAP):
    g = Diagram("a", q=4096, x=4096, d=128, e=128)
    Q, K_, V = g.input("Q", "q d"), g.input("K", "x d"), g.input("V", "x e")
    S = g.map("scale(0.0883)", g.contract(Q, K_, out="q x", name="S", dtype="fp32"), name="Ss", dtype="fp32")
    if cap == "sigmoid":
        O = g.contract(g.map("sigmoid(a - 2.0)", S, name="P"), V, out="q e", name="O")
    else:
        S = S if cap == "none" else g.map(cap, S, name="Sc", dtype="fp32")
        O = g.softmax_contract(S, V, over="x", name="O")
    mod = _module(napkin_compile(g.output(O).weave("h", 16, ["Q", "K", "V"])).source)
    ck = compile_kernel(mod.attention_fwd_tma, dict(
        Q=TensorDescriptor.from_tensor(q, [1, 128, 128]), K=TensorDescriptor.from_tensor(q, [1, 64, 128]),
        V=TensorDescriptor.from_tensor(q, [1, 64, 128]), O=o, H=16, NQ=4096, NX=4096, sqb=0, sqh=0, sqm=0,
        sqd=0, skb=0, skh=0, skn=0, skd=0, svb=0, svh=0, svn=0, sve=0, sob=16 * 4096 * 128, soh=4096 * 128,
        som=128, soe=1, D=128, E=128, BM=128, BN=64, CAUSAL=False, EVEN_Q=True, EVEN_X=True, HEAD_GROUP=0), num_warps=8, num_stages=3)
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "k.ptx"), "w").write(ck.asm["ptx"])
        subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", os.path.join(tmp, "k.ptx"), "-o",
                        os.path.join(tmp, "k.cubin")], check=True)
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", os.path.join(tmp, "k.cubin")],
                              check=True, capture_output=True, text=True).stdout
    mufu = collections.Counter(re.findall(r"MUFU\.(\w+)", sass))
    cks[cap] = ck
    print("mufu", cap.replace(" ", ""), mufu["EX2"], mufu["RCP"], mufu["TANH"], resources(ck).spill_stores)


def loop_instructions(ck):
    """SASS instructions a warp issues in a step of the k-loop: the smallest backward-branch region that
    holds the HGMMAs."""
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "k.ptx"), "w").write(ck.asm["ptx"])
        subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", os.path.join(tmp, "k.ptx"), "-o",
                        os.path.join(tmp, "k.cubin")], check=True)
        text = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", os.path.join(tmp, "k.cubin")],
                              check=True, capture_output=True, text=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = []
    for a, x in ins:
        b = re.search(r"BRA (0x[0-9a-f]+)", x)
        if b and int(b.group(1), 16) < a:
            body = [y for c, y in ins if int(b.group(1), 16) <= c <= a]
            if any("HGMMA" in y for y in body):
                loops.append(len(body))
    return min(loops)


gemm = compile_kernel(_module(napkin_compile(models.matmul(m=8192, n=4096, k=4096)).source).stage_0_C_tma, dict(
    A=TensorDescriptor.from_tensor(X, [128, 64]), W0=TensorDescriptor.from_tensor(P, [64, 256]), OUT=P, M=8192,
    N=4096, K=4096, stride_am=4096, stride_ak=1, stride_w0k=4096, stride_w0n=1, stride_om=4096, stride_on=1,
    BM=128, BN=256, BK=64, GROUP=8), num_warps=8, num_stages=3)
print("loop", loop_instructions(norm), loop_instructions(gemm))
print("softcap_loop", *(loop_instructions(cks[c]) for c in ("none", "softcap(30.0)", S35_SOFTCAP, "softcap_approx(30.0)")))
# the shared-memory ring of every TMA-loaded MMA operand in a loop: its depths (a race where one is shallower)
for name, ck in (("dual", dual), ("attention", att), ("rownorm", norm)):
    print("rings", name, *sorted(set(re.findall(r"ttg.local_alloc : \(\) -> !ttg.memdesc<(\d+)x\d+x\d+xbf16",
                                                 ck.asm["ttgir"]))))
'''


def test_compiled_kernels_compile_for_hopper_with_wgmma_and_tma():
    # the GPU's compiler, on the CPU (TRITON_INTERPRET unset in a fresh process): the dual GEMM with its
    # epilogue, the causal softcap attention and RMSNorm + GEMM take wgmma (not serialized) and TMA,
    # without spills, within shared memory
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", HOPPER_CHECK], capture_output=True, text=True, timeout=300,
                       env=env, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.split()[:1] in (["dual"], ["attention"], ["rownorm"])]
    assert len(rows) == 3
    mufu = {ln.split()[1]: [int(v) for v in ln.split()[2:]] for ln in r.stdout.splitlines() if ln.startswith("mufu ")}
    # a score's SFU work in the emitted loop, as rewrite.SFU_COST counts it (32 scores a thread a key tile;
    # the online softmax adds 2 EX2 (alpha) and the epilogue 3 RCP (1 / l) per thread beside them): the
    # softmax 1 EX2; softcap's tanh one EX2 (compile._tanh); softcap_approx's one TANH;
    # sigmoid attention's EX2 + RCP (no softmax); the program order's integer division by a runtime value
    # (a head's query tiles, HEAD_GROUP 0 as run.py launches non-causal kernels: before the loop) 1 RCP
    # more each (HEAD_GROUP 4's head groups: 3)
    order = 1
    assert mufu["none"] == [32 + 2, 3 + order, 0, 0]
    assert mufu["softcap(30.0)"] == [64 + 2, 3 + order, 0, 0]  # tanh: one EX2, its reciprocal by Newton steps
    assert mufu["softcap_approx(30.0)"] == [32 + 2, 3 + order, 32, 0]
    assert mufu["sigmoid"] == [32, 32 + 1 + order, 0, 0]
    # the exact softcap's loop issues fewer instructions than session 35's sigmoid form (compile._softcap:
    # one EX2, Newton steps for the reciprocal, the scale folded into tanh's argument): 758 against 822
    # SASS instructions a warp a key tile (plain 340, softcap_approx 436)
    plain, exact, s35, approx = next([int(v) for v in ln.split()[1:]] for ln in r.stdout.splitlines()
                                     if ln.startswith("softcap_loop"))
    assert approx < exact < s35 and (exact - plain) / 32 <= 13.5, (plain, exact, s35, approx)
    # rownorm's GEMM: the row factor comes from its own pass, so the k-loop is the plain GEMM's (in
    # session 35 the statistic recomputed in it cost 143 SASS instructions a warp a step more), and X's
    # tile and P's share one ring depth (X's second use, the statistic's read of the same tile, had given
    # it 2 buffers against P's 3 with the TMA two steps ahead of the wgmma: a write-after-read race)
    norm_loop, gemm_loop = next([int(v) for v in ln.split()[1:]] for ln in r.stdout.splitlines() if ln.startswith("loop "))
    assert abs(norm_loop - gemm_loop) <= 8, (norm_loop, gemm_loop)
    rings = {ln.split()[1]: ln.split()[2:] for ln in r.stdout.splitlines() if ln.startswith("rings ")}
    # one depth a kernel, its num_stages: the dual GEMM's X, W1, W3 4; attention's K and V 3 (Q once a tile);
    # rownorm's X and P 3
    assert rings == {"dual": ["4"], "attention": ["3"], "rownorm": ["3"]}, rings
    for name, regs, spill_st, spill_ld, shared, wgmma, tma, serialized in rows:
        # serialized: ptxas's C7515, an MMA operand or accumulator defined by other instructions in the
        # pipeline (rownorm's operand made in registers did that: 0.5x; the weight is now prescaled)
        assert wgmma == "True" and tma == "True" and serialized == "False", name
        assert spill_st == spill_ld == "0" and int(regs) <= 255 and int(shared) <= 227 * 1024, name


def test_attention_scale_folded_into_exp2():
    g = Diagram("scaled_attention", q=32, x=48, d=16, e=16)
    Q, K, V = g.input("Q", "q d", "fp16"), g.input("K", "x d", "fp16"), g.input("V", "x e", "fp16")
    S = g.map("scale(0.3)", g.contract(Q, K, out="q x", name="S", dtype="fp32"), name="Ss", dtype="fp32")
    g = g.output(g.softmax_contract(S, V, over="x", name="O", causal="q", dtype="fp16")).weave("h", 2, ["Q", "K", "V"])
    f, _, _ = run_and_check(g, 4.0, scale=3.0, BM=16, BN=16)
    assert f"tl.exp2(s * {0.3 * 1.4426950408889634!r}" in f.source and "v_Ss =" not in f.source

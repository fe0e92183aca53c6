"""The chunk-parallel GLA backward's dqk kernel with its value columns by a loop (configs_gla_bwd.CHUNKED dqk_VB,
session 31: fewer live tiles a program), in the interpreter into NaN-filled buffers against the float64
recurrence's autograd: fp16 weak decays (the factored intra-chunk terms) with a tail (N 17, 200) and a partial
value block, float32 strong decays with a reset and a floored channel (the sub-chunk fallback, dg 0 where the floor
clamps), with dq / dk apart and the fallback apart. experiments/linear_attention/gpu_gla_bwd_dqk.py checks and
times the same variants on the H100 (bf16) and tests/linear_attention/test_gla_backward_dqk_compile.py reads their
sm_90a registers."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import kernels_backward_gla_chunked
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan

from la_testing import F16, F32, make, reference

NAN = float("nan")


def run_chunked(q, k, v, g, s0, do, dht, ht, **blocks):
    """kernels_backward_gla_chunked.backward into NaN-filled buffers (every element written): dq, dk, dv, dg[, dh0]."""
    p = tl_plan(q, v, g, IDENTITY, 64)
    out = dict(dq=torch.full_like(q, NAN), dk=torch.full_like(k, NAN), dv=torch.full_like(v, NAN),
               dg=torch.full_like(g, NAN, dtype=torch.float32))
    if s0 is not None:
        out["dh0"] = torch.full_like(s0, NAN)
    got = kernels_backward_gla_chunked.backward(p, do, q, k, v, g, s0, ht, dht, q.shape[-1] ** -0.5, out=out, **blocks)
    for name, t in out.items():
        assert not torch.isnan(t).any(), f"{name}: some elements were never written"
    return [x for x in got if x is not None]


# the value loop at blocks of 16 over Dv 40 (a block-padded 64: the last block masked whole, one partly), dq / dk
# together or apart, the fallback in the same launch or its own; warps and the register cap (compile options: the
# interpreter takes and ignores them) as the GPU candidates have them; the fallback launch reading 4 flags a program
VARIANTS = [
    dict(dqk_VB=16, dg_fused=False),
    dict(dqk_VB=16, wide_apart=True, dqk_warps=8, dqk_maxnreg=128, wide_group=4, dg_fused=False),
    dict(dqk_VB=32, wide_apart=False, dqk_apart=True, dg_fused=False),
]


@pytest.mark.parametrize("N, options", [(17, o) for o in VARIANTS] + [(200, VARIANTS[1])])
def test_value_loop_fp16_weak_decays_and_tails(N, options):
    """fp16, N 17 / 200 in chunks of 16 (a partial last chunk; at 200 the fallback launch's 26 programs in groups of
    4, the last partial), Dk 32 in two key blocks, Dv 40, an initial state and a final state's gradient: dq, dk, dv
    within 2.5x the rounding floor, dg, dh0 at fp16's relative error."""
    torch.manual_seed(N)
    q, k, v, g, s0 = make(1, N, 1, 1, 32, 40, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run_chunked(q, k, v, g, s0, do, dht, st.float(), BT=16, BKB=16, KD=16, BV=16, BK_DG=16, **options)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3
    assert accuracy.rel_rms(got[4], ref[4]) < 1e-3


@pytest.mark.parametrize("N, options", [(200, VARIANTS[0]), (200, VARIANTS[1]), (200, VARIANTS[2])])
def test_value_loop_float32_strong_decays_and_a_reset(N, options):
    """float32, log decays in [-6, 0] (the sub-chunk fallback) with a reset (-inf) and a -1e30 channel, weak decays
    on the last chunks (both forms in one run), N 200 in chunks of 32 (a partial last one; 7 programs for the
    fallback launch's groups of 4), no initial state:
    float32 noise against float64, dg 0 where the floor clamped."""
    torch.manual_seed(7)
    q, k, v, g, _ = make(1, N, 1, 1, 16, 40, dtype=F32, decay="channel", strong=True)
    g[:, N // 2, :, :4] = float("-inf")
    g[:, 3, :, 5] = -1e30
    g[:, N - 40:, :, :] *= 0.01
    do, dht = torch.randn(v.shape), torch.randn(1, 1, 16, 40)
    _, st, ref = reference(q, k, v, g, None, dout=do, dstate=dht)
    dq, dk, dv, dg = run_chunked(q, k, v, g, None, do, dht, st.float(), BT=32, BKB=16, **options)
    for name, x, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert accuracy.rel_rms(x, r) < 2e-5, (name, accuracy.rel_rms(x, r))
    live = g >= -100
    assert (dg[~live] == 0).all()
    assert accuracy.rel_rms(dg[live], ref[3][live]) < 2e-4


def test_value_loop_matches_whole_value_columns():
    """The value loop and the whole-columns program give the same gradients (float32: to rounding), and dk_at (a
    second score dot on the whole v, do) is refused with the loop."""
    torch.manual_seed(9)
    q, k, v, g, s0 = make(1, 70, 1, 1, 16, 32, dtype=F32, decay="channel", h0=True)
    do, dht = torch.randn(v.shape), torch.randn(s0.shape)
    _, st, _ = reference(q, k, v, g, s0, dout=do, dstate=dht)
    whole = run_chunked(q, k, v, g, s0, do, dht, st.float(), BT=16, dqk_VB=None, dg_fused=False)
    loop = run_chunked(q, k, v, g, s0, do, dht, st.float(), BT=16, dqk_VB=16, dg_fused=False)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), whole, loop):
        assert accuracy.rel_rms(b, a) < 1e-6, name
    with pytest.raises(ValueError, match="dk_at"):
        run_chunked(q, k, v, g, s0, do, dht, st.float(), BT=16, dqk_VB=16, dk_at=True, dg_fused=False)


@pytest.mark.parametrize("final, local", [(True, False), (False, False), (True, True), (False, True),
                                          (True, "early"), (False, "early"), (True, "lean"), (False, "lean"),
                                          (True, 1), (False, 2), (True, 3), (False, 3)])
def test_dg_fused_in_the_dqk_kernel(final, local):
    """dg_fused: dg stored whole by the dqk kernel (the later tokens' part from S_(c+1) dS_c; the final state's from
    ht where given), no dg kernel: fp16 N 17 and float32 strong decays + a reset + a -1e30 channel at N 200, with and
    without a final state's gradient; dg 0 where the floor clamped (float32 at N 100: 4 chunks of 32, the first
    two strong, the last two weak, the last partial). dg_local (session 32): the same part from S_c,
    dS_c and the chunk's own k, v (S_(c+1) never read; ht not passed); "early": with dqk_early (the first value
    block's tiles loaded before the span test, the loop from the second); "lean": with dqk_lean (r from do v^T's
    diagonal) and dqk_dotscan (dG's reverse sum as a dot; here its interpreter form, one float32 dot); 1-3: "lean"
    with session 33's dqk_form (1: one three-way reduction and two exp tiles, 2: no branch on the span, the flagged
    blocks' outputs written again by the fallback's launch; 3: both)."""
    form = local if local in (1, 2, 3) and local is not True else 0
    lean = local == "lean" or bool(form)
    extra = dict(dg_local=bool(local), dqk_early=local == "early", dqk_lean=lean, dqk_dotscan=lean, dqk_form=form)
    torch.manual_seed(11)
    q, k, v, g, s0 = make(1, 17, 1, 1, 32, 40, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape) if final else None
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run_chunked(q, k, v, g, s0, do, dht, None if local else st.float(), BT=16, BKB=16, KD=16, BV=16, BK_DG=16,
                      dqk_VB=16, dg_fused=True, **extra)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3
    q, k, v, g, _ = make(1, 100, 1, 1, 16, 40, dtype=F32, decay="channel", strong=True)
    g[:, 50, :, :4] = float("-inf")
    g[:, 3, :, 5] = -1e30
    g[:, 60:, :, :] *= 0.01
    do, dht = torch.randn(v.shape), torch.randn(1, 1, 16, 40) if final else None
    _, st, ref = reference(q, k, v, g, None, dout=do, dstate=dht)
    dq, dk, dv, dg = run_chunked(q, k, v, g, None, do, dht, None if local else st.float(), BT=32, BKB=16, dqk_VB=16,
                                 wide_group=2, dg_fused=True, **extra)
    for name, x, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert accuracy.rel_rms(x, r) < 2e-5, (name, accuracy.rel_rms(x, r))
    live = g >= -100
    assert (dg[~live] == 0).all()
    assert accuracy.rel_rms(dg[live], ref[3][live]) < 2e-4
    with pytest.raises(ValueError, match="dg_fused"):
        run_chunked(q, k, v, g, None, do, dht, st.float(), BT=32, dqk_VB=None, dg_fused=True)


@pytest.mark.parametrize("N, Dk, walk_BK", [(17, 24, 16), (50, 32, 16), (40, 32, 8)])
def test_walks_by_key_blocks(N, Dk, walk_BK):
    """walk_BK (session 32): the state walks by key blocks (each row of S and dS walks on its own), here 2-4 blocks
    with a partial last one (Dk 24 in blocks of 16), an initial state and a final state's gradient: the same
    gradients as the whole-row walks (float32: to rounding) and fp16 within 2.5x the rounding floor, dh0 at fp16's
    relative error."""
    torch.manual_seed(N + Dk)
    q, k, v, g, s0 = make(1, N, 1, 1, Dk, 40, dtype=F32, decay="channel", h0=True)
    do, dht = torch.randn(v.shape), torch.randn(s0.shape)
    _, st, _ = reference(q, k, v, g, s0, dout=do, dstate=dht)
    blocks = dict(BT=16, BKB=16, KD=16, BV=16, BK_DG=16, dqk_VB=16, dg_fused=True)
    whole = run_chunked(q, k, v, g, s0, do, dht, st.float(), **blocks)
    split = run_chunked(q, k, v, g, s0, do, dht, st.float(), walk_BK=walk_BK, walk_warps=4, **blocks)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), whole, split):
        assert accuracy.rel_rms(b, a) < 1e-6, name
    q, k, v, g, s0 = make(1, N, 1, 1, Dk, 40, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run_chunked(q, k, v, g, s0, do, dht, st.float(), walk_BK=walk_BK, **blocks)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3
    assert accuracy.rel_rms(got[4], ref[4]) < 1e-3


def test_scan_dot_three_bf16_pieces():
    """_scan_dot's GPU form (DOTSCAN 3) splits float32 x into three bf16 pieces hi + mid + lo; the interpreter cannot
    run bf16 dots, so its arithmetic is checked here in torch: the pieces sum to x within 2^-22 relative over
    magnitudes 1e-30 .. 1e30 (and signs), and the triangle-of-ones product of the pieces (float64 sums) is the float64
    reverse cumulative sum within float32's rounding."""
    torch.manual_seed(3)
    x = torch.randn(64, 32) * torch.logspace(-30, 30, 64)[:, None]
    hi = x.to(torch.bfloat16)
    r1 = x - hi.float()
    mid = r1.to(torch.bfloat16)
    lo = (r1 - mid.float()).to(torch.bfloat16)
    back = hi.double() + mid.double() + lo.double()
    assert ((back - x.double()).abs() <= x.double().abs() * 2.0 ** -22).all()
    y = torch.randn(64, 32)
    hi = y.to(torch.bfloat16)
    r1 = y - hi.float()
    mid = r1.to(torch.bfloat16)
    lo = (r1 - mid.float()).to(torch.bfloat16)
    upper = torch.triu(torch.ones(64, 64, dtype=torch.float64))
    got = upper @ (hi.double() + mid.double() + lo.double())
    ref = torch.flip(torch.cumsum(torch.flip(y.double(), [0]), 0), [0])
    assert accuracy.rel_rms(got, ref) < 1e-7


@pytest.mark.parametrize("N, Dk, form", [(17, 24, 1), (34, 48, 1), (17, 24, 5), (34, 48, 5), (34, 48, 21),
                                         (17, 24, 53)])
def test_dv_form_one_reduction_two_exp_tiles(N, Dk, form):
    """dv_form 1 (session 33): the dv kernel's factored blocks with the span's middle and G_last by one three-way
    reduction and e^(G_last - G) from e^(m - G): the same gradients as dv_form 0 (float32 weak decays: to rounding),
    fp16 within 2.5x the rounding floor, and float32 strong decays with a reset (most chunks flagged for the fallback,
    some not) against float64. Form 5: and no branch on the flags (marked chunks written again by the fallback's
    launch); 21: and the scores made transposed (P^T, the register operand of P^T do); 53: and each key block's dS_c
    rows loaded with its q, k, g."""
    torch.manual_seed(N + 1)
    q, k, v, g, s0 = make(1, N, 1, 1, Dk, 40, dtype=F32, decay="channel", h0=True)
    do, dht = torch.randn(v.shape), torch.randn(s0.shape)
    _, st, _ = reference(q, k, v, g, s0, dout=do, dstate=dht)
    blocks = dict(BT=16, BKB=16, KD=16, BV=16, BK_DG=16, dqk_VB=16, dg_fused=True)
    before = run_chunked(q, k, v, g, s0, do, dht, st.float(), dv_form=0, **blocks)
    after = run_chunked(q, k, v, g, s0, do, dht, st.float(), dv_form=form, **blocks)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), before, after):
        assert accuracy.rel_rms(b, a) < 1e-6, name
    q, k, v, g, s0 = make(1, N, 1, 1, Dk, 40, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run_chunked(q, k, v, g, s0, do, dht, st.float(), dv_form=form, **blocks)
    assert accuracy.error_over_floor(got[2], ref[2]) <= 2.5
    q, k, v, g, _ = make(1, N, 1, 1, Dk, 40, dtype=F32, decay="channel", strong=True)
    g[:, N // 2, :, :4] = float("-inf")
    g[:, N - 9:, :, :] *= 0.01
    do = torch.randn(v.shape)
    _, _, ref = reference(q, k, v, g, None, dout=do)
    got = run_chunked(q, k, v, g, None, do, None, None, dv_form=form, dqk_form=3, **blocks)
    assert accuracy.rel_rms(got[2], ref[2]) < 2e-5


def test_session33_values_only_at_the_checked_head_dims():
    """configs_gla_bwd.CHUNKED_OTHER_DIMS: session 33's dqk_VB / dqk_form / dv_form run at the head dims the H100
    checked them (CHUNKED_CHECKED_DIMS: d 128; d 64 and d 32 with dqk_dyn since session 34's run 3); other dims (d 96
    here) take session 32's; a caller's explicit override is kept whatever the dims."""
    from tilecore.ops.linear_attention import configs_gla_bwd

    def dqk_dv_options(d, **over):
        q = torch.empty(1, 256, 2, d, dtype=torch.bfloat16)
        g = torch.empty(1, 256, 2, d)
        s = torch.empty(1, 2, d, d)
        steps = []
        kernels_backward_gla_chunked.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1,
                                              steps=steps, **dict(dict(dqk_flat=0), **over))  # the common launch
        opts = {name: kw for name, _, _, _, kw in steps}
        return opts["dqk0w"], opts["dvw"]

    assert {(128, 128), (64, 64), (32, 32)} == set(configs_gla_bwd.CHUNKED_CHECKED_DIMS)
    dqk, dv = dqk_dv_options(128)
    assert (dqk["VB"], dqk.get("FORM"), dv.get("DVFORM")) == (configs_gla_bwd.CHUNKED["dqk_VB"],
                                                             configs_gla_bwd.CHUNKED["dqk_form"],
                                                             configs_gla_bwd.CHUNKED["dv_form"])
    dqk, dv = dqk_dv_options(64)
    assert (dqk["VB"], dqk.get("FORM"), dv.get("DVFORM"), dqk.get("DYN")) == (64, 3, configs_gla_bwd.CHUNKED["dv_form"],
                                                                              True)
    dqk, dv = dqk_dv_options(96)
    assert (dqk["VB"], dqk.get("FORM"), dv.get("DVFORM")) == (32, None, None)
    dqk, dv = dqk_dv_options(96, dqk_VB=64, dqk_form=3, dv_form=5)
    assert (dqk["VB"], dqk.get("FORM"), dv.get("DVFORM")) == (64, 3, 5)


S33 = dict(dqk_VB=64, dqk_form=3, dv_form=5, dqk_flat=0)  # session 33's values, by override (whatever configs' dims
# rule), on the common launch
OFF = dict(dqk_dyn=False)  # the constexpr-bounded value loop (configs' before session 34's run 3)


@pytest.mark.parametrize("D, switch", [(64, OFF), (64, dict(dqk_dyn=True)), (32, dict(dqk_dyn=True)),
                                       (96, dict(dqk_dyn=True, dqk_VB=32, dqk_form=0, dv_form=0))])
def test_session33_values_at_d64_and_d32(D, switch):
    """Session 33's dqk_VB 64 / dqk_form 3 / dv_form 5 at Dk = Dv = 64 and 32 with configs' chunk 64 and key blocks
    of 32: one value block (VB 64 >= Dv; on the H100 that build was wrong, decision 84) or one bounded by Dv at run
    time (dqk_dyn). fp16 N 66 (a last chunk of 2 tokens) with an
    initial state and a final state's gradient against float64: dq / dk / dv within 2.5x the rounding floor; float32
    strong decays with a reset and a -1e30 channel (the fallback launches) at float32 noise, dg 0 where the floor
    clamped. d 96 (a dims pair configs leave to CHUNKED_OTHER_DIMS): session 32's form (dqk_VB 32, forms 0) with
    dqk_dyn, as configs now run it there (a partial last value block). The math is right in every form here (the
    interpreter runs no compiled code): the GPU run (experiments/linear_attention/gpu_gla_bwd_s34.py) and
    test_gla_backward_dqk_compile's loop test say which build is right."""
    torch.manual_seed(D)
    q, k, v, g, s0 = make(1, 66, 1, 1, D, D, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run_chunked(q, k, v, g, s0, do, dht, st.float(), **dict(S33, **switch))
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3
    assert accuracy.rel_rms(got[4], ref[4]) < 1e-3
    q, k, v, g, _ = make(1, 100, 1, 1, D, D, dtype=F32, decay="channel", strong=True)
    g[:, 50, :, :4] = float("-inf")
    g[:, 3, :, 5] = -1e30
    do, dht = torch.randn(v.shape), torch.randn(1, 1, D, D)
    _, st, ref = reference(q, k, v, g, None, dout=do, dstate=dht)
    dq, dk, dv, dg = run_chunked(q, k, v, g, None, do, dht, None, **dict(S33, **switch))
    for name, x, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert accuracy.rel_rms(x, r) < 2e-5, (name, accuracy.rel_rms(x, r))
    live = g >= -100
    assert (dg[~live] == 0).all()
    assert accuracy.rel_rms(dg[live], ref[3][live]) < 2e-4


def _dqk_launch_options(D: int, **over) -> list[dict]:
    """The dqk launches' compile options at Dk = Dv = D (bf16, configs' CHUNKED with ``over``), by backward's steps."""
    q = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
    g = torch.empty(1, 256, 2, D)
    s = torch.empty(1, 2, D, D)
    steps = []
    kernels_backward_gla_chunked.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1,
                                          steps=steps, **over)
    return [kw for name, _, _, _, kw in steps if name.startswith("dqk")]


@pytest.mark.parametrize("D", [16, 32, 64, 128, 256])
def test_value_loop_never_one_constexpr_block(D):
    """dqk_dyn: the block as configured, the loop's bound Dv at run time (DYN) in both launches, so Triton never
    folds a one-block loop into straight-line code (the build the H100 got wrong at d 64). Off: session 33's VB 64 is
    one block at d 64 (the decision-84 build) and at d 32 (min(64, 32))."""
    BVF = max(16, D)
    for kw in _dqk_launch_options(D, dqk_dyn=True, **S33):
        assert kw["VB"] == min(64, BVF) and kw["DYN"] is True
    for kw in _dqk_launch_options(D, **S33, **OFF):
        assert kw["VB"] == min(64, BVF) and "DYN" not in kw
    for kw in _dqk_launch_options(D):  # configs' (dqk_dyn on since session 34's run 3): never a folded loop
        assert kw.get("DYN") is True or kw.get("CPP")  # (the flat launch's loop over chunks has a run-time bound)



def _strong_with_a_reset(N, H):
    """float32 strong decays, Dk = Dv = 32, with a reset (-inf) and a -1e30 channel, a final state's gradient: (q, k,
    v, g, do, dht, the float64 gradients)."""
    q, k, v, g, _ = make(1, N, H, H, 32, 32, dtype=F32, decay="channel", strong=True)
    g[:, N // 2, :, :4] = float("-inf")
    g[:, 3, :, 5] = -1e30
    do, dht = torch.randn(v.shape), torch.randn(1, H, 32, 32)
    _, _, ref = reference(q, k, v, g, None, dout=do, dstate=dht)
    return q, k, v, g, do, dht, ref


@pytest.mark.parametrize("N, H, flat, dtype", [(80, 2, 2, F16), (80, 2, 4, F32), (64, 1, 3, F16)])
def test_dqk_flat_chunks_a_program(N, H, flat, dtype):
    """The flat dqk launch (gla_dqk_flat_kernel: ``flat`` consecutive chunks a program, one loop over them, loads by
    tensor descriptors, which the interpreter runs) with dqk_form 3's math, chunks of 16, key blocks of 16, Dk = Dv =
    32: N 80 / 64 (5 / 4 chunks: groups of 2 / 4 / 3, each with a partial last group), 1-2 heads. fp16 weak decays with an
    initial state and a final state's gradient: dq / dk / dv within 2.5x the rounding floor, dg, dh0 at fp16's relative
    error; float32 strong decays with a reset and a -1e30 channel (flagged blocks: the fallback's launch writes them
    again): float32 noise, dg 0 where the floor clamped. Both equal the common launch's gradients to rounding."""
    blocks = dict(BT=16, BKB=16, dqk_VB=16, KD=16, BV=16, dqk_form=3, dqk_flat=flat)
    off = dict(blocks, dqk_flat=0)
    torch.manual_seed(N + flat)
    if dtype == F16:
        q, k, v, g, s0 = make(1, N, H, H, 32, 32, dtype=F16, decay="channel", h0=True)
        do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
        _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
        got = run_chunked(q, k, v, g, s0, do, dht, st.float(), **blocks)
        for name, x, r in zip(("dq", "dk", "dv"), got, ref):
            assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
        assert accuracy.rel_rms(got[3], ref[3]) < 5e-3
        assert accuracy.rel_rms(got[4], ref[4]) < 1e-3
        base, tol = run_chunked(q, k, v, g, s0, do, dht, st.float(), **off), 2e-3
    else:
        q, k, v, g, do, dht, ref = _strong_with_a_reset(N, H)
        got = run_chunked(q, k, v, g, None, do, dht, None, **blocks)
        for name, x, r in zip(("dq", "dk", "dv"), got[:3], ref):
            assert accuracy.rel_rms(x, r) < 2e-5, (name, accuracy.rel_rms(x, r))
        live = g >= -100
        assert (got[3][~live] == 0).all()
        assert accuracy.rel_rms(got[3][live], ref[3][live]) < 2e-4
        base, tol = run_chunked(q, k, v, g, None, do, dht, None, **off), 1e-6
    for name, x, y in zip(("dq", "dk", "dv", "dg"), got, base):
        assert accuracy.rel_rms(x, y) < tol, (name, accuracy.rel_rms(x, y))


def test_dqk_flat_where_configs_and_the_descriptors_allow():
    """configs_gla_bwd.CHUNKED_FLAT_DIMS: the flat launch (chunks a program and stages as listed) at d 128, 64 and 32
    where N is a multiple of the chunk; the common launch elsewhere: N not a multiple of 64, d 96 (not listed),
    a view whose heads are not consecutive in a token's row (q, k, v from a fused projection's split), dqk_flat 0."""
    from tilecore.ops.linear_attention import configs_gla_bwd

    def first(D, N=256, fused=False, **over):  # fused: float32 (no interpreter upcast, which copies the views)
        q = torch.empty(1, N, 2, 3 * D)[..., :D] if fused else torch.empty(1, N, 2, D, dtype=torch.bfloat16)
        g = torch.empty(1, N, 2, D)
        s = torch.empty(1, 2, D, D)
        steps = []
        kernels_backward_gla_chunked.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1,
                                              steps=steps, **over)
        step = next(st for st in steps if st[0] == "dqk0w")
        return step[1].fn.__name__, step[4]

    for (Dk, Dv), want in configs_gla_bwd.CHUNKED_FLAT_DIMS.items():
        name, kw = first(Dk)
        assert name == "gla_dqk_flat_kernel" and kw["CPP"] == want["dqk_flat"], (Dk, kw)
        assert kw["num_stages"] == want["dqk_flat_stages"]
        q, g, s = torch.empty(1, 256, 2, Dk, dtype=torch.bfloat16), torch.empty(1, 256, 2, Dk), torch.empty(1, 2, Dk, Dk)
        steps = []
        kernels_backward_gla_chunked.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1,
                                              steps=steps)
        dv = next(st for st in steps if st[0] == "dvw")  # (the dv kernel by descriptors where dv_flat is listed)
        assert dv[1].fn.__name__ == ("gla_dv_flat_kernel" if want.get("dv_flat") else "gla_dv_kernel"), Dk
        assert dv[4].get("CPP") == want.get("dv_flat") and dv[4]["num_stages"] == want.get("dv_flat_stages", 2)
    assert {(128, 128), (64, 64), (32, 32)} == set(configs_gla_bwd.CHUNKED_FLAT_DIMS)
    for case in (dict(D=128, N=1000), dict(D=64, N=200), dict(D=32, N=200), dict(D=96), dict(D=128, fused=True),
                 dict(D=128, dqk_flat=0)):
        assert first(**case)[0] == "gla_dqk_kernel", case


@pytest.mark.parametrize("N, H, flat, dtype", [(80, 2, 2, F16), (80, 1, 3, F32), (48, 1, 1, F16)])
def test_dv_flat_by_descriptors(N, H, flat, dtype):
    """dv_flat (session 39): the dv kernel's common launch by gla_dv_flat_kernel (``flat`` chunks a program, the loads
    and dv's store by tensor descriptors, P^T made directly), chunks of 16, key blocks of 16 (two a chunk), value
    blocks of 16 (two), Dk = Dv = 32, N 80 / 48 (groups of 2 / 3 with a partial last one; one chunk a program), 1-2
    heads. fp16 weak decays with an
    initial state and a final state's gradient: dv within 2.5x the rounding floor; float32 strong decays with a reset
    and a -1e30 channel (chunks flagged: the fallback's launch writes their dv again): float32 noise. Every output
    equals the pointer launch's (dv_flat 0) to rounding."""
    blocks = dict(BT=16, BKB=16, dqk_VB=16, KD=16, BV=16, dv_BV=16, dv_flat=flat)
    torch.manual_seed(N + flat)
    if dtype == F16:
        q, k, v, g, s0 = make(1, N, H, H, 32, 32, dtype=F16, decay="channel", h0=True)
        do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
        _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
        args, tol = (q, k, v, g, s0, do, dht, st.float()), 2e-3
        got = run_chunked(*args, **blocks)
        assert accuracy.error_over_floor(got[2], ref[2]) <= 2.5, accuracy.error_over_floor(got[2], ref[2])
    else:
        q, k, v, g, do, dht, ref = _strong_with_a_reset(N, H)
        args, tol = (q, k, v, g, None, do, dht, None), 1e-6
        got = run_chunked(*args, **blocks)
        assert accuracy.rel_rms(got[2], ref[2]) < 2e-5, accuracy.rel_rms(got[2], ref[2])
    steps = []
    kernels_backward_gla_chunked.backward(tl_plan(q, v, g, IDENTITY, 64), do, q, k, v, g, args[4], args[7], dht,
                                          0.1, steps=steps, **blocks)
    assert next(s for s in steps if s[0] == "dvw")[1].fn.__name__ == "gla_dv_flat_kernel"
    base = run_chunked(*args, **dict(blocks, dv_flat=0))
    for name, x, y in zip(("dq", "dk", "dv", "dg"), got, base):
        assert accuracy.rel_rms(x, y) < tol, (name, accuracy.rel_rms(x, y))

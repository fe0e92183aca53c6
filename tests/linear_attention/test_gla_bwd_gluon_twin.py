"""The Gluon dq / dk kernel's FORM 2 chain (gluon_gla_bwd.GlaDqk.chain_dots) step by step in torch on the CPU: its
twin. Gluon does not run in the interpreter, so this replays the chain's arithmetic (bf16 operands of every product,
float32 sums, G's sums from two bf16 pieces of g and dG's from three, m = G_last / 2, e^m and e^G_last as products of
e^(m / 2), a^T as a's bf16 tile transposed, the flag) against the float64 gradients of one chunk
(linear_attention_reference through autograd, an initial state and a final state's gradient standing for S_c and
dS_c). The kernel's e^x (ex2.approx.ftz) flushes results below 2^-126 to 0, which float32 torch keeps as subnormals:
terms of that size are nothing next to the others; the FORM bits beside 2 (STORE_TMA, DG_TMA, DG_LATE: where the
results are stored; J_SMEM: where J is read from) leave the arithmetic as it is, PIECES_RZ makes the pieces by
truncation (``rz``), DG_TWO makes dG's sums from two pieces (``dg_two``). The GPU run
(experiments/linear_attention/gpu_gla_bwd_forms.py) checks the kernel itself against float64."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import gluon_gla_bwd as gg
from tilecore.ops.linear_attention import linear_attention_reference

FLOOR = gg.FLOOR.value
BF16 = torch.bfloat16
f32 = torch.float32


def mm(a, b):
    """A wgmma: operands in bf16 (as given), products exact, sums in float32."""
    return a.to(f32) @ b.to(f32)


def trunc16(x):
    """gluon_gla_bwd.GlaDqk.trunc16: the float32 pattern's low 16 bits cleared."""
    return (x.view(torch.int32) & -65536).view(f32)


def pieces(x, n, rz=False):
    """x (float32) as n bf16 pieces, largest first (gluon_gla_bwd.GlaDqk.pieces: n = 3); rz (PIECES_RZ): each piece
    but the last by truncation."""
    out, rest = [], x
    for i in range(n):
        p = trunc16(rest).to(BF16) if rz and i < n - 1 else rest.to(BF16)
        out.append(p)
        rest = rest - p.to(f32)
    return out


def chain_dots(q, k, g, v, do, hs, dhs, scale, span=64.0, rz=False, dg_two=False):
    """One key block of one chunk as chain_dots computes it: q, k [BT, BKB] bf16, g float32, v, do [BT, Dv] bf16,
    hs, dhs [BKB, Dv] bf16 (S_c's and dS_c's rows). Returns dq, dk (bf16), dg (float32), the flag."""
    BT = q.shape[0]
    L = torch.tril(torch.ones(BT, BT)).to(BF16)
    J = torch.ones(BT, BT).to(BF16)
    gc = torch.where(g < FLOOR, torch.full_like(g, FLOOR), g)
    pg = pieces(gc, 2, rz)
    G = sum(mm(L, p) for p in reversed(pg))
    Gl = sum(mm(J, p) for p in reversed(pg))
    m = 0.5 * Gl
    flag = bool(((G - m).abs() > 0.5 * span).any() or torch.isnan(G).any())
    E, Ei = torch.exp(G - m), torch.exp(m - G)
    sfx = (hs.to(f32) * dhs.to(f32)).sum(1)
    kei, qe = (k.to(f32) * Ei).to(BF16), (q.to(f32) * E).to(BF16)
    a, dqs, dks = mm(do, v.T), mm(do, hs.T), mm(v, dhs.T)
    r = torch.diagonal(a)[:, None] * scale
    a_op = torch.tril(a, -1).to(BF16)
    half = torch.exp(0.5 * m)
    dq = (E * mm(a_op, kei) + dqs * ((E * half) * half)) * scale
    dq_out = (dq + r * k.to(f32)).to(BF16)
    dG = q.to(f32) * dq
    at_op = a_op.T  # (a's strictly-lower bf16 tile read transposed: no second product v do^T)
    em = half * half
    dk_state = dks * (Ei * em)
    dk = Ei * mm(at_op, qe) * scale + dk_state
    dk_out = (dk + r * q.to(f32)).to(BF16)
    dG = dG - k.to(f32) * dk
    x = dG + k.to(f32) * dk_state
    n = 2 if dg_two else 3
    acc = sum(mm(J, p) for p in reversed(pieces(x, n, rz))) - sum(mm(L, p) for p in reversed(pieces(dG, n, rz)))
    e2m = em * em
    dg = acc + dG + e2m * sfx[None, :]
    return dq_out, dk_out, torch.where(g < FLOOR, torch.zeros_like(dg), dg), flag


def case(decay, seed, D=64, BT=64, BKB=32):
    """One chunk, one head: the twin by key blocks of BKB against float64 autograd (S_c = h0, dS_c = dht)."""
    torch.manual_seed(seed)
    q, k, v, do = (torch.randn(1, BT, 1, D).to(BF16) for _ in range(4))
    g = -torch.rand(1, BT, 1, D) * decay
    h0 = torch.randn(1, 1, D, D).to(BF16)
    dht = torch.randn(1, 1, D, D).to(BF16)
    scale = D ** -0.5
    leaves = [t.double().requires_grad_() for t in (q, k, v, g)]
    o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=scale, initial_state=h0.double())
    ref = torch.autograd.grad((o * do.double()).sum() + (st * dht.double()).sum(), leaves)
    return (q[0, :, 0], k[0, :, 0], g[0, :, 0], v[0, :, 0], do[0, :, 0], h0[0, 0], dht[0, 0], scale,
            [r[0, :, 0] for r in ref])


def run(c, BKB=32, rz=False, dg_two=False):
    q, k, g, v, do, h0, dht, scale, _ = c
    outs = [chain_dots(q[:, s:s + BKB], k[:, s:s + BKB], g[:, s:s + BKB], v, do, h0[s:s + BKB], dht[s:s + BKB], scale,
                       rz=rz, dg_two=dg_two) for s in range(0, q.shape[1], BKB)]
    return [torch.cat([o[i] for o in outs], 1) for i in range(3)], [o[3] for o in outs]


@pytest.mark.parametrize("rz", [False, True])
@pytest.mark.parametrize("seed, D, BKB", [(2, 64, 32), (7, 64, 32), (6, 32, 32)])
def test_chain_dots_against_float64(seed, D, BKB, rz):
    """Weak decays (no block flagged): dq, dk within 2x the bf16 rounding floor, dg within 2% (one chunk here: 1.55 /
    1.3x and 0.5%); d 32 by one key block of 32 (a consumer's chain when a tile is a pair of chunks, CHUNKS 2)
    too; rz: the pieces by truncation (PIECES_RZ)."""
    c = case(0.3, seed=seed, D=D)
    (dq, dk, dg), flags = run(c, BKB, rz)
    rq, rk, _, rg = c[-1]
    assert not any(flags)
    assert accuracy.error_over_floor(dq, rq) < 2.0, accuracy.error_over_floor(dq, rq)
    assert accuracy.error_over_floor(dk, rk) < 2.0, accuracy.error_over_floor(dk, rk)
    assert accuracy.rel_rms(dg.double(), rg) < 0.02, accuracy.rel_rms(dg.double(), rg)


@pytest.mark.parametrize("rz", [False, True])
@pytest.mark.parametrize("seed, D", [(2, 64), (6, 32)])
def test_dg_from_two_pieces(seed, D, rz):
    """DG_TWO: dG's sums from two bf16 pieces (16 bits of each token's dG) change dg by far less than its error against
    float64 (the bf16 products q dq, k dk it sums): within 1e-4 of dg's RMS of the three-piece chain, and the same
    bound against float64; dq and dk are the same bits."""
    c = case(0.3, seed=seed, D=D)
    (dq3, dk3, dg3), _ = run(c, 32, rz)
    (dq2, dk2, dg2), flags = run(c, 32, rz, dg_two=True)
    assert not any(flags) and torch.equal(dq2, dq3) and torch.equal(dk2, dk3)
    assert accuracy.rel_rms(dg2.double(), dg3.double()) < 1e-4, accuracy.rel_rms(dg2.double(), dg3.double())
    assert accuracy.rel_rms(dg2.double(), c[-1][3]) < 0.02


def test_wide_span_flags_the_block():
    """Strong decays: a block whose G spans past SPAN about m = G_last / 2 is flagged (the fallback launch writes it
    again); the clamped tokens' dg is 0."""
    q, k, g, v, do, h0, dht, scale, _ = case(6.0, seed=3)
    g[10, :3] = float("-inf")
    (_, _, dg), flags = run((q, k, g, v, do, h0, dht, scale, None))
    assert all(flags)
    assert (dg[10, :3] == 0).all()


def test_truncated_pieces_sum_to_x_exactly():
    """PIECES_RZ: hi and mid by truncation, lo the rest rounded to bf16: the three pieces are x exactly (float32 has 24
    significant bits, each truncated piece takes 8 and leaves an exact remainder), as the rounded pieces are; two
    pieces (G's) within 2^-16 |x|."""
    torch.manual_seed(0)
    x = torch.randn(4096) * torch.exp2(torch.randint(-60, 60, (4096,)).float())
    for rz in (False, True):
        p = pieces(x, 3, rz)
        assert torch.equal((p[0].double() + p[1].double() + p[2].double()).float(), x), rz
        two = pieces(x, 2, rz)
        assert ((two[0].double() + two[1].double() - x.double()).abs() <= x.double().abs() * 2.0 ** -16).all(), rz

"""fft_conv's plan memo (op._PLANS, and the recipes and kept launches made from its plans) keys on
tiles.switches.generation: plans read configs, so a probe's ``switches.patched`` block gets plans of its own, and
the shipped plan again after it, on the very inputs the shipped config ran on. Under Triton's interpreter (the pair
kernel at N = 256), the op's signature taken for CPU tensors."""
import torch

from tilecore.ops.fft_conv import configs
from tilecore.ops.fft_conv import op as fft_op
from tilecore.tiles.switches import patched


def _signature(*items):
    """A CPU stand-in for the op's launch-key signature: tensors by shape, strides, dtype, device, alignment."""
    out = []
    for t in items:
        if isinstance(t, torch.Tensor):
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or isinstance(t, (bool, int, float, str)):
            out.append(t)
        else:
            return None
    return tuple(out)


def test_fft_conv_plans_again_in_a_patched_block_and_after_it(monkeypatch):
    """N = 256 by the pair kernel: the shipped PAIR_CONFIGS[256] (2 pairs a program) for the key's calls, another
    tuple (1 pair a program) under a block that patches the table, the shipped one again after it; each plan's calls
    give its first call's bits and the two plans agree to the floor's order (the same convolution)."""
    monkeypatch.setattr(fft_op, "signature", _signature)
    made = []
    real = fft_op.plan
    monkeypatch.setattr(fft_op, "plan", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    for cache in (fft_op._CHECKED, fft_op._PLANS, fft_op._GLUON_CONVS):
        cache.clear()
    g = torch.Generator().manual_seed(42)
    u = torch.randn(2, 2, 256, generator=g).to(torch.bfloat16)
    k = (torch.randn(2, 256, generator=g) / 16).to(torch.bfloat16)

    def calls(n=2):
        return [fft_op.fft_conv(u, k) for _ in range(n)]

    shipped = calls()
    assert [p.pairs for p in made] == [configs.PAIR_CONFIGS[256][2]] == [2]
    with patched(configs, PAIR_CONFIGS={**configs.PAIR_CONFIGS, 256: (32, 16, 1, 4)}):
        variant = calls()
    assert [p.pairs for p in made] == [2, 1]
    after = calls()
    assert [p.pairs for p in made] == [2, 1, 2]
    for ys in (shipped, variant, after):
        assert all(torch.equal(y, ys[0]) for y in ys[1:])
    assert torch.equal(after[0], shipped[0])
    torch.testing.assert_close(variant[0].float(), shipped[0].float(), rtol=2e-2, atol=2e-2)
    for cache in (fft_op._CHECKED, fft_op._PLANS, fft_op._GLUON_CONVS):
        cache.clear()

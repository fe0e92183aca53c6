"""tiles.launch.CachedLaunch's key: it must change exactly when Triton would compile another kernel."""
import torch
from triton.runtime.jit import JITFunction

from tilecore.ops.hadamard import kernels
from tilecore.tiles.launch import CachedLaunch


def key_for(x, out, rows, n=256, **over):
    cfg = dict(N=n, S=4, N1=1, N2=64, B=32, IN_PIECES=1, MID_PIECES=2, MMA_DTYPE=kernels.tl.float16,
               PIECE_DTYPE=kernels.tl.bfloat16, GRID=132, TMA_LOAD=False, TMA_STORE=False, num_warps=8,
               num_stages=3) | over
    # The compiled (not interpreted) kernel, as on a GPU, whatever TRITON_INTERPRET says here.
    launcher = CachedLaunch(JITFunction(kernels.hadamard_kernel.fn))
    return launcher.key((x, out, rows, x.stride(0), out.stride(0), 0.5), cfg)


def test_key_orders_every_argument_and_specializes_like_triton():
    x = torch.randn(64, 256, dtype=torch.float16)
    out = torch.empty_like(x)
    key, ordered = key_for(x, out, 64)
    assert len(ordered) == len(kernels.hadamard_kernel.arg_names)
    assert key == key_for(torch.randn(128, 256, dtype=torch.float16), torch.empty(128, 256, dtype=torch.float16), 128)[0]
    assert key != key_for(x, out, 63)[0]  # rows no longer divisible by 16
    assert key != key_for(x, out, 1)[0]  # 1 is compiled in as a constant
    assert key != key_for(x.bfloat16(), out.bfloat16(), 64)[0]
    assert key != key_for(x, out, 64, MMA_DTYPE=kernels.tl.bfloat16)[0]
    assert key != key_for(x, out, 64, num_stages=2)[0]
    misaligned = torch.randn(64 * 256 + 1, dtype=torch.float16)[1:].view(64, 256)
    assert key != key_for(misaligned, out, 64)[0]

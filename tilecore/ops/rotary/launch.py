"""One launch of a rotary plan (plan.py): out = x turned pair by pair (out may be x itself: in place)."""
from __future__ import annotations

import torch

from tilecore.ops.rotary import kernels
from tilecore.ops.rotary.plan import Plan
from tilecore.tiles.launch import CachedLaunch

_rotary = CachedLaunch(kernels.rotary_kernel)


def output(shape, dtype, device) -> torch.Tensor:
    """A tensor that the kernel writes whole (tests fill it with NaN first, to see that it does)."""
    return torch.empty(shape, dtype=dtype, device=device)


def launch(plan: Plan, x, cos, sin, position_ids, out, interleaved: bool, conjugate: bool, key=None) -> None:
    """x, out: (B, N, H, D) with unit stride along D; cos, sin: (N_max, R) with unit stride along R;
    position_ids: None or (B, N) integers (any strides, 0 included). ``key``: the call's launch key
    (op.py: its signature, which fixes every argument's specialization), or None."""
    B, N, H, D = x.shape
    if x.numel() == 0:
        return
    R = cos.shape[1]
    in_place = out.data_ptr() == x.data_ptr()
    if plan.path == "cpu":
        _cpu(x, cos, sin, position_ids, out, interleaved, conjugate, in_place)
        return
    pos = position_ids
    args = (x, cos, sin, pos, out, N, H, cos.shape[0], x.stride(0), x.stride(1), x.stride(2),
            out.stride(0), out.stride(1), out.stride(2), cos.stride(0), sin.stride(0),
            0 if pos is None else pos.stride(0), 0 if pos is None else pos.stride(1))
    options = dict(R=R, BLOCK_R=plan.block_r, BLOCK_H=plan.block_h, PASS=0 if in_place else D - 2 * R,
                   BLOCK_PASS=plan.block_pass, INTERLEAVED=interleaved, CONJUGATE=conjugate, HAS_POS=pos is not None,
                   num_warps=plan.num_warps)
    if plan.block_t > 1:  # (the token-major launch passes no BLOCK_T: its keyed launches' constexprs as before)
        options["BLOCK_T"] = plan.block_t
    _rotary.run(key, plan.grid, args, options)


# the CPU path's float32 temporaries: tokens a chunk so that one (B, tokens, H, 2R) float32 chunk holds about this many
# values (4 MiB): x's float32 copy and the products are chunks, not whole tensors (issue 31's CPU memory: 3.5x
# torch's own bf16 code's peak at 4 x 1024 x 8 x 128 before, experiments/common/host_cpu_path.py)
CPU_CHUNK_ELEMS = 1 << 20


def _cpu(x, cos, sin, position_ids, out, interleaved, conjugate, in_place) -> None:
    """The same rotation with torch operations in float32, rounded once to out's dtype, CPU_CHUNK_ELEMS at a time
    along the tokens (elementwise: the chunks give the whole tensor's bits; a chunk is read before it is written,
    so in place is safe)."""
    B, N, H = x.shape[:3]
    R = cos.shape[1]
    step = max(1, CPU_CHUNK_ELEMS // max(1, B * H * 2 * R))
    for n0 in range(0, N, step):
        n1 = min(N, n0 + step)
        rows = torch.arange(n0, n1) if position_ids is None else position_ids[..., n0:n1]
        c = cos[rows].float().unsqueeze(-2)  # (n, 1, R) or (B, n, 1, R)
        s = sin[rows].float().unsqueeze(-2)
        if conjugate:
            s = -s
        xf = x[:, n0:n1, :, :2 * R].float()
        if interleaved:
            a, b = xf[..., 0::2], xf[..., 1::2]
        else:
            a, b = xf[..., :R], xf[..., R:]
        a2, b2 = a * c - b * s, b * c + a * s
        rotated = torch.stack((a2, b2), -1).flatten(-2) if interleaved else torch.cat((a2, b2), -1)
        out[:, n0:n1, :, :2 * R] = rotated
        if not in_place and x.shape[-1] > 2 * R:
            out[:, n0:n1, :, 2 * R:] = x[:, n0:n1, :, 2 * R:]

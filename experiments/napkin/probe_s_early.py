"""Can a `tl` attention loop overlap the softmax with the next tile's QK^T wgmma (FlashAttention-3's
in-warpgroup overlap)? CPU only: compiles, for sm_90a, a plain softmax loop whose next S = Q K^T is issued a
step early in the source (before this tile's softmax) and prints where Triton places the waits on the
wgmmas in the loop (TTGIR `ttng.warp_group_dot_wait` and its `pendings`).

Session 37 (Triton 3.6): the QK^T wgmma is waited for with pendings = 0 right after it is issued, before the
softmax, as in the loop napkin.compile emits (S then its wait); only the P V wgmma stays in flight across
the loop's back edge. So the early issue buys
nothing in `tl` (notes/napkin/compile.md, "What is left").

    python experiments/napkin/probe_s_early.py        (TRITON_INTERPRET unset)
"""
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from tilecore.tiles.compile import compile_kernel, resources  # noqa: E402


@triton.jit
def s_early(Q, K, V, O, NX, som, H, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(NX, BM)
    pid_m = pid % num_m
    bh = pid // num_m
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, D)
    q = Q.load([bh, pid_m * BM, 0]).reshape(BM, D)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    s = tl.dot(q, tl.trans(K.load([bh, 0, 0]).reshape(BN, D)))
    for n0 in range(0, NX, BN):
        v = V.load([bh, n0, 0]).reshape(BN, D)
        s_next = tl.dot(q, tl.trans(K.load([bh, n0 + BN, 0]).reshape(BN, D)))  # the next tile's S, early
        m_new = tl.maximum(m_i, tl.max(s, 1) * 0.1275)
        p = tl.exp2(s * 0.1275 - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
        s = s_next
    o = O + bh.to(tl.int64) * NX * som + rm[:, None].to(tl.int64) * som + rd[None, :]
    tl.store(o, (acc / l_i[:, None]).to(O.dtype.element_ty))


def waits(ttgir: str) -> list:
    """In the loop body: each wgmma (S or P V by its result shape) and each wait with its pendings, in order."""
    body = ttgir[ttgir.index("scf.for"):]
    body = body[:body.index("scf.yield")]
    out = []
    for line in body.splitlines():
        if "ttng.warp_group_dot_wait" in line:
            out.append("wait pendings=" + re.search(r"pendings = (\d+)", line).group(1))
        elif "ttng.warp_group_dot " in line:
            out.append("wgmma -> " + re.search(r"-> tensor<(\d+x\d+)", line).group(1))
        elif "math.exp2" in line and re.search(r"tensor<\d+x\d+x", line):
            out.append("softmax exp2")
    return out


def main():
    D, BM, BN, H = 128, 128, 64, 16
    q = torch.empty(H, 4096, D, dtype=torch.bfloat16)
    ck = compile_kernel(s_early, dict(
        Q=TensorDescriptor.from_tensor(q, [1, BM, D]), K=TensorDescriptor.from_tensor(q, [1, BN, D]),
        V=TensorDescriptor.from_tensor(q, [1, BN, D]), O=q, NX=4096, som=D, H=H, D=D, BM=BM, BN=BN),
        num_warps=8, num_stages=3)
    print("S issued a step early:", resources(ck))
    for w in waits(ck.asm["ttgir"]):
        print("   ", w)


if __name__ == "__main__":
    main()

"""The forward's tile steps in Triton ``tl``, shared by the query-block kernel (kernels.py) and the
split-key kernel (decode.py): a block of keys loaded, attended to and folded into the running
softmax, and a tile's rows normalized at the end.

Scores are kept in base 2 (s = q k^T * scale * log2 e, one exp2 each) and are scaled before they
are masked, so a negative scale cannot turn the -inf fill into +inf. A row that saw no key ends with
l = 0: it is written as 0, with lse = -inf, never NaN.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.tiles.launch import next_power_of_2
from tilecore.tiles.ops import block_ptrs, causal_mask, masked, mma, mma_abt, online_softmax_update


def block_d(d: int) -> int:
    """The head dimension padded to a power of two >= 16 (tl.dot's smallest)."""
    return max(16, next_power_of_2(d))


@triton.jit
def key_block(k_base, v_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd, svn, svd):
    """Keys start_n + offs_n0 of one head: K and V rows (zeros from key_end on and past D), and that
    mask (64-bit offsets: tiles.ops.block_ptrs)."""
    kv_ok = (start_n + offs_n0[:, None] < key_end) & d_ok[None, :]
    k = tl.load(block_ptrs(k_base, start_n, offs_n0, offs_d, skn, skd), mask=kv_ok, other=0.0)
    v = tl.load(block_ptrs(v_base, start_n, offs_n0, offs_d, svn, svd), mask=kv_ok, other=0.0)
    return k, v, kv_ok


@triton.jit
def attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd, svn, svd, query, shift,
                m_i, l_i, acc, scale_log2e, CAUSAL: tl.constexpr):
    """Fold keys start_n + offs_n0 (those before key_end) into the rows' running (max, sum, output):
    S = Q K^T, masked (causal: query i sees keys j <= i + shift), online softmax, O += P V."""
    k, v, _ = key_block(k_base, v_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd, svn, svd)
    offs_n = start_n + offs_n0
    s = mma_abt(q, k, tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32)) * scale_log2e
    s = masked(s, offs_n[None, :] < key_end, float("-inf"))
    if CAUSAL:
        s = causal_mask(s, query + shift, offs_n, float("-inf"))
    m_i, l_i, acc, p = online_softmax_update(m_i, l_i, acc, s, 1.0)
    return m_i, l_i, mma(p.to(v.dtype), v, acc)


@triton.jit
def normalized(m_i, l_i, acc):
    """The rows' output acc / l and their base-2 lse (m + log2 l); a row with no key: 0 and -inf."""
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    return acc / l_safe[:, None], tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))

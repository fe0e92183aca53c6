"""Session 28's forward-side terms (issue 36), each checked by hand on one row: FlashAttention-2's
forward tile prologue/epilogue, and the K/V-repeated peer's gathers (timed forward) and scatters (timed
backward) at PyTorch's generic copy rate."""
import math

import pytest

from tilecore.napkin import validate
from tilecore.napkin.hardware import H100


def test_flash2_forward_tile_by_hand_d128():
    # FA2 D128: 128 x 64 tiles. In: Q 128x128, K and V 64x128 (bf16) = 64 KiB; out: O 128x128 bf16 + lse
    # 128 fp32 = 32,768 + 512 B. At the SM's port to the L2 (13.96 TB/s over 132 SMs), plus two 0.7 us round trips.
    loads, stores = 128 * 128 * 2 + 2 * 64 * 128 * 2, 128 * 128 * 2 + 128 * 4
    by_hand = (loads + stores) / (13.96e12 / 132) + 2 * 0.7e-6
    assert by_hand == pytest.approx(2.33e-6, rel=0.01)
    assert validate.flash2_forward_tile_s(128, H100) == pytest.approx(by_hand, rel=1e-9)


def test_flash2_forward_row_adds_one_tile_term_a_query_tile():
    # attention.json's FA2 D128 causal N512 row: B 128, H 16, 4 query tiles of 128 a head = 8192 tiles
    gpu = validate.lab_gpu()
    t_flash, _ = validate.attention_time(128, 16, 16, 512, 128, True, False, gpu, "flash")
    tiles = 128 * 16 * math.ceil(512 / 128)
    term = tiles * validate.flash2_forward_tile_s(128, gpu) / gpu.sms
    assert term == pytest.approx(8192 * 2.33e-6 / 132, rel=0.02)           # ~145 us
    # the wgmma forwards (tilecore persistent; cuDNN costed as FA3's) carry no such term: the same
    # diagram under FA2's tile without the term is what relabel gives
    from tilecore.napkin import models
    from tilecore.napkin.engine import group, relabel, stream
    diag = models.attention(batch=128, heads=16, kv_heads=16, seq=512, d=128, causal=True)
    base = relabel(diag, gpu, {"q": group(128), "x": stream(64)}, warpgroups=1, mma="mma.sync",
                   time_model="serial").time
    assert t_flash == pytest.approx(base + term, rel=1e-9)


def test_kv_repeated_forward_and_backward_by_hand():
    # attention-gqa.json 8B (Hq 32, Hkv 8, D128) N1024: B = 2^20 / (32 * 1024) = 32
    gpu = validate.lab_gpu()
    b, hq, hkv, n, d = 32, 32, 8, 1024, 128
    # one tensor: the q heads' K (or V) written, the kv heads' read: (hq + hkv) x B N D x 2 bytes
    nbytes = (hq + hkv) * b * n * d * 2
    one = validate.copy_time(nbytes // 2, gpu)[0] * validate.GENERIC_COPY_SLOWDOWN
    assert one == pytest.approx(2.07 * (nbytes / 3002e9 + gpu.launch_s), rel=0.08)
    for backward in (False, True):
        attn, _ = validate.attention_time(b, hq, hq, n, d, True, backward, gpu, "cudnn")
        t, _ = validate.kv_repeated_time(b, hq, hkv, n, d, backward, gpu, "cudnn")
        # forward: two index_select gathers; backward: two index_add_ scatters (the forward's repeats
        # are outside the timed autograd.grad call)
        assert t == pytest.approx(attn + 2 * one, rel=1e-9)


def test_generic_copy_slowdown_is_run5s_layout_copies():
    # run 5: SDPA flash backward's two transposing copies of Q (B 16 H 16 N 4096 at the attention bench's
    # 65536 rows x 16 heads): 0.37 ms at D64, 0.74 ms at D128; each copy reads and writes Q's bytes
    for d, ms in ((64, 0.37), (128, 0.74)):
        q_bytes = 65536 * 16 * d * 2
        at_ceiling = 2 * 2 * q_bytes / 3002e9 * 1e3
        assert ms / at_ceiling == pytest.approx(validate.GENERIC_COPY_SLOWDOWN, rel=0.01)

"""The FFT convolution's kernels compile for sm_90a on this (GPU-less) machine: the float32 kernel at its
largest N with at most a few bytes of register spill; the pair kernel at N = 1024 and the long form's
three passes at N = 8192 as the plans ship them, with at most a few bytes of spill (pass 2 at 32 rows:
24 bytes, measured the faster on the H200 all the same), within the H100's shared memory
(python -m tilecore.ops.fft_conv.report compiles every configuration)."""

from tilecore.ops.fft_conv import configs
from compiled_run import compiled_json

CODE = """
import json
from tilecore.ops.fft_conv import configs
from tilecore.ops.fft_conv.report import fft_conv_variants, long_variants, pair_variant
from tilecore.tiles.report import rows
variants = fft_conv_variants()[-1:] + [pair_variant(*configs.PAIR_CONFIGS[1024])] + \\
    long_variants(*configs.LONG_CONFIGS[8192])
print(json.dumps(rows(variants)))
"""


def test_compiles_for_hopper():
    tl_row, pair_row, *long_rows = compiled_json(CODE, timeout=600)
    assert tl_row["kernel"].startswith(f"fft_conv N{max(configs.TL_FACTORS)}"), tl_row
    assert tl_row["spill_stores"] <= 16 and tl_row["shared"] <= 64 * 1024, tl_row
    assert pair_row["kernel"].startswith("fft_conv pair N1024"), pair_row
    assert len(long_rows) == 3 and all(r["kernel"].startswith("fft_conv long N8192") for r in long_rows)
    for row in [pair_row] + long_rows:
        assert row["spill_stores"] <= 32 and row["shared"] <= 227 * 1024, row
    assert pair_row["wgmma"], pair_row  # (64 rows a product: Hopper's warpgroup MMA)

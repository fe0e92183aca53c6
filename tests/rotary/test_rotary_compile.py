"""The rotary kernel compiles for sm_90a on this (GPU-less) machine without spilling, and both layouts
move x in 16-byte vectors (ld/st.global.v4: a 3-D pair tile made 4-byte accesses in the interleaved one).
python -m tilecore.ops.rotary.report compiles every variant."""
from compiled_run import compiled_json

CODE = """
import json
from tilecore.ops.rotary.report import rotary_variants
from tilecore.tiles.compile import compile_kernel, resources
out = []
for name, kernel, args, warps, _ in rotary_variants(((32, 128, 64),)):
    if "position_ids" in name:
        continue
    compiled = compile_kernel(kernel, args, num_warps=warps)
    ptx = compiled.asm["ptx"]
    out.append(dict(name=name, **vars(resources(compiled)), v4_loads=ptx.count("ld.global.v4"),
                    v4_stores=ptx.count("st.global.v4"), stores=ptx.count("st.global")))
print(json.dumps(out))
"""


def test_compiles_for_hopper_with_vector_accesses():
    report = compiled_json(CODE, timeout=600)
    assert len(report) == 2
    for row in report:
        assert row["spill_stores"] == 0 and row["stack"] == 0, row
        assert row["v4_loads"] >= 2 and row["v4_stores"] == row["stores"] == 2, row  # x in, out: all 16-byte

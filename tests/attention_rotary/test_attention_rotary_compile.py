"""The tl attention kernels with ROTARY on compile for sm_90a on this (GPU-less) machine: the forward
at D64 without spilling, every rotary kernel within 64 KiB of shared memory at configs.ROTARY_TL_STAGES;
ROTARY off adds no kernel parameter (COS and SIN default to None, constexpr)
and its PTX is the PTX of the kernel given the off values explicitly. (Before / after identity of the
non-rotary PTX, 24 variants: notes/rotary/README.md's decision log.)"""
from compiled_run import compiled_json

CODE = """
import json, re
import torch
from tilecore.ops.attention import kernels_tl as K
from tilecore.tiles.compile import compile_kernel, resources

d, n, h = 64, 256, 4
q = torch.empty(2, h, n, d, dtype=torch.bfloat16)
lse = torch.empty(2, h, n)
table = torch.empty(n, d // 2)
st = dict(zip("b h n d".split(), q.stride()))
def strides(*prefixes):
    return {p + k: v for p in prefixes for k, v in st.items()}
common = dict(H=h, N=n, Nk=n, D=d, DV=d, GROUP=1, left=0, right=0, scale_log2e=0.1, tanh_scale=0.0, CAUSAL=True,
              WINDOW=False, SOFTCAP=False, BLOCK_D=d, BLOCK_DV=d)
def rotary(on, interleaved=False):
    if not on:
        return dict(COS=None, SIN=None, stride_cos=1, stride_sin=1, rotary_pairs=1, ROTARY=False,
                    ROTARY_INTERLEAVED=False)
    return dict(COS=table, SIN=table, stride_cos=d // 2, stride_sin=d // 2, rotary_pairs=d // 2, ROTARY=True,
                ROTARY_INTERLEAVED=interleaved)
fwd = dict(Q=q, K=q, V=q, O=q, LSE=lse, **strides("sq", "sk", "sv", "so"), **common, BLOCK_M=128, BLOCK_N=64)
bwd = dict(Q=q, K=q, V=q, DO=q, LSE=lse, DELTA=lse, **strides("sq", "sk", "sv", "sd", "sg"), **common,
           scale=0.3, BLOCK_M=64, BLOCK_N=64)
from tilecore.ops.attention_rotary.configs import ROTARY_TL_STAGES as S
variants = [
    ("fwd", K.attn_fwd, fwd, 8, 3),
    ("fwd off", K.attn_fwd, dict(fwd, **rotary(False)), 8, 3),
    ("fwd rotary", K.attn_fwd, dict(fwd, **rotary(True)), 8, S),
    ("fwd rotary interleaved", K.attn_fwd, dict(fwd, **rotary(True, True)), 8, S),
    ("dkdv rotary", K.attn_bwd_dkdv, dict(bwd, DK=q, DV_OUT=q, HKV=h, **strides("svg"), **rotary(True)), 4, S),
    ("dq rotary", K.attn_bwd_dq, dict(bwd, DQ=q, **rotary(True)), 4, S),
]
out = []
for name, kernel, args, warps, stages in variants:
    compiled = compile_kernel(kernel, args, num_warps=warps, num_stages=stages)
    ptx = compiled.asm["ptx"]
    code = [l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "//")) and ".debug" not in l]
    out.append(dict(name=name, **vars(resources(compiled)), params=len(re.findall(r"\\.param \\.", ptx)),
                    code=hash("\\n".join(code))))
print(json.dumps(out))
"""


def test_rotary_compiles_and_off_is_free():
    rows = {row["name"]: row for row in compiled_json(CODE, timeout=900)}
    assert len(rows) == 6
    plain, off = rows["fwd"], rows["fwd off"]
    assert plain["code"] == off["code"] and plain["params"] == off["params"]
    # COS, SIN, their row strides and the pairs: the only parameters rotary adds
    assert rows["fwd rotary"]["params"] == plain["params"] + 5
    for name in ("fwd", "fwd rotary", "fwd rotary interleaved"):
        assert rows[name]["spill_stores"] == 0 and rows[name]["stack"] == 0, rows[name]
    for name in ("dkdv rotary", "dq rotary"):  # compiled (tl.gather turns the fp32 accumulators back)
        assert rows[name]["registers"] > 0, rows[name]
    for name in ("fwd rotary", "fwd rotary interleaved", "dkdv rotary", "dq rotary"):
        # at configs.ROTARY_TL_STAGES: within 64 KiB a block, which every GPU the plans serve has (the
        # table's stages pipeline the turned tiles' cos / sin rows too: 240 KiB at D128, past the H100's 227)
        assert rows[name]["shared"] <= 64 * 1024, rows[name]

"""Issue 30's move of varlen and the KV cache into op packages of their own changed no emitted code:
the kernels compiled for sm_90a on the CPU from a tree (the moved one, or one before the move with the old
module names), one PTX file a variant, for experiments/tiles/ptx_compare.py:

    git archive OLD tilecore | tar -x -C /tmp/old
    python experiments/attention/ptx_move.py --root /tmp/old --ptx /tmp/ptx_old
    python experiments/attention/ptx_move.py --ptx /tmp/ptx_new
    python experiments/tiles/ptx_compare.py /tmp/ptx_old /tmp/ptx_new

Variants: the Gluon varlen forward, backward (dK/dV) and dq kernels at D128 causal; the tl varlen forward;
the KV cache's split-key forward (paged, GQA) and its append.
"""
import argparse
import importlib
import os
import re
import sys


def module(new: str, old: str):
    """The module under its new name, else under its name before the move."""
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError:
        return importlib.import_module(old)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--ptx", required=True)
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.root))
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.tiles.compile import compile_kernel

    assert os.path.abspath(importlib.import_module("tilecore").__file__).startswith(os.path.abspath(a.root))
    os.makedirs(a.ptx, exist_ok=True)

    def write(name, compiled):
        path = os.path.join(a.ptx, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx")
        with open(path, "w") as f:
            f.write(compiled.asm["ptx"].replace(os.path.abspath(a.root) + os.sep, ""))
        print(name, "->", path, flush=True)

    fwd = module("tilecore.ops.attention_varlen.gluon_forward", "tilecore.ops.attention.gluon_varlen")
    bwd = module("tilecore.ops.attention_varlen.gluon_backward", "tilecore.ops.attention.gluon_varlen_backward")
    write("varlen gluon fwd d128 causal", fwd.compiled_forward(128, True))
    write("varlen gluon bwd d128 causal", bwd.compiled_backward(128, True))
    write("varlen gluon dq d128 causal", bwd.compiled_dq(128, True))

    tl_varlen = module("tilecore.ops.attention_varlen.kernels_tl", "tilecore.ops.attention.kernels_varlen")
    tl_cache = module("tilecore.ops.attention_kvcache.kernels_tl", "tilecore.ops.attention.kernels_varlen")
    x = torch.empty(256, 8, 128, dtype=torch.bfloat16)
    i32 = torch.empty(64, dtype=torch.int32)
    f32 = torch.empty(64)
    write("varlen tl fwd d128 causal", compile_kernel(tl_varlen.varlen_fwd, dict(
        Q=x, K=x, V=x, O=x, LSE=f32, CU_Q=i32, CU_K=i32, CU_BLOCKS=i32, sqt=1024, sqh=128, sqd=1, skt=1024, skh=128,
        skd=1, svt=1024, svh=128, svd=1, sot=1024, soh=128, sod=1, B=4, D=128, DV=128, GROUP=1, total_q=256, scale=0.1,
        softcap=0.0, left=0, right=0, SEARCH_STEPS=8, LEFT=False, RIGHT=True, SOFTCAP=0, UNMASKED_MIDDLE=True,
        BLOCK_M=64, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128), num_warps=4, num_stages=3))
    cache = torch.empty(64, 16, 2, 128, dtype=torch.bfloat16)
    q = torch.empty(4, 1, 8, 128, dtype=torch.bfloat16)
    write("kvcache fwd split paged16 gqa", compile_kernel(tl_cache.kvcache_fwd_split, dict(
        Q=q, KC=cache, VC=cache, BLOCK_TABLE=i32, SEQLENS=i32, O=q, LSE=f32, O_PART=f32, LSE_PART=f32,
        sqb=1024, sqn=1024, sqh=128, sqd=1, skp=4096, sks=256, skh=128, skd=1, svp=4096, svs=256, svh=128, svd=1,
        stb=16, stp=1, sob=1024, son=1024, soh=128, sod=1, Hkv=2, Nq=1, Nnew=1, D=128, DV=128, GROUP=4,
        keys_per_split=256, scale=0.1, softcap=0.0, left=0, right=0, PAGE=16, PAGED=True, LEFT=False, RIGHT=False,
        SOFTCAP=False, MERGED=False, BLOCK_M=16, BLOCK_N=128, BLOCK_D=128, BLOCK_DV=128), num_warps=4, num_stages=3))
    new = torch.empty(4, 1, 2, 128, dtype=torch.bfloat16)
    write("kvcache append paged16", compile_kernel(tl_cache.kvcache_append, dict(
        K_NEW=new, V_NEW=new, KC=cache, VC=cache, BLOCK_TABLE=i32, SEQLENS=i32, Nnew=1, Hkv=2, D=128, DV=128,
        snb=256, snn=256, snh=128, snd=1, svnb=256, svnn=256, svnh=128, svnd=1, skp=4096, sks=256, skh=128, skd=1,
        svp=4096, svs=256, svh=128, svd=1, stb=16, stp=1, PAGE=16, PAGED=True, BLOCK_H=2, BLOCK_D=128, BLOCK_DV=128),
        num_warps=4))


if __name__ == "__main__":
    main()

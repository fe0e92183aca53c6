"""The tl attention forward and decode kernels (kernels_tl.attn_fwd, attn_fwd_split_keys) compiled for
sm_90a on the CPU, one PTX file a variant, to check that a change of their source left the emitted
code alone (as port_resources.py does for the Gluon kernels):

    python experiments/tiles/tl_ptx.py --root OLD --ptx /tmp/tl_old
    python experiments/tiles/tl_ptx.py --ptx /tmp/tl_new
    python experiments/tiles/ptx_compare.py /tmp/tl_old /tmp/tl_new

Variants: head dims 64 and 128 with configs.forward_config's blocks, no mask, causal, a window, and
a softcap; decode merged (one split) and split, and the merge of the splits.
"""
import argparse
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--ptx", required=True)
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.ops.attention import kernels_tl
    try:  # the split-key kernels: tilecore.ops.attention_decode since session 31 (issue 30), attention's before
        from tilecore.ops.attention_decode import kernels_tl as decode_kernels
    except ModuleNotFoundError:
        decode_kernels = kernels_tl
    from tilecore.ops.attention.configs import forward_config
    from tilecore.tiles.compile import compile_kernel

    os.makedirs(a.ptx, exist_ok=True)
    LOG2E = 1.4426950408889634

    def write(name, kernel, args, num_warps, **options):
        k = compile_kernel(kernel, args, num_warps=num_warps, **options)
        path = os.path.join(a.ptx, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx")
        with open(path, "w") as f:
            f.write(k.asm["ptx"].replace(os.path.abspath(a.root) + os.sep, ""))
        print(name, "->", path, flush=True)

    masks = {"plain": dict(CAUSAL=False, WINDOW=False, SOFTCAP=False, left=0, right=0, tanh_scale=0.0),
             "causal": dict(CAUSAL=True, WINDOW=False, SOFTCAP=False, left=0, right=0, tanh_scale=0.0),
             "window": dict(CAUSAL=False, WINDOW=True, SOFTCAP=False, left=100, right=3, tanh_scale=0.0),
             "softcap": dict(CAUSAL=False, WINDOW=False, SOFTCAP=True, left=0, right=0, tanh_scale=0.01)}
    for d in (64, 128):
        cfg = forward_config(d, interpret=False)
        blocks = {k: v for k, v in cfg.items() if k.isupper()}
        t = torch.empty(2, 4, 256, d, dtype=torch.bfloat16)
        lse = torch.empty(8, 256, dtype=torch.float32)
        s = t.stride()
        for name, m in masks.items():
            args = dict(Q=t, K=t, V=t, O=t, LSE=lse, sqb=s[0], sqh=s[1], sqn=s[2], sqd=s[3], skb=s[0], skh=s[1],
                        skn=s[2], skd=s[3], svb=s[0], svh=s[1], svn=s[2], svd=s[3], sob=s[0], soh=s[1], son=s[2],
                        sod=s[3], H=4, N=256, Nk=256, D=d, DV=d, GROUP=1, scale_log2e=0.1 * LOG2E, BLOCK_D=d,
                        BLOCK_DV=d, **m, **blocks)
            write(f"tl fwd d{d} {name}", kernels_tl.attn_fwd, args, cfg["num_warps"], num_stages=cfg["num_stages"])
    # decode: one query a sequence, 8 q heads a kv head; merged (one split) and split
    q = torch.empty(2, 16, 1, 128, dtype=torch.bfloat16)
    kv = torch.empty(2, 2, 4096, 128, dtype=torch.bfloat16)
    part = torch.empty(64, dtype=torch.float32)
    sq, sk = q.stride(), kv.stride()
    for merged in (True, False):
        args = dict(Q=q, K=kv, V=kv, O=q, LSE=part, O_PART=part, LSE_PART=part, sqb=sq[0], sqh=sq[1], sqn=sq[2],
                    sqd=sq[3], skb=sk[0], skh=sk[1], skn=sk[2], skd=sk[3], svb=sk[0], svh=sk[1], svn=sk[2],
                    svd=sk[3], Hkv=2, N=1, Nk=4096, D=128, DV=128, GROUP=8, keys_per_split=512,
                    scale_log2e=0.1 * LOG2E, MERGED=merged, BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128,
                    BLOCK_DK=128, **masks["plain"])
        write(f"tl decode {'merged' if merged else 'split'}", decode_kernels.attn_fwd_split_keys, args, 4, num_stages=2)
    write("tl decode merge", decode_kernels.attn_merge_splits, dict(O=q, LSE=part, O_PART=part, LSE_PART=part,
                                                                    rows_total=32, D=128, splits=8, SPLITS=8,
                                                                    BLOCK_D=128), 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())

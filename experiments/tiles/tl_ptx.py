"""The tl attention forward and decode kernels (kernels_tl.attn_fwd, attn_fwd_split_keys) compiled for
sm_90a on the CPU, one PTX file a variant, to check that a change of their source left the emitted
code alone (as port_resources.py does for the Gluon kernels):

    python experiments/tiles/tl_ptx.py --root OLD --ptx /tmp/tl_old
    python experiments/tiles/tl_ptx.py --ptx /tmp/tl_new
    python experiments/tiles/ptx_compare.py /tmp/tl_old /tmp/tl_new

Variants: head dims 64 and 128 with configs.forward_config's blocks, no mask, causal, a window, and
a softcap; decode merged (one split) and split, and the merge of the splits; varlen's packed forward
(the same four masks at both head dims) and dQ kernel (D128), and the KV cache's split-key forward
(merged and split) and merge.
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
    # varlen's packed forward (its tl kernel: op.forward_kernels' arguments and block_config's Hopper blocks) and the
    # KV cache's split-key forward (op._DecodeLayout's options), which end with the same normalization
    try:
        from tilecore.ops.attention_kvcache import kernels_tl as kvcache_kernels
        from tilecore.ops.attention_varlen import kernels_tl as varlen_kernels
    except ModuleNotFoundError:
        return 0
    i32 = torch.empty(64, dtype=torch.int32)
    for d in (64, 128):
        x = torch.empty(4096, 16, d, dtype=torch.bfloat16)
        s = x.stride()
        lse = torch.empty(16, 4096, dtype=torch.float32)
        for name, (left, right, softcap) in {"plain": (0, 0, 0), "causal": (0, 1, 0), "window": (1, 1, 0),
                                             "softcap": (0, 0, 1)}.items():
            args = dict(Q=x, K=x, V=x, O=x, LSE=lse, CU_Q=i32, CU_K=i32, CU_BLOCKS=i32, sqt=s[0], sqh=s[1], sqd=s[2],
                        skt=s[0], skh=s[1], skd=s[2], svt=s[0], svh=s[1], svd=s[2], sot=s[0], soh=s[1], sod=s[2], B=4,
                        total_q=4096, D=d, DV=d, GROUP=1, scale=0.1, softcap=30.0 if softcap else 0.0,
                        left=100 if left else 4096, right=0 if right and not left else 3 if right else 4096,
                        LEFT=bool(left), RIGHT=bool(right), SOFTCAP=softcap, SEARCH_STEPS=2,
                        UNMASKED_MIDDLE=not softcap, BLOCK_M=64, BLOCK_N=64, BLOCK_D=d, BLOCK_DV=d)
            write(f"tl varlen fwd d{d} {name}", varlen_kernels.varlen_fwd, args, 4, num_stages=3)
            if d == 128:  # the dQ kernel (block_config's "dq": 64 x 64, 2 stages)
                dq_args = {k: v for k, v in args.items() if k not in ("O", "sot", "soh", "sod")}
                dq_args.update(DO=x, DELTA=lse, DQ=x, sdt=s[0], sdh=s[1], sdd=s[2], sgt=s[0], sgh=s[1], sgd=s[2])
                write(f"tl varlen dq d{d} {name}", varlen_kernels.varlen_bwd_dq, dq_args, 4, num_stages=2)
    q = torch.empty(2, 1, 16, 128, dtype=torch.bfloat16)
    cache = torch.empty(2, 4096, 2, 128, dtype=torch.bfloat16)
    sq, sk = q.stride(), cache.stride()
    for merged in (True, False):
        args = dict(Q=q, KC=cache, VC=cache, BLOCK_TABLE=i32, SEQLENS=i32, O=q, LSE=part, O_PART=part, LSE_PART=part,
                    sqb=sq[0], sqn=sq[1], sqh=sq[2], sqd=sq[3], skp=sk[0], sks=sk[1], skh=sk[2], skd=sk[3],
                    svp=sk[0], svs=sk[1], svh=sk[2], svd=sk[3], stb=0, stp=0, sob=sq[0], son=sq[1], soh=sq[2],
                    sod=sq[3], Hkv=2, Nq=1, Nnew=0, D=128, DV=128, GROUP=8, keys_per_split=512, scale=0.1,
                    softcap=0.0, left=0, right=0, PAGE=1, PAGED=False, LEFT=False, RIGHT=False, SOFTCAP=False,
                    MERGED=merged, BLOCK_M=16, BLOCK_N=128, BLOCK_D=128, BLOCK_DV=128)
        write(f"tl kvcache {'merged' if merged else 'split'}", kvcache_kernels.kvcache_fwd_split, args, 4,
              num_stages=3)
    write("tl kvcache merge", kvcache_kernels.kvcache_merge_splits,
          dict(O=q, LSE=part, O_PART=part, LSE_PART=part, rows_total=32, Hq=16, Nq=1, DV=128, splits=8, sob=sq[0],
               son=sq[1], soh=sq[2], sod=sq[3], SPLITS=8, BLOCK_DV=128), 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())

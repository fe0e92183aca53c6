"""PTX of the convenience path's tl quantizers as its calls launch them (B16 H16 N4096, bf16 in), compiled for sm_90a
on this GPU-less machine, one file a variant, for experiments/tiles/ptx_compare.py (a refactor of kernels_tl.py must
leave the shipped quantizers' code unchanged):

    python experiments/attention_fp8/ptx_quantizers.py --ptx /tmp/q_new [--root DIR]
    python experiments/tiles/ptx_compare.py /tmp/q_old /tmp/q_new

Variants: k's rotate_quantize (D128 and D64, one descale a block of 128 keys), q's (D128, per row: the pass the kernel
replaced at D64 / D128, still the tl path's), v's quantize_v_permuted per block (D128, D64), and, where the tree has
it, ``quantize_kv`` (k and v in one launch, D128 and D64: at 2b0f1d6b only, removed after session 37's call 1).
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--root", default=os.getcwd())
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.ops.attention_fp8 import configs, kernels_tl
    from tilecore.tiles.compile import compile_kernel, resources

    assert os.path.abspath(kernels_tl.__file__).startswith(os.path.abspath(a.root)), kernels_tl.__file__
    os.makedirs(a.ptx, exist_ok=True)
    B, H, N = 16, 16, 4096
    f32 = torch.empty(8192)
    signs = torch.empty(256)
    variants = {}
    # the quantizers' explicit clamp as the convenience path passes it (session 40; absent in older trees)
    clamp = {"CLAMP": configs.QUANTIZE_CLAMP} if hasattr(configs, "QUANTIZE_CLAMP") else {}
    for D in (128, 64):
        x = torch.empty(B, H, N, D, dtype=torch.bfloat16)
        codes = torch.empty(B, H, N, D, dtype=torch.float8_e4m3fn)
        vt = torch.empty(B, H, D, N, dtype=torch.float8_e4m3fn)
        row_blocks, stages = (8, 2) if D >= 128 else (4, None)
        rq = dict(X=x, OUT=codes, DESCALE=f32, SIGNS=signs, sxb=x.stride(0), sxh=x.stride(1), sxn=x.stride(2),
                  sxd=x.stride(3), H=H, N=N, n_scales=N // 128, out_scale=D ** -0.5, ROTATE=True, UPCAST=False,
                  BLOCK_R=128, BLOCK_D=D, ROW_BLOCKS=row_blocks, **clamp)
        opts = dict(num_warps=4, **({"num_stages": stages} if stages else {}))
        variants[f"k_block_d{D}"] = (kernels_tl.rotate_quantize, dict(rq, SCALE=1), opts)
        if D == 128:
            variants[f"q_row_d{D}"] = (kernels_tl.rotate_quantize, dict(rq, SCALE=0), opts)
        variants[f"v_block_d{D}"] = (kernels_tl.quantize_v_permuted, dict(
            V=x, OUT=vt, DESCALE=f32, svb=x.stride(0), svh=x.stride(1), svn=x.stride(2), svd=x.stride(3), H=H, Nk=N,
            D=D, n_out=N, EMULATE_CAST=False, BLOCK_K=128, BLOCK_D=D, PER_BLOCK=True, n_scales=N // 128, **clamp),
            dict(num_warps=4))
        if hasattr(kernels_tl, "quantize_kv"):
            variants[f"kv_d{D}"] = (kernels_tl.quantize_kv, dict(
                K=x, K8=codes, KS=f32, SIGNS=signs, skb=x.stride(0), skh=x.stride(1), skn=x.stride(2), skd=x.stride(3),
                V=x, V8=vt, VS=f32, svb=x.stride(0), svh=x.stride(1), svn=x.stride(2), svd=x.stride(3), H=H, Nk=N,
                n_scales=N // 128, out_scale=D ** -0.5, n_out=N, k_groups=N // (128 * row_blocks),
                k_programs=B * H * N // (128 * row_blocks), UPCAST=False, BLOCK_R=128, BLOCK_D=D,
                ROW_BLOCKS=row_blocks), opts)
    for name, (kernel, args, opts) in variants.items():
        t0 = time.time()
        c = compile_kernel(kernel, args, **opts)
        with open(os.path.join(a.ptx, name + ".ptx"), "w") as f:
            f.write(c.asm["ptx"])
        print(f"{name}: {time.time() - t0:.0f} s, {resources(c)}", flush=True)


if __name__ == "__main__":
    main()

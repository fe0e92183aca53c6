"""PTX of the FP8 Hopper kernel as the shipped configs launch it (issue 30: a refactor of gluon_fp8.py must leave it
unchanged), compiled for sm_90a on this GPU-less machine, one file a variant, for experiments/tiles/ptx_compare.py:

    python experiments/attention_fp8/ptx_shipped.py --ptx /tmp/ptx_new [--root DIR] [--only d128,d64c]
    python experiments/tiles/ptx_compare.py /tmp/ptx_old /tmp/ptx_new

The options are the launch's own (launch.gluon_options from configs.gluon_config, or for q rotated in the kernel
launch.rotated_q_config where the tree has it; the tree before gluon_options, e.g. 741bc3b,
needs this script as of 478e51c, which read launch._GluonLayout), so the variants are the ones a
call reaches: D 128 and 64, causal or not, with the three descale forms the op takes (per head; q per row with k per
128-key block, the convenience path's; q and k per row). ``--root``: the tree to import (an old commit's archive).
"""
import argparse
import os
import sys
import time

VARIANTS = {  # name -> (D, causal, q descales per row, k descales: "head", "block" (per 128 keys) or "row"[, v per block])
    "d128": (128, False, False, "head"), "d128c": (128, True, False, "head"), "d64": (64, False, False, "head"),
    "d64c": (64, True, False, "head"), "d128c_rowblock": (128, True, True, "block"), "d64_rowrow": (64, False, True, "row"),
    # session 34: v's descales per block of 128 keys (the convenience path's v_scales="block"; not in older trees)
    "d128c_vblock": (128, True, True, "block", True), "d64c_vblock": (64, True, True, "block", True),
    # session 35: q rotated and quantized in the kernel (the convenience path's at D64 / D128; not in older trees)
    "d128c_qrot": (128, True, True, "block", True, True), "d64_qrot": (64, False, True, "block", True, True),
    # session 36: q's codes in registers (Q_REG, the convenience path's at D128; not in trees before it)
    "d128c_qreg": (128, True, True, "block", True, True, True), "d128_qreg": (128, False, True, "block", True, True, True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.ops.attention_fp8 import configs, gluon_fp8, launch
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    assert os.path.abspath(gluon_fp8.__file__).startswith(os.path.abspath(a.root)), gluon_fp8.__file__
    os.makedirs(a.ptx, exist_ok=True)
    names = a.only.split(",") if a.only else list(VARIANTS)
    for name in names:
        D, causal, q_row, k_form, *rest = VARIANTS[name]
        v_block = bool(rest and rest[0])
        q_rotate = bool(len(rest) > 1 and rest[1])
        q_reg = bool(len(rest) > 2 and rest[2])
        t0 = time.time()
        cfg = configs.gluon_config(D, causal)
        if q_rotate and hasattr(launch, "rotated_q_config"):  # the convenience path's (hide_first_key, mask32)
            cfg = launch.rotated_q_config(D, causal)
        N = Nk = 1000
        f8 = torch.float8_e4m3fn
        q = torch.empty(2, 4, N, D, dtype=torch.bfloat16 if q_rotate else f8)
        k = torch.empty(2, 2, Nk, D, dtype=f8)
        vt = torch.empty(2, 2, D, 1024, dtype=f8)
        o = torch.empty(2, 4, N, D, dtype=torch.bfloat16)
        f32 = torch.empty(8192)
        k_per_row = k_form != "head"
        k_n, k_rows = (-(-Nk // 128), 128) if k_form == "block" else (Nk, 1) if k_form == "row" else (1, 1)
        q_n, q_rows = (N, 1) if q_row else (1, 1)
        opts = launch.gluon_options(q, k, cfg, causal, q_row, k_per_row, k_n, k_rows, *([True] if v_block else []),
                                    **({"q_rotate": True} if q_rotate else {}), **({"q_reg": True} if q_reg else {}))
        bm, bn = cfg["block_m"], cfg["block_n"]
        args = dict(q_desc=gluon_descriptor(q, [1, 1, bm, D]), k_desc=gluon_descriptor(k, [1, 1, bn, D]),
                    vt_desc=gluon_descriptor(vt, [1, 1, D, bn]), o_desc=gluon_descriptor(o, [1, 1, bm, D]),
                    lse_ptr=f32, q_scales=f32, k_scales=f32, v_scales=f32, H=4, N=N, Nk=Nk, GROUP=2, scale_log2e=0.1,
                    q_n_scales=q_n, q_rows_per_scale=q_rows, k_n_scales=k_n, k_rows_per_scale=k_rows, num_bh=8,
                    head_group=4, schedule=None)
        if "v_n_scales" in gluon_fp8.attention_fp8_fwd_kernel.arg_names:  # (session 34's argument)
            args["v_n_scales"] = -(-Nk // 128) if v_block else 1
        if q_rotate:
            args["signs"] = f32
        num_warps = opts.pop("num_warps")
        args.update(opts)
        c = compile_kernel(gluon_fp8.attention_fp8_fwd_kernel, args, num_warps=num_warps)
        with open(os.path.join(a.ptx, name + ".ptx"), "w") as f:
            f.write(c.asm["ptx"])
        r = resources(c)
        print(f"{name}: {time.time() - t0:.0f} s, {r}", flush=True)


if __name__ == "__main__":
    main()

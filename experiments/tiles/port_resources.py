"""Resources of every Gluon kernel the tiles template runs, compiled for sm_90a on the CPU: ptxas's
registers, spills and wgmma serialization, and counts of the PTX's wgmma / TMA / mbarrier
instructions. Run against two checkouts to compare a port with the code before it:

    python experiments/tiles/port_resources.py [--root DIR] [--json OUT] [--ptx DIR] [--quick]

A variant that fails to compile is reported with its error (the innermost message) and the run goes on;
the exit status is 1 when any failed. ``--ptx DIR`` writes each variant's PTX (its .file paths made
relative) to compare two trees; their .loc lines and .debug sections still differ (line numbers, the
tree's path as bytes), so compare without those. ``--quick`` compiles one variant of each kernel. It
is the triton compile matrix's driver (scripts/compile_matrix.sh): it compiles under whichever python,
and so triton, runs it.

Only kernel entry points are used, with the shipped configurations written out here, so the same
script compiles both trees. Parameters a kernel does not take are dropped (the v1 forward's
PINGPONG/OVERLAP, say), so a variant that a tree cannot build is reported as missing.
"""
import argparse
import json
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--json")
    ap.add_argument("--only", default="", help="the variants whose names hold one of these comma-separated strings")
    ap.add_argument("--ptx", help="write each variant's PTX into this folder")
    ap.add_argument("--quick", action="store_true", help="one variant of each kernel: " + ", ".join(QUICK))
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor as desc

    rows = []

    def one(name, kernel, args, num_warps):
        if (a.only and not any(o in name for o in a.only.split(","))) or (a.quick and name not in QUICK):
            return
        params = {p.name for p in kernel.params}
        if any(k not in params for k, v in args.items() if v is not None and k.isupper() and v not in (0, False, 1)
               and k in ("PINGPONG",)):
            rows.append(dict(kernel=name, missing=True))
            return
        record(name, lambda: compile_kernel(kernel, {n: v for n, v in args.items() if n in params},
                                            num_warps=num_warps))

    def record(name, build):
        """Compile by ``build()`` (a compiled kernel) and record its resources and PTX."""
        if (a.only and not any(o in name for o in a.only.split(","))) or (a.quick and name not in QUICK):
            return
        try:
            k = build()
            r = resources(k)
        except Exception as e:  # noqa: BLE001 (reported per variant: the matrix wants every failure)
            rows.append(dict(kernel=name, error=_innermost(e)))
            print(rows[-1], flush=True)
            return
        ptx = k.asm["ptx"]
        if a.ptx:
            os.makedirs(a.ptx, exist_ok=True)
            with open(os.path.join(a.ptx, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx"), "w") as f:
                f.write(ptx.replace(os.path.abspath(a.root) + os.sep, ""))
        rows.append(dict(kernel=name, registers=r.registers, spills=r.spill_stores + r.spill_loads, stack=r.stack,
                         shared=r.shared, serialized=r.wgmma_serialized,
                         wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
                         tma=len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                         mbarrier=len(re.findall(r"mbarrier\.", ptx)), ptx_lines=ptx.count("\n")))
        print(rows[-1], flush=True)

    # GEMM: the shipped configs (block, stages, consumers, epilogue bytes)
    from tilecore.ops.gemm.gluon_kernels import gemm_kernel
    bf16 = dict(block=(128, 256, 64), stages=3, group_m=8, num_warps=8, epilogue_bytes=65536, consumers=2)
    small_k = dict(bf16, block=(128, 128, 64), stages=4)
    fp8 = dict(block=(128, 256, 128), stages=3, group_m=8, num_warps=8, epilogue_bytes=65536, consumers=1)
    for name, dtype, cfg, b_t, scales, stream_k in (
            ("gemm bf16", torch.bfloat16, bf16, False, 0, False),
            ("gemm bf16 stream-K", torch.bfloat16, bf16, False, 0, True),
            ("gemm bf16 small K", torch.bfloat16, small_k, False, 0, False),
            ("gemm bf16 B^T", torch.bfloat16, bf16, True, 0, True),
            ("gemm bf16 fp32 out", torch.bfloat16, bf16, False, -1, True),
            ("gemm_fp8 row scales", torch.float8_e4m3fn, fp8, True, 4, True)):
        BM, BN, BK = cfg["block"]
        c = cfg["consumers"]
        x = torch.empty(256, 256, dtype=dtype)
        out = torch.empty(256, 256, dtype=torch.float32 if scales < 0 else torch.bfloat16 if scales else dtype)
        scales = max(scales, 0)
        f32 = torch.empty(256)
        args = dict(a_desc=desc(x, [BM, BK]), b_desc=desc(x, [BN, BK] if b_t else [BK, BN]),
                    c_desc=desc(out, [BM // c, min(BN, cfg["epilogue_bytes"] // (BM * out.element_size()))]),
                    M=256, N=256, K=256, bias_ptr=out if not scales else f32, scale_a_ptr=f32, scale_b_ptr=f32,
                    workspace=f32, flags=torch.empty(8, dtype=torch.int32), num_units=4, B_T=b_t, GROUP_M=8,
                    HAS_BIAS=not scales, SCALES=scales, STAGES=cfg["stages"], CONSUMERS=c, STREAM_K=stream_k)
        one(name, gemm_kernel, args, cfg["num_warps"] // c)

    # Hadamard: n = 16384 (4 stages) and 32768 (8 stages, lookahead 4), drawn rows
    from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_kernel
    for n, stages, lookahead in ((16384, 4, 0), (32768, 8, 4)):
        for dtype in (torch.bfloat16, torch.float16):
            x = torch.empty(64, n, dtype=dtype)
            S = n // 8192
            lines = lambda t, block: desc(t, block, shape=[64 * n // 64, 64], strides=[64, 1])
            h = torch.empty(192, 64, dtype=torch.bfloat16)  # H_64 as bf16 bits
            args = dict(x_desc=lines(x, [64, 64]), out_desc=lines(x, [64, 64]), staging_desc=lines(x, [64 * S, 64]),
                        h_desc=desc(h, [64, 64]), rows=64, scale=0.5, row_counter=torch.zeros(1, dtype=torch.int32),
                        S=S, STAGES=stages, LOOKAHEAD=lookahead)
            one(f"hadamard n={n} {str(dtype)[6:]}", hadamard_gluon_kernel, args, 4)

    # attention forward: the shipped configurations (gluon_forward_config's outcomes)
    from tilecore.ops.attention.gluon_kernels import attention_fwd_kernel
    fwd = [("d64", 64, False, dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2)),
           ("d64 causal", 64, True, dict(block_m=64, block_n=128, stages=3, consumers=2, q_buffers=2)),
           ("d128", 128, False, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2)),
           ("d128 causal", 128, True, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2)),
           ("d128 Q regs", 128, False, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2, q_regs=True)),
           ("d128 causal short", 128, True, dict(block_m=64, block_n=64, stages=3, consumers=2, q_buffers=2)),
           ("d64 carried causal", 64, True, dict(block_m=64, block_n=64, stages=3, consumers=2, q_buffers=2, carry=True)),
           ("d128 carried", 128, False, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2, carry=True)),
           ("d64 3 consumers", 64, False, dict(block_m=64, block_n=128, stages=3, consumers=3, q_buffers=1)),
           ("d64 3 consumers causal", 64, True, dict(block_m=64, block_n=128, stages=3, consumers=3, q_buffers=1)),
           ("d64 3 consumers q2", 64, False, dict(block_m=64, block_n=128, stages=3, consumers=3, q_buffers=2)),
           ("d64 3 consumers causal short", 64, True, dict(block_m=64, block_n=64, stages=3, consumers=3, q_buffers=2))]
    for name, d, causal, cfg in fwd:
        t = torch.empty(2, 4, 256, d, dtype=torch.bfloat16)
        head = lambda rows: desc(t, [1, 1, rows, d])
        args = dict(q_desc=head(cfg["block_m"]), k_desc=head(cfg["block_n"]), v_desc=head(cfg["block_n"]),
                    o_desc=head(cfg["block_m"]), lse_ptr=torch.empty(8, dtype=torch.float32), H=4, N=256, Nk=256,
                    GROUP=1, scale_log2e=0.1, num_bh=8, head_group=4,
                    schedule=torch.empty(8, dtype=torch.int32) if causal else None, left=0, right=0,
                    tanh_scale=0.0, CAUSAL=causal,
                    STAGES=cfg["stages"], OVERLAP=True, CONSUMERS=cfg["consumers"], PINGPONG=False,
                    Q_BUFFERS=cfg["q_buffers"], CARRY=cfg.get("carry", False), Q_REGS=cfg.get("q_regs", False),
                    WINDOW=False, SOFTCAP=False)
        one(f"attention fwd {name}", attention_fwd_kernel, args, 4)
    # MLA's forward (q/k 192 in three 64-column pieces, v 128; test_mla_gluon's arguments) and the rotary forward
    # (attention_rotary.gluon_forward: the forward's op wrapped, Q turned in the kernel; test_gluon_rotary's first and fourth variants)
    q192 = torch.empty(2, 2, 256, 192, dtype=torch.bfloat16)
    v128 = torch.empty(2, 2, 256, 128, dtype=torch.bfloat16)
    for causal in (False, True):
        bm, bn, stages = 64, 128, 2
        args = dict(q_desc=desc(q192, [1, 1, 2 * bm, 64]), k_desc=desc(q192, [1, 1, bn, 64]),
                    v_desc=desc(v128, [1, 1, bn, 128]), o_desc=desc(v128, [1, 1, bm, 64]),
                    lse_ptr=torch.empty(64, dtype=torch.float32), H=16, N=4096, Nk=4096, GROUP=1, scale_log2e=0.1,
                    num_bh=256, head_group=12, schedule=torch.empty(64, dtype=torch.int32) if causal else None, left=0,
                    right=0, tanh_scale=0.1, CAUSAL=causal, STAGES=stages, OVERLAP=True, CONSUMERS=2, PINGPONG=False,
                    Q_BUFFERS=1, CARRY=False, Q_REGS=False, WINDOW=False, SOFTCAP=0)
        one(f"attention fwd mla{' causal' if causal else ''}", attention_fwd_kernel, args, 4)
    try:  # tilecore.ops.attention_rotary since session 44 (issue 30's move); before it in attention's modules
        from tilecore.ops.attention_rotary.gluon_forward import attention_rotary_fwd_kernel, rows_at_a_time
    except (ModuleNotFoundError, ImportError):
        try:
            from tilecore.ops.attention.gluon_rotary import attention_rotary_fwd_kernel, rows_at_a_time
        except (ModuleNotFoundError, ImportError):
            attention_rotary_fwd_kernel = None
    if attention_rotary_fwd_kernel is not None:
        for d, causal, cfg, r, cos_dtype in ((128, False, dict(block_m=64, block_n=128, stages=2, q_regs=True), 64,
                                              torch.bfloat16),
                                             (64, True, dict(block_m=64, block_n=64, stages=3, carry=True), 16,
                                              torch.float32)):
            t = torch.empty(2, 4, 256, d, dtype=torch.bfloat16)
            cs = torch.empty(256, r, dtype=cos_dtype)
            args = dict(q_desc=desc(t, [1, 1, 64, d]), k_desc=desc(t, [1, 1, cfg["block_n"], d]),
                        v_desc=desc(t, [1, 1, cfg["block_n"], d]), o_desc=desc(t, [1, 1, 64, d]),
                        lse_ptr=torch.empty(8, dtype=torch.float32), cos_ptr=cs, sin_ptr=cs, cos_stride=r, sin_stride=r,
                        n_max=4096, H=4, N=256, Nk=256, GROUP=1, scale_log2e=0.1, num_bh=8, head_group=4,
                        schedule=torch.empty(8, dtype=torch.int32) if causal else None, left=0, right=0,
                        tanh_scale=0.0, qr_desc=None, CAUSAL=causal, STAGES=cfg["stages"], R=r, Q_BUFFERS=2,
                        CARRY=cfg.get("carry", False), INTERLEAVED=False, Q_REGS=cfg.get("q_regs", False), CONSUMERS=2,
                        TURN_ROWS=rows_at_a_time(r, False))
            one(f"attention fwd rotary d{d}{' causal carried' if causal else ' Q regs'}", attention_rotary_fwd_kernel,
                args, 4)
    # attention backward (dK/dV with its dQ modes) and the dq kernel: the shipped configurations
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    try:  # tilecore.ops.attention_backward since session 31 (issue 30's move); before it in attention's modules
        from tilecore.ops.attention_backward.gluon_backward import attention_bwd_kernel
        from tilecore.ops.attention_backward.gluon_dq import attention_dq_kernel
    except ModuleNotFoundError:
        from tilecore.ops.attention.gluon_backward import attention_bwd_kernel
        from tilecore.ops.attention.gluon_dq import attention_dq_kernel
    modes = {"gluon": 0, "fused": 1, "lagged": 3, "warpgroup": 4}
    bwd = [("d64 warpgroup", 64, False, 1, dict(dq="warpgroup", kv_regs=True)),
           ("d64 warpgroup causal", 64, True, 1, dict(dq="warpgroup", kv_regs=True)),
           ("d128 lagged", 128, False, 1, dict(dq="lagged")),
           ("d128 fused causal", 128, True, 1, dict(dq="fused")),
           ("d64 warpgroup causal gqa", 64, True, 4, dict(dq="warpgroup", kv_regs=True)),
           ("d128 fused causal gqa", 128, True, 4, dict(dq="fused")),
           ("d64 no dq causal", 64, True, 1, dict(dq="gluon")),
           ("d128 fused causal softcap", 128, True, 1, dict(dq="fused", softcap=3))]  # (launch: tanh.approx as 3)
    for name, d, causal, group, cfg in bwd:
        bm, bn = 64, 64
        t = torch.empty(2, 2, 256, d, dtype=torch.bfloat16)
        head = lambda rows: desc(t, [1, 1, rows, d])
        stats = torch.empty(4, 2, 256, dtype=torch.float32)
        stats_desc = TensorDescriptor(stats, list(stats.shape), list(stats.stride()), [1, 2, bm],
                                      gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3))
        dq_sum = torch.empty(2, 2, 256, d, dtype=torch.float32)
        box = [1, 1, bm, 32] if cfg["dq"] == "warpgroup" else [1, 1, bm, d // 2]
        args = dict(q_desc=head(bm), k_desc=head(2 * bn), v_desc=head(2 * bn), do_desc=head(bm), dk_desc=head(bn),
                    dv_desc=head(bn), stats_desc=stats_desc, dq_desc=desc(dq_sum, box), H=16, N=4096, Nk=4096,
                    GROUP=group, scale=0.1, scale_log2e=0.1, num_bhk=256, head_group=8,
                    schedule=torch.empty(64, dtype=torch.int32) if causal and not cfg.get("drawn") else None,
                    left=0, right=0,
                    tanh_scale=0.01 if cfg.get("softcap") else 0.0, CAUSAL=causal, STAGES=2, DQ=modes[cfg["dq"]],
                    KV_REGS=cfg.get("kv_regs", False), WINDOW=False, SOFTCAP=cfg.get("softcap", 0))
        one(f"attention bwd {name}", attention_bwd_kernel, args, 4)
    for d, bn, stages, softcap in ((64, 128, 3, 0), (128, 64, 4, 0), (128, 64, 4, 3)):
        for causal in (False, True) if not softcap else (True,):
            bm = 64
            t = torch.empty(2, 2, 256, d, dtype=torch.bfloat16)
            head = lambda rows: desc(t, [1, 1, rows, d])
            f32 = torch.empty(64, dtype=torch.float32)
            args = dict(q_desc=head(2 * bm), k_desc=head(bn), v_desc=head(bn), do_desc=head(2 * bm), dq_desc=head(bm),
                        qdo_desc=head(2 * bm), lse_ptr=f32, delta_ptr=f32, H=16, N=4096, Nk=4096, GROUP=1, scale=0.1,
                        scale_log2e=0.1, num_bh=256, head_group=12,
                        schedule=torch.empty(64, dtype=torch.int32) if causal else None, left=0, right=0,
                        tanh_scale=0.01 if softcap else 0.0, CAUSAL=causal, STAGES=stages, WINDOW=False,
                        SOFTCAP=softcap)
            one(f"attention dq d{d}{' causal' if causal else ''}{' softcap' if softcap else ''}", attention_dq_kernel,
                args, 4)
    # a window and a softcap (tanh.approx) on the D64 backward and dq: the options' code paths
    bm, bn = 64, 64
    t = torch.empty(2, 2, 256, 64, dtype=torch.bfloat16)
    head = lambda rows: desc(t, [1, 1, rows, 64])
    stats = torch.empty(4, 2, 256, dtype=torch.float32)
    stats_desc = TensorDescriptor(stats, list(stats.shape), list(stats.stride()), [1, 2, bm],
                                  gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3))
    dq_sum = torch.empty(2, 2, 256, 64, dtype=torch.float32)
    f32 = torch.empty(64, dtype=torch.float32)
    window = dict(H=16, N=4096, Nk=4096, GROUP=1, scale=0.1, scale_log2e=2.0, head_group=8, schedule=None, left=100,
                  right=3, tanh_scale=0.01, CAUSAL=False, WINDOW=True, SOFTCAP=3)
    one("attention bwd d64 warpgroup window softcap", attention_bwd_kernel,
        dict(window, q_desc=head(bm), k_desc=head(2 * bn), v_desc=head(2 * bn), do_desc=head(bm), dk_desc=head(bn),
             dv_desc=head(bn), stats_desc=stats_desc, dq_desc=desc(dq_sum, [1, 1, bm, 32]), num_bhk=256,
             tile_counter=None, STAGES=2, DQ=4, KV_REGS=True), 4)
    one("attention dq d64 window softcap", attention_dq_kernel,
        dict(window, q_desc=head(2 * bm), k_desc=head(128), v_desc=head(128), do_desc=head(2 * bm), dq_desc=head(bm),
             qdo_desc=head(2 * bm), lse_ptr=f32, delta_ptr=f32, num_bh=256, STAGES=3), 4)
    # MLA's 192 / 128 (configs.GLUON_BACKWARD_DV, GLUON_DQ_DV): every box 64 columns wide
    try:  # tilecore.ops.attention_mla since session 31 (issue 30's move); before it in attention's modules
        from tilecore.ops.attention_mla.gluon_backward import attention_bwd_mla_kernel
        from tilecore.ops.attention_mla.gluon_dq import attention_dq_mla_kernel
    except ModuleNotFoundError:
        from tilecore.ops.attention.gluon_backward import attention_bwd_mla_kernel
        from tilecore.ops.attention.gluon_dq import attention_dq_mla_kernel
    piece = lambda x, rows: desc(x, [1, 1, rows, 64])
    for causal in (False, True):
        mla = dict(H=16, N=4096, Nk=4096, GROUP=1, scale=0.1, scale_log2e=0.1, head_group=8,
                   schedule=torch.empty(64, dtype=torch.int32) if causal else None, left=0, right=0, tanh_scale=0.0,
                   CAUSAL=causal, STAGES=3, WINDOW=False, SOFTCAP=0)
        # dK/dV at 64 query rows a step (AttentionBackwardPieces.compute, configs.GLUON_BACKWARD_DV's block_m: the
        # shipped kernel; the 32-row step was removed in session 35)
        for bm in (64,):
            one(f"attention bwd mla{' rows64' if bm == 64 else ''}{' causal' if causal else ''}",
                attention_bwd_mla_kernel,
                dict(mla, q_desc=piece(q192, bm), k_desc=piece(q192, 128), v_desc=piece(v128, 128),
                     do_desc=piece(v128, bm), dk_desc=piece(q192, 64), dv_desc=piece(v128, 64),
                     stats_desc=TensorDescriptor(stats, list(stats.shape), list(stats.stride()), [1, 2, bm],
                                                 gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32,
                                                                      rank=3)),
                     num_bhk=256), 4)
        one(f"attention dq mla{' causal' if causal else ''}", attention_dq_mla_kernel,
            dict(mla, q_desc=piece(q192, 128), k_desc=piece(q192, 64), v_desc=piece(v128, 64), do_desc=piece(v128, 128),
                 dq_desc=piece(q192, 64), lse_ptr=f32, delta_ptr=f32, num_bh=256), 4)
    # varlen (packed sequences): the forward, the dK/dV kernel with its config's dQ and the dq kernel, each by the
    # package's own compile helper (op.py's arguments); the shipped configs, a softcap, a window, grouped heads
    try:
        from tilecore.ops.attention_varlen import configs as varlen_configs
        from tilecore.ops.attention_varlen import gluon_backward as varlen_bwd
        from tilecore.ops.attention_varlen import gluon_forward as varlen_fwd
    except ModuleNotFoundError:
        varlen_fwd = None
    if varlen_fwd is not None:
        for d, causal, softcap, window, group in ((128, True, 0, False, 1), (128, False, 0, False, 1),
                                                   (64, True, 0, False, 1), (64, False, 0, False, 1),
                                                   (128, True, 2, False, 1), (128, False, 0, True, 1),
                                                   (128, True, 0, False, 4)):
            tag = f"d{d}{' causal' if causal else ''}{' softcap' if softcap else ''}{' window' if window else ''}" \
                  f"{' gqa' if group > 1 else ''}"
            if group == 1:
                record(f"attention varlen fwd {tag}", lambda: varlen_fwd.compiled_forward(d, causal, softcap,
                                                                                         window=window))
            dq_from = varlen_configs.varlen_gluon_backward_config(d, causal)["dq_from"]
            record(f"attention varlen bwd {dq_from} {tag}",
                   lambda: varlen_bwd.compiled_backward(d, causal, softcap, window=window, group=group))
            record(f"attention varlen dq {tag}",
                   lambda: varlen_bwd.compiled_dq(d, causal, softcap, window=window, group=group))
    # the MLA backward by roles (experiments/attention/mla_roles_kernel.py: AttentionBackward's step math on a struct
    # of its own), causal and windowed
    try:
        from experiments.attention import mla_roles_kernel
    except ModuleNotFoundError:
        mla_roles_kernel = None
    if mla_roles_kernel is not None:
        for causal, window in ((True, False), (False, True)):
            record(f"attention bwd mla roles{' causal' if causal else ''}{' window' if window else ''}",
                   lambda: mla_roles_kernel.compiled(causal, window))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    failed = [r["kernel"] for r in rows if "error" in r]
    import triton
    print(f"triton {triton.__version__}: {len(rows) - len(failed)} of {len(rows)} variants compiled"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed or not rows else 0


# --quick: the GEMM (stream-K: its partials' barriers), the Hadamard kernel, the forward and the backward
# (warpgroup dQ: the helper partition, TMA reductions), and the dq kernel, one configuration each.
QUICK = ("gemm bf16 stream-K", "hadamard n=16384 bfloat16", "attention fwd d64 causal",
         "attention bwd d64 warpgroup causal", "attention dq d64 causal")


def _innermost(e: BaseException) -> str:
    """The message of the exception at the bottom of a chain (a CompilationError wraps the
    AttributeError or TypeError that says what the triton version lacks), on one line."""
    while e.__cause__ is not None:
        e = e.__cause__
    msg = " ".join(str(e).split())
    if type(e).__name__ == "CompilationError" and "\n" in str(e):  # the source excerpt: keep the last lines
        msg = " ".join(str(e).strip().splitlines()[-1].split())
    return f"{type(e).__name__}: {msg}"[:400]


if __name__ == "__main__":
    sys.exit(main())

"""``python -m tilecore.ops.fft_conv.report``: compile the FFT convolution's kernels for sm_90a (no GPU
needed) at every configuration the plans ship and the GPU check times (the pair kernel) and at every N
of the float32 kernel; print registers, spills and shared memory (tilecore.tiles.report's table).
``--shipped``: only the configurations plan.py picks."""
from __future__ import annotations

import sys


def pair_variant(n1: int, n2: int, pairs: int, warps: int, loop: int = 1, stages: int = 1,
                 hoist: bool = False) -> tuple[str, object, dict, int, bool]:
    import torch

    from tilecore.ops.fft_conv import kernels_pair

    n = n1 * n2 // 2
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(U=t, K=f32, Y=t, F1RE=f16, F1IM=f16, F2RE=f16, F2IM=f16, TWRE=f32, TWIM=f32, batch=16, heads=768,
                stride_ub=768 * n, stride_uh=n, stride_yb=768 * n, stride_yh=n, stride_kh=2 * (n + 1),
                N1=n1, N2=n2, PAIRS=pairs, CONJ=False, LOOP=loop, STAGES=stages, HOIST=hoist)
    if pairs == 0:  # the one-pair, transpose-free kernel
        del args["PAIRS"], args["LOOP"], args["STAGES"], args["HOIST"]
        return (f"fft_conv pair N{n} ({n1}x{n2}, one pair untransposed, {warps} warps)",
                kernels_pair.fft_conv_pair1_kernel, args, warps, False)
    looped = (f", loop {loop}" + (f" ({stages} stages)" if stages > 1 else "") + (" hoisted" if hoist else "")
              if loop > 1 else "")
    return (f"fft_conv pair N{n} ({n1}x{n2}, {pairs} pairs{looped}, {warps} warps)", kernels_pair.fft_conv_pair_kernel,
            args, warps, False)


def mono_variant(a: int, b: int, c: int, loop: int, warps: int, permute: bool = False,
                 kfull: bool = False) -> tuple[str, object, dict, int, bool]:
    """The one-pass three-factor kernel (kernels_mono.fft_conv_mono_kernel) at one configuration."""
    import torch

    from tilecore.ops.fft_conv import kernels_mono

    n = a * b * c // 2
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(U=t, K=f32, Y=t, FARE=f16, FAIM=f16, FBRE=f16, FBIM=f16, FCRE=f16, FCIM=f16, T1RE=f32, T1IM=f32,
                T2RE=f32, T2IM=f32, T3RE=f32, T3IM=f32, batch=16, heads=768, stride_ub=768 * n, stride_uh=n,
                stride_yb=768 * n, stride_yh=n, stride_kh=2 * (n + 1), A=a, B=b, C=c, CONJ=False, LOOP=loop,
                PERMUTE=permute, KFULL=kfull)
    extra = (", permute" if permute else "") + (", kfull" if kfull else "")
    return (f"fft_conv mono N{n} ({a}x{b}x{c}, loop {loop}{extra}, {warps} warps)", kernels_mono.fft_conv_mono_kernel,
            args, warps, False)


def gluon_variant(a: int, b: int, per_sm: int = 0, async_mma: bool = False, tma: bool = False,
                  chunk: int = 0, rfft: bool = False, warpgroups: int = 1,
                  warps: int = 4, tw_sfu: bool = False, contig: bool = False,
                  kpre: int = 0, yalias: bool = False, lean: int = 0,
                  maxnreg: int = 0) -> tuple[str, object, dict, int, bool]:
    """The one-pass kernel in Gluon (gluon_onepass.fft_conv_gluon_onepass_kernel) at one configuration
    (per_sm: the grid only, not the compile; ``maxnreg`` is a compile option, which this tuple cannot carry:
    named only, the callers that compile pass it, gluon_options)."""
    import torch

    from tilecore.ops.fft_conv import gluon_onepass
    from tilecore.ops.fft_conv.launch import gluon_descriptors

    n = a * b // 2
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(U=t, K=f16 if rfft == 3 else f32, Y=t, FARE=f16, FAIM=f16, FBRE=f16, FBIM=f16, TFRE=f32, TFIM=f32,
                batch=16, heads=768,
                stride_ub=768 * n, stride_uh=n, stride_yb=768 * n, stride_yh=n, stride_kh=4 * n, A=a, B=b,
                ASYNC=async_mma, TMA=tma, RFFT=rfft, CONJ=False, TW_SFU=tw_sfu,
                CONTIG=contig, KPRE=kpre, LEAN=lean)
    if tma:
        rows = torch.empty(2, 1, n, dtype=torch.bfloat16)  # (the descriptors' type is what compiles)
        args["u_desc"], args["y_desc"] = gluon_descriptors(rows, rows, a, b)
    extra = (", async" if async_mma else "") + (", TMA" if tma else "") + (", rfft" if rfft else "") + (
        " float16" if rfft == 3 else "") + (", twiddles computed" if tw_sfu else "") + (
        ", contiguous walk" if contig else "") + (
        f", spectrum prefetch {kpre}" if kpre else "") + (", y in u's ring" if yalias else "") + (
        f", lean {lean}" if lean else "") + (f", maxnreg {maxnreg}" if maxnreg else "")
    if chunk:
        del args["ASYNC"]
        args.update(CHUNK=chunk, WARPGROUPS=warpgroups, WORKER_REGS=248, YALIAS=yalias)
        return (f"fft_conv gluon N{n} ({a}x{b}, chunks of {chunk}{extra.replace(', async', '')}, {4 * warpgroups} warps)",
                gluon_onepass.fft_conv_gluon_chunked_kernel, args, 4, True)
    return (f"fft_conv gluon N{n} ({a}x{b}{extra}, {warps} warps)",
            gluon_onepass.fft_conv_gluon_onepass_kernel, args, warps, True)


def gluon_options(config: tuple) -> dict:
    """The compile options of a configs.GLUON_ONEPASS tuple beyond gluon_variant's (its 15th element, maxnreg)."""
    return {"maxnreg": config[14]} if len(config) > 14 and config[14] else {}


def dk_variant(n1: int, n2: int, loop: int, warps: int) -> tuple[str, object, dict, int, bool]:
    """The filter-gradient kernel (kernels_pair.fft_conv_dk_pair_kernel) at one configuration."""
    import torch

    from tilecore.ops.fft_conv import kernels_pair

    n = n1 * n2 // 2
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(U=t, DY=t, P=f32, F1RE=f16, F1IM=f16, F2RE=f16, F2IM=f16, TWRE=f32, TWIM=f32, batch=16, heads=768,
                stride_ub=768 * n, stride_uh=n, stride_db=768 * n, stride_dh=n, N1=n1, N2=n2, LOOP=loop)
    return (f"fft_conv dk N{n} ({n1}x{n2}, loop {loop}, {warps} warps)", kernels_pair.fft_conv_dk_pair_kernel, args,
            warps, False)


def long_variants(n1: int, n2: int, bn: int, bk1: int, kc: int, warps: int, rows_warps: int,
                  gauss: bool = False) -> list:
    """The three passes of the long form at one configuration."""
    import torch

    from tilecore.ops.fft_conv import kernels_long as kl

    n = n1 * n2 // 2
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    name = f"fft_conv long N{n} ({n1}x{n2}"
    columns = dict(U=t, A=f16, SCALE=f32, F1RE=f16, F1IM=f16, TWRE=f32, TWIM=f32, batch=16, stride_ub=768 * n,
                   stride_uh=n, N1=n1, N2=n2, BN=bn, KC=kc, CH=min(n, 1024), GAUSS=gauss)
    rows = dict(A=f16, RSCALE=f32, K=f32, F2RE=f16, F2IM=f16, TWRE=f32, TWIM=f32, batch=16, stride_kh=2 * (n + 1),
                N1=n1, N2=n2, BK1=bk1, CONJ=False, GAUSS=gauss)
    inverse = dict(A=f16, RSCALE=f32, SCALE=f32, Y=t, F1RE=f16, F1IM=f16, batch=16, stride_yb=768 * n, stride_yh=n,
                   N1=n1, N2=n2, BN=bn, KC=kc, GAUSS=gauss)
    name += ", Gauss" if gauss else ""
    return [(f"{name}, pass 1: BN {bn}, KC {kc}, {warps} warps)", kl.long_columns_kernel, columns, warps, False),
            (f"{name}, pass 2: BK1 {bk1}, {rows_warps} warps)", kl.long_rows_kernel, rows, rows_warps, False),
            (f"{name}, pass 3: BN {bn}, KC {kc}, {warps} warps)", kl.long_inverse_columns_kernel, inverse, warps,
             False)]


def order3_variant(n: int, per_sm: int = 2, warpgroups: int = 1, rfft: int = 3,
                   stack: bool = False, kfull: bool = False) -> tuple[str, object, dict, int, bool]:
    """The order-3 one-pass Gluon kernel (gluon_order3.fft_conv_gluon_order3_kernel) at a configs.GLUON_ORDER3
    tuple (per_sm: the grid only, not the compile; warpgroups 2: two a pair)."""
    import torch

    from tilecore.ops.fft_conv import gluon_order3

    a, b, _ = gluon_order3.factors(n)
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(U=t, K=f16, Y=t, F16RE=f16, F16IM=f16, F2RE=f16, F2IM=f16, FBRE=f16, FBIM=f16, T1RE=f32, T1IM=f32,
                batch=16, heads=768, stride_ub=768 * n, stride_uh=n, stride_yb=768 * n, stride_yh=n, stride_kh=2 * (n + 1),
                KS=None, A=a, B=b)
    extra = "float16 bins" if rfft == 3 else "bins over each channel's scale"
    if warpgroups != 1:
        args.update(WARPGROUPS=warpgroups, WORKER_REGS=gluon_order3.WORKER_REGS)
        extra += ", two warpgroups a pair"
    if rfft == 4:
        args.update(KS=f32, KSCALE=True)
    if stack:
        args.update(STACK=True)
        extra += ", 1a / 1'a four columns a product"
    if kfull:
        args.update(KFULL=True, stride_kh=4 * n)
        extra += ", laid-out bins"
    return (f"fft_conv gluon order3 N{n} ({a}x{b}, {extra}, {4 * warpgroups} warps)",
            gluon_order3.fft_conv_gluon_order3_kernel, args, 4, True)


def pair_variants(shipped_only: bool = False) -> list:
    from tilecore.ops.fft_conv import configs
    from tilecore.ops.fft_conv.plan import plan_of_config

    seen, out = set(), []
    for n, config in configs.PAIR_CONFIGS.items():
        seen.add(config)
        out.append(pair_variant(*config))
    for n, config in configs.LONG_CONFIGS.items():
        seen.add(config)
        out += long_variants(*config)
    for n, config in configs.DK_CONFIGS.items():
        out.append(dk_variant(*config))
    for n, config in configs.DK_GLUON.items():
        out.append(gluon_dk_variant(*config))
    for n, config in configs.MONO_CONFIGS.items():
        out.append(mono_variant(*config))
    for n, config in configs.GLUON_ONEPASS.items():
        out.append(gluon_variant(*config))
    for n, config in configs.GLUON_ORDER3.items():
        out.append(order3_variant(n, *config))
    for n, config in configs.GLUON_ONEPASS_HALF.items():  # (a float16 spectrum's tuples: RFFT 3)
        out.append(gluon_variant(*config))
    for n, config in configs.GLUON_ORDER3_HALF.items():
        out.append(order3_variant(n, *config))
    if not shipped_only:
        for n, candidates in configs.GLUON_ONEPASS_HALF_CANDIDATES.items():
            out += [gluon_variant(*c) for c in candidates if c != configs.GLUON_ONEPASS_HALF.get(n)]
        for candidates in configs.GLUON_ONEPASS_CANDIDATES.values():
            variants = {(c[0], c[1], 0) + tuple(c[3:]) for c in candidates if c not in configs.GLUON_ONEPASS.values()}
            out += [gluon_variant(*config) for config in sorted(variants)]
        for candidates in configs.MONO_CANDIDATES.values():
            out += [mono_variant(*config) for config in candidates if config not in configs.MONO_CONFIGS.values()]
        for candidates in configs.DK_CANDIDATES.values():
            out += [dk_variant(*config) for config in candidates if config not in configs.DK_CONFIGS.values()]
        for candidates in configs.DK_GLUON_CANDIDATES.values():
            out += [gluon_dk_variant(*config) for config in candidates if config not in configs.DK_GLUON.values()]
        for candidates in list(configs.PAIR_CANDIDATES.values()) + list(configs.LONG_CANDIDATES.values()):
            for config in candidates:
                if config not in seen:
                    seen.add(config)
                    out += ([pair_variant(*config)] if plan_of_config(config).path == "pair"
                            else long_variants(*config))
    return out


def fft_conv_variants() -> list[tuple[str, object, dict, int, bool]]:
    import torch

    from tilecore.ops.fft_conv import configs, kernels

    t = torch.empty(64, dtype=torch.bfloat16)
    f32 = torch.empty(64, dtype=torch.float32)
    out = []
    for n, (n1, n2) in configs.TL_FACTORS.items():  # (what the plans ship; 2048's 64 x 64 spills)
        args = dict(U=t, KRE=f32, KIM=f32, Y=t, F1RE=f32, F1IM=f32, F2RE=f32, F2IM=f32, TWRE=f32, TWIM=f32,
                    heads=768, stride_ub=768 * n, stride_uh=n, stride_yb=768 * n, stride_yh=n, stride_kh=n1 * n2,
                    N1=n1, N2=n2, PRECISION=configs.TL_PRECISION)
        out.append((f"fft_conv N{n} ({n1}x{n2})", kernels.fft_conv_kernel, args, configs.TL_WARPS[n], False))
    return out


def main(argv=None) -> int:
    from tilecore.tiles import report

    argv = list(sys.argv[1:] if argv is None else argv)
    shipped = "--shipped" in argv
    if shipped:
        argv.remove("--shipped")
    return report.main(lambda: pair_variants(shipped) + ([] if shipped else fft_conv_variants()), argv,
                       prog="python -m tilecore.ops.fft_conv.report", description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())


def gluon_dk_variant(a: int, b: int, loop: int, xsmem: bool = False, tw_sfu: bool = True) -> tuple[str, object, dict, int,
                                                                                                    bool]:
    """The filter-gradient kernel on the Gluon one-pass kernel's forward stages (gluon_onepass.fft_conv_gluon_dk_kernel)
    at one configuration (N = a b / 2)."""
    import torch

    from tilecore.ops.fft_conv import gluon_onepass

    n = a * b // 2
    t = torch.empty(64, dtype=torch.bfloat16)
    f16 = torch.empty(64, dtype=torch.float16)
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(U=t, DY=t, P=f32, FARE=f16, FAIM=f16, FBRE=f16, FBIM=f16, TFRE=f32, TFIM=f32, batch=16, heads=768,
                stride_ub=768 * n, stride_uh=n, stride_db=768 * n, stride_dh=n, A=a, B=b, LOOP=loop, TW_SFU=tw_sfu,
                XSMEM=xsmem)
    return (f"fft_conv gluon dk N{n} ({a}x{b}, loop {loop}{', twiddles computed' if tw_sfu else ''}"
            f"{', u parked in shared memory' if xsmem else ''}, 4 warps)",
            gluon_onepass.fft_conv_gluon_dk_kernel, args, 4, True)

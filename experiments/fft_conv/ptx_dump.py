"""Write the PTX of fft_conv's Gluon one-pass kernels (gluon_onepass.py) at every shipped tuple of
configs.GLUON_ONEPASS and every candidate, for the convolution and the correlation (CONJ), compiled for
sm_90a on the CPU: one file a variant, to compare two trees with experiments/tiles/ptx_compare.py (a
refactor that leaves the PTX identical changed nothing the GPU runs).

    python experiments/fft_conv/ptx_dump.py --root OLD_TREE /tmp/ptx_old
    python experiments/fft_conv/ptx_dump.py /tmp/ptx_new
    python experiments/tiles/ptx_compare.py /tmp/ptx_old /tmp/ptx_new

``--root`` imports tilecore from that tree (default: this one); ``--shipped`` only the shipped tuples. Also the
filter-gradient kernel (fft_conv_gluon_dk_kernel) at configs.DK_GLUON's tuples and (without ``--shipped``) its
candidates, where the tree has it (session 33); the order-3 kernel (gluon_order3.py) at configs.GLUON_ORDER3 and its
candidates (session 34); the float16-spectrum tables GLUON_ONEPASS_HALF / GLUON_ORDER3_HALF with the shipped ones
(session 38).
"""
import argparse
import os
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--shipped", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    os.environ.pop("TRITON_INTERPRET", None)
    from tilecore.ops.fft_conv import configs
    from tilecore.ops.fft_conv.report import gluon_variant
    try:
        from tilecore.ops.fft_conv.report import gluon_options
    except ImportError:  # (a tree before session 31's maxnreg)
        gluon_options = lambda config: {}  # noqa: E731
    from tilecore.tiles.compile import compile_kernel

    tuples = list(configs.GLUON_ONEPASS.values())
    tuples += [c for c in getattr(configs, "GLUON_ONEPASS_HALF", {}).values() if c not in tuples]  # (session 38)
    # and each shipped tuple without TMA (the pointer loads of u and y a call takes where u or y is not
    # describable)
    tuples += [c[:4] + (False,) + c[5:] for c in configs.GLUON_ONEPASS.values() if c[4]]
    if not a.shipped:
        tuples += [c for cs in configs.GLUON_ONEPASS_CANDIDATES.values() for c in cs if c not in tuples]
    os.makedirs(a.out, exist_ok=True)
    for config in tuples:
        for conj in (False, True):
            a_, b_, per_sm, *rest = config
            name, kernel, args, warps, _ = gluon_variant(a_, b_, 0, *rest)
            args["CONJ"] = conj and args.get("RFFT", False)
            if conj and not args["CONJ"]:
                continue  # (without RFFT the host conjugates: the same kernel)
            label = "x".join(str(int(c)) for c in config) + ("_conj" if conj else "")
            try:
                ptx = compile_kernel(kernel, args, num_warps=warps, **gluon_options(config)).asm["ptx"]
            except Exception as err:  # noqa: BLE001 (reported, the rest go on)
                print(f"{label}: {type(err).__name__}: {str(err)[-300:]}", flush=True)
                continue
            ptx = re.sub(r'\.file\s+(\d+)\s+"[^"]*/(tilecore/[^"]*)"', r'.file \1 "\2"', ptx)
            with open(os.path.join(a.out, f"fft_gluon_{label}.ptx"), "w") as f:
                f.write(ptx)
            print(f"{label}: {name}", flush=True)
    try:
        from tilecore.ops.fft_conv.report import gluon_dk_variant
    except ImportError:  # (a tree before session 32's dk kernel)
        return 0
    dks = list(configs.DK_GLUON.values())
    if not a.shipped:
        dks += [c for cs in configs.DK_GLUON_CANDIDATES.values() for c in cs if c not in dks]
    for config in dks:
        label = "dk_" + "x".join(str(int(c)) for c in config)
        name, kernel, args, warps, _ = gluon_dk_variant(*config)
        try:
            ptx = compile_kernel(kernel, args, num_warps=warps).asm["ptx"]
        except Exception as err:  # noqa: BLE001
            print(f"{label}: {type(err).__name__}: {str(err)[-300:]}", flush=True)
            continue
        ptx = re.sub(r'\.file\s+(\d+)\s+"[^"]*/(tilecore/[^"]*)"', r'.file \1 "\2"', ptx)
        with open(os.path.join(a.out, f"fft_gluon_{label}.ptx"), "w") as f:
            f.write(ptx)
        print(f"{label}: {name}", flush=True)
    try:  # the order-3 kernel (session 34), where the tree has it: shipped tuples and (without --shipped) candidates
        from tilecore.ops.fft_conv.report import order3_variant
    except ImportError:
        return 0
    order3 = [(n, c) for n, c in configs.GLUON_ORDER3.items()]
    order3 += [(n, c) for n, c in getattr(configs, "GLUON_ORDER3_HALF", {}).items()]  # (float16 bins: session 38)
    if not a.shipped:  # (a tree before session 41 lists candidates)
        order3 += [(n, c) for n, cs in getattr(configs, "GLUON_ORDER3_CANDIDATES", {}).items() for c in cs
                   if (n, c) not in order3]
    for n, config in order3:
        for conj in (False, True):
            label = f"order3_{n}_" + "x".join(str(int(c)) for c in config) + ("_conj" if conj else "")
            name, kernel, args, warps, _ = order3_variant(n, *config)
            args["CONJ"] = conj
            try:
                ptx = compile_kernel(kernel, args, num_warps=warps).asm["ptx"]
            except Exception as err:  # noqa: BLE001
                print(f"{label}: {type(err).__name__}: {str(err)[-300:]}", flush=True)
                continue
            ptx = re.sub(r'\.file\s+(\d+)\s+"[^"]*/(tilecore/[^"]*)"', r'.file \1 "\2"', ptx)
            with open(os.path.join(a.out, f"fft_gluon_{label}.ptx"), "w") as f:
                f.write(ptx)
            print(f"{label}: {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

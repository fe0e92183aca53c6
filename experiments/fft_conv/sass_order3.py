"""Where the order-3 kernel's instructions go, a pair at a time (issue 37, session 41): the shipped builds
(configs.GLUON_ORDER3 / _HALF) compiled for sm_90a on this machine, their SASS (nvdisasm) cut by its loops into the
pair's parts (before the chunk loop: the pair's scales and stage 1a; the chunk loop: 1b-1'b, once a chunk; after it:
the scales' ratios and 1'a) and counted by instruction class, the chunk loop's counts times its trips a pair. With
the H100's rates (one warp instruction a cycle a scheduler, the SFU's 16 lanes a cycle a multiprocessor, shared
memory 128 B a cycle, the tensor cores' 2048 dense float16 FMA a cycle) each class's cycles a pair against the
measured time (``--ms``: the launch's, B16 H768).

    python experiments/fft_conv/sass_order3.py [--n 8192,16384] [--ms 8192:1.132,16384:4.20] [--json OUT]
        [--stack 0|1] [--kfull 0|1]
"""
import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CLASSES = [  # (class, SASS opcodes by prefix)
    ("wgmma", ("HGMMA",)), ("wgmma sync", ("WARPGROUP", "WARPSYNC")), ("sfu", ("MUFU",)),
    ("shared ld", ("LDS", "LDSM")), ("shared st", ("STS", "STSM")), ("global ld", ("LDG",)), ("global st", ("STG",)),
    ("local (spill)", ("LDL", "STL")), ("barrier", ("BAR", "SYNCS", "MEMBAR", "FENCE", "DEPBAR")),
    ("shuffle", ("SHFL",)), ("fp32", ("FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "FCHK", "FMUL2")),
    ("convert", ("F2F", "F2FP", "I2F", "F2I", "HADD2", "HMUL2", "HFMA2", "PRMT")),
    ("int / address", ("IMAD", "IADD", "LOP", "SHF", "LEA", "ISETP", "SEL", "IABS", "SGXT", "IMNMX", "BMSK", "LOP3",
                       "UIADD", "ULOP", "USHF", "UMOV", "ULEA", "UIMAD", "USEL", "UISETP", "S2R", "S2UR", "R2UR",
                       "CS2R", "MOV", "R2P", "P2R", "PLOP3", "VOTE", "POPC", "FLO", "BREV")),
]


def sass_of(n, config):
    """(the build's name, its SASS with line information) for a configs.GLUON_ORDER3 tuple."""
    os.environ.pop("TRITON_INTERPRET", None)
    from experiments.tiles.ptx_compare import _tool
    from tilecore.ops.fft_conv.report import order3_variant
    from tilecore.tiles.compile import compile_kernel

    name, kernel, args, warps, _ = order3_variant(n, *config)
    compiled = compile_kernel(kernel, args, num_warps=warps)
    path = f"/tmp/sass_order3_{n}_{'x'.join(str(int(c)) for c in config)}.cubin"
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    return name, subprocess.run([_tool("nvdisasm"), "-c", path], check=True, capture_output=True, text=True).stdout


def instructions(sass):
    """[(line index, opcode, text)] and {label: line index}."""
    out, labels = [], {}
    for i, line in enumerate(sass.splitlines()):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(out)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)(.*)", line)
        if m:
            out.append((i, m.group(2), m.group(2) + m.group(3)))
    return out, labels


def loops(ins, labels):
    """[(first, last)] instruction ranges of the backward branches (loops), outermost first."""
    found = []
    for k, (_, op, text) in enumerate(ins):
        m = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", text)
        if op.startswith("BRA") and m and labels.get(m.group(1), k + 1) <= k:
            found.append((labels[m.group(1)], k))
    return sorted(found, key=lambda r: r[0] - r[1])


def classify(op):
    for name, prefixes in CLASSES:
        if op.startswith(prefixes):
            return name
    return "other"


def counts(ins):
    c = Counter(classify(op) for _, op, _ in ins)
    c["all"] = len(ins)
    c["hgmma 64x64"] = sum(1 for _, op, _ in ins if op.startswith("HGMMA.64x64"))
    c["hgmma small"] = sum(1 for _, op, _ in ins if op.startswith("HGMMA") and not op.startswith("HGMMA.64x64"))
    return c


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="8192,16384")
    ap.add_argument("--ms", default="8192:1.132,16384:4.20", help="N:ms of the launch at B16 H768 (the measured time)")
    ap.add_argument("--ghz", type=float, default=1.755, help="the H100's clock under load")
    ap.add_argument("--json")
    ap.add_argument("--stack", type=int, default=None, help="the shipped tuple with STACK 0 / 1 (8192: 1a / 1'a four "
                                                              "columns a2 a product, in the wgmmas' layouts)")
    ap.add_argument("--kfull", type=int, default=None, help="the shipped tuple with KFULL 0 / 1 (the bins laid out a "
                                                              "call as the chunks read them: 16-byte loads)")
    a = ap.parse_args()
    from tilecore.ops.fft_conv import configs, gluon_order3

    measured = {int(k): float(v) for k, v in (x.split(":") for x in a.ms.split(","))}
    report = {}
    for n in (int(x) for x in a.n.split(",")):
        config = configs.GLUON_ORDER3[n]
        if a.stack is not None:
            config = tuple(config)[:3] + (bool(a.stack),)
        if a.kfull is not None:  # (STACK as the tuple has it, False where it has none)
            config = tuple(config)[:3] + (bool(tuple(config)[3:4] == (True,)), bool(a.kfull))
        name, sass = sass_of(n, config)
        ins, labels = instructions(sass)
        found = loops(ins, labels)
        # the pair loops (one a warpgroup's walk: WARPGROUPS 2 has two partitions), each with its chunk loop inside
        outer = [r for r in found if r[1] - r[0] > 1000 and not any(o[0] <= r[0] and r[1] <= o[1] and o != r
                                                                      for o in found)]
        a2 = gluon_order3.factors(n)[2]
        kg = 64 // a2
        per_sm, warpgroups = config[0], config[1]
        trips = 16 // kg // warpgroups  # chunks a warpgroup a pair
        programs = per_sm * 132
        pairs = 768 * 8
        ms = measured.get(n)
        cycles = ms * 1e-3 * a.ghz * 1e9 * programs / pairs if ms else None  # a pair's cycles a program (wall)
        report[n] = {"build": name, "instructions": len(ins), "measured cycles a pair a program":
                     round(cycles) if cycles else None, "walks": []}
        for w, pair in enumerate(sorted(outer)):
            chunk = max((r for r in found if pair[0] < r[0] and r[1] < pair[1]), key=lambda r: r[1] - r[0])
            parts = {"before chunks (scales, 1a)": counts(ins[pair[0]:chunk[0]]),
                     "chunk (1b-1'b), once": counts(ins[chunk[0]:chunk[1] + 1]),
                     "after chunks (ratios, 1'a)": counts(ins[chunk[1] + 1:pair[1] + 1])}
            per_pair = Counter()
            for key, c in parts.items():
                for k, v in c.items():
                    per_pair[k] += v * (trips if key.startswith("chunk") else 1)
            # a warpgroup's pair: each warp issues these; 4 warps on 4 schedulers. Cycles a pair a warpgroup by the
            # issue slots, the SFU (16 lanes a SM: a warp's MUFU 8 cycles a scheduler), the tensor cores (dense
            # float16 at 2048 FMA a cycle a SM: a 64x64x16 HGMMA 32 cycles, a 64x16x16 8, a 64x8x16 4: ~6)
            issue = per_pair["all"]
            sfu = 8 * per_pair["sfu"]
            tensor = 32 * per_pair["hgmma 64x64"] + 6 * per_pair["hgmma small"]
            report[n]["walks"].append({"pair loop": pair, "chunk loop": chunk, "chunk trips": trips,
                                       "parts": {k: dict(v) for k, v in parts.items()},
                                       "per pair (a warp)": dict(per_pair),
                                       "cycles a pair a warpgroup": {"issue": issue, "sfu": sfu, "tensor": tensor}})
            print(f"\n{name}, walk {w}: {len(ins)} SASS instructions; chunk loop {chunk[1] - chunk[0] + 1} x {trips} "
                  f"a pair")
            cols = ["all", "wgmma", "sfu", "shared ld", "shared st", "global ld", "global st", "local (spill)",
                    "barrier", "shuffle", "fp32", "convert", "int / address", "other"]
            print(f"{'part':30}" + "".join(f"{c[:9]:>10}" for c in cols))
            for key, c in list(parts.items()) + [("a pair (chunks x trips)", per_pair)]:
                print(f"{key[:30]:30}" + "".join(f"{c.get(x, 0):>10}" for x in cols))
            print(f"cycles a pair a warpgroup: issue >= {issue}, SFU {sfu}, tensor {tensor}"
                  + (f"; measured {cycles:.0f} a pair a program ({ms} ms, {programs} programs, {pairs} pairs)"
                     if cycles else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

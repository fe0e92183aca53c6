"""SASS of the FP8 Hopper kernel's steady step, per variant, compiled for sm_90a without a GPU (issue 34, session 29).

    python experiments/attention_fp8/sass_fp8.py [--d 128] [--causal] [--variants default,st2,q1] [--json P]
    (TRITON_INTERPRET unset; ~10-30 s a variant on 2 CPU cores)

For each variant (configs.gluon_config(D, causal) with the variant's overrides, per-head descales, the headline
call's specialization): registers, spills, shared memory, and the instruction counts by kind of
* the softmax block: the basic block with the most MUFU.EX2 (the unmasked steady step's softmax: max, FFMA, exp2,
  sum, P's float32 kept for the next step), and
* the steady step: the instructions from the S wgmma's first QGMMA (from zero) before that block to the block's end
  (the wgmma issue, P's e4m3 packing, the waits, the softmax, O *= alpha),
and the whole kernel. Kinds as experiments/hadamard/sass_quantize.py's, with FMNMX, FADD, FMUL, FFMA, F2FP, PRMT
counted alone (the softmax's own instructions).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

OPS = ("FMNMX", "FADD", "FMUL", "FFMA", "MUFU", "F2FP", "PRMT", "SHFL", "QGMMA", "FSETP", "FSEL", "WARPGROUP",
       "BAR", "LDS", "STS", "MOV", "IMAD", "LOP3", "ISETP", "SEL")
VARIANTS = {  # name -> configs.GLUON_FORWARD overrides (the kernel's variants of sessions 26-32 were removed by issue 30:
    # their code, and this table's entries for them, at commit 741bc3b)
    "default": {}, "st2": dict(stages=2), "q1": dict(q_buffers=1),
    "exp2": dict(p_linear=0),  # P by exp2, rounded (the default before session 33; p_linear 1 since)
    "vblock": dict(_v_block=True),  # v's descales per block of 128 keys (session 34; not a config key: the descale's shape)
    # q in bf16, rotated and quantized in the kernel (session 35, the convenience path's at D64 / D128: Q_ROTATE; with
    # --e2e, v per block as shipped); the tile's rotation (HGMMA, the amax, the codes' stores) is outside the step
    "qrot": dict(_q_rotate=True, _v_block=True), "qrot_q1": dict(_q_rotate=True, _v_block=True, q_buffers=1),
    # session 36: q's codes in registers as S's operand (Q_REG; configs.ROTATED["q_reg"]); "qrot" keeps them in shared
    # memory whatever that config says. (P V in bfloat16 on v as given, session 36's "qrot_pv": removed, commit 7d57409c)
    "qreg": dict(_q_rotate=True, _v_block=True, _q_reg=True), "qreg_q1": dict(_q_rotate=True, _v_block=True,
                                                                               _q_reg=True, q_buffers=1),
    # session 38: causal, the tile's first key offset through opaque_int (the bf16 forward's first_key)
    "hide": dict(hide_first_key=True), "qrot_hide": dict(_q_rotate=True, _v_block=True, hide_first_key=True),
    # session 40: the masked step's mask as one 32-bit comparison an element (mask32; P V's wait after the softmax,
    # pv_late, lost on the H100 and was removed: notes/attention_fp8's decision log). The variants take
    # configs.gluon_config, which names neither ROTATED's hide_first_key nor its mask32 (the convenience path's D64
    # causal kernel: qrot_hide_m32 with serial and three consumers, qreg_m32_serial_c3's form)
    "m32": dict(mask32=True),
    "qrot_hide_m32": dict(_q_rotate=True, _v_block=True, hide_first_key=True, mask32=True),
    # session 41 (the pipeline carried across a program's tiles, carry 1 / 2, lost and was removed: notes/attention_fp8):
    # serial steps (a step's P V in it, no P carried), with three consumers (160 registers) or two
    "qrot_m32_serial_c3": dict(_q_rotate=True, _v_block=True, mask32=True, serial=True, consumers=3),
    "qrot_m32_serial": dict(_q_rotate=True, _v_block=True, mask32=True, serial=True),
    "qreg_m32_serial_c3": dict(_q_rotate=True, _v_block=True, _q_reg=True, mask32=True, serial=True, consumers=3),
    "qrot_m32_serial_c3_st4": dict(_q_rotate=True, _v_block=True, mask32=True, serial=True, consumers=3, stages=4),
    "qrot_m32_serial_c3_q1": dict(_q_rotate=True, _v_block=True, mask32=True, serial=True, consumers=3, q_buffers=1),
    # D128 on three consumers (serial 2: O rescaled first, P V added in place; 160 registers a thread, 168 for the
    # first), codes in shared memory: one bf16 Q buffer and 3 stages (session 41's d128c3), and the convenience path's
    # D128 kernel since session 42, 2 stages (d128c3s2). Session 42's d128c3q2 (the split rotation, two Q buffers),
    # d128c3r (codes in registers: 368 B of spills) and d128c3o4 (O in 4 column slices) lost: their code at c77489fb
    # (split) / 0f7d019f (o_slices)
    "d128c3": dict(_q_rotate=True, _v_block=True, hide_first_key=True, mask32=True, serial=2, consumers=3,
                   q_buffers=1),
    "d128c3s2": dict(_q_rotate=True, _v_block=True, hide_first_key=True, mask32=True, serial=2, consumers=3,
                     q_buffers=1, stages=2),
    # session 43: the last consumer's Q in two buffers (q_last_buffers; the convenience path's D128 causal kernel since
    # session 43). ql12 (the last two consumers'), lsel (O stored before lse) and q's codes in registers (d128c3s2r:
    # 424 B of spills, LDL/STL in the step) lost: notes/attention_fp8
    "d128c3s2ql2": dict(_q_rotate=True, _v_block=True, hide_first_key=True, mask32=True, serial=2, consumers=3,
                        q_buffers=1, stages=2, q_last_buffers=2),
}


def _tool(name):
    from triton.backends.nvidia.compiler import get_ptxas

    return os.path.join(os.path.dirname(get_ptxas(90).path), name)


def sass_rows(cubin: bytes):
    """[(address, instruction)] of the cubin's SASS."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([_tool("cuobjdump"), "-sass", path], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def blocks(rows):
    """The basic blocks: split at every branch target and after every branch or exit."""
    targets = set()
    for _, ins in rows:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?(?:0x)?([0-9a-f]+)", ins)
        if "BRA" in ins and m:
            targets.add(int(m.group(1), 16))
    out, cur = [], []
    for addr, ins in rows:
        if addr in targets and cur:
            out.append(cur)
            cur = []
        cur.append((addr, ins))
        if opcode(ins) in ("BRA", "EXIT", "RET"):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def counts(instructions) -> dict:
    c = {"total": len(instructions)}
    for ins in instructions:
        op = opcode(ins)
        for k in OPS:
            if op.startswith(k):
                c[k] = c.get(k, 0) + 1
                break
        else:
            c["other"] = c.get("other", 0) + 1
    return c


def compile_variant(D: int, causal: bool, overrides: dict, e2e_forms: bool = False):
    """``e2e_forms``: q's descales per row and k's per 128-key block (the convenience path's) instead of per head."""
    from tilecore.ops.attention_fp8 import configs, gluon_fp8, launch
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    overrides = dict(overrides)
    v_block = overrides.pop("_v_block", False)
    q_rotate = overrides.pop("_q_rotate", False)
    q_reg = overrides.pop("_q_reg", False)
    cfg = dict(configs.gluon_config(D, causal), **overrides)
    f8 = torch.float8_e4m3fn
    q = torch.empty(16, 16, 4096, D, dtype=torch.bfloat16 if q_rotate else f8)
    vt = torch.empty(16, 16, D, 4096, dtype=f8)
    o = torch.empty(16, 16, 4096, D, dtype=torch.bfloat16)
    f32 = torch.empty(8192)
    k_n, k_rows = (32, 128) if e2e_forms else (1, 1)
    k = torch.empty(16, 16, 4096, D, dtype=f8)
    if q_rotate:  # the convenience path's descales: q per row (computed in the kernel), k per 128-key block
        e2e_forms, k_n, k_rows = True, 32, 128
    opts = launch.gluon_options(q, k, cfg, causal, e2e_forms, e2e_forms, k_n, k_rows, v_block, q_rotate=q_rotate,
                                q_reg=q_reg)
    bm, bn = cfg["block_m"], cfg["block_n"]
    args = dict(q_desc=gluon_descriptor(q, [1, 1, bm, D]), k_desc=gluon_descriptor(k, [1, 1, bn, D]),
                vt_desc=gluon_descriptor(vt, [1, 1, D, bn]), o_desc=gluon_descriptor(o, [1, 1, bm, D]), lse_ptr=f32,
                q_scales=f32, k_scales=f32, v_scales=f32, H=16, N=4096, Nk=4096, GROUP=1, scale_log2e=0.1,
                q_n_scales=4096 if e2e_forms else 1, q_rows_per_scale=1, k_n_scales=k_n, k_rows_per_scale=k_rows,
                num_bh=256, head_group=16, schedule=None, v_n_scales=32 if v_block else 1,
                **({"signs": f32} if q_rotate else {}))
    num_warps = opts.pop("num_warps")
    k = compile_kernel(gluon_fp8.attention_fp8_fwd_kernel, dict(args, **opts), num_warps=num_warps)
    return k, resources(k)


def analyse(k) -> dict:
    rows = sass_rows(k.asm["cubin"])
    bl = blocks(rows)
    ex2 = [sum(opcode(i).startswith("MUFU.EX2") for _, i in b) for b in bl]
    soft = max(range(len(bl)), key=lambda i: (ex2[i], len(bl[i])))
    # the steady step: back from the softmax block to the first QGMMA (S = Q K^T, from zero: "RZ, !UPT") before it
    idx = next(i for i, (a, _) in enumerate(rows) if a == bl[soft][0][0])
    j = idx
    while j > 0 and not (opcode(rows[j][1]).startswith("QGMMA.64x128") and "!UPT" in rows[j][1]):
        j -= 1
    end = bl[soft][-1][0]
    step = [i for a, i in rows[j:] if a <= end]
    return dict(softmax_block=counts([i for _, i in bl[soft]]), step=counts(step), kernel=counts([i for _, i in rows]),
                softmax_block_ex2=ex2[soft], step_first=rows[j][0], step_last=end)


def overlap_facts(k) -> dict:
    """Where the wgmma wait lies against the softmax (session 32, for s_ahead: removed, commit ecb1c8e): in
    the steady softmax block (the most MUFU.EX2; D128 / D64 unmasked), where its step's S wgmma (the QGMMA from zero, "RZ, !UPT", before the block) was issued, whether a WARPGROUP.DEPBAR lies between that
    issue and the block's last MUFU.EX2 (none: S and P V run on the tensor cores under the exponentials), and the spill
    loads and stores (LDL / STL) from that issue to the block's end."""
    rows = sass_rows(k.asm["cubin"])
    bl = blocks(rows)
    ex2 = [sum(opcode(i).startswith("MUFU.EX2") for _, i in b) for b in bl]
    soft = max(range(len(bl)), key=lambda i: (ex2[i], len(bl[i])))
    start = next(i for i, (a, _) in enumerate(rows) if a == bl[soft][0][0])
    end = next(i for i, (a, _) in enumerate(rows) if a == bl[soft][-1][0])
    issue = start
    while issue > 0 and not (opcode(rows[issue][1]).startswith("QGMMA.64x128") and "!UPT" in rows[issue][1]):
        issue -= 1
    last_ex2 = max(i for i in range(start, end + 1) if opcode(rows[i][1]).startswith("MUFU.EX2"))
    first_ex2 = min(i for i in range(start, end + 1) if opcode(rows[i][1]).startswith("MUFU.EX2"))
    span = [ins for _, ins in rows[issue:end + 1]]
    return dict(ex2=ex2[soft], s_issue_before_ex2=issue < first_ex2,
                depbar_before_last_ex2=any("WARPGROUP.DEPBAR" in ins for _, ins in rows[issue:last_ex2]),
                depbar_after_last_ex2=any("WARPGROUP.DEPBAR" in ins for _, ins in rows[last_ex2:end + 1]),
                qgmma_issued=sum(opcode(ins).startswith("QGMMA") for _, ins in rows[issue:first_ex2]),
                step_spills=sum(opcode(ins).startswith(("STL", "LDL")) for ins in span),
                step_instructions=len(span))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--e2e", action="store_true", help="q's descales per row, k's per 128-key block (the convenience "
                    "path's; default per head)")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dump", default=None, help="write the SASS of the (last) variant's softmax block here")
    args = ap.parse_args()
    out = []
    for name in args.variants.split(","):
        t0 = time.time()
        k, r = compile_variant(args.d, args.causal, VARIANTS[name], args.e2e)
        rec = dict(variant=name, D=args.d, causal=args.causal, registers=r.registers, spill_stores=r.spill_stores,
                   spill_loads=r.spill_loads, shared=r.shared, wgmma_serialized=r.wgmma_serialized, **analyse(k),
                   compile_s=round(time.time() - t0, 1))
        out.append(rec)
        print(json.dumps(rec), flush=True)
        if args.dump:
            rows = sass_rows(k.asm["cubin"])
            with open(args.dump.replace("{}", name), "w") as f:
                f.write("\n".join(f"{a:05x} {i}" for a, i in rows))
    print(f"\nD{args.d} {'causal' if args.causal else 'full'}: per thread; softmax block (the most MUFU.EX2) / steady "
          "step (HGMMA issue to the block's end)")
    keys = ("total", "FMNMX", "FFMA", "MUFU", "FADD", "FMUL", "F2FP", "PRMT", "SHFL", "QGMMA")
    print(f"{'variant':20s} regs spill " + " ".join(f"{k:>9s}" for k in keys))
    for r in out:
        print(f"{r['variant']:20s} {r['registers']:4d} {r['spill_stores']:5d} " + " ".join(
            f"{r['softmax_block'].get(k, 0):4d}/{r['step'].get(k, 0):<4d}" for k in keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

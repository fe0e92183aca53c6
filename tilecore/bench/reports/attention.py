"""Compile the attention kernels for sm_90a without a GPU and print their resources (registers,
spills, shared memory) at the block shapes the launcher picks on a GPU, and at any given ones.

    python -m tilecore.bench.reports.attention [--json]      (with TRITON_INTERPRET unset)

The Gluon forward and backward (Hopper) rows also say whether the PTX holds wgmma and TMA (and the
backward's TMA reduction), and whether ptxas serialized the wgmma (its warnings C7513/C7515).
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, kernels_tl, launch


def _compile(kernel, args: dict, options: dict):
    from tilecore.tiles.compile import compile_kernel

    return compile_kernel(kernel, args, **options)


def kernel_resources(d: int, causal: bool = True, dtype=torch.bfloat16, fwd_cfg: dict | None = None,
                     bwd_cfg: dict | None = None, dv: int | None = None, window: bool = False,
                     softcap: bool = False, suffix: str = "") -> list[dict]:
    """Resources of the forward, dk/dv and dq kernels for head dim ``d`` (the default GPU configs
    unless given; ``dv``: v's head dim, ``window``/``softcap``: those kernel variants, ``suffix``
    added to the rows' kernel names)."""
    from tilecore.tiles.compile import resources

    dv = d if dv is None else dv
    fwd_cfg = dict(fwd_cfg or configs.forward_config(max(d, dv), interpret=False))
    bwd_cfg = dict(bwd_cfg or configs.backward_config(max(d, dv), interpret=False))
    t = torch.empty(64, dtype=dtype)  # only the type and alignment matter to the signature
    f32 = torch.empty(64, dtype=torch.float32)
    n = 4096  # contiguous (B=16, H=16, N=4096, D) tensors, as in the benchmark
    strides = lambda p, e=d: {f"{p}b": 16 * n * e, f"{p}h": n * e, f"{p}n": e, f"{p}d": 1}
    common = {"H": 16, "HKV": 16, "N": n, "Nk": n, "D": d, "DV": dv, "GROUP": 1, "scale": 0.1, "scale_log2e": 0.1,
              "tanh_scale": 0.1, "left": 1024, "right": 0}
    out = []

    def one(name, kernel, args, cfg):
        options = {k: cfg[k] for k in ("num_warps", "num_stages") if k in cfg}
        consts = {k: v for k, v in cfg.items() if k.startswith("BLOCK")}
        full = dict(args, CAUSAL=causal and not window, WINDOW=window, SOFTCAP=softcap, BLOCK_D=kernels_tl.block_d(d),
                    BLOCK_DV=kernels_tl.block_d(dv), **consts)
        # a parameter the report does not set (the rotary ones) takes its default: the kernel as it is compiled
        # without that feature
        full = {p.name: full[p.name] if p.name in full else p.default for p in kernel.params}
        r = resources(_compile(kernel, full, options))
        out.append(dict(kernel=name + suffix, D=d, Dv=dv, causal=causal, window=window, softcap=softcap, cfg=cfg,
                        registers=r.registers, spill_stores=r.spill_stores, spill_loads=r.spill_loads, stack=r.stack,
                        shared=r.shared, threads=r.threads))

    base = {"Q": t, "K": t, "V": t, "O": t, "DO": t, "DK": t, "DV_OUT": t, "DQ": t, "LSE": f32, "DELTA": f32}
    base |= strides("sq") | strides("sk") | strides("sv", dv) | strides("so", dv) | strides("sd", dv)
    base |= strides("sg") | strides("svg", dv) | common
    one("forward", kernels_tl.attn_fwd, base, fwd_cfg)
    one("backward dk/dv", kernels_tl.attn_bwd_dkdv, base, bwd_cfg)
    one("backward dq", kernels_tl.attn_bwd_dq, base, bwd_cfg)
    return out


_SASS_WRITE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s+R(\d+)\b")


def _written_width(opcode: str) -> int:
    """Registers an instruction writes from its destination on (a conservative reading of SASS)."""
    if opcode.startswith("HGMMA"):
        return int(re.match(r"HGMMA\.64x(\d+)x", opcode).group(1)) // 2  # the f32 accumulator
    if ".M88.4" in opcode or ".128" in opcode:
        return 4
    if ".M88.2" in opcode or ".64" in opcode or ".WIDE" in opcode:
        return 2
    return 1


def register_operands_clobbered(cubin: bytes) -> bool:
    """Whether a register that an LDSM fills (the key split's K and V rows, loaded once a tile as
    wgmma register operands with ``kv_regs``) is also written by any other instruction, i.e. whether
    ptxas reused a loop-carried operand's registers inside the loop. It did in the dK/dV kernel alone
    (dQ mode 0) and gave wrong dK and dV on the H100 (notes/attention/README.md)."""
    import tempfile

    import triton.backends.nvidia as nvidia

    nvdisasm = os.path.join(os.path.dirname(nvidia.__file__), "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    loaded, written = set(), set()
    for opcode, reg in _SASS_WRITE.findall(sass):
        if opcode.startswith(("ST", "RED")):  # stores: their first register is an address or data
            continue
        regs = range(int(reg), int(reg) + _written_width(opcode))
        (loaded if opcode.startswith("LDSM") else written).update(regs)
    return bool(loaded & written)


def _descriptor(t, rows: int):
    """launch.head_operand's checked TensorDescriptor, as the launch that compiles builds it."""
    return launch.head_operand(t, rows).descriptor()


def _schedule(causal: bool, cfg: dict):
    """What the launchers pass for the tile schedule: a table (causal, balanced) or None."""
    return torch.empty(64, dtype=torch.int32) if causal and cfg.get("balanced", True) else None


def gluon_forward_resources(d: int, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None,
                            window: bool = False, softcap: bool = False) -> dict:
    """Resources of Hopper's Gluon forward for head dim ``d`` at the launcher's config (or ``cfg``),
    with whether its PTX holds wgmma and TMA and whether ptxas serialized its wgmma; ``window`` and
    ``softcap``: those variants (a window takes the non-causal config without carry, as plan.py)."""
    from tilecore.ops.attention.gluon_kernels import attention_fwd_kernel
    from tilecore.tiles.compile import has_hopper_instructions, resources

    cfg = dict(cfg or configs.GLUON_FORWARD[d])
    if window:
        cfg["carry"] = False
    n = 4096
    x = torch.empty(2, 2, 256, d, dtype=dtype)
    desc = functools.partial(_descriptor, x)  # as launch_forward_gluon builds them

    args = dict(q_desc=desc(cfg["block_m"]), k_desc=desc(cfg["block_n"]), v_desc=desc(cfg["block_n"]),
                o_desc=desc(cfg["block_m"]), lse_ptr=torch.empty(64, dtype=torch.float32), H=16, N=n, Nk=n,
                GROUP=1, scale_log2e=0.1, num_bh=256, head_group=12,
                schedule=_schedule(causal and not window, cfg), left=1024, right=0, tanh_scale=0.1,
                CAUSAL=causal and not window, STAGES=cfg["stages"],
                CONSUMERS=cfg["consumers"], Q_BUFFERS=cfg["q_buffers"], CARRY=cfg.get("carry", False),
                Q_REGS=cfg.get("q_regs", False), WINDOW=window, SOFTCAP=softcap)
    compiled = _compile(attention_fwd_kernel, args, {"num_warps": 4})
    r = resources(compiled)
    name = ("forward (gluon, Q in registers)" if cfg.get("q_regs") else
            "forward (gluon, 3 consumers)" if cfg["consumers"] == 3 else
            "forward (gluon, carried)" if cfg.get("carry") else
            "forward (gluon, short tiles)" if (cfg["q_buffers"], cfg["block_n"]) != (
                configs.GLUON_FORWARD[d]["q_buffers"], configs.GLUON_FORWARD[d]["block_n"]) else
            "forward (gluon)")
    if window or softcap:
        name = "forward (gluon, " + ", ".join(f for f, on in (("window", window), ("softcap", softcap)) if on) + ")"
    return dict(kernel=name, D=d, causal=causal, window=window, softcap=softcap, cfg=cfg, **vars(r),
                **has_hopper_instructions(compiled.asm["ptx"]))


def compile_gluon_backward(d: int, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None,
                           group: int = 1, window: bool = False, softcap: int = 0):
    """Hopper's Gluon backward for head dim ``d``, compiled (no GPU needed) at the launcher's config
    (or ``cfg``) with the arguments launch_backward_gluon_kernel would pass, for ``group`` q heads a
    kv head (1, specialized to a constant, or more); ``window`` and ``softcap`` (the SOFTCAP mode, 2:
    tanh.approx) its issue-35 variants (a window not with causal): (compiled kernel, cfg)."""
    from tilecore.ops.attention_backward.gluon_backward import attention_bwd_kernel
    from tilecore.tiles.launch import gluon_descriptor

    cfg = dict(cfg or configs.GLUON_BACKWARD[d, causal])
    x = torch.empty(2, 2, 256, d, dtype=dtype)
    dq_sum = torch.empty(2, 2, 256, d, dtype=torch.float32)
    desc = functools.partial(_descriptor, x)  # as launch_backward_gluon_kernel builds them

    bm, bn = cfg["block_m"], cfg["block_n"]
    stats = torch.empty(4, 2, 256, dtype=torch.float32)  # backward_preprocess's (B * H, 2, N) row statistics
    args = dict(q_desc=desc(bm), k_desc=desc(2 * bn), v_desc=desc(2 * bn), do_desc=desc(bm), dk_desc=desc(bn),
                dv_desc=desc(bn), stats_desc=launch.row_stats_operand(stats, bm).descriptor(),
                dq_desc=gluon_descriptor(dq_sum, launch.dq_box(bm, d, cfg["dq_from"])), H=16, N=4096,
                Nk=4096, GROUP=group, scale=0.1, scale_log2e=0.1, num_bhk=256, head_group=8,
                schedule=_schedule(causal and not window, cfg),
                left=1024 if window else 0, right=0, tanh_scale=0.1 if softcap else 0.0, CAUSAL=causal and not window,
                STAGES=cfg["stages"], DQ=configs.DQ_MODES[cfg["dq_from"]], KV_REGS=cfg.get("kv_regs", False),
                WINDOW=window, SOFTCAP=softcap, DP_FROM_DELTA=cfg.get("dp_from_delta", False))
    return _compile(attention_bwd_kernel, args, {"num_warps": 4}), cfg


def gluon_backward_resources(d: int, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None,
                             group: int = 1) -> dict:
    """Resources of Hopper's Gluon backward for head dim ``d`` at the launcher's config (or ``cfg``)
    for ``group`` q heads a kv head, with whether its PTX holds wgmma, TMA and the TMA reduction of
    dQ, and whether ptxas serialized its wgmma."""
    from tilecore.tiles.compile import has_hopper_instructions, resources

    compiled, cfg = compile_gluon_backward(d, causal, dtype, cfg, group=group)
    ptx = compiled.asm["ptx"]
    name = "backward (gluon, grouped heads)" if group > 1 else "backward (gluon)"
    clobbered = register_operands_clobbered(compiled.asm["cubin"]) if cfg.get("kv_regs") else None
    return dict(kernel=name, D=d, causal=causal, cfg=cfg, **vars(resources(compiled)),
                **has_hopper_instructions(ptx), tma_reduce="cp.reduce.async.bulk.tensor" in ptx,
                kv_operands_clobbered=clobbered)


def compile_gluon_dq(d: int, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None,
                     window: bool = False, softcap: int = 0):
    """Hopper's Gluon dQ kernel (gluon_dq.py) for head dim ``d``, compiled (no GPU needed) with the
    arguments launch_dq_gluon would pass; ``window`` and ``softcap`` as compile_gluon_backward's."""
    from tilecore.ops.attention_backward.gluon_dq import attention_dq_kernel

    cfg = dict(cfg or configs.GLUON_DQ[d])
    x = torch.empty(2, 2, 256, d, dtype=dtype)
    desc = functools.partial(_descriptor, x)  # as launch_dq_gluon builds them
    bm, bn = cfg["block_m"], cfg["block_n"]
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(q_desc=desc(2 * bm), k_desc=desc(bn), v_desc=desc(bn), do_desc=desc(2 * bm), dq_desc=desc(bm),
                qdo_desc=desc(2 * bm), lse_ptr=f32, delta_ptr=f32, H=16, N=4096, Nk=4096, GROUP=1, scale=0.1,
                scale_log2e=0.1, num_bh=256, head_group=12, schedule=_schedule(causal and not window, cfg),
                left=1024 if window else 0, right=0, tanh_scale=0.1 if softcap else 0.0, CAUSAL=causal and not window,
                STAGES=cfg["stages"], WINDOW=window, SOFTCAP=softcap)
    return _compile(attention_dq_kernel, args, {"num_warps": 4})


def gluon_dq_resources(d: int, causal: bool = True, dtype=torch.bfloat16, cfg: dict | None = None) -> dict:
    """Resources of Hopper's Gluon dQ kernel (gluon_dq.py) for head dim ``d``, with whether its PTX
    holds wgmma and TMA and whether ptxas serialized its wgmma."""
    from tilecore.tiles.compile import has_hopper_instructions, resources

    cfg = dict(cfg or configs.GLUON_DQ[d])
    compiled = compile_gluon_dq(d, causal, dtype, cfg)
    return dict(kernel="backward dq (gluon)", D=d, causal=causal, cfg=cfg, **vars(resources(compiled)),
                **has_hopper_instructions(compiled.asm["ptx"]))


def decode_resources(d: int, group: int = 4, queries: int = 1, dv: int | None = None, hkv: int = 8,
                     suffix: str = "") -> list[dict]:
    """Resources of the split-key (decode) kernels for head dim ``d`` (v's ``dv``) at the plan's
    config, for ``queries`` queries of a ``group``-head group over ``hkv`` kv heads, with whether the
    K/V loads are cp.async-pipelined (``suffix`` added to the rows' kernel names)."""
    from tilecore.tiles.compile import resources

    from tilecore.ops.attention_decode import configs as decode_configs, kernels_tl as decode_kernels
    from tilecore.ops.attention_decode.plan import tile_rows

    dv = d if dv is None else dv
    cfg = decode_configs.decode_config(max(d, dv), interpret=False)
    bf16, f32 = torch.empty(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.float32)
    nk = 4096
    block_d, block_dv = kernels_tl.block_d(d), kernels_tl.block_d(dv)
    block_dk = block_d if d <= decode_configs.DECODE_WHOLE_HEAD_DIM else decode_configs.DECODE_HEAD_DIM_CHUNK
    most_rows = (decode_configs.DECODE_MAX_ROWS if dv <= decode_configs.DECODE_WHOLE_HEAD_DIM else
                 decode_configs.DECODE_MAX_ROWS_LARGE_DV)
    block_m = tile_rows(queries, group, most_rows)
    strides = lambda p, n, e=d: {f"{p}b": hkv * group * n * e, f"{p}h": n * e, f"{p}n": e, f"{p}d": 1}
    split_args = dict(Q=bf16, K=bf16, V=bf16, O=bf16, LSE=f32, O_PART=f32, LSE_PART=f32, **strides("sq", queries),
                      **strides("sk", nk), **strides("sv", nk, dv), Hkv=hkv, N=queries, Nk=nk, D=d, DV=dv,
                      GROUP=group, keys_per_split=512, left=0, right=0, scale_log2e=0.1, tanh_scale=0.0, CAUSAL=True,
                      WINDOW=False, SOFTCAP=False, MERGED=False, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"],
                      BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_DK=block_dk)
    merge_args = dict(O=bf16, LSE=f32, O_PART=f32, LSE_PART=f32, rows_total=4096, D=dv, splits=8, SPLITS=16,
                      BLOCK_D=block_dv)
    options = {k: cfg[k] for k in ("num_warps", "num_stages") if k in cfg}
    rows = []
    for name, kernel, args, opts, row_cfg in (
            ("decode split keys", decode_kernels.attn_fwd_split_keys, split_args, options, cfg),
            ("decode merge", decode_kernels.attn_merge_splits, merge_args, {}, dict(SPLITS=16))):
        compiled = _compile(kernel, args, opts)
        ptx = compiled.asm["ptx"]
        rows.append(dict(kernel=name + suffix, D=d, Dv=dv, causal=True, cfg=row_cfg, **vars(resources(compiled)),
                         cp_async="cp.async.cg" in ptx or "cp.async.ca" in ptx, mma="mma.sync" in ptx))
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if dispatch.interpreter_enabled():
        print("run with TRITON_INTERPRET unset: the interpreter's kernels cannot be compiled", file=sys.stderr)
        return 2
    rows = [r for d in (64, 128, 256) for r in kernel_resources(d)]
    rows += [gluon_forward_resources(d, causal) for d in (64, 128) for causal in (False, True)]
    gluon_forward_config = configs.gluon_forward_config
    # short tiles: two Q buffers (GLUON_FORWARD's at D = 128), carried across tiles but at D = 128
    # causal, and causal ones 64-key blocks; D = 64 at long lengths: three consumers
    for d, causal in ((64, True), (128, False), (128, True)):
        rows.append(gluon_forward_resources(d, causal, cfg=gluon_forward_config(d, 512, 512, causal)))
    for causal in (False, True):
        rows.append(gluon_forward_resources(64, causal, cfg=gluon_forward_config(64, 16384, 16384, causal)))
    rows.append(gluon_forward_resources(64, False, cfg=gluon_forward_config(64, 4096, 4096, False)))  # and 2 Q buffers
    rows.append(gluon_forward_resources(64, True, cfg=gluon_forward_config(64, 1024, 1024, True)))  # and 64-key blocks
    rows.append(gluon_forward_resources(128, False, cfg=gluon_forward_config(128, 4096, 4096, False)))  # Q in registers
    rows += [gluon_backward_resources(d, causal) for d in (64, 128) for causal in (False, True)]
    # grouped heads (the group size a runtime value, not the constant 1): the step's q head divided out
    rows += [gluon_backward_resources(d, True, group=4) for d in (64, 128)]
    # the deterministic mode's D64 backward (dq by its own kernel)
    rows.append(gluon_backward_resources(64, True, cfg=dict(configs.GLUON_BACKWARD[64, True], dq_from="gluon",
                                                            kv_regs=False)))
    rows += [gluon_dq_resources(d, causal) for d in (64, 128) for causal in (False, True)]
    rows += [r for d in (64, 128, 256) for r in decode_resources(d)]
    # issue 35 (a few rows: each compile is CI time): MLA decode (576 / 512, 128 q heads over one latent) and
    # the Gluon forward's window and softcap at D 128 (compile-checked, not routed by default:
    # configs.GLUON_FORWARD_FEATURES); the tl kernels' window and softcap variants are compiled by
    # kernel_resources(d, window=True, softcap=True) (notes/attention: dk/dv at D 128 spills 256 B)
    rows += decode_resources(576, group=128, dv=512, hkv=1, suffix=" (MLA 576/512)")
    rows += [gluon_forward_resources(128, False, window=True), gluon_forward_resources(128, True, softcap=True)]
    if "--json" in argv:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(f"{r['kernel']:>15} D={r['D']:<3} {r['cfg']}: {r['registers']} regs, spills "
                  f"{r['spill_stores']}/{r['spill_loads']}, stack {r['stack']}, shared {r['shared']} B, "
                  f"{r['threads']} threads" + (" (wgmma SERIALIZED by ptxas)" if r.get("wgmma_serialized") else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The PTX of the linear-attention Gluon forwards (gluon_forward.la_fwd_gluon_kernel; Based's
gluon_based.based_fwd_gluon_kernel) as the shipped launches build them, one file a case, compiled for sm_90a on this
machine (no GPU). The linear kernel's flags come from the public functions gluon_forward.forward asks (``variant``)
and the configs it reads; Based's launch is gluon_based.forward's own, captured before it runs. So the same script run
against two trees shows whether an edit changed what the shipped launches compile. Compare with
experiments/tiles/ptx_compare.py:

    git archive HEAD tilecore | tar -x -C /tmp/old
    python experiments/linear_attention/ptx_forward_shipped.py --root /tmp/old --ptx /tmp/ptx_old
    python experiments/linear_attention/ptx_forward_shipped.py --ptx /tmp/ptx_new
    python experiments/tiles/ptx_compare.py /tmp/ptx_old /tmp/ptx_new
    python experiments/linear_attention/ptx_forward_shipped.py --compare /tmp/ptx_old /tmp/ptx_new [--json OUT]

``--compare`` is ptx_compare's comparison with the kernel's parameters left out (the ``.param`` declarations, the
parameters' names in the PTX and their constant-bank offsets in the SASS): for an edit that removes parameters no
shipped launch reads (session 37: G, BETA, Z and their strides), whose code is otherwise the same.
"""
import argparse
import inspect
import os
import re
import sys

# (Hqk, H, Dk, Dv, dtype, decay, beta, D, z, states): what the op launches the kernel with
CASES = {
    "linear_d128": (16, 16, 128, 128, "bf16", False, False, False, False, False),
    "linear_d128_states": (16, 16, 128, 128, "bf16", False, False, False, False, True),
    "linear_d64_fp16": (16, 16, 64, 64, "fp16", False, False, False, False, False),
    "beta_no_decay": (16, 16, 128, 128, "bf16", False, True, False, False, False),
    "decay_d128_states": (16, 16, 128, 128, "bf16", True, False, False, False, True),
    "decay_d64": (16, 16, 64, 64, "bf16", True, False, False, False, False),
    "mamba2": (1, 80, 128, 64, "bf16", True, True, True, True, False),
    "mamba2_d_only_states": (1, 80, 128, 64, "bf16", True, True, True, False, True),
    "mamba2_fp16": (8, 80, 128, 64, "fp16", True, True, True, True, False),
}


def shipped_kwargs(gf, configs, g, beta, z) -> dict:
    """launch_args's keywords as gluon_forward.forward gives them for these inputs (None or a tensor each)."""
    if not hasattr(gf, "variant"):  # (session 37 on: the kernel has no switches; G and beta always head-major)
        return dict(g_stage=g is not None)
    kw = dict(gf.variant(g, beta, z))
    kw["z_stage"] = configs.GLUON_Z_STAGE
    kw["silu_tanh"] = configs.GLUON_SILU_TANH
    if hasattr(gf, "s32_flags"):  # (the tree before issue 30's removals: LEAN came from configs.GLUON_S32)
        s32 = dict(gf.s32_flags(beta is not None))
        s32.pop("beta_log", None)  # (needs beta_nonneg: no shipped config names it)
        kw.update(s32)
    params = inspect.signature(gf.launch_args).parameters
    return {k: v for k, v in kw.items() if k in params or k == "g_stage"}


def without_params(lines: list[str]) -> list[str]:
    """PTX lines without the parameters' declarations and names."""
    return [re.sub(r"\w+_param_\d+", "param", x) for x in lines if not x.strip().startswith(".param")]


def compare(old: str, new: str, out: str | None) -> int:
    """ptx_compare's rows for the files of both folders, the kernels' parameters left out (module docstring)."""
    import json

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tiles"))
    import ptx_compare as pc

    bank = lambda code: [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", i) for i in code]  # noqa: E731
    rows = []
    for name in sorted(set(os.listdir(old)) | set(os.listdir(new))):
        paths = [os.path.join(d, name) for d in (old, new)]
        if not name.endswith(".ptx") or not all(os.path.exists(p) for p in paths):
            rows.append(dict(variant=name, missing=[p for p in paths if not os.path.exists(p)]))
            print(f"{name:28s} only in one folder", flush=True)
            continue
        ptx = [pc.ptx_code(p) for p in paths]
        code = [pc.sass(p) for p in paths]
        row = dict(variant=name[:-4], ptx_identical=ptx[0] == ptx[1],
                   ptx_identical_but_params=without_params(ptx[0]) == without_params(ptx[1]),
                   sass_instructions=[len(x) for x in code], sass_identical=code[0] == code[1],
                   sass_identical_but_param_offsets=bank(code[0]) == bank(code[1]),
                   sass_same_up_to_registers_and_offsets=pc.without_registers(bank(code[0]))
                   == pc.without_registers(bank(code[1])))
        rows.append(row)
        print(f"{row['variant']:28s} PTX {'same' if row['ptx_identical'] else 'differs'}, but the parameters "
              f"{'same' if row['ptx_identical_but_params'] else 'DIFFERENT'}; SASS {row['sass_instructions']} "
              f"{'identical' if row['sass_identical'] else ''} but offsets "
              f"{'same' if row['sass_identical_but_param_offsets'] else 'DIFFERENT'}", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r.get("sass_same_up_to_registers_and_offsets") for r in rows if "missing" not in r) else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--ptx")
    ap.add_argument("--only", default="")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.compare, a.json))
    sys.path.insert(0, a.root)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention import gluon_forward as gf
    from tilecore.tiles.compile import compile_kernel, resources

    os.makedirs(a.ptx, exist_ok=True)
    for name, (Hqk, H, Dk, Dv, dt, decay, has_beta, has_d, has_z, states) in CASES.items():
        if a.only and a.only not in name:
            continue
        dtype = torch.bfloat16 if dt == "bf16" else torch.float16
        B, N = 2, 4096
        f32 = lambda *shape: torch.empty(*shape, dtype=torch.float32)  # noqa: E731
        q = torch.empty(B, N, Hqk, Dk, dtype=dtype)
        v = torch.empty(B, N, H, Dv, dtype=dtype)
        z = torch.empty_like(v) if has_z else None
        g_in = f32(B, N, H) if decay else None
        b_in = f32(B, N, H) if has_beta else None
        if "beta" in inspect.signature(gf.fits).parameters:  # (session 37 on: the kernel turns some inputs away)
            why = gf.fits(q, q, v, g_in, 0, b_in, z)
            if why and "without" in why:  # (beta without a decay, z without beta: the tl kernels' since)
                print(f"{name:22s} not the kernel's: {why}", flush=True)
                continue
        kw = shipped_kwargs(gf, configs, g_in, b_in, z)
        g_stage = kw.get("g_stage", False)
        if "g_stage" not in inspect.signature(gf.launch_args).parameters:
            kw.pop("g_stage", None)
        g = (f32(B, H, N) if g_stage else g_in) if decay else None
        beta = (f32(B, H, N) if g_stage else b_in) if has_beta else None
        _, args, warps = gf.launch_args(q, q, v, g, beta, f32(H, Dv) if has_d else None, z,
                                        f32(B, H, Dk, Dv) if states else None, torch.empty_like(v),
                                        f32(B, H, Dk, Dv) if states else None, 1.0, configs.GLUON_STAGES, **kw)
        k = compile_kernel(gf.la_fwd_gluon_kernel, args, num_warps=warps)
        r = resources(k)
        with open(os.path.join(a.ptx, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx"), "w") as f:
            f.write(k.asm["ptx"].replace(os.path.abspath(a.root) + os.sep, ""))
        on = sorted(n for n, val in kw.items() if val)
        print(f"{name:22s} registers {r.registers} spills {r.spill_stores} shared {r.shared} flags {on}", flush=True)
    based(a, torch, compile_kernel, resources)


# Based's launches (gluon_based.forward with configs' flags, its launch captured before it runs): (H, Dv, dtype,
# initial state, final state)
BASED_CASES = {
    "based_v64": (16, 64, "bf16", False, False),
    "based_v64_states": (16, 64, "bf16", True, True),
    "based_v128_fp16": (4, 128, "fp16", False, True),
}


def based(a, torch, compile_kernel, resources):
    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention import gluon_based as gb

    for name, (H, Dv, dt, h0, final) in BASED_CASES.items():
        if a.only and a.only not in name:
            continue
        dtype = torch.bfloat16 if dt == "bf16" else torch.float16
        q = torch.empty(2, 4096, H, gb.DK, dtype=dtype)
        v = torch.empty(2, 4096, H, Dv, dtype=dtype)
        init = torch.zeros(2, H, 1 + 16 + 256, Dv) if h0 else None
        launched = []
        stages = getattr(configs, "GLUON_BASED_ALU_STAGES", configs.GLUON_BASED_STAGES)  # (the tree before: ALU's)
        gb.forward(q, q, v, init, 0.25, final, stages, launch=lambda grid, args, warps: launched.append((args, warps)))
        args, warps = launched[0]
        k = compile_kernel(gb.based_fwd_gluon_kernel, args, num_warps=warps)
        r = resources(k)
        with open(os.path.join(a.ptx, name + ".ptx"), "w") as f:
            f.write(k.asm["ptx"].replace(os.path.abspath(a.root) + os.sep, ""))
        on = sorted(n for n, val in args.items() if n.isupper() and len(n) > 2 and isinstance(val, (bool, int))
                    and n not in ("STAGES",) and val not in (False, 0))
        print(f"{name:22s} registers {r.registers} spills {r.spill_stores} shared {r.shared} flags {on}", flush=True)


if __name__ == "__main__":
    main()

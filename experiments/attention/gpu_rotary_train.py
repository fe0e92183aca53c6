"""Issue 37 (session 38, helper HR): attention(..., rotary=(cos, sin)) on Hopper, the training forward by
gluon_forward (K by apply_rotary's pass, Q turned in the Gluon forward and stored from there for the backward:
configs.ROTARY_TRAIN_IN_KERNEL_CASES) against the turned path's (q and k by apply_rotary's passes, then the
shipped forward), and apply_rotary's K pass against a copy of K.

1. --checks D:full,D:causal[:N] (bf16, fresh random inputs, the allocator's free memory filled with NaN first so an
   unwritten element shows; B1 H2 N4096, the timed shapes' kernels, or N: short, the carried kernel; full
   half-split, causal interleaved): O, dq,
   dk, dv of the new training path against the float64 reference (reference.rotary_attention_reference) as
   multiples of the rounding floor, beside plain attention's on the same inputs; the turned q and k it keeps
   (``same_qk``), its O and lse (``same_olse``): the turned path's bits; ``same`` / ``repeat``: which of O, dq,
   dk, dv equal the turned path's bits / those the turned path repeats (dQ's float32 sum is added by TMA
   reductions, in any order).
2. --kpass: B16 H16 N4096 D128 bf16: apply_rotary's K pass (rotary.op.turn into a contiguous buffer, as the
   paths do; token-major tiles, and head-major ones: rotary.configs.HEAD_MAJOR_TILES, its bits checked) against
   a copy of K (Tensor.copy_, same bytes), GPU time from CUDA graphs, interleaved rounds.
3. --dims D,..: GPU time from CUDA graphs (triton.testing.do_bench_cudagraph medians, interleaved rounds), B16
   H16 N4096, bf16 tables, full and causal: forward without a gradient (plain / rotary as routed); forward
   recording a gradient (plain / turned / new); forward + backward (autograd.grad of q, k, v: plain / turned
   / new); --shipped: the shipped routes alone (no-grad forward and forward + backward, plain / rotary);
   --routed: the no-grad forward by gluon_forward in every case against the turned forward (the choice
   configs.ROTARY_IN_KERNEL_CASES makes per case; gpu_rotary_dk.py's --routed until session 38, removed).
   Overheads over plain in the same run (issue 37: <= 3%). (Session 38's runs 1-4 also timed the no-grad
   forward with K turned into a (B, H, Nk, D) buffer, configs.ROTARY_K_BY_HEAD, removed since: git 1ecd5bd.)

4. (session 42) K turned inside gluon_forward's launch (KTurn: side items of the persistent schedule,
   configs.ROTARY_K_OVERLAP_*): --overlap-checks D:full (B1 H2 N4096 half-split), D:causal (GQA 8/2, N 300 < Nk
   700, interleaved), D:causal4096: the no-grad O against float64 into poisoned memory, its bits against the route
   that turns K by the pass and against a second call; --overlap D,..: the no-grad forward plain / as shipped /
   inside per --variants steps:lead (items' ring steps, lead in grids of tiles), --train the training forward too;
   --one-sm: one program (sm_margin) over B1 H1 N128 Nk 65536, plain against inside: the items' turn rate on one SM.

5. (session 43) --ab D:mask,..: the no-grad forward's routes by name (--ab-variants: AB_VARIANTS, plain / shipped /
   pass / items), each graph captured inside the patched block of an eager call before it (ab_timing: the plan the
   label names, K items taken or not recorded); --ncu D:mask,..: Nsight Compute on one launch of each route's
   kernels (--ncu-variants; ncu_phase: time, the SMs' active-cycle spread, tensor pipe, L2 / DRAM traffic, L2
   atomics); --overlap-checks D:window512: a causal call with the window (512, 0) (the items, window kernel;
   GQA 4/2, half-split).

  PYTHONPATH=. python experiments/attention/gpu_rotary_train.py [--checks 128:full,128:causal] [--kpass]
      [--dims 128,64] [--rounds 2]
  PYTHONPATH=. python experiments/attention/gpu_rotary_train.py --smoke   # CPU: imports and the checks' code
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import os
import sys
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import tilecore  # noqa: E402
from experiments.common.gpu_script import Run, check, same_bits, sync, time_rounds  # noqa: E402
from tilecore.ops.attention import configs as attention_configs  # noqa: E402
from tilecore.ops.attention_rotary import configs, op as op_rotary  # noqa: E402
from tilecore.ops.attention.reference import attention_reference  # noqa: E402
from tilecore.ops.attention_rotary.reference import rotary_attention_reference  # noqa: E402
from tilecore.ops.rotary import configs as rotary_configs  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
# configs.ROTARY_IN_KERNEL_CASES (and ROTARY_TRAIN_IN_KERNEL_CASES) routing every case
ALL_CASES = frozenset({(64, False), (64, True), (128, False), (128, True)})


def poison():
    """The allocator's free blocks filled with NaN (the next outputs likely land there)."""
    if SMOKE:
        return
    free = torch.cuda.mem_get_info()[0]
    try:
        junk = torch.full((int(min(free * 0.5, 8 << 30)) // 2,), float("nan"), dtype=torch.bfloat16, device=DEV)
        del junk
    except RuntimeError:
        pass


def tables(rows, pairs, dtype=torch.float32):
    angle = torch.rand(rows, pairs, device=DEV, dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


CHECK_OVERLAP = []  # --checks-overlap: the new path's K turned inside the launch (configs.ROTARY_K_OVERLAP_CASES)


def new_path(on: bool):
    """The training forward by gluon_forward in every case (on) or in none (off: the turned path's); with
    --checks-overlap, on, its K turned inside the launch."""
    values = dict(ROTARY_TRAIN_IN_KERNEL_CASES=ALL_CASES if on else frozenset())
    if on and CHECK_OVERLAP:
        values.update(ROTARY_K_OVERLAP_CASES=ALL_CASES if CHECK_OVERLAP[0] else frozenset())
    return patched(configs, **values)


def checks(run, name, b, hq, hkv, n, nk, d, pairs, causal, interleaved, dtype=torch.bfloat16):
    q = torch.randn(b, hq, n, d, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, nk, d, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hkv, nk, d, device=DEV, dtype=dtype, requires_grad=True)
    cos, sin = tables(nk + 3, pairs)
    g = torch.randn(b, hq, n, d, device=DEV, dtype=dtype)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    result, got = {}, {}
    for label, rot, on in (("new", (cos, sin), True), ("turned", (cos, sin), False), ("again", (cos, sin), False),
                           ("plain", None, False)):
        poison()
        with new_path(on):
            out = tilecore.attention(q, k, v, causal=causal, rotary=rot, rotary_interleaved=interleaved)
            grads = torch.autograd.grad(out, (q, k, v), g)
        got[label] = (out.detach(), *grads)
        if label in ("turned", "again"):
            continue
        if rot is None:
            ro, _ = attention_reference(q64, k64, v64, causal=causal)
        else:
            ro, _ = rotary_attention_reference(q64, k64, v64, cos, sin, interleaved=interleaved, causal=causal)
        rg = torch.autograd.grad(ro, (q64, k64, v64), g.double())
        for t, x, ref in zip(("o", "dq", "dk", "dv"), got[label], (ro, *rg)):
            c = check(x, ref, tol=3.0)
            result[f"{label}_{t}"] = c.get("err_over_floor")
            if label == "new":
                result[f"{t}_pass"] = c["pass"]
        del ro, rg
    # the turned q and k the new forward keeps, against the turned path's, straight from the ops
    with torch.no_grad():
        args = (q.detach(), k.detach(), v.detach(), cos, sin, causal, d ** -0.5, interleaved, -1, -1, 0.0, 0)
        poison()
        with new_path(True):
            new = op_rotary.turned_forward_op(*args)
        with new_path(False):
            old = op_rotary.turned_forward_op(*args)
    result["same_qk"] = same_bits(new[2:], old[2:])
    if not result["same_qk"]:  # where the kept q and k differ, and which is nearer the float64 turn
        result.update(differences(q.detach(), new[2], old[2], cos[nk - n:], sin[nk - n:], interleaved, "q"))
        result.update(differences(k.detach(), new[3], old[3], cos, sin, interleaved, "k"))
    result["same_olse"] = same_bits(new[:2], old[:2])
    # the outputs equal to the turned path's bits, and those the turned path itself repeats (dQ's float32 sum is
    # added by TMA reductions in any order: not repeatable)
    names = ("o", "dq", "dk", "dv")
    result["same"] = "".join(t[-1] if same_bits(x, y) else "-" for t, x, y in zip(names, got["new"], got["turned"]))
    result["repeat"] = "".join(t[-1] if same_bits(x, y) else "-" for t, x, y in zip(names, got["again"], got["turned"]))
    ok = all(result[f"{t}_pass"] for t in ("o", "dq", "dk", "dv")) and result["same_qk"] and result["same_olse"]
    ok = ok and all(a == "-" or a == b for a, b in zip(result["repeat"], result["same"]))  # all repeatable alike
    ok = ok and all(result[f"new_{t}"] <= max(3.0, 1.8 * result[f"plain_{t}"]) for t in ("o", "dq", "dk", "dv"))
    run.row(f"check {name}", kind="check", causal=causal, interleaved=interleaved, d=d, pairs=pairs, n=n, nk=nk,
            hq=hq, hkv=hkv, ok=bool(ok), **{k_: v_ for k_, v_ in result.items() if not k_.endswith("_pass")})


def differences(x, a, b, cos, sin, interleaved, name):
    """Where two turns a, b (B, H, N, D) of x differ: how many elements, over how many 64-row blocks and columns,
    by how many bf16 ulps at most, and how many of those a or b rounds nearer the float64 turn."""
    from tilecore.ops.rotary import rotary_reference

    diff = a != b
    if not diff.any():
        return {f"{name}_diff": 0}
    ref = rotary_reference(x.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)
    ea, eb = (a.double() - ref).abs()[diff], (b.double() - ref).abs()[diff]
    where = diff.nonzero()
    ulps = ((a.view(torch.int16).int() - b.view(torch.int16).int()).abs()[diff]).max().item()
    return {f"{name}_diff": int(diff.sum()), f"{name}_of": diff.numel(),
            f"{name}_blocks": len(set((where[:, 2] // 64).tolist())),
            f"{name}_cols": sorted(set(where[:, 3].tolist()))[:8], f"{name}_ulps": ulps,
            f"{name}_new_nearer": int((ea < eb).sum()), f"{name}_old_nearer": int((eb < ea).sum())}


def kpass(run, d=128, b=16, h=16, n=4096, rounds=3):
    """apply_rotary's K pass (into a contiguous buffer, as gluon_forward's training forward and the turned path
    do) against Tensor.copy_ of K: the same bytes read and written."""
    from tilecore.ops.rotary.op import turn

    k = torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16)
    out = torch.empty_like(k)
    cos, sin = tables(n, d // 2, torch.bfloat16)
    def head_major(tile=rotary_configs.TILE_ELEMS):  # rotary.configs.HEAD_MAJOR_TILES: tile / 2R tokens a tile
        def f():
            with patched(rotary_configs, HEAD_MAJOR_TILES=True, TILE_ELEMS=tile):
                turn(k.transpose(1, 2), cos, sin, out=out.transpose(1, 2))
        return f

    fns = {"pass": lambda: turn(k.transpose(1, 2), cos, sin, out=out.transpose(1, 2)), "pass_hm": head_major(),
           "pass_hm2k": head_major(2048), "pass_hm8k": head_major(8192), "copy": lambda: out.copy_(k)}
    for f in fns.values():
        f()
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    gb = 2 * k.numel() * k.element_size() / 1e9
    ref = turn(k.transpose(1, 2), cos, sin).transpose(1, 2)
    same = []
    for tile in (2048, 4096, 8192):
        out.fill_(float("nan"))
        head_major(tile)()
        same.append(same_bits(out, ref.contiguous()))
    run.row(f"K pass D{d}", kind="kpass", d=d, pass_ms=t["pass_graph_ms"], copy_ms=t["copy_graph_ms"],
            pass_hm_ms=t["pass_hm_graph_ms"], hm_same=all(same),
            **{f"{n_}_of_copy": round(t["copy_graph_ms"] / t[f"{n_}_graph_ms"], 4)
               for n_ in ("pass_hm2k", "pass_hm8k")},
            pass_of_copy=round(t["copy_graph_ms"] / t["pass_graph_ms"], 4),
            hm_of_copy=round(t["copy_graph_ms"] / t["pass_hm_graph_ms"], 4),
            pass_tbs=round(gb / t["pass_graph_ms"], 3), copy_tbs=round(gb / t["copy_graph_ms"], 3),
            rounds={n_: t[f"{n_}_rounds"]["graph"] for n_ in fns})


def timing(run, d, causal, b=16, h=16, n=4096, rounds=2, fwd_only=False, shipped=False, routed=False):
    q, k, v = (torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16)
    cos, sin = tables(n, d // 2, torch.bfloat16)

    def nograd(rot):
        def f():
            with torch.no_grad():
                tilecore.attention(q, k, v, causal=causal, rotary=rot)
        return f

    def train_fwd(rot, on=None):  # recording a gradient, no backward; on: None as shipped, else new_path(on)
        def f():
            with contextlib.nullcontext() if on is None else new_path(on):
                tilecore.attention(q, k, v, causal=causal, rotary=rot)
        return f

    def fwdbwd(rot, on=None):
        def f():
            with contextlib.nullcontext() if on is None else new_path(on):
                torch.autograd.grad(tilecore.attention(q, k, v, causal=causal, rotary=rot), (q, k, v), g)
        return f

    def nograd_routed(cases):  # the no-grad forward with ROTARY_IN_KERNEL_CASES = cases
        def f():
            with torch.no_grad(), patched(configs, ROTARY_IN_KERNEL_CASES=cases):
                tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin))
        return f

    rot = (cos, sin)
    if routed:  # the no-grad forward by gluon_forward (K by the pass, Q in the kernel) against the turned forward
        fns = {"fwd_plain": nograd(None), "fwd_inkernel": nograd_routed(ALL_CASES),
               "fwd_turned": nograd_routed(frozenset())}
    elif shipped:  # the shipped routes alone: plain and rotary, without and with a gradient
        fns = {"fwd_plain": nograd(None), "fwd_rotary": nograd(rot), "bwd_plain": fwdbwd(None),
               "bwd_rotary": fwdbwd(rot)}
    else:
        fns = {"fwd_plain": nograd(None), "fwd_rotary": nograd(rot), "tfwd_plain": train_fwd(None),
               "tfwd_turned": train_fwd(rot, False), "tfwd_new": train_fwd(rot, True)}
        if not fwd_only:
            fns.update(bwd_plain=fwdbwd(None), bwd_turned=fwdbwd(rot, False), bwd_new=fwdbwd(rot, True))
    for f in fns.values():  # compiled before the clock
        f()
    torch.cuda.synchronize()
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    ms = {name: t[f"{name}_graph_ms"] for name in fns}
    over = lambda a, base: round(100 * (ms[a] / ms[base] - 1), 2)
    if routed:
        extra = dict(fwd_inkernel_over=over("fwd_inkernel", "fwd_plain"),
                     fwd_turned_over=over("fwd_turned", "fwd_plain"))
    elif shipped:
        extra = dict(bwd_over=over("bwd_rotary", "bwd_plain"))
    else:
        extra = dict(tfwd_turned_over=over("tfwd_turned", "tfwd_plain"), tfwd_new_over=over("tfwd_new", "tfwd_plain"))
        if not fwd_only:
            extra.update(bwd_turned_over=over("bwd_turned", "bwd_plain"), bwd_new_over=over("bwd_new", "bwd_plain"))
    run.row(f"time D{d} {'causal' if causal else 'full'}", kind="time", d=d, causal=causal, b=b, h=h, n=n,
            **{f"{k_}_ms": round(v_, 4) for k_, v_ in ms.items()},
            **({} if routed else {"fwd_over": over("fwd_rotary", "fwd_plain")}), **extra,
            rounds={name: t[f"{name}_rounds"]["graph"] for name in fns})


def overlap_path(steps=None, lead=None):
    """K turned inside gluon_forward's launch (configs.ROTARY_K_OVERLAP_*: KTurn's side items) in every case, with
    these item steps and lead (None: the configs'); also routing every no-grad case to gluon_forward."""
    values = dict(ROTARY_K_OVERLAP_CASES=ALL_CASES, ROTARY_IN_KERNEL_CASES=ALL_CASES)
    if steps is not None:
        values.update(ROTARY_K_OVERLAP_ITEM_STEPS=steps, ROTARY_K_OVERLAP_LEAD=lead)
    return patched(configs, **values)


def overlap_checks(run, name, b, hq, hkv, n, nk, d, causal, interleaved, steps, lead, window=(-1, -1)):
    """The no-grad forward with K turned inside the launch against float64 (O, lse written), beside the route that
    turns K by apply_rotary's pass (its O's bits) and plain attention's error on the same inputs; ``window``: the
    call's window_size too (a causal call with a window takes the items: the window kernel, causal folded in)."""
    q = torch.randn(b, hq, n, d, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, nk, d, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(b, hkv, nk, d, device=DEV, dtype=torch.bfloat16)
    cos, sin = tables(nk + 3, d // 2, torch.bfloat16)
    with torch.no_grad():
        poison()
        kw = dict(causal=causal, window_size=window)
        with overlap_path(steps, lead):
            taken = overlap_taken(q, k, causal, window)
            o_new = tilecore.attention(q, k, v, **kw, rotary=(cos, sin), rotary_interleaved=interleaved)
            sync()
            o_new2 = tilecore.attention(q, k, v, **kw, rotary=(cos, sin), rotary_interleaved=interleaved)
        with patched(configs, ROTARY_IN_KERNEL_CASES=ALL_CASES, ROTARY_K_OVERLAP_CASES=frozenset()):
            o_pass = tilecore.attention(q, k, v, **kw, rotary=(cos, sin), rotary_interleaved=interleaved)
        o_plain = tilecore.attention(q, k, v, **kw)
    ro, _ = rotary_attention_reference(q.double(), k.double(), v.double(), cos, sin, interleaved=interleaved,
                                       causal=causal, window_size=window)
    rp, _ = attention_reference(q.double(), k.double(), v.double(), causal=causal, window_size=window)
    c = check(o_new, ro, tol=2.5)
    cp = check(o_pass, ro, tol=2.5)
    run.row(f"ocheck {name}", kind="ocheck", ok=bool(c["pass"] and same_bits(o_new, o_new2)),
            new_o=c.get("err_over_floor"),
            pass_o=cp.get("err_over_floor"), plain_o=check(o_plain, rp).get("err_over_floor"), written=c["written"],
            same=same_bits(o_new, o_pass), repeat=same_bits(o_new, o_new2), steps=steps, lead=lead, items=taken,
            window=list(window))


def overlap_taken(q, k, causal, window):
    """Whether gluon_forward's forward takes the K items for this call (its own test: a configuration that restarts
    the pipeline at each tile, and a table), read inside the caller's patched block."""
    from tilecore.ops.attention.plan import plan_forward
    from tilecore.ops.attention_rotary.plan import rotary_overlap_schedule

    if q.device.type != "cuda":
        return None
    windowed = tuple(window) != (-1, -1)
    cfg = attention_configs.gluon_forward_config(q.shape[3], q.shape[2], k.shape[2], causal and not windowed)
    if cfg.get("carry"):
        return False
    p = plan_forward(q, k, k, causal, q.shape[3] ** -0.5, path="gluon", config=cfg, window=window)
    return rotary_overlap_schedule(q, k, p.config, causal, p.sizes["head_group"], p.grid[0]) is not None


def overlap_timing(run, d, causal, variants, b=16, h=16, n=4096, rounds=3, train=False, bwd=False):
    """GPU time (CUDA graphs, interleaved rounds), B16 H16 N4096 bf16, bf16 tables: the no-grad forward, plain / as
    shipped (K by the pass) / K turned inside the launch (per variant steps:lead); train: the forward recording a
    gradient too (plain / shipped / inside)."""
    q, k, v = (torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    cos, sin = tables(n, d // 2, torch.bfloat16)

    def call(grad, rot, ctx=contextlib.nullcontext):
        def f():
            with ctx(), (contextlib.nullcontext() if grad else torch.no_grad()):
                tilecore.attention(q, k, v, causal=causal, rotary=rot)
        return f

    # the shipped route unpatched: a graph captured in a patched block plans causal launches round-robin (the
    # balanced table is keyed on switches.generation, new in each block; session 42 run 1's causal "shipped" was so)
    fns = {"fwd_plain": call(False, None), "fwd_shipped": call(False, (cos, sin))}
    for s_, l_ in variants:
        fns[f"fwd_in_{s_}_{l_}"] = call(False, (cos, sin), lambda s_=s_, l_=l_: overlap_path(s_, l_))
    if train:
        fns.update(tfwd_plain=call(True, None), tfwd_shipped=call(True, (cos, sin)),
                   tfwd_in=call(True, (cos, sin), lambda: overlap_path(*variants[0])))
    if bwd:
        g = torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16)

        def fwdbwd(rot, ctx=contextlib.nullcontext):
            def f():
                with ctx():
                    torch.autograd.grad(tilecore.attention(q, k, v, causal=causal, rotary=rot), (q, k, v), g)
            return f

        fns.update(bwd_plain=fwdbwd(None), bwd_shipped=fwdbwd((cos, sin)),
                   bwd_in=fwdbwd((cos, sin), lambda: overlap_path(*variants[0])))
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    ms = {name: t[f"{name}_graph_ms"] for name in fns if f"{name}_graph_ms" in t}
    over = {f"{name}_over": round(100 * (ms[name] / ms[name.split("_")[0] + "_plain"] - 1), 2)
            for name in ms if not name.endswith("_plain")}
    run.row(f"otime D{d} {'causal' if causal else 'full'}", kind="otime", d=d, causal=causal,
            **{f"{k_}_ms": round(v_, 4) for k_, v_ in ms.items()}, **over,
            rounds={name: t[f"{name}_rounds"]["graph"] for name in fns})


# (session 43) the no-grad forward's routes by name: the call's rotary tables or none, and the configs patched
AB_VARIANTS = {
    "plain": (False, {}),
    "shipped": (True, {}),
    "pass": (True, dict(ROTARY_K_OVERLAP_CASES=frozenset(), ROTARY_IN_KERNEL_CASES=ALL_CASES)),
    "items": (True, dict(ROTARY_K_OVERLAP_CASES=ALL_CASES, ROTARY_IN_KERNEL_CASES=ALL_CASES)),
}
# (session 43's calls 1-2 also timed "items_regs", the items through registers (configs.ROTARY_K_ITEM_BY_REGISTERS,
# the only form since), against the items turned in place and TMA-stored, and "items_regs_c25", an item step
# dealt at 2.5 attention steps: notes/rotary)


def ab_calls(d, causal, b=16, h=16, n=4096, train=False):
    """{variant: (call, its configs)}: the no-grad forward at B16 H16 N4096 bf16, bf16 tables; ``train``: forward +
    backward (autograd.grad of q, k, v) instead."""
    if SMOKE:  # the interpreter: a tiny shape
        b, h, n = 1, 2, 64
    q, k, v = (torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16, requires_grad=train) for _ in range(3))
    g = torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16)
    cos, sin = tables(n, d // 2, torch.bfloat16)

    def call(rot):
        def f():
            if train:
                out = tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin) if rot else None)
                torch.autograd.grad(out, (q, k, v), g)
                return
            with torch.no_grad():
                tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin) if rot else None)
        return f

    return {name: (call(rot), values) for name, (rot, values) in AB_VARIANTS.items()}, (q, k)


def ab_timing(run, d, causal, names, rounds=3, train=False):
    """GPU time from CUDA graphs of the no-grad forward's routes ``names`` (AB_VARIANTS), interleaved rounds (the order
    reversed every other round). Each graph is captured inside the same patched block as an eager call before it,
    so that every table the plan uploads (the causal balanced schedule, the K items' table) is the block's own and
    the graph runs the plan of its label (session 42's artefact: a table keyed on switches.generation, new in each
    block, cannot be uploaded while capturing, and the launch falls back to round-robin); ``items`` records
    whether each variant's launch took the K items there."""
    from experiments.common.gpu_script import graph_ms

    calls, (q, k) = ab_calls(d, causal, train=train)
    per = {name: [] for name in names}
    taken = {}
    for r in range(rounds):
        if r > 0 and run.left() < 6:
            break
        for name in (names if r % 2 == 0 else names[::-1]):
            f, values = calls[name]
            with patched(configs, **values):
                f()
                sync()
                taken[name] = overlap_taken(q.detach(), k.detach(), causal, (-1, -1)) if AB_VARIANTS[name][0] else False
                per[name].append(round(graph_ms(f) or 0.0, 5) if not SMOKE else 1.0)
    ms = {name: statistics.median(v) for name, v in per.items()}
    run.row(f"ab{' train' if train else ''} D{d} {'causal' if causal else 'full'}", kind="ab", d=d, causal=causal,
            train=train,
            **{f"{name}_ms": round(v, 4) for name, v in ms.items()},
            **{f"{name}_over": round(100 * (ms[name] / ms["plain"] - 1), 2) for name in ms if name != "plain"},
            items_taken=taken, rounds=per)


NCU_METRICS = ["gpu__time_duration.sum", "sm__cycles_active.avg", "sm__cycles_active.max", "sm__cycles_active.min",
               "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
               "lts__t_sectors.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
               "lts__t_sectors_op_atom.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
NCU_KERNELS = "regex:attention_fwd_kernel|attention_rotary_fwd_kernel"  # the forward's launch of each route


def ncu_plan(cases, names):
    """The profiled launches, in order: (case, variant), one forward launch each (the pass route's rotary_kernel
    before it is not profiled)."""
    return [(case, name) for case in cases for name in names]


def ncu_target(cases, names):
    """One call of each case's routes, each inside its patched block (the kernels compiled by the phases before: the
    Triton cache), each profiled by ncu."""
    for case in cases:
        d, mask = case.split(":")
        calls, _ = ab_calls(int(d), mask == "causal")
        for name in names:
            f, values = calls[name]
            with patched(configs, **values):
                f()
        sync()


def ncu_phase(run, cases, names):
    """Nsight Compute on one launch of each route's kernels (ncu_plan): time, the SMs' active cycles (the spread of
    max and min over the mean: the programs' imbalance), tensor pipe, L2 and DRAM traffic, L2 atomics (the items'
    counters: one a tile and per item, more where a tile's producer spins on its head), shared-memory bank
    conflicts, instructions."""
    import re
    import subprocess

    from experiments.common.nsight import ncu_binary

    order = ncu_plan(cases, names)
    cmd = [ncu_binary(), "--clock-control", "none", "--print-units", "base", "--metrics", ",".join(NCU_METRICS),
           "-k", NCU_KERNELS, "--launch-count", str(len(order)), sys.executable,
           __file__, "--ncu-target", ",".join(cases), "--ab-variants", ",".join(names)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=max(20, int(run.left()) - 5))
    text = res.stdout + res.stderr
    blocks, cur = [], None
    for line in text.splitlines():
        if re.match(r"^\s*\S+.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line):
            cur = {"kernel": line.strip().split()[0]}
            blocks.append(cur)
            continue
        parts = line.split()
        if cur is not None and len(parts) >= 2 and parts[0] in NCU_METRICS:
            try:
                cur[parts[0]] = float(parts[-1].replace(",", ""))
            except ValueError:
                pass
    if len(blocks) != len(order):
        run.errors.append(f"ncu: {len(blocks)} kernels profiled, {len(order)} expected; tail: {text[-1500:]}")
    short = {"gpu__time_duration.sum": "us", "sm__cycles_active.avg": "act_avg", "sm__cycles_active.max": "act_max",
             "sm__cycles_active.min": "act_min", "lts__t_sector_hit_rate.pct": "l2_hit",
             "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
             "lts__t_sectors.avg.pct_of_peak_sustained_elapsed": "l2_pct", "dram__bytes_read.sum": "dram_rd_mb",
             "dram__bytes_write.sum": "dram_wr_mb", "lts__t_sectors_op_atom.sum": "l2_atoms",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct"}
    for (case, name), blk in zip(order, blocks):
        row = {}
        for m, v in blk.items():
            if m in short:
                key = short[m]
                if key == "us":
                    v = v / 1e3
                elif key.endswith("_mb"):
                    v = v / 1e6 * (32 if key.startswith("l2_") else 1)
                row[key] = round(v, 4)
        if "act_avg" in row and row["act_avg"]:
            row["act_spread"] = round((row.get("act_max", 0) - row.get("act_min", 0)) / row["act_avg"], 4)
        run.row(f"ncu {case} {name}", kind="ncu", kernel=blk["kernel"], **row)


def overlap_one_sm(run, steps, lead, nk=65536, d=128, rounds=3):
    """The K items' rate on one SM: B1 H1, one tile of 128 queries over nk keys, launched on one program
    (sm_margin: the SMs less one), plain against K turned inside (nk / (2 block_n steps) items, then the tile):
    the difference is the items' time there, and 2 x K's bytes over it one program's turn rate."""
    q = torch.randn(1, 1, 128, d, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1, nk, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = tables(nk, d // 2, torch.bfloat16)
    margin = torch.cuda.get_device_properties(0).multi_processor_count - 1

    def call(rot, ctx=contextlib.nullcontext):
        def f():
            with ctx(), torch.no_grad():
                tilecore.attention(q, k, v, rotary=rot, sm_margin=margin)
        return f

    fns = {"one_plain": call(None), "one_in": call((cos, sin), lambda: overlap_path(steps, lead))}
    for f in fns.values():
        f()
    sync()
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    ms = {name: t[f"{name}_graph_ms"] for name in fns}
    items_ms = ms["one_in"] - ms["one_plain"]
    run.row(f"one SM nk{nk}", kind="one_sm", **{f"{k_}_ms": round(v_, 4) for k_, v_ in ms.items()},
            items_ms=round(items_ms, 4), sm_gbs=round(2 * k.numel() * k.element_size() / 1e6 / items_ms, 2),
            rounds={name: t[f"{name}_rounds"]["graph"] for name in fns})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--dims", default="", help="timing (forward, training forward, forward + backward) at these D")
    ap.add_argument("--masks", default="full,causal")
    ap.add_argument("--checks", default="", help="checks: D:full (half-split), D:causal (interleaved)")
    ap.add_argument("--kpass", action="store_true")
    ap.add_argument("--fwd-only", action="store_true")
    ap.add_argument("--shipped", action="store_true", help="timing of the shipped routes alone (final figures)")
    ap.add_argument("--routed", action="store_true", help="timing of the no-grad forward by gluon_forward against the "
                    "turned forward (configs.ROTARY_IN_KERNEL_CASES per case)")
    ap.add_argument("--overlap-checks", default="", help="K turned inside the launch, checked: D:full, D:causal "
                    "(interleaved, GQA 8/2, N 300 < Nk 700), D:causal4096 (interleaved, B1 H2 N4096)")
    ap.add_argument("--overlap", default="", help="timing of the no-grad forward with K turned inside at these D")
    ap.add_argument("--variants", default="8:2", help="steps:lead of the K items (configs.ROTARY_K_OVERLAP_*)")
    ap.add_argument("--train", action="store_true", help="--overlap: the training forward too")
    ap.add_argument("--bwd", action="store_true", help="--overlap: forward + backward too")
    ap.add_argument("--checks-overlap", action="store_true", help="--checks: the new path with K turned inside")
    ap.add_argument("--checks-no-overlap", action="store_true", help="--checks: the new path with K by the pass")
    ap.add_argument("--one-sm", action="store_true", help="the K items' turn rate on one SM (overlap_one_sm)")
    ap.add_argument("--ab", default="", help="D:mask,..: the no-grad forward's routes (--ab-variants) timed, each "
                    "graph captured in its own patched block (ab_timing)")
    ap.add_argument("--ab-variants", default="plain,shipped,pass,items")
    ap.add_argument("--ncu", default="", help="D:mask,..: Nsight Compute on the --ab-variants routes' kernels")
    ap.add_argument("--ncu-variants", default="plain,pass,items")
    ap.add_argument("--ncu-target", default="", help="(what ncu runs; its routes by --ab-variants)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=56.0)
    a = ap.parse_args()
    torch.manual_seed(0)
    names = [x for x in a.ab_variants.split(",") if x]
    if a.ncu_target:
        return ncu_target([x for x in a.ncu_target.split(",") if x], names)
    run = Run("gpu_rotary_train", deadline=a.deadline)
    if SMOKE:  # the checks' code on the CPU path (composite; the switch has no effect there)
        run.attempt("smoke", checks, run, "smoke", 1, 2, 1, 24, 40, 32, 8, True, True, torch.float16)
        run.attempt("smoke overlap", overlap_checks, run, "smoke", 1, 2, 1, 24, 40, 32, True, True, 8, 2.0)
        run.attempt("smoke window", overlap_checks, run, "smoke window", 1, 4, 2, 40, 40, 32, True, True, 8, 2.0,
                    window=(16, 0))
        run.attempt("smoke ab", ab_timing, run, 32, True, ["plain", "shipped", "pass", "items"], rounds=2)
        run.attempt("smoke ab train", ab_timing, run, 32, True, ["plain", "items"], rounds=1, train=True)
        assert len(ncu_plan(["128:full", "128:causal"], ["plain", "pass", "items"])) == 6
        ncu_target(["32:causal"], ["plain", "items"])
        run.finish(["name", "ok", "same", "same_qk", "new_dq", "new_dk", "plain_dk"])
        return
    variants = [(int(x.split(":")[0]), float(x.split(":")[1])) for x in a.variants.split(",") if x]
    if a.checks_overlap or a.checks_no_overlap:
        CHECK_OVERLAP.append(bool(a.checks_overlap))
    for case in filter(None, a.checks.split(",")):  # D:mask[:N] (N 4096 by default; short N: the carried kernel)
        d, mask, *n = case.split(":")
        d, causal, n = int(d), mask == "causal", int(n[0]) if n else 4096
        run.attempt(f"check {case}", checks, run, f"D{d} {mask}{' inter' if causal else ''} N{n}", 1, 2, 2, n, n,
                    d, d // 2, causal, causal)
    for case in filter(None, a.overlap_checks.split(",")):
        d, mask = case.split(":")
        d = int(d)
        shape = (1, 2, 2, 4096, 4096) if mask != "causal" else (2, 8, 2, 300, 700)
        window = (-1, -1)
        if mask == "causal4096":
            shape = (1, 2, 2, 4096, 4096)
        if mask.startswith("window"):  # windowW: causal with the window (W, 0), GQA 4/2 N 4096, half-split
            shape, window = (1, 4, 2, 4096, 4096), (int(mask[6:] or 512), 0)
        run.attempt(f"ocheck {case}", overlap_checks, run, f"D{d} {mask}", *shape, d, mask != "full",
                    mask != "full" and window == (-1, -1), *variants[0], window=window)
    if a.one_sm:
        run.attempt("one SM", overlap_one_sm, run, *variants[0])
    for case in filter(None, a.ab.split(",")):  # before ncu: its process finds these kernels compiled
        d, mask, *mode = case.split(":")  # D:mask[:train]: forward + backward
        if run.left() < 15:
            run.errors.append(f"ab {case}: skipped (deadline)")
            continue
        run.attempt(f"ab {case}", ab_timing, run, int(d), mask == "causal", names, rounds=a.rounds,
                    train=mode == ["train"])
    if a.ncu:
        run.attempt("ncu", ncu_phase, run, [x for x in a.ncu.split(",") if x],
                    [x for x in a.ncu_variants.split(",") if x])
    for d in [int(x) for x in a.overlap.split(",") if x]:
        for mask in a.masks.split(","):
            if run.left() < 15:
                run.errors.append(f"otime D{d} {mask}: skipped (deadline)")
                continue
            run.attempt(f"otime D{d} {mask}", overlap_timing, run, d, mask == "causal", variants, rounds=a.rounds,
                        train=a.train, bwd=a.bwd)
    if a.kpass:
        run.attempt("kpass", kpass, run)
    for d in [int(x) for x in a.dims.split(",") if x]:
        for mask in a.masks.split(","):
            if run.left() < 12:
                run.errors.append(f"time D{d} {mask}: skipped (deadline)")
                continue
            run.attempt(f"time D{d} {mask}", timing, run, d, mask == "causal", rounds=a.rounds,
                        fwd_only=a.fwd_only, shipped=a.shipped, routed=a.routed)
    run.finish(["name", "ok", "items", "same", "repeat", "new_o", *[f"{x}_over" for x in names if x != "plain"],
                "plain_ms", "us", "act_spread", "tensor_pct", "l2_pct", "l2_hit", "dram_rd_mb", "dram_wr_mb", "l2_atoms", "pass_o", "plain_o", "fwd_plain_ms", "fwd_shipped_over", "items_ms", "sm_gbs",
                *[f"fwd_in_{s_}_{l_}_over" for s_, l_ in variants], "tfwd_shipped_over", "tfwd_in_over", "bwd_shipped_over", "bwd_in_over",
                "same_qk", "same_olse", "new_dq", "new_dk", "new_dv", "plain_dk",
                "pass_of_copy", "hm_of_copy", "hm_same", "pass_ms", "copy_ms", "fwd_over", "fwd_inkernel_over",
                "fwd_turned_over", "tfwd_turned_over", "tfwd_new_over", "bwd_plain_ms", "bwd_over", "bwd_turned_over",
                "bwd_new_over"])


if __name__ == "__main__":
    main()

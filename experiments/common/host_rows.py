"""The eager rows still over issue 31's 40 us of host time a call (session 34 call 1, runs/host_confirm34_run1), timed
and profiled on the GPU's host: where each call's host time goes, for the next cuts.

    python experiments/common/host_rows.py [--rows all|every|NAME,NAME] [--calls 300] [--rounds 3] [--profile 300]
                                           [--deadline 55]

For each row (host_time.py's cases: the same small inputs and torch peers): the first call (compiles, plans), the
same bits on calls 1..10 (host_time.same_bits_later, forward rows), then ``--rounds`` interleaved rounds of
``--calls`` back-to-back calls, ours then torch's (medians, us a call), then a cProfile over ``--profile`` calls (the
top functions by own time, us a call: cProfile's overhead inflates them, read them as shares). Stops starting rows
at ``--deadline`` seconds. Writes $OUT/host_rows.json after each row (gpu_script.Run: "rows" a list of rows, each
with its name; "ab" the A/B rows; device, versions and date in "meta"); prints a short table last.

--ab-rows NAME,NAME (first): those rows with tiles.launch.OP_RECIPES on and off (keep_op_recipes), ``--ab-rounds``
interleaved rounds (the order alternating), medians; the outputs of the recipe's calls (on) against the general
path's (off), bit for bit, and calls 1..10 with it on. Session 35: hadamard_quantize's per-key recipe.
--ab-switch MODULE:NAME: that module switch in place of OP_RECIPES (tilecore.tiles.switches.patched), e.g.
tilecore.ops.fft_conv.op:RECORDED_RECIPES (session 36).
--ab "ROW@MODULE:NAME" (repeatable, session 39): that row A/B'd by that switch, each with its own (e.g. the norm's
recorded recipe, tilecore.ops.norm.op:RECORDED_RECIPES, on "rms_norm (grad recorded)" and on the fwd+bwd row).
--split: fft_conv's plain eager call taken apart on this host (split_fft_conv: the whole call, the call given the
spectrum, the padding cat, the rfft, the memo, the mode, a plan-cache lookup, the allocation), each part alone.
--checks (session 41): float64 checks of the rows RAW_SCRATCH changes, on and off (switch_checks), before anything is
timed. --hold MODULE:NAME=on|off (repeatable): that switch held for the whole run (a flip's figures before it ships).
--parts (session 41): what an autograd Function's apply costs on this host by its arguments and saved tensors
(split_apply: attention's recorded call applies 10 arguments and saves 5 tensors), and the pieces of the rows' host
paths (an internal buffer as a tensor or a raw block of the caching allocator, tile_counter, eager_mode), each alone.

Rows beyond host_time.py's (extra_cases): "rms_norm fwd+bwd (grad recorded)" and "fft_conv fwd+bwd (grad recorded)",
the forward recording a gradient then torch.autograd.grad of both inputs (ours returns y and both gradients, so the
A/B's same-bits check reads them).
"""
import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import host_time  # noqa: E402 (the cases and the profiler: experiments/common/host_time.py)
from experiments.common.gpu_script import Run, same_bits  # noqa: E402

# session 34 call 1's rows over 40 us (us a call there: ours / torch's)
ROWS = ("fft_conv", "hadamard_quantize fp8", "attention N256", "attention N256 (grad recorded)",
        "rms_norm (grad recorded)", "linear_attention (grad recorded)", "fft_conv (grad recorded)",
        "attention_varlen 3 seqs", "paged decode")


def extra_cases() -> dict:
    """Rows host_time.py has not: name -> (ours, torch's), host_time's shapes and device."""
    import torch.nn.functional as F

    import tilecore
    bf = dict(device=host_time.DEV[0], dtype=torch.bfloat16)
    gen = torch.Generator(device=host_time.DEV[0]).manual_seed(39)
    x = torch.randn(64, 4096, generator=gen, **bf).requires_grad_()
    w = torch.randn(4096, generator=gen, **bf).requires_grad_()
    gy = torch.randn(64, 4096, generator=gen, **bf)

    def ours():
        y = tilecore.layer_norm(x, w, rms=True)
        return (y, *torch.autograd.grad(y, (x, w), gy))

    def peer():
        y = F.rms_norm(x, (4096,), w)
        return (y, *torch.autograd.grad(y, (x, w), gy))

    # fft_conv's row shapes (host_time: u (2, 64, 1024) bf16, k (64, 1024) float32), u and k recording a gradient
    u = torch.randn(2, 64, 1024, generator=gen, **bf).requires_grad_()
    k = torch.randn(64, 1024, generator=gen, device=host_time.DEV[0]).requires_grad_()
    du = torch.randn(2, 64, 1024, generator=gen, **bf)

    def conv():
        y = tilecore.fft_conv(u, k)
        return (y, *torch.autograd.grad(y, (u, k), du))

    def conv_peer():
        n = 2 * u.shape[-1]
        y = torch.fft.irfft(torch.fft.rfft(u.float(), n) * torch.fft.rfft(k, n), n)[..., :u.shape[-1]].to(u.dtype)
        return (y, *torch.autograd.grad(y, (u, k), du))
    return {"rms_norm fwd+bwd (grad recorded)": (ours, peer), "fft_conv fwd+bwd (grad recorded)": (conv, conv_peer)}


def split_fft_conv(calls: int) -> dict:
    """fft_conv's plain eager row (host_time's u (2, 64, 1024) bf16, k (64, 1024) float32) taken apart, us a call, each
    part alone over ``calls`` back-to-back calls (synchronized before and after): the call; the call given the
    spectrum (no rfft of k); torch.cat of k with zeros (the recipe's padding), torch.fft.rfft of the padded filter and
    both; torch._fft_r2c of it (what rfft calls: the same bits?); the padding left to rfft (``rfft(k, n=2N)``) or to
    F.pad, and a bfloat16 k both ways (each against the cat's spectrum bit for bit); a SignatureMemo hit of (u, k);
    dispatch.eager_mode; an LRU lookup of the signature; u.new_empty. Public entry points only."""
    import tilecore
    from tilecore import dispatch
    from tilecore.tiles.launch import LRU, SignatureMemo, signature
    dev = host_time.DEV[0]
    gen = torch.Generator(device=dev).manual_seed(7)
    u = torch.randn(2, 64, 1024, generator=gen, device=dev).to(torch.bfloat16)
    k = torch.randn(64, 1024, generator=gen, device=dev)
    zeros = torch.zeros(64, 1024, device=dev)
    padded = torch.cat((k, zeros), 1)
    spectrum = tilecore.filter_spectrum(k, 1024)
    memo, lru = SignatureMemo(), LRU(256)
    key = memo(u, k)
    key = memo(u, k)  # (a signature seen twice: the entry kept)
    lru.put(signature(u, k), 1)
    k16 = k.to(torch.bfloat16)  # (a 16-bit filter: the cat promotes it to float32, rfft(n=) needs k.float() first)
    parts = {
        "call": lambda: tilecore.fft_conv(u, k),
        "call given the spectrum": lambda: tilecore.fft_conv(u, spectrum),
        "cat (padding)": lambda: torch.cat((k, zeros), 1),
        "rfft of the padded": lambda: torch.fft.rfft(padded),
        "cat + rfft": lambda: torch.fft.rfft(torch.cat((k, zeros), 1)),
        "_fft_r2c of the padded": lambda: torch._fft_r2c(padded, [1], 0, True),
        # (session 42: the filter's padding inside rfft, rfft(k, n=2N): torch pads by constant_pad_nd first)
        "rfft(k, n=2N)": lambda: torch.fft.rfft(k, n=2048),
        "pad + rfft": lambda: torch.fft.rfft(torch.nn.functional.pad(k, (0, 1024))),
        "bf16 k: cat + rfft": lambda: torch.fft.rfft(torch.cat((k16, zeros), 1)),
        "bf16 k: rfft(k.float(), n=2N)": lambda: torch.fft.rfft(k16.float(), n=2048),
        "memo hit (u, k)": lambda: memo(u, k),
        "eager_mode": lambda: dispatch.eager_mode(u, k),
        "LRU lookup": lambda: lru.get(key),
        "new_empty": lambda: u.new_empty(u.shape),
    }
    row = {"r2c_same_bits": same_bits(torch.fft.rfft(padded), torch._fft_r2c(padded, [1], 0, True)),
           "filter_spectrum_same_bits": same_bits(torch.fft.rfft(padded), spectrum),
           "rfft_n_same_bits": same_bits(torch.fft.rfft(k, n=2048), spectrum),
           "pad_same_bits": same_bits(torch.fft.rfft(torch.nn.functional.pad(k, (0, 1024))), spectrum),
           "bf16_same_bits": same_bits(torch.fft.rfft(torch.cat((k16, zeros), 1)),
                                       torch.fft.rfft(k16.float(), n=2048))}
    times = {name: [] for name in parts}
    for r in range(3):
        for name in (list(parts) if r % 2 == 0 else list(parts)[::-1]):
            times[name].append(round(host_time.per_call_us(parts[name], calls), 2))
    row.update({f"{name}_us": statistics.median(v) for name, v in times.items()})
    row["rounds_us"] = times
    return row


def split_apply(calls: int) -> dict:
    """An autograd Function's apply on this host, us a call, each form alone over ``calls`` back-to-back calls: the
    forward allocates O and lse as attention's recorded call does (the two allocations alone timed too) and returns
    O; forms: 10 arguments (attention's _AttentionOutFunction: q, k, v and 7 others) saving q, k, v, O, lse; 6
    arguments (a recipe, q, k, v, scale, softcap) saving the same; 6 saving 4 (lse kept as an attribute: it is no
    output, so no cycle); 6 without set_materialize_grads. q, k, v as the N256 row's (B1 H8 N256 D64 bf16, recording
    a gradient). torch.autograd.Function's own apply is not used (tiles.eager.apply, as the ops call it)."""
    from tilecore.tiles import eager as tiles_eager
    dev = host_time.DEV[0]
    q, k, v = (torch.randn(1, 8, 256, 64, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))

    def outputs(q):
        return q.new_empty((1, 8, 256, 64)), q.new_empty((1, 8, 256), dtype=torch.float32)

    def form(arity: int, saved: int, lean_grads: bool = True):
        """A Function of ``arity`` arguments (q, k, v last but ``arity`` - 4 ... as attention's: q first of 10, second
        of 6) allocating O and lse, saving the first ``saved`` of (q, k, v, O, lse) (lse an attribute where 4), with
        set_materialize_grads(False) where ``lean_grads``."""
        first = 0 if arity == 10 else 1

        def forward(ctx, *inputs):
            q, k, v = inputs[first:first + 3]
            out, lse = outputs(q)
            if lean_grads:
                ctx.set_materialize_grads(False)
            ctx.save_for_backward(*(q, k, v, out, lse)[:saved])
            ctx.kept = (lse, inputs[first + 3:])
            return out
        return type(f"Form{arity}x{saved}", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(lambda ctx, dout: (None,) * arity)})

    ten, six, six_four, six_materialized = form(10, 5), form(6, 5), form(6, 4), form(6, 5, lean_grads=False)
    key = ("forward_recorded", (q.shape, q.stride(), q.dtype, q.device, True))
    from tilecore import dispatch
    from tilecore.tiles import launch as tiles_launch
    raw_alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
    raw_delete = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    device = q.device
    small = [t.detach() for t in (q, k, v)] + [torch.zeros(4, dtype=torch.int32, device=dev)] * 2
    parts = {
        "two allocations": lambda: outputs(q),
        # (an internal buffer's ways: a tensor allocated and freed, or the caching allocator's raw block)
        "new_empty 4 MiB float32 (and its free)": lambda: q.new_empty((1 << 20,), dtype=torch.float32),
        "tile_counter": lambda: tiles_launch.tile_counter(device),
        "interpreter_enabled": dispatch.interpreter_enabled,
        "eager_mode of 5 tensors": lambda: dispatch.eager_mode(*small),
        "apply 10 args, save 5": lambda: tiles_eager.apply(ten, q, k, v, False, 0.125, (-1, -1), 0.0, key, 0, None),
        "apply 6 args, save 5": lambda: tiles_eager.apply(six, key, q, k, v, 0.125, 0.0),
        "apply 6 args, save 4": lambda: tiles_eager.apply(six_four, key, q, k, v, 0.125, 0.0),
        "apply 6 args, save 5, grads materialized": lambda: tiles_eager.apply(six_materialized, key, q, k, v, 0.125, 0.0),
    }
    if raw_alloc is not None and raw_stream is not None and dev != "cpu":
        index = torch.cuda.current_device()
        parts["raw alloc + delete 4 MiB"] = lambda: raw_delete(raw_alloc(4 << 20, raw_stream(index)))
        parts["raw stream"] = lambda: raw_stream(index)
    times = {name: [] for name in parts}
    for r in range(5):
        for name in (list(parts) if r % 2 == 0 else list(parts)[::-1]):
            times[name].append(round(host_time.per_call_us(parts[name], calls), 2))
    row = {f"{name}_us": statistics.median(v) for name, v in times.items()}
    row["rounds_us"] = times
    return row


def switch_checks() -> list:
    """Float64 checks of what this session's switch changes (session 41), on and off in one process: the calls after a
    key's first (its recipe's, where the launches go the kept way), against the op's float64 reference
    (gpu_script.check: the error as a multiple of the rounding floor, every element written, NaN / inf as the
    reference's), and the same bits on vs off. RAW_SCRATCH: paged decode (O alone: the merged lse in the raw block),
    varlen (O alone: lse in the work table's block), attention's split-key decode at N256 (O alone). A row passes where
    the switch on changes nothing the reference sees: every element written, each output the off side's bits; each
    check's own pass (error <= 2.5x the floor) is reported beside. Session 42: the norms' plain calls by STATS_SCRATCH
    (mean and rstd, which they return neither of, in one raw block; norm.launch): layer_norm and rms_norm (64 x 4096, whole rows)
    and layer_norm at 8 x 16384 (the stats kernel, then the forward reading them); mamba2_step by MAMBA_STEP_SCRATCH
    (linear_attention.op: dt_eff and g in one raw block), y and its updated state. Session 44: hadamard_transform's
    per-key recipe by OP_RECIPES (hadamard.op._TlTransform) at three shapes, and apply_rotary's (rotary.op._RotaryLaunch)."""
    import tilecore
    from tilecore.ops.attention import attention_reference
    from tilecore.ops.attention_kvcache import kvcache_reference
    from tilecore.ops.attention_varlen import varlen_reference
    from tilecore.tiles.switches import patched
    from experiments.common.gpu_script import check
    from tilecore.tiles import launch as tiles_launch
    dev = host_time.DEV[0]
    gen = torch.Generator(device=dev).manual_seed(41)
    bf = dict(device=dev, dtype=torch.bfloat16)
    rows = []

    def both(name, module, switch, call, ref):
        try:
            checked(name, module, switch, call, ref)
        except Exception as err:  # noqa: BLE001 (a row's failure is its result; the others go on)
            rows.append({"name": name, "switch": switch, "error": f"{type(err).__name__}: {err}"[:400], "pass": False})

    def checked(name, module, switch, call, ref):
        outs = {}
        for on in (True, False):
            with patched(module, **{switch: on}):
                for _ in range(3):  # (the key's first call plans; the later ones take the recipe)
                    got = call()
            outs[on] = [t.detach().clone() for t in got]
        row = {"name": name, "switch": switch, "same_bits_on_vs_off": [bool(same_bits(a, b))
                                                                       for a, b in zip(outs[True], outs[False])]}
        for on in (True, False):
            checks = [check(a, r) for a, r in zip(outs[on], ref)]
            row["on" if on else "off"] = [{k: c.get(k) for k in ("err_over_floor", "written", "pass")} for c in checks]
        # (the switch passes where it changes nothing the reference sees: every element written, the off side's bits)
        row["pass"] = all(a["written"] and same for a, same in zip(row["on"], row["same_bits_on_vs_off"]))
        rows.append(row)

    # paged decode (B4 Hq32 Hkv8 D128, pages 64 x 64), O alone
    pages = torch.randperm(64, generator=torch.Generator().manual_seed(1)).to(dev).reshape(4, 16).to(torch.int32)
    kc, vc = (torch.randn(64, 64, 8, 128, generator=gen, **bf) for _ in range(2))
    lengths = torch.tensor([1000, 613, 1024, 77], dtype=torch.int32, device=dev)
    qd = torch.randn(4, 1, 32, 128, generator=gen, **bf)
    ref, _ = kvcache_reference(qd.double(), kc.double(), vc.double(), lengths, block_table=pages)
    both("paged decode", tiles_launch, "RAW_SCRATCH",
         lambda: [tilecore.attention_with_kvcache(qd, kc, vc, cache_seqlens=lengths, block_table=pages)], [ref])
    # varlen, 3 sequences, causal, O alone
    lens = torch.tensor([0, 100, 312, 636], dtype=torch.int32, device=dev)
    qv, kv, vv = (torch.randn(636, 8, 64, generator=gen, **bf) for _ in range(3))
    ref, _ = varlen_reference(qv.double(), kv.double(), vv.double(), lens, lens, causal=True)
    both("attention_varlen 3 seqs", tiles_launch, "RAW_SCRATCH",
         lambda: [tilecore.attention_varlen(qv, kv, vv, lens, lens, 324, 324, causal=True)], [ref])
    # attention's split-key decode (N256, 8 heads), O alone
    qs, ks, vs = (torch.randn(1, 8, 256, 64, generator=gen, **bf) for _ in range(3))
    ref, _ = attention_reference(qs.double(), ks.double(), vs.double())
    both("attention N256", tiles_launch, "RAW_SCRATCH", lambda: [tilecore.attention(qs, ks, vs)], [ref])
    # (session 42) the norms' plain calls: mean and rstd in the raw block; rows of 16384 take the stats kernel first
    from tilecore.ops.linear_attention import op as la_op
    from tilecore.ops.norm import launch as norm_launch, layer_norm_reference
    for name, (m, n), rms in (("layer_norm", (64, 4096), False), ("rms_norm", (64, 4096), True),
                              ("layer_norm two passes", (8, 16384), False)):
        x = torch.randn(m, n, generator=gen, **bf)
        w, b = torch.randn(n, generator=gen, **bf), (None if rms else torch.randn(n, generator=gen, **bf))
        ref, _ = layer_norm_reference(x.double(), w.double(), None if b is None else b.double(), rms=rms)
        both(name, norm_launch, "STATS_SCRATCH",
             lambda x=x, w=w, b=b, rms=rms: [tilecore.layer_norm(x, w, b, rms=rms)], [ref])
    # (session 42) mamba2_step (host_time's B4 H32 P64 N128): dt_eff and g in the raw block; y and the state it updates
    # in place (reset before each call) against mamba_ssm's selective_state_update in float64
    xm = torch.randn(4, 32, 64, generator=gen, **bf)
    dtm, am = torch.rand(4, 32, generator=gen, device=dev), -torch.rand(32, generator=gen, device=dev)
    bm, cm = (torch.randn(4, 1, 128, generator=gen, **bf) for _ in range(2))
    s0 = torch.randn(4, 32, 64, 128, generator=gen, device=dev)
    s = s0.clone()
    da = torch.exp(dtm.double() * am.double())[..., None, None]
    s_ref = s0.double() * da + (dtm.double()[..., None] * xm.double())[..., None] * bm.double()[:, :, None, :]
    y_ref = torch.einsum("bhps,bgs->bhp", s_ref, cm.double())
    both("mamba2_step", la_op, "MAMBA_STEP_SCRATCH",
         lambda: [tilecore.mamba2_step(s.copy_(s0), xm, dtm, am, bm, cm), s], [y_ref, s_ref])
    # (session 44) hadamard_transform's per-key recipe (op._TlTransform, under OP_RECIPES): the host row's 64 x 4096,
    # a 3-D input and rows of a wider tensor (a row stride of their own), each with a scale
    from tilecore.ops.hadamard import hadamard_matrix
    for name, xh, scale in (("hadamard 64 x 4096", torch.randn(64, 4096, generator=gen, **bf), 1.0),
                            ("hadamard 3 x 21 x 1024", torch.randn(3, 21, 1024, generator=gen, **bf), 2 ** -5),
                            ("hadamard rows of 2048 in 4096", torch.randn(48, 4096, generator=gen, **bf)[:, :2048], 0.75)):
        ref = xh.double() @ hadamard_matrix(xh.shape[-1], torch.float64).to(dev).T * scale
        both(name, tiles_launch, "OP_RECIPES", lambda xh=xh, scale=scale: [tilecore.hadamard_transform(xh, scale)], [ref])
    # (session 44) apply_rotary's per-key recipe (rotary.op._RotaryLaunch, under OP_RECIPES): half-split with position_ids
    # (features past rotary_dim copied), interleaved, and a head-major view (the BLOCK_T tiles)
    from tilecore.ops.rotary.reference import rotary_reference
    cr, sr = torch.randn(2048, 32, generator=gen, device=dev), torch.randn(2048, 32, generator=gen, device=dev)
    posr = torch.randint(0, 2048, (2, 512), generator=gen, device=dev)
    for name, xr, pos, inter in (("apply_rotary positions, D 128 rotary_dim 64", torch.randn(2, 512, 8, 128, generator=gen, **bf), posr, False),
                                 ("apply_rotary interleaved", torch.randn(2, 512, 8, 64, generator=gen, **bf), None, True),
                                 ("apply_rotary head-major", torch.randn(2, 8, 512, 64, generator=gen, **bf).transpose(1, 2), None, False)):
        ref = rotary_reference(xr.double(), cr.double(), sr.double(), interleaved=inter, position_ids=pos)
        both(name, tiles_launch, "OP_RECIPES", lambda xr=xr, pos=pos, inter=inter:
             [tilecore.apply_rotary(xr, cr, sr, position_ids=pos, interleaved=inter)], [ref])
    return rows


def _tensors(y):
    ys = y if isinstance(y, (tuple, list)) else (y,)
    out = []
    for t in ys:
        if isinstance(t, (tuple, list)):
            out += _tensors(t)
        elif isinstance(t, torch.Tensor):
            out.append(t.detach().clone())
    return out


def switch_setter(spec: str):
    """(set(on), restore()) for --ab-switch MODULE:NAME (a with-block of switches.patched held open), or for
    OP_RECIPES where ``spec`` is empty."""
    from tilecore.tiles import launch as tiles_launch
    from tilecore.tiles.switches import patched

    if not spec:
        return tiles_launch.keep_op_recipes, lambda: tiles_launch.keep_op_recipes(True)
    module_name, name = spec.split(":")
    module = importlib.import_module(module_name)
    held = []

    def restore():
        while held:
            held.pop().close()

    def set_(on: bool):
        restore()
        stack = contextlib.ExitStack()
        stack.enter_context(patched(module, **{name: on}))
        held.append(stack)
    return set_, restore


def ab_recipes(name, ours, peer, rounds, calls, switch: str = "") -> dict:
    """OP_RECIPES (or ``switch``, MODULE:NAME) on vs off for one row: medians over interleaved rounds, and the same
    bits both ways."""
    keep, restore = switch_setter(switch)
    row = {}
    try:
        keep(False)
        host_time.RESETS.get(name, lambda: None)()
        off = _tensors(ours())
        keep(True)
        ons = []
        for _ in range(10):  # the key's first call with the switch on makes the recipe; the rest use it
            host_time.RESETS.get(name, lambda: None)()
            ons.append(_tensors(ours()))
        row["same_bits_on_vs_off"] = same_bits(ons[-1], off)
        row["same_bits_calls_1_10_on"] = all(same_bits(o, ons[0]) for o in ons[1:])
        t = {"on": [], "off": [], "torch": []}
        for r in range(rounds):
            for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
                keep(setting == "on")
                t[setting].append(host_time.per_call_us(ours, calls))
            t["torch"].append(host_time.per_call_us(peer, calls))
        row["rounds_us"] = {k: [round(x, 1) for x in v] for k, v in t.items()}
        row.update({f"{k}_us": round(statistics.median(v), 1) for k, v in t.items()})
    except Exception as err:  # noqa: BLE001
        row["error"] = f"{type(err).__name__}: {err}"[:400]
    finally:
        restore()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="all")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=int, default=300)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--deadline", type=float, default=55.0)
    ap.add_argument("--ab-rows", default="", help="rows timed with OP_RECIPES on and off first (comma-separated)")
    ap.add_argument("--ab-rounds", type=int, default=5)
    ap.add_argument("--ab-switch", default="", help="MODULE:NAME: the switch --ab-rows time on and off (OP_RECIPES)")
    ap.add_argument("--ab", action="append", default=[], help="ROW@MODULE:NAME: that row A/B'd by that switch")
    ap.add_argument("--split", action="store_true", help="fft_conv's plain eager call taken apart (split_fft_conv)")
    ap.add_argument("--hold", action="append", default=[], metavar="MODULE:NAME=on|off",
                    help="a switch held for the whole run (tilecore.tiles.switches.patched), e.g. a flip not yet shipped")
    ap.add_argument("--checks", action="store_true", help="float64 checks of the session's switches (switch_checks)")
    ap.add_argument("--parts", action="store_true", help="an autograd Function's apply by its arguments (split_apply)")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors, a few calls: the script's plumbing")
    a = ap.parse_args()
    if a.smoke:
        host_time.DEV[0] = "cpu"
        a.calls, a.rounds, a.profile = 3, 1, 3
    held = contextlib.ExitStack()
    for spec in a.hold:  # (entered first: every phase runs under them)
        from tilecore.tiles.switches import patched
        target, value = spec.split("=")
        module_name, name = target.split(":")
        held.enter_context(patched(importlib.import_module(module_name), **{name: value == "on"}))
    table = {**host_time.cases(), **host_time.later_cases(), **extra_cases()}
    # ("all": the rows once over 40 us; "every": those, then each other row of the table: issue 31's every op)
    names = ROWS if a.rows == "all" else tuple(dict.fromkeys([*ROWS, *(n for n in table if "dt:" not in n)])) \
        if a.rows == "every" else tuple(a.rows.split(","))
    run = Run("host_rows", deadline=a.deadline)
    run.extra.update(calls=a.calls, rounds=a.rounds, ab={}, held=a.hold)
    abs_ = [(r, a.ab_switch) for r in a.ab_rows.split(",") if r] + [tuple(spec.split("@")) for spec in a.ab]
    for name, switch in abs_:
        ours, peer = table[name]
        label = f"{name} [{switch.split(':')[-1]}]" if switch else name
        run.extra["ab"][label] = ab_recipes(name, ours, peer, 1 if a.smoke else a.ab_rounds, a.calls, switch)
        run.save()
        run.say(f"A/B {switch or 'OP_RECIPES'} {name}: {json.dumps(run.extra['ab'][label])}")
    if a.checks:
        try:
            run.extra["checks"] = switch_checks()
        except Exception as err:  # noqa: BLE001
            run.extra["checks"] = [{"error": f"{type(err).__name__}: {err}"[:400]}]
        run.save()
        for row in run.extra["checks"]:
            run.say("check " + json.dumps(row))
    for wanted, name, split in ((a.split, "split_fft_conv", split_fft_conv), (a.parts, "split_apply", split_apply)):
        if not wanted:
            continue
        try:
            run.extra[name] = split(a.calls)
        except Exception as err:  # noqa: BLE001
            run.extra[name] = {"error": f"{type(err).__name__}: {err}"[:400]}
        run.save()
        run.say(f"{name}, us a call: " + ", ".join(f"{k[:-3]} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in run.extra[name].items() if k != "rounds_us"))
    for name in names:
        if run.left() < 0:
            run.row(name, skipped="deadline")
            continue
        ours, peer = table[name]
        row = {}
        try:
            t0 = run.elapsed()
            host_time.RESETS.get(name, lambda: None)()
            ours()
            host_time.sync()
            row["first_call_s"] = round(run.elapsed() - t0, 3)
            if "grad" not in name:
                row["same_bits_calls_1_10"] = host_time.same_bits_later({name: table[name]})[name]
            rounds = []
            for _ in range(a.rounds):
                rounds.append((host_time.per_call_us(ours, a.calls), host_time.per_call_us(peer, a.calls)))
            row["rounds_us"] = [[round(x, 1), round(y, 1)] for x, y in rounds]
            row["ours_us"] = round(statistics.median(x for x, _ in rounds), 1)
            row["torch_us"] = round(statistics.median(y for _, y in rounds), 1)
            # (the rounds' spread, min-max: the host's phase moves a row's median as much as a cut does)
            row["ours_spread"] = f"{min(x for x, _ in rounds):.1f}-{max(x for x, _ in rounds):.1f}"
            row["torch_spread"] = f"{min(y for _, y in rounds):.1f}-{max(y for _, y in rounds):.1f}"
            row["profile"] = host_time.profile_rows({name: table[name]}, [name], a.profile, top=a.top)[name]
        except Exception as err:  # noqa: BLE001 (a row's failure is its result; the others go on)
            row["error"] = f"{type(err).__name__}: {err}"[:400]
        run.row(name, **row)
    # the profiles, three functions a row, then the table
    for row in run.rows:
        if isinstance(row.get("profile"), list):
            top = "; ".join(f"{fn.split(':')[-1]} {own:.1f}" for own, _, _, fn in row["profile"][:4])
            print(f"  {row['name'][:34]:34s} own us: {top}"[:160])
    for name, row in run.extra["ab"].items():
        if "error" in row:
            print(f"A/B {name}: ERROR {row['error'][:100]}")
        else:
            print(f"A/B {name}: on {row['on_us']:.1f} / off {row['off_us']:.1f} us (torch "
                  f"{row['torch_us']:.1f}), {row['on_us'] / row['off_us']:.2f}x; same bits on vs off "
                  f"{row['same_bits_on_vs_off']}, calls 1..10 {row['same_bits_calls_1_10_on']}")
    run.finish(["name", "ours_us", "ours_spread", "torch_us", "torch_spread", "first_call_s", "same_bits_calls_1_10",
                "error", "skipped"])


if __name__ == "__main__":
    main()

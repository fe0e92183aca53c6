"""GPU check and timing of attention_varlen's Gluon backward (gluon_varlen_backward.py; issue 35,
session 28), <= 90 s on an H100 including compiles.

    PYTHONPATH=. python3 experiments/attention/gpu_varlen_bwd.py                 # check, then time (--quick)
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/attention/gpu_varlen_bwd.py --smoke   # CPU: tiny shapes

check (bf16 / fp16 against float64, error as a multiple of the rounding floor): varlen.backward_gluon
    (the shipped fused dQ, and dq_from "gluon": dK/dV alone, then attention_varlen_dq_kernel)
    into NaN-poisoned dq / dk / dv, each a slice of a larger buffer whose tail holds a sentinel (never
    written), with dlse; lengths 0, 1, odd, non-multiples of 128, Nk != N, GQA, causal and not,
    softcap, window, D64; the tl varlen backward's error on the same inputs beside it.
time (bf16, triton.testing.do_bench medians): the 64K-token long-tailed batch of gpu_varlen (54 seqs,
    H16 D128, causal): backward alone and forward + backward, Gluon (fused dQ and split) against the tl
    varlen backward,
    the fixed-length tilecore backward (B16 N4096, same tokens: TFLOP/s per token), SDPA on the
    padded batch and FlexAttention with the document mask (compiled, last, where the budget allows).
Under --smoke (the CPU interpreter: Gluon does not run there) the tl backward stands in for the Gluon
one, so that shapes and the script's paths are exercised.
The first check of each path (fused dQ, split) runs first in a process of its own (a kernel fault, a CUDA
error, poisons its process): a path that fails there is not launched in the main process.
Prints a table last; writes $OUT/gpu_varlen_bwd.json (default /tmp/out). Each case catches its errors.
"""
import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (experiments.common)

SMOKE = False
BUDGET_S = 80.0
BROKEN = set()  # paths ("fused", "split") whose probe process failed: a CUDA error poisons the process
START = [time.time()]
RESULTS = {"check": [], "time": [], "errors": []}


def _device():
    return "cpu" if SMOKE else "cuda"


def _meta():
    import triton

    meta = {"torch": torch.__version__, "triton": triton.__version__, "smoke": SMOKE,
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if torch.cuda.is_available() and not SMOKE:
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
    return meta


def guarded(name):
    def wrap(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - report and go on
                RESULTS["errors"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
                print(f"[error] {name}: {type(e).__name__}: {e}")
                traceback.print_exc()
        return run
    return wrap


def over_budget(name, reserve=0.0):
    if not SMOKE and time.time() - START[0] > BUDGET_S - reserve:
        RESULTS["errors"].append({"case": name, "error": f"skipped: past the {BUDGET_S:.0f} s budget"})
        print(f"[skip] {name}: past the budget")
        return True
    return False


def cu_of(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def path_of(config):
    if config and config.get("dq_from") == "gluon":
        return "split"
    return "fused"


def gluon_backward(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap, grads=None,
                   config=None):
    from tilecore.ops.attention_varlen import op as varlen

    if path_of(config) in BROKEN:
        raise RuntimeError(f"the {path_of(config)} path failed in its probe process: not run here")
    if SMOKE:
        return varlen.backward_kernels(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap,
                                       grads=grads)
    return varlen.backward_gluon(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap,
                                 grads=grads, config=config)


def variant(d, causal, **changes):
    """The shipped config of the Gluon varlen backward with ``changes`` (None under --smoke: the tl
    backward stands in)."""
    from tilecore.ops.attention_varlen import configs

    if SMOKE:
        return None
    return dict(configs.varlen_gluon_backward_config(d, causal), **changes)


def forward(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap):
    from tilecore.ops.attention_varlen import op as varlen

    if SMOKE:
        return varlen.forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap)
    return varlen.forward_gluon(q, k, v, cu_q, cu_k, causal, scale, softcap, left, right)


def poisoned(shape, dtype, dev):
    """A NaN-filled tensor of ``shape``, the head of a larger buffer whose tail (64 rows) holds 7.0."""
    rows = shape[0]
    per_row = math.prod(shape[1:])
    buf = torch.full(((rows + 64) * per_row,), 7.0, dtype=dtype, device=dev)
    return buf, buf[:rows * per_row].view(shape).fill_(float("nan"))


# --------------------------------------------------------------------------------------------
# check


def check(dtype, lens_q, lens_k, hq, hkv, d, options, ref_heads=None, dq_from=None, zero_tail=None, extra=None,
          with_dlse=True):
    from tilecore import accuracy
    from tilecore.ops.attention_varlen import op as varlen
    from tilecore.ops.attention_varlen.reference import varlen_reference

    name = (f"gluon varlen bwd {str(dtype)[6:]} q{lens_q if len(lens_q) <= 8 else f'[{len(lens_q)} seqs]'}"
            f" k{lens_k if len(lens_k) <= 8 else f'[{len(lens_k)} seqs]'} H{hq}/{hkv} D{d} {options}"
            + (f" dq_from={dq_from}" if dq_from else "") + (f" zero_tail={zero_tail}" if zero_tail else "")
            + (f" {extra}" if extra else "") + ("" if with_dlse else " no dlse"))
    if over_budget(name):
        return
    dev = _device()
    cu_q, cu_k = cu_of(lens_q, dev), cu_of(lens_k, dev)
    total_q, total_k = sum(lens_q), sum(lens_k)
    q = torch.randn(total_q, hq, d, dtype=dtype, device=dev)
    k = torch.randn(total_k, hkv, d, dtype=dtype, device=dev)
    v = torch.randn(total_k, hkv, d, dtype=dtype, device=dev)
    causal, softcap = options.get("causal", False), options.get("softcap", 0.0)
    left, right = options.get("window_size", (-1, -1))
    scale = d ** -0.5
    out, lse = varlen.forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, softcap)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else torch.zeros_like(lse)
    bufs, grads = zip(*(poisoned(t.shape, dtype, dev) for t in (q, k, v)))
    is_causal = causal or left >= 0 or right >= 0
    changes = dict(({"dq_from": dq_from} if dq_from else {}), **({"zero_tail": zero_tail} if zero_tail else {}),
                   **(extra or {}))
    config = variant(d, is_causal, **changes) if changes else None
    gluon_backward(dout, q, k, v, out, lse, dlse if with_dlse else None, cu_q, cu_k, causal, scale, left, right,
                   softcap, grads=grads, config=config)
    tl_grads = varlen.backward_kernels(dout, q, k, v, out, lse, dlse, cu_q, cu_k, causal, scale, left, right, softcap)
    heads = hq if ref_heads is None else ref_heads
    kh = max(1, heads // (hq // hkv))
    heads = kh * (hq // hkv)
    q64, k64, v64 = (t[:, :n].double().requires_grad_() for t, n in ((q, heads), (k, kh), (v, kh)))
    ref, ref_lse = varlen_reference(q64, k64, v64, cu_q, cu_k, causal=causal, softcap=softcap,
                                    window_size=(left, right))
    live = torch.isfinite(ref_lse)
    loss = (ref * dout[:, :heads].double()).sum() + (torch.where(live, ref_lse, 0.0) * dlse[:heads].double()).sum()
    ref_grads = torch.autograd.grad(loss, (q64, k64, v64))
    row = {"case": name + (f" (float64 on {heads} heads)" if ref_heads else ""),
           "unwritten": int(sum(g.isnan().sum() for g in grads)),
           "written_past_end": int(sum((b[g.numel():] != 7.0).sum() for b, g in zip(bufs, grads)))}
    for n, g, tg, r in zip("qkv", grads, tl_grads, ref_grads):
        cols = r.shape[1]
        row[f"d{n}_x_floor"] = accuracy.error_over_floor(g[:, :cols], r)
        row[f"tl_d{n}_x_floor"] = accuracy.error_over_floor(tg[:, :cols], r)
        row[f"d{n}_vs_tl_max_abs"] = float((g.float() - tg.float()).abs().max())
    row["ok"] = (row["unwritten"] == 0 and row["written_past_end"] == 0
                 and all(row[f"d{n}_x_floor"] <= max(3.0, 1.25 * row[f"tl_d{n}_x_floor"]) for n in "qkv"))
    RESULTS["check"].append(row)
    print(("PASS " if row["ok"] else "FAIL ") + row["case"], flush=True)


def check_neighbour_nonfinite(zero_tail, dq_from=None):
    """inf in the next sequence's V and NaN in its K, Q and dO: are the first sequence's gradients
    finite (and right)? With zero_tail off: informational (the documented limitation); on: the check
    of the kernel's ZERO_TAIL (the next sequence's rows zeroed in shared memory)."""
    from tilecore import accuracy
    from tilecore.ops.attention_varlen import op as varlen
    from tilecore.ops.attention_varlen.reference import varlen_backward_reference

    if over_budget(f"gluon varlen bwd: non-finite neighbour, zero_tail={zero_tail} dq_from={dq_from}"):
        return
    dev = _device()
    lens = [20, 30, 9] if SMOKE else [100, 300, 129]
    d = 16 if SMOKE else 128
    cu = cu_of(lens, dev)
    q, k, v = (torch.randn(sum(lens), 4, d, dtype=torch.float16 if SMOKE else torch.bfloat16, device=dev)
               for _ in range(3))
    out, lse = varlen.forward_kernels(q, k, v, cu, cu, True, d ** -0.5, -1, -1, 0.0)
    dout = torch.randn_like(out)
    first = slice(0, lens[0])
    ref = varlen_backward_reference(dout[first].double(), q[first].double(), k[first].double(), v[first].double(),
                                    out[first].double(), lse[:, first].double(), None, cu[:2], cu[:2], causal=True,
                                    scale=d ** -0.5, compute_dtype=torch.float64)
    nxt = slice(lens[0], lens[0] + 10)
    v[nxt] = float("inf")
    k[nxt] = float("nan")
    q[nxt] = float("nan")
    dout[nxt] = float("inf")
    lse[:, nxt] = float("nan")
    out[nxt] = float("nan")
    grads = gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, d ** -0.5, -1, -1, 0.0,
                           config=variant(d, True, zero_tail=zero_tail, **({"dq_from": dq_from} if dq_from else {})))
    finite = bool(all(torch.isfinite(g[first]).all() for g in grads))
    row = {"case": f"gluon varlen bwd: inf/NaN in the next sequence's K, V, Q, dO, O, lse, zero_tail={zero_tail}"
                   + (f" dq_from={dq_from}" if dq_from else "")
                   + ("" if zero_tail else " (informational)"), "first_sequence_finite": finite}
    if finite:
        row.update({f"d{n}_x_floor": accuracy.error_over_floor(g[first], r) for n, g, r in zip("qkv", grads, ref)})
    row["ok"] = (not zero_tail) or (finite and all(row[f"d{n}_x_floor"] <= 3.0 for n in "qkv"))
    RESULTS["check"].append(row)
    print(("PASS " if row["ok"] else "FAIL ") + row["case"], flush=True)


def run_checks():
    bf16, fp16 = torch.bfloat16, torch.float16
    if SMOKE:
        cases = [(fp16, [1, 0, 37, 5, 20], [1, 0, 37, 5, 20], 2, 2, 16, {"causal": True}),
                 (fp16, [9, 1, 30, 0], [12, 3, 30, 5], 4, 2, 16, {}),
                 (fp16, [20, 3, 33], [25, 3, 40], 2, 1, 16, {"causal": True, "softcap": 5.0}),
                 (fp16, [20, 3, 33], [25, 3, 40], 2, 2, 16, {"window_size": (7, 3)})]
    else:
        cases = [(bf16, [1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, {"causal": True}),
                 (bf16, [300, 1, 1025, 0, 129], [300, 5, 1300, 7, 129], 32, 8, 128, {}),
                 (bf16, [700, 129, 2000, 64], [900, 129, 2000, 70], 16, 4, 128, {"causal": True}),
                 (fp16, [1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, {"causal": True}),
                 (bf16, [129, 4096, 17, 0, 300], [129, 4096, 17, 5, 300], 8, 8, 64, {"causal": True}),
                 (bf16, [700, 129, 2000, 64], [900, 129, 2000, 70], 16, 4, 128, {"causal": True, "softcap": 20.0}),
                 (bf16, [700, 129, 2000, 64], [900, 129, 2000, 70], 16, 4, 128, {"window_size": (100, 37)})]
    # first: the shipped fused dQ and the split one (dK/dV, then attention_varlen_dq_kernel) on the odd
    # lengths, causal; then no mask with GQA and N != Nk
    if PROBE:  # a probe process: the first case on one path
        case = cases[0] + (None, "gluon" if PROBE == "split" else "fused")
        guarded(f"check {case[1]}")(check)(*case)
        return []
    if CHECK_BOTH:  # --matched --check (session 31): every case on both paths, the fused dQ and the split
        return [case + (None, mode) for case in cases[1:] for mode in ("fused", "gluon")]
    later = cases[2:] + [cases[1] + (None, "gluon"), cases[2] + (None, "gluon"), cases[-1] + (None, "gluon")]
    guarded(f"check {cases[1][1]}")(check)(*cases[1])
    return later


# --------------------------------------------------------------------------------------------
# time


def bench(fn):
    import triton

    if SMOKE:
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def long_tailed_lengths(total, seed=0, longest=16384, shortest=16):
    """gpu_varlen.py's: log-normal lengths (median ~800, a tail to 16K) until ``total`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        n = int(math.exp(torch.randn(1, generator=g).item() * 1.2 + math.log(800)))
        lengths.append(max(shortest, min(longest, n, total - sum(lengths))))
    return lengths


def causal_flops(lengths, h, d):
    return sum(4 * n * n / 2 * d * h for n in lengths)


def time_backward(lengths, h=16, d=128):
    import tilecore
    from tilecore.ops.attention_varlen import op as varlen

    dev = _device()
    total = sum(lengths)
    cu = cu_of(lengths, dev)
    dtype = torch.float16 if SMOKE else torch.bfloat16
    scale = d ** -0.5
    q, k, v = (torch.randn(total, h, d, dtype=dtype, device=dev) for _ in range(3))
    flops = causal_flops(lengths, h, d)
    row = {"case": f"long-tailed: {len(lengths)} seqs, {total} tokens, longest {max(lengths)}, H{h} D{d} causal",
           "flops_fwd": flops}
    RESULTS["time"].append(row)
    out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
    dout = torch.randn_like(out)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    def timed(name, fn):
        guarded(f"time {name}")(lambda: row.__setitem__(name, bench(fn)))()

    timed("tl_bwd_ms", lambda: varlen.backward_kernels(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1, -1,
                                                       0.0, grads=grads))
    split = variant(d, True, dq_from="gluon")
    for name, cfg in (("gluon", None), ("gluon_split", split)):
        if path_of(cfg) in BROKEN:
            continue
        timed(f"{name}_bwd_ms", lambda cfg=cfg: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1,
                                                               -1, 0.0, grads=grads, config=cfg))

        def fwd_bwd(cfg=cfg):
            o, l_ = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
            gluon_backward(dout, q, k, v, o, l_, None, cu, cu, True, scale, -1, -1, 0.0, grads=grads, config=cfg)
        timed(f"{name}_fwd_bwd_ms", fwd_bwd)
    for name, factor in (("gluon_bwd", 2.5), ("gluon_fwd_bwd", 3.5), ("gluon_split_bwd", 2.5),
                         ("gluon_split_fwd_bwd", 3.5), ("tl_bwd", 2.5)):
        if f"{name}_ms" in row:
            row[f"{name}_tflops"] = factor * flops / row[f"{name}_ms"] / 1e9

    @guarded("time fixed-length tilecore backward")
    def fixed():
        n = 16 if SMOKE else 4096
        b = max(1, total // n)
        qf, kf, vf = (torch.randn(b, h, n, d, dtype=dtype, device=dev, requires_grad=True) for _ in range(3))
        of = tilecore.attention(qf, kf, vf, causal=True)
        dof = torch.randn_like(of)
        tb = bench(lambda: torch.autograd.grad(of, (qf, kf, vf), dof, retain_graph=True))

        def fixed_fwd_bwd():
            o = tilecore.attention(qf, kf, vf, causal=True)
            torch.autograd.grad(o, (qf, kf, vf), dof)
        tfb = bench(fixed_fwd_bwd)
        fixed_flops = causal_flops([n] * b, h, d)
        row[f"fixed_B{b}_N{n}_bwd_ms"] = tb
        row[f"fixed_B{b}_N{n}_fwd_bwd_ms"] = tfb
        row["fixed_bwd_tflops"] = 2.5 * fixed_flops / tb / 1e9
        row["fixed_fwd_bwd_tflops"] = 3.5 * fixed_flops / tfb / 1e9
        for name, ours, fixed_name in (("bwd_vs_fixed", "gluon_bwd", "fixed_bwd"),
                                       ("fwd_bwd_vs_fixed", "gluon_fwd_bwd", "fixed_fwd_bwd"),
                                       ("split_bwd_vs_fixed", "gluon_split_bwd", "fixed_bwd"),
                                       ("split_fwd_bwd_vs_fixed", "gluon_split_fwd_bwd", "fixed_fwd_bwd")):
            if f"{ours}_tflops" in row:
                row[name] = row[f"{ours}_tflops"] / row[f"{fixed_name}_tflops"]
    fixed()
    return row, (q, k, v, cu, dout)


def time_variants(row, tensors, d=128):
    """The backward at other configs: zero_tail on (what an inf / NaN next door costs to keep out), fused
    and split; the split dK/dV kernel with 3 stages (its shared memory allows it); causal with the lagged
    dQ (the fixed kernel's non-causal mode)."""
    q, k, v, cu, dout = tensors
    scale = d ** -0.5
    out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    for name, cfg in (("zero_tail", variant(d, True, zero_tail=True)),
                      ("split_zero_tail", variant(d, True, dq_from="gluon", zero_tail=True)),
                      ("split_3_stages", variant(d, True, dq_from="gluon", stages=3)),
                      ("lagged", variant(d, True, dq_from="lagged"))):
        if over_budget(f"time variant {name}", 10.0):
            continue
        if path_of(cfg) in BROKEN:
            continue
        guarded(f"time variant {name}")(lambda name=name, cfg=cfg: row.__setitem__(
            f"gluon_bwd_{name}_ms", bench(lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1,
                                                                 -1, 0.0, grads=grads, config=cfg))))()


def time_peers(row, lengths, tensors, h=16, d=128):
    q, k, v, cu, dout = tensors
    dev = _device()
    dtype = q.dtype
    total = sum(lengths)

    @guarded("time sdpa padded")
    def sdpa_padded():
        import torch.nn.functional as F
        nmax = max(lengths)
        qp, kp, vp = (torch.randn(len(lengths), h, nmax, d, dtype=dtype, device=dev, requires_grad=True)
                      for _ in range(3))
        op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        dop = torch.randn_like(op)
        row["sdpa_padded_bwd_ms"] = bench(lambda: torch.autograd.grad(op, (qp, kp, vp), dop, retain_graph=True))
        for ours in ("gluon", "gluon_split"):
            if f"{ours}_bwd_ms" in row:
                row[f"sdpa_padded_bwd_over_{ours}"] = row["sdpa_padded_bwd_ms"] / row[f"{ours}_bwd_ms"]
    if not over_budget("sdpa padded", 5.0):
        sdpa_padded()

    @guarded("time flex document mask")
    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev), torch.tensor(lengths, device=dev))

        def document_causal(b, hh, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)
        mask = create_block_mask(document_causal, None, None, total, total, device=dev)
        compiled = torch.compile(flex_attention)
        qx, kx, vx = (t.detach().transpose(0, 1).unsqueeze(0).requires_grad_() for t in (q, k, v))
        ox = compiled(qx, kx, vx, block_mask=mask)
        dox = dout.transpose(0, 1).unsqueeze(0)
        row["flex_bwd_ms"] = bench(lambda: torch.autograd.grad(ox, (qx, kx, vx), dox, retain_graph=True))
        for ours in ("gluon", "gluon_split"):
            if f"{ours}_bwd_ms" in row:
                row[f"flex_bwd_over_{ours}"] = row["flex_bwd_ms"] / row[f"{ours}_bwd_ms"]
    if not SMOKE and os.environ.get("GPU_VARLEN_FLEX", "1") != "0" and not over_budget("flex", 35.0):
        flex()


MATCHED_LENGTHS = (512, 1024, 2048, 4096, 8192)


def fixed_rates(h=16, d=128, total=65536):
    """The fixed-length tilecore attention's causal TFLOP/s (forward, backward, forward + backward) at
    each of MATCHED_LENGTHS, B = total / N (the same tokens): {N: (fwd, bwd, fwd_bwd)}."""
    import tilecore

    dev = _device()
    dtype = torch.float16 if SMOKE else torch.bfloat16
    rates = {}
    for n in ((16, 32) if SMOKE else MATCHED_LENGTHS):
        if over_budget(f"time fixed N{n}", 8.0):
            continue
        b = 2 if SMOKE else max(1, total // n)

        def one(n=n, b=b):
            qf, kf, vf = (torch.randn(b, h, n, d, dtype=dtype, device=dev, requires_grad=True) for _ in range(3))
            of = tilecore.attention(qf, kf, vf, causal=True)
            dof = torch.randn_like(of)
            tf = bench(lambda: tilecore.attention(qf, kf, vf, causal=True))
            tb = bench(lambda: torch.autograd.grad(of, (qf, kf, vf), dof, retain_graph=True))

            def fwd_bwd():
                o = tilecore.attention(qf, kf, vf, causal=True)
                torch.autograd.grad(o, (qf, kf, vf), dof)
            tfb = bench(fwd_bwd)
            fl = causal_flops([n] * b, h, d)
            rates[n] = (fl / tf / 1e9, 2.5 * fl / tb / 1e9, 3.5 * fl / tfb / 1e9)
        guarded(f"time fixed N{n}")(one)()
    return rates


def matched_time_ms(lengths, rates, which, h=16, d=128):
    """What the fixed-length kernel would take for these sequences at its own rate for each length
    (``which``: 0 fwd, 1 bwd, 2 fwd+bwd; the rate interpolated in log2 N between the measured lengths,
    held at the ends): the batch's FLOPs over the fixed path's rate at the same lengths, in ms."""
    known = sorted(rates)
    factor = (1.0, 2.5, 3.5)[which]
    total = 0.0
    for n in lengths:
        x = math.log2(max(n, 1))
        lo = max([m for m in known if math.log2(m) <= x] or known[:1])
        hi = min([m for m in known if math.log2(m) >= x] or known[-1:])
        if lo == hi:
            rate = rates[lo][which]
        else:
            t = (x - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            rate = rates[lo][which] * (1 - t) + rates[hi][which] * t
        total += factor * causal_flops([n], h, d) / rate / 1e9
    return total


def time_matched(h=16, d=128):
    """--matched: the varlen Gluon forward, backward and both on the long-tailed and the uniform 16 x 4096
    batches against the fixed-length path at the same sequence lengths (the issue's "tilecore's own
    fixed-length throughput per token": a long tail's short sequences run at the fixed path's short-N
    rate too, which B16 N4096 alone does not show)."""
    rates = fixed_rates(h, d)
    RESULTS["time"].append({"case": "fixed-length causal TFLOP/s by N (fwd, bwd, fwd+bwd), B = 64K / N",
                            **{f"fixed_N{n}_{w}": r[i] for n, r in rates.items()
                               for i, w in enumerate(("fwd", "bwd", "fwd_bwd"))}})
    dev = _device()
    dtype = torch.float16 if SMOKE else torch.bfloat16
    scale = d ** -0.5
    batches = (("long-tailed", [16, 40, 3, 25] if SMOKE else long_tailed_lengths(65536)),
               ("uniform 16 x 4096", [32, 32] if SMOKE else [4096] * 16))
    for label, lengths in batches:
        if over_budget(f"time matched {label}", 10.0):
            continue

        def one(label=label, lengths=lengths):
            total = sum(lengths)
            cu = cu_of(lengths, dev)
            q, k, v = (torch.randn(total, h, d, dtype=dtype, device=dev) for _ in range(3))
            out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
            dout = torch.randn_like(out)
            grads = tuple(torch.empty_like(t) for t in (q, k, v))
            flops = causal_flops(lengths, h, d)
            row = {"case": f"matched {label}: {len(lengths)} seqs, {total} tokens, longest {max(lengths)}, H{h} D{d} "
                           f"causal (vs_matched: the fixed path's time at these lengths / ours)"}
            RESULTS["time"].append(row)
            row["gluon_fwd_ms"] = bench(lambda: forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0))
            row["gluon_bwd_ms"] = bench(lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1,
                                                               -1, 0.0, grads=grads))

            def fwd_bwd():
                o, l_ = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
                gluon_backward(dout, q, k, v, o, l_, None, cu, cu, True, scale, -1, -1, 0.0, grads=grads)
            row["gluon_fwd_bwd_ms"] = bench(fwd_bwd)
            # the backward's dQ modes (the fixed path fuses dQ at N 4096 causal; the varlen default splits it off)
            for mode in ("fused", "lagged"):
                if not over_budget(f"time matched {label} dq {mode}", 15.0):
                    cfg = variant(d, True, dq_from=mode)
                    guarded(f"time matched {label} dq {mode}")(lambda mode=mode, cfg=cfg: row.__setitem__(
                        f"gluon_bwd_{mode}_ms", bench(lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu,
                                                                             True, scale, -1, -1, 0.0, grads=grads,
                                                                             config=cfg))))()
            for i, w in enumerate(("fwd", "bwd", "fwd_bwd")):
                row[f"gluon_{w}_tflops"] = (1.0, 2.5, 3.5)[i] * flops / row[f"gluon_{w}_ms"] / 1e9
                if rates:
                    row[f"fixed_matched_{w}_ms"] = m = matched_time_ms(lengths, rates, i, h, d)
                    row[f"{w}_vs_matched"] = m / row[f"gluon_{w}_ms"]
                    if 4096 in rates:
                        row[f"{w}_vs_N4096"] = row[f"gluon_{w}_tflops"] / rates[4096][i]
        guarded(f"time matched {label}")(one)()


def run_zero_tail():
    """--zero-tail (session 29): ZERO_TAIL 2, config zero_tail "checked" (the neighbours' rows zeroed only in
    the sequences varlen.neighbour_rows_nonfinite marks): checks (finite odd lengths: nothing marked, the plain
    math; inf / NaN next door with dQ split and fused), then the 64K long-tailed causal backward's time
    shipped (zero_tail off), zero_tail on (every sequence) and checked (nothing marked: the flags' pass and
    the kernel's code), interleaved twice against drift."""
    bf16 = torch.float16 if SMOKE else torch.bfloat16
    d = 16 if SMOKE else 128
    lens = [1, 0, 37, 5, 20] if SMOKE else [1, 0, 777, 63, 1500, 2]
    guarded("check zero_tail checked")(check)(bf16, lens, lens, 2 if SMOKE else 16, 2 if SMOKE else 16, d,
                                              {"causal": True}, None, "gluon", "checked")
    guarded("check non-finite neighbour, zero_tail checked")(check_neighbour_nonfinite)("checked", "gluon")
    guarded("check non-finite neighbour, zero_tail checked, fused")(check_neighbour_nonfinite)("checked", "fused")
    lengths = [16, 40, 3, 25] if SMOKE else long_tailed_lengths(65536)
    h = 2 if SMOKE else 16
    dev = _device()
    total = sum(lengths)
    cu = cu_of(lengths, dev)
    scale = d ** -0.5
    q, k, v = (torch.randn(total, h, d, dtype=bf16, device=dev) for _ in range(3))
    out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
    dout = torch.randn_like(out)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    row = {"case": f"zero_tail long-tailed: {len(lengths)} seqs, {total} tokens, H{h} D{d} causal, dq split (ms)"}
    RESULTS["time"].append(row)
    for rep_ in range(2):
        for name, zt in (("off", False), ("on", True), ("checked", "checked")):
            if over_budget(f"time zero_tail {name}", 5.0):
                continue
            cfg = variant(d, True, dq_from="gluon", zero_tail=zt)
            guarded(f"time zero_tail {name}")(lambda name=name, cfg=cfg: row.__setitem__(
                f"{name}_{rep_}", bench(lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1,
                                                               -1, 0.0, grads=grads, config=cfg))))()
    for name in ("on", "checked"):
        if f"{name}_1" in row and "off_1" in row:
            row[f"{name}_over_off"] = (row[f"{name}_0"] + row[f"{name}_1"]) / (row["off_0"] + row["off_1"])


def kernel_times(fn, reps=5):
    """{kernel name: mean GPU ms a call} of fn by torch.profiler (after a warm-up call: gpu_script.profiled)."""
    from experiments.common.gpu_script import profiled

    prof = profiled(fn, reps)
    times = {}
    for evt in prof.key_averages():
        total = getattr(evt, "device_time_total", None)
        if total is None:
            total = getattr(evt, "cuda_time_total", 0.0)
        if total:
            times[evt.key[:60]] = total / reps / 1e3  # us -> ms
    return dict(sorted(times.items(), key=lambda kv: -kv[1])[:8])


def run_kernels(h=16, d=128):
    """--kernels (session 29): where the varlen backward's time goes against the fixed path's on the same
    tiles (uniform 16 x 4096 causal, H16 D128): per-kernel GPU time (torch.profiler) of the fixed backward with
    dQ fused (its default at N 4096) and split (the dq kernel after), and of the varlen backward split (its
    default) and fused."""
    from tilecore.ops.attention import launch, plan

    if SMOKE:
        RESULTS["errors"].append({"case": "kernels", "error": "skipped: --smoke (torch.profiler on the GPU only)"})
        return
    dev = _device()
    n, b = 4096, 16
    dtype = torch.bfloat16
    scale = d ** -0.5
    qf, kf, vf = (torch.randn(b, h, n, d, dtype=dtype, device=dev) for _ in range(3))
    out_f = torch.empty_like(qf)
    lse_f = torch.empty(b, h, n, device=dev)
    launch.forward(plan.plan_forward(qf, kf, vf, True, scale), qf, kf, vf, out_f, lse_f, True, scale)
    do_f = torch.randn_like(out_f)
    gf = [torch.empty_like(t) for t in (qf, kf, vf)]
    lengths = [n] * b
    cu = cu_of(lengths, dev)
    q, k, v = (t.transpose(1, 2).reshape(b * n, h, d).contiguous() for t in (qf, kf, vf))
    out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
    dout = do_f.transpose(1, 2).reshape(b * n, h, d).contiguous()
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    base = plan.plan_backward(do_f, qf, kf, vf, True, scale, path="gluon")
    cases = {"fixed fused (default)": base,
             "fixed split": plan.plan_backward(do_f, qf, kf, vf, True, scale, path="gluon",
                                               config=dict(base.config, dq_from="gluon"))}
    for name, p in cases.items():
        guarded(f"kernels {name}")(lambda name=name, p=p: RESULTS["time"].append(
            {"case": f"kernels {name}: uniform 16 x 4096 H{h} D{d} causal (GPU ms a call)", **kernel_times(
                lambda: launch.backward(p, do_f, qf, kf, vf, out_f, lse_f, None, *gf, True, scale))}))()
    for name, cfg in (("varlen split (default)", None), ("varlen fused", variant(d, True, dq_from="fused"))):
        guarded(f"kernels {name}")(lambda name=name, cfg=cfg: RESULTS["time"].append(
            {"case": f"kernels {name}: uniform 16 x 4096 H{h} D{d} causal (GPU ms a call)", **kernel_times(
                lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1, -1, 0.0, grads=grads,
                                       config=cfg))}))()


def run_layout(h=16, d=128):
    """--layout (session 30): run 1's per-kernel times showed the varlen split kernels at the fixed split ones'
    time (dK/dV 3.25 vs 3.27 ms, dq 2.26 vs 2.24) and the varlen fused dK/dV kernel at 6.40 ms against the fixed
    fused 4.79. Here: the float64 check of the fused dQ (odd lengths, causal), then the varlen backward split /
    fused / lagged on the uniform 16 x 4096 and the 64K long-tailed batches (causal H16 D128, do_bench ms), then
    the fixed backward (fused / split) on contiguous tensors and on the packed layout's views."""
    from tilecore.ops.attention import launch, plan

    dev = _device()
    dtype = torch.float16 if SMOKE else torch.bfloat16
    hh, dd = (2, 16) if SMOKE else (h, d)
    scale = dd ** -0.5
    if SMOKE:
        case = (dtype, [1, 0, 37, 5, 20], [1, 0, 37, 5, 20], 2, 2, 16, {"causal": True})
    else:
        case = (dtype, [1, 0, 777, 63, 1500, 2], [1, 0, 777, 63, 1500, 2], 16, 16, 128, {"causal": True})
    guarded("check fused")(check)(*case, extra=None if SMOKE else dict(dq_from="fused"))
    # (run 5 of session 30 also timed head_minor, a work table of a sequence's key tiles tile by tile across its
    # kv heads, and round-robin tiles: neither helped, both removed; commit e4a2630 has them)
    variants = (("split", {}), ("fused", dict(dq_from="fused")), ("lagged", dict(dq_from="lagged")))
    n, b = (32, 2) if SMOKE else (4096, 16)
    for label, lengths in (("uniform", [n] * b), ("long-tailed", [16, 40, 3, 25] if SMOKE else long_tailed_lengths(65536))):
        cu = cu_of(lengths, dev)
        total = sum(lengths)
        q, k, v = (torch.randn(total, hh, dd, dtype=dtype, device=dev) for _ in range(3))
        out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
        dout = torch.randn_like(out)
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        row = {"case": f"layout {label}: {len(lengths)} seqs, {total} tokens, H{hh} D{dd} causal varlen backward (ms)"}
        RESULTS["time"].append(row)
        for name, changes in variants:
            if over_budget(f"layout varlen {label} {name}", 10.0):
                continue
            cfg = variant(dd, True, **changes)
            guarded(f"layout varlen {label} {name}")(lambda name=name, cfg=cfg: row.__setitem__(f"{name}_ms", bench(
                lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1, -1, 0.0, grads=grads,
                                       config=cfg))))()
        if "split_ms" in row:
            for key in [k_ for k_ in row if k_.endswith("_ms")]:
                row[key.replace("_ms", "_over_split")] = row[key] / row["split_ms"]
        if label == "uniform" and not SMOKE:  # the fixed backward on the same tiles, contiguous and packed views
            packed = [t.view(b, n, hh, dd).transpose(1, 2) for t in (q, k, v, out, dout)]  # (B, H, N, D), no copy
            dense = [t.contiguous() for t in packed]
            lse_f = lse.view(hh, b, n).transpose(0, 1).contiguous()  # (B, H, N)
            for layout_name, (qf, kf, vf, of, df) in (("contiguous", dense), ("packed views", packed)):
                gf = [torch.empty_like(t) for t in (qf, kf, vf)]
                for mode in ("fused", "gluon"):
                    key = f"fixed_{layout_name.replace(' ', '_')}_{'split' if mode == 'gluon' else mode}_ms"
                    if over_budget(f"layout {key}", 5.0):
                        continue
                    base = plan.plan_backward(df, qf, kf, vf, True, scale, path="gluon")
                    p = plan.plan_backward(df, qf, kf, vf, True, scale, path="gluon",
                                           config=dict(base.config, dq_from=mode))
                    guarded(f"layout {key}")(lambda p=p, qf=qf, kf=kf, vf=vf, of=of, df=df, gf=gf, key=key: row.__setitem__(
                        key, bench(lambda: launch.backward(p, df, qf, kf, vf, of, lse_f, None, *gf, True, scale))))()

def table():
    lines = ["", "== check =="]
    for r in RESULTS["check"]:
        lines.append(("PASS " if r.get("ok") else "FAIL ") + r["case"])
        lines.append("     " + " ".join(f"{k}={(round(v, 3) if isinstance(v, float) else v)}" for k, v in r.items()
                                        if k not in ("case", "ok")))
    lines.append("")
    lines.append("== time ==")
    for r in RESULTS["time"]:
        lines.append(r["case"])
        for k, v in r.items():
            if k != "case":
                lines.append(f"   {k:40s} {v:12.3f}" if isinstance(v, float) else f"   {k:40s} {v}")
    if RESULTS["errors"]:
        lines.append("")
        lines.append(f"errors: {len(RESULTS['errors'])}")
        lines.extend(f"   {e['case']}: {e['error'][:300]}" for e in RESULTS["errors"])
    return "\n".join(lines)


PROBE = None
CHECK_BOTH = False


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream): the replay's time is the GPU's alone,
    with no host time between the kernels."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def run_uniform_gap(h=16, d=128, rounds=3):
    """--uniform-gap (session 33): why the varlen backward ran at 0.869x the fixed path on the uniform 16 x 4096
    causal batch in session 33's call 1 (varlen split 6.387 ms by backward_gluon against the fixed path's 5.550 by
    tilecore.attention's autograd) while session 30's run 5 had 0.98x (split 5.921 against the fixed fused kernel
    launch's 5.799). The same tokens (the varlen tensors are the fixed ones' packed copies), each way timed
    alternately ``rounds`` times (do_bench medians): the varlen split (shipped) and fused, direct
    (op.backward_gluon) and through autograd (tilecore.attention_varlen); the fixed fused (its default at N 4096)
    and split by launch.backward, and through autograd (tilecore.attention); the direct ones also replayed from a
    CUDA graph (GPU time alone: the difference is host time the GPU waits for); per-kernel GPU times of the varlen
    split and the fixed fused (torch.profiler). Checks: the varlen split's gradients against the fixed path's on
    the same tokens (each a multiple of the float64 reference's rounding floor on the first two sequences)."""
    import statistics

    import triton.testing

    import tilecore
    from tilecore import accuracy
    from tilecore.ops.attention import launch, plan
    from tilecore.ops.attention_varlen.reference import varlen_reference

    dev = _device()
    dtype = torch.float16 if SMOKE else torch.bfloat16
    n, b = (32, 2) if SMOKE else (4096, 16)
    scale = d ** -0.5
    lengths = [n] * b
    cu = cu_of(lengths, dev)
    qf, kf, vf = (torch.randn(b, h, n, d, dtype=dtype, device=dev) for _ in range(3))
    packed = lambda t: t.transpose(1, 2).reshape(b * n, h, t.shape[-1]).contiguous()  # noqa: E731
    q, k, v = (packed(t) for t in (qf, kf, vf))
    out, lse = forward(q, k, v, cu, cu, True, scale, -1, -1, 0.0)
    dout = torch.randn_like(out)
    do_f = dout.view(b, n, h, d).transpose(1, 2).contiguous()
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    fns = {}
    fns["varlen split (shipped), direct"] = lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale,
                                                                  -1, -1, 0.0, grads=grads)
    if not SMOKE:
        fused = variant(d, True, dq_from="fused")
        fns["varlen fused, direct"] = lambda: gluon_backward(dout, q, k, v, out, lse, None, cu, cu, True, scale, -1,
                                                             -1, 0.0, grads=grads, config=fused)
        out_f = torch.empty_like(qf)
        lse_f = torch.empty(b, h, n, device=dev)
        launch.forward(plan.plan_forward(qf, kf, vf, True, scale), qf, kf, vf, out_f, lse_f, True, scale)
        gf = [torch.empty_like(t) for t in (qf, kf, vf)]
        base = plan.plan_backward(do_f, qf, kf, vf, True, scale)
        split = plan.plan_backward(do_f, qf, kf, vf, True, scale, path="gluon",
                                   config=dict(base.config, dq_from="gluon"))
        fns[f"fixed {base.config['dq_from']} (default), launch"] = lambda: launch.backward(
            base, do_f, qf, kf, vf, out_f, lse_f, None, *gf, True, scale)
        fns["fixed split, launch"] = lambda: launch.backward(split, do_f, qf, kf, vf, out_f, lse_f, None, *gf, True,
                                                             scale)
    qa, ka, va = (t.detach().requires_grad_() for t in (qf, kf, vf))
    oa = tilecore.attention(qa, ka, va, causal=True)
    fns["fixed, tilecore.attention autograd"] = lambda: torch.autograd.grad(oa, (qa, ka, va), do_f, retain_graph=True)
    qv, kv_, vv = (t.detach().requires_grad_() for t in (q, k, v))
    ov = tilecore.attention_varlen(qv, kv_, vv, cu, cu, n, n, causal=True)
    fns["varlen, tilecore.attention_varlen autograd"] = lambda: torch.autograd.grad(ov, (qv, kv_, vv), dout,
                                                                                   retain_graph=True)
    # check first: the varlen split against float64 on the first two sequences, and against the fixed path
    fns["varlen split (shipped), direct"]()
    first = slice(0, 2 * n)
    h_ref = 2
    q64, k64, v64 = (t[first, :h_ref].double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = varlen_reference(q64, k64, v64, cu[:3], cu[:3], causal=True)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout[first, :h_ref].double())
    ga = torch.autograd.grad(oa, (qa, ka, va), do_f, retain_graph=True)
    row = {"case": f"check varlen split (uniform {b} x {n}, H{h} D{d} causal): float64 on 2 seqs x {h_ref} heads"}
    for nm, g, r, fixed_g in zip("qkv", grads, ref_grads, ga):
        row[f"d{nm}_x_floor"] = accuracy.error_over_floor(g[first, :h_ref], r)
        row[f"d{nm}_vs_fixed_max_abs"] = float((g.float() - packed(fixed_g).float()).abs().max())
    row["unwritten"] = int(sum(g.isnan().sum() for g in grads))
    row["ok"] = row["unwritten"] == 0 and all(row[f"d{nm}_x_floor"] <= 3.0 for nm in "qkv")
    RESULTS["check"].append(row)
    print(("PASS " if row["ok"] else "FAIL ") + row["case"], {k_: v_ for k_, v_ in row.items() if k_ != "case"},
          flush=True)
    if not SMOKE:
        for name in [nm for nm in fns if nm.endswith(("direct", "launch"))]:
            try:
                fns[name.rsplit(",", 1)[0] + ", CUDA graph"] = graph_of(fns[name])
            except Exception as e:  # noqa: BLE001 - report and go on
                RESULTS["errors"].append({"case": f"graph {name}", "error": f"{type(e).__name__}: {e}"})
                print(f"[error] graph {name}: {e}", flush=True)
    row = {"case": f"uniform gap: {b} x {n} causal H{h} D{d}, backward ms ({rounds} alternate rounds, median)"}
    RESULTS["time"].append(row)
    times = {name: [] for name in fns}
    for r in range(1 if SMOKE else rounds):
        for name, fn in fns.items():
            if over_budget(f"time {name} round {r}", 12.0):
                continue
            try:
                times[name].append(bench(fn) if SMOKE else triton.testing.do_bench(fn, warmup=10, rep=80,
                                                                                     return_mode="median"))
            except Exception as e:  # noqa: BLE001 - report and go on
                RESULTS["errors"].append({"case": f"time {name}", "error": f"{type(e).__name__}: {e}"})
                print(f"[error] time {name}: {e}", flush=True)
        dump_partial()
    for name, ts in times.items():
        if ts:
            row[f"{name} ms"] = statistics.median(ts)
            RESULTS.setdefault("rounds", {})[name] = ts  # in the JSON, not the table
            print(f"   {name:55s} {row[name + ' ms']:.3f} ms  ({' '.join(f'{t:.3f}' for t in ts)})", flush=True)
    for ours, theirs in (("varlen split (shipped), direct", "fixed fused (default), launch"),
                         ("varlen split (shipped), CUDA graph", "fixed fused (default), CUDA graph"),
                         ("varlen, tilecore.attention_varlen autograd", "fixed, tilecore.attention autograd"),
                         ("varlen fused, direct", "fixed fused (default), launch"),
                         ("varlen split (shipped), direct", "fixed split, launch")):
        if f"{ours} ms" in row and f"{theirs} ms" in row:
            row[f"ratio {ours} / {theirs} (speed)"] = row[f"{theirs} ms"] / row[f"{ours} ms"]
    if not SMOKE:
        for name in ("varlen split (shipped), direct", "fixed fused (default), launch"):
            if name in fns and not over_budget(f"kernels {name}", 6.0):
                guarded(f"kernels {name}")(lambda name=name: RESULTS["time"].append(
                    {"case": f"kernels {name} (GPU ms a call)", **kernel_times(fns[name])}))()
    dump_partial()


def dump_partial():
    """The results so far as $OUT/gpu_varlen_bwd_uniform_gap.json (a run cut short keeps them)."""
    out_dir = os.environ.get("OUT", "/tmp/out")
    with open(os.path.join(out_dir, "gpu_varlen_bwd_uniform_gap.json"), "w") as f:
        json.dump({"meta": _meta(), "broken": sorted(BROKEN), **RESULTS, "elapsed_s": time.time() - START[0]}, f,
                  indent=1, default=str)


def probe(path, budget):
    """The first check on ``path`` in a process of its own: a kernel fault (CUDA error) poisons its
    process, so the main one learns which path runs before it launches either."""
    import subprocess
    import sys

    out_dir = os.environ.get("OUT", "/tmp/out")
    cmd = [sys.executable, os.path.abspath(__file__), "--probe", path, "--budget", str(budget)]
    cmd += ["--smoke"] if SMOKE else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(budget + 30, 60))
        text, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, code = f"timed out: {e}", -1
    print(text[-4000:], flush=True)
    try:
        with open(os.path.join(out_dir, f"gpu_varlen_bwd_probe_{path}.json")) as f:
            found = json.load(f)
    except (OSError, ValueError):
        found = {"check": [], "errors": []}
    RESULTS["check"].extend(found["check"])
    RESULTS["errors"].extend({"case": f"probe {path}: {e['case']}", "error": e["error"]} for e in found["errors"])
    if code != 0 or found["errors"] or not found["check"] or not all(c.get("ok") for c in found["check"]):
        BROKEN.add(path)
        RESULTS["errors"].append({"case": f"probe {path}", "error": f"exit {code}: the {path} path is not run "
                                  f"in the main process; its output's tail: {text[-600:]}"})


def main():
    global SMOKE, BUDGET_S, PROBE, CHECK_BOTH
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, no timing (the CPU interpreter)")
    parser.add_argument("--quick", action="store_true", help="the default: checks and the 64K timing, <= 90 s")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds before later cases are skipped")
    parser.add_argument("--no-time", action="store_true")
    parser.add_argument("--probe", choices=("fused", "split"), help="(internal) the first check on one path")
    parser.add_argument("--uniform-gap", action="store_true",
                        help="only the uniform 16 x 4096 batch's varlen vs fixed backward, direct, from CUDA graphs "
                             "and through autograd, alternate rounds (session 33), <= 90 s")
    parser.add_argument("--kernels", action="store_true",
                        help="only the per-kernel GPU times (torch.profiler) of the fixed and varlen backward, <= 60 s")
    parser.add_argument("--layout", action="store_true",
                        help="only the varlen backward's dQ modes on the uniform and long-tailed batches, and the "
                             "fixed one on the same tiles (session 30), <= 90 s")
    parser.add_argument("--zero-tail", action="store_true",
                        help="only zero_tail 'checked' (ZERO_TAIL 2): its checks and its cost, <= 90 s")
    parser.add_argument("--matched", action="store_true",
                        help="only the varlen vs fixed-length timing at matched lengths (no checks), <= 90 s")
    parser.add_argument("--check", action="store_true",
                        help="with --matched: first each path's probe (fused dQ, split), then the timing, then "
                             "every check case on both paths until the budget (session 31: the masks' range form)")
    args = parser.parse_args()
    SMOKE, BUDGET_S, PROBE = args.smoke, args.budget, args.probe
    CHECK_BOTH = args.check
    START[0] = time.time()
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    if args.kernels:
        guarded("kernels")(run_kernels)()
        text = table()
        with open(os.path.join(out_dir, "gpu_varlen_bwd_kernels.json"), "w") as f:
            json.dump({"meta": _meta(), **RESULTS, "elapsed_s": time.time() - START[0]}, f, indent=1, default=str)
        print(text)
        print(f"elapsed {time.time() - START[0]:.1f} s")
        return
    if args.layout:
        guarded("layout")(run_layout)()
        text = table()
        with open(os.path.join(out_dir, "gpu_varlen_bwd_layout.json"), "w") as f:
            json.dump({"meta": _meta(), **RESULTS, "elapsed_s": time.time() - START[0]}, f, indent=1, default=str)
        print(text)
        print(f"elapsed {time.time() - START[0]:.1f} s")
        return
    if args.zero_tail:
        run_zero_tail()
        text = table()
        with open(os.path.join(out_dir, "gpu_varlen_bwd_zero_tail.json"), "w") as f:
            json.dump({"meta": _meta(), **RESULTS, "elapsed_s": time.time() - START[0]}, f, indent=1, default=str)
        print(text)
        print(f"elapsed {time.time() - START[0]:.1f} s")
        return
    if args.uniform_gap:
        guarded("uniform gap")(run_uniform_gap)(h=2 if SMOKE else 16, d=16 if SMOKE else 128)
        text = table()
        dump_partial()
        print(text)
        print(f"elapsed {time.time() - START[0]:.1f} s")
        return
    if args.matched:
        if args.check:
            for path in ("fused", "split"):
                probe(path, 30.0)
        guarded("time matched")(time_matched)(h=2 if SMOKE else 16, d=16 if SMOKE else 128)
        if args.check:
            for case in guarded("checks")(run_checks)() or []:
                guarded(f"check {case[1]}")(check)(*case)
        text = table()
        with open(os.path.join(out_dir, "gpu_varlen_bwd_matched.json"), "w") as f:
            json.dump({"meta": _meta(), **RESULTS, "elapsed_s": time.time() - START[0]}, f, indent=1, default=str)
        print(text)
        print(f"elapsed {time.time() - START[0]:.1f} s")
        return
    if PROBE:
        run_checks()
        with open(os.path.join(out_dir, f"gpu_varlen_bwd_probe_{PROBE}.json"), "w") as f:
            json.dump({"check": RESULTS["check"], "errors": RESULTS["errors"]}, f, default=str)
        return
    for path in ("fused", "split"):
        probe(path, 20.0)
    later = run_checks()
    timed = None
    if not args.no_time:
        lengths = [16, 40, 3, 25] if SMOKE else long_tailed_lengths(65536)
        timed = guarded("time long-tailed backward")(time_backward)(lengths, h=2 if SMOKE else 16,
                                                                    d=16 if SMOKE else 128)
    for case in later:
        guarded(f"check {case[1]}")(check)(*case)
    guarded("check non-finite neighbour, zero_tail")(check_neighbour_nonfinite)(True)
    guarded("check non-finite neighbour, zero_tail, split")(check_neighbour_nonfinite)(True, "gluon")
    guarded("check non-finite neighbour")(check_neighbour_nonfinite)(False)
    if not args.no_time and timed is not None:
        guarded("time variants")(time_variants)(timed[0], timed[1], d=16 if SMOKE else 128)
    if not args.no_time and timed is not None:
        guarded("time peers")(time_peers)(timed[0], lengths, timed[1], h=2 if SMOKE else 16, d=16 if SMOKE else 128)
    text = table()
    with open(os.path.join(out_dir, "gpu_varlen_bwd.json"), "w") as f:
        json.dump({"meta": _meta(), "broken": sorted(BROKEN), **RESULTS, "elapsed_s": time.time() - START[0]}, f,
                  indent=1, default=str)
    print(text)
    print(f"elapsed {time.time() - START[0]:.1f} s")


if __name__ == "__main__":
    main()

"""Run a compiled diagram: napkin.compile's Triton source imported from a cache file, launched per kernel.

    from tilecore.napkin import models
    from tilecore.ops.napkin_compiled import compile_diagram
    f = compile_diagram(models.gated_mlp(tokens=256, model=128, hidden=256, dtype="fp16"))
    out = f(X=x, W1=w1, W3=w3, W2=w2)            # {"Y": tensor}

Inputs are given by name, shaped as the diagram's axes say, in the diagram's dtype (fp16, bf16 or
fp32), on one device; outputs and intermediates are allocated here in their diagram dtypes.
"""
from __future__ import annotations

import hashlib
import importlib.util
import tempfile
from pathlib import Path

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from tilecore import dispatch
from tilecore.napkin.compile import CompileError, Program, compile as napkin_compile
from tilecore.napkin.diagram import Diagram

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_MODULES: dict = {}


def _module(source: str):
    """Import the emitted source from a file named by its hash (Triton's JIT needs a source file)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:20]
    if key not in _MODULES:
        folder = Path(tempfile.gettempdir()) / "tilecore_napkin_compiled"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"diagram_{key}.py"
        if not path.exists() or path.read_text() != source:
            tmp = path.with_suffix(f".{id(source)}.tmp")
            tmp.write_text(source)
            tmp.replace(path)
        spec = importlib.util.spec_from_file_location(f"tilecore_napkin_compiled_{key}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _MODULES[key] = mod
    return _MODULES[key]


def _blocks(device: torch.device, family: str) -> dict:
    """Tile sizes: small where the interpreter runs (it is slow per element), H100-sized on a GPU."""
    if device.type != "cuda":
        return {"chain": dict(BM=16, BN=32, BK=16, GROUP=4), "attention": dict(BM=16, BN=16),
                "rownorm": dict(BM=16, BO=32, BK=32, GROUP=2)}[family]
    # the fastest of the timed blocks on the H100 (notes/napkin/compile.md): chain 1.20x, attention 1.21-1.31x
    # the earlier defaults, rownorm's BO 256 1.18x BO 128; causal attention: attention_blocks
    return {"chain": dict(BM=128, BN=256, BK=64, GROUP=8, num_warps=8, num_stages=4),
            "attention": dict(BM=128, BN=64, num_warps=8, num_stages=3),
            "rownorm": dict(BM=128, BO=256, BK=64, GROUP=8, num_warps=8, num_stages=3)}[family]


def _attention_blocks(device: torch.device, causal: bool, d128_tma: bool = False) -> dict:
    """Causal attention on a GPU: 64 x 64 tiles, 4 warps, 3 stages (two programs an SM, whose softmax and
    MMAs interleave) against the family's BM 128 BN 64 with 8 warps: softcap_approx 1.064x, the exact softcap
    1.006x, plain D128 1.044-1.045x, D64 1.011-1.012x (H100, interleaved rounds; notes/napkin/compile.md).
    Not causal: the family's blocks (plain D64 with BM 64 tiles: 1.066x its time), but a softmax at D = E =
    128 through TMA with no score modifier other than scale(c) and softcap_approx(C) (d128_tma: see
    d128_tma_modifiers) in 2 stages with the registers capped at 128 (126, no spills; 96 KiB): two 8-warp
    programs an SM, plain 1.019x / 1.026x, softcap_approx 1.049x (the pointer kernel would spill 20 B there;
    the exact softcap: 1.003x, not taken)."""
    if causal and device.type == "cuda":
        return dict(BM=64, BN=64, num_warps=4, num_stages=3)
    if d128_tma and device.type == "cuda":
        return dict(BM=128, BN=64, num_warps=8, num_stages=2, maxnreg=128)
    return _blocks(device, "attention")


def _head_group(causal: bool) -> int:
    """The attention kernel's program order (HEAD_GROUP): causal, 4 heads at a time with the longest query
    tiles first (1.056x a head's tiles in order on the H100); otherwise a head's tiles in order (0: 1.017x
    the groups of 4 there). notes/napkin/compile.md."""
    return 4 if causal else 0


def d128_tma_modifiers(d: Diagram) -> bool:
    """Whether an attention diagram's full loop may take _attention_blocks' two programs an SM at D = E = 128
    through TMA: a softmax whose score modifiers are only scale(c) and softcap_approx(C) (the timed cases)."""
    return any(op.kind == "softmax_contract" for op in d.ops) and all(
        op.label.strip().startswith(("scale(", "softcap_approx(")) for op in d.ops if op.kind == "map")


def attention_defaults(device: torch.device, causal: bool, d128_tma: bool = False) -> dict:
    """The blocks and program order an attention diagram launches with by default (d128_tma: a softmax whose
    score modifiers are only scale(c) and softcap_approx(C), D = E = 128, loaded through TMA descriptors)."""
    return dict(_attention_blocks(device, causal, d128_tma), HEAD_GROUP=_head_group(causal))


def _tma_ok(device: torch.device, tensors) -> bool:
    """Host tensor descriptors: a GPU with TMA (or the interpreter, which emulates them), rows
    contiguous, row strides and base addresses 16-byte aligned."""
    if not dispatch.tma_ok(device):
        return False
    for x in tensors:
        q = x.element_size()
        if x.stride(-1) != 1 or any((st * q) % 16 for st in x.stride()[:-1]) or x.data_ptr() % 16:
            return False
    return True


def _heads_flat(t: torch.Tensor) -> bool:
    """Can (B, H, N, D) be viewed as (B*H, N, D) without a copy?"""
    return t.shape[0] == 1 or t.stride(0) == t.stride(1) * t.shape[1]


class CompiledDiagram:
    """A diagram's kernels, ready to launch: call it with the input tensors by name."""

    def __init__(self, program: Program, blocks: dict | None = None):
        self.program = program
        self.diagram = program.diagram
        self.blocks = blocks
        self.module = _module(program.source)

    @property
    def source(self) -> str:
        return self.program.source

    def _check(self, inputs: dict) -> torch.device:
        d = self.diagram
        names = [a.name for a in d.inputs()]
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            raise ValueError(f"{d.name}: inputs {', '.join(names)} by name; "
                             + (f"missing {missing}" if missing else f"unknown {extra}"))
        devices = {t.device for t in inputs.values()}
        if len(devices) != 1:
            raise ValueError(f"{d.name}: inputs on one device, got {sorted(map(str, devices))}")
        for n in names:
            arr, t = d.arrays[n], inputs[n]
            want = tuple(d.sizes[a] for a in arr.axes)
            if tuple(t.shape) != want:
                raise ValueError(f"{d.name}: {n} must have shape {want} (axes {arr.axes}), got {tuple(t.shape)}")
            if t.dtype != TORCH_DTYPES[arr.dtype]:
                raise ValueError(f"{d.name}: {n} must be {TORCH_DTYPES[arr.dtype]} ({arr.dtype}), got {t.dtype}")
        return devices.pop()

    def _empty(self, name, device, poison: bool):
        arr = self.diagram.arrays[name]
        shape = [self.diagram.sizes[a] for a in arr.axes]
        t = torch.empty(shape, dtype=TORCH_DTYPES.get(arr.dtype, torch.float32), device=device)
        return t.fill_(float("nan")) if poison else t

    def __call__(self, poison: bool = False, **inputs) -> dict:
        device = self._check(inputs)
        if dispatch.backend_for(device) != "kernel":  # an old GPU gets its clear error here
            raise ValueError(f"{self.diagram.name}: compiled diagrams run on CUDA tensors or under "
                             "TRITON_INTERPRET=1; use tilecore.ops.napkin_compiled.evaluate on the CPU")
        vals = dict(inputs)
        for k in self.program.kernels:
            out = k.args[-1]
            vals[out] = self._empty(out, device, poison)
            getattr(self, "_launch_" + k.family)(k, vals, device)
        return {o: vals[o] for o in self.diagram.outputs}

    # ---------------------------------------------------------------- launches
    def _launch_chain(self, k, vals, device):
        blk = dict(self.blocks or _blocks(device, "chain"))
        t, kk, f = k.info["axes"]
        A, out = vals[k.args[0]], vals[k.args[-1]]
        ws = [vals[n] for n in k.args[1:-1] if n not in k.info["extras"]]
        if len(ws) > 1 and device.type == "cuda":
            # BN is the tile's total accumulator width: one accumulator a weight, all in registers
            blk["BN"] = max(32, blk["BN"] // len(ws))
        extras = [vals[n] for n in k.info["extras"]]
        M, K, N = A.shape[0], A.shape[1], out.shape[1]
        e_strides = []
        for n, ax in k.info["extras"].items():
            x = vals[n]
            e_strides += [x.stride(ax.index(t)) if t in ax else 0, x.stride(ax.index(f)) if f in ax else 0]
        grid = (triton.cdiv(M, blk["BM"]) * triton.cdiv(N, blk["BN"]),)
        use_tma = blk.pop("tma", None)
        if use_tma is None:
            use_tma = _tma_ok(device, [A, *ws])
        name, a_arg, w_args = k.name, A, ws
        if use_tma:  # TMA loads: the hardware zero-fills past the bounds, no masks in the loop
            name = k.name + "_tma"
            a_arg = TensorDescriptor.from_tensor(A, [blk["BM"], blk["BK"]])
            w_args = [TensorDescriptor.from_tensor(w, [blk["BK"], blk["BN"]]) for w in ws]
        getattr(self.module, name)[grid](
            a_arg, *w_args, *extras, out, M, N, K, A.stride(0), A.stride(1),
            *[s for w in ws for s in (w.stride(0), w.stride(1))], *e_strides, out.stride(0), out.stride(1), **blk)

    def _launch_attention(self, k, vals, device):
        blk = dict(self.blocks or {})
        Q, K, V, O = (vals[n] for n in k.args)
        lead = len(k.info["lead"])

        def four(t):  # [B, H, N, D] views of 2-, 3- or 4-D tensors
            for _ in range(2 - lead):
                t = t.unsqueeze(0)
            return t
        Q4, K4, V4, O4 = (four(t) for t in (Q, K, V, O))
        B, H, NQ, D = Q4.shape
        NX, E = K4.shape[2], V4.shape[3]
        use_tma = blk.pop("tma", None)
        flat = [t.reshape(B * H, t.shape[2], t.shape[3]) if _heads_flat(t) else None for t in (Q4, K4, V4)]
        if use_tma is None:
            use_tma = all(f is not None for f in flat) and _tma_ok(device, [f[0] for f in flat])
        if not self.blocks:
            blk = _attention_blocks(device, k.info["causal"], bool(use_tma and D == E == 128 and d128_tma_modifiers(
                self.diagram)))
        grid = (triton.cdiv(NQ, blk["BM"]) * B * H,)
        blk.setdefault("HEAD_GROUP", _head_group(k.info["causal"]))
        kernel, args = self.module.attention_fwd, (Q4, K4, V4)
        if use_tma:  # [B*H, N, D] descriptors: TMA zero-fills past N within each head
            kernel = self.module.attention_fwd_tma
            args = (TensorDescriptor.from_tensor(flat[0], [1, blk["BM"], D]),
                    TensorDescriptor.from_tensor(flat[1], [1, blk["BN"], D]),
                    TensorDescriptor.from_tensor(flat[2], [1, blk["BN"], E]))
        kernel[grid](*args, O4, H, NQ, NX, *Q4.stride(), *K4.stride(), *V4.stride(), *O4.stride(),
                     D=D, E=E, CAUSAL=k.info["causal"], EVEN_Q=NQ % blk["BM"] == 0, EVEN_X=NX % blk["BN"] == 0, **blk)

    def _launch_rownorm(self, k, vals, device):
        blk = dict(self.blocks or _blocks(device, "rownorm"))
        X = vals[k.args[0]]
        vecs = [vals[n] for n in k.info["vecs"]]
        rows = [vals[n] for n in k.info["rows"]]
        P, out = vals[k.args[-2]], vals[k.args[-1]]
        M, N = X.shape
        NO = P.shape[1]
        grid = (triton.cdiv(M, blk["BM"]) * triton.cdiv(NO, blk["BO"]),)
        use_tma = blk.pop("tma", None)
        if k.info["prescale"]:  # P' = vector factors * P first (one pass over P): x then goes straight to the MMA
            P2 = torch.empty(P.shape, dtype=P.dtype, device=P.device)
            pre = (triton.cdiv(N, 64), triton.cdiv(NO, 64))
            self.module.prescale_weight[pre](P, *vecs, P2, N, NO, P.stride(0), P.stride(1), BK=64, BO=64)
            P = P2
        if use_tma is None:
            use_tma = _tma_ok(device, [X, P])
        kernel, x_arg, p_arg = self.module.rownorm_gemm, X, P
        if use_tma:  # TMA loads of the rows and the weight; zero past the bounds
            kernel = self.module.rownorm_gemm_tma
            x_arg = TensorDescriptor.from_tensor(X, [blk["BM"], blk["BK"]])
            p_arg = TensorDescriptor.from_tensor(P, [blk["BK"], blk["BO"]])
        sizes = (M, N, NO, X.stride(0), X.stride(1), P.stride(0), P.stride(1), out.stride(0), out.stride(1))
        if k.info["row_factor"]:  # F[M] (fp32) by its own pass, then the GEMM scales its accumulator by it
            F = torch.empty(M, dtype=torch.float32, device=device)
            # on a GPU 16 rows x 256 columns a step, 4 warps: many small programs an SM keep the loads of a
            # bandwidth-bound pass in flight (M / 16 of them)
            fm, fk, fw = (16, 256, 4) if device.type == "cuda" else (blk["BM"], blk["BK"], 4)
            self.module.row_factor[(triton.cdiv(M, fm),)](X, *vecs, *rows, F, M, N, X.stride(0), X.stride(1),
                                                         BM=fm, BK=fk, num_warps=fw)
            kernel[grid](x_arg, *([] if k.info["prescale"] else vecs), F, p_arg, out, *sizes, **blk)
        else:
            kernel[grid](x_arg, *vecs, *rows, p_arg, out, *sizes, **blk)


def compile_diagram(diagram: Diagram, blocks: dict | None = None) -> CompiledDiagram:
    """napkin.compile(diagram), imported and ready to run. Raises CompileError (a ValueError) naming
    the families where the diagram fits none."""
    if not isinstance(diagram, Diagram):
        raise TypeError(f"compile_diagram takes a tilecore.napkin.Diagram, got {type(diagram).__name__}")
    return CompiledDiagram(napkin_compile(diagram), blocks)


__all__ = ["CompileError", "CompiledDiagram", "attention_defaults", "compile_diagram"]

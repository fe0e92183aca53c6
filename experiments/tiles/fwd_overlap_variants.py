"""Does ptxas keep the attention forward's softmax beside its own in-flight P V wgmma, in variants of the
shipped Gluon forward (tilecore/ops/attention/gluon_kernels.py) made here by text edits of its source into a
temporary module (the library untouched)? Compiled for sm_90a on the CPU; for each variant: registers,
spilled bytes, the highest register named, and per ``DEPBAR.LE gsb0, 0x1`` site (wgmma_overlap.py) the
instructions and EX2 run before the P V wait, the EX2 after it, and writes of the in-flight A registers.

    python experiments/tiles/fwd_overlap_variants.py [--variants shipped,regs240,p2,p2_regs240] [--configs d128,...]

Variants: shipped; regs240 (consumers 240 registers, the producer 24: FA3's split); p2 (P double-buffered:
an even step's P in one loop-carried buffer, an odd step's in another, so a step's new P is never packed
into the registers its in-flight P V reads); p2_regs240 (both). Session 33 (triton 3.6.0): no variant
overlaps the softmax in every site without spilling (notes/distributed/README.md, session 33).
"""
import argparse
import importlib.util
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

REGS = ("CONSUMER_REGS=160 if CONSUMERS == 3 else 232,\n                    PRODUCER_REGS=24 if CONSUMERS == 3 else 40,",
        "CONSUMER_REGS=160 if CONSUMERS == 3 else 240,\n                    PRODUCER_REGS=24,")
P2 = [
    ("    p: object\n    rows: object", "    p: object\n    p2: object\n    rows: object"),
    ("        return Running(m, l, acc, gl.zeros([self.BM, self.BN], self.q_desc.dtype, self.P), rows, pending, q)",
     "        p0 = gl.zeros([self.BM, self.BN], self.q_desc.dtype, self.P)\n"
     "        return Running(m, l, acc, p0, p0, rows, pending, q)"),
    ("    def s_and_pv(self, q, k_t, v, st, acc, first_key):", "    def s_and_pv(self, q, k_t, v, st, acc, first_key, p_in=None):"),
    ("        o_tok = warpgroup_mma(st.p, v, acc, is_async=True)",
     "        if p_in is None:\n            o_tok = warpgroup_mma(st.p, v, acc, is_async=True)\n"
     "        else:\n            o_tok = warpgroup_mma(p_in, v, acc, is_async=True)"),
    ("""            elif step < st.rows.n_blocks:
                m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, st.acc, step * self.BN)
                st = st.replace(m=m, l=l, acc=acc * alpha, p=self.p_operand(p32))
            elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
                st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
        elif step == 0:""",
     """            elif step < st.rows.n_blocks:
                if step % 2 == 1:
                    m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, st.acc, step * self.BN, st.p)
                    st = st.replace(m=m, l=l, acc=acc * alpha, p2=self.p_operand(p32))
                else:
                    m, l, p32, alpha, acc = self.s_and_pv(q, k_t, v, st, st.acc, step * self.BN, st.p2)
                    st = st.replace(m=m, l=l, acc=acc * alpha, p=self.p_operand(p32))
            elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
                if step % 2 == 1:
                    st = st.replace(acc=warpgroup_mma(st.p, v, st.acc))
                else:
                    st = st.replace(acc=warpgroup_mma(st.p2, v, st.acc))
        elif step == 0:"""),
]
VARIANTS = {"shipped": [], "regs240": [REGS], "p2": P2, "p2_regs240": P2 + [REGS]}
CONFIGS = {  # the shipped D128 forward configurations (port_resources.py's)
    "d128": (False, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2)),
    "d128_qregs": (False, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2, q_regs=True)),
    "d128_causal": (True, dict(block_m=64, block_n=128, stages=2, consumers=2, q_buffers=2)),
}


def variant_module(edits, tmp):
    import tilecore.ops.attention.gluon_kernels as shipped

    text = open(shipped.__file__).read()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"edit does not apply once: {old[:60]!r}")
        text = text.replace(old, new)
    path = os.path.join(tmp, f"gk_{len(os.listdir(tmp))}.py")
    open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    a = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor as desc
    from wgmma_overlap import overlaps, sass_of

    with tempfile.TemporaryDirectory() as tmp:
        for vname in a.variants.split(","):
            mod = variant_module(VARIANTS[vname], tmp)
            for cname in a.configs.split(","):
                causal, cfg = CONFIGS[cname]
                t = torch.empty(2, 4, 256, 128, dtype=torch.bfloat16)
                head = lambda rows: desc(t, [1, 1, rows, 128])  # noqa: E731
                args = dict(q_desc=head(64), k_desc=head(128), v_desc=head(128), o_desc=head(64),
                            lse_ptr=torch.empty(8, dtype=torch.float32), H=4, N=256, Nk=256, GROUP=1, scale_log2e=0.1,
                            num_bh=8, head_group=4, schedule=torch.empty(8, dtype=torch.int32) if causal else None,
                            left=0, right=0, tanh_scale=0.0, CAUSAL=causal, STAGES=cfg["stages"],
                            CONSUMERS=cfg["consumers"], Q_BUFFERS=cfg["q_buffers"], CARRY=False,
                            Q_REGS=cfg.get("q_regs", False), WINDOW=False, SOFTCAP=False)
                k = compile_kernel(mod.attention_fwd_kernel, args, num_warps=4)
                r = resources(k)
                ptx = os.path.join(tmp, "k.ptx")
                open(ptx, "w").write(k.asm["ptx"])
                ins = sass_of(ptx)
                top = max(int(x) for _, t_ in ins for x in re.findall(r"\bR(\d+)\b", t_))
                sites = " ".join(f"{x['instructions_overlapped']}/{x['ex2_overlapped']}/{x['ex2_after_wait0']}/{x['a_writes']}"
                                 for x in overlaps(ins))
                print(f"{vname:<11} {cname:<12} registers {r.registers} spilled {r.spill_stores + r.spill_loads:>5} B "
                      f"top R{top}  sites (instr/EX2 before the P V wait, EX2 after, A writes): {sites}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

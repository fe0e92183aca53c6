"""docs/tiles.md, the tutorial that builds a GEMM with a SiLU-gate epilogue on the tiles template: its
` ```python ` blocks, joined, are a module whose Gluon kernel compiles for sm_90a as the doc says
(wgmma and TMA in the PTX, no spills, wgmma not serialized, the shared memory and threads it states);
its ` ```python tl ` blocks are the op's tl twin, which runs in the interpreter against the doc's float64
reference; and the line counts the doc states are the code's."""
import ast
import importlib.util
import io
import os
import re
import tokenize
from pathlib import Path

import pytest
import torch

from tilecore import accuracy
from compiled_run import compiled_json

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tiles.md"
GLUON_OP = ("Stage", "Tile", "Acc", "SiluGate", "silu_gate_kernel")  # the op-specific Gluon code
TL_OP = ("Stage", "Tile", "Acc", "SiluGate", "silu_gate_tl_kernel")


def doc_text() -> str:
    return DOC.read_text()


def module(tag: str) -> str:
    """The doc's code blocks fenced as ``tag`` ("python", or "python tl"), joined in order."""
    return "\n\n".join(re.findall(rf"```{tag}\n(.*?)```", doc_text(), flags=re.S))


def code_lines(src: str, names) -> int:
    """Lines of the top-level definitions ``names`` (decorators included) that are code: not blank, not
    comments, not docstrings (experiments/tiles/code_lines.py's measure)."""
    tree = ast.parse(src)
    docstrings, spans, found = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    for node in tree.body:
        if getattr(node, "name", None) in names:
            found.add(node.name)
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans.update(range(start, node.end_lineno + 1))
    assert found == set(names), f"missing from the doc's code: {set(names) - found}"
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(line for line in range(tok.start[0], tok.end[0] + 1) if line in spans and line not in docstrings)
    return len(lines)


def stated(pattern: str) -> list[int]:
    """Every number the doc states in ``pattern`` (one group; whitespace may break lines)."""
    return [int(v.replace(",", "")) for v in re.findall(pattern.replace(" ", r"\s+"), doc_text())]


def test_stated_line_counts_are_the_code():
    gluon, tl = code_lines(module("python"), GLUON_OP), code_lines(module("python tl"), TL_OP)
    print(f"op-specific code lines: Gluon {gluon}, tl twin {tl}")
    assert stated(r"(\d+) lines of op-specific Gluon code") == [gluon, gluon]  # the intro and section 7
    assert stated(r"(\d+) lines of op-specific tl code") == [tl]


COMPILE = r'''
import json, re, sys, torch
sys.path.insert(0, sys.argv[1])
import tiles_tutorial as t
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
x = torch.empty(512, 512, dtype=torch.bfloat16)
out = []
for config in (dict(), dict(stages=4), dict(consumers=1)):
    args = t.silu_gate_args(x, x, x, x, **config)
    k = compile_kernel(t.silu_gate_kernel, args, num_warps=8 // args["CONSUMERS"])
    ptx = k.asm["ptx"]
    r = resources(k)
    out.append(dict(config=config, wgmma_count=len(re.findall(r"wgmma\.mma_async", ptx)),
                    **has_hopper_instructions(ptx), **vars(r)))
print(json.dumps(out))
'''


def test_gluon_kernel_compiles_for_hopper(tmp_path):
    (tmp_path / "tiles_tutorial.py").write_text(module("python"))

    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    default, four_stages, one_consumer = compiled_json(COMPILE, str(tmp_path), timeout=600, cwd=ROOT,
                                                       env={"PYTHONPATH": path})
    for k in (default, four_stages, one_consumer):
        print(k)
        assert k["wgmma"] and k["wgmma_count"] > 0 and k["tma"] and k["mbarrier"], k
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0 and k["stack"] == 0, k
        assert not k["wgmma_serialized"], k  # ptxas's C7513
        assert k["shared"] <= 227 * 1024 and k["threads"] == 384, k
    # what the doc says of the default configuration
    assert stated(r"which gives (\d+) wgmma") == [default["wgmma_count"]]
    assert stated(r"([\d,]+) bytes of shared memory") == [default["shared"]]
    assert stated(r"(\d+) registers at launch") == [default["registers"]]


def load(tag: str, name: str, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text(module(tag))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (70, 45, 100), (33, 65, 17), (64, 96, 128)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tl_twin_matches_the_reference(M, N, K, dtype, tmp_path):
    """In the interpreter (the tests run under TRITON_INTERPRET=1); fp16 within 1.6x its rounding floor,
    fp32 (float32 sums over K) within a relative RMS error of 1e-6."""
    main, twin = load("python", "tiles_tutorial", tmp_path), load("python tl", "tiles_tutorial_tl", tmp_path)
    x, w_gate, w_up = (torch.randn(*shape, dtype=dtype) for shape in ((M, K), (K, N), (K, N)))
    out = twin.silu_gate_tl(x, w_gate, w_up)
    ref = main.silu_gate_reference(x, w_gate, w_up)
    assert out.shape == (M, N) and out.dtype == dtype and torch.isfinite(out).all()
    if dtype == torch.float16:
        assert accuracy.error_over_floor(out, ref) < 1.6
    else:
        assert accuracy.rel_rms(out, ref) < 1e-6

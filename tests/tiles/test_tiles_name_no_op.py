"""Issue 30's target "tiles/ with no switch that names an op": no identifier or string in the code of
tilecore/tiles/ (docstrings and comments left out: they may say which op uses a tile) names an op, but
for the tile vocabulary's own names (the online softmax's steps, quantize/dequantize of a tile)."""
import ast
import io
import re
import tokenize
from pathlib import Path

TILES = Path(__file__).resolve().parents[2] / "tilecore" / "tiles"

# op names of tilecore/ops (and their usual spellings), as whole words or name parts
OP_NAMES = re.compile(r"(?<![a-z])(attention|attn|hadamard|gemm|matmul|rms_?norm|layer_?norm|rotary|fft|conv(?!ert)|"
                      r"decode|kv_?cache|varlen|mla|linear_attention|fp8_attention|quantize_wide)(?![a-z])", re.I)
# the tile vocabulary's names that contain an op-like word
VOCABULARY = {"online_softmax_start", "online_softmax_update", "online_softmax_result"}


def _code_tokens(path: Path):
    """(line, text) of the NAME and STRING tokens outside docstrings."""
    src = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.NAME, tokenize.STRING) and tok.start[0] not in docstrings:
            yield tok.start[0], tok.string


def test_tiles_code_names_no_op():
    files = sorted(TILES.rglob("*.py"))
    assert len(files) >= 10  # the package was found (tiles/, tiles/gluon/)
    hits = [f"{p.relative_to(TILES)}:{line}: {text}" for p in files for line, text in _code_tokens(p)
            if text not in VOCABULARY and OP_NAMES.search(text)]
    assert hits == [], "tiles/ names an op in code:\n" + "\n".join(hits)


def test_the_check_sees_an_op_switch(tmp_path):
    """The scan catches what it is for: a branch on an op's name, and a flag named after one."""
    bad = tmp_path / "bad.py"
    bad.write_text('"""doc: attention is fine here."""\nIS_ATTENTION = 1\nif kind == "gemm":\n    pass\n')
    texts = [text for _, text in _code_tokens(bad) if text not in VOCABULARY and OP_NAMES.search(text)]
    assert texts == ["IS_ATTENTION", '"gemm"']

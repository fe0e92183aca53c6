"""Lines of code in Python files: not blank, not comments, not docstrings (the measure of issue 30's
size targets: the attention forward's op-specific Gluon code, the GEMM's).

    python experiments/tiles/code_lines.py FILE...
"""
import ast
import io
import sys
import tokenize


def code_lines(path: str) -> int:
    src = open(path).read()
    docstrings = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        for line in range(tok.start[0], tok.end[0] + 1):
            if line not in docstrings:
                lines.add(line)
    return len(lines)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"{code_lines(p):5d}  {p}")

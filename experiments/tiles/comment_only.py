"""Is a change to Python files comment-only? Compares each file's tokens, comments and line breaks left out,
with the same file at a git revision (HEAD by default): equal token streams mean the same program (docstrings
are strings, so a docstring edit is a code change here).

    python experiments/tiles/comment_only.py [--rev REV] FILE...

Prints one line a file and exits 1 if any file changed more than comments (or does not parse).
Used for issue 30's comment clean-ups in files other helpers own (session 34): the run history moved from
comments to the notes, the code untouched.
"""
import argparse
import io
import subprocess
import sys
import tokenize

SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENCODING, tokenize.ENDMARKER}


def code_tokens(text: str) -> list[tuple[int, str]]:
    """The file's tokens without comments or line structure: (type, string) pairs. A comment-only line's
    removal changes NL tokens only; INDENT/DEDENT are left out too (a comment line never makes one), and a
    statement's end is kept by its NEWLINE's absence being the same on both sides (the next token follows)."""
    toks = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(t.type, t.string) for t in toks if t.type not in SKIP]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    bad = 0
    for path in a.files:
        old = subprocess.run(["git", "show", f"{a.rev}:{path}"], capture_output=True, text=True)
        if old.returncode:
            print(f"{path}: not at {a.rev}")
            bad += 1
            continue
        new = open(path).read()
        try:
            same = code_tokens(old.stdout) == code_tokens(new)
            # the line structure of the code too: a comment edit must not join or split statements
            same = same and _statement_lines(old.stdout) == _statement_lines(new)
        except (tokenize.TokenError, SyntaxError, IndentationError) as e:
            print(f"{path}: does not tokenize ({e})")
            bad += 1
            continue
        n_old, n_new = old.stdout.count("\n"), new.count("\n")
        verdict = "unchanged" if new == old.stdout else "comments only" if same else "CODE CHANGED"
        print(f"{path}: {verdict} ({n_old} -> {n_new} lines)")
        bad += not same
    return 1 if bad else 0


def _statement_lines(text: str) -> list[tuple[int, int, str]]:
    """Each code token with its indentation level and whether a logical line ends after it, so that moving a
    statement into another block or splitting one shows."""
    out, depth = [], 0
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type == tokenize.INDENT:
            depth += 1
        elif t.type == tokenize.DEDENT:
            depth -= 1
        elif t.type == tokenize.NEWLINE and out:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + "\n")
        elif t.type not in SKIP:
            out.append((t.type, depth, t.string))
    return out


if __name__ == "__main__":
    sys.exit(main())

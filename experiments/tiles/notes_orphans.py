"""Issue 30's deliverable 7 ("run JSONs under notes/<op>/runs/, each referenced from it; orphans
removed"), checked: every file under notes/*/runs/ that no note names.

A file counts as referenced where a markdown file of notes/ or docs/, or README.md, names it (its
name or its name without the extension), or names a pattern that matches it (``*`` and ``{a,b}``
as the notes write them: ``runs/attention_bwd_late_run{1,2}_session15_h100.json``). A file no note
names is "covered" where a sibling of the same run is named (the same ``<job>_run<k>_session<s>``
or ``<job>_session<s>`` prefix: a run's JSON beside its named log), else an orphan.

    python experiments/tiles/notes_orphans.py            (per op: files, named, covered, orphans)
    python experiments/tiles/notes_orphans.py --list     (and every orphan's path)
    python experiments/tiles/notes_orphans.py --json out.json
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r"[A-Za-z0-9_.*{},/-]+")
RUN_PREFIX = re.compile(r"^(.*?_session\d+[a-z]?)")


def expand(pattern: str) -> list[str]:
    """``{a,b}`` alternatives expanded (nested and several groups), as a shell would."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand(pattern[:m.start()] + alt + pattern[m.end():])]


def documents() -> list[Path]:
    docs = [p for p in (ROOT / "notes").rglob("*.md") if "runs" not in p.relative_to(ROOT / "notes").parts[:-1]]
    docs += list((ROOT / "docs").rglob("*.md")) if (ROOT / "docs").is_dir() else []
    readme = ROOT / "README.md"
    return docs + ([readme] if readme.exists() else [])


def scan() -> dict:
    text = "\n".join(p.read_text(errors="replace") for p in documents())
    words = set(TOKEN.findall(text))
    patterns = []
    for w in words:
        base = w.rstrip(".,)").split("/")[-1]
        literal = re.sub(r"[*{},]", "", base)
        if ("*" in base or "{" in base) and "session" in base and len(literal) >= 12:  # not markdown's ** or a glob alone
            patterns += expand(base)
    names = {w.rstrip(".,)").split("/")[-1] for w in words}
    report = {}
    for runs in sorted((ROOT / "notes").glob("*/runs")):
        op = runs.parent.name
        files = sorted(p.name for p in runs.iterdir() if p.is_file())

        def named(f):
            stem = f.rsplit(".", 1)[0]
            return (f in names or stem in names or any(stem in n for n in names if len(n) > len(stem))
                    or any(fnmatch.fnmatch(f, p) or fnmatch.fnmatch(stem, p) for p in patterns))

        hit = {f for f in files if named(f)}
        prefixes = {m.group(1) for f in hit if (m := RUN_PREFIX.match(f))}
        covered = {f for f in files if f not in hit and (m := RUN_PREFIX.match(f)) and m.group(1) in prefixes}
        orphans = [f for f in files if f not in hit and f not in covered]
        report[op] = {"files": len(files), "named": len(hit), "covered": len(covered), "orphans": orphans}
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="every orphan's path")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = scan()
    print(f"{'notes/<op>/runs':<20}{'files':>7}{'named':>7}{'covered':>9}{'orphans':>9}")
    for op, r in report.items():
        print(f"{op:<20}{r['files']:>7}{r['named']:>7}{r['covered']:>9}{len(r['orphans']):>9}")
    total = {k: sum(r[k] if k != "orphans" else len(r[k]) for r in report.values())
             for k in ("files", "named", "covered", "orphans")}
    print(f"{'all':<20}{total['files']:>7}{total['named']:>7}{total['covered']:>9}{total['orphans']:>9}")
    if args.list:
        for op, r in report.items():
            for f in r["orphans"]:
                print(f"notes/{op}/runs/{f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

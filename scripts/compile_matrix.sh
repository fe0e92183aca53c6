#!/usr/bin/env bash
# The triton compile matrix: every Gluon kernel variant compiled for sm_90a (no GPU) under each triton
# release the kernels claim (tilecore/tiles/gluon/compat.py's TESTED), a table of the results and the
# wall time. Compile only: registers, spills and wgmma serialization come from ptxas; nothing runs.
#
#   bash scripts/compile_matrix.sh [--quick] [-j N] [--json FILE] [VERSION ...]
#
# --quick: one variant of each kernel (experiments/tiles/port_resources.py --quick) instead of all 34.
# -j N: compile N triton versions at once (default 1). --json: every row, per version, to FILE.
# VERSION: releases to check (default: TESTED). The project's own .venv serves its triton; every other
# release gets a venv of its own, cached under $TILECORE_MATRIX_DIR (default ~/.cache/tilecore-matrix),
# holding only triton==VERSION: torch and numpy come from the project's .venv through a .pth line, so a
# venv costs one triton download (about a minute) and ~1 GB of disk. A venv that cannot be built (no
# network) is reported as "no venv", not as a failure of the kernels.
# Exit status: 0 when every variant compiled under every version whose venv exists, 1 when any failed,
# 2 when no venv could be built for a version asked for (and nothing failed).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || bash "$root/scripts/setup.sh"
cache="${TILECORE_MATRIX_DIR:-$HOME/.cache/tilecore-matrix}"
quick=() jobs=1 json="" versions=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    -j) jobs="$2"; shift ;;
    --json) json="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) versions+=("$1") ;;
  esac
  shift
done
if [ ${#versions[@]} -eq 0 ]; then  # compat.TESTED, read without importing triton
  read -r -a versions < <("$py" -c "import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
print(*next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
            and getattr(n.targets[0], 'id', '') == 'TESTED'))" "$root/tilecore/tiles/gluon/compat.py")
fi
mkdir -p "$cache"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
installed="$("$py" -c "import triton; print(triton.__version__.split('+')[0])")"
site="$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
pyver="$("$py" -c "import sys; print('py%d.%d' % sys.version_info[:2])")"  # the venvs share the .venv's torch

venv_for() {  # prints the python that has triton $1, building its venv if need be; fails without network
  local v="$1" dir="$cache/triton-$1-$pyver"
  if [ "$v" = "$installed" ]; then echo "$py"; return 0; fi
  (
    flock 9
    if [ ! -f "$dir/.tilecore-ok" ]; then
      rm -rf "$dir"
      "$py" -m venv "$dir" >&2 || exit 1
      "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps "triton==$v" 2>&1 \
        | grep -v "^WARNING: Location" >&2
      "$dir/bin/python" -c "import triton" 2>/dev/null || exit 1
      touch "$dir/.tilecore-ok"
    fi
    # torch and numpy from the project's venv (after the venv's own site-packages: its triton wins)
    echo "$site" > "$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tilecore-matrix.pth"
  ) 9>"$dir.lock" || return 1
  echo "$dir/bin/python"
}

check() {  # one version: $out/$v.json (rows), $out/$v.log, $out/$v.status (ok | failed | novenv), $out/$v.secs
  local v="$1" start=$SECONDS vpy
  if ! vpy="$(venv_for "$v" 2>"$out/$v.log")"; then
    echo novenv > "$out/$v.status"; echo 0 > "$out/$v.secs"; return
  fi
  # TRITON_DEFAULT_FP_FUSION=1: 3.9 warns that its default changes in 3.10; keep today's (fusion on)
  if TRITON_CACHE_DIR="$cache/kernels-$v" TRITON_DEFAULT_FP_FUSION=1 \
      "$vpy" "$root/experiments/tiles/port_resources.py" --root "$root" --json "$out/$v.json" "${quick[@]}" \
      >>"$out/$v.log" 2>&1; then
    echo ok > "$out/$v.status"
  else
    echo failed > "$out/$v.status"
  fi
  echo $((SECONDS - start)) > "$out/$v.secs"
}

start=$SECONDS
running=0
for v in "${versions[@]}"; do
  check "$v" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
"$py" - "$out" "$json" "$((SECONDS - start))" "$jobs" "${versions[@]}" <<'EOF'
import json, os, sys
out, json_path, wall, jobs, versions = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
report, code = {}, 0
print(f"{'triton':8} {'status':8} {'compiled':>9} {'spills>0':>9} {'serialized':>11} {'secs':>5}")
for v in versions:
    status = open(os.path.join(out, f"{v}.status")).read().strip()
    secs = int(open(os.path.join(out, f"{v}.secs")).read())
    path = os.path.join(out, f"{v}.json")
    rows = json.load(open(path)) if os.path.exists(path) else []
    failed = [r for r in rows if "error" in r]
    if status == "failed" and not failed:  # died before writing a row: say why
        tail = open(os.path.join(out, f"{v}.log")).read().strip().splitlines()[-3:]
        failed = [dict(kernel="(the run)", error=" / ".join(tail))]
    ok = [r for r in rows if "error" not in r]
    report[v] = dict(status=status, seconds=secs, rows=rows)
    print(f"{v:8} {'no venv' if status == 'novenv' else status:8} {f'{len(ok)}/{len(rows)}':>9} "
          f"{sum(r['spills'] > 0 for r in ok):>9} {sum(bool(r['serialized']) for r in ok):>11} {secs:>5}")
    for r in failed:
        print(f"    {r['kernel']}: {r['error']}")
    if status == "novenv":
        print("    " + " ".join(open(os.path.join(out, f"{v}.log")).read().split())[-300:])
    code = 1 if status == "failed" or code == 1 else 2 if status == "novenv" else code
print(f"wall time {wall} s ({len(versions)} versions, {jobs} at a time)")
if json_path:
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
sys.exit(code)
EOF

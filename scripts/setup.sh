#!/usr/bin/env bash
# Creates .venv (once) and installs tilecore into it with the pinned CPU toolchain.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.tilecore-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ] || [ "$root/constraints/cpu.txt" -nt "$stamp" ]; then
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$root/constraints/cpu.txt")
  # torch first, from the pin (a bare 'torch' requirement would pull a multi-GB CUDA build).
  # (This machine's pip.conf names package folders that may be absent; pip warns about each: drop those lines.)
  { "${pip[@]}" torch triton numpy && "${pip[@]}" -e "$root[test,bench]"; } 2>&1 | grep -v "^WARNING: Location" || true
  "$venv/bin/python" -c "import tilecore, torch, triton" || { echo "setup failed: tilecore did not import" >&2; exit 1; }
  touch "$stamp"
fi

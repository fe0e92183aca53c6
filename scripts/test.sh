#!/usr/bin/env bash
# README command 2: set up, then run the whole test suite (kernels through Triton's interpreter).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q "$@"

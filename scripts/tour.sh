#!/usr/bin/env bash
# README command 1: set up, then run the tour of every op (GPU if there is one, else CPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/tilecore" tour "$@"

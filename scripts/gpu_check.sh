#!/usr/bin/env bash
# The GPU check (docs/gpus.md): scripts/gpu_check.py with its arguments, e.g.
#   bash scripts/gpu_check.sh                     # every visible GPU; gpu_check/gpu_check.{json,md}
#   bash scripts/gpu_check.sh --tiny --out /tmp/g # its plumbing on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/gpu_check.py "$@"

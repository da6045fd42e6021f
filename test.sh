#!/usr/bin/env bash
# The tests: the CPU tier always; the GPU tier where CuPy sees a GPU (skipped, with the reason,
# elsewhere). Args go to pytest, e.g. ./test.sh --sweep=full, ./test.sh --sanitize, ./test.sh -n 2.
set -euo pipefail
source "$(dirname "$0")/scripts/env.sh"
cd "$repo"
exec "$PY" -m pytest "$@"

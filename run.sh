#!/usr/bin/env bash
# The main job: on a GPU, verify every kernel and print the ladder vs cuBLAS; without one, run
# the static checks (compile for sm_80/sm_90a, spills, SASS) and say so. Args go to the CLI.
set -euo pipefail
source "$(dirname "$0")/scripts/env.sh"
cd "$repo"
exec "$PY" -m deepgemm "$@"

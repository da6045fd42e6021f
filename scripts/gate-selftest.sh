#!/usr/bin/env bash
# Proves on a GPU that the benchmark gate passes unchanged code and fails slowed kernels:
# a baseline, unchanged reruns that must pass, and V4, V5 and small_m each slowed on purpose (a
# wait planted in a copy of kernels/) that must fail. Options (deepgemm/gate/selftest.py says more):
#   [--record] [--reruns 3] [--delay-ns 20000] [--out out/gate-selftest] [--kernels v4,v5,small_m]
#   scripts/gate-selftest.sh                 scratch baseline of the benchmarks it runs (~4-6 min)
#   scripts/gate-selftest.sh --record        first records the whole suite as this GPU's baseline
#                                            under regressions/ (commit it afterwards)
set -uo pipefail
# -h/--help: the comment above, before anything is set up (env.sh), run or written.
case ${1:-} in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
source "$(dirname "$0")/env.sh"
cd "$repo"
export DEEPGEMM_COMMIT=${DEEPGEMM_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
exec "$PY" -m deepgemm.gate.selftest "$@"

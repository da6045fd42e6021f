#!/usr/bin/env bash
# The benchmark gate on this GPU (docs/regression-gate.md); extra args go to pytest.
#   scripts/bench-gate.sh            .ci/gate: pytest tests/bench --benchmark-only --benchmark-compare, the
#                                    slower benchmarks timed again alone; exit 1 if slower again
#   scripts/bench-gate.sh --record   record this GPU's baseline (regressions/<GPU>/<key>/), then commit it
set -uo pipefail
# -h/--help: the comment above, before anything is set up (env.sh), run or written.
case ${1:-} in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
source "$(dirname "$0")/env.sh"
cd "$repo"
export DEEPGEMM_COMMIT=${DEEPGEMM_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [ "${1:-}" = "--record" ]; then
  shift
  exec "$PY" -m pytest tests/bench -p no:cacheprovider -q --benchmark-only --benchmark-save=baseline "$@"
fi
exec "$repo/.ci/gate" "$@"

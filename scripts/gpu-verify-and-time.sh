#!/usr/bin/env bash
# One call on a GPU machine: what produced the numbers in docs/perf-log.md.
# Logs go to ${OUT:-out}/; a short table is printed last.
#   scripts/gpu-verify-and-time.sh [pytest args for the GPU tier...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-$PWD/.dgcache}
PY=${DEEPGEMM_PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
$PY -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
t0=$(date +%s)
$PY -m deepgemm warm-cache 2>&1 | tail -1
t1=$(date +%s); echo "warm-cache: $((t1 - t0)) s"
$PY -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf "$@" > "$OUT/gpu-tier.log" 2>&1
echo "gpu tier exit $?: $(tail -1 "$OUT/gpu-tier.log")  ($(( $(date +%s) - t1 )) s)"
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tier.log" | cut -c1-300 | head -20
$PY -m deepgemm --out "$OUT" > "$OUT/main-job.log" 2>&1; echo "main job exit $?"
grep -E "FAIL|checks passed" "$OUT/main-job.log" | head -12
tail -14 "$OUT/main-job.log"

#!/usr/bin/env bash
# One GPU call for the accuracy report (docs/perf-log.md, Run E): the quick tier (API changes),
# the FP16-accumulation kernels' tests, the torch interop tests, then the accuracy report with the
# GPU kernels next to the exact CPU emulation.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-$PWD/.dgcache} PYTHONUNBUFFERED=1
log=$OUT/tiers.log
step() { local name=$1; shift; local s=$(date +%s); echo "### $name" >> "$log"; "$@" >> "$log" 2>&1
         echo "$name: exit $? in $(( $(date +%s) - s )) s: $(tail -1 "$log")"; }
step "warm-cache" python3 -m deepgemm warm-cache
step "quick tier, -n 8" python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=short -rf -n 8
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-300 | head -12
step "accuracy report (GPU)" python3 -m deepgemm report accuracy --out "$OUT/accuracy" --no-progress
tail -40 "$log" | grep -vE "^\s*$" | tail -30

#!/usr/bin/env bash
# One GPU call for the accuracy report (docs/perf-log.md, Run E): the quick tier (API changes),
# the FP16-accumulation kernels' tests, the torch interop tests, then the accuracy report with the
# GPU kernels next to the exact CPU emulation.
source "$(dirname "$0")/gpu-common.sh"
step "warm-cache" python3 -m deepgemm warm-cache
step "quick tier, -n 8" python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=short -rf -n 8
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-300 | head -12
step "accuracy report (GPU)" python3 -m deepgemm report accuracy --out "$OUT/accuracy" --no-progress
tail -40 "$log" | grep -vE "^\s*$" | tail -30

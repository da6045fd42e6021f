#!/usr/bin/env bash
# Issue 5 on one GPU machine (about 5 minutes on an H200): small_m's tests and quick sweep, the
# tuner over the model shapes (its table lands in $OUT/tuned/<GPU>.json: copy it to
# deepgemm/configs/ to ship it), then the decode / model-shape / host-overhead benchmarks with
# kernel="auto" using that table. Logs in $OUT (tiers.log, gpu.txt, tuned/, bench-dispatch.json,
# summary.txt); a summary table is printed last.
#   scripts/gpu-dispatch-run.sh            TUNE_SECONDS=150 (tuning budget; a rerun resumes) TUNE_REPS=10
source "$(dirname "${BASH_SOURCE[0]}")/gpu-common.sh"
PY=${DEEPGEMM_PYTHON:-python3}
export DEEPGEMM_TUNED_DIR=$PWD/$OUT/tuned
[[ $OUT = /* ]] && export DEEPGEMM_TUNED_DIR=$OUT/tuned
mkdir -p "$DEEPGEMM_TUNED_DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
NPROC=$(nproc 2>/dev/null || echo 8); XDIST=$(( NPROC > 8 ? 8 : NPROC ))
t0=$(date +%s)
step "warm-cache small_m" $PY -m deepgemm warm-cache --kernels small_m
step "tune (models, ${TUNE_SECONDS:-150} s max)" $PY -m deepgemm tune --preset models --dtypes float16,bfloat16 \
     --max-seconds "${TUNE_SECONDS:-150}" --reps "${TUNE_REPS:-10}"
step "tests/gpu/test_small_m.py" $PY -m pytest tests/gpu/test_small_m.py -q -x -p no:cacheprovider --tb=short -n "$XDIST"
step "quick sweep --kernels=small_m" $PY -m pytest tests/gpu/test_sweep.py -q -x -p no:cacheprovider --tb=short \
     --kernels=small_m -n "$XDIST"
step "benchmarks (decode, models, host)" env DEEPGEMM_BENCH_SUMMARY="$OUT/summary.txt" \
     $PY -m pytest tests/bench/test_bench_dispatch.py -q -p no:cacheprovider --tb=short \
     --benchmark-json="$OUT/bench-dispatch.json" --benchmark-columns=median,iqr,rounds
echo "total: $(( $(date +%s) - t0 )) s; tuned table: $DEEPGEMM_TUNED_DIR/$(ls "$DEEPGEMM_TUNED_DIR" | head -1)"
grep -E "^(FAILED|ERROR)" "$OUT/tiers.log" | cut -c1-240 | head -12
echo "----------------------------------------------------------------------------- summary"
cat "$OUT/summary.txt" 2>/dev/null || echo "(no summary: the benchmark step did not reach its last test; see $OUT/tiers.log)"

#!/usr/bin/env bash
# Session 2's last GPU call: the two fixed tests, where host time goes (cProfile), tuning the demo
# shapes into the H200 table, the demos again, and a new benchmark baseline for this GPU.
source "$(dirname "$0")/gpu-common.sh"
step "fixed tests" timeout 90 python3 -m pytest tests/gpu/test_fuzz.py tests/gpu/test_plan_cache.py -q -p no:cacheprovider --tb=short -n 4
timeout 60 python3 scripts/profile_host.py cupy > "$OUT/profile-cupy.txt" 2>&1; head -30 "$OUT/profile-cupy.txt"
export DEEPGEMM_TUNED_DIR=$OUT/tuned; mkdir -p "$DEEPGEMM_TUNED_DIR"; cp deepgemm/configs/NVIDIA_H200.json "$DEEPGEMM_TUNED_DIR/"
step "tune demo shapes" timeout 150 python3 -m deepgemm tune --dtypes float16 --max-seconds 100 --reps 8 \
  --shapes 512x3072x3072,1024x2304x768,1024x3072x768,1024x768x3072,4096x2304x768,4096x3072x768,4096x768x3072,1x2304x768,1x3072x768,1x768x3072
step "seed MLP demo" timeout 90 python3 examples/seed_mlp.py --out "$OUT/mlp.json"
step "GPT-2 demo" timeout 120 python3 examples/gpt2_block.py --out "$OUT/gpt2.json"
step "benchmark baseline" timeout 300 env DEEPGEMM_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown) \
  python3 -m pytest tests/bench -p no:cacheprovider --benchmark-only --benchmark-save=baseline -q
cp regressions/NVIDIA_H200/*/*baseline*.json "$OUT/" 2>/dev/null; ls "$OUT"

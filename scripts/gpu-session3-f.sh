#!/usr/bin/env bash
# Session 3's last GPU call: every variant built, the quick tier for every kernel, the main job
# (verify + ladder vs cuBLAS), V5's full sweep (as far as the time allows), the sanitizer for V4
# and V5, and V4's new default timed in both dtypes. Summary lines only; logs in $OUT.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
step "warm-cache" timeout 90 python3 -m deepgemm warm-cache
step "quick tier, -n 8" timeout 190 python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf -n 8
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -12
step "main job" timeout 100 python3 -m deepgemm --out "$OUT/ladder"
grep -E "^\| (V|cuBLAS|auto)" "$OUT/ladder/ladder.md" 2>/dev/null | head -12
step "full sweep v5, -n 8" timeout 80 python3 -m pytest tests/gpu/test_sweep.py --sweep=full --kernels=v5 -q -p no:cacheprovider --tb=line -rf -n 8 -x
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -6
step "sanitize v4, v5" timeout 60 python3 -m pytest tests/gpu/test_sanitize.py --sanitize --kernels=v4,v5 -q -p no:cacheprovider -n 4
timeout 30 python3 scripts/v5_probe.py time --kernel v4 --sizes 4096,8192 --layouts rc 2>&1 | grep -E "^time|Error"

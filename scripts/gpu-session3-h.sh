#!/usr/bin/env bash
# Session 3, run V: V5's interior epilogue loads C in batches of 16 before using them. Probe
# checks, V5's quick tier, the epilogue-cost benchmark for V5.
source "$(dirname "$0")/gpu-common.sh"
timeout 60 python3 scripts/v5_probe.py check > "$OUT/check.log" 2>&1; echo "probe exit $?: $(grep -c ' ok$' "$OUT/check.log") ok, $(grep -c FAIL "$OUT/check.log") FAIL"
step "quick tier v5, -n 8" timeout 100 python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf -n 8 --kernels=v5
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -8
timeout 60 python3 -m pytest tests/bench/test_bench.py -k "epilogue_cost and v5" -p no:cacheprovider --benchmark-only --benchmark-columns=median \
  --benchmark-sort=name -q 2>&1 | grep -E "^test_epilogue|passed|failed|Error" | sed -E 's/ +/ /g' | cut -c1-120 | tee "$OUT/epilogue.txt"

#!/usr/bin/env bash
# Session 3, run U: the fused epilogue computed for all of a thread's elements before any store
# (V4, V5). Correctness (probe checks with the fused chain, the quick tier for v4/v5 incl. the
# epilogue sweep), then the epilogue-cost benchmark and both demos again.
source "$(dirname "$0")/gpu-common.sh"
probe() { timeout "$1" python3 scripts/v5_probe.py "${@:2}"; echo "exit $?"; }
for k in v4 v5; do echo "## $k" >> "$OUT/check.log"; probe 60 check --kernel $k >> "$OUT/check.log" 2>&1; done
echo "checks: $(grep -c ' ok$' "$OUT/check.log") ok, $(grep -c FAIL "$OUT/check.log") FAIL; $(grep -c 'exit 0' "$OUT/check.log") of 2 exit 0"
step "quick tier v4, v5, -n 8" timeout 120 python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf -n 8 --kernels=v4,v5
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -8
timeout 90 python3 -m pytest tests/bench/test_bench.py -k "epilogue_cost" -p no:cacheprovider --benchmark-only --benchmark-columns=median \
  --benchmark-sort=name -q 2>&1 | grep -E "^test_epilogue|passed|failed|Error" | sed -E 's/ +/ /g' | cut -c1-120 | tee "$OUT/epilogue.txt"
step "seed MLP demo" timeout 60 python3 examples/seed_mlp.py --out "$OUT/mlp.json"
step "GPT-2 demo" timeout 80 python3 examples/gpt2_block.py --out "$OUT/gpt2.json"
python3 scripts/demo_summary.py "$OUT"

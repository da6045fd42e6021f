#!/usr/bin/env bash
# Session 3, run A: V5's coalesced fallback epilogue (D that TMA cannot store) and split-K clusters.
# Correctness first (probe checks for the default and each split config, V5's quick tier, the
# plan-cache and torch tests, the sanitizer on a split config), then timing vs cuBLAS and ncu.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
probe() { timeout "$1" python3 scripts/v5_probe.py "${@:2}"; echo "exit $?"; }
SPLITS=('{"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 2}' '{"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 4}'
        '{"DG_BN": 192, "DG_STAGES": 4, "DG_SPLIT_K": 2}' '{"DG_BN": 192, "DG_STAGES": 4, "DG_SPLIT_K": 4}')
echo "## default" >> "$OUT/check.log"; probe 150 check >> "$OUT/check.log" 2>&1
for cfg in "${SPLITS[@]}"; do
  echo "## $cfg" >> "$OUT/check.log"; probe 100 check --config "$cfg" >> "$OUT/check.log" 2>&1
done
echo "checks: $(grep -c ' ok$' "$OUT/check.log") ok, $(grep -c FAIL "$OUT/check.log") FAIL; $(grep -c 'exit 0' "$OUT/check.log") of 5 exit 0"
grep -E "FAIL|Error" "$OUT/check.log" | head -8
step "v5 quick sweep, plan cache, torch, v5 tests" timeout 240 python3 -m pytest tests/gpu/test_sweep.py tests/gpu/test_v5.py \
     tests/gpu/test_plan_cache.py tests/gpu/test_torch_linear.py -q -p no:cacheprovider --tb=line -rf -n 8 --kernels=v5
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -10
step "memcheck split-K" timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/v5_probe.py check \
     --config "${SPLITS[1]}" --layouts rc,cr --dtypes float16
step "racecheck split-K" timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/v5_probe.py check \
     --config "${SPLITS[0]}" --layouts rc --dtypes float16
probe 150 time --sizes 4097,4095,777x1234x555,512x3072x768,4096 --layouts rc 2>&1 | tee "$OUT/time.log" | grep -E "time|exit|Error"
for cfg in '{"DG_BN": 128, "DG_STAGES": 6}' "${SPLITS[@]}"; do
  echo "## $cfg" | tee -a "$OUT/time-ab.log"
  probe 100 time --sizes 512x3072x768,512x768x3072,512x3072x3072 --layouts rc --dtypes float16 --config "$cfg" 2>&1 \
    | tee -a "$OUT/time-ab.log" | grep -E "time|exit|Error"
done
timeout 100 ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
  python3 scripts/ncu_shapes.py 512x3072x768 'v5:{"DG_BN": 128, "DG_STAGES": 6}' "v5:${SPLITS[2]}" cublas > "$OUT/ncu.txt" 2>&1
grep -E "deepgemm_kernel|gemm|nvjet|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|L2 Cache Throughput|Grid Size|Cluster" "$OUT/ncu.txt" | head -60

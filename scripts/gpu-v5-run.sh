#!/usr/bin/env bash
# V5 on the H200 after a change: the probe's correctness checks (layouts, tails, staged
# misaligned operands, fused chain), the quick verification tier and the sanitizer for V5, then
# the issue's benchmark shapes vs cuBLAS, and A/B runs of other configs:
#   V5_AB='{"DG_EPI_TMA": 0, "DG_STAGES": 4}|4096,8192;{"DG_BN": 128}|4097'   (config|sizes, ';'-separated)
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
probe() { timeout "$1" python3 scripts/v5_probe.py "${@:2}"; echo "exit $?"; }
probe 200 check 2>&1 | tee "$OUT/check.log" | grep -E "FAIL|epilogue|exit|Error" | head -12
step "quick tier v5, -n 8" timeout 300 python3 -m pytest tests/gpu/test_sweep.py -q -p no:cacheprovider --tb=line -rf -n 8 --kernels=v5
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -10
step "sanitize v5" timeout 200 python3 -m pytest tests/gpu/test_sanitize.py --sanitize --kernels=v5 -q -p no:cacheprovider -n 3
probe 300 time --sizes "${V5_SIZES:-4096,8192,4096x14336x4096,4096x4096x14336,8192x8192x1024,4095,4097,777x1234x555,512x3072x768}" \
  --layouts "${V5_LAYOUTS:-rc}" 2>&1 | tee "$OUT/time.log" | grep -E "time|exit|Error"
IFS=';' read -ra AB <<< "${V5_AB:-}"
for item in "${AB[@]}"; do
  echo "## config ${item%%|*}" | tee -a "$OUT/time-ab.log"
  probe 200 time --sizes "${item##*|}" --layouts rc --config "${item%%|*}" 2>&1 | tee -a "$OUT/time-ab.log" | grep -E "time|exit|Error"
done

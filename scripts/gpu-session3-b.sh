#!/usr/bin/env bash
# Session 3, run B: 96-wide V5 tiles (K-major B) and split-K with the reduction shared by the ranks.
# Probe checks per config (rc and cc: the layouts BN = 96 takes), the sanitizer on one split config,
# then the 512/1024-row model shapes vs cuBLAS per config.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
probe() { timeout "$1" python3 scripts/v5_probe.py "${@:2}"; echo "exit $?"; }
CFGS=('{"DG_BN": 128, "DG_STAGES": 6}' '{"DG_BN": 96, "DG_STAGES": 6}' '{"DG_BN": 96, "DG_STAGES": 6, "DG_SPLIT_K": 2}'
      '{"DG_BN": 96, "DG_STAGES": 6, "DG_SPLIT_K": 4}' '{"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 2}'
      '{"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 4}' '{"DG_BN": 192, "DG_STAGES": 4, "DG_SPLIT_K": 2}')
for cfg in "${CFGS[@]:1}"; do
  echo "## $cfg" >> "$OUT/check.log"; probe 100 check --config "$cfg" --layouts rc,cc >> "$OUT/check.log" 2>&1
done
echo "checks: $(grep -c ' ok$' "$OUT/check.log") ok, $(grep -c FAIL "$OUT/check.log") FAIL; $(grep -c 'exit 0' "$OUT/check.log") of $(( ${#CFGS[@]} - 1 )) exit 0"
grep -E "FAIL|Error" "$OUT/check.log" | head -8
step "memcheck BN96 x2" timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/v5_probe.py check \
     --config "${CFGS[2]}" --layouts rc --dtypes float16
step "racecheck BN128 x4" timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/v5_probe.py check \
     --config "${CFGS[5]}" --layouts rc --dtypes float16
for cfg in "${CFGS[@]}"; do
  echo "## $cfg" | tee -a "$OUT/time-ab.log"
  probe 100 time --sizes "${AB_SIZES:-512x3072x768,512x768x3072,512x3072x3072,1024x3072x768,1024x768x3072}" --layouts rc \
    --dtypes float16 --config "$cfg" 2>&1 | tee -a "$OUT/time-ab.log" | grep -E "time|exit|Error" | sed -E 's/^time v5 float16 rc //'
done

#!/usr/bin/env bash
# Session 3, run E: V4's new variants (check, then time at 4096³/8192³), V5 with the exit waiting
# only for the TMA stores' reads, deepgemm.torch.linear's leaner eager path (GPU tests, host
# time, both demos).
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
probe() { timeout "$1" python3 scripts/v5_probe.py "${@:2}"; echo "exit $?"; }
V4=('{}' '{"DG_BK": 64, "DG_STAGES": 3}' '{"DG_BK": 64, "DG_STAGES": 3, "DG_SWIZZLE": 1}' '{"DG_BN": 256, "DG_STAGES": 4, "DG_SWIZZLE": 1}'
    '{"DG_BN": 256, "DG_BK": 64, "DG_STAGES": 3, "DG_SWIZZLE": 1}' '{"DG_BM": 256, "DG_BK": 64, "DG_STAGES": 3, "DG_SWIZZLE": 1}'
    '{"DG_BN": 256, "DG_BK": 64, "DG_STAGES": 4, "DG_SWIZZLE": 1}')
for cfg in "${V4[@]}"; do
  echo "## v4 $cfg" >> "$OUT/check.log"; probe 100 check --kernel v4 --config "$cfg" >> "$OUT/check.log" 2>&1
done
echo "## v5 default" >> "$OUT/check.log"; probe 100 check >> "$OUT/check.log" 2>&1
echo "checks: $(grep -c ' ok$' "$OUT/check.log") ok, $(grep -c FAIL "$OUT/check.log") FAIL; $(grep -c 'exit 0' "$OUT/check.log") of $(( ${#V4[@]} + 1 )) exit 0"
grep -E "^## |FAIL|Error" "$OUT/check.log" | grep -B1 -E "FAIL|Error" | head -12
for cfg in "${V4[@]}"; do
  echo "## v4 $cfg" | tee -a "$OUT/time.log"
  probe 100 time --kernel v4 --config "$cfg" --sizes 4096,8192 --layouts rc --dtypes float16 2>&1 | tee -a "$OUT/time.log" | grep -E "^time|exit [1-9]|Error" | sed -E 's/^time v4 float16 rc //'
done
echo "## v5 BN128 and default (exit waits for the stores' reads only)" | tee -a "$OUT/time.log"
probe 100 time --config '{"DG_BN": 128, "DG_STAGES": 6}' --sizes 512x3072x768,512x3072x3072,1024x3072x768 --layouts rc --dtypes float16 2>&1 | tee -a "$OUT/time.log" | grep -E "^time|Error" | sed -E 's/^time v5 float16 rc //'
probe 100 time --sizes 4096,8192x8192x1024,4097 --layouts rc --dtypes float16 2>&1 | tee -a "$OUT/time.log" | grep -E "^time|Error" | sed -E 's/^time v5 float16 rc //'
step "torch tests" timeout 120 python3 -m pytest tests/gpu/test_torch_linear.py tests/gpu/test_torch_interop.py -q -p no:cacheprovider --tb=short -rf -n 4
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -8
timeout 60 python3 scripts/profile_torch_linear.py > "$OUT/torch-linear.txt" 2>&1; head -4 "$OUT/torch-linear.txt"
step "seed MLP demo" timeout 90 python3 examples/seed_mlp.py --out "$OUT/mlp.json"
step "GPT-2 demo" timeout 120 python3 examples/gpt2_block.py --out "$OUT/gpt2.json"
python3 scripts/demo_summary.py "$OUT"

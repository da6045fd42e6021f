#!/usr/bin/env bash
# Session 3, run D: where V5's time goes at 512-row shapes (warm vs cold L2; ncu warp-stall
# sampling per SASS line), the fresh-thread replay fix, and deepgemm.torch.linear's host time.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
step "fresh-thread replay" timeout 60 python3 -m pytest tests/gpu/test_plan_cache.py -q -p no:cacheprovider --tb=short -k "thread"
timeout 60 python3 scripts/warm_cold.py 512x3072x768,512x3072x3072,512x768x3072,4096x4096x4096 '{"DG_BN": 128, "DG_STAGES": 6}' 2>&1 | tee "$OUT/warm-cold.txt"
timeout 60 python3 scripts/profile_torch_linear.py > "$OUT/torch-linear.txt" 2>&1; head -34 "$OUT/torch-linear.txt"
timeout 120 ncu --profile-from-start off -k regex:deepgemm_kernel --set full --import-source no -o "$OUT/v5-512" \
  python3 scripts/ncu_shapes.py 512x3072x768 'v5:{"DG_BN": 128, "DG_STAGES": 6}' > "$OUT/ncu-run.txt" 2>&1; tail -3 "$OUT/ncu-run.txt"
ncu -i "$OUT/v5-512.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu-src.csv" 2>&1
ncu -i "$OUT/v5-512.ncu-rep" --page details > "$OUT/ncu-details.txt" 2>&1
python3 scripts/ncu_stalls.py "$OUT/ncu-src.csv" 40 2>&1 | tee "$OUT/stalls.txt" | head -60
grep -E "Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|Stall|Eligible Warps" "$OUT/ncu-details.txt" | head -20
rm -f "$OUT/ncu-src.csv"

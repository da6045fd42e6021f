#!/usr/bin/env bash
# Session 3, run C: the replay fast path (cuLaunchKernel via ctypes) checked and timed; the H200
# table re-tuned for M >= 128 with V5's new configs (96-wide tiles, split-K); both demos after.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
step "plan cache + torch tests" timeout 150 python3 -m pytest tests/gpu/test_plan_cache.py tests/gpu/test_torch_linear.py \
     tests/cpu/test_launch.py tests/cpu/test_api.py -q -p no:cacheprovider --tb=short -rf -n 4
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -10
for what in "cupy" "torch" "cupy v5" "torch v5"; do
  echo "## $what" >> "$OUT/host.txt"; timeout 60 python3 scripts/profile_host.py $what >> "$OUT/host.txt" 2>&1
done
grep -iE "^##|per call|us/call|µs" "$OUT/host.txt" | head -24
export DEEPGEMM_TUNED_DIR=$OUT/tuned; mkdir -p "$DEEPGEMM_TUNED_DIR"; cp deepgemm/configs/NVIDIA_H200.json "$DEEPGEMM_TUNED_DIR/"
step "re-tune M >= 128" timeout 240 python3 -m deepgemm tune --force --kernels v5 --reps 8 --max-seconds 200 --dtypes float16,bfloat16 \
  --shapes 512x768x768,512x3072x768,512x768x3072,512x3072x3072,1024x2304x768,1024x3072x768,1024x768x3072,4096x2304x768,4096x3072x768,4096x768x3072
grep -E "^  m" "$log" | tail -24
step "seed MLP demo" timeout 90 python3 examples/seed_mlp.py --out "$OUT/mlp.json"
step "GPT-2 demo" timeout 120 python3 examples/gpt2_block.py --out "$OUT/gpt2.json"
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for name in ("mlp.json", "gpt2.json"):
    p = Path(sys.argv[1]) / name
    if p.exists():
        print(name, json.dumps(json.loads(p.read_text()).get("latency_us", json.loads(p.read_text())))[:900])
PY

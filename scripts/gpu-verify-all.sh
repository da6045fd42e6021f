#!/usr/bin/env bash
# The whole GPU verification after a kernel or API change, in one call (~7 min on one H200):
# build every variant the quick tier launches, the quick tier for every kernel (V0-V5, small_m,
# the plan cache, torch interop and deepgemm.torch), the host-overhead benchmark, both demos, and
# the main job (verify + ladder vs cuBLAS). Logs in $OUT; a summary is printed last.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
step "warm-cache" timeout 200 python3 -m deepgemm warm-cache
step "quick tier, -n 8" timeout 300 python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf -n 8
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -12
step "host overhead" timeout 120 env DEEPGEMM_BENCH_SUMMARY="$OUT/host.txt" python3 -m pytest \
     tests/bench/test_bench_dispatch.py -q -p no:cacheprovider -k "host or summary" --benchmark-columns=median
cat "$OUT/host.txt" 2>/dev/null | grep -i host
step "seed MLP demo" timeout 90 python3 examples/seed_mlp.py --out "$OUT/mlp.json"
step "GPT-2 demo" timeout 120 python3 examples/gpt2_block.py --out "$OUT/gpt2.json"
step "main job" timeout 200 python3 -m deepgemm --out "$OUT/ladder"
cat "$OUT/ladder/ladder.md" 2>/dev/null

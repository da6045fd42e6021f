#!/usr/bin/env bash
# V5 bring-up on the H200: correctness per layout and the fused chain, then TFLOP/s vs cuBLAS.
# Every step is under a timeout, so a deadlocked mbarrier costs a minute, not the session.
source "$(dirname "$0")/gpu-common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
probe() { timeout "$1" python3 scripts/v5_probe.py "${@:2}"; echo "exit $?"; }
probe 120 check --layouts rc --dtypes float16 2>&1 | tee "$OUT/check-rc.log" | tail -9
probe 180 check 2>&1 | tee "$OUT/check-all.log" | grep -E "FAIL|epilogue|exit" | head -20
probe 240 time --sizes "${V5_SIZES:-4096,8192}" --layouts "${V5_LAYOUTS:-rc,rr}" 2>&1 | tee "$OUT/time.log" | grep -E "time|exit|Error"

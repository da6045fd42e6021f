#!/usr/bin/env bash
# One call on a 2-GPU machine (docs/perf-log.md, Run C): tier timings serial and with xdist on one
# and two GPUs, the full tier, the benchmark baseline and a second run compared with it, the ladder.
source "$(dirname "$0")/gpu-common.sh"
P="python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf"
nvidia-smi -L
python3 -m deepgemm warm-cache 2>&1 | tail -1
step "quick tier, serial, one GPU" $P --durations=6
step "quick tier, -n 2, two GPUs" $P -n 2 --junitxml="$OUT/junit-n2.xml"
step "quick tier, -n 2, one GPU" env CUDA_VISIBLE_DEVICES=0 $P -n 2
step "full tier, -n 16, two GPUs" $P --sweep=full -n 16
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -10
grep -o 'worker_gpu" value="[^"]*' "$OUT/junit-n2.xml" | sort -u
source "$(dirname "$0")/gpu-bench-and-ladder.sh"

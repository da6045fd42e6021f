#!/usr/bin/env bash
# One call after a kernel change (docs/perf-log.md, Run D): rebuild the cache, the quick tier on
# every GPU of the machine, the sanitizer for V4, a new benchmark baseline plus a second run
# compared with it, the ladder.
source "$(dirname "$0")/gpu-common.sh"
step "warm-cache" python3 -m deepgemm warm-cache
step "quick tier, -n 4" python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf -n 4 --junitxml="$OUT/junit.xml"
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -10
grep -o 'worker_gpu" value="[^"]*' "$OUT/junit.xml" | sort -u
step "sanitize v4" python3 -m pytest tests/gpu/test_sanitize.py --sanitize --kernels=v4 -q -p no:cacheprovider -n 3
rm -rf regressions/*/
source "$(dirname "$0")/gpu-bench-and-ladder.sh"

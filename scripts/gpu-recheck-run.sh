#!/usr/bin/env bash
# One call after a kernel change (docs/perf-log.md, Run D): rebuild the cache, the quick tier on
# every GPU of the machine, the sanitizer for V4, a new benchmark baseline plus a second run
# compared with it, the ladder.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-$PWD/.dgcache} PYTHONUNBUFFERED=1
log=$OUT/tiers.log
step() { local name=$1; shift; local s=$(date +%s); echo "### $name" >> "$log"; "$@" >> "$log" 2>&1
         echo "$name: exit $? in $(( $(date +%s) - s )) s: $(tail -1 "$log")"; }
step "warm-cache" python3 -m deepgemm warm-cache
step "quick tier, -n 4" python3 -m pytest tests/gpu -q -p no:cacheprovider --tb=line -rf -n 4 --junitxml="$OUT/junit.xml"
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -10
grep -o 'worker_gpu" value="[^"]*' "$OUT/junit.xml" | sort -u
step "sanitize v4" python3 -m pytest tests/gpu/test_sanitize.py --sanitize --kernels=v4 -q -p no:cacheprovider -n 3
rm -rf regressions/*/
B="python3 -m pytest tests/bench -p no:cacheprovider --benchmark-only -q"
step "bench: record baseline" $B --benchmark-save=baseline
step "bench: second run" $B --benchmark-json="$OUT/bench2.json"
python3 -m deepgemm regress compare "$OUT/bench2.json" > "$OUT/compare.txt" 2>&1; echo "regress compare exit $?"
cp regressions/*/*/*baseline.json "$OUT/baseline.json"
python3 -m deepgemm --out "$OUT" > "$OUT/main-job.log" 2>&1; echo "main job exit $?"; tail -13 "$OUT/main-job.log"
python3 - "$OUT/bench2.json" <<'PY'
import json, sys
for b in sorted(json.load(open(sys.argv[1]))["benchmarks"], key=lambda b: b["name"]):
    e = b["extra_info"]
    if "epilogue" in b["name"] or "v4-" in b["name"]:
        print(f"{b['name'][:66]:66} {b['stats']['median']*1e6:8.1f}us {e.get('tflops', 0):6.1f}TF {e.get('pct_cublas', 0):5.1f}%")
PY

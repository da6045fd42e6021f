#!/usr/bin/env bash
# The benchmark half of a GPU call (sourced by gpu-final-run.sh and gpu-recheck-run.sh, which set
# OUT, log and step): record a baseline for this GPU, run the suite again and compare it with the
# baseline (noise-aware), run the main job's ladder, print the V4 and epilogue rows.
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

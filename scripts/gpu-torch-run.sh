#!/usr/bin/env bash
# One call on the H200 (issue 8, deepgemm.torch): the torch GPU tests, then both demos with JSON
# out; a short summary last. Under 4 minutes; writes $OUT/tiers.log, mlp.json, gpt2.json.
#   OUT=out scripts/gpu-torch-run.sh
source "$(dirname "$0")/gpu-common.sh"
PY=${DEEPGEMM_PYTHON:-python3}
start=$(date +%s)
left() { echo $(( start + 230 - $(date +%s) )); }     # seconds left of the 4-minute budget
cap() { local l; l=$(left); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }   # never 0 (= no limit)
# Kernel compiles dominate a cold run: spread the tests over 4 processes (one GPU) when xdist is there.
xdist=$($PY -c "import xdist" 2>/dev/null && echo "-n 4")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"

step "torch GPU tests" timeout "$(cap 120)" $PY -m pytest tests/gpu/test_torch_linear.py -q -rs \
    -p no:cacheprovider --tb=short $xdist
step "seed MLP demo" timeout "$(cap 60)" $PY examples/seed_mlp.py --out "$OUT/mlp.json"
step "GPT-2 demo" timeout "$(cap 100)" $PY examples/gpt2_block.py --out "$OUT/gpt2.json"

echo; echo "== summary ($(( $(date +%s) - start )) s; logs in $OUT/tiers.log)"
grep -E "^(FAILED|ERROR)|^SKIPPED|[0-9]+ (passed|failed|skipped|error)" "$log" | cut -c1-200 | head -20
$PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = []
def f(v, fmt="{:.1f}"):
    return "n/a" if v is None else fmt.format(v)
p = out / "mlp.json"
if p.exists():
    d = json.loads(p.read_text()); lat = d["latency_us"]
    rows.append(("seed MLP 512 tok", f"GEMM share {f(100 * d['gemm_share_profiler'] if d['gemm_share_profiler'] else None, '{:.0f}')}%",
                 f"torch {f(lat['torch_eager'])} us", f"deepgemm {f(lat['deepgemm'])} us",
                 f"ratio {d['ratio']:.2f} (<= {d['target']}: {'PASS' if d['target_met'] else 'MISS'})",
                 f"graphed {f(d['ratio_graph'], '{:.2f}')}", "outputs " + ("OK" if d["outputs_ok"] else "FAIL")))
else:
    rows.append(("seed MLP", "no mlp.json: see tiers.log"))
p = out / "gpt2.json"
if p.exists():
    d = json.loads(p.read_text())
    ok = "OK" if d["outputs_ok"] else "FAIL"
    for t in d["timings"]:
        rows.append((f"GPT-2 {t['shape']}", f"MLP torch {f(t['mlp_torch_us'])} us", f"deepgemm {f(t['mlp_deepgemm_us'])} us",
                     f"MLP ratio {t['mlp_ratio']:.2f} (<= {d['target_mlp']}: {'PASS' if t['mlp_target_met'] else 'MISS'})",
                     f"block ratio {t['block_ratio']:.2f}", f"graphed MLP/block {f(t['mlp_ratio_graph'], '{:.2f}')}/"
                     f"{f(t['block_ratio_graph'], '{:.2f}')}", f"outputs {ok}"))
else:
    rows.append(("GPT-2", "no gpt2.json: see tiers.log"))
for r in rows:
    print(" | ".join(r))
EOF

#!/usr/bin/env bash
# The whole GPU verification of every registered kernel in one command. `./test.sh` and
# `./run.sh` each do part of it; this runs the parts in the order that makes a failure cheapest
# to find, keeps every step's output in one log, and ends with one line per step.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/verify-gpu.sh [--out DIR] [-n WORKERS] [--kernels LIST] [--full] [--no-sanitize] [-h|--help]

The whole GPU verification, one step after the other (each step's output goes to DIR/verify.log,
one summary line per step is printed; exit status 1 if any step failed):

  1. warm cache   python -m deepgemm warm-cache: compile every variant the quick tier launches,
                  in parallel, so the tests time kernels rather than the compiler
  2. quick tier   pytest tests/gpu: every kernel x dtype x layout on its tile-edge shapes, the
                  fuzzing, the planted bugs, V5, the plan cache, torch interop and deepgemm.torch
  3. full sweep   (only with --full) pytest tests/gpu/test_sweep.py --sweep=full
  4. sanitizer    pytest tests/gpu/test_sanitize.py --sanitize: a sample of each kernel's cases
                  under compute-sanitizer memcheck, racecheck and synccheck
  5. main job     python -m deepgemm --out DIR/ladder: every kernel against the FP64 reference,
                  then the ladder against cuBLAS at 4096^3 (ladder.json, ladder.md; from a
                  repository checkout it also rewrites README.md's ladder table)

options:
  --out DIR        where logs and results go (default: out/verify)
  -n WORKERS       pytest-xdist workers for the test steps (default: 8 when pytest-xdist is
                   installed, else serial); worker K uses GPU K mod (number of GPUs)
  --kernels LIST   comma-separated kernels (e.g. v4,v5) for steps 1-4; the main job always
                   verifies and times every kernel
  --full           add the full sweep (sizes 1..2053, 4096^3, 4095x4097x4095; a few minutes)
  --no-sanitize    skip step 4 (compute-sanitizer is slow: ~10x per case)

The Python is chosen as for ./run.sh and ./test.sh (scripts/env.sh; DEEPGEMM_PYTHON wins).
On a machine without a GPU the test steps report skips and the main job runs the static checks.
EOF
}

out=out/verify workers= kernels= full=0 sanitize=1
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --out) out=$2; shift 2 ;;
    -n) workers=$2; shift 2 ;;
    --kernels) kernels=$2; shift 2 ;;
    --full) full=1; shift ;;
    --no-sanitize) sanitize=0; shift ;;
    *) echo "verify-gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

source "$(dirname "$0")/env.sh"            # sets $repo and $PY, exports PYTHONPATH
cd "$repo"
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/verify.log
: > "$log"
export PYTHONUNBUFFERED=1

if [ -z "$workers" ] && "$PY" -c "import xdist" 2>/dev/null; then workers=8; fi
xdist=${workers:+-n $workers}
kernel_args=${kernels:+--kernels=$kernels}
pytest_common="-q -p no:cacheprovider --tb=line -rf"

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu --format=csv,noheader 2>/dev/null \
  | tee "$out/gpu.txt" || echo "no nvidia-smi: no GPU steps will run" | tee "$out/gpu.txt"

failed=0
summary=()
# step NAME CMD...: append CMD's output to the log under a heading; record one summary line.
step() {
  local name=$1; shift
  local start=$(date +%s)
  echo "### $name: $*" >> "$log"
  "$@" >> "$log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && failed=1
  local line="$name: exit $rc in $(( $(date +%s) - start )) s: $(tail -1 "$log" | cut -c1-160)"
  summary+=("$line")
  echo "$line"
}

warm_kernels=${kernels:+--kernels $kernels}
step "warm cache" "$PY" -m deepgemm warm-cache $warm_kernels
step "quick tier" "$PY" -m pytest tests/gpu $pytest_common $xdist $kernel_args
if [ $full -eq 1 ]; then
  step "full sweep" "$PY" -m pytest tests/gpu/test_sweep.py --sweep=full $pytest_common $xdist $kernel_args
fi
if [ $sanitize -eq 1 ]; then
  step "sanitizer" "$PY" -m pytest tests/gpu/test_sanitize.py --sanitize $pytest_common $xdist $kernel_args
fi
step "main job" "$PY" -m deepgemm --out "$out/ladder"

echo
echo "== summary (log: $log)"
printf '%s\n' "${summary[@]}"
grep -E "^(FAILED|ERROR)" "$log" | cut -c1-240 | head -20
[ -f "$out/ladder/ladder.md" ] && cat "$out/ladder/ladder.md"
exit $failed

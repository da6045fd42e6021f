# Sourced by the gpu-*-run.sh scripts: repo root, $OUT, the compile cache carried with the call,
# and step NAME CMD... which appends CMD's output to $OUT/tiers.log and prints one timed line.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-$PWD/.dgcache} PYTHONUNBUFFERED=1
log=$OUT/tiers.log
step() { local name=$1; shift; local s=$(date +%s); echo "### $name" >> "$log"; "$@" >> "$log" 2>&1
         echo "$name: exit $? in $(( $(date +%s) - s )) s: $(tail -1 "$log")"; }

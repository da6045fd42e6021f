# Sourced by run.sh and test.sh: pick (or build) a Python that has deepgemm's dependencies, so
# each command does its own set-up on a fresh machine.
#  - DEEPGEMM_PYTHON, if set, is used as is.
#  - A ready image (python3 already has CuPy, NumPy, ml_dtypes, pytest, hypothesis and
#    pytest-benchmark, as on the H200 runner, which has no package registry) is used directly.
#  - Otherwise a virtual environment .venv is made once and `.[test]` installed into it (editable),
#    plus the CuPy build matching the driver when a GPU is present, or, with no GPU, a CPU build of
#    torch and transformers for the CPU tier's module-swap tests (they skip, saying why, without).
#    The installs go through uv, which takes seconds where pip takes minutes.
# Whichever Python it is, PYTHONPATH puts this checkout first (last line): the commands run and
# test the source tree, not a deepgemm installed in that Python (tox.ini tests an installed wheel).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# has MODULE...: whether $1 (a Python) finds them all; looked up, not imported (torch alone takes
# seconds to import, and this runs before every command).
has() {
  local py=$1; shift
  "$py" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))" "$@" \
    >/dev/null 2>&1
}
need="numpy ml_dtypes tqdm pytest hypothesis pytest_benchmark matplotlib"
if [ -n "${DEEPGEMM_PYTHON:-}" ]; then
  PY=$DEEPGEMM_PYTHON
elif has python3 $need cupy; then
  PY=python3
else
  venv="$repo/.venv"
  PY="$venv/bin/python"
  if ! has "$PY" $need deepgemm; then
    echo "deepgemm: setting up $venv (one time) ..." >&2
    python3 -m venv "$venv"
  fi
  uv_pip() {
    local uv flags=(-q --python "$PY")
    uv=$(command -v uv || echo "$venv/bin/uv")
    [ -x "$uv" ] || "$PY" -m pip install -q uv
    # uv reads neither pip's configuration nor its variables: pass on pip's local wheel folders.
    for l in ${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}; do
      flags+=(--find-links "$l")
    done
    "$uv" pip install "${flags[@]}" "$@"
  }
  if ! has "$PY" $need deepgemm; then
    extras=test
    if cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$'); then
      [ "$cuda" -ge 13 ] && extras="test,cuda13" || extras="test,cuda12"
    fi
    uv_pip -e "$repo[$extras]"
  fi
  # A CPU build of torch only ("+cpu": PyPI's default Linux torch pulls several GB of CUDA
  # libraries); DEEPGEMM_TORCH_PIP names another spec. Tried again on each run while it is missing.
  if ! nvidia-smi >/dev/null 2>&1 && ! has "$PY" torch transformers; then
    spec=${DEEPGEMM_TORCH_PIP:-torch==2.13.0+cpu}
    echo "deepgemm: installing $spec and transformers into $venv ..." >&2
    uv_pip "$spec" transformers ||
      echo "deepgemm: could not install $spec: the module-swap tests will skip (DEEPGEMM_TORCH_PIP names another)" >&2
  fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

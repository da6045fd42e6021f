# Sourced by run.sh and test.sh: pick (or build) a Python that has deepgemm's dependencies, so
# each command does its own set-up on a fresh machine.
#  - DEEPGEMM_PYTHON, if set, is used as is.
#  - A ready image (python3 already has CuPy, NumPy, ml_dtypes, pytest, hypothesis and
#    pytest-benchmark, as on the H200 runner, which has no package registry) is used directly.
#  - Otherwise a virtual environment .venv is made once and `pip install -e .[test]` fills it,
#    plus the CuPy build matching the driver when a GPU is present.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
need="import numpy, ml_dtypes, pytest, hypothesis, pytest_benchmark, matplotlib"
if [ -n "${DEEPGEMM_PYTHON:-}" ]; then
  PY=$DEEPGEMM_PYTHON
elif python3 -c "$need; import cupy" >/dev/null 2>&1; then
  PY=python3
else
  venv="$repo/.venv"
  if ! "$venv/bin/python" -c "$need; import deepgemm" >/dev/null 2>&1; then
    echo "deepgemm: setting up $venv (one time) ..." >&2
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    extras=test
    if cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$'); then
      [ "$cuda" -ge 13 ] && extras="test,cuda13" || extras="test,cuda12"
    fi
    "$venv/bin/python" -m pip install -q -e "$repo[$extras]"
  fi
  PY="$venv/bin/python"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

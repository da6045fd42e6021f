# Sourced by run.sh and test.sh: pick (or build) a Python that has deepgemm's dependencies, so
# each command does its own set-up on a fresh machine.
#  - DEEPGEMM_PYTHON, if set, is used as is.
#  - A ready image (python3 already has CuPy, NumPy, ml_dtypes, pytest, hypothesis and
#    pytest-benchmark, as on the H200 runner, which has no package registry) is used directly.
#  - Otherwise a virtual environment .venv is made once and `pip install -e .[test]` fills it,
#    plus the CuPy build matching the driver when a GPU is present, or, with no GPU, a CPU build
#    of torch and transformers, so the CPU tier's deepgemm.torch tests (module swapping) run.
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
  # torch==2.13.0 is a CPU build on this project's CPU machines (a local wheel, ~190 MB, ~40 s;
  # PyPI's default Linux torch pulls several GB of CUDA libraries). Pinned in the same command so
  # transformers cannot upgrade it. DEEPGEMM_TORCH_PIP overrides the spec.
  if ! nvidia-smi >/dev/null 2>&1 && ! "$venv/bin/python" -c "import importlib.util as u; assert u.find_spec('torch') and u.find_spec('transformers')" >/dev/null 2>&1; then
    echo "deepgemm: installing a CPU build of torch and transformers into $venv (one time) ..." >&2
    "$venv/bin/python" -m pip install -q ${DEEPGEMM_TORCH_PIP:-torch==2.13.0} transformers
  fi
  PY="$venv/bin/python"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

"""The demos on a machine without a GPU: asked for the GPU (their default) they stop with the reason
and exit 2; `--device cpu` runs their plumbing end to end (swap, fused layers, error check, table)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from subprocess_env import child_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install -e .[torch])")


def run_demo(name, *args, **env):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so these run the same on a GPU runner.
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          timeout=240, env=child_env(CUDA_VISIBLE_DEVICES="", **env))


@pytest.mark.parametrize("name", ["seed_mlp.py", "gpt2_block.py"])
def test_a_demo_without_torch_says_so_and_exits_2(name, tmp_path):
    """Run by a Python that has no torch (a stand-in package that fails to import, as a missing one
    does): one line naming what to install, no traceback."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    p = run_demo(name, PYTHONPATH=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{name}: needs PyTorch" in p.stderr and "nothing was measured" in p.stderr
    assert "pip install -e '.[torch]'" in p.stderr and "Traceback" not in p.stderr and p.stdout == ""


@needs_torch
@pytest.mark.parametrize("name", ["seed_mlp.py", "gpt2_block.py"])
def test_a_demo_without_a_gpu_says_so_and_exits_2(name):
    p = run_demo(name)
    assert p.returncode == 2, p.stderr
    assert f"{name}: needs a CUDA GPU" in p.stderr and "nothing was measured" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


@needs_torch
def test_the_seed_mlp_dry_run_on_the_cpu_swaps_fuses_and_checks_its_outputs():
    p = run_demo("seed_mlp.py", "--device", "cpu", "--tokens", "16")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "Seed MLP 768-3072-3072-768, 16 tokens, float16" in out
    # Both GELUs folded into the layer before them: three deepgemm layers, one launch each.
    assert "3 layers swapped, 2 with a folded activation, 0 skipped" in out, out
    err_row = next(line for line in out.splitlines() if line.startswith("max |err| vs FP32 model"))
    assert err_row.rstrip().endswith("OK"), err_row

"""The measuring tools in scripts/ still run against the package as it is: each is run once, small,
as a user would run it. They reach into internals (a plan's launcher and its pointer arguments),
so a change there that forgets them fails here rather than in the next person's measurement."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

RUNS = {   # name -> (script, arguments, a line its output must have)
    "profile_host-cupy-small": ("profile_host.py", ["cupy", "small", "--calls", "400", "--top", "1"], "launch alone"),
    "profile_host-cupy-v5": ("profile_host.py", ["cupy", "v5", "--calls", "400", "--top", "1"], "launch alone"),
    "profile_host-torch-v5": ("profile_host.py", ["torch", "v5", "--calls", "400", "--top", "1"], "launch alone"),
    "profile_torch_linear": ("profile_torch_linear.py", ["--tokens", "64", "--calls", "200", "--top", "1"], "linear"),
    "warm_cold": ("warm_cold.py", ["256x256x256", "--reps", "3"], "256x256x256"),
    "warm_cold-states-copy": ("warm_cold.py", ["16x256x256", "--kernel", "small_m", "--reps", "3", "--states",
                                               "read,write,warm", "--copy"], "copy cold-write"),
    "ncu_shapes": ("ncu_shapes.py", ["256x512x128", "auto", "cublas"], "profiled cublas"),
    "batched_configs-torch": ("batched_configs.py", ["4x256x64x128,2x100x72x40", "--configs", "128x64,256x64",
                                                     "--reps", "3", "--rounds", "1"], "torch.bmm"),
    "ncu_shapes-batched-torch": ("ncu_shapes.py", ["4x128x192x64", "auto", "cublas", "--layout", "rr"], "profiled cublas"),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_script_runs(name):
    script, args, expect = RUNS[name]
    if "torch" in name:
        pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert expect in proc.stdout, proc.stdout[-2000:]

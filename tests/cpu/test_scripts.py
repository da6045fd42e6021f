"""Every tool in scripts/ and .ci/ starts and explains itself on a machine without a GPU (`--help`,
exit 0, nothing written): a Python tool's imports at the top resolve and its arguments parse; a
shell script prints its header comment before it sets anything up. Running them for real is the
GPU tier's (tests/gpu/test_scripts_run.py)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.py"))
# What a user runs from scripts/ and .ci/ (env.sh is sourced by the others, not run).
COMMANDS = sorted(f"{d}/{p.name}" for d in ("scripts", ".ci") for p in (ROOT / d).iterdir()
                  if p.is_file() and p.name != "env.sh")


def test_there_are_scripts():
    assert "profile_host.py" in SCRIPTS and len(SCRIPTS) >= 5, SCRIPTS


def _files(root: Path) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.mark.parametrize("script", COMMANDS)
def test_script_help(script, tmp_path):
    """Run from a copy of scripts/ and .ci/ (the shell scripts work from the folder above their
    own): whatever --help wrote would land in that copy. A script that went on to env.sh anyway
    finds DEEPGEMM_PYTHON set rather than building a .venv there."""
    for d in ("scripts", ".ci"):
        shutil.copytree(ROOT / d, tmp_path / d)
    before = _files(tmp_path)
    env = dict(os.environ, DEEPGEMM_PYTHON=sys.executable, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = [sys.executable] if script.endswith(".py") else ["bash"]
    proc = subprocess.run(run + [str(tmp_path / script), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if script.endswith(".py"):
        assert "usage:" in proc.stdout and len(proc.stdout.splitlines()) > 3, proc.stdout
    else:   # its usage, or its header comment from the line after #!
        header = (ROOT / script).read_text().splitlines()[1].removeprefix("# ")
        first = proc.stdout.splitlines()[0] if proc.stdout else ""
        assert (first == header or first.startswith("usage:")) and not proc.stderr, proc.stdout + proc.stderr
    assert _files(tmp_path) == before


@pytest.mark.parametrize("script,needs", [("profile_host.py", None), ("profile_torch_linear.py", "torch"),
                                          ("batched_configs.py 4x256x64x128", None)])
def test_a_profiling_tool_without_a_gpu_says_so_and_exits_2(script, needs):
    if needs:
        pytest.importorskip(needs)
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this runs the same on a GPU runner.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    script, *args = script.split()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{script}: needs a" in proc.stderr and "nothing was measured" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ncu_stalls_sums_the_stall_reasons_and_the_loops_of_a_source_page_export(tmp_path):
    """scripts/ncu_stalls.py on a source-page CSV shaped as `ncu --page source --print-source sass
    --csv` writes it: the reasons summed, each loop (a backward branch's span) with its samples,
    the busiest lines. A loop whose lines hold a few samples each is where the warps wait."""
    rows = [("0x7f00000100", "LDC R1, c[0x0][0x28]", 2, 1),
            ("0x7f00000110", "HGMMA.64x256x16.F32 R24, gdesc[UR20].tnspB, R24", 10, 3),
            ("0x7f00000120", "WARPGROUP.DEPBAR.LE gsb0, 0x0", 20, 20),
            ("0x7f00000130", "VIADD R3, R3, 0x1", 6, 2),
            ("0x7f00000140", "ISETP.NE.AND P0, PT, R15, 0x1, PT", 7, 2),
            ("0x7f00000150", "@!P0  BRA 0x7f00000130", 9, 9),
            ("0x7f00000160", "@P0   BRA 0x7f00000180", 1, 1),          # forward: no loop
            ("0x7f00000170", "BRA.U.ANY 0x7f00000110", 3, 0),
            ("0x7f00000180", "EXIT", 4, 0)]
    lines = ['"Kernel Name","deepgemm_kernel"',
             '"Address","Source","Warp Stall Sampling (All Samples)","stall_wait"']
    lines += [f'"{a}","{src}","{n}","{w}"' for a, src, n, w in rows]
    dump = tmp_path / "dump.csv"
    dump.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "ncu_stalls.py"), str(dump), "--top", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "9 SASS lines, 62 stall samples"
    assert "stall_wait" in out[1] and "38 (61.3%)" in out[1]
    assert out[2] == "loop 0x7f00000110-0x7f00000170 (7 instructions): 56 samples (90.3%)"
    assert out[3] == "loop 0x7f00000130-0x7f00000150 (3 instructions): 22 samples (35.5%), innermost"
    assert "WARPGROUP.DEPBAR" in out[4] and "HGMMA" in out[5] and len(out) == 6


def _batched_configs(*args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "batched_configs.py"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_batched_configs_lists_the_tiles_a_batch_takes_and_autos_pick_without_a_gpu():
    """--list needs no GPU: the grouped rule's unsplit options, the 256-row tiles among them, and
    the pick of auto (on the guessed SM count) for attention's PV and QK^T."""
    proc = _batched_configs("64x512x64x512,64x512x512x64", "--list")
    assert proc.returncode == 0, proc.stderr
    pv, qk = proc.stdout.splitlines()
    assert pv.startswith("64x512x64x512: auto v5 128x64; configs ") and qk.startswith("64x512x512x64: auto v5 128x256;")
    labels = pv.split("configs ")[1].split(", ")
    assert {"128x64", "256x64", "256x128", "128x64-pingpong"} <= set(labels), labels
    assert not any("split" in c for c in labels) and len(labels) == len(set(labels))


@pytest.mark.parametrize("args,message", [(["64x512x64"], "shape '64x512x64': expected BxMxNxK with positive"),
                                          (["64x0x64x512"], "shape '64x0x64x512': expected BxMxNxK with positive"),
                                          (["64x512x64x512", "--configs", "256x64,7x7"], "--configs: 7x7 not among"),
                                          (["64x512x64x512", "--reps", "0"], "--reps and --rounds")])
def test_batched_configs_refuses_a_bad_argument_by_name(args, message):
    proc = _batched_configs(*args, "--list")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr

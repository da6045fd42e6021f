"""`import deepgemm` works on a machine with no GPU and no CuPy, and says why the GPU tier cannot run."""
import subprocess
import sys


def test_import_without_cupy_or_torch():
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['torch'] = None\n"
            "import deepgemm, deepgemm.testing, deepgemm.report.accuracy, deepgemm.regress\n"
            "ok, why = deepgemm.gpu_available()\n"
            "assert not ok and 'CuPy' in why, why\n"
            "assert [k['name'] for k in deepgemm.kernels()] == ['v0', 'v1', 'v2', 'v3', 'v4', 'v5', 'small_m']\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_cli_says_it_has_no_gpu(monkeypatch, capsys):
    from deepgemm import __main__ as cli
    monkeypatch.setattr("deepgemm.gpu_available", lambda: (False, "no CUDA device visible to CuPy"))
    monkeypatch.setattr(cli, "_static", lambda args: 0)
    assert cli.main([]) == 0
    assert "No GPU here (no CUDA device visible to CuPy): running the static checks only" in capsys.readouterr().out

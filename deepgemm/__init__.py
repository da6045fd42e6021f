"""deepgemm: hand-written CUDA GEMM kernels (a V0..V5 ladder) behind a thin API, and the
framework that verifies and benchmarks them. Importable with no GPU and no CuPy."""
from deepgemm.api import gemm, kernels
from deepgemm.dispatch import explain
from deepgemm.jit import CompileError

__all__ = ["gemm", "kernels", "explain", "CompileError", "gpu_available"]
__version__ = "0.1.0"


def gpu_available() -> tuple[bool, str]:
    """(True, device name) when CuPy sees a CUDA device, else (False, the reason)."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install -e '.[cuda13]' or '.[cuda12]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, "no CUDA device"
        props = cupy.cuda.runtime.getDeviceProperties(0)
        return True, props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception as exc:  # no driver, no device: CuPy raises various CUDARuntimeError kinds
        return False, f"no usable CUDA device ({type(exc).__name__}: {exc})"

"""deepgemm: hand-written CUDA GEMM kernels (a V0..V5 ladder) behind a thin API, and the
framework that verifies and benchmarks them. Importable with no GPU and no CuPy."""
from deepgemm.api import clear_caches, gemm, grouped_gemm, kernels
from deepgemm.device import gpu_available
from deepgemm.dispatch import explain
from deepgemm.jit import CompileError

__all__ = ["gemm", "grouped_gemm", "kernels", "explain", "clear_caches", "CompileError", "gpu_available"]
__version__ = "0.1.0"

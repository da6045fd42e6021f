"""Benchmarks (pytest-benchmark, device time: CUDA events, cold L2, median of rounds).

Every benchmark names its reference, cuBLAS (cupy.matmul) on the same operands, whose rounds
alternate with the kernel's in the same run (extra_info['reference']); TFLOP/s and % of cuBLAS go
to extra_info too. The gate judges each benchmark against its reference, so a GPU that is slower
today is reported as drift, not as a regression (docs/regression-gate.md):

    pytest tests/bench --benchmark-only --benchmark-save=baseline   # record this GPU's baseline
    pytest tests/bench --benchmark-only --benchmark-compare         # the gate: exit 1 if slower

DEEPGEMM_BENCH_CONFIG='v4={"DG_STAGES": 2}' runs a kernel with another config.
"""
import json
import os

import numpy as np
import pytest

from deepgemm import registry
from deepgemm.gate.verdict import GATE_MIN_CHANGE_KEY
from deepgemm.testing.benchplugin import Reference

pytestmark = pytest.mark.gpu

SHAPES = {
    "4096^3": (4096, 4096, 4096),
    "8192^3": (8192, 8192, 8192),
    "bert_ffn_up_512x3072x768": (512, 3072, 768),
    "misaligned_4095^3": (4095, 4095, 4095),
    "odd_777x1234x555": (777, 1234, 555),
    "decode_16x14336x4096": (16, 14336, 4096),
    "8192x8192x1024": (8192, 8192, 1024),
    "llama_up_4096x14336x4096": (4096, 14336, 4096),
    "llama_down_4096x4096x14336": (4096, 4096, 14336),
    "misaligned_4097^3": (4097, 4097, 4097),
}
# (kernel, shape, dtype): the ladder at 4096^3; the fast kernels across the model shapes.
CASES = [(k, "4096^3", "float16") for k in ("v0", "v1", "v2", "v3")]
V4_SHAPES = ("4096^3", "8192^3", "bert_ffn_up_512x3072x768", "misaligned_4095^3", "odd_777x1234x555",
             "decode_16x14336x4096")
CASES += [("v4", s, d) for s in V4_SHAPES for d in ("float16", "bfloat16")]
# V5: every shape but decode (the small-M path's).
CASES += [("v5", s, d) for s in SHAPES if s != "decode_16x14336x4096" for d in ("float16", "bfloat16")]
CASES += [("v3", s, "float16") for s in ("bert_ffn_up_512x3072x768", "misaligned_4095^3", "odd_777x1234x555")]
FUSED_SHAPES = ("bert_ffn_up_512x3072x768", "4096^3", "8192x8192x1024", "decode_16x14336x4096")

_inputs = {}


def _config_override(kernel):
    for item in filter(None, os.environ.get("DEEPGEMM_BENCH_CONFIG", "").split(";")):
        name, cfg = item.split("=", 1)
        if name.strip() == kernel:
            return json.loads(cfg)
    return None


def operands(shape: str, dtype: str, layout: str = "rr"):
    """Random normal device operands per (shape, dtype, layout), made once per session (never
    zeros). A row-major; B row-major (layout "rr"), or column-major ("rc": the same values in
    Fortran order, as an nn.Linear weight's w.T)."""
    import cupy
    from deepgemm.reference import NUMPY_DTYPES
    key = (shape, dtype, layout)
    if key not in _inputs:
        m, n, k = SHAPES[shape]
        rng = np.random.default_rng(0)
        a = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(NUMPY_DTYPES[dtype])
        b = cupy.asarray(rng.standard_normal((k, n), dtype=np.float32)).astype(NUMPY_DTYPES[dtype])
        if layout == "rc":
            b = cupy.asfortranarray(b)
        _inputs[key] = (a, b, cupy.empty((m, n), dtype=a.dtype))
    return _inputs[key]


def cublas(shape: str, dtype: str, layout: str = "rr") -> Reference:
    """cuBLAS on the benchmark's own operands; the name pairs it across runs."""
    import cupy
    a, b, _ = operands(shape, dtype, layout)
    return Reference(f"cublas[{shape}-{dtype}" + ("]" if layout == "rr" else f"-{layout}]"), lambda: cupy.matmul(a, b))


@pytest.mark.parametrize("kernel,shape,dtype", CASES, ids=[f"{k}-{s}-{d}" for k, s, d in CASES])
def test_gemm(device_benchmark, kernel, shape, dtype):
    from deepgemm import gemm
    a, b, out = operands(shape, dtype)
    config = _config_override(kernel)
    device_benchmark(lambda: gemm(a, b, kernel=kernel, config=config, out=out), reference=cublas(shape, dtype),
                     rounds=10 if kernel in ("v0", "v1") else 30)
    m, n, k = SHAPES[shape]
    device_benchmark.record_throughput(m=m, n=n, k=k)
    device_benchmark.extra_info.update(kernel=kernel, dtype=dtype, config=config or "default")
    if kernel == "v4" and shape == "8192^3":
        # The gate's effect floor here: 15 %. As in test_v4_config_space at 8192^3, these runs hold the
        # GPU at its power cap, which slows V4's mma.sync loop more than cuBLAS: with V4 unchanged, one
        # H100 timed it 0.4-10.8 % (fp16) and 5.4-15.3 % (bf16) over the baseline another H100 recorded,
        # in three runs (docs/regression-gate.md).
        device_benchmark.extra_info[GATE_MIN_CHANGE_KEY] = 0.15


V4_CONFIGS = [dict(c) for c in registry.get("v4").config_space]


@pytest.mark.parametrize("config", V4_CONFIGS, ids=[f"cfg{i}" for i in range(len(V4_CONFIGS))])
@pytest.mark.parametrize("shape", ["4096^3", "8192^3"])
def test_v4_config_space(device_benchmark, shape, config):
    """The autotuner's raw material: every V4 config on the large shapes (fp16)."""
    from deepgemm import gemm
    a, b, out = operands(shape, "float16")
    device_benchmark(lambda: gemm(a, b, kernel="v4", config=config, out=out), reference=cublas(shape, "float16"))
    m, n, k = SHAPES[shape]
    device_benchmark.record_throughput(m=m, n=n, k=k)
    device_benchmark.extra_info.update(config=config)
    if shape == "8192^3":
        # The gate's effect floor here: 10 %, not 5 %. These 3 ms runs hold the H200 at its power
        # cap, which slows V4's mma.sync loop more than cuBLAS: unchanged V4 code has moved +6.5 %
        # against cuBLAS between two gate runs twice (cfg3, cfg6; docs/regression-gate.md), and one
        # config's ratio spans 7.8 % over its stored runs. V4 is gated at 5 % on its other shapes.
        device_benchmark.extra_info[GATE_MIN_CHANGE_KEY] = 0.10


# Every code path of a kernel's config space (KernelSpec.path_configs: V5's ping-pong, split-K, 64-row
# tiles, register-store epilogue and B multicast; small_m's cp.async ring), so that the gate times each
# whatever a tuned table picks: a path no table chooses on this GPU may be the tuner's pick on another.
# V4's are all in test_v4_config_space.
PATH_SHAPES = {"v5": "4096^3", "small_m": "decode_16x14336x4096"}
# A path timed at another shape than its kernel's: V5's 64-row tiles at 4096^3 (2048 tiles of 64 x 128)
# spread their samples over 207-302 us on one H100, from run to run and within one, at full clocks,
# where every other path there keeps within 2 %. They are timed where the tuned tables pick them:
# decode, at the H100 and H200 tables' own config for 16 x 14336 x 4096.
PATH_SHAPE_OF = {("v5", "DG_BM", 64): "decode_16x14336x4096"}
PATH_LAYOUT = "rc"   # B column-major: every path's configs take it (V5's 96-wide tiles refuse a row-major B)
PATH_CASES = [(kernel, name, value, config) for kernel in PATH_SHAPES
              for name, value, config in registry.get(kernel).path_configs()]


def path_shape(kernel: str, name: str, value: int) -> str:
    return PATH_SHAPE_OF.get((kernel, name, value), PATH_SHAPES[kernel])


@pytest.mark.parametrize("kernel,name,value,config", PATH_CASES,
                         ids=[f"{k}-{n}={v}" for k, n, v, _ in PATH_CASES])
def test_code_paths(device_benchmark, kernel, name, value, config):
    """Each code-path switch of V5's and small_m's config space at its shape (fp16, B column-major)."""
    from deepgemm import gemm
    shape = path_shape(kernel, name, value)
    a, b, out = operands(shape, "float16", PATH_LAYOUT)
    device_benchmark(lambda: gemm(a, b, kernel=kernel, config=config, out=out),
                     reference=cublas(shape, "float16", PATH_LAYOUT))
    m, n, k = SHAPES[shape]
    device_benchmark.record_throughput(m=m, n=n, k=k)
    device_benchmark.extra_info.update(kernel=kernel, config=config)


def _epilogue_operands(shape):
    import cupy
    m, n, _ = SHAPES[shape]
    rng = np.random.default_rng(1)
    bias = cupy.asarray(rng.standard_normal(n, dtype=np.float32)).astype(cupy.float16)
    resid = cupy.asarray(rng.standard_normal((m, n), dtype=np.float32)).astype(cupy.float16)
    return bias, resid


@pytest.mark.parametrize("variant", ["plain", "fused_bias_gelu_residual"])
@pytest.mark.parametrize("shape", FUSED_SHAPES)
@pytest.mark.parametrize("kernel", ["v4", "v5"])
def test_epilogue_cost(device_benchmark, kernel, shape, variant):
    """The fused chain's cost over the same kernel with no epilogue (fp16, bias + GELU + residual)."""
    from deepgemm import gemm
    a, b, out = operands(shape, "float16")
    kw = {}
    if variant != "plain":
        bias, resid = _epilogue_operands(shape)
        kw = dict(bias=bias, activation="gelu", c=resid, beta=1.0)
    device_benchmark(lambda: gemm(a, b, kernel=kernel, out=out, **kw), reference=cublas(shape, "float16"))
    m, n, k = SHAPES[shape]
    device_benchmark.record_throughput(m=m, n=n, k=k)


@pytest.mark.parametrize("variant", ["torch_unfused", "cublaslt_bias_gelu_plus_residual"])
@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_torch_epilogue_reference(device_benchmark, shape, variant):
    """What deepgemm's fused epilogue competes with: torch eager `gelu(a @ w + bias) + c`, and
    cuBLASLt's fused bias+GELU (torch._addmm_activation) followed by the residual add."""
    torch = pytest.importorskip("torch")
    a, b, _ = operands(shape, "float16")
    bias, resid = _epilogue_operands(shape)
    ta, tb, tbias, tres = (torch.from_dlpack(x) for x in (a, b, bias, resid))
    if variant == "torch_unfused":
        def fn():
            return torch.nn.functional.gelu(ta @ tb + tbias, approximate="tanh") + tres
    else:
        def fn():
            return torch._addmm_activation(tbias, ta, tb, use_gelu=True) + tres
    import cupy
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    device_benchmark(fn, stream=stream, reference=cublas(shape, "float16"))
    m, n, k = SHAPES[shape]
    device_benchmark.record_throughput(m=m, n=n, k=k)

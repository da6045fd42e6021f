"""GPU tier: each kernel's activations, as the device evaluates them, on every finite bfloat16 input
(bfloat16 spans float32's whole exponent range, subnormals included), against float64: the error
must stay within the error bound's device allowance, deepgemm.testing.bounds.ACTIVATION_DEVICE_ERROR
(eps_act (|z| + |act z|) + 2^-126). The sweep's random data only reaches |z| of a few tens; this
covers the tails, where a fast exponential or division is most likely to go wrong."""
import numpy as np
import pytest

from deepgemm import registry
from deepgemm.reference import ACTIVATIONS
from deepgemm.testing.bounds import ACTIVATION_DEVICE_ERROR


def _every_finite_bfloat16():
    import ml_dtypes
    z = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    return z[np.isfinite(z.astype(np.float32))]


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_erf", "silu"])
@pytest.mark.parametrize("kernel", registry.names())
def test_activation_on_every_bfloat16_input(kernel, activation, selected_kernels):
    import cupy
    import deepgemm
    from deepgemm import device
    if kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {kernel}")
    z = _every_finite_bfloat16()
    m, n, k = 2, z.size, 8
    spec, cc = registry.get(kernel), device.compute_capability(cupy.cuda.Device().id)
    why = "needs a newer GPU" if cc < spec.min_cc else spec.supports(registry.Problem(m, n, k, "bfloat16", "float32", cc=cc))
    if "bfloat16" not in spec.input_dtypes or why is not None:
        pytest.skip(f"{kernel} does not run this problem here: {why}")
    # D[i, j] = act(sum_k A[i, k] B[k, j]) with A's rows (1, 0, ..., 0) and B's first row z: each
    # accumulator is z[j] exactly, in any summation order.
    a = np.zeros((m, k), z.dtype)
    a[:, 0] = 1
    b = np.zeros((k, n), z.dtype)
    b[0] = z
    out = deepgemm.gemm(cupy.asarray(a), cupy.asarray(b), kernel=kernel, activation=activation, out_dtype="float32")
    got = cupy.asnumpy(out).astype(np.float64)
    x = z.astype(np.float64)
    exact = ACTIVATIONS[activation](x)
    allowance = ACTIVATION_DEVICE_ERROR[activation] * (np.abs(x) + np.abs(exact)) + 2.0 ** -126
    with np.errstate(invalid="ignore"):
        ratio = np.abs(got - exact) / allowance
    worst = int(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio)[0]))
    assert np.all(ratio <= 1), (f"{kernel} {activation}: at z = {x[worst]!r} got {got[0, worst]!r}, "
                                f"exact {exact[worst]!r} ({ratio[0, worst]:.3g} x the allowance)")

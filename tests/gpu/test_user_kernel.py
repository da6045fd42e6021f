"""On the GPU: a kernel registered by a user that asks for scratch (KernelSpec.workspace_bytes) gets
it on every call: a pointer to at least the bytes it asked for, the element count beside it, fresh
per call (such calls are never replayed from a plan, whose pointers would be a freed workspace's).
No shipped kernel uses a workspace, so only a kernel like this one runs that path of gemm()."""
import numpy as np
import pytest

import deepgemm
from deepgemm import api, jit, registry
from deepgemm.testing import assert_gemm_close

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

# V0's kernel with each accumulator sent through the workspace before it is stored: written to its
# own float of the scratch, read back. A workspace that is missing (null) or smaller than M x N
# floats stores NaN instead, so the result says whether gemm() kept the kernel's contract.
THROUGH_WORKSPACE = """
    if (p.workspace == nullptr || p.workspace_elems < (long long)p.m * p.n) {
        acc = __int_as_float(0x7fc00000);   // NaN: the contract was broken
    } else {
        volatile float* scratch = static_cast<float*>(p.workspace) + (long long)row * p.n + col;
        *scratch = acc;
        acc = *scratch;
    }
    dg::store_d(p, row, col, acc);"""


def _scratch_source(tmp_path):
    text = (jit.KERNEL_DIR / "v0_naive.cu").read_text()
    store = "\n    dg::store_d(p, row, col, acc);"
    assert text.count(store) == 1, "v0_naive.cu changed: update the workspace kernel built from it"
    out = tmp_path / "scratch_gemm.cu"
    out.write_text(text.replace(store, THROUGH_WORKSPACE))
    return out


@pytest.fixture
def scratch_kernel(tmp_path):
    """A user kernel (V0's tiles and block) that needs M x N floats of workspace."""
    source = _scratch_source(tmp_path)
    base = registry.get("v0")
    name = "user_scratch_gemm"
    registry.register(registry.KernelSpec(
        name=name, file=str(source), summary="a user's GEMM through a workspace", min_cc=base.min_cc,
        tile=base.tile, block=base.block, default_config=dict(base.default_config), public=False,
        workspace_bytes=lambda cfg, problem: 4 * problem.m * problem.n))
    try:
        yield name
    finally:
        registry.unregister(name)


def _operands(m, n, k, seed):
    rng = np.random.default_rng(seed)
    a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
    b = cupy.asarray(rng.standard_normal((k, n)).astype(np.float16))
    return a, b


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 45, 19), (256, 320, 64)])
def test_a_kernel_that_asks_for_a_workspace_gets_one(scratch_kernel, m, n, k):
    a, b = _operands(m, n, k, seed=m + n + k)
    d = deepgemm.gemm(a, b, kernel=scratch_kernel, out_dtype="float32")
    assert not bool(cupy.isnan(d).any()), "the kernel saw no workspace, or one smaller than it asked for"
    assert_gemm_close(d, a=a, b=b, msg=f"{scratch_kernel} {m}x{n}x{k}")


def test_repeated_calls_get_a_workspace_each_time(scratch_kernel):
    """The second and later calls of one geometry (those a plan would replay) still get a
    workspace, and the right one for their own size."""
    for m, seed in [(64, 1), (64, 2), (64, 3), (96, 4)]:
        a, b = _operands(m, 80, 32, seed)
        d = deepgemm.gemm(a, b, kernel=scratch_kernel, out_dtype="float32")
        assert not bool(cupy.isnan(d).any()), f"call with seed {seed}: no workspace, or too small"
        assert_gemm_close(d, a=a, b=b, msg=f"seed {seed}")
    kept = [key for key in api._plans if scratch_kernel in key]
    assert not kept, "a call with a workspace was kept for replay, which would reuse a freed workspace"
    deepgemm.gemm(a, b, kernel="v0", out_dtype="float32")   # the control: V0's call is kept
    assert any("v0" in key for key in api._plans), "the plan cache keeps nothing: the check above proves nothing"


def test_a_torch_call_gets_its_workspace_too(scratch_kernel):
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(48, 40, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(40, 56, device="cuda", dtype=torch.bfloat16, generator=gen)
    d = deepgemm.gemm(a, b, kernel=scratch_kernel, out_dtype="float32")
    assert not bool(torch.isnan(d).any()), "the kernel saw no workspace, or one smaller than it asked for"
    assert_gemm_close(d, a=a, b=b)

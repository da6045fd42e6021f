"""gemm()'s repeat-call fast path (api._plans) gives the same results as the full path: new
pointers, new outputs, epilogue operands, alignment changes, torch tensors and every kernel kind
(the plain launch, V5's tensor maps, small_m's grid hook)."""
import threading

import numpy as np
import pytest

import deepgemm
from deepgemm import api

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _rand(shape, seed, dtype=cupy.float16):
    return cupy.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)).astype(dtype)


@pytest.mark.parametrize("m, n, k", [(1, 4096, 1024), (256, 512, 128), (300, 200, 136)])
def test_replayed_calls_match_the_full_path(m, n, k):
    api._plans.clear()
    bias, c = _rand(n, 9, cupy.float32), _rand((m, n), 10)
    results = []
    for seed in range(3):   # call 1: full path, builds the plan; calls 2, 3: replays with new pointers
        a, w = _rand((m, k), seed), _rand((n, k), seed + 100)
        results.append((deepgemm.gemm(a, w.T, bias=bias, activation="relu", c=c), a, w))
    assert len(api._plans) == 1
    for d, a, w in results:
        ref = cupy.maximum(a.astype(cupy.float32) @ w.T.astype(cupy.float32) + bias, 0) + c.astype(cupy.float32)
        err = float(cupy.abs(d.astype(cupy.float32) - ref).max() / cupy.abs(ref).max())
        assert err < 2e-3, err


def test_alignment_change_takes_the_full_path():
    """Same shape and strides, base 2 bytes off: not a replay of the aligned call's plan (V5 must
    stage that operand, so such calls are never cached)."""
    api._plans.clear()
    buf, b = _rand((128, 144), 1), _rand((136, 256), 2)
    deepgemm.gemm(buf[:, :136], b, kernel="v5")
    assert len(api._plans) == 1
    view = buf[:, 1:137]                      # the same geometry, base 2 bytes further
    d = deepgemm.gemm(view, b, kernel="v5")
    assert len(api._plans) == 1
    ref = view.astype(cupy.float32) @ b.astype(cupy.float32)
    assert float(cupy.abs(d.astype(cupy.float32) - ref).max() / cupy.abs(ref).max()) < 2e-3


def test_torch_calls_replay_on_torch_stream():
    torch = pytest.importorskip("torch")
    api._plans.clear()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for seed in range(3):
            x = torch.randn(64, 96, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(seed))
            w = torch.randn(80, 96, device="cuda", dtype=torch.float16)
            y = deepgemm.gemm(x, w.T)
            ref = x.float() @ w.T.float()
    torch.cuda.synchronize()
    assert isinstance(y, torch.Tensor) and len(api._plans) == 1
    assert float((y.float() - ref).abs().max() / ref.abs().max()) < 2e-3


# ---- replays launch through cuLaunchKernel (deepgemm.launch), not CuPy: the same bits ---------

def _operands(fw, m, n, k, device=0):
    with cupy.cuda.Device(device):
        ops = [_rand((m, k), 1), _rand((n, k), 2), _rand(n, 3, cupy.float32), _rand((m, n), 4), _rand(n, 5)]
    if fw == "torch":
        torch = pytest.importorskip("torch")
        ops = [torch.from_dlpack(x) for x in ops]
    return ops


def _full_path_launches(monkeypatch):
    launches = []
    real = api.launch
    monkeypatch.setattr(api, "launch", lambda *a: launches.append(a) or real(*a))
    return launches


def _same(x, y) -> bool:
    return bool(cupy.array_equal(cupy.asarray(x), cupy.asarray(y)))


@pytest.mark.parametrize("fw", ["cupy", "torch"])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 1024), (256, 512, 128)])   # small_m; V5 (tensor maps) on Hopper
def test_replays_give_the_first_calls_bits(fw, m, n, k, monkeypatch):
    """New pointers (copies of the same values, new outputs): bit-identical results, with every
    epilogue operand (bias, residual c, scale vector) read through the replayed params."""
    api._plans.clear()
    launches = _full_path_launches(monkeypatch)
    a, w, bias, c, scale = _operands(fw, m, n, k)
    kw = dict(bias=bias, activation="silu", c=c, beta=0.5, scale=scale)
    first = deepgemm.gemm(a, w.T, **kw)
    replays = [deepgemm.gemm(a.clone() if fw == "torch" else a.copy(), w.T, **kw) for _ in range(2)]
    outs = [first * 0 for _ in range(2)]
    for out in outs:                                                   # out=: its own plan, then a replay
        assert deepgemm.gemm(a, w.T, out=out, **kw) is out
    cupy.cuda.runtime.deviceSynchronize()
    assert len(launches) == 2 and len(api._plans) == 2                 # one full path per plan
    for d in replays + outs:
        assert _same(d, first)


def _ints(shape, seed, fw, dtype="float16"):
    """Small integers on the device as a `fw` array of `dtype` (exact in either dtype and in any FP32
    sum here), made from their 16-bit patterns so that bfloat16 needs no CuPy arithmetic; and the
    same values on the host, in float64."""
    from deepgemm.reference import NUMPY_DTYPES
    host = np.random.default_rng(seed).integers(-2, 3, shape)
    bits = cupy.asarray(host.astype(NUMPY_DTYPES[dtype]).view(np.uint16))
    if fw == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_dlpack(bits).view(getattr(torch, dtype)), host.astype(np.float64)
    return bits.view(NUMPY_DTYPES[dtype]), host.astype(np.float64)


@pytest.mark.parametrize("fw", ["cupy", "torch"])
@pytest.mark.parametrize("m, n, k, b_row, dtype", [(8, 4096, 4096, False, "float16"), (2, 2048, 1024, True, "float16"),
                                                   (16, 768, 3072, False, "bfloat16")])
def test_a_column_major_a_at_decode_sizes_is_exact_through_its_row_major_copy(fw, m, n, k, b_row, dtype, monkeypatch):
    """auto runs a column-major A at 2 <= M <= 16 (K >= 1024) on a row-major copy
    (dispatch.copies_a): integer operands give the exact product on the full path and on replays
    with new values in new and in the same memory, with B in either layout, in either dtype."""
    api._plans.clear()
    launches = _full_path_launches(monkeypatch)
    w, w_host = _ints((k, n) if b_row else (n, k), 1, fw, dtype)
    b, b_host = (w, w_host) if b_row else (w.T, w_host.T)
    first_a = None
    for seed in range(3):
        values, a_host = _ints((k, m), 10 + seed, fw, dtype)
        values, a_host = values.T, a_host.T                        # M x K, column-major, as x.t() of a K x M x
        if seed < 2:
            a = values
        else:                                                      # new values where the first call's A lay
            a = first_a
            if fw == "torch":
                a.copy_(values)
            else:
                a.view(cupy.uint16)[...] = values.view(cupy.uint16)
        first_a = first_a if first_a is not None else a
        strides = a.stride() if fw == "torch" else tuple(x // 2 for x in a.strides)
        assert strides == (1, m)
        d = deepgemm.gemm(a, b, out_dtype="float32")
        assert _same(d, cupy.asarray(a_host @ b_host))
    assert len(launches) == 1 and len(api._plans) == 1


def test_torch_graph_replays_the_copy_of_a_column_major_a():
    """Under CUDA-graph capture the row-major copy of a column-major A comes from the graph's pool
    and is made again on every replay of the graph, from A's values at that time."""
    torch = pytest.importorskip("torch")
    api._plans.clear()
    x = _ints((4096, 8), 1, "torch")[0].t()             # 8 x 4096, column-major
    w = _ints((4096, 4096), 2, "torch")[0]
    deepgemm.gemm(x, w.T, out_dtype="float32")          # full path: the plan
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        deepgemm.gemm(x, w.T, out_dtype="float32")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = deepgemm.gemm(x, w.T, out_dtype="float32")
    x.copy_(_ints((4096, 8), 3, "torch")[0].t())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.double(), x.double() @ w.T.double())


def _in_a_fresh_thread(call) -> list:
    """Run call() in a new thread, wait for it and for the device; the exceptions it raised."""
    errors = []

    def run():
        try:
            call()
        except Exception as exc:   # noqa: BLE001 (returned to the test)
            errors.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    cupy.cuda.runtime.deviceSynchronize()
    return errors


@pytest.mark.parametrize("fw", ["cupy", "torch"])
def test_replay_from_a_fresh_thread(fw, monkeypatch):
    """A thread whose first CUDA work is a replay: its context gets bound before the launch (and,
    on Hopper, before V5's tensor maps are encoded for the new pointers)."""
    api._plans.clear()
    launches = _full_path_launches(monkeypatch)
    a, w, bias, c, scale = _operands(fw, 128, 256, 64)
    first = deepgemm.gemm(a, w.T, bias=bias)
    deepgemm.gemm(a, w.T, bias=bias, out=first * 0)   # the out= plan
    out = first * 0
    errors = _in_a_fresh_thread(lambda: deepgemm.gemm(a, w.T, bias=bias, out=out))
    assert not errors and len(launches) == 2 and _same(out, first)          # the thread's call: a replay


@pytest.mark.parametrize("fw", ["cupy", "torch"])
@pytest.mark.parametrize("call", ["gemm", "batched", "grouped"])
def test_first_call_from_a_fresh_thread(fw, call):
    """A thread whose first CUDA work is a full-path call (a server's worker thread): no plan to
    replay (batched and grouped calls never keep one), so on Hopper V5's tensor maps are encoded
    there before any launch has bound a context. Integer operands: the result is exact."""
    api._plans.clear()
    rng = np.random.default_rng(5)
    ints = lambda *shape: cupy.asarray(rng.integers(-2, 3, shape).astype(np.float16))
    f64 = lambda x: x.astype(cupy.float64)
    kw = {}
    if call == "gemm":
        a, b = ints(200, 136), ints(136, 264)
        ref, out = f64(a) @ f64(b), cupy.empty((200, 264), cupy.float16)
    elif call == "batched":
        a, b = ints(3, 130, 72), ints(3, 72, 136)
        ref, out = cupy.matmul(f64(a), f64(b)), cupy.empty((3, 130, 136), cupy.float16)
    else:
        sizes, a, b = [70, 0, 130], ints(200, 72), ints(3, 72, 136)
        rows = np.cumsum([0] + sizes)
        ref = cupy.concatenate([f64(a[lo:hi]) @ f64(b[g]) for g, (lo, hi) in enumerate(zip(rows[:-1], rows[1:]))])
        out, kw = cupy.empty((200, 136), cupy.float16), {"sizes": cupy.asarray(sizes, dtype=cupy.int32)}
    args = [a, b, out]
    if fw == "torch":
        torch = pytest.importorskip("torch")
        args = [torch.from_dlpack(x) for x in args]
        kw = {name: torch.from_dlpack(v) for name, v in kw.items()}
    cupy.cuda.runtime.deviceSynchronize()
    x, w, o = args
    errors = _in_a_fresh_thread(lambda: deepgemm.grouped_gemm(x, w, out=o, **kw) if call == "grouped"
                                else deepgemm.gemm(x, w, out=o))
    assert not errors, errors
    assert int((f64(out) != ref).sum()) == 0


@pytest.mark.parametrize("fw", ["cupy", "torch"])
def test_replays_on_another_device_than_the_current_one(fw):
    """Operands on device 1: replays switch to it (module, stream) whatever device is current, and
    switch back."""
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    api._plans.clear()
    a, w, bias, c, scale = _operands(fw, 128, 256, 64, device=1)
    with cupy.cuda.Device(1):
        first = deepgemm.gemm(a, w.T, bias=bias)
    results = []
    for current in (0, 1, 0):
        with cupy.cuda.Device(current):
            results.append(deepgemm.gemm(a, w.T, bias=bias))
            assert cupy.cuda.runtime.getDevice() == current
    with cupy.cuda.Device(1):
        cupy.cuda.runtime.deviceSynchronize()
        assert len(api._plans) == 1 and all(_same(d, first) for d in results)


def test_torch_graph_captures_a_replay():
    """Inside CUDA-graph capture a replay launches on torch's capturing stream (a launch on any
    other stream would fail the capture), and the graph reruns it on new input values."""
    torch = pytest.importorskip("torch")
    api._plans.clear()
    x, w, bias, c, scale = _operands("torch", 64, 256, 96)
    deepgemm.gemm(x, w.T, bias=bias)                                    # full path: the plan
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        deepgemm.gemm(x, w.T, bias=bias)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = deepgemm.gemm(x, w.T, bias=bias)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert len(api._plans) == 1 and torch.equal(y, deepgemm.gemm(x, w.T, bias=bias))


def test_a_failing_replay_raises_with_the_kernel_and_the_driver_error():
    api._plans.clear()
    a, w, bias, c, scale = _operands("cupy", 128, 256, 64)
    deepgemm.gemm(a, w.T)
    (plan,) = api._plans.values()
    plan.launcher._dims = (1, 1, 1, 4096, 1, 1, 0)                     # 4096 threads per block: invalid
    plan.launcher._local = threading.local()   # this thread's buffers (and launch config) built anew from them
    with pytest.raises(RuntimeError, match=r"launching kernel .+: cuLaunchKernel(?:Ex)? failed with CUresult 1: "
                                           r"CUDA_ERROR_INVALID_VALUE"):
        deepgemm.gemm(a, w.T)
    api._plans.clear()

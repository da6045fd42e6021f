"""deepgemm.torch.grouped_linear on the CPU: the argument checks, the torch-op arithmetic CPU
tensors get (against a per-expert loop of nn.functional.linear), and the fake implementation."""
import pytest

torch = pytest.importorskip("torch")
import deepgemm.torch as dgt  # noqa: E402


def test_cpu_tensors_get_a_loop_over_experts():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 16, generator=gen)
    w = torch.randn(3, 8, 16, generator=gen)
    b = torch.randn(3, 8, generator=gen)
    sizes = [4, 0, 6]
    y = dgt.grouped_linear(x, w, sizes=sizes, bias=b, activation="relu")
    expected = torch.cat([torch.relu(torch.nn.functional.linear(x[:4], w[0], b[0])),
                          torch.relu(torch.nn.functional.linear(x[4:], w[2], b[2]))])
    torch.testing.assert_close(y, expected)
    y2 = dgt.grouped_linear(x, w.transpose(1, 2), offsets=torch.tensor([0, 4, 4, 10]), bias=b,
                            activation="relu", weight_layout="in_out")
    torch.testing.assert_close(y2, expected)


@pytest.mark.parametrize("kw, message", [
    ({}, r"^sizes, offsets: give exactly one"),
    ({"sizes": [10], "offsets": [0, 10]}, r"^sizes, offsets: give exactly one"),
    ({"sizes": [10], "weight": torch.zeros(8, 16)}, r"^weight: expected one matrix per group"),
    ({"sizes": [10], "x": torch.zeros(2, 5, 16)}, r"^x: expected \[M, in\] \(the groups' rows one after another\), "
                                                  r"got shape \(2, 5, 16\)"),
    ({"sizes": [10], "weight": torch.zeros(1, 8, 12)}, r"^weight: x has 16 input features, weight \(1, 8, 12\) expects 12"),
    ({"sizes": [10], "bias": torch.zeros(2, 8)}, r"^bias: expected \(8,\) or \(3, 8\)"),
    ({"sizes": [10], "activation": "tanh"}, r"^activation: must be one of"),
])
def test_errors_name_the_argument(kw, message):
    args = {"x": torch.zeros(10, 16), "weight": torch.zeros(3, 8, 16)} | kw
    x, weight = args.pop("x"), args.pop("weight")
    with pytest.raises(ValueError, match=message):
        dgt.grouped_linear(x, weight, **args)


@pytest.mark.parametrize("kw, error, message", [
    ({"sizes": [4.5, 5.5, 0]}, TypeError, r"^sizes: expected integers, got dtype float64"),   # not truncated to 4, 5
    ({"offsets": 10}, ValueError, r"^offsets: expected a 1-D sequence of integers"),
    ({"sizes": [10, 0, 0], "activation": ["relu"]}, ValueError, r"^activation: must be one of"),
    ({"sizes": [10, 0, 0], "weight": torch.zeros(3, 8, 16, dtype=torch.float64)}, TypeError,
     r"^weight: dtype torch.float64 differs from x's torch.float32"),
    ({"sizes": [10, 0, 0], "x": torch.zeros(10, 16, dtype=torch.int32)}, TypeError, r"^x: dtype must be float16 or bfloat16"),
    ({"sizes": [10, 0, 0], "weight": torch.zeros(3, 8, 16, device="meta")}, ValueError, r"^weight: is on meta, x on cpu"),
    ({"sizes": [10, 0, 0], "x": [[0.0] * 16] * 10}, TypeError, r"^x: expected a torch tensor, got list"),
    ({"sizes": [10, 0, 0], "weight": [[[0.0] * 16] * 8] * 3}, TypeError, r"^weight: expected a torch tensor, got list"),
    ({"sizes": [10, 0, 0], "bias": [0.0] * 8}, TypeError, r"^bias: expected a torch tensor or None, got list"),
])
def test_errors_name_the_argument_in_this_ops_names(kw, error, message):
    """The host split is checked as grouped_gemm checks it, and the operands under their names here
    (grouped_gemm would call them a and b)."""
    args = {"x": torch.zeros(10, 16), "weight": torch.zeros(3, 8, 16)} | kw
    with pytest.raises(error, match=message):
        dgt.grouped_linear(args.pop("x"), args.pop("weight"), **args)


def test_fake_tensor_shape_for_torch_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x, w = torch.empty(10, 16), torch.empty(3, 8, 16)
        y = torch.ops.deepgemm.grouped_linear(x, w, torch.empty(3, dtype=torch.int32), False, None, None, False)
    assert tuple(y.shape) == (10, 8)


@pytest.mark.parametrize("kw, message", [
    ({"sizes": [3, 3, 0]}, r"^sizes: the group sizes add up to 6, but a has 10 rows"),
    ({"sizes": [4, -1, 7]}, r"^sizes: group 1 has a negative size -1"),
    ({"sizes": [5, 5]}, r"^sizes: expected 3 group sizes"),
    ({"offsets": [0, 6, 4, 10]}, r"^offsets: out of order at group 1 \(6 > 4\)"),
    ({"offsets": torch.tensor([0, 4, 10])}, r"^offsets: expected 4 row offsets"),
    ({"offsets": [1, 4, 6, 10]}, r"^offsets: must start at 0 and end at a's 10 rows"),
])
def test_cpu_tensors_get_the_row_split_checked_as_on_the_gpu(kw, message):
    """A split that does not cover x's rows exactly would leave rows of the result unwritten."""
    with pytest.raises(ValueError, match=message):
        dgt.grouped_linear(torch.zeros(10, 16), torch.zeros(3, 8, 16), **kw)
    with pytest.raises(ValueError, match=message):
        rows = kw.get("sizes", kw.get("offsets"))
        dgt.reference_grouped_linear(torch.zeros(10, 16), torch.zeros(3, 8, 16), torch.as_tensor(rows),
                                     rows_are_offsets="offsets" in kw)


def test_the_cuda_path_hands_views_and_the_split_to_grouped_gemm(monkeypatch):
    """_grouped_cuda on CPU tensors, grouped_gemm recorded: the weight goes as a [G, K, N] view of
    the caller's memory in either layout, the split under its own name, the epilogue as given."""
    from deepgemm import api
    from deepgemm.torch import grouped
    calls = []
    monkeypatch.setattr(api, "grouped_gemm", lambda a, b, **kw: calls.append(dict(a=a, b=b, **kw)) or "result")
    x, w, bias = torch.zeros(10, 16), torch.zeros(3, 8, 16), torch.zeros(3, 8)
    assert grouped._grouped_cuda(x, w, torch.tensor([4, 0, 6]), False, bias, "relu", False) == "result"
    call = calls[-1]
    assert call["a"] is x and call["b"].shape == (3, 16, 8) and call["b"].data_ptr() == w.data_ptr()
    assert call["b"].stride() == (128, 1, 16)                                  # W_g^T, read in place
    assert call["sizes"] == [4, 0, 6] and "offsets" not in call
    assert call["bias"] is bias and call["activation"] == "relu"
    w_in_out = torch.zeros(3, 16, 8)
    grouped._grouped_cuda(x, w_in_out, torch.tensor([0, 4, 4, 10]), True, None, None, True)
    call = calls[-1]
    assert call["b"] is w_in_out and call["offsets"] == [0, 4, 4, 10] and "sizes" not in call
    assert call["a"] is x and call["bias"] is None and call["activation"] is None

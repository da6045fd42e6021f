"""deepgemm.torch on the CPU: what swap_linears() swaps, what it folds and why not, that swapped
models keep their outputs and parameters (CPU tensors take the op's torch-arithmetic path), the
op's registration (schema, fake impl, torch.compile tracing), and how the CUDA path hands torch
memory to gemm() (recorded instead of launched). Skipped, saying why, without torch."""
import copy
import itertools
import os
import subprocess
import sys
import types

import pytest
from subprocess_env import child_env

# scripts/env.sh installs a CPU build of torch (and transformers) where it can find one.
torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[torch])")
from torch import nn

import deepgemm.torch as dgt
from deepgemm.torch import op as dgt_op


def _close(a, b, tol=1e-5):
    assert a.shape == b.shape
    assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max()


def test_import_deepgemm_does_not_import_torch():
    code = "import sys, deepgemm; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_without_torch_this_file_skips_and_says_why():
    code = ("import sys; sys.modules['torch'] = None; import pytest\n"
            f"sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', {__file__!r}]))")
    env = child_env()
    env.pop("CI", None)   # CI makes a missing torch fail instead of skipping
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    assert proc.returncode == 5, proc.stdout + proc.stderr   # pytest's "no tests ran": the module skipped
    assert "torch is not installed (pip install -e .[torch])" in proc.stdout, proc.stdout
    assert "1 skipped" in proc.stdout and "passed" not in proc.stdout, proc.stdout


def test_activation_names():
    assert dgt.activation_name(nn.ReLU()) == "relu"
    assert dgt.activation_name(nn.ReLU(inplace=True)) == "relu"
    assert dgt.activation_name(nn.GELU()) == "gelu_erf"
    assert dgt.activation_name(nn.GELU(approximate="tanh")) == "gelu"
    assert dgt.activation_name(nn.SiLU()) == "silu"
    for unsupported in (nn.Tanh(), nn.Sigmoid(), nn.LeakyReLU(), nn.Identity(), nn.Dropout()):
        assert dgt.activation_name(unsupported) is None

    class MyGELU(nn.GELU):      # a subclass may compute something else
        pass
    assert dgt.activation_name(MyGELU()) is None


def test_sequential_folds_a_following_supported_activation():
    torch.manual_seed(0)
    act1 = nn.GELU()
    model = nn.Sequential(nn.Linear(8, 16), act1, nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 12, bias=False), nn.GELU(approximate="tanh"),
                          nn.Linear(12, 12), nn.Dropout(0.0), nn.SiLU(),   # dropout between: no fold
                          nn.Linear(12, 4), nn.SiLU())
    ref = copy.deepcopy(model)
    weights = [m.weight for m in model if isinstance(m, nn.Linear)]
    report = dgt.swap_linears(model)

    assert report.names == ["0", "2", "4", "6", "9"]
    assert report.folded == {"0": "gelu_erf", "4": "gelu", "9": "silu"}
    assert report.not_folded == {"2": "Tanh is not an activation deepgemm fuses"}
    assert [type(m).__name__ for m in model] == ["Linear", "Identity", "Linear", "Tanh", "Linear", "Identity",
                                                "Linear", "Dropout", "SiLU", "Linear", "Identity"]
    assert all(isinstance(model[i], dgt.Linear) for i in (0, 2, 4, 6, 9))
    assert [model[i].activation for i in (0, 2, 4, 6, 9)] == ["gelu_erf", None, "gelu", None, "silu"]
    # the same Parameter objects: nothing copied, optimisers/ties keep working
    assert [model[i].weight for i in (0, 2, 4, 6, 9)] == weights
    assert model[4].bias is None
    assert model.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 5, 8)
    _close(model(x), ref(x))
    assert "5 layers swapped, 3 with a folded activation" in str(report)


def test_swap_linears_returns_its_report_and_prints_nothing(capsys):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    report = dgt.swap_linears(model)
    assert isinstance(report, dgt.SwapReport) and report.names == ["0", "2"]
    assert capsys.readouterr().out == ""
    assert str(report).splitlines() == [
        "deepgemm.torch.swap_linears: 2 layers swapped, 1 with a folded activation, 0 skipped",
        f"  {'0':40} {'nn.Linear':9} + relu (1 -> Identity)",
        f"  {'2':40} {'nn.Linear':9} ",
    ]


def test_swapping_twice_changes_nothing_more():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    dgt.swap_linears(model)
    again = dgt.swap_linears(model)
    assert again.swapped == [] and again.skipped == {"0": "already a deepgemm layer"}


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 10)
        self.act = nn.SiLU()
        self.out = nn.Linear(10, 3)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))   # act(fc(x)): foldable


class Sequential2(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(6, 10)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, hidden):
        # the BERT intermediate layer's shape, with a comment in the way
        hidden = self.dense(hidden)
        hidden = self.intermediate_act_fn(hidden)
        return hidden


class PreActivationReused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.fc(x)
        return self.act(h) + h     # folding would change the second term


class UsedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x)) + self.fc(x)


class OtherMethodUsesLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))

    def logits(self, x):
        return self.fc(x)          # must still get the pre-activation


class BranchThenActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU()

    def forward(self, x, project=True):
        h = x
        if project:
            h = self.fc(x)
        h = self.act(h)          # also applied to x itself when project is False: no fold
        return h


class ActOfFc(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class SubclassAddsAMethod(ActOfFc):   # forward is the base class's; the new method is read too
    def logits(self, x):
        return self.fc(x)


class ActOfFcPlusOne(ActOfFc):
    def forward(self, x):
        return self.act(self.fc(x) - 1.0)   # the activation reads more than the layer's output


class ActOfFcItem(ActOfFc):
    def forward(self, x):
        return self.act(self.fc(x)[..., :3])


class LayerIntoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(6, 6), nn.Linear(6, 6), nn.LayerNorm(6)

    def forward(self, x):
        return self.norm(self.fc2(self.fc1(x)))   # no activation module: nothing to fold or report

@pytest.mark.parametrize("cls, folded, why_not", [
    (Nested, {"fc": "silu"}, {}),
    (Sequential2, {"dense": "gelu_erf"}, {}),
    (PreActivationReused, {}, {}),
    (UsedTwice, {}, {"fc": "UsedTwice uses self.fc 2x and self.act 1x; folding needs each used once, together"}),
    (OtherMethodUsesLayer, {}, {"fc": "OtherMethodUsesLayer uses self.fc 2x and self.act 1x; folding needs "
                                      "each used once, together"}),
    (BranchThenActivation, {}, {}),
    (ActOfFc, {"fc": "relu"}, {}),
    (SubclassAddsAMethod, {}, {"fc": "SubclassAddsAMethod uses self.fc 2x and self.act 1x; folding needs "
                                     "each used once, together"}),
    (ActOfFcPlusOne, {}, {}),
    (ActOfFcItem, {}, {}),
    (LayerIntoLayer, {}, {}),
])
def test_custom_modules_fold_only_where_the_forward_source_shows_it_is_safe(cls, folded, why_not):
    torch.manual_seed(1)
    model = cls()
    ref = copy.deepcopy(model)
    report = dgt.swap_linears(model)
    assert report.folded == folded
    assert report.not_folded == why_not
    for name in folded:
        assert isinstance(getattr(model, name), dgt.Linear)
    x = torch.randn(4, 6)
    _close(model(x), ref(x))
    if hasattr(ref, "logits"):
        _close(model.logits(x), ref.logits(x))
    if cls is BranchThenActivation:
        _close(model(x, project=False), ref(x, project=False))


def test_torch_modules_other_than_sequential_are_not_read_for_folds():
    """Only nn.Sequential's forward is known to be a plain chain among torch's own modules."""
    class TorchSide(ActOfFc):
        def forward(self, x):
            return self.act(self.fc(x))
    TorchSide.__module__ = "torch.nn.modules.made_up"
    model = TorchSide()
    report = dgt.swap_linears(model)
    assert report.names == ["fc"] and report.folded == {} and report.not_folded == {}
    assert isinstance(model.act, nn.ReLU)

def test_each_class_source_is_read_once_per_call(monkeypatch):
    from deepgemm.torch import surgery
    read = []
    real = surgery._normalised_source
    monkeypatch.setattr(surgery, "_normalised_source", lambda obj: read.append(obj) or real(obj))
    model = nn.ModuleList([ActOfFc() for _ in range(4)])     # a model repeats its blocks
    report = dgt.swap_linears(model)
    assert report.folded == {f"{i}.fc": "relu" for i in range(4)}
    assert read.count(ActOfFc.forward) == 1 and read.count(ActOfFc) == 1


def test_a_class_whose_source_cannot_be_read_is_swapped_but_not_folded():
    ns = {"nn": nn}
    exec("class NoSource(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.fc, self.act = nn.Linear(4, 4), nn.ReLU()\n"
         "    def forward(self, x):\n"
         "        return self.act(self.fc(x))\n", ns)
    model = ns["NoSource"]()
    report = dgt.swap_linears(model)
    assert report.names == ["fc"] and report.folded == {} and isinstance(model.act, nn.ReLU)


def test_a_readable_forward_in_a_class_whose_own_source_is_not_is_not_folded():
    """ActOfFc's forward is readable, but a subclass made by exec() is not, and any method of it
    could read the layer's output: swapped, not folded."""
    ns = {"ActOfFc": ActOfFc}
    exec("class Unreadable(ActOfFc):\n    pass\n", ns)
    model = ns["Unreadable"]()
    report = dgt.swap_linears(model)
    assert report.names == ["fc"] and report.folded == {} and isinstance(model.act, nn.ReLU)


def test_an_instance_level_forward_is_not_read_for_folds():
    model = ActOfFc()
    model.forward = lambda x: model.act(model.fc(x) * 2.0)    # not the class's forward
    report = dgt.swap_linears(model)
    assert report.names == ["fc"] and report.folded == {} and isinstance(model.act, nn.ReLU)
    x = torch.randn(3, 6)
    _close(model(x), torch.relu(model.fc(x) * 2.0))


class _Doubled(nn.Module):
    def forward(self, w):
        return 2 * w


def _parametrized(layer):
    """layer with its weight recomputed on each access (torch.nn.utils.parametrize)."""
    from torch.nn.utils import parametrize
    parametrize.register_parametrization(layer, "weight", _Doubled())
    return layer


def test_a_parametrized_layer_is_not_swapped_and_the_report_lists_why():
    tied = _parametrized(nn.Linear(4, 4))
    model = nn.Sequential(tied, nn.Linear(4, 4), nn.Tanh())
    report = dgt.swap_linears(model)
    assert report.names == ["1"] and isinstance(model[0], nn.Linear) and hasattr(model[0], "parametrizations")
    assert report.skipped == {"0": "its weight is parametrized (torch.nn.utils.parametrize)"}
    assert report.not_folded == {"1": "Tanh is not an activation deepgemm fuses"}
    lines = str(report).splitlines()
    assert lines[0] == "deepgemm.torch.swap_linears: 1 layers swapped, 0 with a folded activation, 1 skipped"
    assert f"  {'0':40} skipped: its weight is parametrized (torch.nn.utils.parametrize)" in lines
    assert f"  {'1':40} not folded: Tanh is not an activation deepgemm fuses" in lines


def test_a_parametrized_conv1d_is_not_swapped_either():
    pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.pytorch_utils import Conv1D
    conv = _parametrized(Conv1D(4, 4))
    report = dgt.swap_linears(nn.Sequential(conv, Conv1D(4, 4)))
    assert report.names == ["1"] and report.skipped == {"0": "its weight is parametrized (torch.nn.utils.parametrize)"}


def test_what_is_not_swapped_and_why():
    class Sub(nn.Linear):
        pass

    hooked = nn.Linear(4, 4)
    hooked.register_forward_hook(lambda m, i, o: o)
    mha = nn.MultiheadAttention(8, 2)          # out_proj subclasses nn.Linear and is bypassed
    model = nn.ModuleDict({"sub": Sub(4, 4), "hooked": hooked, "mha": mha, "plain": nn.Linear(4, 4),
                           "kept": nn.Linear(4, 4)})
    report = dgt.swap_linears(model, skip=lambda name, m: name == "kept")
    assert report.names == ["plain"]
    assert report.skipped["sub"].startswith("Sub subclasses nn.Linear")
    assert report.skipped["hooked"] == "it has forward hooks, which expect its own module"
    assert report.skipped["mha.out_proj"].startswith("NonDynamicallyQuantizableLinear subclasses nn.Linear")
    assert report.skipped["kept"] == "skip() said so"
    with pytest.raises(TypeError, match="model: is itself a layer"):
        dgt.swap_linears(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got dict"):
        dgt.swap_linears({"fc": nn.Linear(2, 2)})
    with pytest.raises(TypeError, match="skip: expected a function"):
        dgt.swap_linears(nn.Sequential(nn.Linear(2, 2)), skip={"0"})


def test_only_transformers_conv1d_is_taken_for_a_conv1d():
    class Conv1D(nn.Module):             # another library's (or the user's) layer of that name
        def __init__(self, nf, nx):
            super().__init__()
            self.nf, self.nx = nf, nx
            self.weight = nn.Parameter(torch.randn(nx, nf))
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            return x @ self.weight * 2 + self.bias

    model = nn.Sequential(Conv1D(4, 3), nn.ReLU())
    report = dgt.swap_linears(model)
    assert report.swapped == [] and report.folded == {} and report.skipped == {}
    assert type(model[0]) is Conv1D and isinstance(model[1], nn.ReLU)

def test_a_layer_shared_by_two_parents_is_swapped_everywhere_but_not_folded():
    shared = nn.Linear(4, 4)
    model = nn.ModuleList([nn.Sequential(shared, nn.ReLU()), nn.Sequential(shared, nn.Tanh())])
    ref = copy.deepcopy(model)
    report = dgt.swap_linears(model)
    assert report.names == ["0.0"] and report.folded == {}
    assert report.not_folded == {"0.0": "the layer is shared by several parents"}
    assert model[0][0] is model[1][0] and isinstance(model[0][0], dgt.Linear)
    x = torch.randn(2, 4)
    for m, r in zip(model, ref):
        _close(m(x), r(x))


def test_an_activation_with_hooks_is_kept_and_its_hooks_still_run():
    for register in ("register_forward_hook", "register_forward_pre_hook"):
        calls = []
        act = nn.ReLU()
        getattr(act, register)(lambda *args: calls.append(1))
        model = nn.Sequential(nn.Linear(4, 4), act)
        report = dgt.swap_linears(model)
        assert report.names == ["0"] and report.folded == {}, register
        assert report.not_folded == {"0": "the activation module has hooks"}, register
        assert model[1] is act and model[0].activation is None
        model(torch.randn(2, 4))
        assert calls == [1], register

def test_fold_can_be_turned_off():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    report = dgt.swap_linears(model, fold_activations=False)
    assert report.names == ["0"] and report.folded == {} and isinstance(model[1], nn.GELU)


def test_swap_works_on_meta_modules_and_keeps_state_dict_compatibility():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    dgt.swap_linears(model)
    assert model[0].weight.is_meta and model[0].activation == "relu"
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model = model.to_empty(device="cpu")
    model.load_state_dict(plain.state_dict(), strict=True)
    x = torch.randn(3, 4)
    _close(model(x), plain(x))


# --- transformers models --------------------------------------------------------------------

def _tiny_gpt2(n_layer=2):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_gpt2_conv1d_projections_swapped_and_mlp_activation_folded():
    model = _tiny_gpt2()
    ref = copy.deepcopy(model)
    report = dgt.swap_linears(model)
    expected = ["lm_head"] + [f"transformer.h.{i}.{p}" for i in range(2)
                              for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert sorted(report.names) == sorted(expected)
    assert report.folded == {"transformer.h.0.mlp.c_fc": "gelu", "transformer.h.1.mlp.c_fc": "gelu"}  # gelu_new
    mlp = model.transformer.h[0].mlp
    assert isinstance(mlp.c_fc, dgt.Conv1D) and mlp.c_fc.activation == "gelu"
    assert isinstance(mlp.act, nn.Identity) and mlp.c_proj.activation is None
    assert mlp.c_fc.weight.shape == (64, 256)                            # [in, out], as it was
    assert model.lm_head.weight is model.transformer.wte.weight          # still tied
    assert model.state_dict().keys() == ref.state_dict().keys()
    model.load_state_dict(ref.state_dict(), strict=True)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        out, want = model(ids, output_hidden_states=True), ref(ids, output_hidden_states=True)
    _close(out.logits, want.logits, 1e-4)
    _close(out.hidden_states[-1], want.hidden_states[-1], 1e-4)


def test_conv1d_layout_matches_transformers():
    pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.pytorch_utils import Conv1D
    torch.manual_seed(0)
    layer = Conv1D(nf=5, nx=3)
    nn.init.normal_(layer.bias)
    ours = dgt.Conv1D.from_conv1d(layer, activation="relu")
    assert ours.weight is layer.weight and ours.weight.shape == (3, 5)
    x = torch.randn(2, 4, 3)
    _close(ours(x), torch.relu(layer(x)))
    fresh = dgt.Conv1D(5, 3)
    fresh.load_state_dict(layer.state_dict(), strict=True)


def test_llama_mlp_gate_activation_folded():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.models.llama.modeling_llama import LlamaMLP
    torch.manual_seed(0)
    mlp = LlamaMLP(transformers.LlamaConfig(hidden_size=32, intermediate_size=64, hidden_act="silu"))
    ref = copy.deepcopy(mlp)
    report = dgt.swap_linears(mlp)
    assert report.folded == {"gate_proj": "silu"}
    assert sorted(report.names) == ["down_proj", "gate_proj", "up_proj"]
    x = torch.randn(3, 32)
    _close(mlp(x), ref(x))


# --- the op ----------------------------------------------------------------------------------

def test_linear_on_cpu_matches_the_torch_computation():
    torch.manual_seed(0)
    x, w, b, r = torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(5), torch.randn(2, 3, 5)
    y = dgt.linear(x, w, b, "gelu", r)
    _close(y, nn.functional.gelu(nn.functional.linear(x, w, b), approximate="tanh") + r)
    _close(dgt.linear(x, w.t().contiguous(), b, weight_layout="in_out"), nn.functional.linear(x, w, b))
    for act, fn in (("relu", torch.relu), ("gelu_erf", nn.functional.gelu), ("silu", nn.functional.silu)):
        _close(dgt.linear(x, w, b, act), fn(nn.functional.linear(x, w, b)))


def test_linear_takes_a_lone_feature_vector_but_not_a_scalar():
    torch.manual_seed(0)
    x, w, b = torch.randn(8), torch.randn(5, 8), torch.randn(5)
    y = dgt.linear(x, w, b, "relu")
    assert y.shape == (5,)
    _close(y, torch.relu(nn.functional.linear(x, w, b)))
    with pytest.raises(ValueError, match=r"^x: expected at least 1 dimension"):
        dgt.linear(torch.tensor(1.0), torch.randn(5, 1))

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(activation="tanh"), ValueError, "activation: must be one of"),
    (dict(activation=["relu"]), ValueError, "activation: must be one of"),   # unhashable: named all the same
    (dict(weight_layout="kn"), ValueError, "weight_layout: must be one of"),
    (dict(bias=torch.zeros(4)), ValueError, r"bias: expected shape \(5,\)"),
    (dict(residual=torch.zeros(3, 4)), ValueError, "residual: expected the output's shape"),
])
def test_linear_argument_errors_name_the_argument(kwargs, error, match):
    x, w = torch.zeros(3, 8), torch.zeros(5, 8)
    with pytest.raises(error, match=match):
        dgt.linear(x, w, **kwargs)
    with pytest.raises(ValueError, match="x has 7 input features"):
        dgt.linear(torch.zeros(3, 7), w)


@pytest.mark.parametrize("weight, error, match", [
    (torch.zeros(8), ValueError, r"^weight: expected a 2-D matrix, got shape \(8,\)"),
    (torch.zeros(2, 5, 8), ValueError, r"^weight: expected a 2-D matrix, got shape \(2, 5, 8\)"),
    (torch.zeros(5, 8, dtype=torch.float64), TypeError, r"^weight: dtype torch.float64 differs from x's torch.float32"),
])
def test_linear_weight_errors_name_the_weight(weight, error, match):
    """A weight of the wrong rank or dtype is named as such, before its shape is read for the features
    (a 1-D weight would otherwise fail on an index, a 3-D one as a feature mismatch)."""
    with pytest.raises(error, match=match):
        dgt.linear(torch.zeros(3, 8), weight)


def test_linear_refuses_what_is_not_a_tensor_by_name_before_torch_does():
    x, w = torch.zeros(3, 8), torch.zeros(5, 8)
    for args, kwargs, name in ((([[0.0] * 8], w), {}, "x"), ((x, w.tolist()), {}, "weight"),
                               ((x, w), {"bias": [0.0] * 5}, "bias"), ((x, w), {"residual": 1.0}, "residual")):
        with pytest.raises(TypeError, match=f"^{name}: expected a torch tensor"):
            dgt.linear(*args, **kwargs)


def test_backward_through_the_op_raises_instead_of_losing_gradients():
    layer = dgt.Linear(4, 3)
    y = layer(torch.randn(2, 4))
    assert y.grad_fn is not None                     # went through the registered op
    with pytest.raises(RuntimeError, match="no autograd formula"):
        y.sum().backward()
    with torch.no_grad():
        assert layer(torch.randn(2, 4)).grad_fn is None


def test_op_registration_passes_opcheck():
    torch.manual_seed(0)
    x, w, b, r = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5), torch.randn(6, 5)
    torch.library.opcheck(torch.ops.deepgemm.linear.default, (x, w, b, r, "gelu", False))
    torch.library.opcheck(torch.ops.deepgemm.linear.default, (x.view(2, 3, 8), w.t().contiguous(), None, None,
                                                               None, True))


def test_torch_compile_traces_one_opaque_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 4))
    dgt.swap_linears(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend=backend, fullgraph=True)(x)
    _close(got, want)
    (gm,) = graphs
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.deepgemm.linear.default) == 2, targets


# --- the CUDA path's plumbing, with gemm() recorded instead of run ------------------------------

class FakeCupyArray:
    """What gemm() reads of a CuPy array, for machines without CuPy (CI's CPU tier)."""

    def __init__(self, ptr, nbytes, shape, dtype, strides, device):
        self.shape, self.dtype, self.strides, self.ndim = shape, dtype, strides, len(shape)
        self.data = types.SimpleNamespace(ptr=ptr)
        self.device = types.SimpleNamespace(id=device)


@pytest.fixture
def recorded(monkeypatch):
    """Run _linear_cuda on CPU tensors: deepgemm.api.gemm records the tensors it is handed (the
    torch tensors themselves, no copies) and checks their layouts through the CuPy views the full
    path would make (real CuPy arrays where CuPy is installed, else stand-ins with the same geometry)."""
    from deepgemm import api, arrays
    try:
        import cupy  # noqa: F401
    except ImportError:
        monkeypatch.setattr(arrays, "_cupy_array", FakeCupyArray)
    monkeypatch.setattr(arrays, "_views", {})
    calls = []

    def fake_gemm(a, b, **kw):
        calls.append(dict(a=a, b=b, **kw))
        for name, arr in (("a", a), ("b", b), ("out", kw["out"])):
            arrays.matrix(arrays.torch_view(arr), name)     # gemm's own layout check
        return kw["out"]

    monkeypatch.setattr(api, "gemm", fake_gemm)
    return calls


def _run_cuda_path(x, w, b=None, r=None, act=None, in_out=False):
    n = w.shape[1] if in_out else w.shape[0]
    return dgt_op._linear_cuda(x, w, b, r, act, in_out, n)


def _geometry(t):
    return tuple(t.shape), tuple(t.stride()), t.data_ptr()


def test_cuda_path_reads_weight_and_batched_x_in_place(recorded):
    x = torch.randn(2, 3, 8, dtype=torch.float16)
    w = torch.randn(5, 8, dtype=torch.float16)
    b = torch.randn(5, dtype=torch.float32)
    r = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    y = _run_cuda_path(x, w, b, r, "silu")
    (call,) = recorded
    assert _geometry(call["a"]) == ((6, 8), (8, 1), x.data_ptr())            # a view of x
    assert _geometry(call["b"]) == ((8, 5), (1, 8), w.data_ptr())            # W^T: column-major, in place
    assert _geometry(call["bias"]) == ((5,), (1,), b.data_ptr())
    assert _geometry(call["c"]) == ((6, 5), (5, 1), r.data_ptr())
    assert _geometry(call["out"]) == ((6, 5), (5, 1), y.data_ptr())
    assert y.shape == (2, 3, 5) and y.dtype == torch.float16
    assert call["activation"] == "silu"
    assert [str(call[k].dtype).replace("torch.", "") for k in ("a", "b", "bias", "c", "out")] == \
        ["float16", "float16", "float32", "bfloat16", "float16"]


def test_cuda_path_layouts(recorded):
    w = torch.randn(5, 8, dtype=torch.bfloat16)
    xt = torch.randn(8, 6, dtype=torch.bfloat16).t()                   # 6 x 8, column-major
    _run_cuda_path(xt, w)
    assert _geometry(recorded[-1]["a"]) == ((6, 8), (1, 6), xt.data_ptr())
    big = torch.randn(6, 20, dtype=torch.bfloat16)
    xs = big[:, 4:12]                                                  # row-major, leading dim 20
    _run_cuda_path(xs, w)
    assert _geometry(recorded[-1]["a"]) == ((6, 8), (20, 1), xs.data_ptr())
    xp = torch.randn(8, 2, 3, dtype=torch.bfloat16).permute(1, 2, 0)   # [2, 3, 8] flattening to column-major
    _run_cuda_path(xp, w)
    assert _geometry(recorded[-1]["a"]) == ((6, 8), (1, 6), xp.data_ptr())
    x3 = torch.randn(3, 8, 2, dtype=torch.bfloat16).permute(2, 0, 1)   # cannot be flattened: copied
    y = _run_cuda_path(x3, w)
    shape, strides, ptr = _geometry(recorded[-1]["a"])
    assert shape == (6, 8) and strides == (8, 1) and ptr != x3.data_ptr() and y.shape == (2, 3, 5)
    wkn = torch.randn(8, 5, dtype=torch.bfloat16)                      # Conv1D's [in, out]: row-major
    _run_cuda_path(xs, wkn, in_out=True)
    assert _geometry(recorded[-1]["b"]) == ((8, 5), (5, 1), wkn.data_ptr())
    x1 = torch.randn(8, dtype=torch.bfloat16)                          # no leading dimensions
    assert _run_cuda_path(x1, w).shape == (5,)
    assert _run_cuda_path(torch.randn(0, 8, dtype=torch.bfloat16), w).shape == (0, 5)
    y = _run_cuda_path(torch.randn(2, 3, 0, dtype=torch.bfloat16), torch.randn(5, 0, dtype=torch.bfloat16))
    assert y.shape == (2, 3, 5) and _geometry(recorded[-1]["a"])[0] == (6, 0)     # K = 0: the epilogue on zeros


def test_cuda_path_reads_in_place_exactly_the_views_gemm_accepts(recorded):
    """An operand goes to gemm as it is when gemm's layout check takes it (one unit-stride
    dimension, the other not overlapping it; a lone row or column with any stride), else as a
    row-major copy of the same values (broadcast, overlapping or doubly strided views)."""
    from deepgemm import arrays
    base = torch.arange(64, dtype=torch.float16)
    in_place = copied = 0
    for rows, cols, s_row, s_col in itertools.product(range(1, 5), range(1, 5), range(7), range(7)):
        t = base.as_strided((rows, cols), (s_row, s_col))
        try:
            arrays.matrix(arrays.torch_view(t), "a")
            accepted = True
        except ValueError:
            accepted = False
        got = dgt_op._as_matrix(t)
        where = (rows, cols, s_row, s_col)
        if accepted:
            assert got is t, where
            in_place += 1
        else:
            assert got.is_contiguous() and got.data_ptr() != t.data_ptr() and torch.equal(got, t), where
            copied += 1
    assert in_place > 100 and copied > 100
    w = torch.randn(1, 8, dtype=torch.bfloat16).expand(5, 8)          # one weight row broadcast
    _run_cuda_path(torch.randn(6, 8, dtype=torch.bfloat16), w)
    shape, strides, ptr = _geometry(recorded[-1]["b"])
    assert shape == (8, 5) and strides == (5, 1) and ptr != w.data_ptr()


def test_cuda_path_residual_is_read_row_major(recorded):
    """gemm reads the residual row-major with a leading dimension of at least N: a sliced
    row-major residual goes in place, any other view as a row-major copy."""
    x = torch.randn(6, 8, dtype=torch.float16)
    w = torch.randn(5, 8, dtype=torch.float16)
    big = torch.randn(6, 10, dtype=torch.float16)
    sliced = big[:, 2:7]                                             # leading dimension 10
    _run_cuda_path(x, w, r=sliced)
    assert _geometry(recorded[-1]["c"]) == ((6, 5), (10, 1), sliced.data_ptr())
    copies = {
        "column-major": torch.randn(5, 6, dtype=torch.float16).t(),
        "every other column": big[:, ::2],
        "overlapping rows": big.flatten().as_strided((6, 5), (2, 1)),
        "one row broadcast": torch.randn(5, dtype=torch.float16).expand(6, 5),
    }
    for what, r in copies.items():
        _run_cuda_path(x, w, r=r)
        c = recorded[-1]["c"]
        assert tuple(c.stride()) == (5, 1) and c.data_ptr() != r.data_ptr() and torch.equal(c, r), what
    small = {   # the same at the smallest sizes where each can happen
        "N = 2, every other column": (x, w[:2], big[:, 0:4:2]),
        "M = 2, overlapping rows": (x[:2], w, big.flatten().as_strided((2, 5), (2, 1))),
        "N = 1, one value broadcast down the rows": (x, w[:1], torch.randn(1, 1, dtype=torch.float16).expand(6, 1)),
    }
    for what, (xs, ws, r) in small.items():
        _run_cuda_path(xs, ws, r=r)
        c = recorded[-1]["c"]
        assert c.is_contiguous() and c.data_ptr() != r.data_ptr() and torch.equal(c, r), what
    one_row = big.flatten().as_strided((1, 5), (3, 1))               # M = 1: any row stride
    _run_cuda_path(x[:1], w, r=one_row)
    assert recorded[-1]["c"].data_ptr() == one_row.data_ptr()
    one_col = big[:, 3:4]                                            # N = 1: any column stride
    _run_cuda_path(x, w[:1], r=one_col)
    assert recorded[-1]["c"].data_ptr() == one_col.data_ptr()
    strided_col = big.flatten().as_strided((6, 1), (7, 3))
    _run_cuda_path(x, w[:1], r=strided_col)
    assert recorded[-1]["c"].data_ptr() == strided_col.data_ptr()


def test_cuda_path_launches_nothing_for_an_empty_result_only(recorded):
    w = torch.randn(5, 8, dtype=torch.float16)
    assert _run_cuda_path(torch.randn(0, 8, dtype=torch.float16), w).shape == (0, 5)
    assert _run_cuda_path(torch.randn(3, 0, 8, dtype=torch.float16), w).shape == (3, 0, 5)
    assert _run_cuda_path(torch.randn(4, 8, dtype=torch.float16), w[:0]).shape == (4, 0)
    assert recorded == []
    y = _run_cuda_path(torch.randn(1, 8, dtype=torch.float16), w)    # one row: still a GEMM
    assert len(recorded) == 1 and recorded[-1]["out"].data_ptr() == y.data_ptr()
    y = _run_cuda_path(torch.randn(4, 8, dtype=torch.float16), w[:1])   # one output feature
    assert len(recorded) == 2 and y.shape == (4, 1)


def test_eager_calls_skip_the_dispatcher_only_when_nothing_needs_to_see_the_op():
    w = nn.Parameter(torch.randn(3, 4))
    x = torch.randn(2, 4)
    assert not dgt_op._direct_call_ok(x, w, None, None)           # autograd must record it
    with torch.no_grad():
        assert dgt_op._direct_call_ok(x, w, None, None)
    with torch.inference_mode():
        assert dgt_op._direct_call_ok(x, w.detach(), None, None)
    # A dispatch mode (what tracing and fake tensors use) must see the op, so no direct call.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    with torch.no_grad():
        with Seen() as mode:
            assert not dgt_op._direct_call_ok(x, w, None, None)
            y = dgt.linear(x, w)
        assert any(op.startswith("deepgemm.linear") for op in mode.ops), mode.ops
        _close(y, x @ w.t())


def test_linear_refuses_epilogue_dtypes_and_devices_it_cannot_take():
    """Off the CPU (meta tensors stand in for CUDA ones here) bias and residual must be 16-bit or
    FP32, and every tensor on x's device."""
    x = torch.empty(4, 8, dtype=torch.float16, device="meta")
    w = torch.empty(3, 8, dtype=torch.float16, device="meta")
    assert dgt.linear(x, w, bias=torch.empty(3, dtype=torch.float32, device="meta")).shape == (4, 3)
    cases = [
        (dict(bias=torch.empty(3, dtype=torch.int32, device="meta")), TypeError, r"^bias: dtype must be float16, bfloat16 or float32"),
        (dict(residual=torch.empty(4, 3, dtype=torch.int8, device="meta")), TypeError, r"^residual: dtype must be"),
        (dict(bias=torch.empty(3, dtype=torch.float16)), ValueError, r"^bias: is on cpu, x on meta"),
        (dict(residual=torch.empty(4, 3, dtype=torch.float16)), ValueError, r"^residual: is on cpu, x on meta"),
    ]
    for kwargs, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            dgt.linear(x, w, **kwargs)
    with pytest.raises(ValueError, match=r"^weight: is on cpu, x on meta"):
        dgt.linear(x, torch.empty(3, 8, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^x: dtype must be float16 or bfloat16 for deepgemm .* got torch.float32"):
        dgt.linear(x.float(), w.float())


def test_on_the_cpu_linear_takes_any_floating_dtype_and_refuses_integers():
    w = torch.randn(3, 8, dtype=torch.float64)
    assert dgt.linear(torch.randn(4, 8, dtype=torch.float64), w).dtype == torch.float64
    for dtype in (torch.int32, torch.int64, torch.bool):
        with pytest.raises(TypeError, match=r"^x: dtype must be float16 or bfloat16 for deepgemm \(any floating type "
                                            rf"on the CPU\), got {dtype}"):
            dgt.linear(torch.zeros(4, 8, dtype=dtype), torch.zeros(3, 8, dtype=dtype))


def test_swapped_layers_keep_their_metadata_and_say_what_they_fuse():
    lin = dgt.Linear.from_linear(nn.Linear(16, 4, bias=False), activation="gelu")
    assert (lin.in_features, lin.out_features, lin.bias) == (16, 4, None) and lin.activation == "gelu"
    assert repr(lin) == "Linear(in_features=16, out_features=4, bias=False, activation=gelu)"
    assert repr(dgt.Linear(3, 2)) == "Linear(in_features=3, out_features=2, bias=True)"   # a bias by default
    assert dgt.Linear(3, 2).bias.shape == (2,)
    conv = dgt.Conv1D.from_conv1d(dgt.Conv1D(nf=6, nx=10), activation="relu")
    assert (conv.nf, conv.nx, tuple(conv.weight.shape)) == (6, 10, (10, 6))
    assert repr(conv) == "Conv1D(nf=6, nx=10, activation=relu)" and repr(dgt.Conv1D(6, 10)) == "Conv1D(nf=6, nx=10)"


@pytest.mark.parametrize("training", [True, False])
def test_swapped_layers_keep_the_training_mode_of_the_layer_they_replace(training):
    # A model swapped after .eval() must stay in eval mode: dropout around the layers and the
    # module's own flag read by callers follow it.
    lin = nn.Linear(8, 4).train(training)
    conv = dgt.Conv1D(nf=4, nx=8).train(training)
    assert dgt.Linear.from_linear(lin).training is training
    assert dgt.Conv1D.from_conv1d(conv).training is training
    model = nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.5)).train(training)
    dgt.swap_linears(model)
    assert isinstance(model[0], dgt.Linear) and [m.training for m in model.modules()] == [training] * 3


def test_a_new_conv1d_is_initialised_as_transformers_does():
    torch.manual_seed(0)
    conv = dgt.Conv1D(nf=256, nx=256)
    weight = conv.weight.detach()
    assert 0.018 < float(weight.std()) < 0.022 and abs(float(weight.mean())) < 0.002
    assert torch.count_nonzero(conv.bias) == 0
    assert dgt.Conv1D(nf=4, nx=4, device="meta").weight.is_meta                # no init on meta

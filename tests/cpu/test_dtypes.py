"""Dtypes as NumPy, CuPy, torch and ml_dtypes users write them, wherever deepgemm takes one (gemm's
out_dtype, explain's in_dtype/out_dtype, an Epilogue's dtypes, the tuner's jobs, the reference),
through one normaliser (deepgemm.dtypes); errors name the argument and list what is accepted."""
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import deepgemm
from deepgemm import dispatch, dtypes, reference, registry, tuner
from test_api import FAKE_GPU, F, captured, gpus  # noqa: F401  (fakes and fixtures)

SPELLINGS = {
    "float16": ["float16", "fp16", "FP16", "half", "f2", "<f2", "torch.float16", np.float16,
                np.dtype("float16"), np.dtype(np.float16)],
    "bfloat16": ["bfloat16", "bf16", "BF16", "torch.bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)],
    "float32": ["float32", "fp32", "single", "f4", np.float32, np.dtype("float32")],
}
CASES = [(name, s) for name, spellings in SPELLINGS.items() for s in spellings]


@pytest.mark.parametrize("name,spelling", CASES, ids=[f"{n}-{s!r}" for n, s in CASES])
def test_every_spelling_has_one_canonical_name(name, spelling):
    assert dtypes.canonical(spelling) == name


def test_torch_dtypes_without_importing_torch_for_them():
    torch = pytest.importorskip("torch")
    assert [dtypes.canonical(t) for t in (torch.float16, torch.half, torch.bfloat16, torch.float32, torch.float)] \
        == ["float16", "float16", "bfloat16", "float32", "float32"]
    code = ("import sys, deepgemm.dtypes as d\n"
            "class dtype:\n    __module__ = 'torch'\n    def __str__(self): return 'torch.bfloat16'\n"
            "assert d.canonical(dtype()) == 'bfloat16' and 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bad,pattern", [
    ("int8", r"^out_dtype: must be one of \('float16', 'bfloat16', 'float32'\), got int8$"),
    (np.float64, r"^out_dtype: must be one of .*got float64$"),
    (float, r"^out_dtype: must be one of .*got float64$"),          # Python's float is NumPy's float64
    ("nope", r"^out_dtype: expected a dtype, one of 'float16' \('fp16', numpy.float16, torch.float16\), "
             r"'bfloat16' .*; got 'nope'$"),
    ([1], r"^out_dtype: expected a dtype"),
    (3, r"^out_dtype: expected a dtype"),
])
def test_errors_name_the_argument_and_list_what_is_accepted(bad, pattern):
    with pytest.raises(TypeError, match=pattern):
        dtypes.canonical(bad, "out_dtype")


@pytest.mark.parametrize("spelling", ["float32", "fp32", np.float32, np.dtype("float32")])
def test_gemm_out_dtype_in_any_spelling(captured, spelling):
    out = deepgemm.gemm(F(4, 7), F(7, 3), out_dtype=spelling, kernel="v0")
    assert str(out.dtype) == "float32" and "[float16->float32," in captured[0]["compiled"].name


def test_gemm_out_dtype_torch_and_ml_dtypes(captured):
    torch = pytest.importorskip("torch")
    deepgemm.gemm(F(4, 7), F(7, 3), out_dtype=torch.bfloat16, kernel="v0")
    deepgemm.gemm(F(4, 7), F(7, 3), out_dtype=ml_dtypes.bfloat16, kernel="v0")
    assert all("[float16->bfloat16," in c["compiled"].name for c in captured)


def test_gemm_out_and_out_dtype_compare_canonically(captured):
    out = F(4, 3, dtype="float32")
    assert deepgemm.gemm(F(4, 7), F(7, 3), out=out, out_dtype=np.float32, kernel="v0") is out
    with pytest.raises(TypeError, match=r"^out: dtype float32 differs from out_dtype=float16"):
        deepgemm.gemm(F(4, 7), F(7, 3), out=out, out_dtype="fp16")
    with pytest.raises(TypeError, match=r"^out_dtype: must be one of"):
        deepgemm.gemm(F(4, 7), F(7, 3), out_dtype=np.int8)


def test_explain_takes_any_spelling_and_blames_the_right_argument():
    text = deepgemm.explain(16, 64, 64, in_dtype=np.float16, out_dtype=np.float32, device=None)
    assert text.startswith("16x64x64 float16->float32") and ".float16.rc." in text
    assert "bfloat16->bfloat16" in deepgemm.explain(16, 64, 64, in_dtype=ml_dtypes.bfloat16, device=None)
    with pytest.raises(TypeError, match=r"^in_dtype: must be one of \('float16', 'bfloat16'\), got float32"):
        deepgemm.explain(16, 64, 64, in_dtype=np.float32, device=None)
    with pytest.raises(TypeError, match=r"^out_dtype: must be one of .*got int8"):
        deepgemm.explain(16, 64, 64, out_dtype="int8", device=None)


def test_epilogue_and_tuner_dtypes():
    epi = registry.Epilogue(bias=np.float32, scale="bf16", residual=ml_dtypes.bfloat16)
    assert (epi.bias, epi.scale, epi.residual) == ("float32", "bfloat16", "bfloat16")
    assert epi == registry.Epilogue(bias="float32", scale="bfloat16", residual="bfloat16")   # one cache key
    assert registry.Epilogue(scale="scalar").scale == "scalar"
    with pytest.raises(TypeError, match=r"^bias dtype: must be one of"):
        registry.Epilogue(bias="int32")
    jobs = tuner.plan([(16, 4096, 4096)], ["bf16", np.float16], "rc", 90)
    assert [j.dtype for j in jobs] == ["bfloat16", "float16"]
    with pytest.raises(TypeError, match=r"^dtype: must be one of \('float16', 'bfloat16'\), got float32"):
        tuner.plan([(16, 4096, 4096)], ["fp32"], "rc", 90)
    assert dispatch.shape_problem(1, 2, 3, "bf16", np.float32).out_dtype == "float32"


def test_the_reference_uses_the_same_names():
    assert reference.dtype_name("fp64") == "float64" == reference.dtype_name(np.zeros(1))
    assert reference.dtype_name(np.float16) == "float16"
    assert reference.dtype_name(np.zeros(1, ml_dtypes.bfloat16)) == "bfloat16"
    with pytest.raises(TypeError, match="int32"):
        reference.dtype_name(np.zeros(1, np.int32))


def test_spellings_are_resolved_once_and_what_is_not_a_dtype_is_never_remembered(monkeypatch):
    resolved = []
    real = dtypes._resolve

    def counting(x):
        resolved.append(x)
        return real(x)
    monkeypatch.setattr(dtypes, "_resolve", counting)
    deepgemm.clear_caches()
    for _ in range(3):
        assert dtypes.canonical("fp16") == "float16"
    assert resolved == ["fp16"]
    for _ in range(2):
        with pytest.raises(TypeError, match="expected a dtype"):
            dtypes.canonical("not-a-dtype")
    assert resolved == ["fp16", "not-a-dtype", "not-a-dtype"]       # asked again each time, never cached
    with pytest.raises(TypeError, match=r"^out_dtype: must be one of"):
        dtypes.canonical("float64", "out_dtype")                      # a dtype, just not one we take
    with pytest.raises(TypeError, match=r"^out_dtype: must be one of"):
        dtypes.canonical("float64", "out_dtype")
    assert resolved.count("float64") == 1
    deepgemm.clear_caches()

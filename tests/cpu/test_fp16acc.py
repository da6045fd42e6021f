"""CPU tier for the accuracy report's FP16-accumulating kernels: both compile clean for
sm_80 and sm_90a, the mma one really runs f16-accumulator HMMA, the API selects and refuses them
as documented, and they stay out of everything that means "the ladder" (sweep, "auto", kernels())."""
import pytest

import deepgemm
from deepgemm import binary, dispatch, registry, static_checks
from deepgemm.registry import Problem
from deepgemm.report import accuracy, emulate
from test_api import FAKE_GPU, F, captured, gpus  # noqa: F401  (fakes and fixtures)

REPORT = ("fp16acc_simt", "fp16acc_mma")


@pytest.fixture(scope="module")
def results(sweep_tier):
    return static_checks.run_all(specs=[registry.get(n) for n in REPORT], full=sweep_tier == "full")


# ---------------------------------------------------------------- registry

def test_report_kernels_are_registered_but_not_ladder_kernels():
    assert set(REPORT) <= set(registry.names(purpose="report"))
    assert set(REPORT) <= set(registry.names(purpose=None))
    assert not set(REPORT) & set(registry.names())                  # the sweep, fuzz, sanitize, ladder
    assert not set(REPORT) & {s.name for s in registry.specs()}     # registry.specs()'s default
    assert not set(REPORT) & {k["name"] for k in deepgemm.kernels()}
    listed = {k["name"]: k for k in deepgemm.kernels(include_report=True)}
    assert listed["fp16acc_mma"]["input_dtypes"] == ["float16"] and listed["fp16acc_mma"]["purpose"] == "report"
    assert listed["v0"]["purpose"] == "gemm"
    for purpose in ("reports", "GEMM", ""):                         # a misspelt purpose lists nothing silently: refused
        with pytest.raises(ValueError, match=r"^purpose: must be one of \('gemm', 'report'\) or None, got "):
            registry.names(purpose=purpose)


def test_report_kernel_specs():
    mma, simt = registry.get("fp16acc_mma"), registry.get("fp16acc_simt")
    assert (mma.accumulation, simt.accumulation) == ("fp16", "fp16")
    assert mma.input_dtypes == ("float16",) and simt.input_dtypes == registry.INPUT_DTYPES
    assert mma.min_cc == simt.min_cc == 80 and "HMMA" in mma.sass_required
    assert {v.in_dtype for a in mma.archs for v in static_checks.variants(mma, a)} == {"float16"}
    assert binary.sass_features("HMMA.16816.F16 R4, R8, R12, R4 ;")["HMMA"] == 1


def test_auto_never_picks_a_report_kernel():
    for cc in (80, 90):
        for dt in registry.INPUT_DTYPES:
            spec, _ = dispatch.choose(Problem(64, 64, 64, dt, dt, cc=cc))
            assert spec.purpose == "gemm"
    assert dispatch.choose(Problem(64, 64, 64, "float16", "float16", cc=90),
                           accumulate="fp16")[0].name == "fp16acc_mma"
    assert "fp16acc_mma" in deepgemm.explain(64, 64, 64, accumulate="fp16")


# ---------------------------------------------------------------- static checks

@pytest.mark.parametrize("kernel,arch", [(k, a) for k in REPORT for a in ("sm_80", "sm_90a")])
def test_compiles_clean_for_every_layout_and_dtype(results, sweep_tier, kernel, arch):
    spec = registry.get(kernel)
    assert arch in spec.archs
    mine = [r for r in results if r.variant.spec.name == kernel and r.variant.arch == arch]
    assert len(mine) == len(static_checks.variants(spec, arch, sweep_tier == "full"))
    assert {(r.variant.a_row, r.variant.b_row) for r in mine} == {(x, y) for x in (0, 1) for y in (0, 1)}
    assert {r.variant.in_dtype for r in mine} == set(spec.input_dtypes)
    problems = [f"{r.variant}: {'; '.join(r.problems)}" for r in mine if not r.ok]
    assert not problems, "\n".join(problems)
    for r in mine:
        assert r.resources["registers"] > 0 and r.resources["spill_stores"] == 0 == r.resources["spill_loads"]


def test_mma_accumulates_in_f16_on_the_tensor_cores(results):
    mma = [r for r in results if r.variant.spec.name == "fp16acc_mma"]
    assert mma
    for r in mma:
        assert r.features["HMMA.F16"], f"{r.variant}: no HMMA.16816.F16"
        assert not r.features["HMMA.F32"], f"{r.variant}: has an FP32-accumulating HMMA"


def test_simt_accumulates_with_hfma2(results):
    simt = [r for r in results if r.variant.spec.name == "fp16acc_simt" and r.variant.epilogue == registry.NO_EPILOGUE
            and r.variant.arch == "sm_90a"]
    assert {r.variant.in_dtype for r in simt} == set(registry.INPUT_DTYPES)
    for r in simt:
        assert r.features["HFMA2"] >= 32 * 4, \
            f"{r.variant}: {r.features['HFMA2']} HFMA2 (expected BK*TM = 128 in the loop)"
        assert bool(r.features["BF16_V2"]) == (r.variant.in_dtype == "bfloat16")
        assert not r.features["HMMA"] and not r.features["HMMA.F16"] and not r.features["HMMA.F32"]


# ---------------------------------------------------------------- API

@pytest.mark.parametrize("a,b,kwargs,exc,pattern", [
    (F(4, 7), F(7, 3), dict(accumulate="fp64"), ValueError, r"^accumulate: must be one of \('fp32', 'fp16'\)"),
    (F(0, 7), F(7, 3), dict(accumulate="bf16"), ValueError, r"^accumulate: must be one of"),
    (F(4, 7, dtype="bfloat16"), F(7, 3, dtype="bfloat16"), dict(accumulate="fp16"), TypeError,
     r"^accumulate: 'fp16' with bfloat16 inputs: fp16acc_mma takes float16 only .*kernel='fp16acc_simt'"),
    (F(4, 7, dtype="bfloat16"), F(7, 3, dtype="bfloat16"), dict(accumulate="fp16", kernel="fp16acc_mma"),
     TypeError, r"^kernel: 'fp16acc_mma' takes float16 inputs only, got bfloat16 \(there is no bf16 mma"),
    (F(4, 7), F(7, 3), dict(kernel="fp16acc_simt"), ValueError,
     r"^accumulate: kernel 'fp16acc_simt' accumulates in fp16, but accumulate='fp32'; pass accumulate='fp16'"),
    (F(4, 7), F(7, 3), dict(kernel="fp16acc_mma", accumulate="fp32"), ValueError,
     r"^accumulate: kernel 'fp16acc_mma' accumulates in fp16"),
    (F(4, 7), F(7, 3), dict(kernel="v4", accumulate="fp16"), ValueError,
     r"^accumulate: kernel 'v4' accumulates in fp32, but accumulate='fp16'"),
    (F(4, 7), F(7, 3), dict(accumulate="fp16", config={"DG_BM": 64}), ValueError, r"^config: only meaningful"),
])
def test_accumulate_errors(captured, a, b, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        deepgemm.gemm(a, b, **kwargs)
    assert not captured


def test_accumulate_fp16_needs_sm80(captured, gpus):
    gpus({0: dict(FAKE_GPU, cc=75)})
    with pytest.raises(ValueError, match=r"^accumulate: 'fp16' needs compute capability >= 8.0"):
        deepgemm.gemm(F(4, 7), F(7, 3), accumulate="fp16")


def test_accumulate_fp16_launches_the_mma_variant(captured):
    deepgemm.gemm(F(200, 48), F(80, 48).T, accumulate="fp16", out_dtype="float32")
    (launch,) = captured
    assert launch["compiled"].name.startswith("fp16acc_mma[float16->float32,rc,")
    assert launch["grid"] == (1, 2, 1) and launch["block"] == (128, 1, 1)


def test_named_simt_variant_takes_bf16(captured):
    deepgemm.gemm(F(40, 48, dtype="bfloat16"), F(48, 70, dtype="bfloat16"), kernel="fp16acc_simt",
                  accumulate="fp16")
    (launch,) = captured
    assert launch["compiled"].name.startswith("fp16acc_simt[bfloat16->bfloat16,rr,")
    assert launch["grid"] == (2, 2, 1) and launch["block"] == (256, 1, 1)


# ---------------------------------------------------------------- the report's GPU wiring

def _tiny_report_args(tmp_path, *extra):
    return ["--out", str(tmp_path), "--ks", "16", "--size", "4", "--no-progress", *extra]


def test_report_uses_deepgemm_kernels_when_a_gpu_is_there(tmp_path, monkeypatch):
    from deepgemm import device
    from deepgemm.report import gpu_runner

    calls = []

    def fake_runner(a, b, acc):
        calls.append((a.dtype.name, acc))
        return None if (acc, a.dtype.name) == ("fp16", "bfloat16") else (emulate.emulate_gemm(a, b, acc), 1e-6)

    fake_runner.device_name = "Fake GPU"
    monkeypatch.setattr(device, "gpu_available", lambda: (True, "Fake GPU"))
    monkeypatch.setattr(gpu_runner, "make_gpu_runner", lambda: fake_runner)
    assert accuracy.main(_tiny_report_args(tmp_path / "gpu")) == 0
    assert ("float16", "fp16") in calls and ("bfloat16", "fp32") in calls
    assert "Fake GPU" in (tmp_path / "gpu" / "report.md").read_text().splitlines()[0]

    calls.clear()   # --emulated: the runner is never built nor called
    assert accuracy.main(_tiny_report_args(tmp_path / "emu", "--emulated")) == 0
    assert not calls and "EMULATED" in (tmp_path / "emu" / "report.md").read_text().splitlines()[0]


@pytest.fixture
def fake_cupy_device(monkeypatch):
    """make_gpu_runner on the CPU: NumPy stands in for CuPy (outputs start as NaN, as an unwritten
    buffer may), gemm() computes in float32, time_device records its arguments and never calls the
    function it is given, so the runner's result is its own call's."""
    import sys
    import types

    import numpy as np

    from deepgemm import bench, device
    seen = {"gemm": [], "timed": [], "devices": []}

    class Device:
        def __init__(self, dev=None):
            self.id = 0 if dev is None else dev

        def __enter__(self):
            seen["devices"].append(self.id)

        def __exit__(self, *exc):
            return False

    def gemm(a, b, out, **kw):
        seen["gemm"].append(kw)
        out[...] = a.astype(np.float32) @ b.astype(np.float32)
    fake = types.SimpleNamespace(asarray=np.asarray, asnumpy=np.asarray, float32=np.float32,
                                 empty=lambda shape, dtype: np.full(shape, np.nan, dtype),
                                 cuda=types.SimpleNamespace(Device=Device))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(deepgemm, "gpu_available", lambda: (True, "Fake GPU"))
    monkeypatch.setattr(device, "compute_capability", lambda dev: 80)
    monkeypatch.setattr(device, "name", lambda dev: f"Fake GPU {dev}")
    monkeypatch.setattr(deepgemm, "gemm", gemm)
    monkeypatch.setattr(bench, "time_device", lambda fn, warmup, reps: (
        seen["timed"].append((warmup, reps)), types.SimpleNamespace(median_seconds=2e-6))[1])
    return seen


def test_the_gpu_runner_runs_each_accumulation_on_its_kernel(fake_cupy_device):
    import ml_dtypes
    import numpy as np

    from deepgemm.report.gpu_runner import make_gpu_runner
    seen = fake_cupy_device
    runner = make_gpu_runner(warmup=1, reps=3)
    assert runner.device_name == "Fake GPU"
    rng = np.random.default_rng(0)
    a, b = rng.integers(-3, 4, (5, 7)).astype(np.float16), rng.integers(-3, 4, (7, 3)).astype(np.float16)
    for acc, kw in (("fp32", {"kernel": "v4"}), ("fp16", {"kernel": "fp16acc_mma", "accumulate": "fp16"})):
        c, seconds = runner(a, b, acc)
        assert c.dtype == np.float64 and c.shape == (5, 3) and seconds == 2e-6
        assert np.array_equal(c, a.astype(np.float64) @ b.astype(np.float64))
        assert seen["gemm"][-1] == kw
    assert seen["timed"] == [(1, 3)] * 2 and seen["devices"] == [0, 0]
    calls = len(seen["gemm"])
    assert runner(a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16), "fp16") is None
    assert runner(a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16), "fp32")[0].shape == (5, 3)
    assert len(seen["gemm"]) == calls + 1                    # bf16 with an fp16 accumulator: no launch
    with pytest.raises(ValueError, match=r"accumulate: expected one of \('fp32', 'fp16'\), got 'fp64'"):
        runner(a, b, "fp64")
    on_one = make_gpu_runner(device=1)
    assert on_one.device_name == "Fake GPU 1"
    on_one(a, b, "fp32")
    assert seen["devices"][-1] == 1


def test_the_gpu_runner_refuses_a_machine_it_cannot_use(fake_cupy_device, monkeypatch):
    from deepgemm import device
    from deepgemm.report.gpu_runner import make_gpu_runner
    monkeypatch.setattr(device, "compute_capability", lambda dev: 75)
    with pytest.raises(RuntimeError, match=r"need compute capability >= 8\.0, this GPU has 7\.5"):
        make_gpu_runner()
    monkeypatch.setattr(deepgemm, "gpu_available", lambda: (False, "no CUDA device visible to CuPy"))
    with pytest.raises(RuntimeError, match="no GPU for the accuracy report: no CUDA device visible to CuPy"):
        make_gpu_runner()


def test_report_emulates_without_a_gpu(tmp_path, monkeypatch):
    from deepgemm import device
    monkeypatch.setattr(device, "gpu_available", lambda: (False, "no GPU"))
    assert accuracy.default_gpu_runner() is None
    assert accuracy.main(_tiny_report_args(tmp_path)) == 0
    assert "EMULATED" in (tmp_path / "report.md").read_text().splitlines()[0]


def test_an_emulated_run_never_replaces_the_committed_gpu_report_by_default(tmp_path, monkeypatch, capsys):
    """Without --out the report goes to docs/accuracy; there the committed report is a GPU's, and a
    machine without one (or --emulated) must not overwrite it: exit 2, the file untouched. An
    emulated report there may be replaced, and --out naming that folder replaces a GPU's on purpose."""
    from deepgemm import cli, device
    monkeypatch.setattr(device, "gpu_available", lambda: (False, "no GPU"))
    docs = tmp_path / "docs" / "accuracy"
    docs.mkdir(parents=True)
    monkeypatch.setattr(cli, "repo_path", lambda *parts: tmp_path.joinpath(*parts))
    gpu_report = "# deepgemm accuracy report — NVIDIA H200\n\nMeasured ...\n"
    (docs / "report.md").write_text(gpu_report)
    tiny = ["--ks", "16", "--size", "4", "--no-progress"]
    for extra in ([], ["--emulated"]):
        assert accuracy.main(tiny + extra) == 2
        assert "is a GPU's report: an emulated one goes elsewhere, give --out DIR" in capsys.readouterr().err
        assert (docs / "report.md").read_text() == gpu_report
    assert accuracy.main(tiny + ["--out", str(docs)]) == 0
    assert "EMULATED" in (docs / "report.md").read_text().splitlines()[0]
    assert accuracy.main(tiny) == 0                      # an emulated report is replaced freely

"""CPU tests of the accumulation emulation and the accuracy report (no GPU needed)."""

import math

import ml_dtypes
import numpy as np
import pytest

from deepgemm.report import accuracy
from deepgemm.report.emulate import emulate_gemm, round_to_bf16, round_to_format


def dot(values, accumulate, block_k=1):
    """Sum ``values`` as one dot product (values times ones) in the given accumulator."""
    a = np.array([values], dtype=np.float64)
    return float(emulate_gemm(a, np.ones((len(values), 1)), accumulate, block_k)[0, 0])


def slow_emulation(a, b, dtype, block_k=1):
    """The obvious definition: numpy's casts, one k-block at a time."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((a.shape[0], b.shape[1]), dtype)
    with np.errstate(over="ignore"):
        for k0 in range(0, a.shape[1], block_k):
            acc = (acc + a[:, k0:k0 + block_k] @ b[k0:k0 + block_k]).astype(dtype)
    return acc.astype(np.float64)


# ---------------------------------------------------------------- emulation, by hand

def test_fp16_accumulation_stalls_at_2048():
    values = [2048.0] + [1.0] * 100
    assert dot(values, "fp16") == 2048.0  # 2049 is a tie between 2048 and 2050: even wins
    assert dot(values, "fp32") == 2148.0


def test_block_k_rounds_once_per_block():
    values = [2048.0] + [1.0] * 100
    # block 1: 2048 + 15 = 2063 -> 2064 (tie, even); 5 blocks of 16 ones -> 2144 exactly;
    # last block 5 ones: 2149 -> 2148 (tie, even).
    assert dot(values, "fp16", block_k=16) == 2148.0
    # One block covering all of K = a single rounding of the exact sum.
    assert dot(values, "fp16", block_k=101) == 2148.0
    assert dot([2048.0, 1.0, 1.0], "fp16", block_k=1) == 2048.0
    assert dot([2048.0, 1.0, 1.0], "fp16", block_k=3) == 2050.0


def test_fp16_ties_to_even_subnormals_and_overflow():
    assert dot([1024.0, 0.5], "fp16") == 1024.0
    assert dot([1025.0, 0.5], "fp16") == 1026.0
    assert dot([2.0**-25], "fp16") == 0.0  # half the smallest subnormal: tie to 0
    assert dot([3 * 2.0**-25], "fp16") == 2.0**-23
    assert dot([65504.0, 8.0], "fp16") == 65504.0  # 65512 rounds down
    assert dot([65504.0, 16.0], "fp16") == math.inf  # 65520: tie, rounds to inf
    assert dot([-65504.0, -16.0], "fp16") == -math.inf
    assert dot([65504.0, 16.0, -60000.0], "fp16") == math.inf  # inf stays inf
    assert dot([65504.0, 16.0, -60000.0], "fp32") == 5520.0


def test_fp32_accumulation_stalls_at_2_pow_24():
    a = np.array([[4096.0, 1.0, 1.0]], np.float16)
    b = np.array([[4096.0], [1.0], [1.0]], np.float16)
    assert emulate_gemm(a, b, "fp32")[0, 0] == 2.0**24  # +1 twice: both ties to even
    assert emulate_gemm(a, b, "fp16")[0, 0] == math.inf  # 2^24 > 65504


def test_bf16_rounding_is_single_and_correct():
    assert dot([256.0, 1.0], "bf16") == 256.0  # ulp 2 at 256: tie -> even
    assert dot([256.0, 3.0], "bf16") == 260.0  # 259: tie -> 260 (even significand)
    # Rounding float64 -> float32 -> bf16 (what ml_dtypes' own cast did before 0.7): 1 + 2^-8 + 2^-30
    # becomes the tie 1 + 2^-8 and then 1.0; the correct rounding is 1 + 2^-7.
    x = 1 + 2.0**-8 + 2.0**-30
    assert float(np.float64(x).astype(np.float32).astype(ml_dtypes.bfloat16)) == 1.0
    assert round_to_bf16(x) == 1 + 2.0**-7
    bf16_max = (2 - 2.0**-7) * 2.0**127
    assert round_to_bf16(bf16_max * (1 + 2.0**-10)) == bf16_max
    assert round_to_bf16(3.4e38) == math.inf  # above (2 - 2^-8) * 2^127
    assert round_to_bf16(2.0**-133) == 2.0**-133  # smallest bf16 subnormal
    assert round_to_bf16(2.0**-134) == 0.0  # tie -> 0


def test_fp16_rounding_matches_numpy_cast_bit_for_bit():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(200_000) * np.exp2(rng.uniform(-30, 18, 200_000))
    half = rng.standard_normal(50_000).astype(np.float16)
    ties = (half.astype(np.float64)
            + np.nextafter(half, np.float16(np.inf)).astype(np.float64)) / 2
    x = np.concatenate([x, ties, rng.integers(-4000, 4000, 20_000) * 2.0**-25,
                        [65504, 65519.99, 65520, -65520, np.inf, -np.inf, np.nan, 0.0]])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(round_to_format(x, "fp16"), expected)


@pytest.mark.parametrize("accumulate,dtype", [("fp16", np.float16), ("fp32", np.float32)])
@pytest.mark.parametrize("block_k", [1, 7, 16])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
def test_emulation_matches_the_obvious_definition(accumulate, dtype, block_k, scale):
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((9, 300)) * scale).astype(np.float16)
    b = (rng.uniform(-0.5, 1, (300, 7)) * scale).astype(np.float16)
    np.testing.assert_array_equal(emulate_gemm(a, b, accumulate, block_k),
                                  slow_emulation(a, b, dtype, block_k))


def test_batched_equals_one_at_a_time_and_k0_is_zero():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 5, 40)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3, 40, 4)).astype(ml_dtypes.bfloat16)
    batched = emulate_gemm(a, b, "fp16")
    for i in range(3):
        np.testing.assert_array_equal(batched[i], emulate_gemm(a[i], b[i], "fp16"))
    assert not emulate_gemm(np.zeros((2, 0)), np.zeros((0, 3)), "fp16").any()
    with pytest.raises(ValueError):
        emulate_gemm(a[0], b[0], "fp8")


# ---------------------------------------------------------------- the report

@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("accuracy")
    return accuracy.run_accuracy_report(out, ks=(16, 1024, 8192), m=16, n=16, progress=False)


def test_report_writes_its_files(report):
    assert report.backend == "emulated"
    for path in [report.markdown_path, report.csv_path, *report.plot_paths]:
        assert path.is_file() and path.stat().st_size > 0
    assert len(report.plot_paths) == 2
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in report.plot_paths)
    md = report.markdown_path.read_text()
    assert md.splitlines()[0].startswith("# ") and "EMULATED" in md.splitlines()[0]
    assert "## Inputs float16" in md and "## Inputs bfloat16" in md
    assert "float16" in report.text and "fp16/fp32" in report.text
    assert len(report.rows) == 2 * 4 * 3


def test_fp32_accumulation_is_within_its_bound_everywhere(report):
    for row in report.rows:
        e = row.errors["fp32"]
        assert e.overflow == 0 and e.nan == 0
        assert e.bound_ratio <= 1, (row.dtype, row.dist, row.k)


def test_fp16_accumulation_is_far_worse_at_large_k(report):
    big = [r for r in report.rows if r.dist == "normal" and r.k >= 1024]
    assert len(big) == 4
    for row in big:
        assert row.errors["fp16"].max_rel >= 100 * row.errors["fp32"].max_rel
        assert row.fp16_over_fp32 >= 100
    # The FP16 bound is vacuous at K*u >= 1 and reported as such, not as a number.
    assert all(math.isnan(r.errors["fp16"].bound_ratio) for r in report.rows if r.k >= 2048)


def test_uniform_fp16_sum_stalls(report):
    for dtype in ("float16", "bfloat16"):
        row = report.row(dtype, "uniform", 8192)
        assert row.errors["fp16"].mean_out < 0.9 * row.mean_ref  # stalled well short
        assert row.errors["fp16"].max_rel > 0.1
        assert row.errors["fp32"].max_rel < 1e-5


def test_overflow_is_reported_not_hidden(report):
    for dtype in ("float16", "bfloat16"):
        row = report.row(dtype, "large", 8192)
        assert row.errors["fp16"].overflow > 0.5
        assert row.errors["fp16"].finite_only
        assert row.errors["fp32"].overflow == 0
        assert math.isfinite(row.errors["fp32"].max_rel)
    md = report.markdown_path.read_text()
    assert "OVERFLOW: FP16 accumulation gave inf" in md
    assert "FP32 accumulation produced no inf or nan" in md
    large_rows = [line for line in md.splitlines() if line.startswith("| 8192 | large |")]
    assert len(large_rows) == 2 and all("inf " in line and "*" in line for line in large_rows)
    assert "inf" in report.text
    csv_text = report.csv_path.read_text()
    assert "float16,large,8192,fp16" in csv_text


def test_gpu_backend_with_a_fake_runner(tmp_path):
    calls = []

    def runner(a, b, acc):
        calls.append((a.dtype.name, acc))
        if acc == "fp16" and a.dtype.name == "bfloat16":
            raise NotImplementedError  # bf16 mma has no f16 accumulator
        block_k = 16 if acc == "fp16" else 1  # behaves like a tensor-core kernel
        return emulate_gemm(a, b, acc, block_k), 1e-5

    runner.device_name = "Fake H200"
    result = accuracy.run_accuracy_report(tmp_path, ks=(16, 64), dists=("normal", "large"),
                                          m=8, n=8, gpu_runner=runner, progress=False)
    assert result.backend == "gpu" and result.device == "Fake H200"
    assert ("float16", "fp16") in calls and ("bfloat16", "fp32") in calls
    row = result.row("float16", "normal", 64)
    assert row.errors["fp16"].source == "gpu" and row.seconds["fp16"] == 1e-5
    assert row.agreement["fp16_vs_emulated_k16"] == 0
    assert row.agreement["fp16_vs_emulated"] > 0  # per-k rounding differs from per-block
    assert row.agreement["fp32_vs_emulated"] == 0
    assert result.row("bfloat16", "normal", 64).errors["fp16"].source == "emulated"
    md = result.markdown_path.read_text()
    assert md.splitlines()[0] == "# deepgemm accuracy report — Fake H200"
    assert "agree k16" in md and "(emu)" in md


def test_ratios_of_zero_and_non_finite_errors_are_named_not_raised():
    from deepgemm.report.accuracy import _fmt_ratio, _ratio
    assert _ratio(3.0, 2.0) == 1.5
    assert _ratio(1.0, 0.0) == math.inf and math.isnan(_ratio(0.0, 0.0))
    assert math.isnan(_ratio(math.nan, 1.0)) and math.isnan(_ratio(1.0, math.inf))
    assert [_fmt_ratio(x) for x in (math.inf, math.nan, 1234.5, 2.3456)] == ["n/a", "n/a", "1,234", "2.35"]


def _stats(max_rel, bound_ratio=0.5, overflow=0.0, source="emulated"):
    return accuracy.ErrorStats(max_abs=max_rel, max_rel=max_rel, mean_rel=max_rel / 2, bound_ratio=bound_ratio,
                               overflow=overflow, nan=0.0, mean_out=1.0, source=source)


def test_findings_are_computed_from_the_rows():
    """Synthetic rows with known answers: the ratio range and its median, the worst FP32 bound ratio
    and where, the k-block gain, and on a GPU the price of accuracy and the agreement."""
    def row(k, fp32_bound, fp16_rel, k16_rel, seconds=None, agreement=None):
        return accuracy.AccuracyRow("float16", "normal", k, 0.0, 10.0,
                                    {"fp32": _stats(1e-6, fp32_bound), "fp16": _stats(fp16_rel, math.nan),
                                     "fp16_k16": _stats(k16_rel, math.nan)},
                                    seconds=seconds or {}, agreement=agreement or {})
    rows = [row(512, 0.9, 1e-3, 1e-3), row(1024, 0.25, 2e-4, 5e-5), row(4096, 0.5, 8e-4, 1e-4)]
    text = "\n".join(accuracy.compute_findings(rows, "emulated"))
    assert "K >= 1024: FP16 accumulation's max relative error is 200x-800x that of FP32 accumulation (median 500x)." in text
    assert "FP32 accumulation stays within the forward error bound" in text
    assert "largest error/bound ratio 0.9 (float16, normal, K=512)" in text
    assert "instead of after every k cuts the error 4x-8x (normal data, K >= 1024)" in text
    assert "produced no inf or nan" in text and "Price of accuracy" not in text

    rows[1].errors["fp32"] = _stats(1e-6, 1.5)
    for r, (t16, t32, agree) in zip(rows, ((2.0, 4.0, 0.0), (1.0, 4.0, 1e-3), (3.0, 3.0, 0.0))):
        r.seconds, r.agreement = {"fp16": t16, "fp32": t32}, {"fp32_vs_emulated": agree}
    text = "\n".join(accuracy.compute_findings(rows, "gpu"))
    assert "FP32 accumulation EXCEEDS the forward error bound" in text and "ratio 1.5 (float16, normal, K=1024)" in text
    assert "takes 0.25x-1x the time of the FP32-accumulating one" in text
    assert "GPU vs emulation (fp32_vs_emulated): max |gpu - emu| / max|ref| up to 0.001; bit-exact in 2 of 3 cases." in text


def test_unit_roundoffs_and_formats_agree_with_numpys_finfo():
    from deepgemm.report import emulate
    finfo = {"fp16": np.finfo(np.float16), "bf16": ml_dtypes.finfo(ml_dtypes.bfloat16),
             "fp32": np.finfo(np.float32), "fp64": np.finfo(np.float64)}
    for name, info in finfo.items():
        assert emulate.UNIT_ROUNDOFF[name] == float(info.eps) / 2, name      # u = 2^-p = eps / 2
    for name, (mantissa, min_exp, max_exp, largest) in emulate._FORMATS.items():
        info = finfo[name]
        assert (mantissa, min_exp, max_exp, largest) == (info.nmant, info.minexp, info.maxexp - 1, float(info.max)), name


def test_rounding_keeps_infinities_and_nan_and_rounds_past_the_largest_to_inf():
    for fmt, largest in (("fp16", 65504.0), ("bf16", float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))):
        got = round_to_format(np.array([math.inf, -math.inf, 2 * largest, -2 * largest, largest, 1.0]), fmt)
        assert list(got) == [math.inf, -math.inf, math.inf, -math.inf, largest, 1.0], fmt
        assert math.isnan(round_to_format(np.array([math.nan]), fmt)[0])


def test_rounding_matches_a_single_cast_at_every_float64_exponent():
    """1.5 x 2^e for every e float64 has, both signs: below the format's subnormals, through its
    range, and far past it, where the rounding constant itself would overflow to nan without the
    clamp (fp16 near 2^982, bf16 near 2^979). Each value is exact in float32, so ml_dtypes' cast
    through float32 rounds once, like numpy's float64 -> float16."""
    e = np.arange(-1074, 1023)
    x = np.concatenate([1.5 * np.exp2(e.astype(np.float64)), -1.5 * np.exp2(e.astype(np.float64))])
    x = x[np.isfinite(x) & (x != 0)]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(round_to_format(x, "fp16"), x.astype(np.float16).astype(np.float64))
        via32 = x.astype(np.float32)
        bf = np.where(np.isfinite(via32), via32, np.copysign(np.inf, x)).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(round_to_format(x, "bf16"), bf.astype(np.float64))


@pytest.mark.parametrize("call, error, message", [
    (lambda: emulate_gemm(np.ones((2, 3)), np.ones((4, 2))), ValueError, r"shapes \(2, 3\) and \(4, 2\) do not multiply"),
    (lambda: emulate_gemm(np.ones((2, 2, 3)), np.ones((3, 3, 2))), ValueError, "do not multiply"),   # batch 2 vs 3
    (lambda: emulate_gemm(np.ones((2, 2, 3)), np.ones((2, 4, 2))), ValueError, "do not multiply"),   # K 3 vs 4
    (lambda: emulate_gemm(np.ones((2, 3)), np.ones((3, 2)), block_k=0), ValueError, "block_k must be >= 1"),
    (lambda: emulate_gemm(np.array([["a"]]), np.ones((1, 1))), TypeError, "unsupported input dtype <U1"),
    (lambda: emulate_gemm(np.ones((1, 1), np.complex64), np.ones((1, 1))), TypeError, "unsupported input dtype complex64"),
])
def test_emulate_gemm_refuses_what_it_cannot_model(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend="cuda"), r"^backend must be auto, emulated or gpu, got 'cuda'"),
    (dict(backend="gpu"), r'^backend="gpu" needs a gpu_runner'),
    (dict(dists=("normal", "gaussian")), r"^unknown distributions \['gaussian'\]; known: "),
])
def test_bad_report_arguments_are_refused_before_anything_runs(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        accuracy.run_accuracy_report(tmp_path / "out", quick=True, progress=False, **kwargs)
    assert not (tmp_path / "out").exists()

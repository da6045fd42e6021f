"""The README's ladder table is generated: `./run.sh --out DIR` (or `python -m deepgemm.ladder
ladder.json`) renders the main job's results and rewrites the block between the README's markers.
These tests feed fake results to the renderer and the rewriter (no GPU), and check that the
committed README has one block, in the renderer's format."""
import json
import re
import types
from pathlib import Path

import pytest

from deepgemm import ladder

KERNELS = ["cuBLAS", "v0", "v1", "v2", "v3", "v4", "v5", "auto"]
README = Path(__file__).resolve().parents[2] / "README.md"


def fake_rows(scale=1.0):
    """time_ladder's rows for two dtypes, with made-up TFLOP/s."""
    tflops = dict(zip(KERNELS, (700.0, 5.0, 8.0, 28.0, 48.0, 430.0, 690.0, 689.0)))
    rows = []
    for dtype, f in (("float16", 1.0), ("bfloat16", 1.02)):
        for k in KERNELS:
            tf = tflops[k] * f * scale
            rows.append({"kernel": k, "dtype": dtype, "size": 4096, "median_us": 1.0, "iqr_us": 0.0, "reps": 3,
                         "tflops": tf, "pct_fp32_peak": 100 * tf / 66.9,
                         "pct_cublas": 100 * tf / (tflops["cuBLAS"] * f * scale)})
    return rows


def test_table_has_one_row_per_kernel_with_both_dtypes():
    table = ladder.readme_table(fake_rows(), "NVIDIA H200", 4096, "2030-01-02", "abc1234")
    lines = table.splitlines()
    assert lines[0] == "4096³, NVIDIA H200, 2030-01-02, commit `abc1234`:"
    assert lines[2] == ("| kernel | fp16 TFLOP/s | bf16 TFLOP/s | % of cuBLAS (fp16 / bf16) "
                        "| % of FP32 CUDA-core peak (67) |")
    body = lines[4:]
    assert len(body) == len(KERNELS)
    assert body[0] == "| cuBLAS | 700.0 | 714.0 | 100 | — |"
    assert body[1] == "| V0 naive | 5.0 | 5.1 | 0.7 / 0.7 | 7 |"                 # CUDA-core kernel: peak shown
    assert body[5].startswith("| V4 mma.sync") and body[5].endswith("| 61.4 / 61.4 | — |")  # tensor cores: no peak
    assert body[-1].startswith("| `auto` (what a caller gets) |")


def test_each_kernel_is_a_percentage_of_cublas_in_its_own_dtype():
    rows = [{"kernel": k, "dtype": d, "tflops": t} for k, d, t in
            [("cuBLAS", "float16", 800.0), ("v5", "float16", 760.0), ("cuBLAS", "bfloat16", 400.0),
             ("v5", "bfloat16", 420.0), ("v0", "float16", 8.0)]]
    got = {(r["kernel"], r["dtype"]): r["pct_cublas"] for r in ladder.with_pct_cublas(rows)}
    assert got == {("cuBLAS", "float16"): 100.0, ("v5", "float16"): 95.0, ("cuBLAS", "bfloat16"): 100.0,
                   ("v5", "bfloat16"): 105.0, ("v0", "float16"): 1.0}


def test_unknown_gpu_and_unlabelled_kernel():
    rows = [r for r in fake_rows() if r["kernel"] in ("cuBLAS", "v3")]
    for r in rows:
        r["pct_fp32_peak"] = None
    rows.append(dict(rows[-1], kernel="v9"))
    table = ladder.readme_table(rows, "Some GPU", 1024, "2030-01-02", "unknown")
    assert "| % of FP32 CUDA-core peak |" in table and "1024³, Some GPU" in table
    assert "| V3 padded smem + 128-bit loads | 48.0 | 49.0 | 6.9 / 6.9 | n/a |" in table
    assert "| v9 |" in table


def readme_text(block="old table"):
    return (f"# title\n\nintro\n\n{ladder.README_BEGIN}\n{block}\n{ladder.README_END}\n\n"
            "after the table\n<!-- another comment -->\n")


def test_block_replaced_exactly_once_and_nothing_else():
    text = readme_text()
    new = ladder.replace_readme_block(text, "NEW\nTABLE")
    head, tail = text.split(ladder.README_BEGIN)[0], text.split(ladder.README_END)[1]
    assert new == f"{head}{ladder.README_BEGIN}\nNEW\nTABLE\n{ladder.README_END}{tail}"
    assert new.count("NEW") == 1 and "old table" not in new
    assert ladder.replace_readme_block(new, "NEW\nTABLE") == new                       # idempotent
    assert ladder.replace_readme_block(new, "old table") == text                       # reversible


@pytest.mark.parametrize("text, why", [
    ("no markers at all\n", "found 0 and 0"),
    (readme_text() + readme_text(), "found 2 and 2"),                                  # two pairs
    (f"{ladder.README_END}\nx\n{ladder.README_BEGIN}\n", "comes before"),             # out of order
    (f"{ladder.README_BEGIN}\nonly the start\n", "found 1 and 0"),
])
def test_rewriter_refuses_anything_but_one_ordered_pair(text, why):
    """Refused with the README's own message (not an unpacking error from a split further on)."""
    with pytest.raises(ValueError, match=f"^README: .*{why}"):
        ladder.replace_readme_block(text, "x")


def write_result(tmp_path, drop=(), **changes):
    """A main-job result file, with changes, and without the keys in drop."""
    result = {"gpu": {"name": "NVIDIA H200"}, "commit": "abc1234", "date": "2030-01-02", "full_ladder": True,
              "verify": [{"ok": True}], "ladder": fake_rows()}
    result.update(changes)
    for key in drop:
        del result[key]
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(result))
    return path


def test_cli_rewrites_a_readme_from_a_saved_result(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    assert ladder.main([str(write_result(tmp_path)), "--readme", str(readme)]) == 0
    new = readme.read_text()
    expected_block = ladder.readme_table(fake_rows(), "NVIDIA H200", 4096, "2030-01-02", "abc1234")
    assert new == ladder.replace_readme_block(readme_text(), expected_block)


@pytest.mark.parametrize("changes, why", [({"full_ladder": False}, "the ladder table needs every kernel; this run timed a subset"),
                                         ({"verify": [{"ok": True}, {"ok": False}]}, "a verification check failed")])
def test_a_partial_or_failed_run_leaves_the_readme_alone(tmp_path, changes, why, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    ladder.main([str(write_result(tmp_path, **changes)), "--readme", str(readme)])
    assert readme.read_text() == readme_text()
    assert capsys.readouterr().out == f"README.md: left as is ({why})\n"
    result = json.loads(write_result(tmp_path, **changes).read_text())
    assert ladder._readme_from_result(result, readme, log=lambda line: None) is False


def test_a_saved_result_rewrites_the_readme_once_and_says_so(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    result = json.loads(write_result(tmp_path).read_text())
    assert ladder._readme_from_result(result, readme) is True
    assert ladder._readme_from_result(result, readme) is False           # the same table again: unchanged
    out = capsys.readouterr().out
    assert out == f"{readme}: ladder table updated (commit abc1234)\n{readme}: ladder table unchanged (commit abc1234)\n"


def test_a_result_from_before_full_ladder_existed_counts_as_a_full_run(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    path = write_result(tmp_path, drop=("full_ladder",))
    assert ladder.main([str(path), "--readme", str(readme)]) == 0
    assert readme.read_text() != readme_text()


def test_the_console_table_has_one_row_per_kernel_and_dtype():
    rows = fake_rows()
    rows[1]["pct_fp32_peak"] = None                                      # a GPU whose peak is not listed
    lines = ladder.ladder_table(rows).split("\n")
    assert lines[:2] == ["| kernel | dtype | TFLOP/s | % of cuBLAS | % of FP32 CUDA-core peak | median µs |",
                         "|---|---|---:|---:|---:|---:|"]
    assert len(lines) == 2 + len(rows)
    assert lines[2] == "| cuBLAS | float16 | 700.0 | 100.0% | — | 1 |"           # tensor cores: no CUDA-core share
    assert lines[3] == "| v0 | float16 | 5.0 | 0.7% | n/a | 1 |"
    peak = {(cells[0], cells[1]): cells[4] for cells in (line.strip("| ").split(" | ") for line in lines[2:])}
    assert all(cell == "—" for (kernel, _), cell in peak.items() if kernel in ("cuBLAS", "v4", "v5", "auto"))
    assert peak["v3", "float16"].endswith("%") and peak["v3", "bfloat16"].endswith("%")


def test_cli_needs_a_commit_and_date(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    path = write_result(tmp_path, drop=("commit",))
    with pytest.raises(SystemExit):
        ladder.main([str(path), "--readme", str(readme)])
    ladder.main([str(path), "--readme", str(readme), "--commit", "def5678"])
    assert "commit `def5678`" in readme.read_text()


def test_cli_says_what_is_wrong_with_a_missing_or_broken_result(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("{")
    for path, message in ((tmp_path / "missing.json", f"cannot read {tmp_path / 'missing.json'}: No such file"),
                          (tmp_path, f"cannot read {tmp_path}: Is a directory"),
                          (tmp_path / "broken.json", f"{tmp_path / 'broken.json'} is not a ladder.json")):
        with pytest.raises(SystemExit) as info:
            ladder.main([str(path)])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m deepgemm.ladder: error: {message}") and err.count("\n") == 1, err


def test_commit_from_the_environment(monkeypatch):
    monkeypatch.setenv("DEEPGEMM_COMMIT", "153e3761" + "0" * 32)
    assert ladder._commit() == "153e376"


@pytest.mark.parametrize("status, commit", [("", "abc1234"), (" M kernels/v5_wgmma.cu", "abc1234+"), (None, "unknown")])
def test_commit_from_the_checkout_the_package_runs_from(monkeypatch, status, commit):
    """Without DEEPGEMM_COMMIT: the checkout's HEAD, "+" when tracked files changed, "unknown" without git."""
    import subprocess
    import types
    monkeypatch.delenv("DEEPGEMM_COMMIT", raising=False)
    asked = []

    def run(cmd, **kwargs):
        asked.append(cmd)
        if status is None:
            raise OSError("no git")
        return types.SimpleNamespace(stdout="abc1234\n" if "rev-parse" in cmd else status + "\n")
    monkeypatch.setattr(subprocess, "run", run)
    assert ladder._commit() == commit
    root = str(Path(ladder.__file__).resolve().parents[1])
    assert all(cmd[:3] == ["git", "-C", root] for cmd in asked)


def test_committed_readme_has_one_block_in_the_renderers_format():
    text = README.read_text(encoding="utf-8")
    assert text.count(ladder.README_BEGIN) == 1 and text.count(ladder.README_END) == 1
    assert text.index(ladder.README_BEGIN) < text.index(ladder.README_END)
    block = text.split(ladder.README_BEGIN)[1].split(ladder.README_END)[0].strip("\n")
    # Parse the committed block back into rows and render them again: the same text means the
    # README shows exactly what `./run.sh --out DIR` would write.
    caption = re.match(r"(\d+)³, (.+), (\d{4}-\d\d-\d\d), commit `([^`]+)`:$", block.splitlines()[0])
    assert caption, block.splitlines()[0]
    size, gpu, date, commit = caption.groups()
    kernel_of = {label: k for k, label in ladder.LADDER_LABELS.items()}
    rows = []
    for line in block.splitlines()[4:]:
        label, *tflops, pct, peak = [c.strip() for c in line.strip("|").split("|")]
        kernel = kernel_of.get(label, label)
        pcts = ["100"] * len(tflops) if pct == "100" else pct.split(" / ")
        for dtype, tf, pc in zip(("float16", "bfloat16"), tflops, pcts):
            rows.append({"kernel": kernel, "dtype": dtype, "size": int(size), "tflops": float(tf),
                         "pct_cublas": float(pc), "pct_fp32_peak": float(peak) if peak[0].isdigit() else None})
    assert {r["kernel"] for r in rows} >= {"cuBLAS", "v0", "v4", "v5", "auto"}
    assert ladder.readme_table(rows, gpu, int(size), date, commit) == block


@pytest.mark.parametrize("failing", [0, 1])
def test_the_main_job_fails_on_any_failed_check_and_records_what_it_ran(tmp_path, monkeypatch, capsys, failing):
    """The main job (./run.sh on a GPU), its device faked: it verifies and times only the kernels
    this GPU's compute capability runs, says so, exits 1 when any check failed and 0 otherwise,
    and writes ladder.json (full_ladder only when no kernel list narrowed it); the README is
    rewritten only where it has the ladder's markers."""
    from deepgemm import device
    monkeypatch.setattr(device, "current", lambda: 0)
    monkeypatch.setattr(device, "compute_capability", lambda dev: 80)
    monkeypatch.setattr(device, "identity", lambda: {"name": "NVIDIA H200", "sm_count": 132})
    verified, timed = [], []

    def verify(names):
        verified.extend(names)
        return [{"ok": True}] * 3 + [{"ok": False}] * failing
    monkeypatch.setattr(ladder, "verify", verify)
    monkeypatch.setattr(ladder, "time_ladder", lambda names, size: timed.extend(names) or fake_rows())
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    monkeypatch.setattr(ladder, "README", readme)
    rc = ladder.main_job(out_dir=str(tmp_path / "out"), kernels=["v0", "v4", "v5"])
    out = capsys.readouterr().out
    assert rc == failing
    assert verified == ["v0", "v4"] and timed == ["v0", "v4"]          # V5 needs sm_90
    assert "not on this GPU (compute capability 8.0): v5" in out and f"  {3}/{3 + failing} checks passed" in out
    result = json.loads((tmp_path / "out" / "ladder.json").read_text())
    assert result["full_ladder"] is False and len(result["verify"]) == 3 + failing
    assert readme.read_text() == "no markers here\n"
    table = ladder.ladder_table(fake_rows())
    assert "GPU: NVIDIA H200 (132 SMs" in out and "verifying v0, v4 against the FP64 reference" in out
    assert "timing the ladder at 4096^3" in out and f"\n\n{table}\n" in out
    assert (tmp_path / "out" / "ladder.md").read_text() == f"# Ladder on NVIDIA H200 at 4096^3\n\n{table}\n"


def test_the_main_job_fails_when_no_kernel_asked_for_runs_on_this_gpu(tmp_path, monkeypatch, capsys):
    from deepgemm import device
    monkeypatch.setattr(device, "current", lambda: 0)
    monkeypatch.setattr(device, "compute_capability", lambda dev: 80)
    monkeypatch.setattr(ladder, "verify", lambda names: pytest.fail("nothing should be verified"))
    monkeypatch.setattr(ladder, "time_ladder", lambda names, size: pytest.fail("nothing should be timed"))
    assert ladder.main_job(out_dir=str(tmp_path / "out"), kernels=["v5"]) == 1
    out = capsys.readouterr().out
    assert "not on this GPU (compute capability 8.0): v5" in out and "nothing to verify" in out
    assert not (tmp_path / "out").exists()


def test_the_main_job_over_every_kernel_rewrites_the_readme_it_runs_from(tmp_path, monkeypatch, capsys):
    from deepgemm import device
    monkeypatch.setattr(device, "current", lambda: 0)
    monkeypatch.setattr(device, "compute_capability", lambda dev: 90)
    monkeypatch.setattr(device, "identity", lambda: {"name": "NVIDIA H200", "sm_count": 132})
    monkeypatch.setattr(ladder, "verify", lambda names: [{"ok": True}])
    monkeypatch.setattr(ladder, "time_ladder", lambda names, size: fake_rows())
    monkeypatch.setenv("DEEPGEMM_COMMIT", "abc1234")
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    monkeypatch.setattr(ladder, "README", readme)
    assert ladder.main_job(out_dir=str(tmp_path / "out")) == 0
    result = json.loads((tmp_path / "out" / "ladder.json").read_text())
    assert result["full_ladder"] is True and result["commit"] == "abc1234"
    block = ladder.readme_table(fake_rows(), "NVIDIA H200", 4096, result["date"], "abc1234")
    assert readme.read_text() == ladder.replace_readme_block(readme_text(), block)
    assert f"{readme}: ladder table updated (commit abc1234)" in capsys.readouterr().out
    readme.write_text("no markers here\n")                               # e.g. a project's own README
    assert ladder.main_job(out_dir=str(tmp_path / "out")) == 0
    assert readme.read_text() == "no markers here\n"


# ---- the main job's two steps, on a NumPy stand-in for CuPy -----------------------------------

@pytest.fixture
def stand_in_gpu(monkeypatch):
    """CuPy replaced by fake_cupy's NumPy stand-in, device 0 an H200 of compute capability 9.0, and
    deepgemm.gemm a stand-in whose calls are recorded: kernel "v1" computes a wrong product (one
    element off), every other kernel the exact one in float32."""
    import fake_cupy
    import numpy as np
    import deepgemm
    from deepgemm import device
    cupy = fake_cupy.install(monkeypatch)
    monkeypatch.setattr(device, "current", lambda: 0)
    monkeypatch.setattr(device, "compute_capability", lambda dev: 90)
    monkeypatch.setattr(device, "name", lambda dev: "NVIDIA H200")
    calls = []

    def gemm(a, b, kernel="auto", out=None, out_dtype=None):
        calls.append(dict(kernel=kernel, a=a, b=b, out=out, out_dtype=out_dtype))
        d = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64)).astype(np.float32)
        if kernel == "v1":
            d[0, 0] += 1.0
        return cupy.asarray(d)
    monkeypatch.setattr(deepgemm, "gemm", gemm)
    return calls


def test_verify_checks_each_kernel_dtype_shape_and_layout_and_names_each_failure(stand_in_gpu):
    import numpy as np
    logged = []
    rows = ladder.verify(["v0", "v1", "small_m"], log=logged.append)
    layouts = [(True, True), (True, False), (False, True), (False, False)]
    expected = [(name, dtype, shape, a_row, b_row) for name in ("v0", "v1", "small_m")
                for dtype in ("float16", "bfloat16") for shape in ladder.VERIFY_SHAPES for a_row, b_row in layouts
                if not (name == "small_m" and shape[0] > 64)]      # small_m refuses M = 129: not checked
    assert [(r["kernel"], r["dtype"], r["shape"], r["a_row"], r["b_row"]) for r in rows] == expected
    assert all(r["ok"] == (r["kernel"] != "v1") for r in rows)
    assert all(r["detail"].startswith("margin ") for r in rows if r["ok"])
    failed = [r for r in rows if not r["ok"]]
    assert logged == [f"FAIL v1 {r['dtype']} {'x'.join(map(str, r['shape']))} a_row={r['a_row']} "
                      f"b_row={r['b_row']}: {r['detail']}" for r in failed]
    assert all("outside the error bound" in r["detail"] for r in failed)
    for call, (name, dtype, (m, n, k), a_row, b_row) in zip(stand_in_gpu, expected):
        a, b = call["a"], call["b"]
        assert call["kernel"] == name and call["out_dtype"] == "float32"
        assert a.shape == (m, k) and b.shape == (k, n) and str(a.dtype) == dtype
        assert (a.strides[-1] == a.itemsize or k == 1) == (a_row or m == 1 or k == 1)   # row- or column-major
        assert (b.strides[-1] == b.itemsize or n == 1) == (b_row or k == 1 or n == 1)
    sums = {float(np.abs(np.asarray(c["a"], np.float64)).sum()) for c in stand_in_gpu}
    assert len(sums) == len(stand_in_gpu)                                 # fresh random inputs for each check


def test_time_ladder_times_cublas_each_kernel_and_auto_on_the_same_operands(stand_in_gpu, monkeypatch):
    """One row per (dtype, label) in the order cuBLAS, the kernels, auto; each timed with a cold L2
    for about a second (3 to 30 repetitions); TFLOP/s from the median, as % of cuBLAS in the same
    dtype and of the FP32 CUDA-core peak of the GPU."""
    from deepgemm import bench
    medians = {"cuBLAS": 100.0, "v0": 400.0, "v4": 200.0, "auto": 125.0}
    timed = []

    def time_device(fn, warmup, reps, flush_l2):
        before = len(stand_in_gpu)
        fn()
        label = stand_in_gpu[-1]["kernel"] if len(stand_in_gpu) > before else "cuBLAS"
        timed.append((label, warmup, reps, flush_l2))
        return bench.TimingStats(medians[label], 0, 0, 1.0, 0, 0, 0, reps, ())
    monkeypatch.setattr(bench, "time_device", time_device)
    cupy = __import__("sys").modules["cupy"]
    events = []                    # each label's calls before it is timed: a warm-up, then one to size the reps
    matmul = cupy.matmul
    monkeypatch.setattr(cupy, "matmul", lambda a, b: events.append("cuBLAS") or matmul(a, b))
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: types.SimpleNamespace(synchronize=lambda: events.append("sync")))
    logged = []
    rows = ladder.time_ladder(["v0", "v4"], size=64, log=logged.append)
    labels = ["cuBLAS", "v0", "v4", "auto"]
    assert [(r["kernel"], r["dtype"]) for r in rows] == [(k, d) for d in ("float16", "bfloat16") for k in labels]
    assert [t[0] for t in timed] == labels * 2
    assert all(w == 1 and 3 <= reps <= 30 and flush is True for _, w, reps, flush in timed)
    for r in rows:
        assert r["size"] == 64 and r["median_us"] == medians[r["kernel"]] and r["iqr_us"] == 1.0
        assert r["tflops"] == pytest.approx(2 * 64 ** 3 / (medians[r["kernel"]] * 1e-6) / 1e12)
        assert r["pct_cublas"] == pytest.approx(100 * medians["cuBLAS"] / medians[r["kernel"]])
        assert r["pct_fp32_peak"] == pytest.approx(100 * r["tflops"] / ladder.FP32_CUDA_CORE_PEAK_TFLOPS["NVIDIA H200"])
    calls = [c for c in stand_in_gpu if c["out"] is not None]
    assert {c["kernel"] for c in calls} == {"v0", "v4", "auto"}
    for dtype in ("float16", "bfloat16"):       # every label of a dtype multiplies the same operands
        same = [c for c in calls if str(c["a"].dtype) == dtype]
        assert len({id(c["a"]) for c in same}) == 1 and len({id(c["out"]) for c in same}) == 1
        assert same[0]["a"].shape == (64, 64) and same[0]["out"].dtype == same[0]["a"].dtype
    assert len(logged) == len(rows) and logged[0].startswith("  cuBLAS  float16")
    assert events[:5] == ["cuBLAS", "sync", "cuBLAS", "sync", "cuBLAS"]   # warm-up, the sizing call, then timed
    assert [c["kernel"] for c in stand_in_gpu if c["out"] is not None][:3] == ["v0"] * 3
    # The repetitions fill about a second: 30 at most for fast calls, 3 at least for slow ones.
    clock = iter(range(10 ** 6))
    monkeypatch.setattr(ladder, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    timed.clear()
    ladder.time_ladder(["v0"], size=64, dtypes=("float16",), log=logged.append)
    assert {reps for _, _, reps, _ in timed} == {3}

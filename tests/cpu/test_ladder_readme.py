"""The README's ladder table is generated: `./run.sh --out DIR` (or `python -m deepgemm.ladder
ladder.json`) renders the main job's results and rewrites the block between the README's markers.
These tests feed fake results to the renderer and the rewriter (no GPU), and check that the
committed README has one block, in the renderer's format."""
import json
import re
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


def write_result(tmp_path, **changes):
    result = {"gpu": {"name": "NVIDIA H200"}, "commit": "abc1234", "date": "2030-01-02", "full_ladder": True,
              "verify": [{"ok": True}], "ladder": fake_rows()}
    result.update(changes)
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


@pytest.mark.parametrize("changes", [{"full_ladder": False}, {"verify": [{"ok": True}, {"ok": False}]}])
def test_a_partial_or_failed_run_leaves_the_readme_alone(tmp_path, changes):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    ladder.main([str(write_result(tmp_path, **changes)), "--readme", str(readme)])
    assert readme.read_text() == readme_text()


def test_cli_needs_a_commit_and_date(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text())
    path = write_result(tmp_path)
    data = json.loads(path.read_text())
    del data["commit"]
    path.write_text(json.dumps(data))
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

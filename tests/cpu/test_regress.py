"""`python -m deepgemm regress` (compare, history) on synthetic runs (no GPU)."""

import argparse
import json
import re
from pathlib import Path

import pytest

from deepgemm import regress
from deepgemm.gate import history, runs
from gate_runs import A100, entry, gemm_pair, make_run, noisy

REPO = Path(__file__).resolve().parents[2]


def suite(seed, slow=1.0, drift=1.0):
    return [gemm_pair("test_gemm[v4-4096^3-float16]", 420e-6 * slow * drift, 190e-6 * drift, seed=seed),
            gemm_pair("test_gemm[v5-4096^3-float16]", 200e-6 * drift, 190e-6 * drift, seed=seed + 50)]


def save(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def reg(tmp_path):
    root = tmp_path / "regressions"
    runs.save_run(root, make_run(suite(1)), as_baseline=True)
    return root


def test_interface_for_the_command_line(reg, tmp_path):
    """add_arguments(parser) + run(args), as every command module of `python -m deepgemm`."""
    parser = argparse.ArgumentParser()
    regress.add_arguments(parser)
    current = save(tmp_path / "cur.json", make_run(suite(2)))
    args = parser.parse_args(["compare", str(current), "--regressions", str(reg)])
    assert (args.regress_command, args.alpha, args.min_change) == ("compare", 0.01, 0.05)
    assert regress.run(args) == 0
    with pytest.raises(SystemExit):
        parser.parse_args([])  # a sub-command is required


def test_compare_passes_drift_and_fails_a_slowdown(reg, tmp_path, capsys):
    ok = save(tmp_path / "ok.json", make_run(suite(2)))
    assert regress.main(["compare", str(ok), "--regressions", str(reg)]) == 0
    assert "PASS (2 same)" in capsys.readouterr().out

    drift = save(tmp_path / "drift.json", make_run(suite(3, drift=1.08)))
    md = tmp_path / "verdict.md"
    assert regress.main(["compare", str(drift), "--regressions", str(reg), "--markdown", str(md), "--all"]) == 0
    out = capsys.readouterr().out
    assert "environment drift: 2 of 2 references moved" in out and "drift: absolute +7" in out
    assert "PASS" in md.read_text() and "drift" in md.read_text()

    slow = save(tmp_path / "slow.json", make_run(suite(4, slow=1.12)))
    js = tmp_path / "verdict.json"
    assert regress.main(["compare", str(slow), "--regressions", str(reg), "--json", str(js)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: 1 benchmark(s) slower" in out and "SLOWER" in out and "test_gemm[v4-4096^3-float16]" in out
    assert json.loads(js.read_text())["result"] == "fail"
    # A looser floor lets it through; a stricter alpha does not change a clear case.
    assert regress.main(["compare", str(slow), "--regressions", str(reg), "--min-change", "15%"]) == 0
    assert regress.main(["compare", str(slow), "--regressions", str(reg), "--alpha", "0.001"]) == 1
    # --again: the slower benchmark timed again; slower there too fails, unchanged there passes.
    again_slow = save(tmp_path / "again_slow.json", make_run(suite(5, slow=1.12)))
    assert regress.main(["compare", str(slow), "--again", str(again_slow), "--regressions", str(reg)]) == 1
    assert "slower again alone" in capsys.readouterr().out
    again_ok = save(tmp_path / "again_ok.json", make_run(suite(6)))
    assert regress.main(["compare", str(slow), "--again", str(again_ok), "--regressions", str(reg)]) == 0
    assert "not confirmed" in capsys.readouterr().out


def test_compare_refusals_are_messages_with_exit_2(reg, tmp_path, capsys):
    other_driver = save(tmp_path / "575.json", make_run(suite(2), driver="575.64.05"))
    assert regress.main(["compare", str(other_driver), "--regressions", str(reg)]) == 2
    err = capsys.readouterr().err
    assert "No baseline for [NVIDIA H200, driver 575, CUDA 13]" in err and "driver 580" in err

    a100 = save(tmp_path / "a100.json", make_run(suite(2), gpu=A100))
    baseline = reg / "NVIDIA_H200" / "driver580-cuda13" / "baseline.json"
    assert regress.main(["compare", str(a100), "--baseline", str(baseline)]) == 2
    assert "Refusing to compare across baseline keys" in capsys.readouterr().err

    old = save(tmp_path / "old.json", make_run([entry("t::a", None, stats_median=1e-4)]))
    cur = save(tmp_path / "cur.json", make_run([entry("t::a", noisy(1e-4))]))
    assert regress.main(["compare", str(cur), "--baseline", str(old)]) == 2
    assert "holds no raw samples" in capsys.readouterr().err

    assert regress.main(["compare", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        regress.main(["compare", str(cur), "--min-change", "five"])


def test_history_command(tmp_path, capsys):
    root = tmp_path / "regressions"
    for i, slow in enumerate([1.0, 1.0, 1.0, 1.3, 1.3]):
        runs.save_run(root, make_run(suite(i, slow=slow), commit=f"{i}" * 40, when=f"2026-11-1{i}T00:00:00+00:00"),
                      as_baseline=False)
    out = tmp_path / "out"
    assert regress.main(["history", "--regressions", str(root), "--out", str(out), "--match", "v4"]) == 0
    printed = capsys.readouterr().out
    assert "5 commit(s), 1 benchmark(s), 1 step change(s)" in printed
    assert printed.splitlines()[-2:] == [f"wrote {out / 'NVIDIA_H200_driver580-cuda13.png'}",
                                         f"wrote {out / 'NVIDIA_H200_driver580-cuda13.md'}"]   # where to look
    md = (out / "NVIDIA_H200_driver580-cuda13.md").read_text()
    assert re.search(r"\| test_gemm\[v4-4096\^3-float16\] \| 3333333333 \|.*\| \+(29|30)\.\d% \|", md), md
    assert (out / "NVIDIA_H200_driver580-cuda13.png").exists()

    assert regress.main(["history", "NVIDIA H200", "--key", "driver1-cuda1", "--regressions", str(root)]) == 2
    err = capsys.readouterr().err
    # ...and names the key folders that do have history, so the caller can pick one
    assert "No history for GPU NVIDIA H200 key driver1-cuda1" in err
    assert "(key folders with history: " + str(root / "NVIDIA_H200" / "driver580-cuda13") + ")" in err
    assert regress.main(["history", "--regressions", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "(key folders with history: none)" in capsys.readouterr().err
    assert regress.main(["history", "--regressions", str(root), "--out", str(out), "--match", "nothing"]) == 2
    assert "selects no benchmark" in capsys.readouterr().err


def test_history_of_the_repositorys_runs(tmp_path, capsys):
    """The runs kept from before the gate (medians, reference_us) still chart: time and ratio."""
    assert regress.main(["history", "NVIDIA H200", "--regressions", str(REPO / "regressions"),
                         "--out", str(tmp_path), "--match", r"test_gemm\[v4-4096\^3-float16\]"]) == 0
    md = (tmp_path / "NVIDIA_H200_driver580-cuda13.md").read_text()
    per_commit = md[md.index("## Per commit"):]   # (the step-change table above may name it too)
    row = next(line for line in per_commit.splitlines() if line.startswith("| test_gemm[v4-4096^3-float16] |"))
    cells = [c.strip() for c in row.strip("|").split("|")[1:]]
    assert len(cells) >= 4 and all("×" in c for c in cells if c)  # µs and ratio in every cell


def test_a_change_floor_reads_as_a_percentage_or_a_fraction():
    assert regress._fraction("5%") == pytest.approx(0.05) == regress._fraction("0.05")
    assert regress._fraction("12.5%") == pytest.approx(0.125)
    for bad in ("five", "", "%", "5%%x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected e.g. 5% or 0.05"):
            regress._fraction(bad)


def test_the_absolute_floor_defaults_to_one_microsecond(tmp_path, capsys):
    """A 10 µs benchmark 0.8 µs slower (8 %) is under the default 1 µs floor; 1.5 µs slower is not,
    unless --min-diff-us raises the floor past it."""
    def run(kernel_us, seed):
        return make_run([gemm_pair("test_gemm[v4-decode]", kernel_us * 1e-6, 10e-6, rel=0.002, seed=seed)])
    base = save(tmp_path / "base.json", run(10.0, 1))
    below = save(tmp_path / "below.json", run(10.8, 2))
    above = save(tmp_path / "above.json", run(11.5, 3))
    assert regress.main(["compare", str(below), "--baseline", str(base)]) == 0
    assert regress.main(["compare", str(above), "--baseline", str(base)]) == 1
    assert regress.main(["compare", str(above), "--baseline", str(base), "--min-diff-us", "2"]) == 0
    capsys.readouterr()


def test_an_installed_copy_without_its_repository_asks_for_the_regressions_folder(tmp_path, capsys):
    cur = save(tmp_path / "cur.json", make_run(suite(2)))
    args = argparse.Namespace(regress_command="compare", current=str(cur), baseline=None, regressions=None,
                              alpha=0.01, min_change=0.05, min_diff_us=1.0, markdown=None, json=None, all=False)
    assert regress.run(args) == 2
    assert "pass --regressions DIR" in capsys.readouterr().err


def test_history_charts_the_key_with_the_newest_runs_unless_told(tmp_path, capsys):
    import os
    root = tmp_path / "regressions"
    for driver, commits in (("575.64.05", 2), ("580.159.04", 3)):
        for i in range(commits):
            runs.save_run(root, make_run(suite(i), driver=driver, commit=f"{i}" * 40,
                                         when=f"2026-11-1{i}T00:00:00+00:00"), as_baseline=False)
    old = next(root.glob("*/driver575*/history"))
    for p in old.glob("*.json"):   # the older driver's runs were stored earlier
        os.utime(p, (1_000_000_000, 1_000_000_000))
    assert regress.main(["history", "--regressions", str(root), "--out", str(tmp_path / "a")]) == 0
    assert "3 commit(s)" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "a").glob("*.md")] == ["NVIDIA_H200_driver580-cuda13.md"]
    assert regress.main(["history", "--key", old.parent.name, "--regressions", str(root),
                         "--out", str(tmp_path / "b")]) == 0
    assert "2 commit(s)" in capsys.readouterr().out


def _stored(root, ratios_v4, medians_noref=None):
    """History runs, one per commit: V4's kernel at ratio r to its reference (190 µs), and, when
    given, a benchmark without a reference at those medians."""
    for i, r in enumerate(ratios_v4):
        benches = [gemm_pair("test_gemm[v4-4096^3-float16]", 190e-6 * r, 190e-6, seed=i, rel=0.002)]
        if medians_noref:
            benches.append(entry("tests/bench/test_bench_dispatch.py::test_host", noisy(medians_noref[i], 0.002, seed=i)))
        runs.save_run(root, make_run(benches, commit=f"{i}" * 40, when=f"2026-11-1{i}T00:00:00+00:00"), as_baseline=False)
    return history.load_history(root / "NVIDIA_H200" / "driver580-cuda13")


def test_a_candidate_baseline_is_held_against_the_range_of_its_stored_runs(tmp_path):
    """history.outside_history: a benchmark more than 2 % outside the range of its newest 8 stored
    runs (ratio to its reference; the median where it has none) is named, the furthest first;
    inside the range, or with fewer than 3 stored runs, it is not."""
    stored = _stored(tmp_path, [2.00, 1.96, 2.03, 1.99], [5e-6, 5.2e-6, 4.9e-6, 5.1e-6])
    def candidate(ratio, host_s, extra=()):
        return runs.Run(make_run([gemm_pair("test_gemm[v4-4096^3-float16]", 190e-6 * ratio, 190e-6, seed=9, rel=0.002),
                                  entry("tests/bench/test_bench_dispatch.py::test_host", noisy(host_s, 0.002, seed=9)),
                                  *extra], commit="f" * 40))
    assert history.outside_history(candidate(1.97, 5.05e-6), stored) == []
    assert history.outside_history(candidate(1.93, 5.3e-6), stored) == []            # within the 2 % margin
    new = gemm_pair("test_gemm[v5-4096^3-float16]", 100e-6, 190e-6, seed=3)       # no stored runs: not judged
    fast, slow_host = history.outside_history(candidate(1.80, 6e-6, [new]), stored)[::-1]
    assert slow_host.name.endswith("test_host") and not slow_host.ratio and slow_host.change > 0.13
    assert fast.ratio and fast.runs == 4 and fast.low == pytest.approx(1.96, abs=0.01) and -0.09 < fast.change < -0.07
    assert re.search(r"ratio to its reference 1\.(79|80)\d×, 8\.\d% below its last 4 stored runs \(1\.96", str(fast))
    assert "µs" in str(slow_host) and "above" in str(slow_host)
    assert history.outside_history(candidate(1.80, 5e-6), stored[:2]) == []          # 2 stored runs: no range
    assert history.outside_history(candidate(1.80, 5e-6), stored, window=2) == []    # the newest 2 only
    assert len(history.outside_history(candidate(1.80, 5e-6), stored[:3])) == 1       # 3 stored runs: a range
    # A benchmark that gained a reference since its stored runs is held against their medians.
    with_ref = runs.Run(make_run([entry("tests/bench/test_bench_dispatch.py::test_host", noisy(6e-6, 0.002, seed=9),
                                        ref="cupy.matmul-host", ref_samples=noisy(3e-6, 0.002, seed=8))], commit="f" * 40))
    [host] = history.outside_history(with_ref, stored)
    assert not host.ratio and host.value == pytest.approx(6e-6, rel=0.01)


def test_the_range_is_that_of_the_newest_stored_runs(tmp_path):
    """Runs from before an intended speed-up do not widen the range the candidate is held against."""
    stored = _stored(tmp_path, [2.4, 2.41, 2.39, 2.4, 2.0, 2.01, 1.99, 2.0])
    cand = runs.Run(make_run([gemm_pair("test_gemm[v4-4096^3-float16]", 190e-6 * 2.3, 190e-6, seed=9, rel=0.002)],
                             commit="f" * 40))
    [above] = history.outside_history(cand, stored, window=4)
    assert above.change > 0.1 and above.high == pytest.approx(2.01, abs=0.01)
    assert history.outside_history(cand, stored, window=8) == []


def test_regress_check_names_the_benchmarks_outside_their_stored_runs(tmp_path, capsys):
    root = tmp_path / "regressions"
    _stored(root, [2.00, 1.96, 2.03, 1.99])
    ok = save(tmp_path / "ok.json", make_run([gemm_pair("test_gemm[v4-4096^3-float16]", 380e-6, 190e-6, seed=7, rel=0.002)]))
    assert regress.main(["check", str(ok), "--regressions", str(root)]) == 0
    assert "every benchmark with 3+ stored runs lies within 2%" in capsys.readouterr().out
    odd = save(tmp_path / "odd.json", make_run([gemm_pair("test_gemm[v4-4096^3-float16]", 342e-6, 190e-6, seed=7, rel=0.002)]))
    assert regress.main(["check", str(odd), "--regressions", str(root)]) == 1
    out = capsys.readouterr().out
    assert "1 benchmark(s) lie more than 2% outside" in out and "test_gemm[v4-4096^3-float16]: ratio to its reference 1.8" in out
    broken = make_run([{"fullname": "tests/bench/test_bench.py::test_gemm[v4-4096^3-float16]", "extra_info": {}}],
                      commit="9" * 40, when="2026-11-19T00:00:00+00:00")
    save(root / "NVIDIA_H200" / "driver580-cuda13" / "history" / "broken.json", broken)
    assert regress.main(["check", str(odd), "--regressions", str(root)]) == 2
    assert "cannot be read as history (KeyError" in capsys.readouterr().err
    a100 = save(tmp_path / "a100.json", make_run([gemm_pair("x", 1e-4, 1e-4)], gpu=A100))
    assert regress.main(["check", str(a100), "--regressions", str(root)]) == 2
    assert "No runs under" in capsys.readouterr().err


def test_the_range_check_holds_at_its_margin_on_either_side_and_says_which(monkeypatch):
    """outside_history at its exact edges (a value at low / (1 + margin) or high * (1 + margin) is
    inside, the next float beyond is outside), each side's change and wording, in seconds and as a
    ratio; outside_lines lists at most `top` (30 by default) and counts the rest."""
    import math
    from types import SimpleNamespace
    points = [SimpleNamespace(median_s=s, ratio=None) for s in (1.0e-6, 1.2e-6, 1.1e-6)]   # no reference
    monkeypatch.setattr(history, "build", lambda stored: SimpleNamespace(series={"b": points}))
    monkeypatch.setattr(history, "_median", lambda bench: bench)
    monkeypatch.setattr(history, "_reference_seconds", lambda bench: None)
    def outside(value, margin=0.02):
        return history.outside_history(SimpleNamespace(benchmarks={"b": value}), ["stored"], margin=margin)
    low_edge, high_edge = 1.0e-6 / 1.02, 1.2e-6 * 1.02
    assert outside(low_edge) == [] and outside(high_edge) == []
    assert len(outside(math.nextafter(low_edge, 0))) == 1 and len(outside(math.nextafter(high_edge, 1))) == 1
    [below], [above] = outside(0.9e-6), outside(1.5e-6)
    assert below.change == pytest.approx(-0.1) and above.change == pytest.approx(0.25)
    assert str(below) == "b: median 0.90 µs, 10.0% below its last 3 stored runs (1.00 µs – 1.20 µs)"
    assert str(above) == "b: median 1.50 µs, 25.0% above its last 3 stored runs (1.00 µs – 1.20 µs)"
    ratio = history.Outside("r", 0.8, 1.0, 1.2, 5, True)
    assert str(ratio) == "r: ratio to its reference 0.800×, 20.0% below its last 5 stored runs (1.000× – 1.200×)"
    many = [history.Outside(f"b{i}", 2.0, 1.0, 1.2, 3, False) for i in range(31)]
    assert history.outside_lines(many[:2], top=2)[1:] == ["  " + str(o) for o in many[:2]]
    assert history.outside_lines(many[:3], top=2)[-1] == "  (1 more)"
    assert history.outside_lines(many)[-1] == "  (1 more)" and len(history.outside_lines(many)) == 32
    assert len(history.outside_lines(many[:30])) == 31


def test_a_history_of_no_runs_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^runs: no runs to build a history from$"):
        history.build([])

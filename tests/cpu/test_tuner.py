"""The tuner on the CPU, with an injected fake timer and clock: it picks the fastest candidate,
writes a table dispatch then applies, resumes after an interruption without re-measuring, never
leaves a half-written file, respects its time budget and ignores another GPU's table."""
import argparse
import json

import pytest

from deepgemm import dispatch, registry, tables, tuner
from test_api import gpus  # noqa: F401  (the fake-device fixture)

H200 = {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132, "driver_version": "580.159.04"}
SHAPES = [(16, 4096, 4096), (1, 14336, 4096), (512, 3072, 768)]


def fake_us(spec, config, job):
    """Deterministic timings: small_m wins small M (its 16-warp config best), v4 wins the rest."""
    base = {"small_m": 10.0 if job.m <= 64 else 900.0, "v4": 30.0, "v5": 31.0, "v3": 200.0}.get(spec.name, 1000.0)
    if spec.name == "small_m" and config["DG_SMALL_M_WARPS"] == 16:
        base *= 0.9
    if spec.name == "v4" and config["DG_BM"] == 64:
        base *= 0.8 if job.m > 64 else 1.5
    return base * job.n * job.k / 4096**2


class CountingTimer:
    def __init__(self, fail_after=None):
        self.calls, self.fail_after = [], fail_after

    def __call__(self, spec, config, job):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt
        self.calls.append((tuner.label(spec, config), job.bucket))
        return fake_us(spec, config, job)


def jobs():
    return tuner.plan(SHAPES, ["float16"], "rc", 90)


def test_shape_parsing_and_files(tmp_path):
    assert tuner.parse_shape("16x14336x4096") == (16, 14336, 4096) == tuner.parse_shape("16 14336 4096")
    with pytest.raises(ValueError, match="MxNxK"):
        tuner.parse_shape("16x0x4")
    f = tmp_path / "shapes.txt"
    f.write_text("# llama decode\n1x4096x4096\n\n16 14336 4096  # ffn up\n")
    assert tuner.read_shapes_file(f) == [(1, 4096, 4096), (16, 14336, 4096)]
    f.write_text("1x2x3\nnope\n")
    with pytest.raises(ValueError, match=r"shapes.txt:2:"):
        tuner.read_shapes_file(f)


def test_plan_measures_one_shape_per_bucket_and_dtype():
    planned = tuner.plan([(16, 4096, 4096), (13, 4000, 4000), (1, 4096, 4096)], ["float16", "bfloat16"], "rc", 90)
    assert [(j.m, j.dtype) for j in planned] == [(16, "float16"), (1, "float16"), (16, "bfloat16"), (1, "bfloat16")]
    assert set(tuner.PRESETS["models"].values()) >= {(512, 64, 512), (4096, 14336, 4096), (64, 4096, 14336)}


def test_the_model_presets_are_the_models_gemms():
    """BERT-base at 512 tokens (hidden 768 in 12 heads of 64, FFN 3072), Llama-3-8B's layers at
    4096 tokens (hidden 4096, FFN 14336) and its decode steps: the shapes the benchmarks and the
    tuned tables are about, derived here from the models' dimensions."""
    tokens, hidden, head, ffn = 512, 768, 64, 3072
    assert tuner.BERT_BASE == {"bert_attn_out": (tokens, hidden, hidden), "bert_qkv": (tokens, 3 * hidden, hidden),
                               "bert_ffn_up": (tokens, ffn, hidden), "bert_ffn_down": (tokens, hidden, ffn),
                               "bert_qk": (tokens, tokens, head), "bert_pv": (tokens, head, tokens)}
    tokens, hidden, ffn = 4096, 4096, 14336
    assert tuner.LLAMA == {"llama_attn": (tokens, hidden, hidden), "llama_ffn_up": (tokens, ffn, hidden),
                           "llama_ffn_down": (tokens, hidden, ffn)}
    assert tuner.DECODE_M == tuple(2 ** i for i in range(8))
    assert set(tuner.DECODE_NK) == {(hidden, hidden), (ffn, hidden), (hidden, ffn)}
    assert set(tuner.DECODE.values()) == {(m, n, k) for m in tuner.DECODE_M for n, k in tuner.DECODE_NK}


def test_the_demos_preset_is_the_examples_gemms():
    """The seed MLP (768 -> 3072 -> 3072 -> 768) at 512 tokens and GPT-2 small's projections (hidden
    768, FFN 3072, fused QKV) at the token counts examples/gpt2_block.py times: 1 x 1, 8 x 128, 4 x 1024."""
    tokens, hidden, ffn = 512, 768, 3072
    assert set(tuner.PRESETS["demos"].values()) >= {(tokens, ffn, hidden), (tokens, ffn, ffn), (tokens, hidden, ffn)}
    gpt2 = {(t, n, k) for t in (1, 8 * 128, 4 * 1024)
            for n, k in ((3 * hidden, hidden), (hidden, hidden), (ffn, hidden), (hidden, ffn))}
    assert set(tuner.GPT2.values()) == gpt2 and len(tuner.PRESETS["demos"]) == 3 + len(gpt2)


def test_candidates_own_config_first_and_only_kernels_that_support_the_shape():
    job = tuner.Job(40, 4096, 4096, "float16", "rc", 90)
    plan = dict((s.name, cfgs) for s, cfgs in tuner.candidate_configs(job))
    assert plan["small_m"][0]["DG_SMALL_M_MT"] == 4                  # the config rule's config first
    assert plan["v4"][0]["DG_BM"] == 64                               # 32 tiles of 128x128: v4's small tile
    assert registry.get("v4").default_config in plan["v4"]
    assert plan["v5"][0] == registry.get("v5").config_defines(      # 64 tiles of 64x64 over the whole K
        {"DG_BM": 64, "DG_BN": 64, "DG_STAGES": 12})
    assert registry.get("v5").default_config in plan["v5"]
    assert len({json.dumps(c, sort_keys=True) for c in plan["small_m"]}) == len(plan["small_m"])
    big = tuner.Job(100, 4096, 4096, "float16", "rc", 80)
    names = [s.name for s, _ in tuner.candidate_configs(big)]
    assert "small_m" not in names and "v5" not in names and "v4" in names
    assert [s.name for s, _ in tuner.candidate_configs(job, kernels=["v5"])] == ["v5"]   # tune --kernels v5
    assert {s.name for s, _ in tuner.candidate_configs(job, kernels=["v4", "small_m"])} == {"v4", "small_m"}


def test_tuner_picks_the_fastest_and_dispatch_applies_it(tmp_path, monkeypatch, gpus):
    path = tmp_path / "user" / "NVIDIA_H200.json"
    t = tuner.Tuner(path, H200, CountingTimer())
    stats = t.run(jobs())
    assert stats == {"done": 3, "skipped": 0, "left": 0, "failed": 0}
    table = json.loads(path.read_text())
    assert table["gpu"]["name"] == "NVIDIA H200" and table["format"] == tables.FORMAT
    assert not table["pending"]
    small = table["entries"]["m16.n4096.k4096.float16.rc.epi0.sm90"]
    assert small["kernel"] == "small_m" and small["config"]["DG_SMALL_M_WARPS"] == 16
    assert small["shape"] == [16, 4096, 4096]
    assert all(small["configs"][label] == registry.get(label.split("[")[0]).config_defines(small["configs"][label])
               for label in small["candidates"])                            # every candidate's full config
    assert table["entries"]["m512.n4096.k1024.float16.rc.epi0.sm90"]["config"]["DG_BM"] == 64
    assert "v3" in small["candidates"] and not any(k.startswith("v3[") for k in small["candidates"])  # pruned

    monkeypatch.setenv("DEEPGEMM_TUNED_DIR", str(path.parent))
    monkeypatch.setattr(tables, "SHIPPED_DIR", tmp_path / "none")
    gpus({0: {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}})
    dispatch.reload_tables()
    spec, cfg = dispatch.choose(dispatch.shape_problem(16, 4096, 4096, dev=0))
    assert spec.name == "small_m" and cfg["DG_SMALL_M_WARPS"] == 16


def test_an_interrupted_run_resumes_without_measuring_again(tmp_path):
    path = tmp_path / "t.json"
    reference = CountingTimer()
    tuner.Tuner(tmp_path / "ref.json", H200, reference).run(jobs())
    total = len(reference.calls)

    for stop in (1, total // 2, total - 1):
        path.unlink(missing_ok=True)
        first = CountingTimer(fail_after=stop)
        with pytest.raises(KeyboardInterrupt):
            tuner.Tuner(path, H200, first).run(jobs())
        saved = json.loads(path.read_text())                     # valid JSON at the moment of the interrupt
        measured = sum(len(p["measured"]) for p in saved["pending"].values()) + \
            sum(len(e["candidates"]) for e in saved["entries"].values())
        assert measured == stop
        second = CountingTimer()
        tuner.Tuner(path, H200, second).run(jobs())
        assert len(first.calls) + len(second.calls) == total     # nothing measured twice
        assert not set(first.calls) & set(second.calls)
        assert json.loads(path.read_text())["entries"] == json.loads((tmp_path / "ref.json").read_text())["entries"]


def test_a_finished_table_is_not_measured_again(tmp_path):
    path = tmp_path / "t.json"
    tuner.Tuner(path, H200, CountingTimer()).run(jobs())
    again = CountingTimer()
    assert tuner.Tuner(path, H200, again).run(jobs()) == {"done": 0, "skipped": 3, "left": 0, "failed": 0}
    assert not again.calls


def test_the_table_is_never_half_written(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    tuner.Tuner(path, H200, CountingTimer()).run(jobs()[:1])
    before = path.read_text()

    def broken_dump(obj, f, **kw):
        f.write('{"format": 1, "gpu": {"na')
        raise OSError("disk full")
    monkeypatch.setattr(tables.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        tuner.Tuner(path, H200, CountingTimer()).run(jobs())
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]     # no temp file left behind


def test_time_budget_stops_and_a_later_run_finishes(tmp_path):
    path = tmp_path / "t.json"
    now = [1000.0]                                              # a clock's time, not the time since start

    def timer(spec, config, job):
        now[0] += 1.0                                           # every measurement "takes" 1 s
        return fake_us(spec, config, job)
    stats = tuner.Tuner(path, H200, timer, max_seconds=5, clock=lambda: now[0]).run(jobs())
    assert stats["done"] < 3 and stats["left"] >= 1 and stats["done"] + stats["left"] == 3
    stats = tuner.Tuner(path, H200, timer).run(jobs())
    assert stats["done"] + stats["skipped"] == 3 and stats["left"] == 0


def test_a_budget_spent_inside_a_bucket_counts_that_bucket_as_left(tmp_path):
    first = CountingTimer()
    tuner.Tuner(tmp_path / "one.json", H200, first).run(jobs()[:1])
    now = [1000.0]

    def timer(spec, config, job):
        now[0] += 1.0
        return fake_us(spec, config, job)
    # The first bucket's measurements fit; the second bucket starts and runs out mid-way.
    stats = tuner.Tuner(tmp_path / "t.json", H200, timer, max_seconds=len(first.calls) + 1.5,
                        clock=lambda: now[0]).run(jobs())
    assert stats == {"done": 1, "skipped": 0, "left": 2, "failed": 0}
    saved = json.loads((tmp_path / "t.json").read_text())
    assert list(saved["entries"]) == [jobs()[0].bucket] and list(saved["pending"]) == [jobs()[1].bucket]


def test_a_bucket_where_no_candidate_runs_is_reported_and_the_run_goes_on(tmp_path):
    def timer(spec, config, job):
        if job.m == 16:
            raise RuntimeError("no kernel image")
        return fake_us(spec, config, job)
    seen, logged = [], []
    t = tuner.Tuner(tmp_path / "t.json", H200, timer, progress=lambda done, total, text: seen.append(text),
                    log=logged.append)
    assert t.run(jobs()) == {"done": 2, "skipped": 0, "left": 0, "failed": 1}
    assert seen[0].endswith(": no candidate ran") and seen[1].endswith(" us")
    assert any("no candidate ran" in m for m in logged)
    assert jobs()[0].bucket not in t.table["entries"] and not t.table["pending"]
    assert not tuner.Tuner(tmp_path / "t.json", H200, timer).done(jobs()[0])    # a later run tries it again


def test_configs_are_explored_only_for_kernels_within_the_prune_factor(tmp_path):
    """The default prune is 3x: a kernel whose own config takes 2.9x the best one's time gets its
    whole config space timed, each config once; one at 3.1x only its own config."""
    candidates = {s.name: cfgs for s, cfgs in tuner.candidate_configs(jobs()[0])}
    defaults = {name: cfgs[0] for name, cfgs in candidates.items()}
    first_us = {"small_m": 10.0, "v5": 29.0, "v4": 31.0}

    timed = []

    def timer(spec, config, job):
        timed.append(spec.name)
        return first_us.get(spec.name, 1000.0) if config == defaults[spec.name] else 40.0
    tuner.Tuner(tmp_path / "t.json", H200, timer).run(jobs()[:1])
    assert len(candidates["v5"]) > 2 and len(candidates["small_m"]) > 2
    assert timed.count("v5") == len(candidates["v5"]) and timed.count("small_m") == len(candidates["small_m"])
    assert timed.count("v4") == 1


def test_failing_candidates_are_recorded_and_skipped(tmp_path):
    def timer(spec, config, job):
        if spec.name == "small_m":
            raise RuntimeError("launch failed")
        return fake_us(spec, config, job)
    t = tuner.Tuner(tmp_path / "t.json", H200, timer)
    t.run(jobs()[:1])
    e = t.table["entries"]["m16.n4096.k4096.float16.rc.epi0.sm90"]
    assert e["kernel"] == "v4" and e["candidates"]["small_m"].startswith("error: RuntimeError: launch failed")


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 1, "gpu": {"name": "NVIDIA A100",
                                                                                   "cc": "8.0", "sm_count": 108},
                                                              "entries": {"x": {"kernel": "v4"}}})])
def test_a_corrupted_or_foreign_table_is_replaced_not_merged(tmp_path, content):
    path = tmp_path / "t.json"
    path.write_text(content)
    notes = []
    t = tuner.Tuner(path, H200, CountingTimer(), log=notes.append)
    assert t.table["entries"] == {} and notes and "starting a new table" in notes[0]
    t.run(jobs()[:1])
    assert json.loads(path.read_text())["gpu"]["name"] == "NVIDIA H200"


def test_cli_without_a_gpu_says_so(capsys, monkeypatch):
    from deepgemm import __main__, device
    monkeypatch.setattr(device, "gpu_available", lambda: (False, "no CUDA device visible to CuPy"))
    assert __main__.main(["tune", "--shapes", "1x64x64"]) == 2
    assert "tune needs a GPU" in capsys.readouterr().err


def test_epilogue_jobs_fill_the_fused_buckets_that_dispatch_prefers_for_a_chain(tmp_path, monkeypatch, gpus):
    assert tuner.parse_epilogue("residual+gelu+bias") == ("bias", "gelu", "residual")
    assert tuner.parse_epilogue("none") == ()
    for bad in ("bias+tanh", "gelu+silu", "bias+bias"):
        with pytest.raises(ValueError, match="parts joined by"):
            tuner.parse_epilogue(bad)
    fused = tuner.plan([(512, 3072, 768)], ["float16"], "rc", 90, ("bias", "gelu", "residual"))
    (job,) = fused
    assert job.bucket == "m512.n4096.k1024.float16.rc.epi1.sm90"
    assert job.chain() == registry.Epilogue(bias="float16", activation="gelu", residual="float16")

    def fused_favours_v5(spec, config, job):   # with the chain, v5 wins; without it, v4 (fake_us)
        return 0.5 if job.epilogue and spec.name == "v5" else fake_us(spec, config, job)
    path = tmp_path / "user" / "NVIDIA_H200.json"
    tuner.Tuner(path, H200, fused_favours_v5).run(fused + jobs())
    table = json.loads(path.read_text())["entries"]
    assert table["m512.n4096.k1024.float16.rc.epi1.sm90"]["kernel"] == "v5"
    assert table["m512.n4096.k1024.float16.rc.epi1.sm90"]["epilogue"] == "bias+gelu+residual"
    assert table["m512.n4096.k1024.float16.rc.epi0.sm90"]["kernel"] == "v4"

    monkeypatch.setenv("DEEPGEMM_TUNED_DIR", str(path.parent))
    monkeypatch.setattr(tables, "SHIPPED_DIR", tmp_path / "none")
    gpus({0: {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}})
    dispatch.reload_tables()
    chain = registry.Epilogue(bias="float16", activation="relu")
    assert dispatch.choose(dispatch.shape_problem(512, 3072, 768, epilogue=chain, dev=0))[0].name == "v5"
    assert dispatch.choose(dispatch.shape_problem(512, 3072, 768, dev=0))[0].name == "v4"


def test_the_cli_takes_an_epilogue():
    import argparse
    parser = argparse.ArgumentParser()
    tuner.add_arguments(parser)
    assert parser.parse_args(["--epilogue", "bias+silu"]).epilogue == ("bias", "silu")
    assert parser.parse_args([]).epilogue == ()
    with pytest.raises(SystemExit):
        parser.parse_args(["--epilogue", "bias+tanh"])


def test_the_device_timer_passes_the_jobs_chain_to_gemm(monkeypatch):
    """DeviceTimer on the CPU, with NumPy standing in for CuPy and the launch captured: the job's
    operands and chain reach gemm(), its reps and warmup the timing; one job's operands are kept."""
    import sys
    import types

    import numpy as np

    import deepgemm
    from deepgemm import bench
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(asarray=np.asarray, empty=np.empty))
    seen = []
    monkeypatch.setattr(deepgemm, "gemm", lambda a, b, **kw: seen.append((a.shape, b.shape, kw)))
    asked = []
    monkeypatch.setattr(bench, "time_device",
                        lambda fn, **kw: (asked.append(kw), fn(), types.SimpleNamespace(median=7.0))[2])
    (job,) = tuner.plan([(48, 80, 32)], ["float16"], "rc", 90, ("bias", "silu", "scale", "residual"))
    assert tuner.DeviceTimer(reps=1, warmup=0)(registry.get("v5"), {}, job) == 7.0
    (a_shape, b_shape, kw), = seen
    assert (a_shape, b_shape) == ((48, 32), (32, 80)) and kw["activation"] == "silu" and kw["beta"] == 1.0
    assert kw["bias"].shape == kw["scale"].shape == (80,) and kw["c"].shape == (48, 80)
    assert all(kw[x].dtype == np.float16 for x in ("bias", "scale", "c"))
    (plain,) = tuner.plan([(48, 80, 32)], ["float16"], "rc", 90)
    tuner.DeviceTimer(reps=1, warmup=0)(registry.get("v5"), {}, plain)
    assert set(seen[-1][2]) == {"kernel", "config", "out", "activation"} and seen[-1][2]["activation"] is None
    assert asked == [{"warmup": 0, "reps": 1}] * 2
    parser = argparse.ArgumentParser()
    tuner.add_arguments(parser)
    timer = tuner.DeviceTimer()
    assert timer.reps == parser.parse_args([]).reps          # one default for the class and the command
    timer(registry.get("v4"), {}, job)
    timer(registry.get("v4"), {}, plain)
    assert list(timer._ops) == [plain] and asked[-1] == {"warmup": timer.warmup, "reps": timer.reps}


def test_compare_tables_decides_with_each_table_alone(tmp_path, gpus):
    """scripts/compare_tables.py: what auto runs with one table, then with the other, each with the
    heuristics where it has no entry; the shipped and user tables are back afterwards."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "scripts" / "compare_tables.py"
    spec = importlib.util.spec_from_file_location("compare_tables", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    gpus({0: {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}})
    shipped = json.loads((tables.SHIPPED_DIR / "NVIDIA_H200.json").read_text())
    bucket = "m64.n4096.k4096.float16.rc.epi0.sm90"
    old = dict(shipped, entries={bucket: dict(shipped["entries"][bucket], kernel="small_m", label="small_m",
                                              config=registry.get("small_m").config_defines(None))})
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(shipped))
    problems = [dispatch.shape_problem(64, 4096, 4096, dev=0), dispatch.shape_problem(3000, 2000, 1000, dev=0)]
    before = dispatch.choose(problems[0])
    (o64, o_big), (n64, n_big) = (script.decisions(tmp_path / name, problems) for name in ("old.json", "new.json"))
    assert o64[0] == "small_m" and (n64[0], n64[1]["DG_BM"]) == ("v5", 64)
    assert o_big[0] == n_big[0] == "v5"           # no entry in either: the heuristics
    none64, none_big = script.decisions(None, problems)   # no table at all: the heuristics everywhere
    assert none64[0] == "v5" and none64[1] == registry.get("v5").config_defines(
        dispatch.v5_config(problems[0], 132)[0]) and none_big == n_big
    assert dispatch.choose(problems[0]) == before


def test_precompile_builds_each_variant_once_for_the_given_arch(monkeypatch):
    built, ran = [], []
    monkeypatch.setattr(tuner.registry, "compile_variant",
                        lambda spec, arch, dt, out_dt, a_row, b_row, chain, config:
                        built.append((spec.name, arch, dt, out_dt, a_row, b_row, tuple(sorted(config.items())))))
    monkeypatch.setattr("deepgemm.jit.compile_many", lambda todo: ran.extend(f() for f in todo))
    twice = tuner.plan([(16, 4096, 4096), (1, 4096, 4096)], ["bfloat16"], "cr", 90)   # same candidates
    said = []
    tuner.precompile(twice, None, "sm_90a", log=said.append)
    expected = {(s.name, tuple(sorted(c.items()))) for job in twice for s, cs in tuner.candidate_configs(job)
                for c in cs}
    assert len(built) == len(expected) == len(ran)
    assert {(name, cfg) for name, _, _, _, _, _, cfg in built} == expected
    assert {(arch, dt, out_dt, a_row, b_row) for _, arch, dt, out_dt, a_row, b_row, _ in built} == \
        {("sm_90a", "bfloat16", "bfloat16", False, True)}
    assert said == [f"compiling {len(expected)} variants for sm_90a ..."]


def test_a_variant_that_fails_to_compile_is_left_to_the_timer(monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("ptxas died")
    monkeypatch.setattr(tuner.registry, "compile_variant", broken)
    job = jobs()[0]
    spec, configs = tuner.candidate_configs(job)[0]
    assert isinstance(tuner._compile_quietly(spec, "sm_90a", job, configs[0]), RuntimeError)


def _retune(path, timer, job_list):
    t = tuner.Tuner(path, H200, timer)
    t.forget(job_list)
    t.run(job_list)
    return t.table["entries"]


@pytest.mark.parametrize("edge, kept", [(1.0 + tuner.TUNE_TIE - 1e-9, True), (1.0 + tuner.TUNE_TIE + 0.001, False)])
def test_a_retune_keeps_the_previous_pick_unless_beaten_by_more_than_the_tie(tmp_path, monkeypatch, gpus, edge, kept):
    """--force measures again; the previous pick stays while the new fastest is within TUNE_TIE of
    its new time, says so in "kept", and dispatch (auto and the kernel named)
    applies it. One step past the tie, the new fastest takes over."""
    path = tmp_path / "NVIDIA_H200.json"
    job = jobs()[:1]                                  # 16x4096x4096: small_m with 16 warps wins
    tuner.Tuner(path, H200, CountingTimer()).run(job)
    bucket = job[0].bucket
    before = json.loads(path.read_text())["entries"][bucket]
    assert before["config"]["DG_SMALL_M_WARPS"] == 16

    def timer(spec, config, j):                       # now the 8-warp default is ahead, by 1/edge
        us = fake_us(spec, config, j)
        return us / edge * 0.9 if spec.name == "small_m" and config["DG_SMALL_M_WARPS"] != 16 else us
    entries = _retune(path, timer, job)
    after = entries[bucket]
    assert (after["label"] == before["label"]) is kept
    if kept:
        assert after["kept"]["fastest"] != after["label"] and after["kept"]["us"] < after["us"]
        assert "previous pick, within 2%" in after["kept"]["why"]
    else:
        assert "kept" not in after and after["us"] == min(v for v in after["candidates"].values()
                                                          if isinstance(v, float))
    monkeypatch.setenv("DEEPGEMM_TUNED_DIR", str(tmp_path))
    monkeypatch.setattr(tables, "SHIPPED_DIR", tmp_path / "none")
    gpus({0: {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}})
    dispatch.reload_tables()
    problem = dispatch.shape_problem(16, 4096, 4096, dev=0)
    for kernel in ("auto", "small_m"):
        cfg = dispatch.choose(problem, kernel=kernel)[1]
        assert (cfg["DG_SMALL_M_WARPS"] == 16) is kept, kernel


def test_an_interrupted_retune_resumes_with_the_previous_pick(tmp_path):
    """The previous pick lives in the bucket's pending record from forget() on: a re-tune cut
    short and resumed by a plain run (no --force) still keeps it within the tie."""
    path = tmp_path / "t.json"
    job = jobs()[:1]
    tuner.Tuner(path, H200, CountingTimer()).run(job)
    label = json.loads(path.read_text())["entries"][job[0].bucket]["label"]
    closer = lambda spec, config, j: fake_us(spec, config, j) * (
        0.9 / 1.01 if spec.name == "small_m" and config["DG_SMALL_M_WARPS"] != 16 else 1.0)
    first = tuner.Tuner(path, H200, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    first.forget(job)
    with pytest.raises(KeyboardInterrupt):
        first.run(job)
    assert json.loads(path.read_text())["pending"][job[0].bucket]["previous"] == label
    tuner.Tuner(path, H200, closer).run(job)
    entry = json.loads(path.read_text())["entries"][job[0].bucket]
    assert entry["label"] == label and "kept" in entry


def test_options_rank_a_kept_pick_ahead_of_the_fastest():
    entry = {"kernel": "v5", "config": {"DG_BN": 128}, "us": 10.1, "kept": {"fastest": "v5[BN=64]", "us": 10.0},
             "candidates": {"v5[BN=64]": 10.0, "v5[BN=128]": 10.1, "v4": 12.0},
             "configs": {"v5[BN=64]": {"DG_BN": 64}, "v5[BN=128]": {"DG_BN": 128}, "v4": {}}}
    assert [(k, c) for _, k, c in tables.options(entry)][:3] == [("v5", {"DG_BN": 128}), ("v5", {"DG_BN": 64}),
                                                                  ("v5", {"DG_BN": 128})]
    del entry["kept"]
    assert [c for _, _, c in tables.options(entry)][0] == {"DG_BN": 64}


def test_tune_measures_the_shapes_given_then_the_file_then_the_preset_and_models_by_default(tmp_path):
    parser = argparse.ArgumentParser()
    tuner.add_arguments(parser)
    shapes = lambda *argv: tuner.requested_shapes(parser.parse_args(list(argv)))
    assert shapes() == list(tuner.PRESETS["models"].values())
    assert shapes("--preset", "demos") == list(tuner.PRESETS["demos"].values())
    assert shapes("--shapes", "16x4096x4096") == [(16, 4096, 4096)]
    f = tmp_path / "shapes.txt"
    f.write_text("1 2 3\n")
    assert shapes("--shapes", "16x4096x4096", "--shapes-file", str(f), "--preset", "bert") == \
        [(16, 4096, 4096), (1, 2, 3), *tuner.PRESETS["bert"].values()]
    from deepgemm import cli
    with pytest.raises(cli.UsageError, match=r"^--shapes-file: .*missing\.txt"):
        shapes("--shapes-file", str(tmp_path / "missing.txt"))
    f.write_text("1 2\n")
    with pytest.raises(cli.UsageError, match=r"^--shapes-file: "):
        shapes("--shapes-file", str(f))


def test_the_device_timer_makes_operands_in_the_jobs_layout(monkeypatch):
    """B column-major for "rc" (x @ w.T, the tables' layout), A column-major for "cr", and the
    chain's operands: what the tuner times must be what the bucket describes."""
    import sys
    import types
    import numpy as np
    fake = types.SimpleNamespace(asarray=np.asarray, empty=np.empty)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    timer = tuner.DeviceTimer()
    for layout in ("rr", "rc", "cr", "cc"):
        job = tuner.Job(24, 40, 56, "float16", layout, 90, ("bias", "gelu", "residual"))
        a, b, out, kw = timer.operands(job)
        assert (a.shape, b.shape, out.shape) == ((24, 56), (56, 40), (24, 40))
        assert (a.flags.c_contiguous, b.flags.c_contiguous) == (layout[0] == "r", layout[1] == "r"), layout
        assert (a.flags.f_contiguous, b.flags.f_contiguous) == (layout[0] == "c", layout[1] == "c"), layout
        assert kw["bias"].shape == (40,) and kw["c"].shape == (24, 40) and kw["beta"] == 1.0
        assert kw["activation"] == "gelu" and a.dtype == np.float16


class _Bar:
    """cli.Progress's stand-in: what the tune command reports to its progress bar."""
    made = []

    def __init__(self, total, desc):
        self.total, self.desc, self.updates, self.closed = total, desc, [], False
        _Bar.made.append(self)

    def update(self, done, text=""):
        self.updates.append((done, text))

    def close(self):
        self.closed = True


@pytest.fixture
def tune_cli(monkeypatch):
    """`python -m deepgemm tune` on the CPU: an H200 that is not there, the fake timer in place of
    the device one, compiling and the tables' reload recorded instead of done."""
    from deepgemm import __main__, cli, device
    monkeypatch.setattr(device, "gpu_available", lambda: (True, ""))
    monkeypatch.setattr(device, "identity", lambda dev=None: dict(H200))
    monkeypatch.setattr(device, "current", lambda: 0)
    monkeypatch.setattr(device, "compute_capability", lambda dev: 90)
    seen = {"timers": [], "compiled": [], "reloads": 0}

    class Timer(CountingTimer):
        def __init__(self, reps=None):
            super().__init__()
            self.reps = reps
            seen["timers"].append(self)

    def reload():
        seen["reloads"] += 1
    monkeypatch.setattr(tuner, "DeviceTimer", Timer)
    monkeypatch.setattr(tuner, "precompile", lambda todo, kernels, arch, log:
                        seen["compiled"].append(([j.bucket for j in todo], kernels, arch)))
    monkeypatch.setattr(dispatch, "reload_tables", reload)
    monkeypatch.setattr(cli, "Progress", _Bar)
    _Bar.made = []
    return lambda *argv: __main__.main(["tune", *argv]), seen


def test_the_tune_command_fills_the_table_it_names_then_resumes_and_forces(tmp_path, capsys, tune_cli):
    """End to end on the CPU: the options reach the jobs, the timer and the compile step; the
    buckets land in --out and dispatch reloads its tables in the same process; a second run
    measures nothing; --force measures every bucket again."""
    tune, seen = tune_cli
    out = tmp_path / "tuned.json"
    shapes = [(16, 4096, 4096), (512, 3072, 768)]
    planned = [j.bucket for j in tuner.plan(shapes, ["bfloat16"], "cr", 90)]
    args = ["--shapes", "16x4096x4096,512x3072x768", "--dtypes", "bfloat16", "--layout", "cr", "--out", str(out),
            "--reps", "3", "--kernels", "v4,v5"]
    assert tune(*args) == 0
    printed = capsys.readouterr()
    table = json.loads(out.read_text())
    assert sorted(table["entries"]) == sorted(planned) and not table["pending"]
    assert {(e["dtype"], e["layout"], e["kernel"] in ("v4", "v5")) for e in table["entries"].values()} == \
        {("bfloat16", "cr", True)}
    (timer,) = seen["timers"]
    assert timer.reps == 3 and {b for _, b in timer.calls} == set(planned)
    assert {lbl.split("[")[0] for lbl, _ in timer.calls} == {"v4", "v5"}
    assert seen["compiled"] == [(planned, ["v4", "v5"], "sm_90a")] and seen["reloads"] == 1
    assert f"tuning 2 of 2 bucket(s) on NVIDIA H200 into {out}" in printed.err
    assert f"tune: 2 tuned, 0 already in the table, 0 left -> {out}" in printed.out
    for bucket, e in table["entries"].items():
        assert f"  {bucket:45} {e['label']:40} {e['us']:9.1f} us" in printed.out.splitlines()
    (bar,) = _Bar.made
    assert bar.total == 2 and [d for d, _ in bar.updates] == [1, 2] and bar.closed
    assert all(text.endswith(" us") for _, text in bar.updates)

    assert tune(*args) == 0                                 # finished: nothing measured again
    printed = capsys.readouterr()
    assert len(seen["timers"][-1].calls) == 0 and len(_Bar.made) == 1 and seen["reloads"] == 2
    assert "tuning 0 of 2 bucket(s)" in printed.err and "tune: 0 tuned, 2 already in the table" in printed.out
    assert printed.out.count(" us\n") == 2                  # the table's picks, printed all the same

    assert tune(*args, "--force") == 0                      # measured again, every bucket
    printed = capsys.readouterr()
    assert {b for _, b in seen["timers"][-1].calls} == set(planned)
    assert "tuning 2 of 2 bucket(s)" in printed.err and "tune: 2 tuned, 0 already in the table" in printed.out
    assert sorted(json.loads(out.read_text())["entries"]) == sorted(planned)


def test_the_tune_command_defaults_to_every_dtype_and_stops_at_its_time_budget(tmp_path, capsys, tune_cli):
    tune, seen = tune_cli
    out = tmp_path / "tuned.json"
    assert tune("--shapes", "16x4096x4096", "--out", str(out), "--max-seconds", "0") == 0
    printed = capsys.readouterr()
    expected = [j.bucket for j in tuner.plan([(16, 4096, 4096)], list(registry.INPUT_DTYPES), "rc", 90)]
    assert len(expected) == len(registry.INPUT_DTYPES) > 1 and seen["compiled"][0][0] == expected
    assert f"time budget of 0 s used up: {len(expected)} bucket(s) left; run again to resume" in printed.err
    assert f"tune: 0 tuned, 0 already in the table, {len(expected)} left -> {out}" in printed.out
    assert not _Bar.made and seen["reloads"] == 1
    assert tune("--shapes", "16x4096x4096", "--out", str(out), "--prune", "1") == 0
    assert sorted(json.loads(out.read_text())["entries"]) == sorted(expected)
    pruned = len(seen["timers"][-1].calls)
    assert tune("--shapes", "16x4096x4096", "--out", str(tmp_path / "wide.json"), "--prune", "10") == 0
    assert len(seen["timers"][-1].calls) > pruned           # --prune narrowed what was timed


def test_a_bad_shape_on_the_command_line_is_a_usage_error(capsys):
    parser = argparse.ArgumentParser()
    tuner.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--shapes", "16x0x4"])
    assert "expected MxNxK with positive integers" in capsys.readouterr().err


def test_a_job_names_its_dtype_one_way():
    import numpy as np
    assert tuner.Job(16, 64, 64, "bf16", "rc", 90).dtype == "bfloat16"
    assert tuner.Job(16, 64, 64, np.float16, "rc", 90).bucket == tuner.Job(16, 64, 64, "half", "rc", 90).bucket


def test_a_budget_of_exactly_the_time_spent_is_not_used_up(tmp_path):
    """--max-seconds stops a run only once more time than that has gone: with a clock that never
    moves, a budget of 0 s still tunes every bucket."""
    t = tuner.Tuner(tmp_path / "t.json", H200, CountingTimer(), max_seconds=0, clock=lambda: 5.0)
    assert t.run(jobs()) == {"done": 3, "skipped": 0, "left": 0, "failed": 0}


def test_a_kernel_at_exactly_the_prune_factor_is_explored(tmp_path):
    candidates = {s.name: cfgs for s, cfgs in tuner.candidate_configs(jobs()[0])}
    defaults = {name: cfgs[0] for name, cfgs in candidates.items()}
    timed = []

    def timer(spec, config, job):
        timed.append(spec.name)
        return {"small_m": 10.0, "v5": 30.0}.get(spec.name, 1000.0) if config == defaults[spec.name] else 40.0
    tuner.Tuner(tmp_path / "t.json", H200, timer, prune=3.0).run(jobs()[:1])
    assert timed.count("v5") == len(candidates["v5"]) > 1


def test_a_previous_pick_exactly_at_the_tie_stays(tmp_path):
    """"Unless beaten by more than TUNE_TIE": a new fastest exactly TUNE_TIE ahead does not replace
    the previous pick (50 us against 51 us, exact in binary floating point)."""
    assert 50.0 * (1 + tuner.TUNE_TIE) == 51.0
    path = tmp_path / "t.json"
    job = jobs()[:1]
    first = lambda spec, config, j: 50.0 if spec.name == "v4" and config == spec.config_defines(None) else 60.0
    tuner.Tuner(path, H200, first).run(job)
    before = json.loads(path.read_text())["entries"][job[0].bucket]["label"]
    again = lambda spec, config, j: 51.0 if tuner.label(spec, config) == before else (
        50.0 if spec.name == "v5" and config == spec.config_defines(None) else 60.0)
    after = _retune(path, again, job)[job[0].bucket]
    assert after["label"] == before and after["kept"]["us"] == 50.0


def test_a_table_without_pending_records_is_read_and_extended(tmp_path):
    path = tmp_path / "t.json"
    tuner.Tuner(path, H200, CountingTimer()).run(jobs()[:1])
    table = json.loads(path.read_text())
    del table["pending"]
    path.write_text(json.dumps(table))
    t = tuner.Tuner(path, H200, CountingTimer())
    assert t.run(jobs()) == {"done": 2, "skipped": 1, "left": 0, "failed": 0}


def test_a_half_measured_bucket_for_another_shape_is_measured_afresh(tmp_path):
    """Pending measurements belong to the shape they were taken at: a run that reaches the bucket
    with another of its shapes times every candidate again."""
    path = tmp_path / "t.json"
    with pytest.raises(KeyboardInterrupt):
        tuner.Tuner(path, H200, CountingTimer(fail_after=2)).run(jobs()[:1])
    old = json.loads(path.read_text())["pending"][jobs()[0].bucket]
    assert old["shape"] == [16, 4096, 4096] and len(old["measured"]) == 2
    (other,) = tuner.plan([(13, 4000, 4000)], ["float16"], "rc", 90)
    assert other.bucket == jobs()[0].bucket
    timer = CountingTimer()
    tuner.Tuner(path, H200, timer).run([other])
    assert set(old["measured"]) <= {lbl for lbl, _ in timer.calls}
    assert json.loads(path.read_text())["entries"][other.bucket]["shape"] == [13, 4000, 4000]

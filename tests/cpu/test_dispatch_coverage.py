"""Every dispatch path the shipped tuned tables lead to, on a CPU: for each bucket of each table in
deepgemm/configs/ (on a faked device with that table's GPU identity), in every layout and input
dtype and with a few epilogues, kernel="auto" must choose a kernel that runs the problem with a
config it accepts, explain() must say the same, the table's own entries must be taken as they
are (no entry silently or noisily ignored), and every chosen variant must compile.

Compiling all of them is the --sweep=full tier's job; the default tier compiles one variant of
each distinct (kernel, config), picked deterministically, so the CPU tier stays fast."""
import itertools
import json
import re
import warnings
from pathlib import Path

import pytest

import deepgemm
from deepgemm import caches, device, dispatch, registry, static_checks, tables
from deepgemm.registry import Epilogue, NO_EPILOGUE

SHIPPED = sorted(Path(tables.SHIPPED_DIR).glob("*.json"))
LAYOUTS = ("rr", "rc", "cr", "cc")
DTYPES = ("float16", "bfloat16")
EPILOGUES = (NO_EPILOGUE, Epilogue(bias="float32", activation="gelu"),
             Epilogue(alpha=True, scale="scalar", residual="bfloat16"))
CHOSEN = re.compile(r"^  chosen:     (\S+) \(.*\) config (\{.*\})$", re.M)


def _facts(table: dict) -> dict:
    gpu = table["gpu"]
    return {"name": gpu["name"], "cc": int(str(gpu["cc"]).replace(".", "")), "sm_count": int(gpu["sm_count"])}


def _shapes(bucket: str, entry: dict):
    """The shape the entry was measured at, and the largest shape of its bucket."""
    m, n, k = (int(part[1:]) for part in bucket.split(".")[:3])
    return list(dict.fromkeys([tuple(entry["shape"]), (m, n, k)]))


def _choices(path: Path) -> dict:
    """Every (problem) -> choice for one table, checked as it is made; returns the checks' data."""
    table = json.loads(path.read_text())
    facts = _facts(table)
    cc = facts["cc"]
    out = {"rows": [], "own": [], "warnings": []}
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.setattr(device, "_query", lambda dev: dict(facts) if dev == 0 else (_ for _ in ()).throw(RuntimeError()))
        mp.setattr(tables, "SHIPPED_DIR", path.parent)
        mp.setenv("DEEPGEMM_TUNED_DIR", str(path.parent / "no user tables here"))
        caches.clear("device")
        try:
            for bucket, entry in table["entries"].items():
                b_layout, b_dtype = bucket.split(".")[4], bucket.split(".")[3]
                # the entry's own problem: a bucket with an epilogue ("epi1") is taken with one
                b_epi = NO_EPILOGUE if bucket.split(".")[5] == "epi0" else EPILOGUES[1]
                for (m, n, k), layout, dtype, epi in itertools.product(_shapes(bucket, entry), LAYOUTS, DTYPES,
                                                                       EPILOGUES):
                    problem = dispatch.shape_problem(m, n, k, dtype, None, layout, epi, cc, dev=0)
                    if dispatch.copies_a(problem) is not None:   # gemm() runs a row-major copy of A
                        problem = dispatch.shape_problem(m, n, k, dtype, None, "r" + layout[1], epi, cc, dev=0)
                    spec, cfg = dispatch.choose(problem)
                    text = deepgemm.explain(m, n, k, dtype, cc, layout=layout, epilogue=epi, device=0)
                    out["rows"].append((bucket, problem, spec, dict(cfg), text))
                    if (layout, dtype, epi, (m, n, k)) == (b_layout, b_dtype, b_epi, tuple(entry["shape"])):
                        out["own"].append((bucket, entry, spec, dict(cfg)))
        finally:
            caches.clear("device")
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return out


@pytest.fixture(scope="module")
def choices():
    return {path.name: _choices(path) for path in SHIPPED}


def test_there_is_a_shipped_table():
    assert SHIPPED, f"no tuned table in {tables.SHIPPED_DIR}"


@pytest.mark.parametrize("name", [p.name for p in SHIPPED])
def test_no_entry_of_a_shipped_table_is_ignored(choices, name):
    got = choices[name]
    assert not got["warnings"], "\n".join(got["warnings"])
    table = json.loads((tables.SHIPPED_DIR / name).read_text())
    assert len(got["own"]) == len(table["entries"])
    for bucket, entry, spec, cfg in got["own"]:
        want = registry.get(entry["kernel"]).config_defines(entry.get("config") or None)
        assert (spec.name, cfg) == (entry["kernel"], want), f"{bucket}: the table says {entry['kernel']} {want}"


@pytest.mark.parametrize("name", [p.name for p in SHIPPED])
def test_every_choice_runs_its_problem_and_explain_agrees(choices, name):
    problems = []
    for bucket, problem, spec, cfg, text in choices[name]["rows"]:
        arch = device.arch_for_cc(problem.cc)
        why = (f"needs cc {spec.min_cc}" if spec.min_cc > problem.cc else
               f"takes {spec.input_dtypes}" if problem.in_dtype not in spec.input_dtypes else
               spec.supports(problem) or spec.config_supports(cfg, problem) or
               ("not a full config" if spec.config_defines(cfg) != cfg else None) or
               (f"{spec.dynamic_smem(cfg)} B of shared memory" if spec.dynamic_smem(cfg) >
                static_checks.DYNAMIC_SMEM_LIMIT.get(arch, 0) else None) or
               ("not a gemm kernel" if spec.purpose != "gemm" or not spec.public else None))
        said = CHOSEN.search(text)
        if said is None or said.group(1) != spec.name or said.group(2) != str(cfg):
            why = f"explain says {said.groups() if said else text!r}"
        if why:
            problems.append(f"{bucket} {problem.m}x{problem.n}x{problem.k} {problem.in_dtype} {problem.layout} "
                            f"{problem.epilogue}: {spec.name} {cfg}: {why}")
    assert not problems, "\n".join(problems[:20])
    assert len(choices[name]["rows"]) >= len(LAYOUTS) * len(DTYPES) * len(EPILOGUES)


def _variants(choices) -> list[tuple]:
    """The distinct compiled variants the choices need, in a fixed order."""
    found = {}
    for got in choices.values():
        for _, problem, spec, cfg, _ in got["rows"]:
            key = (spec.name, device.arch_for_cc(problem.cc), problem.in_dtype, problem.out_dtype, problem.layout,
                   problem.epilogue, tuple(sorted(cfg.items())))
            found.setdefault(repr(key), key)
    return [found[k] for k in sorted(found)]


def _sample(variants: list[tuple]) -> list[tuple]:
    """One variant per (kernel, config), rotating through layouts, dtypes and epilogues."""
    groups = {}
    for v in variants:
        groups.setdefault((v[0], v[6]), []).append(v)
    return [vs[i % len(vs)] for i, (_, vs) in enumerate(sorted(groups.items(), key=lambda g: repr(g[0])))]


def test_chosen_variants_compile(choices, sweep_tier):
    variants = _variants(choices)
    todo = variants if sweep_tier == "full" else _sample(variants)
    assert len({(v[0], v[6]) for v in todo}) == len({(v[0], v[6]) for v in variants})   # every (kernel, config)

    def build(v):
        name, arch, in_dtype, out_dtype, layout, epi, cfg = v
        try:
            compiled = registry.compile_variant(registry.get(name), arch, in_dtype, out_dtype, layout[0] == "r",
                                                layout[1] == "r", epi, dict(cfg))
            return None if compiled.resources.get("registers") else f"{v}: no ptxas report"
        except Exception as exc:   # a variant dispatch can choose must build: say which one did not
            return f"{v}: {type(exc).__name__}: {str(exc)[:300]}"
    from deepgemm import jit
    failures = [f for f in jit.compile_many([lambda v=v: build(v) for v in todo]) if f]
    assert not failures, "\n".join(failures)

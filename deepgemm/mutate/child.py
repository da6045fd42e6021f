"""The compile step of one mutant, in its own process: `python -m deepgemm.mutate.child`.

A child process because the JIT reads DEEPGEMM_KERNEL_DIR (the mutated copy) and hashes the
headers once per process, and because a compiler crash must not take the runner with it.
Request (JSON on stdin)::

    {"kernels": ["v3"], "archs": ["sm_80", "sm_90a"], "variants": "static" | "minimal",
     "static": true,                    # false: skip the static-check variants (a warm-up only)
     "warm_arch": "sm_90a" | null,      # also compile every variant the quick sweep launches
     "warm_kernels": null | [...],      # ... for these kernels (default: "kernels")
     "stage_copy": false,               # also compile V5's staging copy (kernels/stage_copy.cu)
     "source": null | {"path": "...", "archs": [...], "defines": {...}},   # a user's kernel instead
     "workers": 16,
     "builds": null | [{"name", "source", "arch", "defines"}],   # also these builds (source: under the
                                        # kernel folder), as the tests asked deepgemm.jit for them
     "digests": false,                  # true: reply with each variant's code digest (same-code check)
     "expect": null | {label: digest},  # stop at the first build whose digest differs; reply "differs"
     "low_priority": false}             # true: run at the lowest CPU priority, its compilers too

Reply (the last line of stdout, JSON)::

    {"compiled": 52, "seconds": 12.3,
     "compile_error": null | {"variant": "...", "log": "first compiler errors"},
     "static_problems": ["v3-sm_90a-float16-float16-rr-none: SASS lacks LDG.128", ...],
     "digests": {"v3-sm_90a-float16-float16-rr-none": "<deepgemm.binary.code_digest>", ...},   # if asked
     "differs": null | "<the first label whose digest is not the expected one>"}               # with "expect"
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path


def _compile_all(jobs, workers, stop_after=None):
    """Run (label, zero-argument compile) jobs: the first alone (a mutant that does not compile
    usually fails in every variant: one failure is enough), the rest in parallel, stopping at the
    first failure, or at the first build stop_after(label, compiled) is true for (the rest are
    cancelled). Returns ([(label, compiled)], None) or (done, (label, CompileError))."""
    from deepgemm import jit

    done = []
    if not jobs:
        return done, None
    label, job = jobs[0]
    try:
        done.append((label, job()))
    except jit.CompileError as exc:
        return done, (label, exc)
    if stop_after is not None and stop_after(*done[-1]):
        return done, None
    with ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {pool.submit(job): label for label, job in jobs[1:]}
        for future in as_completed(futures):
            try:
                done.append((futures[future], future.result()))
            except jit.CompileError as exc:
                for other in futures:
                    other.cancel()
                return done, (futures[future], exc)
            if stop_after is not None and stop_after(*done[-1]):
                for other in futures:
                    other.cancel()
                break
    return done, None


def _compiler_excerpt(message: str, lines: int = 6) -> str:
    """The first error lines of a compiler log (what a reader needs to see why it broke)."""
    errors = [line.strip() for line in message.splitlines() if re.search(r"\berror\b", line, re.I)]
    picked = errors[:lines] or message.strip().splitlines()[:lines]
    return "\n".join(picked)


def _generic_problems(label, compiled) -> list[str]:
    """Static problems of a kernel that has no registry entry: spills, ptxas's performance warnings
    and local memory."""
    from deepgemm import binary
    problems = []
    res = compiled.resources
    if res and (res["stack"] or res["spill_stores"] or res["spill_loads"]):
        problems.append(f"{label}: stack frame {res['stack']} B, spills {res['spill_stores']}/{res['spill_loads']} B")
    problems += [f"{label}: ptxas: {w}" for w in binary.performance_warnings(compiled.log)]
    try:
        local = binary.sass_features(binary.dump_sass(compiled.cubin_path))["LOCAL"]
    except Exception:   # no cuobjdump: the resource report above is what there is
        local = 0
    if local:
        problems.append(f"{label}: SASS has {local} x LOCAL")
    return problems


def build_label(build: dict) -> str:
    """One logged build's label in a reply: its variant name, arch and defines."""
    return f"{build['name']} {build['arch']} {json.dumps(build['defines'], sort_keys=True)}"


def handle(request: dict) -> dict:
    from deepgemm import binary, jit, registry, static_checks

    started = time.monotonic()
    workers = int(request.get("workers") or os.cpu_count() or 1)
    jobs, checks = [], []        # checks: (label, Variant | None) for each job, in order
    source = request.get("source")
    if source:
        for arch in source["archs"]:
            label = f"{os.path.basename(source['path'])}-{arch}"
            jobs.append((label, lambda arch=arch: jit.compile_kernel(
                "mutant", source["path"], arch, dict(source.get("defines") or {}))))
            checks.append(None)
    else:
        for name in request["kernels"] if request.get("static", True) else ():
            spec = registry.get(name)
            for arch in spec.archs:
                if request.get("archs") and arch not in request["archs"]:
                    continue
                variants = static_checks.variants(spec, arch) + static_checks.grouped_variants(spec, arch)
                if request.get("variants") == "minimal":   # the plain fp16 row-major variant, and each
                    # code-path switch's own (a config whose path no default build compiles: small_m's
                    # cp.async ring, V5's ping-pong or split-K), so a mutant that only such a path holds
                    # still meets the static checks' claims for that path
                    variants = [v for v in variants if v.config or (
                        v.in_dtype == "float16" and v.out_dtype == "float16" and v.a_row and v.b_row)]
                for v in variants:
                    jobs.append((str(v), v.compile))
                    checks.append(v)
        if request.get("stage_copy"):
            stage = jit.KERNEL_DIR / "stage_copy.cu"
            jobs.append(("stage_copy-sm_90a", lambda: jit.compile_kernel("stage_copy", stage, "sm_90a", {})))
            checks.append(None)
        if request.get("warm_arch"):
            from deepgemm import device
            from deepgemm.testing import sweep   # needs the test dependencies (hypothesis)
            for name in request.get("warm_kernels") or request["kernels"]:
                if name not in registry.names():   # the sweep covers the ladder kernels only
                    continue
                for i, job in enumerate(sweep.compile_jobs(sweep.quick_cases(name), request["warm_arch"], device.current())):
                    jobs.append((f"{name}-sweep-variant-{i}", job))
                    checks.append(False)   # compiled for the test run only; static-checked above
    derived_dir = tempfile.TemporaryDirectory(prefix="deepgemm-derived-") if request.get("builds") else None
    for i, build in enumerate(request.get("builds") or ()):
        if build.get("origin"):   # a copy of a kernel file the tests wrote (jit.derived_origin): made again
            path = Path(derived_dir.name) / f"{i}-{os.path.basename(build['origin'])}"   # from this kernel folder's
            path.write_text(jit.derived_source(build["origin"], build.get("prefix", "")))
        else:
            path = jit.KERNEL_DIR / build["source"]
        jobs.append((build_label(build), lambda b=build, path=path: jit.compile_kernel(
            b["name"], path, b["arch"], dict(b["defines"]))))
        checks.append(False)   # what the tests compiled: compared by digest, not static-checked
    by_label = dict(zip((label for label, _ in jobs), checks))
    expect, differs = request.get("expect"), []

    def differs_from_expected(label, compiled) -> bool:
        if expect.get(label) != binary.code_digest(compiled.cubin_path):
            differs.append(label)
        return bool(differs)

    done, failure = _compile_all(jobs, workers, differs_from_expected if expect is not None else None)
    reply = {"compiled": len(done), "compile_error": None, "static_problems": []}
    if failure:
        label, exc = failure
        reply["compile_error"] = {"variant": label, "log": _compiler_excerpt(str(exc))}
    else:
        for label, compiled in done:
            variant = by_label[label]
            if variant is False:
                continue
            if variant is None:
                reply["static_problems"] += _generic_problems(label, compiled)
            else:
                result = static_checks.check(variant, compiled)
                reply["static_problems"] += [f"{variant}: {p}" for p in result.problems]
    if derived_dir is not None:
        derived_dir.cleanup()
    if request.get("digests") and not failure:
        reply["digests"] = {label: binary.code_digest(compiled.cubin_path) for label, compiled in done}
    if expect is not None and not failure:
        reply["differs"] = differs[0] if differs else None
    reply["seconds"] = round(time.monotonic() - started, 2)
    return reply


def main() -> int:
    request = json.loads(sys.stdin.read())
    if request.get("low_priority"):
        # A warm-up beside a mutant's tests: those tests' own compiles (the case that kills a
        # mutant needs one or two variants) get the cores first. At equal priority, eight
        # mutants' warm-ups of 45 variants each held a kill in the sweep's first case to ~60 s.
        os.nice(19)
    reply = handle(request)
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Proof on a GPU that the gate passes unchanged code and fails a slowed kernel.

    scripts/gate-selftest.sh [--record] [--reruns 3] [--delay-ns 20000] [--out DIR]

1. baseline: records the benchmarks the later steps run (``--record``: the whole suite, as this
   GPU's real baseline under regressions/, to commit afterwards; without it: a scratch baseline
   under --out, regressions/ untouched);
2. reruns: the same benchmarks on the same code, each must PASS;
3. planted slowdowns: for V4, V5 and small_m in turn, a copy of kernels/ whose kernel starts
   with a ``delay`` spin on %globaltimer in every thread (DEEPGEMM_KERNEL_DIR points the JIT at the
   copy; the JIT cache keys on the source, so nothing stale is reused), and only that kernel's
   benchmarks (``-k``): each run must FAIL with at least one of that kernel's benchmarks slower.

A block that waits 20 µs before its work costs a one-wave problem (512x3072x768, a decode GEMV)
20 µs on 15-70 µs, and every wave of a large one 20 µs more: far beyond the 5 % floor for the
small shapes, so the failure does not depend on a lucky draw. The wait reads %globaltimer in a
loop, as deepgemm.bench's hold kernel does, rather than __nanosleep: exact, and it needs no
header under either compiler route.

Every step's pytest output, benchmark JSON and verdict (JSON and Markdown) go to --out; the
summary table is printed and written to <out>/selftest.md. Exit 0 when every step came out as
expected.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deepgemm import jit

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DELAY_NS = 20_000


@dataclass(frozen=True)
class Plant:
    kernel: str
    source: str  # file under kernels/
    select: str  # pytest -k expression: the benchmarks of that kernel the self-test runs


PLANTS = (
    Plant("v4", "v4_mma.cu", "test_gemm and v4-"),
    Plant("v5", "v5_wgmma.cu", "test_gemm and (v5-4096 or v5-bert or v5-8192)"),
    Plant("small_m", "small_m.cu", "test_small_m_decode"),
)
MARK = "planted by the gate self-test"
_KERNEL_ENTRY = re.compile(r"\bdeepgemm_kernel\s*\([^)]*\)\s*\{")


def planted_wait(delay_ns: int) -> str:
    """One line of CUDA C++: every thread spins until `delay_ns` of %globaltimer have passed."""
    return ("{ unsigned long long dg_t0, dg_t; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(dg_t0)); "
            "do { asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(dg_t)); } "
            f"while (dg_t - dg_t0 < {delay_ns}ull); }}")


def plant_slowdown(source: str, delay_ns: int = DEFAULT_DELAY_NS) -> str:
    """`source` with a `delay_ns` wait as the first statement of deepgemm_kernel."""
    if not isinstance(delay_ns, int) or not 0 < delay_ns <= 1_000_000:
        raise ValueError(f"delay_ns: an int in (0, 1e6] nanoseconds, got {delay_ns!r}")
    found = list(_KERNEL_ENTRY.finditer(source))
    if len(found) != 1:
        raise ValueError(f"source: expected exactly one `deepgemm_kernel(...) {{` definition, found {len(found)}")
    at = found[0].end()
    return f"{source[:at]}\n    {planted_wait(delay_ns)}  // {MARK}{source[at:]}"


def planted_kernel_dir(kernels: Path, dest: Path, plant: Plant, delay_ns: int = DEFAULT_DELAY_NS) -> Path:
    """A copy of `kernels` (sources and include/) in `dest` with `plant`'s kernel slowed."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(kernels, dest)
    target = dest / plant.source
    target.write_text(plant_slowdown(target.read_text(), delay_ns))
    return dest


def union_selection(plants=PLANTS) -> str:
    return " or ".join(f"({p.select})" for p in plants)


# ---------------------------------------------------------------------------------------------
# Running


@dataclass
class Step:
    name: str
    expect: str  # "pass" or "fail"
    rc: int | None = None
    headline: str = ""
    seconds: float = 0.0
    ok: bool = False
    why: str = ""


STEP_TIMEOUT_S = 420  # one pytest run; a hung step is a failed step, not a hung self-test


def _pytest(args: list[str], log: Path, env: dict) -> int:
    cmd = [sys.executable, "-m", "pytest", "tests/bench", "-p", "no:cacheprovider", "-q",
           "--benchmark-only", *args]
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        try:
            return subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=STEP_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\nstopped after {STEP_TIMEOUT_S} s\n")
            return 124


def _judge_step(step: Step, verdict_file: Path, kernel: str | None) -> None:
    if not verdict_file.exists():
        step.why = "no verdict written (see the log)"
        return
    report = json.loads(verdict_file.read_text())
    step.headline = report["headline"]
    slower = [v["name"] for v in report["verdicts"] if v["status"] == "slower"]
    if step.expect == "pass":
        step.ok = step.rc == 0 and report["result"] == "pass"
        step.why = "" if step.ok else f"expected PASS: {', '.join(slower) or report['headline']}"
    else:
        ours = [n for n in slower if kernel in n]
        step.ok = step.rc == 1 and report["result"] == "fail" and bool(ours)
        step.why = (f"{len(ours)} {kernel} benchmark(s) slower" if step.ok
                    else f"expected FAIL with a {kernel} benchmark slower (exit {step.rc})")


def run_selftest(out: Path, *, record: bool, reruns: int, delay_ns: int, plants=PLANTS) -> list[Step]:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    storage = [] if record else [f"--benchmark-storage={out / 'regressions'}"]
    selection = union_selection(plants)
    steps: list[Step] = []

    def done(step: Step) -> None:  # the summary so far, in case the machine is taken away
        steps.append(step)
        (out / "selftest.md").write_text(summary(steps, 1 + reruns + len(plants)) + "\n")

    def gate_args(tag: str) -> list[str]:
        for suffix in ("-bench.json", "-verdict.json", "-verdict.md"):  # none left from an earlier self-test
            (out / (tag + suffix)).unlink(missing_ok=True)
        return ["--benchmark-compare", f"--benchmark-json={out / (tag + '-bench.json')}",
                f"--gate-verdict={out / (tag + '-verdict.json')}",
                f"--gate-markdown={out / (tag + '-verdict.md')}"] + storage

    base = Step("record baseline" + (" (whole suite, regressions/)" if record else " (scratch)"), "pass")
    started = time.monotonic()
    base.rc = _pytest((["--benchmark-save=baseline"] + storage) + ([] if record else ["-k", selection]),
                      out / "baseline.log", env)
    base.seconds = time.monotonic() - started
    base.ok = base.rc == 0
    base.why = "" if base.ok else f"recording failed (exit {base.rc}; see baseline.log)"
    done(base)
    if not base.ok:
        return steps

    for i in range(1, reruns + 1):
        step = Step(f"rerun {i}, unchanged code", "pass")
        started = time.monotonic()
        step.rc = _pytest(["-k", selection] + gate_args(f"rerun{i}"), out / f"rerun{i}.log", env)
        step.seconds = time.monotonic() - started
        _judge_step(step, out / f"rerun{i}-verdict.json", None)
        done(step)

    for plant in plants:
        step = Step(f"planted: {plant.kernel} waits {delay_ns / 1000:g} µs per block", "fail")
        # The sources the JIT compiles (an installed package's deepgemm/kernels has no kernels/ beside it).
        kernel_dir = planted_kernel_dir(jit.kernel_dir(), out / f"kernels-{plant.kernel}", plant, delay_ns)
        planted_env = dict(env, DEEPGEMM_KERNEL_DIR=str(kernel_dir))
        started = time.monotonic()
        step.rc = _pytest(["-k", plant.select] + gate_args(f"planted-{plant.kernel}"),
                          out / f"planted-{plant.kernel}.log", planted_env)
        step.seconds = time.monotonic() - started
        _judge_step(step, out / f"planted-{plant.kernel}-verdict.json", plant.kernel)
        done(step)
    return steps


def summary(steps: list[Step], expected: int | None = None) -> str:
    lines = ["| step | expected | exit | came out | verdict | s |", "|---|---|---:|---|---|---:|"]
    for s in steps:
        lines.append(f"| {s.name} | {s.expect.upper()} | {s.rc} | {'as expected' if s.ok else 'WRONG'} "
                     f"| {(s.why + ': ' if s.why else '') + s.headline} | {s.seconds:.0f} |")
    good = all(s.ok for s in steps)
    lines.append("")
    if expected is not None and len(steps) < expected:
        state = f"{len(steps)} of {expected} steps run" + ("" if good else ", FAILED (see the table and the logs)")
    else:
        state = "every step as expected" if good else "FAILED (see the table and the logs)"
    lines.append("gate self-test: " + state)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gate-selftest.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true",
                        help="record the whole suite as this GPU's baseline under regressions/ first")
    parser.add_argument("--reruns", type=int, default=3, help="unchanged reruns that must pass (default 3)")
    parser.add_argument("--delay-ns", type=int, default=DEFAULT_DELAY_NS,
                        help="the planted wait per thread block, ns (default 20000)")
    parser.add_argument("--out", default="out/gate-selftest", help="logs, JSON and verdicts")
    parser.add_argument("--kernels", default=",".join(p.kernel for p in PLANTS),
                        help="which planted slowdowns to run (default: v4,v5,small_m)")
    args = parser.parse_args(argv)
    if args.reruns < 0:
        parser.error(f"--reruns: must be >= 0, got {args.reruns}")
    wanted = args.kernels.split(",")
    unknown = set(wanted) - {p.kernel for p in PLANTS}
    if unknown:
        parser.error(f"--kernels: unknown {sorted(unknown)}; choose from {[p.kernel for p in PLANTS]}")
    try:
        plant_slowdown("void deepgemm_kernel(int p) {}", args.delay_ns)
    except ValueError as exc:
        parser.error(f"--delay-ns: {exc}")

    from deepgemm import device

    ok, why = device.gpu_available()
    if not ok:
        print(f"gate self-test needs a GPU: {why}", file=sys.stderr)
        return 2
    plants = [p for p in PLANTS if p.kernel in wanted]
    out = Path(args.out).resolve()
    steps = run_selftest(out, record=args.record, reruns=args.reruns, delay_ns=args.delay_ns, plants=plants)
    expected = 1 + args.reruns + len(plants)
    text = summary(steps, expected)
    print(text)
    (out / "selftest.md").write_text(text + "\n")
    return 0 if all(s.ok for s in steps) and len(steps) == expected else 1


if __name__ == "__main__":
    sys.exit(main())

"""`python -m deepgemm mutate`: mutation testing of the kernels against the test tiers."""
from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

DESCRIPTION = """\
Mutation testing for the CUDA kernels: apply one small fault at a time (a shifted edge guard, a
removed barrier, a shallower pipeline wait, swapped leading dimensions, fp16 rounding in the
accumulator, ...) to a private copy of the kernel sources, and check that the tests notice.

Each mutant is compiled (and static-checked: spills, local memory, the SASS claims) in a child
process, then judged by the quick GPU tier restricted to the kernels built from the mutated file
(`pytest tests/gpu --kernels=... -x`), or by --test-cmd. Without a GPU (or with --static-only)
only the compile and the static checks run, unless --host asks for the CPU tier's host runs of the
kernels (every kernel compiled as host C++ and run on the quick sweep's cases, no GPU needed). Mutants in the reviewed equivalents list and
performance mutants are reported, not run. With --jobs N, after the baseline (alone), N mutants
are judged at once, each in its own copy of the sources and JIT cache. With --gate, the
performance mutants (stages, padding, raster, unrolling, cache hints, half the grid) are judged instead, by the
benchmark regression gate: the mutated kernels' benchmarks on the unmutated sources, then on each
mutant, compared by the gate's rule; a mutant is killed when a benchmark is slower twice.

Examples:
  python -m deepgemm mutate --list --kernels v3
  python -m deepgemm mutate --kernels v0,v1 --operators boundary,sync --out out/mutants
  python -m deepgemm mutate --static-only --kernels v4 --max 20
  python -m deepgemm mutate --host --kernels v5 --operators wait,sync --out out/mutants-v5-host
  python -m deepgemm mutate --kernels v3 --jobs 4 --out out/mutants-v3 --resume
  python -m deepgemm mutate --source my_kernel.cu --test-cmd "pytest tests/test_my_kernel.py -x -q"
  python -m deepgemm mutate --gate --kernels v4 --bench-select "test_gemm and v4" --out out/perf-v4
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from deepgemm.mutate.operators import FAMILIES

    parser.description = parser.description or DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--kernels", default=None,
                        help="comma-separated kernels whose sources to mutate (default: every ladder kernel)")
    parser.add_argument("--operators", default=None,
                        help=f"comma-separated operator families or names (default: all); families: {', '.join(FAMILIES)}")
    parser.add_argument("--list", action="store_true", help="list the mutants (site ids) and counts, run nothing")
    parser.add_argument("--static-only", action="store_true",
                        help="compile and static-check each mutant only (the default without a GPU)")
    parser.add_argument("--out", default=None, help="write mutants.json, mutants.md and the test logs here")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant for the tests (default: 3 x the baseline's time + 60, "
                             "times --jobs; a mutant stopped by a shorter limit is unfinished, not killed)")
    parser.add_argument("--stall-timeout", type=float, default=None,
                        help="kill a mutant's tests after this many seconds without output, as a hang (default for "
                             "the GPU tier: 10 x the baseline's slowest test, at least 120 s, times --jobs; none "
                             "for --test-cmd); as with --timeout, a mutant stopped by a shorter limit is unfinished")
    parser.add_argument("--max", type=int, default=None,
                        help="run at most N mutants: an evenly spaced sample in site order")
    parser.add_argument("--sites", default=None, help="comma-separated site ids to run (as --list prints them)")
    parser.add_argument("--no-headers", action="store_true",
                        help="mutate only the kernels' own .cu files, not the shared headers under include/")
    parser.add_argument("--source", default=None,
                        help="mutate this .cu file (your kernel) instead of deepgemm's; it is copied with the files it "
                             "#includes from its folder, and "
                             "the tests see the mutant's path in DEEPGEMM_MUTANT_SOURCE "
                             "(deepgemm.mutate.mutant_source(path) returns it)")
    parser.add_argument("--test-cmd", default=None,
                        help="shell command that tests a mutant (exit 0 = survived); {kernels} is replaced by the "
                             "kernel names; default: deepgemm's GPU tier for the mutated kernels")
    parser.add_argument("--arch", action="append", default=None,
                        help="target arch for the compile and static checks (repeatable; default: each kernel's "
                             "archs, or this GPU's arch when the GPU tier runs; --source: sm_90a)")
    parser.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                        help="--source with --static-only: a -D define for compiling your kernel (repeatable)")
    parser.add_argument("--variants", choices=("static", "minimal"), default="static",
                        help="what the compile step builds per kernel and arch: every static-check variant "
                             "(default) or just the plain fp16 row-major one and one per code-path switch "
                             "(small_m's ring, V5's ping-pong, split-K, multicast, ...); either way also the "
                             "batched/grouped build where the kernel has one")
    parser.add_argument("--no-same-code", action="store_true",
                        help="test every mutant, even one whose builds all keep the unmutated machine code (by "
                             "default such a mutant is reported as same-code and not run: the baseline's tests "
                             "(with --gate, its benchmarks) log what they build through deepgemm.jit, and a "
                             "mutant's static-check builds and every logged build that uses its file are compared "
                             "by deepgemm.binary.code_digest)")
    parser.add_argument("--host", action="store_true",
                        help="judge the mutants by the CPU tier's host runs instead of a GPU "
                             "(tests/cpu/test_host_kernels.py, test_host_v5.py: each mutated kernel compiled as host C++ and run "
                             "through gemm() on the quick sweep's cases, V4's and V5's grouped builds on the "
                             "grouped ones); no GPU needed. Slower than the GPU tier, and it does not run V5's "
                             "thread-block clusters (split-K, B multicast)")
    parser.add_argument("--xdist", type=int, default=0, help="run the GPU tier with pytest-xdist -n N")
    parser.add_argument("--sanitize", action="store_true",
                        help="a mutant the GPU tier leaves alive then runs under compute-sanitizer's memcheck, "
                             "racecheck and synccheck (tests/gpu/test_sanitize.py, the mutated kernels' samples): "
                             "a guard that only lets threads read outside an operand, whose values are never "
                             "stored, or a removed warp barrier that a converged warp never shows, dies there")
    parser.add_argument("--include-performance", action="store_true",
                        help="also run the performance mutants through the tests (by default they are listed for "
                             "the regression gate)")
    parser.add_argument("--gate", action="store_true",
                        help="judge the performance mutants only, by the benchmark gate (tests/bench on this GPU, "
                             "the unmutated sources first): killed when a benchmark is slower by the gate's rule, "
                             "in its run and again alone; one job")
    parser.add_argument("--bench-select", default=None, metavar="EXPR",
                        help="with --gate: the benchmarks to run, as a pytest -k expression (default: the mutated "
                             "kernels' names, e.g. 'v4')")
    parser.add_argument("--run-equivalent", action="store_true",
                        help="also run the mutants the equivalents list names (to re-check a judgement)")
    parser.add_argument("--equivalents", default=None,
                        help="the reviewed equivalents list (JSON; default: deepgemm/mutate/equivalents.json)")
    parser.add_argument("--fail-under", type=float, default=None,
                        help="exit 1 if the mutation score (percent) is below this")
    parser.add_argument("--resume", action="store_true",
                        help="with --out: keep the outcomes already in its mutants.json (an interrupted run) and "
                             "run only the rest (and its baseline too, if that passed on the same GPU, command and "
                             "source bytes)")
    parser.add_argument("--private-cache", action="store_true",
                        help="start from an empty JIT cache in the work folder instead of one seeded with links "
                             "to the JIT cache's entries (unmutated kernels are then rebuilt once per run)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep the work folder (the mutated copies, one per job, and their caches)")
    parser.add_argument("--workers", type=int, default=None,
                        help="parallel compiles per mutant (default: CPU count, divided by --jobs)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="mutants judged at once, each in its own copy of the sources and JIT cache; the "
                             "baseline runs alone first (default: 1)")


def _kernels(spec: str | None) -> list[str]:
    from deepgemm import registry

    valid = registry.names(include_hidden=True, purpose=None)
    if not spec:
        return registry.names()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    for n in names:
        if n not in valid:
            raise ValueError(f"--kernels: unknown kernel {n!r}; choose from {', '.join(valid)}")
    return names


def _gpu_arch() -> tuple[str | None, str]:
    import deepgemm
    ok, why = deepgemm.gpu_available()
    if not ok:
        return None, why
    from deepgemm import device
    return device.arch_for_cc(device.compute_capability(0)), why


def _sample(items: list, n: int) -> list:
    if n is None or n >= len(items):
        return items
    if n <= 0:
        return []
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def _defines(pairs: list[str]) -> dict:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ValueError(f"--define: expected NAME=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _ordered(results: list, mutants: list) -> list:
    order = {m.site_id: i for i, m in enumerate(mutants)}
    return sorted(results, key=lambda r: order[r.mutant.site_id])


def _host_judgeable(kernel_dir: Path, mutants: list) -> tuple[list, list[str]]:
    """(the mutants a host build of their file compiles, the site ids of those it does not: lines
    in a branch only a device compilation takes, operators.device_only_lines)."""
    from deepgemm.mutate import operators

    lines = {rel: operators.device_only_lines((kernel_dir / rel).read_text()) for rel in {m.file for m in mutants}}
    device_only = [m.site_id for m in mutants if m.line in lines[m.file]]
    return [m for m in mutants if m.line not in lines[m.file]], device_only


def _previous_run(out_dir: Path) -> dict:
    """The interrupted run's mutants.json ({} if there is none or it is unreadable)."""
    import json

    try:
        data = json.loads((out_dir / "mutants.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _previous_results(earlier: dict, to_run: dict, static_only: bool, fingerprint: str | None = None) -> list:
    """Outcomes an interrupted run (its mutants.json, _previous_run) already has, for mutants still
    to run (errors and unfinished mutants are run again). A run with tests keeps a static-only
    run's kills and compile errors but judges its passes (passed-static: compiled and clean, never
    tested) itself: a CPU machine's static campaign spares a GPU run those mutants. Where the
    earlier run's fingerprint (kernel sources, package, tests) differs from this run's, its
    survivors are judged again: a test added since may kill them, which is what a resumed campaign
    after a new test is for. Its kills stand (a site whose line changed is another site id)."""
    from deepgemm.mutate import runner

    changed = fingerprint is not None and earlier.get("fingerprint") != fingerprint
    out = []
    for d in earlier.get("mutants", []):
        m = to_run.get(d.get("site"))
        if changed and d.get("outcome") == "survived":
            continue
        if m is not None and d.get("outcome") in runner.OUTCOMES and d["outcome"] not in (
                "error", "equivalent", "performance", "unfinished") and (static_only or d["outcome"] != "passed-static"):
            out.append(runner.Result(m, d["outcome"], d.get("killer"), d.get("detail"), d.get("seconds") or 0.0,
                                     d.get("test_seconds"), d.get("log")))
    return out


def _reusable_baseline(earlier: dict, meta: dict):
    """The interrupted run's baseline, if it passed and ran what this run would run: the same kernels,
    mode, GPU and source fingerprint (kernel sources, the package, the tests), and, for a test command
    of the user's, the same command. None otherwise (the baseline then runs again)."""
    from deepgemm.mutate import runner

    b = earlier.get("baseline")
    if not isinstance(b, dict) or b.get("outcome") != "survived" or not meta.get("fingerprint"):
        return None
    same = ("fingerprint", "kernels", "mode", "gpu", "source") + (("test_cmd",) if meta.get("mode") == "command" else ())
    if any(earlier.get(k) != meta.get(k) for k in same) or b.get("test_seconds") is None:
        return None
    return runner.Result(None, "survived", seconds=float(b.get("seconds") or 0.0),
                         test_seconds=float(b["test_seconds"]), log=b.get("log"),
                         slowest_test=b.get("slowest_test"))


def _command_text(settings) -> str | None:
    """What judges the mutants, as recorded in the report."""
    if settings.gate is not None:
        select = settings.gate.select or "<the mutated kernels>"
        return " ".join(settings.gate.command(Path("<run>.json"), select, None))
    cmd = settings.test_cmd
    return cmd if isinstance(cmd, str) else " ".join(cmd or []) or None


def _judge(runners: list, mutants: list, record, stop: threading.Event) -> None:
    """Judge `mutants`, one thread per runner (each over its own workspace) taking the next from a
    shared queue; record(result) is called under a lock as each finishes. Ctrl-C, or an exception
    in any thread, sets `stop`: the threads take no more mutants and kill their running children
    (whose mutants are then not recorded), and the exception is raised here once they have ended."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for m in mutants:
        todo.put(m)
    lock = threading.Lock()
    failures: list = []
    ended = [threading.Event() for _ in runners]

    def work(r, end: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    m = todo.get_nowait()
                except queue.Empty:
                    return
                res = r.evaluate(m)
                if stop.is_set():   # its child may have been killed by the stop: not a judgement
                    return
                with lock:
                    record(res)
        except BaseException as exc:
            failures.append(exc)
            stop.set()
        finally:
            end.set()

    def wait() -> None:
        # Polled, not Thread.join: Ctrl-C during a join can mark a live thread as ended (CPython
        # before 3.13), and the workspaces would then be removed under a running job.
        while not all(e.is_set() for e in ended):
            time.sleep(0.1)

    for i, (r, end) in enumerate(zip(runners, ended), start=1):
        threading.Thread(target=work, args=(r, end), name=f"mutate-job-{i}", daemon=True).start()
    try:
        wait()
    except BaseException:
        stop.set()
        wait()
        raise
    if failures:
        raise failures[0]


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # Ctrl-C, or a CI step's time limit sending SIGINT
        kept = (f": the mutants judged so far are in {Path(args.out) / 'mutants.json'}; run again with "
                f"--resume to go on" if args.out else " (without --out nothing was kept)")
        print(f"interrupted{kept}", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    from deepgemm import jit
    from deepgemm.mutate import operators, report, runner

    ops = operators.resolve_operators(args.operators)
    if args.max is not None and args.max < 0:
        raise ValueError(f"--max: must be >= 0, got {args.max}")
    if args.jobs < 1:
        raise ValueError(f"--jobs: must be >= 1 (the number of mutants judged at once), got {args.jobs}")
    # ---- what to mutate ------------------------------------------------------------------------
    if args.source:
        source = Path(args.source).resolve()
        if not source.is_file():
            raise FileNotFoundError(f"--source: no such file {args.source}")
        pristine = source.parent
        files = {source.name: ()}
        copied = runner.source_files(source)   # not the whole folder: it may hold anything
        kernels: list[str] = []
    else:
        if args.define:
            raise ValueError("--define: only with --source (deepgemm's kernels get their defines from the registry)")
        kernels = _kernels(args.kernels)
        pristine = jit.KERNEL_DIR
        copied = None   # the whole kernel folder
        files = runner.targets(pristine, kernels, headers=not args.no_headers)
    mutants, untimed = [], 0
    for rel, users in files.items():
        text = (pristine / rel).read_text()
        found = operators.mutants_of(operators.Source(rel, text), ops, kernels=users)
        # A slowdown in code only the stress tier's builds compile is no regression: no benchmark
        # times those builds, so the gate could only report it surviving.
        check_only = operators.check_build_lines(text)
        kept = [m for m in found if not (m.performance and m.line in check_only)]
        untimed += len(found) - len(kept)
        mutants += kept
    if untimed:
        print(f"{untimed} performance mutants lie in code only the stress tier's builds compile "
              f"({', '.join(operators.CHECK_DEFINES)}), which no benchmark times: left out", file=sys.stderr)
    unreached = []
    if not args.source:   # a shared header's mutant is run for the kernels that reach its function
        mutants, unreached = runner.attribute_to_callers(pristine, mutants)
        if unreached:
            print(f"{len(unreached)} mutants of shared headers lie in functions the selected kernels never call: "
                  f"left out", file=sys.stderr)
    generated = mutants   # before --sites: an entry is judged against every mutant its file yields
    if args.gate:
        if args.source or args.test_cmd or args.static_only or args.sanitize or args.include_performance:
            raise ValueError("--gate: runs deepgemm's benchmarks on deepgemm's kernels; not with --source, "
                             "--test-cmd, --static-only, --sanitize or --include-performance")
        if args.jobs != 1:
            raise ValueError(f"--gate: one job (benchmarks need the GPU to themselves), got --jobs {args.jobs}")
        mutants = [m for m in mutants if m.performance]
    elif args.bench_select is not None:
        raise ValueError("--bench-select: only with --gate")
    if args.sites:
        wanted = [s.strip() for s in args.sites.split(",") if s.strip()]
        known = {m.site_id: m for m in mutants}
        missing = [s for s in wanted if s not in known]
        if missing and args.gate:
            raise ValueError(f"--sites: --gate judges performance mutants only; not among them: {', '.join(missing)}")
        if missing:
            raise ValueError(f"--sites: no mutant {', '.join(missing)} among the selected kernels and operators "
                             f"(--list prints the site ids)")
        mutants = [known[s] for s in wanted]
    if args.list:
        print(report.listing(mutants, operators.FAMILIES))
        return 0

    # ---- how to judge them -------------------------------------------------------------------
    try:
        listed = report.load_equivalents(args.equivalents) if (args.equivalents or not args.source) else []
    except ValueError as exc:
        raise ValueError(f"--equivalents: {exc}") from None
    equivalents, stale = report.match_equivalents(   # the left-out mutants too: their entries are not stale
        generated + unreached, listed)
    if args.host and (args.test_cmd or args.source or args.static_only or args.gate or args.sanitize):
        raise ValueError("--host: runs deepgemm's host tier on deepgemm's kernels; not with --test-cmd, --source, "
                         "--static-only, --gate or --sanitize")
    gpu_arch, gpu_why = (None, "--static-only") if args.static_only else (None, "--host") if args.host else _gpu_arch()
    static_only = args.static_only or (gpu_arch is None and not args.test_cmd and not args.host)
    if args.source and not static_only and not args.test_cmd:
        raise ValueError("--source: give --test-cmd (the command that tests your kernel), or --static-only")
    if args.sanitize and (args.test_cmd or args.source or static_only):
        raise ValueError("--sanitize: runs deepgemm's sanitizer samples after its GPU tier; not with --test-cmd, "
                         "--source or without a GPU")
    if args.gate and static_only:
        raise ValueError(f"--gate: needs a GPU to run the benchmarks on ({gpu_why})")
    if static_only and not args.static_only:
        print(f"No GPU here ({gpu_why}): compiling and static-checking the mutants only (--host judges them by the "
              f"CPU tier's host runs instead).", file=sys.stderr)
    settings = runner.Settings(workers=args.workers, variants=args.variants)
    if args.source:
        settings.source = {"path": str(source), "archs": args.arch or ["sm_90a"], "defines": _defines(args.define)}
        settings.compile_check = static_only
    else:
        settings.static_archs = args.arch or (None if static_only or args.test_cmd else [gpu_arch])
    if args.gate:
        settings.gate = runner.Gate(runner.builtin_bench_command(settings.repo_root), select=args.bench_select)
    elif not static_only:
        if args.host:
            settings.test_cmd = runner.builtin_host_command(settings.repo_root)
            settings.host_tier = True
        elif args.test_cmd:
            settings.test_cmd = args.test_cmd
        else:
            settings.test_cmd = runner.builtin_tier_command(settings.repo_root, args.xdist)
            settings.builtin_tier = True
            settings.killers = runner.Killers()
            if args.sanitize:
                settings.sanitize_cmd = runner.builtin_sanitize_command(settings.repo_root)
            settings.warm_arch = gpu_arch
            from deepgemm import registry
            settings.warm_kernels = registry.names()
    mode = ("static" if static_only else "gate" if args.gate else "gpu" if settings.builtin_tier
            else "host" if settings.host_tier else "command")
    # A test or benchmark command that builds through deepgemm.jit logs its builds; --source kernels
    # compile elsewhere.
    settings.same_code = mode in ("gpu", "host", "command", "gate") and not args.source and not args.no_same_code
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        settings.log_dir = out_dir / "logs"

    results: list = []
    to_run = []
    for m in mutants:
        if m.site_id in equivalents and not args.run_equivalent:
            results.append(runner.Result(m, "equivalent", detail=equivalents[m.site_id]))
        elif m.performance and not (args.include_performance or args.gate):
            results.append(runner.Result(m, "performance"))
        else:
            to_run.append(m)
    device_only = []
    if mode == "host":   # the host build compiles the other branch: such a mutant would survive unseen
        to_run, device_only = _host_judgeable(pristine, to_run)
        if device_only:
            print(f"{len(device_only)} mutants lie in code only a device compilation takes (#ifdef __CUDA_ARCH__), "
                  f"which the host build never compiles: left out for a GPU run (listed in mutants.json)",
                  file=sys.stderr)
    sampled = _sample(to_run, args.max)
    left_out = len(to_run) - len(sampled)
    # What a test run's outcomes depend on: a resumed run whose interrupted run passed its baseline
    # on the same sources, tests, GPU and command reuses it instead of spending the tier's time
    # again, and one whose sources or tests changed judges the earlier survivors again.
    fingerprint = None if static_only else runner.tree_digest(
        pristine, Path(jit.__file__).resolve().parent, settings.repo_root / "tests",
        only=None if copied is None else {pristine: copied})
    previous = []
    if args.resume:
        if out_dir is None:
            raise ValueError("--resume: needs --out (the folder of the interrupted run)")
        earlier = _previous_run(out_dir)
        previous = _previous_results(earlier, {m.site_id: m for m in sampled}, static_only, fingerprint)
        results += previous
        if settings.killers is not None:   # the interrupted run's killers go first from the start
            for d in earlier.get("mutants", []):
                if d.get("outcome") == "killed":
                    settings.killers.add(d.get("killer"))
        done_sites = {r.mutant.site_id for r in previous}
        sampled = [m for m in sampled if m.site_id not in done_sites]

    workspace = runner.Workspace(pristine, keep=args.keep_work, seed_cache=None if args.private_cache else jit.cache_dir(),
                                 files=copied)
    workspaces = [workspace]
    stop = threading.Event()
    users = {} if args.source else runner.kernel_users(pristine)

    def progress(line: str) -> None:
        print(line, flush=True)

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta = {"started": started, "mode": mode, "kernels": kernels, "source": str(args.source or ""),
            "operators": [o.name for o in ops], "test_cmd": _command_text(settings),
            "gpu": None if static_only else gpu_why,
            "left_out_by_max": left_out, "left_out_device_only": device_only, "work_dir": str(workspace.root) if args.keep_work else None,
            "jobs": args.jobs, "fingerprint": fingerprint}
    try:
        r = runner.Runner(workspace, settings, users, progress, stop)
        progress(f"{len(sampled)} mutants to run ({mode}), "
                 f"{sum(1 for x in results if x.outcome == 'equivalent')} equivalent and "
                 f"{sum(1 for x in results if x.outcome == 'performance')} performance mutants listed"
                 + (f", {left_out} left out by --max" if left_out else "")
                 + (f", {len(previous)} already judged (--resume)" if args.resume else "")
                 + f"; work folder {workspace.root}")
        t0 = time.monotonic()
        mutant_cmd = settings.test_cmd
        if settings.builtin_tier and args.jobs > 1:
            # The baseline runs alone, so its tier takes the jobs' share of pytest-xdist workers (on
            # the H200 machine, 16 cores: one process took 244 s of a 272 s baseline while the
            # jobs waited). Its time is then about 1/N of a one-process run, and the limits below,
            # N x (3 x that + 60 s), stay above what one mutant's tier costs alone.
            settings.test_cmd = runner.builtin_tier_command(settings.repo_root, args.jobs * max(1, args.xdist))
        # The gate compares each mutant with a baseline measured in this campaign, never a stored one.
        baseline = _reusable_baseline(earlier, meta) if args.resume and not args.gate else None
        if baseline is None:
            baseline = r.evaluate(None, kernels=tuple(kernels))
        else:
            progress(f"baseline: reused from the interrupted run in {out_dir} (same sources, tests, GPU and command)")
            settings.tier_builds = earlier.get("tier_builds") if settings.same_code else None
            if settings.tier_builds and settings.compile_check:
                # The baseline's tests would have filled this campaign's kernel cache. Without them the
                # same-code check's unmutated digests, and every job's first tests, compiled the
                # whole tier on each job's share of the cores: on the H200 machine a resumed V0-V3
                # campaign (--jobs 10, 416 logged builds) judged no mutant in 430 s. All the cores
                # build them once here, before the jobs copy the cache.
                t_warm = time.monotonic()
                reply = r.compile_step(tuple(kernels), None, warm=False, builds=settings.tier_builds)
                if reply.get("compile_error"):
                    print(f"error: the unmutated sources did not build: {reply['compile_error']}", file=sys.stderr)
                    return 2
                progress(f"kernel cache: the {len(settings.tier_builds)} builds the baseline's tests made, "
                         f"compiled in {time.monotonic() - t_warm:.0f} s")
        meta["tier_builds"] = settings.tier_builds
        settings.test_cmd = mutant_cmd
        ok = baseline.outcome in ("survived", "passed-static")
        progress(f"baseline (unmutated): {'ok' if ok else baseline.outcome} in {baseline.seconds:.1f} s"
                 + (f" ({baseline.killer}: {baseline.detail})" if not ok else ""))
        if not ok:
            print("error: the unmutated sources do not pass; fix that first (mutants could not be judged)",
                  file=sys.stderr)
            return 2
        if settings.test_cmd is not None or settings.gate is not None:
            # The baseline ran without a limit; mutants get one. It ran alone; --jobs N runs share the
            # GPU and the cores. A run alone uses at most the whole machine, so with a fair N-way share
            # a correct mutant's tests take at most N times as long: the derived limits scale by N, so
            # contention is not read as a hang.
            # A hang is still killed, N times later, while holding one worker of N: about what a hang
            # costs a run of one job. Limits given on the command line are used as given.
            settings.fair_timeout = args.jobs * round(3 * (baseline.test_seconds or 0) + 60)
            if settings.builtin_tier:
                settings.fair_stall_timeout = args.jobs * round(max(120.0, 10 * (baseline.slowest_test or 0)))
            settings.timeout = args.timeout or settings.fair_timeout
            settings.stall_timeout = args.stall_timeout or settings.fair_stall_timeout
            for flag, given, fair in (("--timeout", args.timeout, settings.fair_timeout),
                                      ("--stall-timeout", args.stall_timeout, settings.fair_stall_timeout)):
                if given is not None and fair is not None and given < fair:
                    progress(f"warning: {flag} {given:g} s is shorter than the {fair:g} s the baseline allows at "
                             f"--jobs {args.jobs}: a mutant it stops is reported unfinished, not killed")
        meta["timeout"], meta["stall_timeout"] = settings.timeout, settings.stall_timeout
        if args.jobs > 1 and args.workers is None:   # the jobs' compiles share the cores
            settings.workers = max(1, (os.cpu_count() or 1) // args.jobs)
        for i in range(2, min(args.jobs, len(sampled)) + 1):   # seeded with what the baseline compiled
            workspaces.append(runner.Workspace(pristine, root=workspace.root / f"job-{i}", keep=args.keep_work,
                                               seed_cache=workspace.cache, files=copied))
        runners = [r] + [runner.Runner(ws, settings, users, progress, stop) for ws in workspaces[1:]]
        width = len(str(len(sampled)))
        judged: list = []

        def record(res) -> None:
            judged.append(res)
            results.append(res)
            what = {"killed": f"killed by {res.killer}", "killed-static": f"killed by the static checks: {res.detail}",
                    "did-not-compile": f"did not compile ({res.killer})"}.get(res.outcome, res.outcome)
            progress(f"[{len(judged):>{width}}/{len(sampled)}] {res.mutant.site_id}  {what[:160]}  "
                     f"({res.seconds:.1f} s)")
            if out_dir is not None:   # after every mutant: a long run that dies keeps what it judged
                report.write(out_dir, {**meta, "complete": False}, baseline, _ordered(results, mutants), stale)

        _judge(runners, sampled, record, stop)
        results = _ordered(results, mutants)
        meta["complete"] = True
        summary = report.summarize(results)
        progress(f"done in {time.monotonic() - t0:.0f} s")
        print(report.summary_line(summary))
        if stale:
            print(f"{len(stale)} entries of the equivalents list no longer match the code: review them "
                  f"({', '.join(e['site'] for e in stale[:5])}{' ...' if len(stale) > 5 else ''})")
        if out_dir is not None:
            json_path, md_path = report.write(out_dir, meta, baseline, results, stale)
            print(f"report: {md_path}, {json_path}")
        if args.fail_under is not None and summary["score"] is not None and 100 * summary["score"] < args.fail_under:
            return 1
        return 0
    finally:
        for ws in workspaces:
            ws.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepgemm mutate")
    add_arguments(parser)
    return run(parser.parse_args(argv))

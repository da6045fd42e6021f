"""Run mutants one at a time per Runner: write the mutant into the Runner's private copy of the
kernel folder, compile it (and run the static checks) in a child process, then run the tests in a
subprocess that sees the copy through DEEPGEMM_KERNEL_DIR, and classify what happened. Several
Runners, each over its own copy, judge mutants side by side (`mutate --jobs`).

Outcomes:
  killed           a test failed (the first failing test id and the time are recorded)
  killed-static    the static checks failed (spills, local memory, a SASS claim): the CPU tier kills it
  timeout          the tests ran past the per-mutant limit (a hang counts as detected)
  did-not-compile  the compiler rejected it (killed by the compiler; reported apart, out of the score)
  survived         every test passed: a gap in the tests, or an equivalent mutant not yet reviewed
  passed-static    static-only runs: compiles and passes the static checks; needs the GPU tier
  same-code        the static checks' variants and every build the unmutated run's tests asked
                   deepgemm.jit for (that use the mutated file) compile to the same machine code as the
                   unmutated sources (deepgemm.binary.code_digest): the tests would run the same
                   binaries, so they cannot tell it apart; reported with the equivalents, not run
  equivalent       judged equivalent in the reviewed list (with its reason); not run
  performance      a performance mutant: for the benchmark regression gate; not run (--gate runs them
                   through the gate instead: killed when a benchmark is slower, twice)
  error            the tests could not judge it (collection or usage error, no tests ran)
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from deepgemm.mutate.operators import Mutant

OUTCOMES = ("killed", "killed-static", "timeout", "did-not-compile", "survived", "passed-static", "equivalent",
            "same-code", "performance", "error", "unfinished")
KILLED = ("killed", "killed-static", "timeout")

# Test files of the built-in tier that check the framework itself, not the kernel under mutation:
# the planted-bug kernels (one is built from the real v1_smem.cu and insists on its exact text) and
# the per-worker GPU pinning of pytest-xdist.
FRAMEWORK_SELF_TESTS = ("test_broken_kernels.py", "test_multi_gpu.py")
# Sweep first: it is per kernel and kills most mutants within its first cases, so `-x` stops early.
FIRST_TESTS = ("test_sweep.py", "test_fuzz.py")
# Kernel files a kernel uses besides its registry entry's own file and its #includes: V5's host
# side launches kernels/stage_copy.cu for operands TMA cannot read (deepgemm/tma.py).
EXTRA_FILES = {"v5": ("stage_copy.cu",)}
# What a failed JIT compile prints (deepgemm.jit.CompileError), in a test log.
_COMPILE_ERROR = re.compile(r"CompileError: compiling kernel (\S+)")


@dataclass
class Result:
    mutant: Mutant | None              # None: the baseline (the unmutated sources)
    outcome: str
    killer: str | None = None          # test id / static problem / "timeout after N s" / failing variant
    detail: str | None = None          # the failure's message, the compiler's first errors, the reason
    seconds: float = 0.0               # compile + tests, wall time
    test_seconds: float | None = None
    log: str | None = None             # the test run's full output, when --out keeps logs
    slowest_test: float | None = None  # the longest single test (built-in tier; sets the hang limit)

    def as_dict(self) -> dict:
        d = {"outcome": self.outcome, "killer": self.killer, "detail": self.detail,
             "seconds": round(self.seconds, 2),
             "test_seconds": None if self.test_seconds is None else round(self.test_seconds, 2), "log": self.log}
        if self.slowest_test is not None:
            d["slowest_test"] = round(self.slowest_test, 2)
        if self.mutant is not None:
            m = self.mutant
            d = {"site": m.site_id, "file": m.file, "line": m.line, "col": m.col, "operator": m.operator,
                 "family": m.family, "kernels": list(m.kernels), "original": m.original,
                 "replacement": m.replacement, "snippet": m.snippet, **d}
        return d


def tree_digest(*roots: Path, only: dict | None = None) -> str:
    """A hash of every file's relative path and bytes under `roots` (caches and .git left out): what a
    test run's outcome depends on, so that a resumed run can tell whether an old baseline still holds.
    only: root -> the files (relative to it) to hash there instead of all of them."""
    h = hashlib.sha256()
    only = {Path(r): files for r, files in (only or {}).items()}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        chosen = [root / f for f in only[root]] if root in only else (p for p in root.rglob("*") if p.is_file())
        for path in sorted(chosen):
            rel = path.relative_to(root)
            if {".git", "__pycache__", ".hypothesis", ".pytest_cache"} & set(rel.parts) or path.suffix == ".pyc":
                continue
            h.update(f"{root.name}/{rel.as_posix()}\0".encode())
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Which files each kernel is built from

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def source_files(source: Path) -> list[str]:
    """What a user kernel's copy needs, relative to its folder: the file, then what it includes
    from that folder (includes_of). Headers found on the compiler's include path (deepgemm's,
    CUDA's) stay where they are."""
    return [source.name, *includes_of(source.parent, source.name)]


def includes_of(kernel_dir: Path, rel: str, seen: set | None = None) -> list[str]:
    """The files under kernel_dir that `rel` includes, transitively (quoted includes, resolved next
    to the including file first, then under include/ as the JIT's -I does)."""
    seen = set() if seen is None else seen
    out = []
    path = kernel_dir / rel
    try:
        text = path.read_text()
    except OSError:
        return out
    # Paths are compared as written, not resolved: a header that is a symlink to a file elsewhere
    # is still the kernel's own include, and its copy (copy2 follows the link) must come along.
    root = Path(os.path.normpath(kernel_dir.absolute()))
    for name in _INCLUDE.findall(text):
        for candidate in (path.parent / name, kernel_dir / "include" / name):
            if candidate.is_file():
                try:
                    found = Path(os.path.normpath(candidate.absolute())).relative_to(root).as_posix()
                except ValueError:
                    break   # outside the kernel folder: not ours to mutate
                if found not in seen:
                    seen.add(found)
                    out.append(found)
                    out += includes_of(kernel_dir, found, seen)
                break
    return out


def kernel_files(kernel_dir: Path, name: str, spec_file: str) -> list[str]:
    own = [spec_file, *EXTRA_FILES.get(name, ())]
    files = list(own)
    for f in own:
        files += [i for i in includes_of(kernel_dir, f) if i not in files]
    return files


def targets(kernel_dir: Path, kernels: list[str], headers: bool = True) -> dict[str, tuple[str, ...]]:
    """File (relative to kernel_dir) -> the selected kernels built from it, kernel files first."""
    from deepgemm import registry

    own, shared = {}, {}
    for name in kernels:
        spec = registry.get(name)
        if Path(spec.file).is_absolute():
            raise ValueError(f"--kernels: {name!r} is built from {spec.file}, outside the kernel folder; "
                             f"mutate it with --source {spec.file} --test-cmd ...")
        for i, f in enumerate(kernel_files(kernel_dir, name, spec.file)):
            is_own = i == 0 or f in EXTRA_FILES.get(name, ())
            if not is_own and not headers:
                continue
            bucket = own if is_own else shared
            bucket.setdefault(f, [])
            if name not in bucket[f]:
                bucket[f].append(name)
    return {f: tuple(ks) for f, ks in {**own, **shared}.items()}


def static_kernels(kernels) -> list[str]:
    """The kernels a mutant of these kernels' sources is compiled and static-checked as: them, then
    every other registered kernel built from one of their files, whatever its purpose. fp16acc_mma
    is v4_mma.cu with DG_ACC_F16, code no V4 build compiles: without it a slowdown there (a
    loop not unrolled, its accumulators then in local memory) would pass the static checks unseen."""
    from deepgemm import registry

    files = {registry.get(k).file for k in kernels}
    siblings = [n for n in registry.names(include_hidden=True, purpose=None)
                if n not in kernels and registry.get(n).file in files]
    return [*kernels, *siblings]


_NOT_FUNCTIONS = frozenset({"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype",
                            "static_assert", "defined"})
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(.*(?:\\\n.*)*)", re.M)


def function_spans(text: str) -> list[tuple[str, int, int]]:
    """(name, body start, body end) of every function defined in `text` (comments already blanked):
    a name, its parenthesised parameters, optional `const`/`noexcept`, then a braced body. Struct
    methods count; constructors with initializer lists and lambdas do not (their code belongs to
    no function here, or to the one around them)."""
    from deepgemm.mutate.operators import match_paren
    out = []
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", text):
        if m.group(1) in _NOT_FUNCTIONS:
            continue
        before = text[max(0, m.start() - 200):m.start()].rstrip()
        if before.endswith((":", ",")) and not before.endswith("::"):
            continue   # a member initializer (`S(int x) : v(x) {`), not a definition
        close = match_paren(text, m.end() - 1)
        if close < 0:
            continue
        after = re.match(r"\s*(?:const\s*)?(?:noexcept\s*)?\{", text[close + 1:])
        if after:
            brace = close + after.end()   # after.end() counts from close + 1 and ends past the brace
            end = match_paren(text, brace)
            if end > 0:
                out.append((m.group(1), brace, end))
    return out


_CONSTANT = re.compile(r"\bconstexpr\s+(?:(?:unsigned|signed|const)\s+)*[\w:<>]+\s+([A-Za-z_]\w*)\s*=[^;{]*;")


def constant_spans(text: str, functions: list | None = None) -> list[tuple[str, int, int]]:
    """(name, start, end) of every `constexpr TYPE NAME = ...;` outside the functions of `text`
    (comments already blanked; `functions`: its function_spans, if already found): a shared
    constant, reached like a function by the kernels that name it (V5 alone reads common.cuh's
    HAS_EPILOGUE)."""
    inside = function_spans(text) if functions is None else functions
    return [(m.group(1), m.start(), m.end()) for m in _CONSTANT.finditer(text)
            if not any(start < m.start() < end for _, start, end in inside)]


def attribute_to_callers(kernel_dir: Path, mutants: list) -> tuple[list, list]:
    """Narrow each shared-header mutant's kernels to those whose code can reach the function it
    sits in: the names a kernel's own files use, closed over the bodies of the header functions
    and macros they name (by name: an overload or a namesake keeps a kernel in, never out).
    Returns (mutants with kernels narrowed, mutants in functions none of their kernels reaches:
    code the selected kernels never run). A namespace-level constant (constant_spans) counts as a
    function; a mutant outside any function or constant keeps every kernel."""
    from deepgemm import registry
    from deepgemm.mutate.operators import Source

    texts: dict[str, str] = {}
    spans: dict[str, list] = {}

    def code(rel: str) -> str:
        if rel not in texts:
            texts[rel] = Source(rel, (kernel_dir / rel).read_text()).nocomment
        return texts[rel]

    def functions(rel: str) -> list:   # scanned once per file, not once per mutant or kernel
        if rel not in spans:
            found = function_spans(code(rel))
            spans[rel] = found + constant_spans(code(rel), found)
        return spans[rel]

    reach_of: dict[str, set[str]] = {}

    def reach(kernel: str) -> set[str]:
        if kernel in reach_of:
            return reach_of[kernel]
        spec = registry.get(kernel)
        own = [spec.file, *EXTRA_FILES.get(kernel, ())]
        bodies: dict[str, list[str]] = {}
        for rel in kernel_files(kernel_dir, kernel, spec.file):
            if rel in own:
                continue
            text = code(rel)
            for name, start, end in functions(rel):
                bodies.setdefault(name, []).append(text[start:end])
            for m in _DEFINE.finditer(text):
                bodies.setdefault(m.group(1), []).append(m.group(2))
        names = set(_IDENT.findall("\n".join(code(rel) for rel in own)))
        todo = list(names)
        while todo:
            for body in bodies.get(todo.pop(), ()):
                for name in set(_IDENT.findall(body)) - names:
                    names.add(name)
                    todo.append(name)
        reach_of[kernel] = names
        return names

    kept, unreached = [], []
    for m in mutants:
        owners = [k for k in m.kernels if m.file in (registry.get(k).file, *EXTRA_FILES.get(k, ()))]
        if owners or not m.kernels:
            kept.append(m)
            continue
        inside = [(end - start, name) for name, start, end in functions(m.file) if start < m.start < end]
        if not inside:
            kept.append(m)
            continue
        function = min(inside)[1]
        callers = tuple(k for k in m.kernels if function in reach(k))
        if callers:
            kept.append(dataclasses.replace(m, kernels=callers))
        else:
            unreached.append(m)
    return kept, unreached


def kernel_users(kernel_dir: Path) -> dict[str, set[str]]:
    """Every registered kernel (hidden and report ones too) and V5's staging copy -> its files."""
    from deepgemm import registry

    users = {"stage_copy": {"stage_copy.cu"}}
    for spec in registry.specs(include_hidden=True, purpose=None):
        if not Path(spec.file).is_absolute():
            users[spec.name] = set(kernel_files(kernel_dir, spec.name, spec.file))
    return users


# ---------------------------------------------------------------------------------------------
# Processes

def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def _python_env(env: dict) -> dict:
    """Our own children import the same deepgemm as this process."""
    env = dict(env)
    root = str(_package_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@dataclass
class Completed:
    returncode: int | None             # None: killed (see killed_because)
    output: str
    seconds: float
    killed_because: str | None = None  # "timeout after N s" / "no output for N s (a hang)"
    stopped_by: str | None = None      # "timeout" / "stall" / "stopped": which limit killed_because names

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_process(cmd, env: dict, cwd: Path, timeout: float | None, stdin: str | None = None,
                stall: float | None = None, stop: threading.Event | None = None) -> Completed:
    """Run cmd (a list, or a string for the shell) in its own process group, and kill that group
    (pytest and whatever it started, not just the first process) at the time limit, or when the
    output has not grown for `stall` seconds (a deadlocked kernel: pytest prints per test, so
    silence that long is a hang, found without waiting for the whole limit), or once `stop` is
    set (the run was interrupted; the result means nothing then)."""
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, shell=isinstance(cmd, str), cwd=str(cwd), env=env, text=True,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        size, changed, why, cause = 0, started, None, None
        try:
            if stdin is not None:
                # A process that exits before reading its input closes the pipe: its status and output say why.
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.write(stdin)
                    proc.stdin.flush()
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
            while True:
                try:
                    rc = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                grown = os.fstat(out.fileno()).st_size
                if grown != size:
                    size, changed = grown, now
                if timeout is not None and now - started >= timeout:
                    why, cause = f"timeout after {timeout:g} s", "timeout"
                elif stall is not None and now - changed >= stall:
                    why, cause = f"no output for {stall:g} s (a hang)", "stall"
                elif stop is not None and stop.is_set():
                    why, cause = "stopped", "stopped"
                if why:
                    _kill_group(proc)
                    rc = None
                    break
        except BaseException:
            # Ctrl-C reaches this process only: the child has a session of its own and would
            # otherwise run on after the campaign is gone.
            _kill_group(proc)
            raise
        out.seek(0)
        return Completed(rc, out.read(), time.monotonic() - started, why, cause)


def junit_slowest(path: Path) -> float | None:
    """The longest test case time in a JUnit XML file (None if unreadable or empty)."""
    try:
        times = [float(c.get("time") or 0) for c in ET.parse(path).getroot().iter("testcase")]
    except (OSError, ET.ParseError, ValueError):
        return None
    return max(times) if times else None


# ---------------------------------------------------------------------------------------------
# What a test run says

def _junit_failure(path: Path, cwd: Path) -> tuple[str, str] | None:
    """(test id, message) of the first failed or errored test case in a JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                parts = (case.get("classname") or "").split(".")
                node = None
                for i in range(len(parts), 0, -1):   # the longest prefix that is a test file
                    candidate = "/".join(parts[:i]) + ".py"
                    if (cwd / candidate).is_file():
                        node = "::".join([candidate, *parts[i:], case.get("name", "")])
                        break
                node = node or f"{case.get('classname')}::{case.get('name')}"
                message = (child.get("message") or child.text or "").strip()
                return node, message
    return None


_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", re.M)
_PYTEST_SUMMARY = re.compile(r"^=+ .*\b(?:passed|failed|errors?|skipped|no tests ran|deselected)\b.* =+$", re.M)


def classify(completed: Completed, junit: Path | None, cwd: Path, timeout: float | None) -> tuple[str, str | None, str | None]:
    """(outcome, killer, detail) of one test run."""
    out = completed.output
    if completed.timed_out:
        return "timeout", completed.killed_because or f"timeout after {timeout:g} s", _tail(out)
    compile_error = _COMPILE_ERROR.search(out)
    if compile_error and completed.returncode != 0:
        return "did-not-compile", compile_error.group(1), _compile_excerpt(out)
    failure = _junit_failure(junit, cwd) if junit is not None else None
    if failure is None:
        m = _PYTEST_FAILED.search(out)
        if m:
            failure = (m.group(1), (m.group(2) or "").strip())
    if completed.returncode == 0:
        return "survived", None, None
    if failure:
        return "killed", failure[0], _first_line(failure[1])
    pytest_like = junit is not None and junit.exists() or _PYTEST_SUMMARY.search(out)
    if pytest_like:
        if completed.returncode == 5:
            return "error", "no tests ran", _tail(out)
        return "error", f"pytest exit status {completed.returncode} with no failing test", _tail(out)
    return "killed", f"exit status {completed.returncode}", _tail(out)


def _first_line(text: str, limit: int = 300) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _compile_excerpt(text: str) -> str:
    errors = [line.strip() for line in text.splitlines() if re.search(r"\berror\b", line) and ".cu" in line]
    return "\n".join(errors[:6]) or _tail(text)


# ---------------------------------------------------------------------------------------------
# The run

CHILD = [sys.executable, "-m", "deepgemm.mutate.child"]   # the compile step's process (JSON request on stdin)


@dataclass
class Settings:
    """How each mutant is judged."""
    test_cmd: list | str | None = None      # None: no tests (static-only)
    builtin_tier: bool = False              # test_cmd is deepgemm's GPU tier (JUnit, --kernels added)
    host_tier: bool = False                 # test_cmd is deepgemm's host tier (the mutated kernels' -k added)
    sanitize_cmd: list | None = None        # run on what the tests leave alive (builtin_sanitize_command)
    compile_check: bool = True              # compile (and static-check) before the tests
    static_archs: list | None = None        # archs the static checks compile for (None: each kernel's)
    variants: str = "static"                # "static": the static checks' variants; "minimal": plain + path switches
    warm_arch: str | None = None            # also compile the quick sweep's variants for this arch
    warm_kernels: list | None = None        # ... of these kernels for the baseline (default: the mutated ones)
    # The same-code check (Runner._same_code): on, the baseline's tests log what they build
    # (DEEPGEMM_BUILD_LOG) into tier_builds, and a mutant whose builds all keep their code is not run.
    same_code: bool = False
    tier_builds: list | None = None
    source: dict | None = None              # a user's kernel: {"path", "archs", "defines"} for the compile
    timeout: float | None = None            # per-mutant limit on the test command (None: from the baseline)
    stall_timeout: float | None = None      # kill when the tests print nothing for this long (a hang)
    # The limits the baseline's own time allows a correct mutant (cli derives them). A stop by a
    # shorter limit, given on the command line, is no evidence of a bug: the mutant is "unfinished".
    fair_timeout: float | None = None
    fair_stall_timeout: float | None = None
    compile_timeout: float = 1800.0
    repo_root: Path = field(default_factory=_package_root)
    log_dir: Path | None = None
    env: dict = field(default_factory=dict)  # extra environment for the tests
    workers: int | None = None
    killers: Killers | None = None          # built-in tier: its earlier killers run first
    # The unmutated sources' code digests per (kernels, mutated file), for the same-code check;
    # shared by the runners of a campaign (their copies hold the same sources).
    baseline_digests: dict = field(default_factory=dict)
    digests_lock: threading.Lock = field(default_factory=threading.Lock)   # guards digest_locks
    digest_locks: dict = field(default_factory=dict)   # one per key: a file's digests never wait on another's
    gate: Gate | None = None                # judge by the benchmark gate instead of the tests (--gate)


@dataclass
class Gate:
    """Performance mutants judged by the benchmark gate. The mutated kernels' benchmarks run on the
    unmutated sources first (the baseline), then on each mutant, on the same GPU within one
    campaign, and the gate's own rule (deepgemm.gate.verdict: against the reference timed in the
    same run, effect floors, Holm-corrected Mann-Whitney U) compares each mutant's run with the
    baseline's. A benchmark found slower runs once more, alone: a mutant is killed only when it is
    slower again, so a one-off outlier on a shared machine is not counted as a kill.

    command(json_path, select, node_ids) -> the benchmark command: a pytest-benchmark JSON written
    to json_path, of the benchmarks pytest's -k `select` picks (None: the node ids given instead)."""
    command: Callable
    select: str | None = None               # -k expression; None: the mutated kernels' names
    rule: object = None                     # deepgemm.gate.verdict.Rule (None: the gate's defaults)
    baseline: object = None                 # the baseline's deepgemm.gate.runs.Run, once measured


class Killers:
    """The tests that have killed mutants in this campaign (a resumed one's included), most kills
    first. The built-in tier runs them before its other tests (`--run-first`), so a mutant that dies
    where others died does so in its first tests instead of after every sweep case before its killer:
    on the H200 a kill in the sweep's first cases took 17-21 s, one by its 180th case 84-105 s.
    Shared by the jobs' runners (a lock)."""

    def __init__(self, limit: int = 32):
        self.limit = limit
        self._counts: dict[str, int] = {}   # insertion order: first kill first, among equal counts
        self._lock = threading.Lock()

    def add(self, killer: str | None) -> None:
        if killer and "::" in killer:   # a test id, not "exit status 1" or a static problem
            with self._lock:
                self._counts[killer] = self._counts.get(killer, 0) + 1

    def first(self) -> list[str]:
        with self._lock:   # a stable sort: equal counts keep the order of their first kill
            return sorted(self._counts, key=self._counts.__getitem__, reverse=True)[:self.limit]


class Workspace:
    """A private copy of the kernel folder (or of a user kernel and its local includes) and a JIT cache for one run."""

    def __init__(self, pristine_dir: Path, root: Path | None = None, keep: bool = False,
                 seed_cache: Path | None = None, files: list[str] | None = None):
        """The mutants compile into a JIT cache in the work folder. seed_cache (the JIT's own
        cache): its entries are hard-linked in first (copied across file systems), so unmutated
        kernels, which hash as the originals do, are not rebuilt. Each mutant's own entries are
        pruned after it, in the work folder only: a shared cache is never pruned, since other
        processes may be compiling into it at the same time (a test run beside a campaign lost
        cubins that way). files: copy only these (relative to pristine_dir) instead of the whole
        folder: a user kernel's folder may hold anything (a repository, a home folder, the
        temporary folder the work folder itself lies in)."""
        self.keep = keep
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="deepgemm-mutate-"))
        self.pristine = Path(pristine_dir).resolve()
        self.kernels = self.root / "src"
        self.cache = self.root / "cache"
        if self.kernels.exists():
            shutil.rmtree(self.kernels)
        if files is None:
            shutil.copytree(self.pristine, self.kernels, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
        else:
            for rel in files:
                (self.kernels / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.pristine / rel, self.kernels / rel)
        self.cache.mkdir(parents=True, exist_ok=True)
        if seed_cache is not None and Path(seed_cache).is_dir():
            for entry in Path(seed_cache).iterdir():
                if entry.suffix in (".json", ".cubin") and not (self.cache / entry.name).exists():
                    try:
                        os.link(entry, self.cache / entry.name)
                    except OSError:
                        try:
                            shutil.copy2(entry, self.cache / entry.name)
                        except OSError:
                            pass   # gone meanwhile (another process's atomic replace): rebuilt if needed

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def cache_entries(self) -> set[str]:
        return {p.name for p in self.cache.iterdir() if p.suffix in (".json", ".cubin")}

    def prune(self, before: set[str], keep_kernels: set[str]) -> None:
        """Remove the cache entries made since `before` except those of kernels in keep_kernels
        (built from unmutated files, so valid for every later mutant too): a mutant's own cubins
        are never used again, and a long run would otherwise fill the disk."""
        for name in self.cache_entries() - before:
            if not name.endswith(".json"):
                continue
            path = self.cache / name
            try:
                kernel = json.loads(path.read_text()).get("name", "").split("[")[0]
            except (OSError, ValueError):
                kernel = ""
            if kernel not in keep_kernels:
                path.unlink(missing_ok=True)
                (self.cache / (name[:-5] + ".cubin")).unlink(missing_ok=True)


class Runner:
    def __init__(self, workspace: Workspace, settings: Settings, users: dict[str, set[str]] | None = None,
                 progress: Callable[[str], None] | None = None, stop: threading.Event | None = None):
        self.ws = workspace
        self.settings = settings
        self.users = users or {}
        self.progress = progress or (lambda line: None)
        self.stop = stop   # set: kill the child running now (its mutant is then not judged)
        self.count = 0

    # -- environment --------------------------------------------------------------------------
    def env(self, mutant: Mutant | None) -> dict:
        env = dict(os.environ)
        env.update(self.settings.env)
        env["DEEPGEMM_CACHE_DIR"] = str(self.ws.cache)
        if self.settings.source:
            original = Path(self.settings.source["path"]).resolve()
            env["DEEPGEMM_MUTANT_ORIGINAL"] = str(original)
            env["DEEPGEMM_MUTANT_SOURCE"] = str(self.ws.kernels / original.name)
        else:
            env["DEEPGEMM_KERNEL_DIR"] = str(self.ws.kernels)
        env.pop("DEEPGEMM_MUTANT_ID", None)
        if mutant is not None:
            env["DEEPGEMM_MUTANT_ID"] = mutant.site_id
            if not self.settings.source:
                env["DEEPGEMM_MUTANT_SOURCE"] = str(self.ws.kernels / mutant.file)
        return env

    # -- steps ----------------------------------------------------------------------------------
    def compile_step(self, kernels: tuple, mutated_file: str | None, warm: bool = True, digests: bool = False,
                     builds: list | None = None, expect: dict | None = None) -> dict:
        """Compile and static-check (the child's reply); warm: also compile the quick sweep's
        variants (Settings.warm_arch) before returning. digests: the reply carries each variant's
        code digest; builds: build only these (logged by the tests; the same-code check's second
        step); expect: label -> digest, stop at the first build that differs (reply "differs")."""
        s = self.settings
        if s.source:
            request = {"source": {"path": str(self.ws.kernels / Path(s.source["path"]).name),
                                  "archs": s.source.get("archs") or ["sm_90a"],
                                  "defines": s.source.get("defines") or {}}}
        else:
            request = {"kernels": static_kernels(kernels), "archs": s.static_archs, "variants": s.variants,
                       "warm_arch": s.warm_arch if warm else None,
                       # The baseline warms every kernel's sweep variants in parallel: the tier also
                       # launches kernels other than the mutated ones (auto picks, the torch tests).
                       "warm_kernels": s.warm_kernels if mutated_file is None else None,
                       "stage_copy": mutated_file is None and "v5" in kernels or mutated_file == "stage_copy.cu"}
            if builds is not None:
                request.update(static=False, warm_arch=None, stage_copy=False, builds=builds)
        request["workers"] = s.workers
        request["digests"] = digests
        if expect is not None:
            request["expect"] = expect
        done = run_process(CHILD, _python_env(self.env(None)),
                           s.repo_root, s.compile_timeout, stdin=json.dumps(request), stop=self.stop)
        if done.timed_out:
            return {"compile_error": {"variant": "all", "log": f"the compile step ran past {s.compile_timeout:g} s"}}
        lines = [line for line in done.output.strip().splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the compile step failed (exit status {done.returncode}):\n{_tail(done.output, 30)}")
        return json.loads(lines[-1])

    def start_warm(self, kernels: tuple, mutant_file: str | None = None) -> subprocess.Popen | None:
        """A mutant's builds compiled in the background while its tests run (None when there are
        none to warm), at the lowest CPU priority: those of the baseline's logged builds that use
        its file (Settings.tier_builds), else the quick sweep's variants. Most mutants die in the sweep's
        first cases, which compile on demand in seconds; warming every variant first took 46 of the
        58 s a killed V5 mutant cost on the H200 machine. A survivor's tests meet the variants the
        warm-up has built."""
        s = self.settings
        if s.source or not s.warm_arch or not s.compile_check:
            return None
        request = {"kernels": list(kernels), "static": False, "warm_arch": s.warm_arch, "workers": s.workers,
                   "low_priority": True}
        if mutant_file is not None and s.tier_builds:
            # Exactly what the baseline's tests built from the mutated file (the sweep's list lacks
            # the configs a named kernel picks by shape, and what the other test files build).
            request.update(warm_arch=None, builds=self._builds_using(mutant_file))
        proc = subprocess.Popen(CHILD, cwd=str(s.repo_root),
                                env=_python_env(self.env(None)), text=True, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.stdin.write(json.dumps(request))
            proc.stdin.close()
        except OSError:   # it died at once; the tests compile what they need
            pass
        return proc

    def stop_warm(self, proc: subprocess.Popen | None) -> None:
        """Kill a warm-up still running (its compiler processes too) and remove the temporary
        files its compiles leave behind."""
        if proc is None:
            return
        from deepgemm import jit   # the cache's owner knows its temporary names
        if proc.poll() is None:
            _kill_group(proc)
        jit.remove_partial_entries(self.ws.cache)

    def test_command(self, kernels: tuple, junit: Path | None, cmd=None):
        s = self.settings
        cmd = s.test_cmd if cmd is None else cmd
        if isinstance(cmd, str):
            return cmd.replace("{kernels}", ",".join(kernels))
        cmd = [c.replace("{kernels}", ",".join(kernels)) for c in cmd]
        if s.host_tier:
            cmd += ["-k", host_selection(kernels)]
        if s.builtin_tier:
            cmd += [f"--kernels={','.join(kernels)}"] + ([f"--junitxml={junit}"] if junit else [])
        return cmd

    def _judge_stop(self, done: Completed, outcome: str, killer, detail):
        """A run stopped by a time limit counts as killed (a hang, or a crawl past 3x the baseline)
        only if the limit was at least what the baseline's time allows a correct mutant; under a
        shorter one it is "unfinished": eight jobs sharing a machine stopped at 300 s, with every
        test so far passed, were correct mutants running slowly, not hangs."""
        s = self.settings
        fair = {"timeout": (s.timeout, s.fair_timeout), "stall": (s.stall_timeout, s.fair_stall_timeout)}
        limit, allowed = fair.get(done.stopped_by, (None, None))
        if outcome == "timeout" and limit is not None and allowed is not None and limit < allowed:
            return ("unfinished", f"{killer}, shorter than the {allowed:g} s the baseline allows: not a kill "
                    "(--resume runs it again)", detail)
        return outcome, killer, detail

    def _write_log(self, mutant: Mutant | None, output: str) -> str | None:
        """The run's output under Settings.log_dir (None when logs are not kept)."""
        if self.settings.log_dir is None:
            return None
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        name = "baseline" if mutant is None else re.sub(r"[^\w.-]+", "_", mutant.site_id)
        path = self.settings.log_dir / f"{name}.log"
        path.write_text(output)
        return str(path)

    def _gate_judge(self, mutant: Mutant | None, kernels: tuple):
        """(outcome, killer, detail, output, seconds) of one benchmark A/B (Settings.gate); the
        baseline's run (mutant None) becomes the reference for every later mutant."""
        from deepgemm.gate import runs, verdict
        s, g = self.settings, self.settings.gate
        env = _python_env({**self.env(mutant), "PYTHONUNBUFFERED": "1"})
        tag = "baseline" if mutant is None else f"mutant-{self.count}"
        # What the baseline's benchmarks build, as the tier logs its tests' builds: a mutant that
        # keeps the machine code of those builds and of the static checks' is reported same-code
        # (the same speed by construction) without a benchmark run.
        build_log = self.ws.root / "builds.jsonl" if mutant is None and s.same_code else None
        if build_log is not None:
            build_log.unlink(missing_ok=True)
            env["DEEPGEMM_BUILD_LOG"] = str(build_log)
        outputs, seconds = [], 0.0

        def bench(name: str, select, node_ids):
            nonlocal seconds
            path = self.ws.root / f"bench-{tag}-{name}.json"
            path.unlink(missing_ok=True)
            done = run_process(g.command(path, select, node_ids), env, s.repo_root, s.timeout, stop=self.stop)
            outputs.append(done.output)
            seconds += done.seconds
            outcome, killer, detail = self._judge_stop(done, *classify(done, None, s.repo_root, s.timeout))
            if outcome == "survived" and not path.is_file():
                outcome, killer, detail = "error", "the benchmarks wrote no JSON", _tail(done.output)
            return outcome, killer, detail, path

        def result(outcome, killer=None, detail=None):
            return outcome, killer, detail, "\n".join(outputs), seconds

        def compare(path):   # ValueError: an unreadable run, or one without the GPU's identity
            return verdict.compare(g.baseline, runs.load_run(path), g.rule or verdict.Rule())

        outcome, killer, detail, path = bench("run", g.select or " or ".join(kernels), None)
        if outcome != "survived":   # a benchmark failed its own check, crashed, or ran past the limit
            return result(outcome, killer, detail)
        try:
            if mutant is None:
                g.baseline = runs.load_run(path)
                if not g.baseline.benchmarks:
                    return result("error", "no benchmark ran", "the selection picked no benchmark")
                runs.check_baseline(g.baseline, g.baseline.key)   # the GPU's identity and raw samples
                if build_log is not None:
                    s.tier_builds = read_build_log(build_log)
                return result("survived")
            report = compare(path)
        except ValueError as exc:
            return result("error", "the gate could not compare the runs", str(exc))
        outputs.append(report.to_text())
        if report.compared == 0:
            return result("error", "no benchmark compared", report.headline())
        if not report.slower:
            return result("survived", None, f"the gate: {report.headline()}")
        first = {v.name for v in report.slower}
        outcome, killer, detail, path = bench("again", None, sorted(first))
        if outcome != "survived":
            return result(outcome, killer, detail)
        try:
            again = compare(path)
        except ValueError as exc:
            return result("error", "the gate could not compare the runs", str(exc))
        outputs.append("---- the slower benchmarks once more ----\n" + again.to_text())
        confirmed = [v for v in again.slower if v.name in first]
        if not confirmed:
            return result("survived", None, f"slower once, not again: {', '.join(sorted(first))}")

        def change(v):
            scale = v.normalised or v.absolute
            return f"{v.base_median * 1e6:.1f} -> {v.cur_median * 1e6:.1f} µs ({scale.change:+.1%})"
        # The killer names the first benchmark, so its numbers lead (a report cell keeps 160 characters).
        others = "".join(f"; {v.name} {change(v)}" for v in confirmed[1:3])
        return result("killed", f"the gate: {confirmed[0].name}",
                      f"{change(confirmed[0])}, {len(confirmed)} slower twice{others}")

    def _builds_using(self, mutated_file: str) -> list:
        """The tests' logged builds whose source is, or includes, the mutated file."""
        found = []
        for build in self.settings.tier_builds or ():
            src = build.get("origin") or build["source"]   # a derived copy: its kernel file (jit.derived_origin)
            if src == mutated_file or mutated_file in includes_of(self.ws.kernels, src):
                found.append(build)
        return found

    def _unmutated_digests(self, kernels: tuple, mutated_file: str) -> tuple[dict, dict, list] | None:
        """(static checks' digests, digests of the tests' builds that use mutated_file, those builds)
        for the unmutated sources; None when no logged build uses the file (the tests never build it:
        nothing to compare, the tests judge). Called while this runner's copy holds no mutant;
        computed once per file and campaign (the JIT cache holds most of these builds already)."""
        s = self.settings
        key = (kernels, mutated_file)
        with s.digests_lock:
            lock = s.digest_locks.setdefault(key, threading.Lock())
        with lock:   # jobs on the same file wait for one computation; jobs on other files go on
            if key not in s.baseline_digests:
                builds = self._builds_using(mutated_file)
                if not builds:
                    s.baseline_digests[key] = None
                else:
                    steps = [self.compile_step(kernels, mutated_file, warm=False, digests=True),
                             self.compile_step(kernels, mutated_file, warm=False, digests=True, builds=builds)]
                    for reply in steps:
                        if reply.get("compile_error") or "digests" not in reply:
                            raise RuntimeError(f"the unmutated sources did not build for the same-code check: "
                                               f"{reply.get('compile_error')}")
                    s.baseline_digests[key] = (steps[0]["digests"], steps[1]["digests"], builds)
            return s.baseline_digests[key]

    def _same_code(self, mutant: Mutant, kernels: tuple, reply: dict, unmutated: tuple):
        """A "same-code" Result when the mutant's static-check builds and then every logged build
        that uses its file keep the unmutated code digest; a did-not-compile Result from that second
        step; else None (the code differs somewhere: the tests judge)."""
        static, built, builds = unmutated
        if reply.get("digests") != static:
            return None
        # Stops at the first build that differs: a mutant the tests can see costs a build or two here.
        second = self.compile_step(kernels, mutant.file, warm=False, builds=builds, expect=built)
        if second.get("compile_error"):
            err = second["compile_error"]
            return Result(mutant, "did-not-compile", err["variant"], err["log"])
        if second.get("differs", "") is not None:
            return None
        return Result(mutant, "same-code", detail=f"the same machine code as the unmutated sources in the "
                      f"{len(static)} static-check builds and all {len(built)} builds of the tests that use "
                      f"{mutant.file}")

    def evaluate(self, mutant: Mutant | None, kernels: tuple | None = None) -> Result:
        """Judge one mutant (None: the unmutated sources, the baseline)."""
        s = self.settings
        kernels = tuple(kernels if kernels is not None else mutant.kernels)
        started = time.monotonic()
        target = self.ws.kernels / (mutant.file if mutant else "")
        original = target.read_text() if mutant else None
        before = self.ws.cache_entries()
        warm = None
        self.count += 1
        same_code = bool(mutant and s.same_code and s.tier_builds and s.compile_check and not s.source)
        try:
            if same_code:
                try:   # before the mutant is written: this copy holds the unmutated sources
                    unmutated = self._unmutated_digests(kernels, mutant.file)
                except RuntimeError as exc:
                    return Result(mutant, "error", "the same-code check failed", str(exc)[-2000:],
                                  time.monotonic() - started)
                same_code = unmutated is not None
            if mutant:
                target.write_text(mutant.apply(original))
            if s.compile_check:
                try:   # a mutant's sweep variants are warmed beside its tests (start_warm)
                    reply = self.compile_step(kernels, mutant.file if mutant else None, warm=mutant is None,
                                              **({"digests": True} if same_code else {}))
                    if same_code and not reply.get("compile_error") and not reply.get("static_problems"):
                        same = self._same_code(mutant, kernels, reply, unmutated)
                        if same is not None:
                            same.seconds = time.monotonic() - started
                            return same
                except RuntimeError as exc:   # the child died (a compiler crash): this mutant only
                    return Result(mutant, "error", "the compile step failed", str(exc)[-2000:],
                                  time.monotonic() - started)
                if reply.get("compile_error"):
                    err = reply["compile_error"]
                    return Result(mutant, "did-not-compile", err["variant"], err["log"], time.monotonic() - started)
                if reply.get("static_problems"):
                    problems = reply["static_problems"]
                    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
                    return Result(mutant, "killed-static", "static checks", problems[0] + more,
                                  time.monotonic() - started)
            if s.gate is not None:
                outcome, killer, detail, output, test_seconds = self._gate_judge(mutant, kernels)
                return Result(mutant, outcome, killer, detail, time.monotonic() - started, test_seconds,
                              self._write_log(mutant, output))
            if s.test_cmd is None:
                return Result(mutant, "passed-static", seconds=time.monotonic() - started)
            junit = self.ws.root / f"junit-{self.count}.xml" if s.builtin_tier else None
            if junit is not None:
                junit.unlink(missing_ok=True)
            env = self.env(mutant)
            build_log = self.ws.root / "builds.jsonl" if mutant is None and s.same_code else None
            if build_log is not None:   # what the baseline's tests build: the same-code check's list
                build_log.unlink(missing_ok=True)
                env["DEEPGEMM_BUILD_LOG"] = str(build_log)
            if mutant is not None:
                warm = self.start_warm(kernels, mutant.file)
            cmd = self.test_command(kernels, junit)
            first = s.killers.first() if s.killers is not None and s.builtin_tier and mutant is not None else []
            if first:
                order = self.ws.root / "run-first.txt"   # this runner's workspace: one mutant at a time
                order.write_text("\n".join(first) + "\n")
                cmd = cmd + [f"--run-first={order}"]
            if s.host_tier:   # this checkout first on the path, as ./test.sh puts it
                env = _python_env({**env, "PYTHONUNBUFFERED": "1"})
            if s.builtin_tier:
                # CI=true: the fuzzing is derandomised with no example database (deepgemm.testing.plugin),
                # so every mutant meets the same examples and a kill reproduces.
                # PYTHONUNBUFFERED: pytest's progress reaches the log as each test ends (the hang check).
                env = _python_env({**env, "CI": "true", "PYTHONUNBUFFERED": "1"})
            done = run_process(cmd, env, s.repo_root, s.timeout, stall=s.stall_timeout, stop=self.stop)
            outcome, killer, detail = self._judge_stop(done, *classify(done, junit, s.repo_root, s.timeout))
            output, test_seconds, slowest = done.output, done.seconds, junit_slowest(junit) if junit is not None else None
            if outcome == "survived" and s.sanitize_cmd:
                # What the outputs cannot show (a read outside an operand whose value is never
                # stored) the sanitizer can: the mutant dies there, or survives both.
                if junit is not None:
                    junit.unlink(missing_ok=True)
                san = run_process(self.test_command(kernels, junit, s.sanitize_cmd), env, s.repo_root, s.timeout,
                                  stall=s.stall_timeout, stop=self.stop)
                outcome, killer, detail = self._judge_stop(san, *classify(san, junit, s.repo_root, s.timeout))
                output += "\n---- compute-sanitizer ----\n" + san.output
                test_seconds += san.seconds
            if outcome == "killed" and mutant is not None and s.killers is not None:
                s.killers.add(killer)
            if build_log is not None and outcome == "survived":
                s.tier_builds = read_build_log(build_log)
            return Result(mutant, outcome, killer, detail, time.monotonic() - started, test_seconds,
                          self._write_log(mutant, output), slowest)
        finally:
            self.stop_warm(warm)
            if mutant:
                target.write_text(original)
                keep = {k for k, files in self.users.items() if mutant.file not in files}
                self.ws.prune(before, keep)


def read_build_log(path: Path) -> list[dict]:
    """The distinct builds a DEEPGEMM_BUILD_LOG file lists (deepgemm.jit writes one JSON line per
    build and process), in a stable order; unreadable lines (a process killed mid-write) are skipped."""
    found = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            build = json.loads(line)
            # A derived copy (jit.derived_origin) by its origin and prefix: each test writes its own.
            source = (build["origin"], build.get("prefix", "")) if build.get("origin") else build["source"]
            key = (build["name"], json.dumps(source), build["arch"], json.dumps(build["defines"], sort_keys=True))
        except (ValueError, KeyError, TypeError):
            continue
        found.setdefault(key, build)
    return [found[k] for k in sorted(found)]


# The plugin's per-test hang limit is off in a mutant's tests: the campaign's own time and silence
# limits (scaled with --jobs, where tests share the GPU and the cores) judge a hang, as documented.
NO_HANG_TIMEOUT = ("--hang-timeout=0",)


def builtin_sanitize_command(repo_root: Path) -> list[str]:
    """compute-sanitizer's memcheck, racecheck and synccheck on the mutated kernels' sanitizer samples
    (tests/gpu/test_sanitize.py; --kernels and JUnit are added as for the tier). racecheck sees a
    shared-memory hazard between two lanes of one warp whose __syncwarp was removed, which a converged
    warp on today's GPUs never turns into a wrong result."""
    test = repo_root / "tests" / "gpu" / "test_sanitize.py"
    if not test.is_file():
        raise FileNotFoundError(f"--sanitize needs the repository's {test.relative_to(repo_root)} (not found under {repo_root})")
    return [sys.executable, "-m", "pytest", str(test.relative_to(repo_root)), "--sanitize", "-x", "-q",
            "-p", "no:cacheprovider", "-o", "addopts=", "-p", "deepgemm.testing.plugin", *NO_HANG_TIMEOUT]


def builtin_bench_command(repo_root: Path):
    """The gate's benchmarks (tests/bench) as Gate.command: pytest-benchmark with the project's
    plugins (the same-run references, raw samples, the GPU's identity), into one JSON file."""
    bench = repo_root / "tests" / "bench"
    if not bench.is_dir():
        raise FileNotFoundError(f"--gate needs the repository's tests/bench (not found under {repo_root})")

    def command(json_path: Path, select: str | None, node_ids: list | None) -> list[str]:
        where = list(node_ids) if select is None else ["tests/bench", "-k", select]
        return [sys.executable, "-m", "pytest", *where, "--benchmark-only", f"--benchmark-json={json_path}",
                "-q", "-p", "no:cacheprovider"]
    return command


HOST_TESTS = ("tests/cpu/test_host_kernels.py", "tests/cpu/test_host_v5.py")


# Host runs of a build that shares a kernel's file but no kernel name selects: V4's f16-accumulator
# build (the accuracy report's fp16acc_mma, DG_ACC_F16 in v4_mma.cu), which the GPU tier's accuracy
# test runs whatever --kernels says. Without it a mutant inside that build's branch survives --host.
HOST_SHARED_FILE_TESTS = {"v4": "f16_accumulator_build"}


def host_selection(kernels) -> str:
    """pytest -k: the host tier's runs of these kernels (each one's quick sweep, and the grouped
    sweep where it has a grouped build; their parameter ids are the kernel names), and the host runs
    of the builds that share their files (HOST_SHARED_FILE_TESTS); not the planted bugs' self-tests."""
    names = " or ".join(f"[{k}]" for k in kernels)
    shared = [HOST_SHARED_FILE_TESTS[k] for k in kernels if k in HOST_SHARED_FILE_TESTS]
    runs = " or ".join([f"((quick_sweep or grouped_sweep) and ({names}))", *shared])
    return f"not planted and ({runs})"


def builtin_host_command(repo_root: Path) -> list[str]:
    """deepgemm's host tier as a mutant's test (--host): the mutated kernels compiled as host C++ and
    run through gemm() under the quick sweep's oracles, stopping at the first failure."""
    missing = [t for t in HOST_TESTS if not (repo_root / t).is_file()]
    if missing:
        raise FileNotFoundError(f"--host needs the repository's {', '.join(missing)} (not found under {repo_root}); "
                                f"pass --test-cmd")
    return [sys.executable, "-m", "pytest", *HOST_TESTS, "-x", "-q", "-p", "no:cacheprovider"]


def builtin_tier_command(repo_root: Path, xdist: int = 0) -> list[str]:
    """deepgemm's GPU tier as a mutant's test: sweep and fuzz first, every other GPU test file after
    (the framework's self-tests left out), stop at the first failure."""
    gpu = repo_root / "tests" / "gpu"
    if not gpu.is_dir():
        raise FileNotFoundError(f"the built-in GPU tier needs the repository's tests/gpu (not found under {repo_root}); "
                                f"pass --test-cmd")
    files = [f for f in FIRST_TESTS if (gpu / f).is_file()]
    files += sorted(p.name for p in gpu.glob("test_*.py") if p.name not in files and p.name not in FRAMEWORK_SELF_TESTS)
    # addopts emptied (none of the project's report options), so deepgemm's plugin is named here.
    cmd = [sys.executable, "-m", "pytest", *[f"tests/gpu/{f}" for f in files], "-x", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "-p", "deepgemm.testing.plugin", *NO_HANG_TIMEOUT]
    if xdist:
        cmd += ["-n", str(xdist)]
    return cmd

"""`python -m deepgemm tune`: measure every candidate (kernel, config) per shape bucket on this GPU
and write the winners to a per-GPU-model table that kernel="auto" then uses (deepgemm.dispatch).

  python -m deepgemm tune --preset models                  # BERT-base, Llama-7B/8B, decode M=1..128
  python -m deepgemm tune --preset demos                   # the seed MLP's and GPT-2's GEMMs (examples/)
  python -m deepgemm tune --shapes 16x14336x4096,1x4096x4096 --dtypes bfloat16
  python -m deepgemm tune --shapes-file my_model.txt --out tuned.json --max-seconds 120
  python -m deepgemm tune --shapes 8192x8192x1024 --epilogue bias+gelu+residual   # the fused buckets

With --epilogue, the jobs carry that epilogue chain and fill the buckets with an epilogue ("epi1"),
which dispatch looks up before the plain ones: a chain can favour another config (e.g. V5's
ping-pong consumers, whose epilogue runs under the other consumer's main loop).

The table (JSON, see deepgemm/tables.py) records the GPU's identity; dispatch applies it only on
the same model, compute capability and SM count. It is rewritten after every measurement through a
temp file and an atomic rename, so an interrupted run leaves a valid table, and a second run
resumes: finished buckets are skipped, half-measured ones keep what they measured ("pending").

Per shape: each candidate kernel's own config for the shape first (its config rule in
deepgemm.dispatch, else its default); then the rest of the config space of the kernels within
`--prune` (default 3x) of the best of those. Cold L2, median of --reps. Each entry records the
full config of every candidate measured ("configs"), so a kernel named without a config can take
its best one for the bucket.

--force measures the buckets again; a bucket's previous pick stays unless the new fastest beats
its new time by more than TUNE_TIE ("kept" in the entry says so), so a re-tune moves only the
picks it can tell apart from one run's noise.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from deepgemm import dispatch, dtypes, registry, tables

# A kernel's config space is explored when its first config is within this factor of the best
# first config. Not less than 3: on the H200 at M = 64, V5's default (256-wide tiles) took 1.5x
# small_m's time while V5's split-K and 64-row configs beat small_m by 1.7-2.2x; a prune of 1.5
# never timed them (docs/performance.md, decode M = 32-128).
DEFAULT_PRUNE = 3.0
# A re-tune (--force) replaces a bucket's pick only with a config more than this much faster than
# the pick's own new time. On the H200, a re-tune moved 16x14336x4096 from 64x128 to 64x64 tiles,
# 33.55 against 33.74 us (0.6 %); the next benchmark recording then timed `auto` there 5.8 % slower
# than before. In that re-tune, at 4096x4096, 64x64 tiles over the whole K and in two parts came within
# -2.7 to +1.9 % of each other per bucket (one median each), so their picks alternated.
TUNE_TIE = 0.02

# Model shapes (M, N, K) for --preset: what tests/bench/test_bench_dispatch.py measures too.
BERT_BASE = {"bert_attn_out": (512, 768, 768), "bert_qkv": (512, 2304, 768), "bert_ffn_up": (512, 3072, 768),
             "bert_ffn_down": (512, 768, 3072), "bert_qk": (512, 512, 64), "bert_pv": (512, 64, 512)}
LLAMA = {"llama_attn": (4096, 4096, 4096), "llama_ffn_up": (4096, 14336, 4096),
         "llama_ffn_down": (4096, 4096, 14336)}
DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128)   # decode batches, up to where V5's 128-row tile is full
DECODE_NK = ((4096, 4096), (14336, 4096), (4096, 14336))
DECODE = {f"decode_m{m}_{n}x{k}": (m, n, k) for m in DECODE_M for n, k in DECODE_NK}
# The demos' GEMMs (examples/): the seed MLP (768 -> 3072 -> 3072 -> 768) at 512 tokens, and GPT-2
# small's four projections at the 1 x 1, 8 x 128 and 4 x 1024 tokens gpt2_block.py times (its Conv1D
# computes x @ W: tune them with --layout rr too).
SEED_MLP = {"seed_mlp_up": (512, 3072, 768), "seed_mlp_mid": (512, 3072, 3072), "seed_mlp_down": (512, 768, 3072)}
GPT2 = {f"gpt2_{name}_{tokens}": (tokens, n, k) for tokens in (1, 1024, 4096)
        for name, (n, k) in (("qkv", (2304, 768)), ("attn_out", (768, 768)), ("fc", (3072, 768)), ("proj", (768, 3072)))}
PRESETS = {"bert": BERT_BASE, "llama": LLAMA, "decode": DECODE, "models": {**BERT_BASE, **LLAMA, **DECODE},
           "demos": {**SEED_MLP, **GPT2}}


def parse_shape(text: str, names: str = "MxNxK", example: str = "16x14336x4096") -> tuple[int, ...]:
    """'16x14336x4096' (or '16 14336 4096', '16*14336*4096') -> (16, 14336, 4096); `names` says how
    many sizes are expected (BxMxNxK: a strided batch), `example` is what the error shows."""
    parts = text.lower().replace("*", "x").replace(",", " ").replace("x", " ").split()
    if len(parts) != names.count("x") + 1 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape {text!r}: expected {names} with positive integers, e.g. {example}")
    return tuple(int(p) for p in parts)


def read_shapes_file(path) -> list[tuple[int, int, int]]:
    """One shape per line, 'MxNxK' or 'M N K'; '#' starts a comment; blank lines are skipped."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                out.append(parse_shape(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
    return out


EPILOGUE_PARTS = ("bias", *registry.ACTIVATIONS, "scale", "residual")


def parse_epilogue(text: str) -> tuple[str, ...]:
    """'bias+gelu+residual' -> ('bias', 'gelu', 'residual'): the parts of the chain to time, at most
    one activation; '' or 'none' -> (). Vectors and the residual take the job's dtype."""
    if text in ("", "none"):
        return ()
    parts = tuple(p.strip() for p in text.split("+"))
    unknown = [p for p in parts if p not in EPILOGUE_PARTS]
    if unknown or len(set(parts)) != len(parts) or sum(p in registry.ACTIVATIONS for p in parts) > 1:
        raise ValueError(f"epilogue {text!r}: parts joined by '+' from {list(EPILOGUE_PARTS)}, each once, at most "
                         f"one activation (e.g. bias+gelu+residual)")
    return tuple(p for p in EPILOGUE_PARTS if p in parts)


def epilogue_chain(parts: tuple[str, ...], dtype: str) -> registry.Epilogue:
    """parse_epilogue's parts as the chain gemm() gets, its vectors and residual in `dtype` (an input
    dtype, any spelling)."""
    dt = dtypes.canonical(dtype, "dtype", registry.INPUT_DTYPES)
    act = next((p for p in parts if p in registry.ACTIVATIONS), None)
    return registry.Epilogue(bias=dt if "bias" in parts else None, activation=act,
                             scale=dt if "scale" in parts else None, residual=dt if "residual" in parts else None)


@dataclass(frozen=True)
class Job:
    m: int
    n: int
    k: int
    dtype: str      # the input (and output) dtype, in any spelling deepgemm.dtypes accepts
    layout: str
    cc: int
    epilogue: tuple = ()   # parse_epilogue's parts; () = a plain GEMM

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype, "dtype", registry.INPUT_DTYPES))

    def chain(self) -> registry.Epilogue:
        return epilogue_chain(self.epilogue, self.dtype)

    def problem(self) -> registry.Problem:
        return dispatch.shape_problem(self.m, self.n, self.k, self.dtype, self.dtype, self.layout,
                                      epilogue=self.chain(), cc=self.cc)

    @property
    def bucket(self) -> str:
        return dispatch.bucket_key(self.problem())

    @property
    def shape(self) -> list:
        return [self.m, self.n, self.k]


def plan(shapes, dtype_list, layout: str, cc: int, epilogue: tuple = ()) -> list[Job]:
    """One job per bucket: the first shape given for a bucket is the one measured. Dtypes in any
    spelling deepgemm.dtypes accepts ('float16', 'bf16', numpy.float16, torch.bfloat16, ...)."""
    jobs, seen = [], set()
    for dtype in dtype_list:
        for m, n, k in shapes:
            job = Job(m, n, k, dtype, layout, cc, epilogue)
            if job.bucket not in seen:
                seen.add(job.bucket)
                jobs.append(job)
    return jobs


def label(spec: registry.KernelSpec, config: dict) -> str:
    diff = {k: v for k, v in config.items() if spec.default_config.get(k) != v}
    return spec.name + ("[" + ",".join(f"{k.removeprefix('DG_')}={v}" for k, v in sorted(diff.items())) + "]"
                        if diff else "")


def candidate_configs(job: Job, kernels=None) -> list[tuple[registry.KernelSpec, list[dict]]]:
    """Per candidate kernel (those "auto" may pick for the job), its default config first, then
    the rest of its config space; `kernels` narrows the set by name."""
    specs, _ = dispatch.candidates(job.problem())
    out = []
    for spec in specs:
        if kernels and spec.name not in kernels:
            continue
        default = spec.config_defines(None)
        rule = dispatch.CONFIG_RULES.get(spec.name)   # the heuristic's config first (small_m: one row block)
        first = rule(job.problem(), dispatch.SM_COUNT_GUESS)[0] if rule else None
        configs = [spec.config_defines(first) if first else default]
        for c in (default, *spec.config_space):
            full = spec.config_defines(c)
            if full not in configs and spec.config_reason(full, job.problem()) is None:
                configs.append(full)
        out.append((spec, configs))
    return out


Timer = Callable[[registry.KernelSpec, dict, Job], float]   # microseconds; raises if it cannot run


class Tuner:
    """Runs jobs against a timer and keeps the table at `path` current after every measurement.

    identity: the GPU's identity (deepgemm.device.identity(); at least name, cc, sm_count).
    timer(spec, config, job) -> microseconds: the real one times gemm() with CUDA events; tests
    inject a fake. clock: seconds, for --max-seconds. progress(done, total, text): a callback."""

    def __init__(self, path, identity: dict, timer: Timer, *, kernels=None, prune: float = DEFAULT_PRUNE,
                 max_seconds: float | None = None, clock=time.monotonic, progress=None, log=None):
        self.path, self.identity, self.timer = Path(path), dict(identity), timer
        self.kernels, self.prune, self.max_seconds = kernels, prune, max_seconds
        self.clock, self.progress, self.log = clock, progress, log or (lambda msg: None)
        self.table = self._load()

    def _load(self) -> dict:
        fresh = {"format": tables.FORMAT, "gpu": self.identity, "entries": {}, "pending": {}}
        table, why = tables.read(self.path)
        if table is None:
            if why != "no file":
                self.log(f"starting a new table: {self.path} is {why}")
            return fresh
        mismatch = tables.mismatch(table["gpu"], self.identity)
        if mismatch:
            self.log(f"starting a new table: {self.path} was {mismatch}")
            return fresh
        table.setdefault("pending", {})
        table["gpu"] = self.identity
        return table

    def save(self) -> None:
        self.table["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        tables.write(self.path, self.table)

    def forget(self, jobs: list[Job]) -> None:
        """Drop the jobs' buckets so that run() measures them again (--force), each remembering its
        pick ("previous", in pending: an interrupted re-tune resumes with it) for TUNE_TIE."""
        for job in jobs:
            entry = self.table["entries"].pop(job.bucket, None)
            if entry is not None:
                pending = self.table["pending"].setdefault(job.bucket, {"shape": job.shape, "measured": {}})
                pending["previous"] = entry.get("label")
        self.save()

    def done(self, job: Job) -> bool:
        entry = self.table["entries"].get(job.bucket)
        return entry is not None and entry.get("shape") == job.shape

    def run(self, jobs: list[Job]) -> dict:
        """Measure what is not measured yet; return the counts of buckets tuned ("done"), already
        in the table ("skipped"), not reached in the time budget ("left") and measured with no
        candidate that ran ("failed": no entry, so a later run tries them again)."""
        start = self.clock()
        todo = [j for j in jobs if not self.done(j)]
        stats = {"done": 0, "skipped": len(jobs) - len(todo), "left": 0, "failed": 0}
        for i, job in enumerate(todo):
            if self.max_seconds is not None and self.clock() - start > self.max_seconds:
                stats["left"] = len(todo) - i
                self.log(f"time budget of {self.max_seconds:.0f} s used up: {stats['left']} bucket(s) left; "
                         f"run again to resume")
                break
            if not self._tune(job, start):
                stats["left"] = len(todo) - i
                break
            entry = self.table["entries"].get(job.bucket)
            stats["done" if entry else "failed"] += 1
            if self.progress:
                text = f"{entry['label']} {entry['us']:.1f} us" if entry else "no candidate ran"
                self.progress(i + 1, len(todo), f"{job.bucket}: {text}")
        return stats

    def _measure(self, job, spec, config, measured: dict) -> float | None:
        key = label(spec, config)
        if key not in measured:
            try:
                measured[key] = round(float(self.timer(spec, config, job)), 3)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:   # a variant that fails to compile or launch is out, not fatal
                measured[key] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            self.save()
        value = measured[key]
        return value if isinstance(value, float) else None

    def _tune(self, job: Job, start: float) -> bool:
        """Measure one job; False if the time budget ran out in the middle (pending kept)."""
        pending = self.table["pending"].setdefault(job.bucket, {"shape": job.shape, "measured": {}})
        if pending.get("shape") != job.shape:
            pending.update(shape=job.shape, measured={})
        measured = pending["measured"]
        plan_ = candidate_configs(job, self.kernels)
        best_default = {}
        for spec, configs in plan_:                                  # phase 1: defaults
            if self._over_budget(start):
                return False
            us = self._measure(job, spec, configs[0], measured)
            if us is not None:
                best_default[spec.name] = us
        if not best_default:
            self.log(f"{job.bucket}: no candidate ran")
            self.table["pending"].pop(job.bucket, None)
            return True
        floor = min(best_default.values())
        for spec, configs in plan_:                                  # phase 2: configs of the contenders
            if spec.name in best_default and best_default[spec.name] <= self.prune * floor:
                for config in configs[1:]:
                    if self._over_budget(start):
                        return False
                    self._measure(job, spec, config, measured)
        results = [(us, spec, config) for spec, configs in plan_ for config in configs
                   if isinstance(us := measured.get(label(spec, config)), float)]
        us, spec, config = fastest = min(results, key=lambda r: r[0])
        kept = {}
        previous = next((r for r in results if label(r[1], r[2]) == pending.get("previous")), None)
        if previous is not None and previous is not fastest and previous[0] <= fastest[0] * (1 + TUNE_TIE):
            us, spec, config = previous
            kept = {"kept": {"fastest": label(fastest[1], fastest[2]), "us": fastest[0],
                             "why": f"the previous pick, within {TUNE_TIE:.0%} of the fastest"}}
        configs = {label(s, c): c for s, cs in plan_ for c in cs if label(s, c) in measured}
        self.table["entries"][job.bucket] = {"kernel": spec.name, "config": config, "label": label(spec, config),
                                             "shape": job.shape, "dtype": job.dtype, "layout": job.layout,
                                             **({"epilogue": "+".join(job.epilogue)} if job.epilogue else {}),
                                             "us": us, "candidates": dict(measured), "configs": configs, **kept}
        self.table["pending"].pop(job.bucket, None)
        self.save()
        return True

    def _over_budget(self, start) -> bool:
        return self.max_seconds is not None and self.clock() - start > self.max_seconds


# ---------------------------------------------------------------------------------------------
# The real timer (CuPy, CUDA events, cold L2)

class DeviceTimer:
    """Times deepgemm.gemm() for a job: operands made once per job (random normal, never zeros),
    the layout as the job says (B column-major = x @ w.T), cold L2, median of `reps`."""

    def __init__(self, reps: int = 10, warmup: int = 2):
        self.reps, self.warmup = reps, warmup
        self._ops = {}

    def operands(self, job: Job):
        if job not in self._ops:
            import cupy
            import numpy as np
            from deepgemm.reference import NUMPY_DTYPES
            self._ops.clear()   # one job's operands at a time
            rng = np.random.default_rng(0)
            dt = NUMPY_DTYPES[job.dtype]

            def mat(rows, cols, row_major):
                shape = (rows, cols) if row_major else (cols, rows)
                x = cupy.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt)
                return x if row_major else x.T
            a = mat(job.m, job.k, job.layout[0] == "r")
            b = mat(job.k, job.n, job.layout[1] == "r")
            chain = job.chain()
            kw = {"activation": chain.activation}
            if chain.bias:
                kw["bias"] = mat(1, job.n, True)[0]
            if chain.scale:
                kw["scale"] = mat(1, job.n, True)[0]
            if chain.residual:
                kw.update(c=mat(job.m, job.n, True), beta=1.0)
            self._ops[job] = (a, b, cupy.empty((job.m, job.n), dtype=dt), kw)
        return self._ops[job]

    def __call__(self, spec, config, job) -> float:
        from deepgemm import bench, gemm
        a, b, out, kw = self.operands(job)
        return bench.time_device(lambda: gemm(a, b, kernel=spec.name, config=config, out=out, **kw),
                                 warmup=self.warmup, reps=self.reps).median


def precompile(jobs, kernels, arch: str, log=print) -> None:
    """Compile every variant the jobs will time, in parallel, before any timing starts."""
    from deepgemm import jit
    todo, seen = [], set()
    for job in jobs:
        for spec, configs in candidate_configs(job, kernels):
            for config in configs:
                key = (spec.name, job.dtype, job.layout, job.epilogue, tuple(sorted(config.items())))
                if key not in seen:
                    seen.add(key)
                    todo.append(lambda s=spec, j=job, c=config: _compile_quietly(s, arch, j, c))
    log(f"compiling {len(todo)} variants for {arch} ...")
    jit.compile_many(todo)


def _compile_quietly(spec, arch, job, config):
    try:
        return registry.compile_variant(spec, arch, job.dtype, job.dtype, job.layout[0] == "r",
                                        job.layout[1] == "r", job.chain(), config)
    except Exception as exc:   # the timer records the failure for this candidate
        return exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `python -m deepgemm tune` options."""
    from deepgemm import cli
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--shapes", type=_shapes, action="extend", default=None,
                        help="comma-separated MxNxK list, e.g. 1x4096x4096,16x14336x4096")
    parser.add_argument("--shapes-file", default=None, help="a file of shapes, one 'MxNxK' or 'M N K' per line")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="built-in model shapes (default when no shapes are given: models)")
    parser.add_argument("--dtypes", type=cli.comma_list(registry.INPUT_DTYPES, "dtype(s)"), default=None,
                        help="input dtypes to tune, comma-separated (default: all of "
                             f"{','.join(registry.INPUT_DTYPES)})")
    parser.add_argument("--epilogue", type=epilogue_argument, default=(),
                        help="time this epilogue chain, e.g. bias+gelu+residual (parts: "
                             f"{'+'.join(EPILOGUE_PARTS)}), filling the buckets with an epilogue")
    parser.add_argument("--layout", default="rc", choices=("rr", "rc", "cr", "cc"),
                        help="A then B, r = row-major (default rc: x @ w.T with an nn.Linear weight)")
    parser.add_argument("--kernels", type=cli.kernel_names(), action="extend", default=None,
                        help="only these candidate kernels (comma-separated; default: every candidate)")
    parser.add_argument("--out", default=None, help="table path (default: the user cache for this GPU model)")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop after this long (resumable)")
    parser.add_argument("--reps", type=cli.positive_int, default=10, help="timed repetitions per candidate (median)")
    parser.add_argument("--prune", type=float, default=DEFAULT_PRUNE,
                        help="explore the config space of kernels whose default is within this factor of the best")
    parser.add_argument("--force", action="store_true",
                        help="re-measure buckets already in the table (a bucket's previous pick stays unless the new "
                             f"fastest beats it by more than {TUNE_TIE * 100:g}%%)")


def epilogue_argument(text: str) -> tuple[str, ...]:
    """parse_epilogue as an argparse type (here and in `python -m deepgemm explain`)."""
    try:
        return parse_epilogue(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shape_argument(text: str) -> tuple[int, int, int]:
    """parse_shape as an argparse type."""
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shapes(text: str) -> list[tuple[int, int, int]]:
    return [shape_argument(s) for s in text.split(",") if s.strip()]


def requested_shapes(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """What `tune` measures: --shapes, then --shapes-file's, then --preset's; the models preset
    when none of the three is given."""
    from deepgemm import cli
    shapes = list(args.shapes or ())
    if args.shapes_file:
        try:
            shapes += read_shapes_file(args.shapes_file)
        except (OSError, ValueError) as exc:
            raise cli.UsageError(f"--shapes-file: {exc}") from None
    if args.preset or not shapes:
        shapes += list(PRESETS[args.preset or "models"].values())
    return shapes


def run(args: argparse.Namespace) -> int:
    from deepgemm import cli
    shapes = requested_shapes(args)
    dtypes = args.dtypes or list(registry.INPUT_DTYPES)
    kernels = args.kernels

    from deepgemm import device
    ok, why = device.gpu_available()
    if not ok:
        print(f"tune needs a GPU: {why}", file=sys.stderr)
        return 2
    identity = device.identity()
    cc = device.compute_capability(device.current())
    path = Path(args.out) if args.out else tables.user_dir() / tables.file_name(identity["name"])
    jobs = plan(shapes, dtypes, args.layout, cc, args.epilogue)
    bar = None

    def progress(done, total, text):
        nonlocal bar
        bar = bar or cli.Progress(total, "tune: buckets")
        bar.update(done, text)

    tuner = Tuner(path, identity, DeviceTimer(reps=args.reps), kernels=kernels, prune=args.prune,
                  max_seconds=args.max_seconds, progress=progress,
                  log=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.force:
        tuner.forget(jobs)
    todo = [j for j in jobs if not tuner.done(j)]
    print(f"tuning {len(todo)} of {len(jobs)} bucket(s) on {identity['name']} into {path}", file=sys.stderr)
    precompile(todo, kernels, device.arch_for_cc(cc), log=lambda m: print(m, file=sys.stderr, flush=True))
    stats = tuner.run(jobs)
    if bar is not None:
        bar.close()
    dispatch.reload_tables()
    failed = f", {stats['failed']} where no candidate ran" if stats["failed"] else ""
    print(f"tune: {stats['done']} tuned, {stats['skipped']} already in the table, {stats['left']} left{failed} -> {path}")
    for job in jobs:
        e = tuner.table["entries"].get(job.bucket)
        if e:
            print(f"  {job.bucket:45} {e['label']:40} {e['us']:9.1f} us")
    return 0


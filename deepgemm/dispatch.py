"""Which kernel and config run a given problem: the one place that holds selection heuristics.

A named kernel is validated here (exists, runs on this GPU, takes these inputs, accumulates as
asked, supports() the problem); "auto" picks from the candidates, i.e. the public "gemm" kernels
that run on the device's compute capability, take the input dtype and whose supports(problem)
is None:
  1. a tuned entry for the problem's shape bucket, from the per-GPU-model tables (the user's,
     written by `python -m deepgemm tune`, over the one shipped in deepgemm/configs/), if it names a
     candidate and was recorded on this GPU model (name, compute capability, SM count);
  2. else the heuristic below: small_m for M <= 64 (a weight stream), else the preferred large
     kernel (v5 on Hopper, which stages operands TMA cannot read; else v4, ...), with v4's
     smallest tile when 128x128 tiles cannot fill the GPU.
Decisions are cached in memory by everything that can change them (exact shape, dtypes, layout,
the operands' 16-byte alignment classes, epilogue, compute capability, device), so a repeated call
costs one dict lookup. deepgemm.explain() prints the bucket, the candidates, the choice and why.

accumulate="fp32" (the default) is the ladder: purpose "gemm" kernels only. accumulate="fp16"
selects the accuracy report's FP16-accumulating variants (registry purpose "report"): "auto"
means fp16acc_mma, which takes fp16 inputs only; fp16acc_simt must be named (with bf16 inputs it
accumulates in bf16, the 16-bit format of its inputs).
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from deepgemm import registry

# Heuristic order for large problems: the first candidate in this list wins.
AUTO_PREFERENCE = ("v5", "v4", "v3", "v2", "v1", "v0")
ACCUMULATE = ("fp32", "fp16")
# kernel="auto" with accumulate="fp16": the tensor-core variant (what the accuracy report measures).
FP16_AUTO = "fp16acc_mma"

# small_m's row blocks (16 * DG_SM_MT rows) re-stream B, so one row block should cover M.
SMALL_M = "small_m"
SMALL_M_CONFIGS = ((16, {"DG_SM_NT": 2, "DG_SM_MT": 1, "DG_SM_WARPS": 8, "DG_SM_UNROLL": 4}),
                   (32, {"DG_SM_NT": 2, "DG_SM_MT": 2, "DG_SM_WARPS": 8, "DG_SM_UNROLL": 2}),
                   (64, {"DG_SM_NT": 2, "DG_SM_MT": 4, "DG_SM_WARPS": 8, "DG_SM_UNROLL": 1}))
SM_COUNT_GUESS = 132   # only for "does a 128x128 grid fill the GPU" in the heuristic

# Shape buckets: powers of two rounded up, clamped (M: 1 .. 16384, N and K: 16 .. 65536).
M_CLASS_RANGE = (1, 16384)
NK_CLASS_RANGE = (16, 65536)

TABLE_FORMAT = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "configs"


def check_accumulate(accumulate) -> str:
    if accumulate not in ACCUMULATE:
        raise ValueError(f"accumulate: must be one of {ACCUMULATE}, got {accumulate!r}")
    return accumulate


# ---------------------------------------------------------------------------------------------
# Buckets

def size_class(x: int, lo: int, hi: int) -> int:
    """The smallest power of two >= x, clamped to [lo, hi]."""
    c = 1 << max(0, int(x) - 1).bit_length()
    return min(max(c, lo), hi)


def bucket_key(problem: registry.Problem) -> str:
    """Coarse and human-readable: 'm16.n16384.k4096.float16.rc.epi0.sm90'. The epilogue only
    counts as present or not (its cost is the same for every kernel, to first order)."""
    epi = int(problem.epilogue != registry.NO_EPILOGUE)
    return (f"m{size_class(problem.m, *M_CLASS_RANGE)}.n{size_class(problem.n, *NK_CLASS_RANGE)}"
            f".k{size_class(problem.k, *NK_CLASS_RANGE)}.{problem.in_dtype}.{problem.layout}.epi{epi}.sm{problem.cc}")


# ---------------------------------------------------------------------------------------------
# Tuned tables: {"format": 1, "gpu": {"name", "cc", "sm_count", ...}, "entries": {bucket: entry}},
# entry = {"kernel", "config", "shape": [m, n, k], "us", "candidates": {label: us}}.

def gpu_slug(name: str) -> str:
    from deepgemm.bench import gpu_slug as slug
    return slug(name)


def user_dir() -> Path:
    """Where `python -m deepgemm tune` writes by default ($DEEPGEMM_TUNED_DIR, else the cache dir's
    'tuned' folder: $DEEPGEMM_CACHE_DIR or ~/.cache/deepgemm)."""
    env = os.environ.get("DEEPGEMM_TUNED_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("DEEPGEMM_CACHE_DIR", Path.home() / ".cache" / "deepgemm")) / "tuned"


def table_paths(gpu_name: str) -> list[tuple[str, Path]]:
    """(origin, path), lowest precedence first: the shipped default, then the user's."""
    return [("shipped", SHIPPED_DIR / f"{gpu_slug(gpu_name)}.json"),
            ("user", user_dir() / f"{gpu_slug(gpu_name)}.json")]


def identity_matches(recorded: dict, identity: dict) -> str | None:
    """Why a table recorded on `recorded` must not be used on `identity` (None: it may).
    Driver and clocks do not matter; the model, compute capability and SM count do."""
    for key in ("name", "cc", "sm_count"):
        if str(recorded.get(key)) != str(identity.get(key)):
            return f"recorded on {key}={recorded.get(key)!r}, this GPU has {identity.get(key)!r}"
    return None


def read_table(path: Path) -> tuple[dict | None, str | None]:
    """(table, None) or (None, why it is unusable): missing, unreadable, corrupted, wrong format."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None, "no file"
    except OSError as exc:
        return None, f"unreadable ({exc})"
    try:
        table = json.loads(text)
    except ValueError as exc:
        return None, f"corrupted JSON ({exc})"
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT \
            or not isinstance(table.get("gpu"), dict) or not isinstance(table.get("entries"), dict):
        return None, f"not a format-{TABLE_FORMAT} deepgemm tuning table"
    return table, None


@dataclass
class Tables:
    """The tuned entries that apply to one device, merged (user over shipped), and what happened
    to each file (for explain)."""
    identity: dict | None
    entries: dict = field(default_factory=dict)     # bucket -> (entry, origin, path)
    notes: list = field(default_factory=list)


def load_tables(identity: dict | None) -> Tables:
    tables = Tables(identity)
    if not identity or not identity.get("name"):
        tables.notes.append("GPU model unknown: heuristics only")
        return tables
    for origin, path in table_paths(identity["name"]):
        table, why = read_table(path)
        if table is None:
            tables.notes.append(f"{origin} table {path}: {why}")
            if why != "no file":
                warnings.warn(f"deepgemm: ignoring tuning table {path}: {why}", RuntimeWarning, stacklevel=3)
            continue
        mismatch = identity_matches(table["gpu"], identity)
        if mismatch:
            tables.notes.append(f"{origin} table {path}: not applied, {mismatch}")
            continue
        n = 0
        for bucket, entry in table["entries"].items():
            if isinstance(entry, dict) and isinstance(entry.get("kernel"), str) \
                    and isinstance(entry.get("config") or {}, dict):
                tables.entries[bucket] = (entry, origin, path)
                n += 1
        tables.notes.append(f"{origin} table {path}: {n} entries")
    return tables


def device_identity(device: int) -> dict | None:
    """Name, compute capability and SM count of a CUDA device (None without a GPU)."""
    try:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(device)
        name = props["name"]
        return {"name": name.decode() if isinstance(name, bytes) else str(name),
                "cc": f"{props['major']}.{props['minor']}", "sm_count": props["multiProcessorCount"]}
    except Exception:
        return None


_tables: dict = {}
_lock = threading.Lock()


def tables_for(device) -> Tables:
    """The tuned tables of a device (loaded once per device; reload_tables() forgets them)."""
    t = _tables.get(device)
    if t is None:
        with _lock:
            t = _tables.get(device)
            if t is None:
                t = _tables[device] = load_tables(device_identity(device) if device is not None else None)
    return t


def reload_tables() -> None:
    """Forget loaded tables and cached decisions (after a tune run, or in tests)."""
    with _lock:
        _tables.clear()
        _cache.clear()


# ---------------------------------------------------------------------------------------------
# Decisions

@dataclass
class Decision:
    spec: registry.KernelSpec
    config: dict
    source: str                   # "tuned", "heuristic", "named", "fp16"
    why: str
    bucket: str = ""
    candidates: tuple = ()
    rejected: dict = field(default_factory=dict)   # name -> reason


def candidates(problem: registry.Problem) -> tuple[list[registry.KernelSpec], dict]:
    """The kernels "auto" may pick for this problem, and why each other public kernel may not."""
    ok, rejected = [], {}
    for spec in registry.specs():
        if spec.min_cc > problem.cc:
            rejected[spec.name] = f"needs compute capability >= {spec.min_cc / 10:.1f}"
        elif problem.in_dtype not in spec.input_dtypes:
            rejected[spec.name] = f"takes {'/'.join(spec.input_dtypes)} only"
        else:
            reason = spec.supports(problem)
            if reason is None:
                ok.append(spec)
            else:
                rejected[spec.name] = reason
    return ok, rejected


def small_m_config(m: int) -> dict | None:
    for limit, cfg in SMALL_M_CONFIGS:
        if m <= limit:
            return dict(cfg)
    return None


def heuristic(problem: registry.Problem, names) -> tuple[str, dict | None, str]:
    """(kernel, config or None for its default, the rule) among candidate names."""
    if SMALL_M in names and small_m_config(problem.m) is not None:
        return SMALL_M, small_m_config(problem.m), (f"M={problem.m} <= {registry.SMALL_M_MAX}: the GEMM is a "
                                                    f"weight stream, small_m keeps every SM loading B")
    for name in AUTO_PREFERENCE:
        if name in names:
            if name == "v4":
                tiles = -(-problem.m // 128) * -(-problem.n // 128)
                if tiles < SM_COUNT_GUESS:
                    small = min(registry.get("v4").config_space, key=lambda c: c["DG_BM"] * c["DG_BN"], default=None)
                    if small is not None:
                        return name, dict(small), (f"{tiles} tiles of 128x128 cannot fill ~{SM_COUNT_GUESS} SMs: "
                                                   f"v4 with its smallest tile")
            return name, None, f"the preferred kernel among the candidates (order {', '.join(AUTO_PREFERENCE)})"
    return names[0], None, "the only kind of candidate left"


def _lookup_keys(bucket: str) -> list[str]:
    """The bucket itself, then the nearest tuned stand-ins: without the epilogue (same data movement
    plus a per-element tail), then the other 16-bit input dtype (same bytes, same tensor-core rate)."""
    m, n, k, dtype, layout, epi, cc = bucket.split(".")
    other = {"float16": "bfloat16", "bfloat16": "float16"}.get(dtype, dtype)
    keys = [bucket, f"{m}.{n}.{k}.{dtype}.{layout}.epi0.{cc}", f"{m}.{n}.{k}.{other}.{layout}.{epi}.{cc}",
            f"{m}.{n}.{k}.{other}.{layout}.epi0.{cc}"]
    return list(dict.fromkeys(keys))


def _valid_tuned(entry: dict, spec_by_name: dict, problem: registry.Problem) -> str | None:
    spec = spec_by_name.get(entry["kernel"])
    if spec is None:
        return f"names {entry['kernel']!r}, not a candidate for this problem"
    try:
        return spec.config_supports(spec.config_defines(entry.get("config") or None), problem)
    except ValueError as exc:
        return str(exc)


def decide(problem: registry.Problem, device=None) -> Decision:
    """kernel="auto", accumulate="fp32", uncached: the full reasoning (explain() prints it)."""
    ok, rejected = candidates(problem)
    if not ok:
        raise ValueError(f"kernel: no registered kernel runs this problem on compute capability "
                         f"{problem.cc / 10:.1f}: " + "; ".join(f"{k}: {v}" for k, v in rejected.items()))
    by_name = {s.name: s for s in ok}
    bucket = bucket_key(problem)
    entries = tables_for(device).entries
    note = ""
    for key in _lookup_keys(bucket):
        hit = entries.get(key)
        if hit is None:
            continue
        entry, origin, path = hit
        bad = _valid_tuned(entry, by_name, problem)
        if bad is None:
            spec = by_name[entry["kernel"]]
            shape = "x".join(str(x) for x in entry.get("shape", ())) or "?"
            us = entry.get("us")
            return Decision(spec, spec.config_defines(entry.get("config") or None), "tuned",
                            f"{origin} table {path}: bucket {key}, tuned at {shape}"
                            + (f", {us:.1f} us" if isinstance(us, (int, float)) else ""),
                            bucket, tuple(by_name), rejected)
        note += f" (tuned entry {key} ignored: {bad})"
    name, cfg, rule = heuristic(problem, list(by_name))
    spec = by_name[name]
    return Decision(spec, spec.config_defines(cfg), "heuristic", rule + note, bucket, tuple(by_name), rejected)


def _named(problem: registry.Problem, kernel, config, accumulate) -> Decision:
    in_dtype, cc = problem.in_dtype, problem.cc
    if not isinstance(kernel, str):
        raise TypeError(f"kernel: expected a kernel name or 'auto', got {type(kernel).__name__}")
    spec = registry.get(kernel)
    if spec.accumulation != accumulate:
        raise ValueError(f"accumulate: kernel {kernel!r} accumulates in {spec.accumulation}, but "
                         f"accumulate={accumulate!r}; pass accumulate={spec.accumulation!r} to run it")
    if in_dtype is not None and in_dtype not in spec.input_dtypes:
        raise TypeError(f"kernel: {kernel!r} takes {'/'.join(spec.input_dtypes)} inputs only, got "
                        f"{in_dtype}" + (" (there is no bf16 mma with an f16 accumulator)"
                                         if spec.accumulation == "fp16" else ""))
    if spec.min_cc > cc:
        raise ValueError(f"kernel: {kernel!r} needs compute capability >= {spec.min_cc / 10:.1f}, "
                         f"this GPU has {cc / 10:.1f}")
    reason = spec.supports(problem)
    if reason is not None:
        raise ValueError(f"kernel: {kernel!r} cannot run this problem: {reason}")
    if config is None and kernel == SMALL_M:   # its default covers 16 rows; more would re-stream B
        config = small_m_config(problem.m)
    cfg = spec.config_defines(config)
    reason = spec.config_supports(cfg, problem)
    if reason is not None:
        raise ValueError(f"config: {reason} (kernel {kernel!r})")
    return Decision(spec, cfg, "named", "named by the caller")


def _fp16_auto(problem: registry.Problem) -> Decision:
    spec = registry.get(FP16_AUTO)
    if problem.in_dtype not in spec.input_dtypes:
        raise TypeError(f"accumulate: 'fp16' with {problem.in_dtype} inputs: {FP16_AUTO} takes "
                        f"{'/'.join(spec.input_dtypes)} only (there is no bf16 mma with an f16 "
                        f"accumulator); kernel='fp16acc_simt' accumulates {problem.in_dtype} inputs in "
                        f"{problem.in_dtype} on CUDA cores")
    if spec.min_cc > problem.cc:
        raise ValueError(f"accumulate: 'fp16' needs compute capability >= {spec.min_cc / 10:.1f} "
                         f"({FP16_AUTO}), this GPU has {problem.cc / 10:.1f}")
    return Decision(spec, spec.config_defines(None), "fp16",
                    "the FP16-accumulating variant of the accuracy report (accumulate='fp16')")


def _operand_class(mat):
    """What supports() may look at beyond the shape: layout and 16-byte alignment of base and ld."""
    if mat is None:
        return None
    return (mat.row_major, mat.ptr & 15 == 0, mat.ld & 7 == 0, mat.device)


_cache: dict = {}


def cache_key(problem: registry.Problem, kernel, config, accumulate) -> tuple:
    return (problem.m, problem.n, problem.k, problem.in_dtype, problem.out_dtype,
            _operand_class(problem.a), _operand_class(problem.b), problem.epilogue, problem.cc,
            kernel, None if config is None else tuple(sorted(config.items())), accumulate,
            len(registry._REGISTRY))


def _decide_any(problem, kernel, config, accumulate) -> Decision:
    check_accumulate(accumulate)
    if kernel == "auto" and config is not None:
        raise ValueError("config: only meaningful with a named kernel (kernel='auto' picks its own)")
    if kernel == "auto" and accumulate == "fp16":
        return _fp16_auto(problem)
    if kernel == "auto":
        return decide(problem, problem.a.device if problem.a is not None else None)
    return _named(problem, kernel, config, accumulate)


def choose(problem: registry.Problem, *, kernel="auto", config=None, accumulate="fp32"):
    """Return (KernelSpec, config dict) for the problem; raise ValueError/TypeError naming `kernel`
    or `accumulate` if impossible. The returned config is shared: do not modify it."""
    try:
        key = cache_key(problem, kernel, config, accumulate)
        hit = _cache.get(key)
    except TypeError:   # an unhashable kernel/config value: let the checks below name it
        key = hit = None
    if hit is not None and registry._REGISTRY.get(hit[0].name) is hit[0]:
        return hit
    d = _decide_any(problem, kernel, config, accumulate)
    result = (d.spec, d.config)
    if key is not None:
        _cache[key] = result
    return result


def clear_cache() -> None:
    _cache.clear()


# ---------------------------------------------------------------------------------------------
# explain

def _shape_only_operands(m, n, k, layout, device):
    """Matrix descriptions with aligned pointers and tight leading dimensions, for explain()."""
    from deepgemm.arrays import Matrix
    a_row, b_row = layout[0] == "r", layout[1] == "r"
    a = Matrix(0, m, k, "", a_row, max(k if a_row else m, 1), device)
    b = Matrix(0, k, n, "", b_row, max(n if b_row else k, 1), device)
    return a, b


def _current_device():
    try:
        import cupy
        if cupy.cuda.is_available():
            return cupy.cuda.Device().id
    except Exception:
        pass
    return None


def explain(m, n, k, in_dtype="float16", cc=None, *, out_dtype=None, layout="rc", epilogue=None,
            kernel="auto", config=None, accumulate="fp32", device="current") -> str:
    """What gemm() would run for an M x N x K problem, and why: the shape bucket, the tuned tables
    found for this GPU, the candidates (and why others are out), the choice and its source.

    layout: 'rc' (A row-major, B column-major: x @ w.T, the default), 'rr', 'cr', 'cc'; operands
    are taken as 16-byte aligned. epilogue: None, True (some epilogue) or a registry.Epilogue.
    cc: compute capability as an int (90); default the current GPU's, else 90. device: a device id,
    "current" (the current GPU, if any) or None (no GPU: heuristics only)."""
    if device == "current":
        device = _current_device()
    if cc is None:
        ident = device_identity(device) if device is not None else None
        cc = int(ident["cc"].replace(".", "")) if ident else 90
    if layout not in ("rr", "rc", "cr", "cc"):
        raise ValueError(f"layout: one of 'rr', 'rc', 'cr', 'cc' (A then B, r = row-major), got {layout!r}")
    if epilogue is True:
        epilogue = registry.Epilogue(bias=in_dtype)
    a, b = _shape_only_operands(m, n, k, layout, device)
    problem = registry.Problem(m, n, k, in_dtype, out_dtype or in_dtype, a, b, epilogue or registry.NO_EPILOGUE, cc)
    d = _decide_any(problem, kernel, config, accumulate)
    lines = [f"{m}x{n}x{k} {in_dtype}->{problem.out_dtype} layout {layout} epilogue {problem.epilogue} on sm_{cc}"
             + (f", device {device}" if device is not None else ", no GPU (heuristics only)")]
    if d.source in ("tuned", "heuristic"):
        lines.append(f"  bucket:     {d.bucket}")
        for note in tables_for(device).notes:
            lines.append(f"  table:      {note}")
        lines.append(f"  candidates: {', '.join(d.candidates)}")
        for name, why in d.rejected.items():
            lines.append(f"  not {name}: {why}")
    lines.append(f"  chosen:     {d.spec.name} ({d.spec.summary}) config {d.config}")
    lines.append(f"  why:        {d.source}: {d.why}")
    return "\n".join(lines)

"""Tuned tables: where they live, how they are read, checked, matched to a GPU and written.
Used by dispatch (kernel="auto" and named kernels without a config) and the tuner, which writes them.

A table is JSON, one per GPU model:
  {"format": 1, "gpu": {"name", "cc", "sm_count", ...}, "entries": {bucket: entry}, ...}
  entry = {"kernel", "config", "shape": [m, n, k], "us", "label",
           "candidates": {label: us or "error: ..."}, "configs": {label: full config}}
(`configs` is written by the tuner so that a named kernel can take its own best config from a
bucket another kernel won; older tables lack it.)

Two places, lowest precedence first: the table shipped in deepgemm/configs/<GPU model>.json,
then the user's ($DEEPGEMM_TUNED_DIR, else the cache dir's 'tuned' folder), written by
`python -m deepgemm tune`. A table is applied only on the GPU model, compute capability and SM
count it was recorded on. A table that cannot be used (unreadable, corrupt JSON, another schema,
another GPU) or entries that cannot (an unknown kernel or config parameter, a config the kernel
refuses for the problem) are skipped with a RuntimeWarning naming the file and why, and the
heuristics decide instead: a bad table never breaks a call.

Loaded tables are cached per device (the cache "tables" of deepgemm.caches); reload() forgets
them and every decision made from them.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from deepgemm import caches, device, jit, registry

FORMAT = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "configs"
# The shape bucket a table entry is filed under (dispatch.bucket_key writes these).
BUCKET_RE = re.compile(r"m\d+\.n\d+\.k\d+\.[a-z0-9]+\.(rr|rc|cr|cc)\.epi[01]\.sm\d+")


def user_dir() -> Path:
    """Where `python -m deepgemm tune` writes by default, and the user's tables are looked for:
    $DEEPGEMM_TUNED_DIR, else the 'tuned' folder of the cache (jit.cache_root())."""
    env = os.environ.get("DEEPGEMM_TUNED_DIR")
    if env:
        return Path(env)
    return jit.cache_root() / "tuned"


def file_name(gpu_name: str) -> str:
    return f"{device.gpu_slug(gpu_name)}.json"


def paths(gpu_name: str) -> list[tuple[str, Path]]:
    """(origin, path), lowest precedence first: the shipped default, then the user's."""
    return [("shipped", SHIPPED_DIR / file_name(gpu_name)), ("user", user_dir() / file_name(gpu_name))]


def mismatch(recorded: dict, identity: dict) -> str | None:
    """Why a table recorded on `recorded` must not be used on `identity` (None: it may).
    Driver and clocks do not matter; the model, compute capability and SM count do."""
    for key in ("name", "cc", "sm_count"):
        if str(recorded.get(key)) != str(identity.get(key)):
            return f"recorded on {key}={recorded.get(key)!r}, this GPU has {identity.get(key)!r}"
    return None


def schema_problem(table) -> str | None:
    """Why `table` (parsed JSON) is not a deepgemm tuning table, or None."""
    if not isinstance(table, dict):
        return f"not a format-{FORMAT} deepgemm tuning table (a JSON {type(table).__name__}, not an object)"
    if table.get("format") != FORMAT:
        return f"not a format-{FORMAT} deepgemm tuning table (format {table.get('format')!r})"
    for key in ("gpu", "entries"):
        if not isinstance(table.get(key), dict):
            return f"not a format-{FORMAT} deepgemm tuning table ('{key}' is not an object)"
    return None


def read(path) -> tuple[dict | None, str | None]:
    """(table, None) or (None, why it is unusable): no file, unreadable, corrupt JSON, wrong schema."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None, "no file"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({exc})"
    try:
        table = json.loads(text)
    except ValueError as exc:
        return None, f"corrupt JSON ({exc})"
    why = schema_problem(table)
    return (None, why) if why else (table, None)


def write(path, table: dict) -> None:
    """Write through a temp file in the same folder and rename: readers see the old or the new
    file, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def kernel_config(kernel, config) -> tuple[registry.KernelSpec | None, dict | None, str | None]:
    """(spec, full config, None) for a kernel name and a (partial) config from a table, or
    (None, None, why not): an unknown or non-"gemm" kernel, a config that is not an object or names
    parameters the kernel does not have."""
    if not isinstance(kernel, str):
        return None, None, f"'kernel' is {kernel!r}, not a name"
    spec = registry.lookup(kernel)
    if spec is None or spec.purpose != "gemm" or not spec.public:
        return None, None, f"names kernel {kernel!r}, which is not a registered gemm kernel"
    if config is not None and not isinstance(config, dict):
        return None, None, f"its config is {type(config).__name__}, not an object"
    try:
        return spec, spec.config_defines(config or None), None
    except ValueError as exc:
        return None, None, str(exc).removeprefix("config: ")


def entry_problem(bucket, entry) -> str | None:
    """Why one entry cannot be used at all (None: it can be, where the problem allows)."""
    if not isinstance(bucket, str) or not BUCKET_RE.fullmatch(bucket):
        return f"{bucket!r} is not a shape bucket such as 'm16.n4096.k4096.float16.rc.epi0.sm90'"
    if not isinstance(entry, dict):
        return f"entry is a {type(entry).__name__}, not an object"
    return kernel_config(entry.get("kernel"), entry.get("config"))[2]


@dataclass
class Tables:
    """The usable tuned entries of one device, merged (user over shipped), and what happened to
    each file (explain prints the notes)."""
    identity: dict | None
    entries: dict = field(default_factory=dict)     # bucket -> (entry, origin, path)
    notes: list = field(default_factory=list)
    _warned: set = field(default_factory=set)

    def warn(self, path, why: str) -> None:
        """A RuntimeWarning naming the table file, once per (file, reason) while this is loaded."""
        if (str(path), why) not in self._warned:
            self._warned.add((str(path), why))
            warnings.warn(f"deepgemm: tuning table {path}: {why}; using the heuristics there instead",
                          RuntimeWarning, stacklevel=4)


def load(identity: dict | None) -> Tables:
    """Read, check and merge the tables for a GPU identity ({'name', 'cc', 'sm_count'})."""
    tables = Tables(identity)
    if not identity or not identity.get("name"):
        tables.notes.append("GPU model unknown: heuristics only")
        return tables
    for origin, path in paths(identity["name"]):
        table, why = read(path)
        if table is None:
            tables.notes.append(f"{origin} table {path}: {why}")
            if why != "no file":
                tables.warn(path, f"ignored, {why}")
            continue
        wrong_gpu = mismatch(table["gpu"], identity)
        if wrong_gpu:
            tables.notes.append(f"{origin} table {path}: not applied, {wrong_gpu}")
            tables.warn(path, f"not applied, {wrong_gpu}")
            continue
        used, bad = 0, []
        for bucket, entry in table["entries"].items():
            problem = entry_problem(bucket, entry)
            if problem is None:
                tables.entries[bucket] = (entry, origin, path)
                used += 1
            else:
                bad.append(f"{bucket}: {problem}")
        tables.notes.append(f"{origin} table {path}: {used} entr{'y' if used == 1 else 'ies'}"
                            + (f", {len(bad)} ignored" if bad else ""))
        for line in bad:
            tables.notes.append(f"  ignored {line}")
        if bad:
            tables.warn(path, f"{len(bad)} unusable entr{'y' if len(bad) == 1 else 'ies'} ignored ("
                        + "; ".join(bad[:3]) + ("; ..." if len(bad) > 3 else "") + ")")
    return tables


def options(entry: dict) -> list[tuple[float | None, str, dict | None]]:
    """What one entry offers, fastest first: (us, kernel, config) for the winner and for every
    measured candidate whose config the tuner recorded ('configs'). A winner a re-tune kept within
    the tuner's tie ('kept') ranks with the fastest, ahead of it."""
    us = entry.get("us") if isinstance(entry.get("us"), (int, float)) else None
    kept = entry.get("kept")
    rank = kept["us"] if isinstance(kept, dict) and isinstance(kept.get("us"), (int, float)) else us
    ranked = [(rank, (us, entry["kernel"], entry.get("config") or None))]   # (sort time, option)
    configs = entry.get("configs")
    timings = entry.get("candidates")
    if isinstance(configs, dict) and isinstance(timings, dict):
        for label, config in configs.items():
            t = timings.get(label)
            if isinstance(label, str) and isinstance(t, (int, float)):
                ranked.append((float(t), (float(t), label.split("[", 1)[0], config)))
    # stable: the winner stays ahead of a candidate with its sort time
    return [o for r, o in sorted(ranked, key=lambda ro: float("inf") if ro[0] is None else ro[0])]


_loaded: dict = {}
_lock = threading.Lock()


def for_device(dev) -> Tables:
    """The tuned tables of a device (None: no device, so none), loaded once per device."""
    t = _loaded.get(dev)
    if t is None:
        with _lock:
            t = _loaded.get(dev)
            if t is None:
                t = _loaded[dev] = load(device.summary(dev))
    return t


def reload() -> None:
    """Forget loaded tables and everything decided from them (after a tune run, or in tests)."""
    caches.clear("tables")


def _clear() -> None:
    with _lock:
        _loaded.clear()


caches.register("tables", __name__, "tuned tables loaded per device", _clear, derived_from=("device", "registry"))

"""Benchmark runs on disk: what a run holds, which baseline it may be compared with, where it lives.

A run is pytest-benchmark's JSON (``--benchmark-json`` or what the plugin saves): top-level
``machine_info`` (``gpu``: the device's identity, added by deepgemm.testing.benchplugin),
``commit_info``, ``datetime`` and ``benchmarks``, each with ``fullname``, ``stats`` (seconds; the
raw per-round times in ``stats.data``) and ``extra_info`` (``reference``: the same-run cuBLAS
timing this benchmark is normalised by; ``telemetry``: clocks before and after).

The baseline key
    A baseline is only meaningful on the same GPU model, the same driver branch (the driver's
    major version: its scheduler and clock policy change between branches, rarely within one)
    and the same CUDA major version (cuBLAS, the reference, and NVRTC, which compiles our
    kernels, come with it). A run of another key is never compared silently: the gate refuses
    and names both keys.

Layout under the regressions root (``regressions/`` in the repository)::

    <GPU slug>/<key slug>/baseline.json                      what the gate compares against
    <GPU slug>/<key slug>/history/<date>_<time>_<commit>.json every recorded run, for `history`

e.g. ``regressions/NVIDIA_H200/driver580-cuda13/baseline.json``.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from deepgemm.device import gpu_slug

RECORD_COMMAND = "pytest tests/bench --benchmark-only --benchmark-save=baseline"
FORMAT_VERSION = 2  # 1: before raw samples, references and telemetry were stored
SIGNIFICANT_DIGITS = 7  # CUDA event times are float32 milliseconds: 7 digits lose nothing


class BaselineNotFound(LookupError):
    pass


class KeyMismatch(ValueError):
    pass


class BaselineFormatError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# The key


def _major(version) -> str | None:
    match = re.match(r"\s*(\d+)", str(version)) if version not in (None, "") else None
    return match.group(1) if match else None


@dataclass(frozen=True)
class GateKey:
    gpu: str
    driver_major: str | None
    cuda_major: str | None

    @classmethod
    def from_identity(cls, identity: dict | None) -> "GateKey":
        """The key of a device identity (deepgemm.device.identity's dict)."""
        if not identity or not identity.get("name"):
            raise ValueError("identity: no GPU model ('name') recorded")
        cuda = identity.get("cuda_runtime_version") or identity.get("cuda_driver_version")
        return cls(str(identity["name"]), _major(identity.get("driver_version")), _major(cuda))

    @property
    def complete(self) -> bool:
        return self.driver_major is not None and self.cuda_major is not None

    @property
    def slug(self) -> str:
        return f"driver{self.driver_major or 'unknown'}-cuda{self.cuda_major or 'unknown'}"

    @property
    def folder(self) -> Path:
        """Relative to the regressions root."""
        return Path(gpu_slug(self.gpu)) / self.slug

    def __str__(self) -> str:
        return (f"{self.gpu}, driver {self.driver_major or '(not recorded)'}, "
                f"CUDA {self.cuda_major or '(not recorded)'}")


# ---------------------------------------------------------------------------------------------
# Runs


@dataclass
class Run:
    """One pytest-benchmark JSON file."""

    data: dict
    path: Path | None = None

    @property
    def identity(self) -> dict:
        return (self.data.get("machine_info") or {}).get("gpu") or {}

    @property
    def gpu_name(self) -> str | None:
        return self.identity.get("name")

    @property
    def key(self) -> GateKey:
        if not self.gpu_name:
            raise KeyMismatch(f"{self} records no GPU model (machine_info.gpu.name): was it run "
                              f"with deepgemm.testing.benchplugin loaded?")
        return GateKey.from_identity(self.identity)

    @property
    def commit(self) -> str:
        info = self.data.get("commit_info") or {}
        commit = str(info.get("id") or "unknown")[:10]
        return commit + ("-dirty" if info.get("dirty") else "")

    @property
    def timestamp(self) -> datetime:
        try:
            when = datetime.fromisoformat(self.data["datetime"])
        except (KeyError, TypeError, ValueError):
            mtime = self.path.stat().st_mtime if self.path and self.path.exists() else 0.0
            return datetime.fromtimestamp(mtime, timezone.utc)
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)

    @property
    def benchmarks(self) -> dict[str, dict]:
        return {b["fullname"]: b for b in self.data.get("benchmarks", [])}

    def has_samples(self) -> bool:
        return any(samples(b) for b in self.data.get("benchmarks", []))

    def __str__(self) -> str:
        return str(self.path) if self.path else f"<run {self.commit}>"


def samples(bench: dict) -> list[float] | None:
    """The raw per-round times (seconds) of a benchmark entry, None when not stored."""
    data = (bench.get("stats") or {}).get("data")
    return [float(x) for x in data] if data else None


def reference(bench: dict) -> dict | None:
    """extra_info['reference'] ({'name', 'samples', 'median'}) when the benchmark has one."""
    ref = (bench.get("extra_info") or {}).get("reference")
    return ref if isinstance(ref, dict) and ref.get("name") else None


def load_run(path) -> Run:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise ValueError(f"{path} is not a pytest-benchmark run (no 'benchmarks' key)")
    return Run(data, path)


def as_run(run) -> Run:
    if isinstance(run, Run):
        return run
    if isinstance(run, dict):
        return Run(run)
    raise TypeError(f"run: expected a Run or a pytest-benchmark dict, got {type(run).__name__}")


def load_runs(folder) -> list[Run]:
    """Every readable run below `folder` (recursively), oldest first; unreadable files warn."""
    runs = []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            runs.append(load_run(path))
        except (OSError, ValueError) as exc:
            warnings.warn(f"skipping {path}: {exc}", stacklevel=2)
    return sorted(runs, key=lambda r: (r.timestamp, r.path.name))


# ---------------------------------------------------------------------------------------------
# Layout


def key_folder(root, key: GateKey) -> Path:
    return Path(root) / key.folder


def baseline_path(root, key: GateKey) -> Path:
    return key_folder(root, key) / "baseline.json"


def history_name(run: Run, label: str | None = None) -> str:
    """'<UTC date>_<time>_<commit>[_<label>].json': sorts by time, names the commit."""
    stamp = run.timestamp.astimezone(timezone.utc).strftime("%Y-%m-%d_%H%M%S")
    tail = f"_{gpu_slug(label)}" if label else ""
    return f"{stamp}_{gpu_slug(run.commit)}{tail}.json"


def keys_under(root) -> dict[GateKey, Path]:
    """Every key with a folder (baseline or history) under the regressions root."""
    found: dict[GateKey, Path] = {}
    root = Path(root)
    if not root.is_dir():
        return found
    for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
        files = [folder / "baseline.json"] if (folder / "baseline.json").exists() else \
            sorted((folder / "history").glob("*.json"))
        for path in files:
            try:
                found.setdefault(load_run(path).key, folder)
                break
            except (OSError, ValueError):
                continue
    return found


def describe_keys(root) -> str:
    keys = keys_under(root)
    return "; ".join(f"{k} ({p})" for k, p in keys.items()) or "none"


def check_baseline(baseline: Run, current_key: GateKey | None = None) -> None:
    """Raise if `baseline` cannot serve as one: another key, or recorded without raw samples."""
    base_key = baseline.key
    # An unversioned baseline first: saying so beats calling its key merely another one.
    if not base_key.complete and current_key is not None:
        raise KeyMismatch(f"{baseline} does not record its driver or CUDA version ([{base_key}]), "
                          f"so it cannot be matched to [{current_key}]; re-record it with: "
                          f"{RECORD_COMMAND}")
    if current_key is not None and base_key != current_key:
        raise KeyMismatch(
            f"Refusing to compare across baseline keys: {baseline} was recorded on [{base_key}], "
            f"this run is on [{current_key}]. Record a baseline for [{current_key}] with: "
            f"{RECORD_COMMAND}")
    if not baseline.has_samples():
        raise BaselineFormatError(
            f"{baseline} holds no raw samples (an older format: medians only, no same-run "
            f"reference, no clocks), so no statistical test can be made against it. Re-record "
            f"the baseline on this GPU with: {RECORD_COMMAND}")


def find_baseline(root, key: GateKey) -> Run:
    """regressions/<gpu>/<key>/baseline.json for `key`, checked; clear errors otherwise."""
    path = baseline_path(root, key)
    if not path.exists():
        same_gpu = {k: p for k, p in keys_under(root).items() if k.gpu == key.gpu and k != key}
        hint = (f" This GPU model has baselines under other keys, which are not compared: "
                f"{'; '.join(f'{k} ({p})' for k, p in same_gpu.items())}." if same_gpu else "")
        raise BaselineNotFound(
            f"No baseline for [{key}]: {path} does not exist.{hint} Keys with runs under "
            f"{root}: {describe_keys(root)}. Record one on this GPU with: {RECORD_COMMAND}")
    baseline = load_run(path)
    check_baseline(baseline, key)
    return baseline


# ---------------------------------------------------------------------------------------------
# Writing


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def compact(data: dict) -> dict:
    """The run with raw samples rounded to SIGNIFICANT_DIGITS (a third of the file's size)."""
    out = json.loads(json.dumps(data, default=str))  # a deep copy; odd param types become text
    for bench in out.get("benchmarks", []):
        stats = bench.get("stats") or {}
        if stats.get("data"):
            stats["data"] = [_round(x) for x in stats["data"]]
        ref = reference(bench)
        if ref and ref.get("samples"):
            ref["samples"] = [_round(x) for x in ref["samples"]]
    return out


def dumps(data: dict) -> str:
    """JSON with one benchmark per line: readable diffs, no indent bloat for sample arrays."""
    head = [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
            for k, v in sorted(data.items()) if k != "benchmarks"]
    lines = [json.dumps(b, sort_keys=True) for b in data.get("benchmarks", [])]
    return ("{\n" + ",\n".join(head + [' "benchmarks": [\n' + ",\n".join(lines) + "\n ]"])
            + "\n}\n")


def save_run(root, data: dict, *, as_baseline: bool, label: str | None = None) -> list[Path]:
    """Store a run under its key: always in history/, and as baseline.json when asked."""
    run = Run(compact(data))
    folder = key_folder(root, run.key)
    text = dumps(run.data)
    written = []
    history = folder / "history" / history_name(run, label)
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_text(text)
    written.append(history)
    if as_baseline:
        if not run.has_samples():
            raise BaselineFormatError("data: a baseline needs raw samples (stats.data); none stored")
        (folder / "baseline.json").write_text(text)
        written.append(folder / "baseline.json")
    return written

"""Compile a kernel variant to a cubin, cache it in memory and on disk, load it on a device.

In memory, one cache per stage, each owned here (deepgemm.caches: "kernels", "modules"):
compiled variants by request (source path, arch, defines, compiler route), so a repeated request
hashes nothing; and each variant's module and entry point per device. The disk cache's key =
SHA-256 of (the kernel source, every header under kernels/include, the compile
options including the -D defines, the compiler's identity and version, the target arch). The disk
cache lives in $DEEPGEMM_CACHE_DIR (default ~/.cache/deepgemm); each entry is a cubin plus a JSON
meta file (ptxas resource usage, the log, the cubin's own hash), and once the static checks have
looked at it, a <cubin hash>.sass.json of its SASS feature counts. Entries are written to a temp file
and renamed into place, so concurrent processes never see half a file; an entry whose hash does
not match its meta is treated as missing and rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from deepgemm import binary, caches, toolchain


def kernel_dir() -> Path:
    """Where the kernel sources are: $DEEPGEMM_KERNEL_DIR if set; else deepgemm/kernels inside
    an installed package (the wheel ships the repository's kernels/ there); else kernels/ beside
    the package (a source checkout or an editable install)."""
    override = os.environ.get("DEEPGEMM_KERNEL_DIR")
    if override:
        return Path(override)
    package = Path(__file__).resolve().parent
    installed, checkout = package / "kernels", package.parent / "kernels"
    # Neither there: keep the installed location, so the error at compile time names it.
    return checkout if not installed.is_dir() and checkout.is_dir() else installed


KERNEL_DIR = kernel_dir()
INCLUDE_DIR = KERNEL_DIR / "include"
ENTRY_POINT = "deepgemm_kernel"


class CompileError(RuntimeError):
    """A kernel failed to compile; the message names the kernel, its config and the compiler log."""


@dataclass(frozen=True)
class CompiledKernel:
    name: str            # human-readable variant name, for messages
    key: str             # cache key
    cubin_path: Path
    resources: dict      # registers, stack, spill_stores, spill_loads, smem (from ptxas -v)
    log: str


def cache_root() -> Path:
    """$DEEPGEMM_CACHE_DIR, else ~/.cache/deepgemm: the compiled kernels, and the user's tuned tables
    in its 'tuned' folder (deepgemm.tables). Not created here."""
    return Path(os.environ.get("DEEPGEMM_CACHE_DIR", Path.home() / ".cache" / "deepgemm"))


def cache_dir() -> Path:
    """The compiled kernels' folder (cache_root()), created on first use."""
    d = cache_root()
    d.mkdir(parents=True, exist_ok=True)
    return d


@functools.lru_cache(maxsize=None)
def _headers_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(INCLUDE_DIR.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(INCLUDE_DIR)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _options(route: str, arch: str, defines: dict, include_dirs: bool = True) -> list[str]:
    """Compile options for either route. arch is an exact target such as 'sm_80' or 'sm_90a'.

    include_dirs=False leaves out the machine-specific -I paths: the cache key hashes what the
    headers contain instead, so a cache built on one machine is valid on another."""
    flags = [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted(defines.items())]
    if route == "nvcc":
        compute = arch.replace("sm_", "compute_")
        # -gencode, not -arch=sm_90a: the shorthand can add a plain sm_90 pass that rejects wgmma.
        includes = [f"-I{INCLUDE_DIR}"] if include_dirs else []
        return ["-cubin", "-std=c++17", "-O3", "-lineinfo", "-Xptxas", "-v",
                f"-gencode=arch={compute},code={arch}"] + includes + flags
    includes = [f"-I{INCLUDE_DIR}", f"-I{toolchain.cuda_include_dir()}"] if include_dirs else []
    return [f"-arch={arch}", "-std=c++17", "-lineinfo", "--ptxas-options=-v"] + includes + flags


def cache_key(source_file: Path, arch: str, defines: dict, route: str | None = None) -> str:
    route = route or toolchain.compiler_route()
    h = hashlib.sha256()
    for part in (Path(source_file).read_bytes(), _headers_digest().encode(),
                 json.dumps(_options(route, arch, defines, include_dirs=False)).encode(),
                 toolchain.compiler_identity(route).encode(), arch.encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()


_lock = threading.Lock()


# What a compile writes before an entry is renamed into place: a work folder and a temporary file.
_WORK_PREFIX, _PARTIAL_SUFFIX = "tmp", ".tmp"


def remove_partial_entries(cache: Path) -> None:
    """Delete what compiles killed half-way left in `cache` (work folders, files never renamed into
    place). Only for a cache no other process is compiling into."""
    for path in cache.iterdir():
        if path.is_dir() and path.name.startswith(_WORK_PREFIX):
            shutil.rmtree(path, ignore_errors=True)
        elif path.suffix == _PARTIAL_SUFFIX:
            path.unlink(missing_ok=True)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=_PARTIAL_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_entry(name: str, key: str) -> CompiledKernel | None:
    cubin, meta = cache_dir() / f"{key}.cubin", cache_dir() / f"{key}.json"
    try:
        info = json.loads(meta.read_text())
        data = cubin.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(data).hexdigest() != info.get("cubin_sha256") or not data.startswith(b"\x7fELF"):
        return None  # corrupted or truncated: rebuild
    return CompiledKernel(name, key, cubin, info["resources"], info["log"])


def _run_compiler(route: str, source_file: Path, arch: str, defines: dict, out: Path) -> tuple[bool, str]:
    options = _options(route, arch, defines)
    if route == "nvcc":
        proc = subprocess.run([toolchain.find_nvcc(), *options, "-o", str(out), str(source_file)],
                              capture_output=True, text=True)
        return proc.returncode == 0, proc.stdout + proc.stderr
    request = {"lib": toolchain.find_nvrtc_library(), "source": Path(source_file).read_text(),
               "filename": str(source_file), "options": options, "out": str(out)}
    proc = subprocess.run([sys.executable, "-m", "deepgemm._nvrtc_child"], input=json.dumps(request),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return False, f"NVRTC child process died with status {proc.returncode}\n{proc.stderr}"
    reply = json.loads(proc.stdout)
    return reply["ok"], reply["log"]


_compiled: dict[tuple, CompiledKernel] = {}   # request -> compiled variant


def compile_kernel(name: str, source_file: Path, arch: str, defines: dict) -> CompiledKernel:
    """Return the compiled variant: from memory, else from the disk cache, else by compiling.

    The memory lookup is by request, so a repeated call hashes nothing; source edits in a running
    process are not picked up until deepgemm.clear_caches() (or a restart, as with any compiled
    extension)."""
    route = toolchain.compiler_route()
    request = (str(source_file), arch, tuple(sorted(defines.items())), route)
    hit = _compiled.get(request)
    if hit is not None:
        return hit
    _log_build(name, source_file, arch, defines)
    if not Path(source_file).is_file():
        raise FileNotFoundError(f"kernel {name}: source {source_file} not found (kernel sources: {KERNEL_DIR}; "
                                f"reinstall deepgemm, or set DEEPGEMM_KERNEL_DIR to a copy of the repository's "
                                f"kernels/ folder)")
    key = cache_key(source_file, arch, defines, route)
    entry = _read_entry(name, key)
    if entry is None:
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=_WORK_PREFIX) as tmp:
            out = Path(tmp) / "k.cubin"
            ok, log = _run_compiler(route, source_file, arch, defines, out)
            if not ok:
                raise CompileError(f"compiling kernel {name} (arch {arch}, {route}, defines {defines}) "
                                   f"failed:\n{log}")
            data = out.read_bytes()
        meta = {"name": name, "arch": arch, "route": route, "defines": defines,
                "resources": binary.parse_ptxas(log), "log": log,
                "cubin_sha256": hashlib.sha256(data).hexdigest()}
        # cubin first, then the meta that vouches for it: a reader never trusts a cubin without it.
        _atomic_write(cache_dir() / f"{key}.cubin", data)
        _atomic_write(cache_dir() / f"{key}.json", json.dumps(meta, indent=1).encode())
        entry = CompiledKernel(name, key, cache_dir() / f"{key}.cubin", meta["resources"], log)
    with _lock:
        _compiled[request] = entry
    return entry


# A source derived from a kernel file (the stress tier's variants: #define lines, then the file's
# text) names its origin the way the compiler's messages do: `#line 1 "file"` before the copy.
_DERIVED_FROM = re.compile(r'^#line 1 "([^"]+)"\n', re.MULTILINE)


def derived_origin(source_file: Path) -> tuple[str, str] | None:
    """(origin, prefix) of a source outside the kernel folder that copies a kernel file: the file
    (relative to KERNEL_DIR) named by its `#line 1 "..."` directive, and the text before that line.
    None for any other source."""
    try:
        text = Path(source_file).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    found = _DERIVED_FROM.search(text)
    if found is None or not (KERNEL_DIR / found.group(1)).is_file():
        return None
    return found.group(1), text[:found.start()]


def derived_source(origin: str, prefix: str) -> str:
    """The text of a source derived from kernel file `origin` with `prefix` in front (derived_origin's
    inverse, for an unchanged copy)."""
    return prefix + f'#line 1 "{origin}"\n' + (KERNEL_DIR / origin).read_text()


def _log_build(name: str, source_file: Path, arch: str, defines: dict) -> None:
    """With $DEEPGEMM_BUILD_LOG set, append what was asked for (once per process and variant) as a
    JSON line: the mutation campaign's same-code check rebuilds exactly what the tests built. A
    source derived from a kernel file (derived_origin) is logged with its origin and prefix, so that
    it is rebuilt from the mutated file: a mutant in code that only such a build compiles (the
    pipeline checks of DG_PIPE_CHECK) is not judged same-code by the normal builds alone."""
    path = os.environ.get("DEEPGEMM_BUILD_LOG")
    if not path:
        return
    entry = {"name": name, "arch": arch, "defines": defines}
    try:
        entry["source"] = Path(source_file).resolve().relative_to(KERNEL_DIR.resolve()).as_posix()
    except ValueError:
        entry["source"] = str(source_file)
        derived = derived_origin(source_file)
        if derived is not None:
            entry["origin"], entry["prefix"] = derived
    line = json.dumps(entry, sort_keys=True)
    with open(path, "a", encoding="utf-8") as f:   # one short append per line: whole lines under xdist
        f.write(line + "\n")


def compile_many(compiles, workers: int | None = None, progress=None) -> list:
    """Run zero-argument compile callables in parallel (each compile is a subprocess: threads
    suffice); results in the callables' order. progress(done, total) is called as each finishes."""
    compiles = list(compiles)
    workers = workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count() or 1)
    done, count_lock = [0], threading.Lock()

    def one(compile_one):
        result = compile_one()
        if progress is not None:
            with count_lock:
                done[0] += 1
                progress(done[0], len(compiles))
        return result

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, compiles))


_features: dict[tuple[str, str], dict] = {}


def sass_features(cubin_path) -> dict[str, int]:
    """deepgemm.binary.sass_features of a cubin's disassembly, cached in memory and on disk next to
    the cubins (keyed by the cubin's SHA-256 and binary.patterns_digest()), so each cubin is
    disassembled once, not on every static check."""
    digest = hashlib.sha256(Path(cubin_path).read_bytes()).hexdigest()
    slot = (digest, binary.patterns_digest())
    if slot in _features:
        return dict(_features[slot])
    path = cache_dir() / f"{digest}.sass.json"
    try:
        stored = json.loads(path.read_text())
        features = stored["features"] if stored.get("patterns") == slot[1] else None
    except (OSError, ValueError, KeyError, AttributeError):
        features = None
    if features is None or set(features) != binary.feature_names():
        features = binary.sass_features(binary.dump_sass(Path(cubin_path)))
        _atomic_write(path, json.dumps({"patterns": slot[1], "features": features}).encode())
    _features[slot] = features
    return dict(features)


DEFAULT_MAX_DYNAMIC_SMEM = 48 * 1024   # what a launch may use without opting in


_loaded: dict[tuple[str, int], list] = {}   # (cache key, device) -> [module, function, smem opted in]


def load_function(kernel: CompiledKernel, device_id: int, dynamic_smem: int = 0):
    """The kernel's entry point as a CuPy function on the given device (module loaded once per
    device), opted in to `dynamic_smem` bytes of dynamic shared memory where that is over the
    default 48 KB (once per loaded function: the opt-in belongs to it)."""
    import cupy

    slot = (kernel.key, device_id)
    loaded = _loaded.get(slot)
    if loaded is None:
        with cupy.cuda.Device(device_id):
            module = cupy.RawModule(path=str(kernel.cubin_path))
            loaded = [module, module.get_function(ENTRY_POINT), DEFAULT_MAX_DYNAMIC_SMEM]  # module outlives function
        with _lock:
            _loaded[slot] = loaded
    if dynamic_smem > loaded[2]:
        with cupy.cuda.Device(device_id):
            loaded[1].max_dynamic_shared_size_bytes = dynamic_smem
        loaded[2] = dynamic_smem
    return loaded[1]


def _clear_compiled() -> None:
    with _lock:
        _compiled.clear()
    getattr(_headers_digest, "cache_clear", lambda: None)()   # (tests stand in a plain function)


def _clear_loaded() -> None:
    with _lock:
        _loaded.clear()


caches.register("kernels", __name__, "compiled kernel variants by request (the disk cache stays)",
                _clear_compiled, derived_from=("toolchain",))
caches.register("modules", __name__, "compiled kernels loaded on a device, with their shared-memory opt-in",
                _clear_loaded, derived_from=("kernels",))
caches.register("sass features", __name__, "SASS instruction counts per cubin hash (also kept on disk)",
                _features.clear, derived_from=("kernels",))


def clear_memory_cache() -> None:
    """Forget compiled and loaded kernels held in this process, and what was built on them (the
    disk cache stays)."""
    caches.clear("kernels")

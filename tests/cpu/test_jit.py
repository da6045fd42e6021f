"""The JIT: both compile routes, the cache key, atomic/corrupt-entry handling, compile errors."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import deepgemm
from deepgemm import binary, jit, registry, toolchain
from deepgemm.registry import Epilogue


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    jit.clear_memory_cache()
    yield tmp_path / "cache"
    jit.clear_memory_cache()


V0 = registry.get("v0")


def _compile(arch="sm_90a", **kw):
    return registry.compile_variant(V0, arch, "float16", "float16", True, True, **kw)


def test_compiles_and_caches_on_disk(fresh_cache):
    first = _compile()
    assert first.cubin_path.parent == fresh_cache and first.cubin_path.read_bytes().startswith(b"\x7fELF")
    assert first.resources["registers"] > 0
    jit.clear_memory_cache()
    again = _compile()
    assert again.key == first.key and again.cubin_path == first.cubin_path


def test_cache_key_covers_defines_arch_and_headers(fresh_cache, monkeypatch):
    base = jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0})
    assert jit.cache_key(V0.source, "sm_80", {"DG_IN": 0}) != base
    assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 1}) != base
    monkeypatch.setattr(jit, "_headers_digest", lambda: "a different header")
    assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0}) != base


def test_a_header_edit_changes_the_cache_key_after_clear_caches(fresh_cache, tmp_path):
    """The headers' digest is computed once per process: an edit in a running process is picked up
    by deepgemm.clear_caches(), as a kernel file's is."""
    include, real = tmp_path / "include", jit.INCLUDE_DIR
    shutil.copytree(real, include)
    try:
        jit.INCLUDE_DIR = include
        deepgemm.clear_caches()
        base = jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0})
        header = include / "deepgemm" / "common.cuh"
        header.write_text(header.read_text() + "\n// edited\n")
        assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0}) == base     # not read again yet
        deepgemm.clear_caches()
        edited = jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0})
        assert edited != base
        # A header renamed, every byte and the files' order kept: what `#include` finds changes.
        (include / "deepgemm" / "stress.cuh").rename(include / "deepgemm" / "stress2.cuh")
        deepgemm.clear_caches()
        assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0}) not in (base, edited)
    finally:
        jit.INCLUDE_DIR = real
        deepgemm.clear_caches()   # the real headers' digest for the tests after this one


def test_cache_key_changes_with_the_compiler(fresh_cache, monkeypatch):
    """A cubin built by another nvcc or NVRTC version is not reused: a toolchain upgrade rebuilds."""
    route = toolchain.compiler_route()
    base = jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0}, route)
    identity = toolchain.compiler_identity(route)
    monkeypatch.setattr(toolchain, "compiler_identity", lambda r: identity + "-next")
    assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0}, route) != base


def test_cache_key_is_independent_of_the_checkout_path(fresh_cache, monkeypatch, tmp_path):
    base = jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0})
    monkeypatch.setattr(jit, "INCLUDE_DIR", tmp_path / "elsewhere" / "include")
    assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0}) == base  # cubins built here load there


def test_corrupted_entry_is_rebuilt(fresh_cache):
    first = _compile()
    first.cubin_path.write_bytes(b"\x7fELF garbage")
    jit.clear_memory_cache()
    rebuilt = _compile()
    assert rebuilt.cubin_path.read_bytes() != b"\x7fELF garbage"
    (fresh_cache / f"{first.key}.json").write_text("{not json")
    jit.clear_memory_cache()
    assert _compile().resources == first.resources


def test_sass_features_are_disassembled_once_per_cubin(fresh_cache, monkeypatch):
    compiled = _compile()
    dumps = []
    real_dump = binary.dump_sass
    monkeypatch.setattr(binary, "dump_sass", lambda path: dumps.append(path) or real_dump(path))
    first = jit.sass_features(compiled.cubin_path)
    assert first["LDG.128"] == 0 and first["LOCAL"] == 0 and set(first) == binary.feature_names()
    digest = hashlib.sha256(compiled.cubin_path.read_bytes()).hexdigest()
    assert (fresh_cache / f"{digest}.sass.json").is_file() and len(dumps) == 1
    jit.clear_memory_cache()
    assert jit.sass_features(compiled.cubin_path) == first and len(dumps) == 1      # from the disk cache
    jit.clear_memory_cache()
    monkeypatch.setattr(binary, "patterns_digest", lambda: "other patterns")        # patterns changed
    assert jit.sass_features(compiled.cubin_path) == first and len(dumps) == 2


def test_the_patterns_digest_follows_the_patterns_and_the_derived_counts_code(monkeypatch):
    """Cached feature counts are keyed by this digest: a changed pattern, or a changed function
    behind a derived count (its source), must change it, or stale counts would be read back."""
    import re
    base = binary.patterns_digest.__wrapped__()   # the function behind its cache

    def other_moves(sass):   # a different body for the same derived count
        return 0
    monkeypatch.setitem(binary.SASS_DERIVED, "TMA_ISSUE_R2UR", other_moves)
    assert binary.patterns_digest.__wrapped__() != base
    monkeypatch.setitem(binary.SASS_DERIVED, "TMA_ISSUE_R2UR", binary.tma_issue_moves)
    assert binary.patterns_digest.__wrapped__() == base
    monkeypatch.setitem(binary.SASS_PATTERNS, "LDG.128", re.compile(r"\bLDG\.E\.128\b"))
    assert binary.patterns_digest.__wrapped__() != base


def test_concurrent_processes_share_the_cache(fresh_cache):
    code = ("from deepgemm import registry as r; k=r.compile_variant(r.get('v0'),'sm_80','bfloat16','float32',"
            "False,False); print(k.key)")
    env = dict(os.environ, DEEPGEMM_CACHE_DIR=str(fresh_cache))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    keys = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(keys) == 1
    assert not list(fresh_cache.glob("*.tmp"))  # no leftovers from the atomic writes
    assert jit._read_entry("v0", keys.pop()) is not None


def test_compile_error_names_kernel_config_and_log(fresh_cache, tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text('#include "deepgemm/common.cuh"\nextern "C" __global__ void deepgemm_kernel(const GemmParams p)'
                      ' { this_is_not_cuda; }\n')
    spec = registry.KernelSpec(name="broken", file=str(broken), summary="x", min_cc=70,
                               tile=lambda c: (1, 1), block=lambda c: (1, 1, 1), default_config={"DG_X": 3},
                               public=False)
    with pytest.raises(jit.CompileError) as info:
        registry.compile_variant(spec, "sm_80", "float16", "float16", True, True)
    msg = str(info.value)
    assert "broken[" in msg and "DG_X" in msg and "this_is_not_cuda" in msg


def test_unknown_config_parameter_and_bad_arch():
    with pytest.raises(ValueError, match="config: kernel 'v0' has no parameter"):
        V0.config_defines({"DG_TILE": 64})
    with pytest.raises(ValueError, match="arch"):
        registry.compile_variant(V0, "hopper", "float16", "float16", True, True)


@pytest.mark.skipif(toolchain.find_nvrtc_library() is None, reason="NVRTC wheel not installed")
def test_nvrtc_route_compiles_the_full_epilogue(fresh_cache, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_COMPILER", "nvrtc")
    epi = Epilogue(alpha=True, bias="float32", activation="silu", scale="scalar", residual="bfloat16")
    for arch in ("sm_80", "sm_90a"):
        k = _compile(arch, epilogue=epi)
        assert k.resources["spill_stores"] == 0 and k.cubin_path.read_bytes().startswith(b"\x7fELF")


def test_an_nvrtc_child_that_dies_is_a_failed_compile_with_its_status(tmp_path, monkeypatch):
    """NVRTC compiles in a child process (a crash inside NVRTC kills its process): a child that
    dies is reported as a failed compile naming its status and what it printed, not a crash here."""
    monkeypatch.setattr(toolchain, "find_nvrtc_library", lambda: "libnvrtc.so.13")
    monkeypatch.setattr(jit.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, -11, stdout="", stderr="Segmentation fault in nvrtcCompileProgram"))
    ok, log = jit._run_compiler("nvrtc", V0.source, "sm_90a", {}, tmp_path / "k.cubin")
    assert ok is False
    assert log == "NVRTC child process died with status -11\nSegmentation fault in nvrtcCompileProgram"


@pytest.mark.skipif(toolchain.find_nvcc() is None, reason="nvcc not installed")
def test_nvcc_and_nvrtc_keys_differ(fresh_cache, monkeypatch):
    nvcc_key = jit.cache_key(V0.source, "sm_90a", {}, route="nvcc")
    if toolchain.find_nvrtc_library():
        assert jit.cache_key(V0.source, "sm_90a", {}, route="nvrtc") != nvcc_key
    assert re.fullmatch(r"nvcc-\d+\.\d+\.\d+", toolchain.compiler_identity("nvcc"))


def test_cache_key_covers_the_source_text_not_its_path(fresh_cache, tmp_path):
    """An edited kernel must never get the cubin of its old text; the same text elsewhere (another
    checkout, an installed wheel) shares its cubin."""
    src = V0.source.read_bytes()
    same, edited = tmp_path / "same" / "k.cu", tmp_path / "edited" / "k.cu"
    same.parent.mkdir()
    edited.parent.mkdir()
    same.write_bytes(src)
    edited.write_bytes(src + b"\n// one more line\n")
    base = jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0})
    assert jit.cache_key(same, "sm_90a", {"DG_IN": 0}) == base
    assert jit.cache_key(edited, "sm_90a", {"DG_IN": 0}) != base
    # every define's name and value counts, whatever order they come in
    assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0, "DG_X": 1}) not in (
        base, jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0, "DG_X": 2}), jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0, "DG_Y": 1}))
    assert jit.cache_key(V0.source, "sm_90a", {"DG_IN": 0, "DG_X": 1}) == jit.cache_key(V0.source, "sm_90a", {"DG_X": 1, "DG_IN": 0})


@pytest.fixture
def fake_compiler(fresh_cache, monkeypatch):
    """The compiler stood in for by one that writes a cubin naming what it was asked to build."""
    runs = []

    def run(route, source_file, arch, defines, out):
        runs.append((Path(source_file).name, arch, dict(defines)))
        out.write_bytes(b"\x7fELF" + repr((Path(source_file).read_bytes(), arch, sorted(defines.items()))).encode())
        return True, ""
    monkeypatch.setattr(jit, "_run_compiler", run)
    return runs


def test_each_request_gets_its_own_cubin_from_memory_and_disk(fake_compiler, tmp_path):
    """The in-memory lookup (by request) and the disk cache (by key) must both tell apart every
    source, arch and define a request names: a mix-up hands a launch another variant's cubin."""
    src, other = tmp_path / "k.cu", tmp_path / "other.cu"
    src.write_text("// kernel one\n")
    other.write_text("// kernel one\n")                                # same text, another kernel file
    requests = [(src, "sm_80", {"DG_X": 1}), (src, "sm_80", {"DG_X": 2}), (src, "sm_90a", {"DG_X": 1}),
                (src, "sm_80", {"DG_X": 1, "DG_Y": 0}), (src, "sm_80", {})]
    first = [jit.compile_kernel("k", *r) for r in requests]
    assert len(fake_compiler) == len(requests) and len({k.key for k in first}) == len(requests)
    again = [jit.compile_kernel("k", *r) for r in requests]            # from memory
    assert again == first and len(fake_compiler) == len(requests)
    jit.clear_memory_cache()
    from_disk = [jit.compile_kernel("k", *r) for r in requests]        # from the disk cache
    assert [k.key for k in from_disk] == [k.key for k in first] and len(fake_compiler) == len(requests)
    for k, (_, arch, defines) in zip(from_disk, requests):
        assert k.cubin_path.read_bytes() == b"\x7fELF" + repr((b"// kernel one\n", arch, sorted(defines.items()))).encode()
    # Another file is another request: it is read (its cubin may be shared on disk, by content).
    other.write_text("// kernel two\n")
    assert jit.compile_kernel("other", other, "sm_80", {"DG_X": 1}).cubin_path.read_bytes() == \
        b"\x7fELF" + repr((b"// kernel two\n", "sm_80", [("DG_X", 1)])).encode()
    # An edited source, after the memory cache is cleared, is compiled again.
    src.write_text("// kernel three\n")
    jit.clear_memory_cache()
    edited = jit.compile_kernel("k", *requests[0])
    assert edited.key != first[0].key and len(fake_compiler) == len(requests) + 2


def test_a_failed_compile_is_not_cached(fresh_cache, monkeypatch, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("// kernel\n")
    outcomes = [(False, "error: this_is_not_cuda"), (True, "")]

    def run(route, source_file, arch, defines, out):
        ok, log = outcomes.pop(0)
        if ok:
            out.write_bytes(b"\x7fELF ok")
        return ok, log
    monkeypatch.setattr(jit, "_run_compiler", run)
    with pytest.raises(jit.CompileError, match="this_is_not_cuda"):
        jit.compile_kernel("k", src, "sm_80", {})
    assert not list(fresh_cache.glob("*.cubin"))
    assert jit.compile_kernel("k", src, "sm_80", {}).cubin_path.read_bytes() == b"\x7fELF ok"


def test_a_missing_source_names_the_kernel_folder(fresh_cache, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"kernel k: source .*nope\.cu not found .*DEEPGEMM_KERNEL_DIR"):
        jit.compile_kernel("k", tmp_path / "nope.cu", "sm_80", {})


def test_the_cache_folder_is_created_with_its_parents(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "a" / "b" / "cache"))
    assert jit.cache_dir() == tmp_path / "a" / "b" / "cache" and jit.cache_dir().is_dir()


def test_partial_entries_are_removed_and_finished_ones_kept(tmp_path):
    """What a compile killed half-way leaves: its work folder (with files in it) and a file never
    renamed into place. Finished entries, and folders that are not work folders, stay."""
    work = tmp_path / f"{jit._WORK_PREFIX}x1"
    work.mkdir()
    (work / "k.cubin").write_bytes(b"half")
    (tmp_path / f"abc.cubin.q7{jit._PARTIAL_SUFFIX}").write_bytes(b"half")
    for name in ("abc.cubin", "abc.json"):
        (tmp_path / name).write_bytes(b"done")
    (tmp_path / "sass").mkdir()
    jit.remove_partial_entries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc.cubin", "abc.json", "sass"]


def test_a_failed_write_raises_and_leaves_neither_file_nor_partial(tmp_path, monkeypatch):
    target = tmp_path / "k.cubin"

    def no_rename(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(jit.os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        jit._atomic_write(target, b"data")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    jit._atomic_write(target, b"data")
    assert target.read_bytes() == b"data" and list(tmp_path.iterdir()) == [target]


@pytest.fixture
def no_tool_caches():
    finders = (toolchain.find_nvcc, toolchain.find_nvrtc_library, toolchain.cuda_include_dir)
    for f in finders:
        f.cache_clear()
    yield
    for f in finders:
        f.cache_clear()


def test_nvcc_is_found_by_override_path_then_cuda_home(tmp_path, monkeypatch, no_tool_caches):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("")
    monkeypatch.delenv("DEEPGEMM_NVCC", raising=False)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)          # not on PATH
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nothing-here"))          # a CUDA_HOME without nvcc is passed over
    monkeypatch.setenv("CUDA_PATH", str(home))
    assert toolchain.find_nvcc() == str(home / "bin" / "nvcc")
    toolchain.find_nvcc.cache_clear()
    monkeypatch.setenv("DEEPGEMM_NVCC", "/opt/my/nvcc")
    assert toolchain.find_nvcc() == "/opt/my/nvcc"


def test_nvrtc_comes_from_pips_wheel_never_its_builtins_or_alt_builds(tmp_path, monkeypatch, no_tool_caches):
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libnvrtc.so.12.builtins", "libnvrtc.so.12.alt.1", "libnvrtc.so.13"):
        (lib / name).write_text("")
    monkeypatch.delenv("DEEPGEMM_NVRTC", raising=False)
    monkeypatch.setattr(toolchain.sys, "path", [str(tmp_path / "site")])
    assert toolchain.find_nvrtc_library() == str(lib / "libnvrtc.so.13")
    toolchain.find_nvrtc_library.cache_clear()
    monkeypatch.setenv("DEEPGEMM_NVRTC", "/opt/libnvrtc.so.13")
    assert toolchain.find_nvrtc_library() == "/opt/libnvrtc.so.13"


def test_without_pips_wheels_nvrtc_and_the_headers_come_from_cuda_home(tmp_path, monkeypatch, no_tool_caches):
    home = tmp_path / "cuda"
    (home / "lib64").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "lib64" / "libnvrtc.so.13").write_text("")
    (home / "include" / "cuda_fp16.h").write_text("")
    monkeypatch.delenv("DEEPGEMM_NVRTC", raising=False)
    monkeypatch.setattr(toolchain.sys, "path", [str(tmp_path / "no-wheels")])
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert toolchain.find_nvrtc_library() == str(home / "lib64" / "libnvrtc.so.13")
    assert toolchain.cuda_include_dir() == str(home / "include")


def test_a_kernel_is_loaded_once_per_device_and_opted_in_only_past_48_kb(monkeypatch, tmp_path):
    """load_function with CuPy's module loader faked: one module per (variant, device), whatever the
    number of calls; the dynamic shared-memory opt-in is set exactly when a launch asks for more than
    the 48 KB every kernel may use without it, and only upwards (an opt-in covers every smaller launch)."""
    import contextlib
    import types

    loads, opt_ins = [], []

    class Function:
        def __setattr__(self, name, value):
            assert name == "max_dynamic_shared_size_bytes"
            opt_ins.append((current[-1], value))

    current = [None]

    @contextlib.contextmanager
    def device(i):
        current.append(i)
        try:
            yield
        finally:
            current.pop()

    def raw_module(path):
        loads.append((path, current[-1]))
        function = Function()
        return types.SimpleNamespace(get_function=lambda name: function if name == jit.ENTRY_POINT else None)

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(RawModule=raw_module,
                                                                    cuda=types.SimpleNamespace(Device=device)))
    monkeypatch.setattr(jit, "_loaded", {})
    kernel = jit.CompiledKernel("k", "key", tmp_path / "k.cubin", {}, "")
    f0 = jit.load_function(kernel, 0)
    assert jit.load_function(kernel, 0, 48 * 1024) is f0 and loads == [(str(kernel.cubin_path), 0)] and opt_ins == []
    assert jit.load_function(kernel, 0, 48 * 1024 + 1) is f0 and opt_ins == [(0, 48 * 1024 + 1)]
    jit.load_function(kernel, 0, 40 * 1024)
    jit.load_function(kernel, 0, 48 * 1024 + 1)
    assert opt_ins == [(0, 48 * 1024 + 1)]
    jit.load_function(kernel, 0, 200 * 1024)
    assert opt_ins[-1] == (0, 200 * 1024) and len(loads) == 1
    f1 = jit.load_function(kernel, 1, 100 * 1024)   # another device: its own module and its own opt-in
    assert f1 is not f0 and loads[-1] == (str(kernel.cubin_path), 1) and opt_ins[-1] == (1, 100 * 1024)
    other = jit.CompiledKernel("k2", "key2", tmp_path / "k2.cubin", {}, "")
    assert jit.load_function(other, 0) is not f0 and len(loads) == 3


@pytest.mark.parametrize("present,expected", [
    ({"installed", "checkout"}, "installed"),   # an installed package never reads a folder beside it
    ({"checkout"}, "checkout"),                 # a source checkout (or an editable install)
    ({"installed"}, "installed"),
    (set(), "installed"),                       # neither: the installed place, which the compile error names
])
def test_the_kernel_folder_is_the_installed_one_unless_only_the_checkout_has_one(tmp_path, monkeypatch, present,
                                                                                  expected):
    package = tmp_path / "site" / "deepgemm"
    package.mkdir(parents=True)
    places = {"installed": package / "kernels", "checkout": package.parent / "kernels"}
    for name in present:
        places[name].mkdir()
    monkeypatch.delenv("DEEPGEMM_KERNEL_DIR", raising=False)
    monkeypatch.setattr(jit, "__file__", str(package / "jit.py"))
    assert jit.kernel_dir() == places[expected]
    monkeypatch.setenv("DEEPGEMM_KERNEL_DIR", str(tmp_path / "mine"))
    assert jit.kernel_dir() == tmp_path / "mine"


def test_compile_many_keeps_the_order_and_counts_each_finished_compile_once():
    """Results come back in the callables' order whatever order they finish in; progress sees
    1..n of n, once each, and the number of workers asked for is the number that run at once."""
    import threading
    import time

    running, most, lock = [0], [0], threading.Lock()

    def job(i):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.02 * (5 - i % 5))   # the early ones finish last
            with lock:
                running[0] -= 1
            return i * i
        return run

    seen = []
    assert jit.compile_many([job(i) for i in range(10)], workers=3,
                            progress=lambda done, total: seen.append((done, total))) == [i * i for i in range(10)]
    assert sorted(seen) == [(i, 10) for i in range(1, 11)] and most[0] == 3
    assert jit.compile_many([], workers=2) == []


def test_the_compiler_route_and_its_errors_name_what_to_install_or_set(tmp_path, monkeypatch):
    """DEEPGEMM_COMPILER picks the route (anything but nvcc/nvrtc is refused); unset, nvcc wins over
    NVRTC; with neither, or with the forced one missing, the error says what to install or set. An
    nvcc whose --version cannot be read is named too."""
    toolchain._clear_found()
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    monkeypatch.setattr(toolchain, "find_nvrtc_library", lambda: None)
    monkeypatch.setenv("DEEPGEMM_COMPILER", "clang")
    with pytest.raises(toolchain.ToolchainError, match=r"^DEEPGEMM_COMPILER must be 'nvcc' or 'nvrtc', got 'clang'"):
        toolchain.compiler_route()
    monkeypatch.delenv("DEEPGEMM_COMPILER")
    with pytest.raises(toolchain.ToolchainError, match=r"^no CUDA compiler found: install the CUDA toolkit"):
        toolchain.compiler_route()
    monkeypatch.setattr(toolchain, "find_nvrtc_library", lambda: "/x/libnvrtc.so.13")
    assert toolchain.compiler_route() == "nvrtc"
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: "/x/nvcc")
    assert toolchain.compiler_route() == "nvcc"
    monkeypatch.setenv("DEEPGEMM_COMPILER", "nvrtc")
    assert toolchain.compiler_route() == "nvrtc"
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    monkeypatch.setattr(toolchain, "find_nvrtc_library", lambda: None)
    for route, message in (("nvcc", r"^DEEPGEMM_COMPILER=nvcc but nvcc was not found"),
                           ("nvrtc", r"^NVRTC not found: pip install nvidia-cuda-nvrtc")):
        toolchain.compiler_identity.cache_clear()
        with pytest.raises(toolchain.ToolchainError, match=message):
            toolchain.compiler_identity(route)
    toolchain.compiler_identity.cache_clear()
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'not a CUDA compiler'\n")
    fake.chmod(0o755)
    toolchain.nvcc_version.cache_clear()
    with pytest.raises(toolchain.ToolchainError, match=r"^cannot read the version of .*nvcc: 'not a CUDA compiler\\n'"):
        toolchain.nvcc_version(str(fake))
    toolchain.nvcc_version.cache_clear()


def test_a_variant_the_arch_or_the_kernel_cannot_build_is_refused_before_compiling(monkeypatch):
    """compile_variant's own guards (dispatch refuses these earlier; a direct caller, e.g. a script,
    gets the same answer instead of a compiler error), and grid sizes past CUDA's y/z limit."""
    monkeypatch.setattr(jit, "compile_kernel", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(ValueError, match=r"^kernel 'v5' needs compute capability >= 9\.0; cannot build it for sm_80$"):
        registry.compile_variant(registry.get("v5"), "sm_80", "float16", "float16", True, False)
    with pytest.raises(ValueError, match=r"^kernel 'v0' has no batched/grouped build$"):
        registry.compile_variant(registry.get("v0"), "sm_90a", "float16", "float16", True, False, grouped=True)
    assert registry._grid_yz(registry.GRID_YZ_MAX, "rows", "fewer") == registry.GRID_YZ_MAX
    with pytest.raises(ValueError, match=r"^65536 row blocks, over CUDA's grid limit of 65535; use fewer$"):
        registry._grid_yz(65536, "65536 row blocks", "use fewer")

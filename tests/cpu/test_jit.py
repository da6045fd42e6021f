"""The JIT: both compile routes, the cache key, atomic/corrupt-entry handling, compile errors."""
import hashlib
import os
import re
import subprocess
import sys

import pytest

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
    assert first["LDG.128"] == 0 and first["LOCAL"] == 0 and set(first) == set(binary.SASS_PATTERNS)
    digest = hashlib.sha256(compiled.cubin_path.read_bytes()).hexdigest()
    assert (fresh_cache / f"{digest}.sass.json").is_file() and len(dumps) == 1
    jit.clear_memory_cache()
    assert jit.sass_features(compiled.cubin_path) == first and len(dumps) == 1      # from the disk cache
    jit.clear_memory_cache()
    monkeypatch.setattr(binary, "patterns_digest", lambda: "other patterns")        # patterns changed
    assert jit.sass_features(compiled.cubin_path) == first and len(dumps) == 2


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


@pytest.mark.skipif(toolchain.find_nvcc() is None, reason="nvcc not installed")
def test_nvcc_and_nvrtc_keys_differ(fresh_cache, monkeypatch):
    nvcc_key = jit.cache_key(V0.source, "sm_90a", {}, route="nvcc")
    if toolchain.find_nvrtc_library():
        assert jit.cache_key(V0.source, "sm_90a", {}, route="nvrtc") != nvcc_key
    assert re.fullmatch(r"nvcc-\d+\.\d+\.\d+", toolchain.compiler_identity("nvcc"))

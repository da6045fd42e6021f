"""A kernel's tile parameters are stated once, in the registry: a .cu file's fallback #define for
a parameter some registered kernel states must agree with it (V4's default tile was once 128x128
in v4_mma.cu and 256x128 in registry.py), and v4_mma.cu, shared by two kernels with different
defaults, has no fallback for its tile at all: it refuses to compile without one."""
import re

import pytest

from deepgemm import jit, registry

FALLBACK = re.compile(r"^#ifndef\s+(DG_\w+)\s*\n#define\s+\1\s+(\S+)", re.M)
SPECS = registry.specs(include_hidden=True, purpose=None)
FILES = sorted({s.file for s in SPECS})


def fallbacks(source) -> dict:
    return {name: value for name, value in FALLBACK.findall(source.read_text())}


@pytest.mark.parametrize("file", FILES)
def test_kernel_file_fallbacks_agree_with_the_registry(file):
    users = [s for s in SPECS if s.file == file]
    found = fallbacks(users[0].source)
    problems = [f"{file}: #define {name} {found[name]}, but registry kernel {s.name!r} says {value}"
                for s in users for name, value in s.default_config.items()
                if name in found and str(found[name]) != str(int(value))]
    assert not problems, "\n".join(problems)


def test_the_fallback_parser_reads_them():
    assert fallbacks(registry.get("v0").source) == {"DG_BX": "32", "DG_BY": "8"}
    assert fallbacks(registry.get("small_m").source)["DG_SMALL_M_WARPS"] == "8"


def test_v4_states_its_tile_only_in_the_registry():
    v4, report = registry.get("v4"), registry.get("fp16acc_mma")
    assert v4.file == report.file and v4.default_config != report.default_config
    tile = {"DG_BM", "DG_BN", "DG_BK", "DG_WM", "DG_WN", "DG_STAGES", "DG_GROUP_M", "DG_SWIZZLE"}
    assert tile <= set(v4.default_config) and tile <= set(report.default_config)
    assert not tile & set(fallbacks(v4.source))


def test_v4_mma_without_its_tile_defines_does_not_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    spec = registry.get("v4")
    defines = registry.variant_defines(spec, spec.default_config, "float16", "float16", True, False)
    del defines["DG_BN"]
    with pytest.raises(jit.CompileError, match="define DG_BM, DG_BN"):
        jit.compile_kernel("v4 without DG_BN", spec.source, "sm_80", defines)

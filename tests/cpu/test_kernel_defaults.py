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


def test_epilogue_defines_are_the_codes_the_kernel_headers_test():
    """Epilogue.defines() speaks common.cuh's language: its dtype and activation codes, and the
    DG_SCALE_MODE under which the per-column scale vector (dtype DG_SCALE) is read."""
    header = (jit.INCLUDE_DIR / "deepgemm" / "common.cuh").read_text()
    defined = {name: int(value) for name, value in re.findall(r"^#define\s+(DG_\w+)\s+(-?\d+)\b", header, re.M)}
    dtype = {"float16": defined["DG_F16"], "bfloat16": defined["DG_BF16"], "float32": defined["DG_F32"]}
    act = {None: defined["DG_ACT_NONE"], "relu": defined["DG_ACT_RELU"], "gelu": defined["DG_ACT_GELU"],
           "gelu_erf": defined["DG_ACT_GELU_ERF"], "silu": defined["DG_ACT_SILU"]}
    assert registry.DTYPE_CODES == dtype and registry.ACTIVATION_CODES == act
    (vector_mode,) = {int(m) for m in re.findall(r"#(?:el)?if DG_SCALE_MODE == (\d)\n[^#]*dtype<DG_SCALE>", header)}
    (scalar_mode,) = {int(m) for m in re.findall(r"#(?:el)?if DG_SCALE_MODE == (\d)\n[^#]*scale_scalar", header)}

    assert registry.Epilogue().defines() == {"DG_ALPHA": 0, "DG_ACT": act[None], "DG_BIAS": -1, "DG_C": -1}
    assert registry.Epilogue(scale="scalar").defines()["DG_SCALE_MODE"] == scalar_mode
    full = registry.Epilogue(alpha=True, bias="bfloat16", activation="gelu_erf", scale="float16", residual="float32")
    assert full.defines() == {"DG_ALPHA": 1, "DG_ACT": act["gelu_erf"], "DG_BIAS": dtype["bfloat16"],
                              "DG_C": dtype["float32"], "DG_SCALE_MODE": vector_mode, "DG_SCALE": dtype["float16"]}

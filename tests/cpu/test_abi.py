"""The host mirror of GemmParams must match the C struct byte for byte (CuPy passes raw bytes)."""
import shutil
import subprocess

import pytest

from deepgemm import jit
from deepgemm.params import GROUPED_PARAMS_DTYPE, PARAMS_DTYPE, make_params


@pytest.mark.parametrize("struct, dtype", [("GemmParams", PARAMS_DTYPE), ("GroupedGemmParams", GROUPED_PARAMS_DTYPE)])
def test_params_dtype_matches_the_c_struct(tmp_path, struct, dtype):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.fail("the CPU tier needs a C++ compiler (g++) to check the kernel ABI")
    fields = dtype.names
    # offsetof on a derived struct is conditionally supported; g++ computes it (and warns)
    prints = "\n".join(f'    printf("{f} %zu\\n", offsetof({struct}, {f}));' for f in fields)
    src = tmp_path / "abi.cpp"
    src.write_text(f'#include <cstdio>\n#include <cstddef>\n#include "deepgemm/params.cuh"\n'
                   f'int main() {{\n{prints}\n    printf("sizeof %zu\\n", sizeof({struct}));\n}}\n')
    exe = tmp_path / "abi"
    subprocess.run([compiler, "-std=c++17", "-Wno-invalid-offsetof", f"-I{jit.INCLUDE_DIR}", str(src), "-o", str(exe)],
                   check=True)
    c_layout = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                            check=True).stdout.splitlines())
    py_layout = {f: str(dtype.fields[f][1]) for f in fields}
    py_layout["sizeof"] = str(dtype.itemsize)
    assert py_layout == c_layout


def test_make_params_defaults_and_unknown_field():
    p = make_params(m=3, a=0x1000)
    assert p.shape == () and p.nbytes == PARAMS_DTYPE.itemsize
    assert (int(p["m"]), int(p["a"]), int(p["split_k"]), float(p["alpha"])) == (3, 0x1000, 1, 1.0)
    with pytest.raises(KeyError, match="no field 'bogus'"):
        make_params(bogus=1)
    # Every other field starts at zero (no workspace, beta 0, flags 0), one K slice, alpha 1, one group.
    ones = {"split_k": 1, "alpha": 1.0, "groups": 1}
    for params in (make_params(), make_params(stride_a=5)):
        for name in params.dtype.names:
            expected = 5 if name == "stride_a" else ones.get(name, 0)
            assert params[name].item() == expected, name


def test_group_fields_make_the_grouped_struct():
    p = make_params(m=3, groups=4, stride_b=99)
    assert p.dtype == GROUPED_PARAMS_DTYPE and (int(p["groups"]), int(p["stride_b"]), int(p["m"])) == (4, 99, 3)
    assert make_params(m=3).dtype == PARAMS_DTYPE


def _defines(header: str, prefix: str) -> dict:
    import re
    text = (jit.INCLUDE_DIR / "deepgemm" / header).read_text()
    return {name: int(value) for name, value in re.findall(rf"^#define ({prefix}\w+) (\d+)\b", text, re.M)}


def test_the_codes_the_host_passes_are_the_kernels_defines():
    """dtype, activation and group-mode codes: the host's tables and the headers' #defines name the
    same numbers (a swap would compile and run, with the wrong dtype, activation or group walk)."""
    from deepgemm import registry
    dtypes = _defines("common.cuh", "DG_")
    assert {d: dtypes[f"DG_{tag}"] for d, tag in (("float16", "F16"), ("bfloat16", "BF16"), ("float32", "F32"))} \
        == registry.DTYPE_CODES
    acts = _defines("common.cuh", "DG_ACT_")
    assert {a: acts[f"DG_ACT_{(a or 'none').upper()}"] for a in registry.ACTIVATION_CODES} == registry.ACTIVATION_CODES
    modes = _defines("grouped.cuh", "DG_GROUP_")
    assert {m: modes[f"DG_GROUP_{m.upper()}"] for m in registry.GROUP_MODES} == registry.GROUP_MODES

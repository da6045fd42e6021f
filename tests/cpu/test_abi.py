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


def test_group_fields_make_the_grouped_struct():
    p = make_params(m=3, groups=4, stride_b=99)
    assert p.dtype == GROUPED_PARAMS_DTYPE and (int(p["groups"]), int(p["stride_b"]), int(p["m"])) == (4, 99, 3)
    assert make_params(m=3).dtype == PARAMS_DTYPE

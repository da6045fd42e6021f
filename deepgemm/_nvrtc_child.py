"""NVRTC through ctypes, run as a child process by deepgemm.jit.

A crash inside NVRTC (seen with NVRTC 13.0 on a wgmma kernel) then kills
this child, not the caller, who gets a CompileError with the exit status instead.
Protocol: JSON on stdin {lib, source, filename, options, out}; JSON on stdout {ok, log}.
"""
import ctypes
import glob
import os
import json
import sys


def _load(lib_path: str) -> ctypes.CDLL:
    # NVRTC dlopens libnvrtc-builtins by name; a pip wheel's lib folder is not on the loader's
    # path, so load the builtins beside it first, globally.
    folder = os.path.dirname(lib_path)
    for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(lib_path)


def version(lib_path: str) -> str:
    lib = _load(lib_path)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def compile_to_cubin(lib_path: str, source: str, filename: str, options: list[str]) -> tuple[bytes | None, str]:
    lib = _load(lib_path)
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0, None, None)
    if rc != 0:
        return None, f"nvrtcCreateProgram failed with status {rc}"
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc = lib.nvrtcCompileProgram(prog, len(options), opts)
    log_size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    lib.nvrtcGetProgramLog(prog, log)
    log_text = log.value.decode(errors="replace")
    if rc != 0:
        return None, log_text
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    # The full size, trailing NUL included: a cubin one byte short is not device code to cuobjdump.
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.raw[: size.value], log_text


def main() -> None:
    req = json.load(sys.stdin)
    cubin, log = compile_to_cubin(req["lib"], req["source"], req["filename"], req["options"])
    if cubin is not None:
        with open(req["out"], "wb") as f:
            f.write(cubin)
    json.dump({"ok": cubin is not None, "log": log}, sys.stdout)


if __name__ == "__main__":
    main()

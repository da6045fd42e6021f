"""What the compiler produced: resource usage from ptxas -v, and SASS from nvdisasm.

The regexes were checked against nvcc 13.0 output. These are what the CPU tier asserts: no spills,
no local memory, no performance warning from ptxas, and the instructions each ladder step claims.
deepgemm.jit.sass_features caches the counts per cubin, so each cubin is disassembled once.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import re
import struct
import subprocess
from pathlib import Path

from deepgemm import toolchain

_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes cumulative stack size)?"
                         r"(?:, (\d+) bytes smem)?")

# ptxas's C75xx warnings: code it had to compile slower than written, e.g. wgmma.mma_async
# instructions serialized (each waits for the previous one) because of a divergent branch or a
# register dependence inside a wgmma sequence. V5 ran 50 % slower with one, and correctly.
_PTXAS_PERF = re.compile(r"\(C75\d\d\) Potential Performance Loss: ([^\n]*)")

# Instruction patterns that prove a ladder step does what it claims (the static checks' summary
# lists these).
LADDER_PATTERNS = {
    "LDG.128": re.compile(r"\bLDG\.E(?:\.[A-Z0-9_]+)*\.128\b"),
    "LDS.128": re.compile(r"\bLDS(?:\.U)?\.128\b"),
    "HMMA": re.compile(r"\bHMMA\.16816\.F(?:32|16)(?:\.BF16)?\b"),
    "LDSM": re.compile(r"\bLDSM\.16\.M(?:T)?88\.[124]\b"),
    "LDGSTS": re.compile(r"\bLDGSTS\b"),
    "HGMMA": re.compile(r"\bHGMMA\.64x\d+x16\.F(?:32|16)(?:\.BF16)?\b"),
    "UTMALDG": re.compile(r"\bUTMALDG\b"),
    "UTMASTG": re.compile(r"\bUTMASTG\b"),
    "CLUSTER_BAR": re.compile(r"\bUCGABAR_(?:ARV|WAIT)\b"),   # barrier.cluster (split-K's reduction)
    "LOCAL": re.compile(r"\b(?:LDL|STL)\b"),
}
# Every pattern counted per cubin: the ladder's, and what the accuracy report's kernels and V5's
# staging copy claim (checked by their tests).
SASS_PATTERNS = {
    **LADDER_PATTERNS,
    "HMMA.F16": re.compile(r"\bHMMA\.16816\.F16\b"),        # f16 accumulators
    "HMMA.F32": re.compile(r"\bHMMA\.16816\.F32"),
    "HFMA2": re.compile(r"\bHFMA2(?:\.MMA)?(?:\.BF16_V2)?\s"),  # ptxas issues some as HFMA2.MMA (another pipe)
    "BF16_V2": re.compile(r"\bBF16_V2\b"),
    "STG.128": re.compile(r"\bSTG\.E(?:\.[A-Z0-9_]+)*\.128\b"),
    "BLOCK_BAR": re.compile(r"\bBAR\.SYNC(?:\.DEFER_BLOCKING)?\s+0x0\s*;"),   # __syncthreads: barrier 0, every thread
    "PDL_WAIT": re.compile(r"\bACQBULK\b"),   # griddepcontrol.wait (a programmatic dependent's wait)
    # An integer min/max that also writes a predicate. nvcc 13.0 (sm_90a) lowered
    # `n = clamp(x, 0, 8); if (n == 8 || n == 0)` into VIMNMX.RELU with a predicate output whose
    # test came out true for every x up to 8 and false past 8 (measured on the H200: V4 sent exactly
    # the chunks across an operand's edge down the wrong path). Every kernel forbids it.
    "VIMNMX.P": re.compile(r"\bVIMNMX(?:\.[A-Z0-9]+)*\s+R\d+,\s*!?P[0-6],"),
}


_INSTRUCTION = re.compile(r"/\*[0-9a-f]+\*/\s*(.*?)\s*;", re.M)   # an instruction line: /*addr*/ text ;
_TMA_ISSUE_ANCHOR = re.compile(r"\b(?:UTMALDG|SYNCS\.PHASECHK)")       # a TMA load or an mbarrier wait


def tma_issue_moves(sass: str) -> int:
    """R2UR moves (a vector register copied to a uniform one) among the instructions that lead up to
    each operand TMA load (UTMALDG without a cache-policy descriptor: C's loads carry one), counted
    from the previous TMA load or mbarrier wait. A producer loop compiled in uniform registers has
    none; one compiled for divergence moves its addresses and coordinates over before every load.
    On the H200 such a V5 producer (6 moves per load, 45 instructions per k-block against 29) fell
    behind 64-wide tiles' wgmmas: 512 x 768 x 3072 with a bias took 12.4 us against 10.9."""
    moves, since = 0, 0
    for text in _INSTRUCTION.findall(sass):
        words = text.split()
        opcode = words[1] if len(words) > 1 and words[0].startswith("@") else words[0] if words else ""
        if opcode.split(".")[0] == "R2UR":
            since += 1
        if _TMA_ISSUE_ANCHOR.search(text):
            if "UTMALDG" in text and "desc[" not in text:
                moves += since
            since = 0
    return moves


# Counts that are not one pattern's matches: name -> function of the whole disassembly.
SASS_DERIVED = {"TMA_ISSUE_R2UR": tma_issue_moves}


def feature_names() -> set[str]:
    """Every name sass_features counts."""
    return set(SASS_PATTERNS) | set(SASS_DERIVED)


@functools.lru_cache(maxsize=None)
def patterns_digest() -> str:
    """Changes whenever SASS_PATTERNS or a derived count's function (its source) does: part of the key
    of cached feature counts."""
    text = "\n".join(f"{name}\t{rx.pattern}" for name, rx in sorted(SASS_PATTERNS.items()))
    text += "\n" + "\n".join(f"{name}\t{inspect.getsource(fn)}" for name, fn in sorted(SASS_DERIVED.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_ptxas(log: str) -> dict:
    """Registers, stack frame, spill bytes and static smem of the (single) entry in a ptxas -v log."""
    frame = _PTXAS_FRAME.search(log)
    used = _PTXAS_USED.search(log)
    if not (frame and used):
        return {}
    return {"stack": int(frame.group(1)), "spill_stores": int(frame.group(2)),
            "spill_loads": int(frame.group(3)), "registers": int(used.group(1)),
            "smem": int(used.group(4) or 0)}


def performance_warnings(log: str) -> list[str]:
    """The "Potential Performance Loss" warnings in a ptxas log, one line each."""
    return [m.group(1).strip() for m in _PTXAS_PERF.finditer(log)]


def dump_sass(cubin_path: Path) -> str:
    """The cubin's SASS. nvdisasm straight on the cubin, code only, no dataflow annotations: the
    instructions cuobjdump --dump-sass prints (it runs nvdisasm itself) in half the time."""
    tool = toolchain.find_nvdisasm()
    if tool is None:
        raise toolchain.ToolchainError("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or set DEEPGEMM_NVDISASM")
    proc = subprocess.run([tool, "--print-code", "--no-dataflow", str(cubin_path)], capture_output=True, text=True)
    if proc.returncode != 0 or ".text." not in proc.stdout:
        raise toolchain.ToolchainError(f"nvdisasm failed on {cubin_path}: {proc.stderr or proc.stdout}")
    return proc.stdout


def sass_features(sass: str) -> dict[str, int]:
    """How many instructions of each pattern in SASS_PATTERNS the disassembly holds, and the
    SASS_DERIVED counts."""
    return {**{name: len(rx.findall(sass)) for name, rx in SASS_PATTERNS.items()},
            **{name: fn(sass) for name, fn in SASS_DERIVED.items()}}


# Sections of a cubin that only describe the source (line tables, their strings and relocations,
# the PTX text kept for the debugger): they change with a comment or a moved line, never what runs.
_DEBUG_SECTIONS = re.compile(r"^(?:\.rela?)?\.(?:debug_|nv_debug_)")


def _elf_sections(cubin_path) -> list[tuple]:
    """(name, type, flags, size, link, info, align, bytes) of each section of a 64-bit ELF cubin."""
    data = Path(cubin_path).read_bytes()
    if data[:5] != b"\x7fELF\x02" or len(data) < 0x40:
        raise ValueError(f"{cubin_path}: not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shnum == 0:
        return []
    try:
        headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_at = headers[shstrndx][4]
        sections = []
        for name_at, kind, flags, _addr, offset, size, link, info, align, _entsize in headers:
            name = data[names_at + name_at:data.index(b"\0", names_at + name_at)].decode()
            body = b"" if kind == 8 else data[offset:offset + size]          # SHT_NOBITS: a size, no bytes
            sections.append((name, kind, flags, size, link, info, align, body))
    except (struct.error, IndexError, ValueError) as exc:   # headers or names past the file's end
        raise ValueError(f"{cubin_path}: a truncated or malformed ELF cubin ({exc})") from None
    return sections


def code_digest(cubin_path: Path) -> str:
    """A digest of everything in a cubin that the GPU executes or the driver reads: every ELF
    section (name, type, flags, size and bytes) except the debug ones (_DEBUG_SECTIONS), so the
    code, its constant banks and the kernel attributes (registers, shared memory, parameters).
    Two cubins with the same digest run identically, whatever the source text that produced them."""
    digest = hashlib.sha256()
    for name, kind, flags, size, link, info, align, body in _elf_sections(cubin_path):
        if _DEBUG_SECTIONS.match(name):
            continue
        digest.update(repr((name, kind, flags, size, link, info, align)).encode())
        digest.update(hashlib.sha256(body).digest())
    return digest.hexdigest()


# Kernel attributes the driver reads from a kernel's ".nv.info.<kernel>" section: records of a format
# byte, an attribute byte, then 2 bytes (a value, or the size of the value that follows). The two
# codes were identified in nvcc 13.0 cubins by the values they hold (V5 at 128x256 tiles: 384, 1, 1
# from __launch_bounds__(384, 1); 2, 1, 1 from __cluster_dims__(2, 1, 1), absent without it); the
# static checks compare the first with the launcher's block in every build they compile.
_EIFMT_SVAL = 4                  # 2-byte size, then that many bytes; every other format: 2 bytes in place
_EIATTR_MAX_THREADS = 0x05       # __launch_bounds__'s maxThreadsPerBlock, as x, y, z
_EIATTR_CLUSTER_DIMS = 0x3D      # __cluster_dims__ (compiled-in cluster shape), as x, y, z


def kernel_attributes(cubin_path) -> dict[str, dict]:
    """Per kernel of a cubin: "max_threads", the block shape its __launch_bounds__ declares (absent
    without one: then any block up to 1024 threads launches), and "cluster", its __cluster_dims__
    (absent without). The driver refuses a launch with more threads than max_threads; fewer launch,
    and leave part of the tile to no thread."""
    out = {}
    for name, _kind, _flags, _size, _link, _info, _align, body in _elf_sections(cubin_path):
        if not name.startswith(".nv.info."):
            continue
        attrs, i = {}, 0
        while i + 4 <= len(body):
            fmt, attr, value = body[i], body[i + 1], body[i + 2:i + 4]
            i += 4
            if fmt == _EIFMT_SVAL:
                size, = struct.unpack("<H", value)
                value, i = body[i:i + size], i + size
            if attr in (_EIATTR_MAX_THREADS, _EIATTR_CLUSTER_DIMS) and len(value) == 12:
                attrs["max_threads" if attr == _EIATTR_MAX_THREADS else "cluster"] = struct.unpack("<3I", value)
        out[name[len(".nv.info."):]] = attrs
    return out

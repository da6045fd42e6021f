"""One entry per kernel: its source, what it supports, its launch geometry and its config space.

Adding a kernel = a .cu file under kernels/ + one `register(KernelSpec(...))` here; the API, the
CPU-tier static checks and the GPU verification sweep all iterate over this registry.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from deepgemm import caches, dtypes, jit
from deepgemm import device as device_facts
from deepgemm.dtypes import INPUT_DTYPES, OUTPUT_DTYPES
from deepgemm.groups import row_ranges, tile_bound

DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2}
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_erf": 3, "silu": 4}
ACTIVATIONS = tuple(a for a in ACTIVATION_CODES if a)   # relu, gelu (tanh), gelu_erf, silu
# GemmParams.group_mode: keep in sync with kernels/include/deepgemm/grouped.cuh
GROUP_MODES = {"batch": 0, "masked": 1, "sizes": 2, "offsets": 3}


def check_activation(activation):
    """activation itself if the epilogue computes it (None included), else ValueError naming it."""
    try:
        known = activation in ACTIVATION_CODES
    except TypeError:   # unhashable (a list, ...): no activation's name either
        known = False
    if not known:
        raise ValueError(f"activation: must be one of {list(ACTIVATIONS)} or None, got {activation!r}")
    return activation


# M, N, K and the batch and group counts reach the kernels as 32-bit ints, which round them up to
# whole tiles and k-steps in 32 bits (m + BM - 1, k0 + BK, ...): a margin below 2^31 keeps those
# sums from wrapping (a wrapped tile count computes nothing, silently). gemm() refuses larger
# sizes, and explain() refuses to explain them.
MAX_SIZE = 2**31 - 2**16


def check_size(label: str, size: int) -> None:
    """ValueError, starting with `label` (the argument and the size, e.g. "a, b: K=5000000000"),
    for an M, N or K over MAX_SIZE."""
    if size > MAX_SIZE:
        raise ValueError(f"{label} exceeds the supported maximum {MAX_SIZE} (32-bit sizes, rounded up to whole "
                         f"tiles in 32 bits)")


@dataclass(frozen=True)
class Epilogue:
    """The compile-time shape of the epilogue chain D = act(alpha*acc + bias)*scale + beta*residual.

    The residual has one name inside deepgemm, `residual` (here, in deepgemm.api and in
    deepgemm.torch). Callers name it as their convention does: gemm(c=, beta=) as BLAS's
    D = alpha*A@B + beta*C, deepgemm.torch.linear(residual=) as torch's modules do. The kernels'
    ABI keeps BLAS's letters: GemmParams.c / ldc and the define DG_C.

    Dtypes may be given in any spelling deepgemm.dtypes accepts; they are kept as canonical names."""
    alpha: bool = False                # alpha != 1
    bias: str | None = None            # dtype of the bias vector
    activation: str | None = None
    scale: str | None = None           # None, "scalar", or the dtype of a per-column vector
    residual: str | None = None        # dtype of the residual (GemmParams.c)

    def __post_init__(self):
        for name in ("bias", "residual"):
            value = getattr(self, name)
            if value is not None and value not in OUTPUT_DTYPES:
                object.__setattr__(self, name, dtypes.canonical(value, f"{name} dtype"))
        if self.scale is not None and self.scale != "scalar" and self.scale not in OUTPUT_DTYPES:
            object.__setattr__(self, "scale", dtypes.canonical(self.scale, "scale dtype"))
        check_activation(self.activation)

    @classmethod
    def of(cls, alpha=1.0, bias=None, activation=None, scale=None, residual=None, beta=None) -> "Epilogue":
        """From call-level values: dtype names for bias/residual, None/"scalar"/dtype for scale,
        beta as `residual_beta` reads it. As in BLAS, a residual with beta == 0 is not read, so it
        compiles away."""
        beta = residual_beta(beta, residual)
        return cls(alpha=float(alpha) != 1.0, bias=bias, activation=activation, scale=scale,
                   residual=residual if beta != 0 else None)

    def defines(self) -> dict:
        d = {"DG_ALPHA": int(self.alpha), "DG_ACT": ACTIVATION_CODES[self.activation],
             "DG_BIAS": DTYPE_CODES[self.bias] if self.bias else -1,
             "DG_C": DTYPE_CODES[self.residual] if self.residual else -1}
        if self.scale == "scalar":
            d["DG_SCALE_MODE"] = 1
        elif self.scale:
            d["DG_SCALE_MODE"], d["DG_SCALE"] = 2, DTYPE_CODES[self.scale]
        return d

    def __str__(self) -> str:
        parts = [p for p, on in (("alpha", self.alpha), (f"bias:{self.bias}", self.bias),
                                 (str(self.activation), self.activation), (f"scale:{self.scale}", self.scale),
                                 (f"C:{self.residual}", self.residual)) if on]
        return "+".join(parts) or "none"


NO_EPILOGUE = Epilogue()


def residual_beta(beta, residual):
    """The residual's coefficient, by the one rule that gemm(), grouped_gemm(), Epilogue.of and
    deepgemm.testing's reference and error bound share: beta=None means 1 with a residual (so the
    reference adds a c given alone, as gemm() does, rather than agree with a kernel that ignores
    C) and 0 without one; a nonzero beta without a residual is an error (it would scale nothing)."""
    if residual is not None:
        return 1.0 if beta is None else beta
    if beta is None or beta == 0:
        return 0.0
    raise ValueError(f"beta: given without a residual c (beta={beta!r}); pass c, or leave beta out")


@dataclass(frozen=True)
class Groups:
    """A batched or grouped problem: `count` GEMMs in one launch (GemmParams' group fields, whose
    meaning kernels/include/deepgemm/grouped.cuh states). Problem.m is then the rows per group
    (modes "batch", "masked") or of all groups together ("sizes", "offsets"), and Problem.a, b, d
    describe group 0's matrices; group g's lie stride_x elements further on (0: shared)."""
    mode: str                 # a GROUP_MODES key
    count: int                # G
    stride_a: int = 0
    stride_b: int = 0
    stride_d: int = 0
    stride_c: int = 0
    stride_bias: int = 0
    rows_ptr: int = 0         # device int32 array: counts (masked, sizes) or G + 1 offsets

    def __post_init__(self):
        if self.mode not in GROUP_MODES:
            raise ValueError(f"group mode: must be one of {tuple(GROUP_MODES)}, got {self.mode!r}")

    @property
    def contiguous(self) -> bool:
        """Groups that follow each other along the rows of one A and D ("sizes", "offsets")."""
        return self.mode in ("sizes", "offsets")

    def params(self) -> dict:
        """The GemmParams fields."""
        return {"groups": self.count, "group_mode": GROUP_MODES[self.mode], "group_rows": self.rows_ptr,
                "stride_a": self.stride_a, "stride_b": self.stride_b, "stride_d": self.stride_d,
                "stride_c": self.stride_c, "stride_bias": self.stride_bias}


@dataclass(frozen=True)
class Problem:
    """One GEMM call as dispatch and the kernels' launch hooks see it. a/b are arrays.Matrix
    descriptions (pointer, layout, leading dimension) or None when only the shape is known
    (deepgemm.explain, the tuner's planning)."""
    m: int
    n: int
    k: int
    in_dtype: str = "float16"
    out_dtype: str = "float16"
    a: object = None
    b: object = None
    epilogue: Epilogue = NO_EPILOGUE
    cc: int = 90
    d: object = None          # the output's arrays.Matrix (None when only the shape is known)
    c: object = None          # the residual's arrays.Matrix (None without one, or shape only)
    groups: Groups | None = None   # a batched/grouped problem (kernels with KernelSpec.grouped)

    @property
    def layout(self) -> str:
        """'rr', 'rc', 'cr', 'cc' (A then B; r = row-major); 'rc' when unknown (nn.Linear's)."""
        if self.a is None or self.b is None:
            return "rc"
        return ("r" if self.a.row_major else "c") + ("r" if self.b.row_major else "c")


@dataclass(frozen=True)
class KernelSpec:
    name: str                          # "v3"
    file: str                          # path relative to kernels/ (or absolute: test-only kernels)
    summary: str
    min_cc: int                        # lowest compute capability it runs on (80 = sm_80)
    tile: Callable[[dict], tuple[int, int]]          # (rows, cols) of D per block
    block: Callable[[dict], tuple[int, int, int]]    # threads per block
    default_config: dict
    config_space: tuple = ()           # alternatives for the autotuner, each a full config
    accumulate: str = "fp32"           # unit roundoff class for error bounds (deepgemm.testing.bounds)
    dynamic_smem: Callable[[dict], int] = field(default=lambda cfg: 0)
    k_step: Callable[[dict], int] = field(default=lambda cfg: int(cfg.get("DG_BK", 16)))
    #   the K a block takes per step of its main loop: the sweep's shapes straddle multiples of it
    sass_required: tuple = ()          # SASS patterns (deepgemm.binary.SASS_PATTERNS) the step claims
    sass_forbidden: tuple = ("LOCAL", "VIMNMX.P")   # VIMNMX.P: a miscompile (deepgemm.binary)
    sass_counts: Callable[[dict], dict] = field(default=lambda cfg: {})
    #   {SASS pattern: the least count} a build must have, given all its -D defines (config, layout,
    #   dtypes): where the count is the design's (barriers whose absence is a race no test has shown),
    #   or where what a step claims depends on the build
    sass_at_most: Callable[[dict], dict] = field(default=lambda cfg: {})
    #   {SASS count: the most} a build may have, likewise: code the compiler must not have made slower
    #   than written, where no warning says so
    archs: tuple = ("sm_80", "sm_90a")  # what the CPU tier compiles it for
    path_defines: tuple = ()           # config defines whose values switch code paths, not constants:
    #   the quick static checks compile, on the newest arch, the first config_space entry with each of
    #   their other values (a ping-pong V5 compiles other code than a cooperative one)
    public: bool = True                # False: test-only variants, hidden from kernels() and "auto"
    purpose: str = "gemm"              # "gemm": the ladder; "report": accuracy-report variants (FP16
                                       # accumulation), never "auto", not swept, selected by name or
                                       # by gemm(accumulate=...)
    input_dtypes: tuple = INPUT_DTYPES  # what it accepts (the static checks compile only these)
    defines: dict = field(default_factory=dict)   # fixed -D defines of every variant (not tunable: no config)
    # Launch hooks, for kernels that need more than "one block per tile, GemmParams only":
    supports: Callable[["Problem"], str | None] = field(default=lambda problem: None)
    #   why this kernel cannot run `problem` (e.g. TMA alignment), or None; "auto" skips it then,
    #   a request by name raises ValueError with the reason.
    config_supports: Callable[[dict, "Problem"], str | None] = field(default=lambda cfg, problem: None)
    #   why this config cannot run `problem` (e.g. a tile width one layout lacks), or None; the tuner
    #   skips such configs, a tuned entry naming one is ignored, an explicit one raises ValueError.
    grid: Callable[[dict, "Problem", int], tuple] | None = None
    #   (config, problem, SM count) -> grid; None: one block per tile of D, x along N.
    extra_args: Callable[[dict, "Problem", int, object], tuple] = field(
        default=lambda cfg, problem, device, stream: ((), ()))
    #   (config, problem, device, stream) -> (kernel arguments after GemmParams, e.g. TMA tensor
    #   maps; buffers to keep alive until the launch is enqueued, e.g. staged operand copies).
    pointer_args: Callable[[dict, "Problem"], Callable | None] = field(
        default=lambda cfg, problem: lambda a, b, d, c: b"")
    #   for gemm()'s plan cache: a function of the (a, b, d, c) pointers giving the bytes of
    #   extra_args' kernel arguments, one after the other, for calls with this problem's geometry;
    #   or None if such calls cannot be replayed from pointers alone (e.g. they stage operands).
    workspace_bytes: Callable[[dict, "Problem"], int] = field(default=lambda cfg, problem: 0)
    #   scratch the kernel needs (GemmParams.workspace, with its size in floats); allocated per call
    #   from the caller's allocator (CuPy's pool; torch's for torch tensors), never replayed from a plan.
    grouped: bool = False
    #   runs batched and grouped problems (Problem.groups) when compiled with DG_GROUPED = 1; its
    #   grid hook then sizes the launch for every group.
    pdl: bool = False
    #   every global access of the kernel follows dg::grid_dependency_wait() (common.cuh), so on
    #   sm_90 and later it is launched as a programmatic dependent (deepgemm/launch.py); the static
    #   checks hold its sm_90 builds to that wait's instruction (PDL_WAIT).

    @property
    def loads_by_tma(self) -> bool:
        """Whether A and B arrive by TMA (the step claims UTMALDG): tails zero-filled by the tensor
        map, operands TMA cannot read staged first, the same for every config."""
        return "UTMALDG" in self.sass_required

    @property
    def accumulation(self) -> str:
        """The accumulator's family, as gemm(accumulate=...) names it: "fp32_tc" -> "fp32"."""
        return self.accumulate.split("_")[0]

    @property
    def source(self) -> Path:
        p = Path(self.file)
        return p if p.is_absolute() else jit.KERNEL_DIR / p

    def config_defines(self, config: dict | None) -> dict:
        cfg = dict(self.default_config)
        if config:
            unknown = set(config) - set(cfg)
            if unknown:   # sorted by text: keys of mixed types do not compare
                raise ValueError(f"config: kernel {self.name!r} has no parameter(s) {sorted(unknown, key=str)}; "
                                 f"its parameters are {sorted(cfg)}")
            for name, value in config.items():   # each becomes -Dname=value: an integer, never a bool
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise ValueError(f"config: {name} must be an integer, got {value!r}")
                cfg[name] = int(value)
        return cfg

    def config_reason(self, cfg: dict, problem: "Problem") -> str | None:
        """Why the full config `cfg` cannot run `problem` (None if it can): config_supports, then
        the dynamic shared memory a block may have on the problem's GPU (smem_limit). Every choice
        of a config goes through this: a caller's, a tuned entry's, a rule's, the tuner's."""
        why = self.config_supports(cfg, problem)
        over = None if why is not None else self.smem_over(cfg, problem.cc)
        if over is not None:
            why = (f"{self.name}'s {self.tile(cfg)[0]} x {self.tile(cfg)[1]} tiles in this config need {over}: "
                   f"smaller tiles or fewer stages")
        return why

    def smem_over(self, cfg: dict, cc: int) -> "SmemOver | None":
        """What a block of `cfg` needs beyond what it may have on compute capability cc (smem_limit);
        None where the config fits."""
        need, limit = self.dynamic_smem(cfg), smem_limit(cc)
        return SmemOver(need, limit, cc) if need > limit else None

    def path_configs(self) -> list[tuple[str, int, dict]]:
        """(define, value, config): for each value of each of path_defines other than the default
        config's, the first config_space entry with it. The static checks compile these beside the
        default config, and the regression gate times them (tests/bench), so that every code path
        of the config space is built and timed whatever a tuned table picks."""
        default, out, seen = self.config_defines(None), [], set()
        for name in self.path_defines:
            for config in self.config_space:
                value = self.config_defines(config)[name]
                if value != default[name] and (name, value) not in seen:
                    seen.add((name, value))
                    out.append((name, value, dict(config)))
        return out


_REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    """Add (or replace) a kernel. Decisions and plans made before are forgotten (the cache
    "registry" of deepgemm.caches stands for this table)."""
    _REGISTRY[spec.name] = spec
    caches.clear("registry")
    return spec


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
    caches.clear("registry")


def lookup(name: str) -> KernelSpec | None:
    """The kernel called `name`, or None."""
    return _REGISTRY.get(name)


def get(name: str) -> KernelSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"kernel: unknown kernel {name!r}; available: {', '.join(names(purpose=None))}") from None


PURPOSES = ("gemm", "report")


def names(include_hidden: bool = False, purpose: str | None = "gemm") -> list[str]:
    """Registered kernels of one purpose ("gemm": what the sweep, the ladder, "auto" and kernels()
    see; "report": the accuracy report's variants; None: all)."""
    if purpose is not None and purpose not in PURPOSES:
        raise ValueError(f"purpose: must be one of {PURPOSES} or None, got {purpose!r}")
    return [n for n, s in _REGISTRY.items()
            if (s.public or include_hidden) and (purpose is None or s.purpose == purpose)]


def specs(include_hidden: bool = False, purpose: str | None = "gemm") -> list[KernelSpec]:
    return [_REGISTRY[n] for n in names(include_hidden, purpose)]


def variant_defines(spec: KernelSpec, config: dict, in_dtype: str, out_dtype: str,
                    a_row: bool, b_row: bool, epilogue: Epilogue = NO_EPILOGUE, grouped: bool = False) -> dict:
    d = {"DG_IN": DTYPE_CODES[in_dtype], "DG_OUT": DTYPE_CODES[out_dtype],
         "DG_A_ROW": int(a_row), "DG_B_ROW": int(b_row)}
    if grouped:
        d["DG_GROUPED"] = 1
    d.update(epilogue.defines())
    d.update(spec.defines)
    cfg = spec.config_defines(config)
    d.update(cfg)
    smem = spec.dynamic_smem(cfg)
    if smem:   # the kernels static_assert that their own layout needs exactly this much
        d["DG_HOST_SMEM_BYTES"] = smem
    return d


def variant_name(spec: KernelSpec, in_dtype, out_dtype, a_row, b_row, epilogue, config, grouped=False) -> str:
    layout = ("r" if a_row else "c") + ("r" if b_row else "c")
    return f"{spec.name}{'.grouped' if grouped else ''}[{in_dtype}->{out_dtype},{layout},epi={epilogue},cfg={config}]"


def compile_variant(spec: KernelSpec, arch: str, in_dtype: str, out_dtype: str, a_row: bool, b_row: bool,
                    epilogue: Epilogue = NO_EPILOGUE, config: dict | None = None,
                    grouped: bool = False) -> jit.CompiledKernel:
    """The variant's cubin (jit.compile_kernel: from memory, the disk cache, or a compile)."""
    cc = device_facts.cc_for_arch(arch)
    cfg = spec.config_defines(config)
    if cc < spec.min_cc:
        raise ValueError(f"kernel {spec.name!r} needs compute capability >= {spec.min_cc / 10:.1f}; "
                         f"cannot build it for {arch}")
    if grouped and not spec.grouped:
        raise ValueError(f"kernel {spec.name!r} has no batched/grouped build")
    return jit.compile_kernel(variant_name(spec, in_dtype, out_dtype, a_row, b_row, epilogue, cfg, grouped),
                              spec.source, arch,
                              variant_defines(spec, cfg, in_dtype, out_dtype, a_row, b_row, epilogue, grouped))


# ---------------------------------------------------------------------------------------------
# The ladder. Tile geometry helpers read the same macros the .cu files define.

def _square(cfg):
    return cfg["DG_BM"], cfg["DG_BN"]


register(KernelSpec(
    name="v0", file="v0_naive.cu", min_cc=70,
    summary="naive: one thread per output element, operands from global memory",
    tile=lambda c: (c["DG_BY"], c["DG_BX"]), block=lambda c: (c["DG_BX"], c["DG_BY"], 1),
    default_config={"DG_BX": 32, "DG_BY": 8},
    config_space=({"DG_BX": 32, "DG_BY": 8}, {"DG_BX": 16, "DG_BY": 16}, {"DG_BX": 32, "DG_BY": 4}),
    sass_forbidden=("LOCAL", "VIMNMX.P", "LDG.128"),
))

register(KernelSpec(
    name="v1", file="v1_smem.cu", min_cc=70,
    summary="shared-memory block tiling: BMxBN tile per block, one output per thread",
    tile=_square, block=lambda c: (c["DG_BM"] * c["DG_BN"], 1, 1),
    default_config={"DG_BM": 32, "DG_BN": 32, "DG_BK": 32},
    config_space=({"DG_BM": 32, "DG_BN": 32, "DG_BK": 32}, {"DG_BM": 16, "DG_BN": 16, "DG_BK": 16},
                  {"DG_BM": 16, "DG_BN": 32, "DG_BK": 32}),
))


def _regtile_threads(c):
    return ((c["DG_BM"] // c["DG_TM"]) * (c["DG_BN"] // c["DG_TN"]), 1, 1)


register(KernelSpec(
    name="v2", file="v2_regtile.cu", min_cc=70,
    summary="register tiling: TMxTN accumulators per thread, each loaded value reused across them",
    tile=_square, block=_regtile_threads,
    default_config={"DG_BM": 128, "DG_BN": 128, "DG_BK": 16, "DG_TM": 8, "DG_TN": 8},
    config_space=({"DG_BM": 128, "DG_BN": 128, "DG_BK": 16, "DG_TM": 8, "DG_TN": 8},
                  {"DG_BM": 64, "DG_BN": 64, "DG_BK": 16, "DG_TM": 4, "DG_TN": 4},
                  {"DG_BM": 128, "DG_BN": 64, "DG_BK": 16, "DG_TM": 8, "DG_TN": 4}),
))

register(KernelSpec(
    name="v3", file="v3_padded_vec.cu", min_cc=70,
    summary="V2 + padded shared memory + 128-bit vectorized global/shared loads (scalar tails)",
    tile=_square, block=_regtile_threads,
    default_config={"DG_BM": 128, "DG_BN": 128, "DG_BK": 16, "DG_TM": 8, "DG_TN": 8},
    config_space=({"DG_BM": 128, "DG_BN": 128, "DG_BK": 16, "DG_TM": 8, "DG_TN": 8},
                  {"DG_BM": 64, "DG_BN": 128, "DG_BK": 16, "DG_TM": 4, "DG_TN": 8},
                  {"DG_BM": 128, "DG_BN": 64, "DG_BK": 16, "DG_TM": 8, "DG_TN": 4}),
    sass_required=("LDG.128", "LDS.128"),
))


def _mma_smem(c):   # mirrors DG_SMEM_BYTES in v4_mma.cu: STAGES x (A + B tiles), rows padded by 8 halves unless swizzled
    return c["DG_STAGES"] * (c["DG_BM"] + c["DG_BN"]) * (c["DG_BK"] + (0 if c.get("DG_SWIZZLE") else 8)) * 2


def _mma(bm, bn, bk, stages, swizzle, wm=64, wn=64):   # a full v4 config
    return {"DG_BM": bm, "DG_BN": bn, "DG_BK": bk, "DG_WM": wm, "DG_WN": wn, "DG_STAGES": stages, "DG_GROUP_M": 8,
            "DG_SWIZZLE": swizzle}


# V4's launch geometry (the entry point at the end of kernels/v4_mma.cu says what each block does).
# One GEMM: one block per tile, x along N. Batched and grouped problems (DG_GROUPED = 1), sized
# without the group sizes, which may exist only on the device:
#   batch, masked:   (tiles along N, ceil(M / BM), G): grid.z is the group (M = rows per group).
#   sizes, offsets:  (tiles along N, ceil(M / BM) + G, 1): grid.y counts the groups' tile rows one
#                    group after the other; sum_g ceil(rows_g / BM) <= ceil(M / BM) + G - 1 whatever
#                    the sizes, as long as the groups do not overlap (M = rows of all groups).
GRID_YZ_MAX = 65535   # CUDA's limit on grid.y and grid.z


def _grid_yz(value: int, what: str, advice: str) -> int:
    """value, if it fits grid.y / grid.z; else ValueError "what, over the limit; advice"."""
    if value > GRID_YZ_MAX:
        raise ValueError(f"{what}, over CUDA's grid limit of {GRID_YZ_MAX}; {advice}")
    return value


def block_reason(spec: "KernelSpec", cfg: dict) -> str | None:
    """Why a config gives no block CUDA can launch (None if it does): a tile or block dimension
    below 1 (or a division by zero on the way), or over 1024 threads. What every kernel needs,
    checked for a caller's config before compiling; each kernel's static_asserts check the rest."""
    try:
        tile, block = tuple(spec.tile(cfg)), tuple(spec.block(cfg))
    except ZeroDivisionError:
        return f"{cfg} divides by zero in kernel {spec.name!r}'s tile geometry"
    if min(tile + block) < 1:
        return f"{cfg} gives {tile[0]} x {tile[1]} tiles and {block} blocks: every size must be at least 1"
    if block[0] * block[1] * block[2] > 1024:
        return f"{cfg} gives blocks of {block[0] * block[1] * block[2]} threads, over CUDA's 1024"
    return None


def tile_grid(name: str, rows: int, cols: int, problem: Problem) -> tuple[int, int, int]:
    """One block per rows x cols tile of D, x along N: the launch grid of kernels without a grid
    hook, and V4's for one GEMM."""
    tiles_m = -(-problem.m // rows)
    return (-(-problem.n // cols), _grid_yz(tiles_m, f"a: M={problem.m} needs {tiles_m} row tiles for kernel {name!r}",
                                            "split the call along M"), 1)


def _mma_grid(c, problem: Problem, sm_count: int = 0) -> tuple[int, int, int]:
    bm, bn = _square(c)
    tiles_n, tiles_m = -(-problem.n // bn), -(-problem.m // bm)
    groups = problem.groups
    if groups is None:
        return tile_grid("v4", bm, bn, problem)
    if groups.contiguous:
        rows = tile_bound(groups.mode, groups.count, problem.m, bm)
        return (tiles_n, _grid_yz(rows, f"a: M={problem.m} rows in {groups.count} groups need {rows} row tiles "
                                        f"(ceil(M/{bm}) + groups) for kernel 'v4'",
                                  "split the call along M or into fewer groups"), 1)
    return (tiles_n,
            _grid_yz(tiles_m, f"a: M={problem.m} rows per group need {tiles_m} row tiles for kernel 'v4'",
                     "split the groups along M"),
            _grid_yz(groups.count, f"a: {groups.count} groups need {groups.count} grid slices (grid.z) for "
                                   f"kernel 'v4'", "split the call into fewer groups"))


def _block_coords(pid: int, grid_m: int, grid_n: int, group_m: int) -> tuple[int, int]:
    """v4_mma.cu block_coords: linear block id -> (tile row, tile column) in the GROUP_M raster."""
    group = pid // (group_m * grid_n)
    first_m = group * group_m
    gsize = min(grid_m - first_m, group_m)
    q = pid - group * group_m * grid_n
    return first_m + q % gsize, q // gsize


def v4_block_map(c: dict, problem: Problem, group_rows=()) -> dict:
    """A model of V4's grouped entry point: every block (x, y, z) of the launch grid (_mma_grid)
    -> (group, tile row within the group, tile column) it computes, or None for a block that exits
    at once. group_rows: what the device array holds (counts or G + 1 offsets; unused for "batch").
    For tests on the host: each tile of each group must be some block's, exactly once."""
    bm, _ = _square(c)
    gx, gy, gz = _mma_grid(c, problem)
    groups = problem.groups
    spans = row_ranges(groups.mode, group_rows, groups.count, problem.m)
    out = {}
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                row, col = _block_coords(y * gx + x, gy, gx, c["DG_GROUP_M"])
                tile = None
                if groups.contiguous:
                    for g, (_, rows) in enumerate(spans):   # the walk over the groups' tile rows
                        tiles = -(-rows // bm)
                        if row < tiles:
                            tile = (g, row, col)
                            break
                        row -= tiles
                elif z < groups.count and row * bm < spans[z][1]:
                    tile = (z, row, col)
                out[(x, y, z)] = tile
    return out


register(KernelSpec(
    name="v4", file="v4_mma.cu", min_cc=80,
    summary="tensor cores: ldmatrix + mma.sync m16n8k16, cp.async multi-stage pipeline, warp tiling",
    tile=_square, block=lambda c: ((c["DG_BM"] // c["DG_WM"]) * (c["DG_BN"] // c["DG_WN"]) * 32, 1, 1),
    default_config=_mma(256, 128, 64, 3, 1),   # H200 at 5b512bf: 436.5 TFLOP/s at 4096³ (docs/performance.md)
    # 128x128: 2 blocks/SM; 128x256, 256x128 (8 warps): 1 block/SM; swizzled tiles need no padding, so
    # BK = 64 (half the barriers per mma) fits 3 stages at 2 blocks/SM. All fit sm_80's 163 KB.
    config_space=(_mma(128, 128, 32, 4, 0), _mma(128, 256, 32, 3, 0), _mma(64, 64, 32, 4, 0, 32, 32),
                  _mma(128, 128, 32, 4, 1), _mma(128, 128, 64, 3, 0), _mma(128, 128, 64, 3, 1),
                  _mma(128, 256, 32, 4, 1), _mma(128, 256, 64, 3, 1), _mma(256, 128, 64, 3, 1)),
    accumulate="fp32_tc", dynamic_smem=_mma_smem,
    sass_required=("HMMA", "LDSM", "LDGSTS"), archs=("sm_80", "sm_90a"), path_defines=("DG_SWIZZLE",),
    grid=_mma_grid, grouped=True,
))


# The dynamic shared memory one block may opt in to, per compute capability (CUDA C++ Programming
# Guide, technical specifications per compute capability): 163 KB on the A100 and Orin (8.0, 8.7),
# 227 KB on Hopper and data-centre Blackwell (9.0, 10.0), 99 KB on the other Ampere and Ada parts
# (8.6: A10, A40, RTX 30; 8.9: L4, L40S, RTX 40) and on consumer Blackwell (12.0). The kernels are
# compiled for each GPU's own arch, so a config that fits sm_80 may still not fit the GPU.
SMEM_OPTIN = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024,
              120: 99 * 1024}


class SmemOver(NamedTuple):
    """A config's shared memory per block over a GPU's limit; reads as the reason, in one wording for
    every message that gives it."""
    need: int
    limit: int
    cc: int

    def __str__(self) -> str:
        return (f"{self.need} bytes of shared memory, over the {self.limit} a block may have on compute "
                f"capability {self.cc / 10:.1f}")


def smem_limit(cc: int) -> int:
    """Dynamic shared memory (bytes) one block may have on compute capability cc; one not listed in
    SMEM_OPTIN gets the smallest listed, so a config deepgemm picks there fits every listed GPU."""
    return SMEM_OPTIN.get(cc, min(SMEM_OPTIN.values()))


# Per target arch of the static checks (the kernels' static_asserts hold the 227 KB of sm_90).
DYNAMIC_SMEM_LIMIT = {"sm_80": smem_limit(80), "sm_90a": smem_limit(90)}


def _wgmma_consumers(c) -> int:   # CONSUMERS in v5_wgmma.cu: one for 64-row tiles, else two
    return 1 if c["DG_BM"] < 128 else 2


def _wgmma_smem(c):   # mirrors SMEM_BYTES in v5_wgmma.cu: alignment slack + ring + D staging + mbarriers
    consumers = _wgmma_consumers(c)
    # 64-row halves per consumer: a ping-pong consumer stages a whole tile, a 256-row tile's two each
    halves = c["DG_BM"] // 64 // (1 if c["DG_PINGPONG"] else consumers)
    units = consumers * halves                              # staging tiles, each with 2 mbarriers
    bias_slots = 2 if c["DG_PINGPONG"] else 1               # a tile's BN FP32 bias values each
    return 1024 + c["DG_STAGES"] * (c["DG_BM"] + c["DG_BN"]) * 64 * 2 \
        + c["DG_EPI_TMA"] * (units * (-(-c["DG_BN"] // 64) * 8192 + 16) + 8 + bias_slots * c["DG_BN"] * 4) \
        + 16 * c["DG_STAGES"]


def _v5_supports(problem: Problem) -> str | None:
    # Operands TMA cannot read (misaligned base or leading dimension) are staged, not refused;
    # except in a grouped problem (a copy per group, of sizes the host may not know), which then
    # goes to another kernel.
    if problem.cc != 90:
        return f"V5 uses wgmma and TMA, which exist on sm_90a (Hopper) only; this GPU is sm_{problem.cc}"
    if problem.groups is not None:
        from deepgemm import tma
        return tma.grouped_reason(problem)
    return None


def _v5_config_supports(c, problem: Problem) -> str | None:
    # The values v5_wgmma.cu's static_asserts accept, checked before compiling so that a bad config
    # is a ValueError naming the parameter, not a compiler log.
    for name, allowed in (("DG_BM", (64, 128, 256)), ("DG_BN", (64, 96, 128, 192, 256)), ("DG_SPLIT_K", tuple(range(1, 9))),
                          ("DG_PINGPONG", (0, 1)), ("DG_EPI_TMA", (0, 1)), ("DG_CLUSTER_M", (1, 2))):
        if c[name] not in allowed:
            return f"{name}={c[name]!r} is not one of {list(allowed)}"
    if c["DG_STAGES"] < 2:
        return f"DG_STAGES={c['DG_STAGES']}: the ring needs at least 2 stages"
    if c["DG_BN"] % 64 and problem.b is not None and problem.b.row_major:
        return (f"DG_BN={c['DG_BN']} needs a column-major (K-major) b: a row-major b is read in 64-column "
                f"blocks")
    if c["DG_PINGPONG"] and (c["DG_BM"] != 128 or c["DG_BN"] > 128 or c["DG_SPLIT_K"] > 1):
        return (f"DG_PINGPONG=1 takes 128-row tiles at most 128 wide without split-K (a consumer holds a whole "
                f"tile's accumulators), not DG_BM={c['DG_BM']}, DG_BN={c['DG_BN']}, DG_SPLIT_K={c['DG_SPLIT_K']}")
    if c["DG_BM"] == 256 and (c["DG_BN"] > 128 or c["DG_PINGPONG"] or c["DG_SPLIT_K"] > 1 or c["DG_CLUSTER_M"] > 1):
        return (f"DG_BM=256 takes tiles at most 128 wide, cooperative, without split-K or multicast (each consumer "
                f"holds two 64-row halves' accumulators), not DG_BN={c['DG_BN']}, DG_PINGPONG={c['DG_PINGPONG']}, "
                f"DG_SPLIT_K={c['DG_SPLIT_K']}, DG_CLUSTER_M={c['DG_CLUSTER_M']}")
    if c["DG_SPLIT_K"] > 1 and c["DG_STAGES"] * (c["DG_BM"] + c["DG_BN"]) * 128 < c["DG_BM"] * c["DG_BN"] * 4:
        return (f"DG_SPLIT_K={c['DG_SPLIT_K']}: the ring of DG_STAGES={c['DG_STAGES']} is too small to park a "
                f"{c['DG_BM']} x {c['DG_BN']} tile's FP32 partial sums: more stages")
    if c["DG_SPLIT_K"] > 1 and problem.groups is not None:
        return (f"DG_SPLIT_K={c['DG_SPLIT_K']} has no grouped build: a split-K launch is one cluster per tile, "
                f"and a grouped problem's tiles depend on group sizes the host does not read")
    if c["DG_CLUSTER_M"] > 1:
        if c["DG_SPLIT_K"] > 1:
            return f"DG_CLUSTER_M={c['DG_CLUSTER_M']} and DG_SPLIT_K={c['DG_SPLIT_K']}: each uses the cluster; one at a time"
        if problem.groups is not None:
            return f"DG_CLUSTER_M={c['DG_CLUSTER_M']} has no grouped build"
        if problem.b is not None and problem.b.row_major and (c["DG_BN"] // 64) % c["DG_CLUSTER_M"]:
            return (f"DG_CLUSTER_M={c['DG_CLUSTER_M']} with DG_BN={c['DG_BN']} and a row-major b: each block loads "
                    f"whole 64-column blocks of B's tile, so DG_BN / 64 must divide by {c['DG_CLUSTER_M']}")
    return None


def _v5_grid(c, problem: Problem, sm_count: int):
    # Persistent (at most one block per SM), or with split-K one cluster of DG_SPLIT_K blocks per tile;
    # with DG_CLUSTER_M, persistent clusters, each walking pairs of tile rows.
    tiles_n = -(-problem.n // c["DG_BN"])
    groups = problem.groups
    if groups is not None:
        # The walk covers every group's tiles, however many SMs there are; sized from a bound that
        # needs no group size (those may be on the device only): G x ceil(M / BM) tile rows when
        # every group has at most M rows, ceil(M / BM) + G when the groups share M rows (each
        # group's last tile row may be partial).
        return (max(1, min(sm_count, tile_bound(groups.mode, groups.count, problem.m, c["DG_BM"]) * tiles_n)), 1, 1)
    cluster = c["DG_CLUSTER_M"]
    if cluster > 1:
        pairs = -(-problem.m // (c["DG_BM"] * cluster)) * tiles_n
        return (cluster * max(1, min(pairs, sm_count // cluster)), 1, 1)
    tiles = -(-problem.m // c["DG_BM"]) * tiles_n
    split = c["DG_SPLIT_K"]
    return (tiles * split if split > 1 else min(tiles, sm_count), 1, 1)


def _v5_sass_counts(c) -> dict:
    # Races the GPU tier did not show on the H200 (mutation runs), so the barriers are counted:
    # * the block barrier after thread 0 initialises the mbarriers (V5's only one of every thread;
    #   the rest are named barriers of its warpgroups): without it a warp may wait on an mbarrier
    #   before it exists;
    # * a multicast build synchronises its cluster twice (arrive + wait each): before anything
    #   reaches the other block's barriers, and as the consumers end, so that neither block exits
    #   while the other may still write into its ring or arrive on its barriers (the producer
    #   warpgroup exits before that, which counts as arriving).
    return {"BLOCK_BAR": 1, **({"CLUSTER_BAR": 4} if c["DG_CLUSTER_M"] > 1 else {})}


def _v5_sass_at_most(c) -> dict:
    # The producer's k-loop in uniform registers: no R2UR before its TMA loads (deepgemm.binary,
    # tma_issue_moves). A branch for another role that lanes of its warp might take compiled it for
    # divergence instead, which cost 64x64 tiles a sixth of their speed with a staged bias (the role
    # branch is taken on dg::warp_id_uniform for that; and the producer warpgroup of the cluster
    # builds, split-K and multicast, exits instead of waiting at the consumers' cluster barriers,
    # where warp 0's other lanes waited for the producer's thread). The grouped build with A
    # column-major and B row-major is uniform but issues 2 + 4 boxes per k-block, and ptxas keeps
    # B's group coordinate and column in vector registers there: 5 R2UR per k-block where the rr
    # build has UMOVs, with no more instructions per load (44-46 in all).
    if c.get("DG_GROUPED") and not c["DG_A_ROW"] and c["DG_B_ROW"]:
        return {}
    return {"TMA_ISSUE_R2UR": 0}


def _v5_stages_c(c, problem: Problem) -> bool:
    # Whether the config stages a 16-bit C in shared memory (C_STAGED in v5_wgmma.cu, less C's
    # dtype, which tma checks): 16-bit D through the staging tiles, no split-K.
    return bool(c["DG_EPI_TMA"]) and c["DG_SPLIT_K"] == 1 and problem.out_dtype != "float32"


def _v5_tensor_maps(c, problem: Problem, device: int, stream):
    from deepgemm import tma
    return tma.prepare(problem, c["DG_BM"], c["DG_BN"], _v5_stages_c(c, problem),
                       device_facts.arch_for_cc(problem.cc), device, stream, b_share=c["DG_CLUSTER_M"])


def _v5_pointer_maps(c, problem: Problem):
    from deepgemm import tma
    return tma.pointer_maps(problem, c["DG_BM"], c["DG_BN"], _v5_stages_c(c, problem), b_share=c["DG_CLUSTER_M"])   # None for a grouped problem


register(KernelSpec(
    name="v5", file="v5_wgmma.cu", min_cc=90,
    summary="Hopper: TMA + mbarrier ring, warp-specialised (1 producer, 2 wgmma consumer warpgroups; 1 for "
            "64-row tiles), persistent grid",
    tile=lambda c: (c["DG_BM"], c["DG_BN"]), block=lambda c: (128 * (_wgmma_consumers(c) + 1), 1, 1),
    default_config={"DG_BM": 128, "DG_BN": 256, "DG_STAGES": 3, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 1,
                    "DG_PINGPONG": 0, "DG_CLUSTER_M": 1},
    config_space=({"DG_BN": 256, "DG_STAGES": 3, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BN": 256, "DG_STAGES": 4, "DG_GROUP_M": 8, "DG_EPI_TMA": 0},
                  {"DG_BN": 128, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BN": 256, "DG_STAGES": 3, "DG_GROUP_M": 16, "DG_EPI_TMA": 1},
                  {"DG_BN": 64, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BN": 192, "DG_STAGES": 4, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  # 96-wide tiles (K-major b only): 128 tiles where 128-wide ones leave SMs idle (M = 512)
                  {"DG_BN": 96, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BN": 96, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  {"DG_BN": 96, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 4},
                  # split-K clusters, for few tiles over a long K (e.g. 512 x 768 x 3072), and for
                  # decode-sized M, where the tiles of one tile row are too few to stream B from every SM
                  {"DG_BN": 64, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  {"DG_BN": 64, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 4},
                  {"DG_BN": 64, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 8},
                  {"DG_BN": 128, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  {"DG_BN": 128, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 4},
                  {"DG_BN": 192, "DG_STAGES": 4, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  {"DG_BN": 192, "DG_STAGES": 4, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 4},
                  # 64-row tiles (one consumer warpgroup) for M <= 64: no zero-filled half tile, and
                  # smaller stages, so more of them in flight while B streams
                  {"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BM": 64, "DG_BN": 96, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  {"DG_BM": 64, "DG_BN": 64, "DG_STAGES": 12, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  {"DG_BM": 64, "DG_BN": 64, "DG_STAGES": 12, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 4},
                  # 64-row tiles, wide, at 512 rows: more blocks than 128-row tiles give, with the same
                  # bytes per k-block (e.g. 512 x 3072: 128 tiles of 64 x 192 against 96 of 128 x 128)
                  {"DG_BM": 64, "DG_BN": 192, "DG_STAGES": 6, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BM": 64, "DG_BN": 256, "DG_STAGES": 4, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BM": 64, "DG_BN": 96, "DG_STAGES": 10, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_SPLIT_K": 2},
                  # 64 x 64 over the whole K: as many blocks as split-K 2 of 128 x 64 gives where N is small
                  # (512 x 768: 96 tiles), with no partial sums to exchange
                  {"DG_BM": 64, "DG_BN": 64, "DG_STAGES": 12, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  # 256 x 64: where N is 64 (attention's P x V), one tile of 256 rows per block reads
                  # B once where two 128-row tiles read it twice; 256 x 128 likewise at N = 128
                  {"DG_BM": 256, "DG_BN": 64, "DG_STAGES": 4, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  {"DG_BM": 256, "DG_BN": 128, "DG_STAGES": 3, "DG_GROUP_M": 8, "DG_EPI_TMA": 1},
                  # ping-pong: the consumers take whole tiles in turn, one's epilogue under the other's wgmmas
                  {"DG_BN": 128, "DG_STAGES": 5, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_PINGPONG": 1},
                  {"DG_BN": 64, "DG_STAGES": 8, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_PINGPONG": 1},
                  # two blocks per cluster sharing B by TMA multicast (half of B's L2 traffic)
                  # (on the H200 0.4-3 % slower than the same tiles without it from 4096^3 to 8192^3, 6 % at 2048^3,
                  # 1.5-1.9x at 512 rows: docs/performance.md, TMA multicast; kept for the tuner and other GPUs)
                  {"DG_BN": 256, "DG_STAGES": 3, "DG_GROUP_M": 8, "DG_EPI_TMA": 1, "DG_CLUSTER_M": 2}),
    # (BN = 256 with split-K spills: its 128 accumulators leave no room for the reduction; so does
    # 64 x 192 with split-K and the whole epilogue chain.)
    accumulate="fp32_tc", dynamic_smem=_wgmma_smem,
    sass_required=("HGMMA", "UTMALDG"), sass_counts=_v5_sass_counts, sass_at_most=_v5_sass_at_most, archs=("sm_90a",),
    path_defines=("DG_PINGPONG", "DG_SPLIT_K", "DG_BM", "DG_EPI_TMA", "DG_CLUSTER_M"),
    supports=_v5_supports, config_supports=_v5_config_supports, grid=_v5_grid, extra_args=_v5_tensor_maps, pointer_args=_v5_pointer_maps,
    grouped=True, pdl=True,
))


# small_m (kernels/small_m.cu): decode-sized M, a weight stream. Block = 16*MT rows x 8*NT columns,
# WARPS warps splitting K; gridDim.y covers M in row blocks (each re-streams B: pick MT >= M/16).
SMALL_M_MAX = 64


def _small_m_supports(problem: Problem) -> str | None:
    if problem.m > SMALL_M_MAX:
        return f"M={problem.m} is over small_m's limit of {SMALL_M_MAX} (a weight-streaming kernel for small M)"
    return None


def _small_m_tile(c):
    return 16 * c["DG_SMALL_M_MT"], 8 * c["DG_SMALL_M_NT"]


def _small_m_grid(c, problem: Problem, sm_count: int):
    rows, cols = _small_m_tile(c)
    return (-(-problem.n // cols), -(-problem.m // rows), 1)


def _small_m(nt, mt, warps, unroll, stages=1):   # a full small_m config
    return {"DG_SMALL_M_NT": nt, "DG_SMALL_M_MT": mt, "DG_SMALL_M_WARPS": warps, "DG_SMALL_M_UNROLL": unroll,
            "DG_SMALL_M_STAGES": stages}


def _small_m_sass_counts(d) -> dict:
    """B's 16-byte loads: LDG.128 into registers, or, with the ring (STAGES >= 2, B K-contiguous), the
    16-byte cp.async of LDGSTS."""
    return {"LDGSTS": 1} if d["DG_SMALL_M_STAGES"] >= 2 and not d["DG_B_ROW"] else {"LDG.128": 1}


def _small_m_smem(c):
    """The reduction buffer (WARPS x rows x columns floats), or the cp.async ring of STAGES groups per
    warp where that is larger (kernels/small_m.cu's SMEM_BYTES)."""
    red = c["DG_SMALL_M_WARPS"] * 16 * c["DG_SMALL_M_MT"] * 8 * c["DG_SMALL_M_NT"] * 4
    ring = c["DG_SMALL_M_WARPS"] * c["DG_SMALL_M_STAGES"] * c["DG_SMALL_M_UNROLL"] * c["DG_SMALL_M_NT"] * 32 * 16
    return max(red, ring) if c["DG_SMALL_M_STAGES"] >= 2 else red


register(KernelSpec(
    name="small_m", file="small_m.cu", min_cc=80,
    summary="small M (<= 64): split-K inside the block over mma.sync, B streamed once with 16-byte loads, "
            "deterministic in-block reduction, one launch",
    tile=_small_m_tile, block=lambda c: (32 * c["DG_SMALL_M_WARPS"], 1, 1),
    # a block's warps take 32 * UNROLL k values each in turn: K past WARPS of those reaches every warp,
    # past twice that the second round
    k_step=lambda c: 32 * c["DG_SMALL_M_UNROLL"] * c["DG_SMALL_M_WARPS"],
    default_config=_small_m(2, 1, 8, 4),
    config_space=(_small_m(2, 1, 8, 4), _small_m(1, 1, 8, 4), _small_m(4, 1, 8, 2), _small_m(2, 1, 16, 2),
                  _small_m(2, 1, 4, 8), _small_m(1, 1, 16, 4), _small_m(2, 2, 8, 2), _small_m(2, 4, 8, 1),
                  _small_m(4, 4, 8, 1), _small_m(4, 1, 8, 1, 2), _small_m(4, 1, 8, 1, 3), _small_m(2, 1, 16, 1, 3)),
    dynamic_smem=_small_m_smem,
    accumulate="fp32_tc", sass_required=("HMMA",), sass_counts=_small_m_sass_counts, archs=("sm_80", "sm_90a"),
    path_defines=("DG_SMALL_M_STAGES",),
    supports=_small_m_supports, grid=_small_m_grid, pdl=True,
))


# ---------------------------------------------------------------------------------------------
# Accuracy-report variants (purpose "report"): FP16 accumulation, so they fail the sweep's FP32
# error bound by design. Selected by name or by gemm(..., accumulate="fp16"); never by "auto".

register(KernelSpec(
    name="fp16acc_simt", file="fp16acc_simt.cu", min_cc=80, purpose="report",
    summary="CUDA cores, __hfma2 half-precision accumulators rounded after every k "
            "(fp16 inputs: fp16; bf16 inputs: bf16 accumulation)",
    tile=_square, block=lambda c: ((c["DG_BN"] // 2) * (c["DG_BM"] // c["DG_TM"]), 1, 1),
    default_config={"DG_BM": 32, "DG_BN": 64, "DG_BK": 32, "DG_TM": 4},
    accumulate="fp16",
))

register(KernelSpec(
    name="fp16acc_mma", file="v4_mma.cu", min_cc=80, purpose="report",
    summary="V4 with mma.sync m16n8k16 f16 accumulators (HMMA.16816.F16); fp16 inputs only",
    tile=_square, block=lambda c: ((c["DG_BM"] // c["DG_WM"]) * (c["DG_BN"] // c["DG_WN"]) * 32, 1, 1),
    default_config=_mma(128, 128, 32, 4, 0), defines={"DG_ACC_F16": 1},
    accumulate="fp16_tc", dynamic_smem=_mma_smem, input_dtypes=("float16",),
    sass_required=("HMMA", "LDSM", "LDGSTS"),
))

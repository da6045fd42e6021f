"""Static checks that need no GPU: every kernel variant compiles for each target arch with no
spills, no local memory and no performance warning from ptxas, fits the shared-memory limit, and its
SASS holds the instructions its ladder step claims. Used by the CPU test tier and by
`python -m deepgemm` on a machine without a GPU.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

from deepgemm import binary, device, jit, registry
from deepgemm.registry import DYNAMIC_SMEM_LIMIT, INPUT_DTYPES, OUTPUT_DTYPES, Epilogue, KernelSpec

# The largest static smem a block may have; dynamic smem may go up to the opt-in limit.
STATIC_SMEM_LIMIT = 48 * 1024
# The whole chain, with three different dtypes, so every epilogue code path is compiled.
FULL_EPILOGUE = Epilogue(alpha=True, bias="float32", activation="gelu", scale="bfloat16", residual="float16")


@dataclass(frozen=True)
class Variant:
    spec: KernelSpec
    arch: str
    in_dtype: str
    out_dtype: str
    a_row: bool
    b_row: bool
    epilogue: Epilogue = Epilogue()
    config: tuple = ()          # sorted (define, value) pairs of a config_space entry; () = the default
    grouped: bool = False       # the batched/grouped build (DG_GROUPED = 1)

    def compile(self) -> jit.CompiledKernel:
        return registry.compile_variant(self.spec, self.arch, self.in_dtype, self.out_dtype,
                                        self.a_row, self.b_row, self.epilogue, dict(self.config) or None,
                                        grouped=self.grouped)

    def __str__(self) -> str:
        layout = ("r" if self.a_row else "c") + ("r" if self.b_row else "c")
        name = self.spec.name + (".grouped" if self.grouped else "")
        text = f"{name}-{self.arch}-{self.in_dtype}-{self.out_dtype}-{layout}-{self.epilogue}"
        return text + (f"-cfg{dict(self.config)}" if self.config else "")


@dataclass
class CheckResult:
    variant: Variant
    resources: dict
    features: dict
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


LAYOUTS = ((True, True), (True, False), (False, True), (False, False))   # (a_row, b_row): rr rc cr cc


def _layout_allowed(spec: KernelSpec, config: dict, a_row: bool, b_row: bool) -> bool:
    """Whether the config can run this layout at all (V5's 96-wide tiles need a K-major b)."""
    a, b = SimpleNamespace(row_major=a_row), SimpleNamespace(row_major=b_row)
    return spec.config_supports(spec.config_defines(config), registry.Problem(64, 64, 64, a=a, b=b)) is None


def coverage_variants(spec: KernelSpec, arch: str, config: dict | None = None) -> list[Variant]:
    """The fewest variants that compile every code path of a kernel once: one per layout, the input
    dtypes and the output dtypes taken in turn, the whole epilogue chain on the rc layout
    (nn.Linear's, the most registers). With two input and three output dtypes: rr f16->f16,
    rc bf16->bf16 + chain, cr f16->f32, cc bf16->f16 (only the input dtypes the kernel accepts:
    fp16acc_mma has no bf16 form)."""
    ins = [i for i in INPUT_DTYPES if i in spec.input_dtypes]
    items = tuple(sorted(config.items())) if config else ()
    out = []
    for i, (a_row, b_row) in enumerate(LAYOUTS):
        if config and not _layout_allowed(spec, config, a_row, b_row):
            continue
        epilogue = FULL_EPILOGUE if (a_row, b_row) == (True, False) else Epilogue()
        out.append(Variant(spec, arch, ins[i % len(ins)], OUTPUT_DTYPES[i % len(OUTPUT_DTYPES)], a_row, b_row,
                           epilogue, items))
    return out


def path_variants(spec: KernelSpec, arch: str) -> list[Variant]:
    """On the kernel's newest arch, one variant per other value of each of its path_defines: the first
    config_space entry with that value, with the whole epilogue chain on the rc layout (the most
    code and registers; rr where the config refuses rc). ptxas may compile such a path slower than
    written (serialized wgmma in V5's ping-pong consumers) while the default config's is fine."""
    if arch != spec.archs[-1]:
        return []
    out = []
    for _, _, config in spec.path_configs():
        a_row, b_row = (True, False) if _layout_allowed(spec, config, True, False) else (True, True)
        out.append(Variant(spec, arch, INPUT_DTYPES[0], INPUT_DTYPES[0], a_row, b_row, FULL_EPILOGUE,
                           tuple(sorted(config.items()))))
    return out


def grouped_variants(spec: KernelSpec, arch: str) -> list[Variant]:
    """The batched/grouped build of a kernel that has one: fp16, row-major, the whole epilogue chain.
    Its own code (the group walk, per-group views) compiles only there; tests/cpu/test_v4_grouped.py
    and test_v5_grouped.py check every layout, and mutation runs compile this one per mutant."""
    if not spec.grouped:
        return []
    return [Variant(spec, arch, INPUT_DTYPES[0], INPUT_DTYPES[0], True, True, FULL_EPILOGUE, grouped=True)]


def variants(spec: KernelSpec, arch: str, full: bool = False) -> list[Variant]:
    """What the static checks compile for one kernel and arch.

    Default: coverage_variants at the default config (four variants) and path_variants. full=True
    (`pytest --sweep=full`, `python -m deepgemm static --all`): every input dtype x output dtype x layout,
    plus the whole epilogue chain per layout; and on the kernel's newest arch, coverage_variants of
    every other config_space entry (the tuner may pick any of them on a GPU)."""
    if not full:
        return coverage_variants(spec, arch) + path_variants(spec, arch)
    ins = [i for i in INPUT_DTYPES if i in spec.input_dtypes]
    out = [Variant(spec, arch, i, o, ar, br)
           for i, o, (ar, br) in itertools.product(ins, OUTPUT_DTYPES, LAYOUTS)]
    out += [Variant(spec, arch, i, i, ar, br, FULL_EPILOGUE) for i, (ar, br) in itertools.product(ins, LAYOUTS)]
    if arch == spec.archs[-1]:
        default = spec.config_defines(None)
        for config in spec.config_space:
            if spec.config_defines(config) != default:
                out += coverage_variants(spec, arch, spec.config_defines(config))
    return out


def check(variant: Variant, compiled: jit.CompiledKernel, config: dict | None = None) -> CheckResult:
    """Problems of one compiled variant; `config`: the tile config it was built with (default: the
    variant's own). The SASS feature counts come from jit.sass_features (disassembled once per cubin)."""
    res = compiled.resources
    features = jit.sass_features(compiled.cubin_path)
    result = CheckResult(variant, res, features)
    if not res:
        result.problems.append("no ptxas resource report in the compile log")
    else:
        if res["stack"] or res["spill_stores"] or res["spill_loads"]:
            result.problems.append(f"stack frame {res['stack']} B, spills {res['spill_stores']}/{res['spill_loads']} B")
        if res["smem"] > STATIC_SMEM_LIMIT:
            result.problems.append(f"static smem {res['smem']} B over {STATIC_SMEM_LIMIT}")
    result.problems += [f"ptxas: {w}" for w in binary.performance_warnings(compiled.log)]
    cfg = variant.spec.config_defines(config if config is not None else dict(variant.config) or None)
    dyn = variant.spec.dynamic_smem(cfg)
    if dyn + res.get("smem", 0) > DYNAMIC_SMEM_LIMIT.get(variant.arch, STATIC_SMEM_LIMIT):
        result.problems.append(f"shared memory {dyn + res.get('smem', 0)} B over the {variant.arch} limit")
    # The block the launcher will use (KernelSpec.block) against the one the kernel is compiled for:
    # more threads than its __launch_bounds__ and the launch fails; fewer, and part of each tile is
    # left to threads that do not exist.
    bounds = binary.kernel_attributes(compiled.cubin_path).get(jit.ENTRY_POINT, {}).get("max_threads")
    block = variant.spec.block(cfg)
    if bounds is not None and math.prod(block) != math.prod(bounds):
        result.problems.append(f"the launcher's block {tuple(block)} has {math.prod(block)} threads, the kernel's "
                               f"__launch_bounds__ {math.prod(bounds)}")
    for name in variant.spec.sass_required:
        if not features[name]:
            result.problems.append(f"SASS lacks {name}")
    if variant.spec.pdl and device.cc_for_arch(variant.arch) >= 90 and not features["PDL_WAIT"]:
        # launched as a programmatic dependent: without the wait it would read the previous kernel's
        # output before that kernel is done
        result.problems.append("SASS lacks PDL_WAIT (griddepcontrol.wait), yet the kernel is launched with PDL")
    for name in variant.spec.sass_forbidden:
        if features[name]:
            result.problems.append(f"SASS has {features[name]} x {name}")
    defines = registry.variant_defines(variant.spec, cfg, variant.in_dtype, variant.out_dtype, variant.a_row,
                                       variant.b_row, variant.epilogue, variant.grouped)
    for name, least in variant.spec.sass_counts(defines).items():
        if features[name] < least:
            result.problems.append(f"SASS has {features[name]} x {name}, the design needs at least {least}")
    for name, most in variant.spec.sass_at_most(defines).items():
        if features[name] > most:
            result.problems.append(f"SASS has {features[name]} x {name}, the design allows at most {most}")
    return result


def plan(specs=None, archs=None, full: bool = False) -> list[Variant]:
    """Every variant to check: each kernel (default: every registered public kernel, the ladder's and
    the accuracy report's) for each arch it targets that is in `archs` (default: all of them)."""
    specs = registry.specs(purpose=None) if specs is None else specs
    return [v for spec in specs for arch in spec.archs if archs is None or arch in archs
            for v in variants(spec, arch, full)]


def run_all(specs=None, archs=None, full: bool = False, workers=None, progress=None) -> list[CheckResult]:
    """Compile and check (disassemble) every variant of plan(specs, archs, full), in parallel;
    progress(done, total) after each."""
    todo = plan(specs, archs, full)
    return jit.compile_many([lambda v=v: check(v, v.compile()) for v in todo], workers=workers, progress=progress)


def summary_table(results: list[CheckResult]) -> str:
    """One line per kernel x arch: variants, max registers, smem, SASS features, problems."""
    rows = {}
    for r in results:
        key = (r.variant.spec.name, r.variant.arch)
        row = rows.setdefault(key, {"n": 0, "regs": 0, "smem": 0, "features": set(), "problems": 0})
        row["n"] += 1
        row["regs"] = max(row["regs"], r.resources.get("registers", 0))
        row["smem"] = max(row["smem"], r.resources.get("smem", 0))
        row["features"] |= {k for k, v in r.features.items() if v and k in binary.LADDER_PATTERNS and k != "LOCAL"}
        row["problems"] += len(r.problems)
    w = max([8] + [len(name) for name, _ in rows])
    lines = [f"{'kernel':{w}} {'arch':7} {'variants':>8} {'max regs':>8} {'smem B':>7}  {'SASS features':32} status"]
    for (name, arch), row in rows.items():
        status = "ok" if not row["problems"] else f"{row['problems']} problem(s)"
        lines.append(f"{name:{w}} {arch:7} {row['n']:>8} {row['regs']:>8} {row['smem']:>7}  "
                     f"{','.join(sorted(row['features'])) or '-':32} {status}")
    return "\n".join(lines)

"""Static checks that need no GPU: every kernel variant compiles for each target arch with no
spills and no local memory, fits the shared-memory limit, and its SASS holds the instructions its
ladder step claims. Used by the CPU test tier and by `python -m deepgemm` on a machine without a GPU.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from deepgemm import binary, jit, registry
from deepgemm.registry import INPUT_DTYPES, OUTPUT_DTYPES, Epilogue, KernelSpec

# The largest static smem a block may have; dynamic smem may go up to the opt-in limit.
STATIC_SMEM_LIMIT = 48 * 1024
DYNAMIC_SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024}
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

    def compile(self) -> jit.CompiledKernel:
        return registry.compile_variant(self.spec, self.arch, self.in_dtype, self.out_dtype,
                                        self.a_row, self.b_row, self.epilogue)

    def __str__(self) -> str:
        layout = ("r" if self.a_row else "c") + ("r" if self.b_row else "c")
        return f"{self.spec.name}-{self.arch}-{self.in_dtype}-{self.out_dtype}-{layout}-{self.epilogue}"


@dataclass
class CheckResult:
    variant: Variant
    resources: dict
    features: dict
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def variants(spec: KernelSpec, arch: str) -> list[Variant]:
    """What the static checks compile for one kernel and arch.

    sm_90a (the GPU we ship for): every input dtype x output dtype x layout, plus the full epilogue
    chain per layout. Other archs: every input dtype x layout (output = input) plus the full chain,
    which covers each code path once at a third of the compile time. Only the input dtypes the
    kernel accepts (spec.input_dtypes: fp16acc_mma has no bf16 form)."""
    ins = [i for i in INPUT_DTYPES if i in spec.input_dtypes]
    outs = OUTPUT_DTYPES if arch == "sm_90a" else (None,)
    out = [Variant(spec, arch, i, o or i, ar, br)
           for i, o, ar, br in itertools.product(ins, outs, (True, False), (True, False))]
    out += [Variant(spec, arch, i, i, ar, br, FULL_EPILOGUE)
            for i, ar, br in itertools.product(ins, (True, False), (True, False))]
    return out


def check(variant: Variant, compiled: jit.CompiledKernel, config: dict | None = None) -> CheckResult:
    """Problems of one compiled variant; `config`: the tile config it was built with (default's if None)."""
    res = compiled.resources
    features = binary.sass_features(binary.dump_sass(compiled.cubin_path))
    result = CheckResult(variant, res, features)
    if not res:
        result.problems.append("no ptxas resource report in the compile log")
    else:
        if res["stack"] or res["spill_stores"] or res["spill_loads"]:
            result.problems.append(f"stack frame {res['stack']} B, spills {res['spill_stores']}/{res['spill_loads']} B")
        if res["smem"] > STATIC_SMEM_LIMIT:
            result.problems.append(f"static smem {res['smem']} B over {STATIC_SMEM_LIMIT}")
    cfg = variant.spec.config_defines(config)
    dyn = variant.spec.dynamic_smem(cfg)
    if dyn + res.get("smem", 0) > DYNAMIC_SMEM_LIMIT.get(variant.arch, STATIC_SMEM_LIMIT):
        result.problems.append(f"shared memory {dyn + res.get('smem', 0)} B over the {variant.arch} limit")
    for name in variant.spec.sass_required:
        if not features[name]:
            result.problems.append(f"SASS lacks {name}")
    for name in variant.spec.sass_forbidden:
        if features[name]:
            result.problems.append(f"SASS has {features[name]} x {name}")
    return result


def run_all(specs=None, archs=None, workers=None, progress=None) -> list[CheckResult]:
    """Compile (in parallel) and check every variant of every kernel for every arch it targets."""
    todo = [v for spec in (specs or registry.specs()) for arch in spec.archs
            if archs is None or arch in archs for v in variants(spec, arch)]
    compiled = jit.compile_many([v.compile for v in todo], workers=workers)
    results = []
    for i, (v, ck) in enumerate(zip(todo, compiled)):
        results.append(check(v, ck))
        if progress:
            progress(i + 1, len(todo))
    return results


def summary_table(results: list[CheckResult]) -> str:
    """One line per kernel x arch: variants, max registers, smem, SASS features, problems."""
    rows = {}
    for r in results:
        key = (r.variant.spec.name, r.variant.arch)
        row = rows.setdefault(key, {"n": 0, "regs": 0, "smem": 0, "features": set(), "problems": 0})
        row["n"] += 1
        row["regs"] = max(row["regs"], r.resources.get("registers", 0))
        row["smem"] = max(row["smem"], r.resources.get("smem", 0))
        row["features"] |= {k for k, v in r.features.items() if v and k != "LOCAL"}
        row["problems"] += len(r.problems)
    lines = [f"{'kernel':8} {'arch':7} {'variants':>8} {'max regs':>8} {'smem B':>7}  {'SASS features':32} status"]
    for (name, arch), row in rows.items():
        status = "ok" if not row["problems"] else f"{row['problems']} problem(s)"
        lines.append(f"{name:8} {arch:7} {row['n']:>8} {row['regs']:>8} {row['smem']:>7}  "
                     f"{','.join(sorted(row['features'])) or '-':32} {status}")
    return "\n".join(lines)

"""`python -m deepgemm [command] [options]`: the main job and the project's tools.

With no command, `check` runs (its options may be given without the name: `python -m deepgemm
--out out/`). `python -m deepgemm COMMAND --help` shows a command's options.
"""
from __future__ import annotations

import argparse
import sys

from deepgemm import cli


# --------------------------------------------------------------------------------------------
# check, static, kernels, explain, warm-cache (their add_arguments/run pairs live here; the other
# commands' in their own modules)

def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="also write ladder.json and ladder.md into this folder")
    parser.add_argument("--size", type=cli.positive_int, default=4096,
                        help="ladder problem size M = N = K (default %(default)s)")
    parser.add_argument("--kernels", type=cli.kernel_names(), action="extend", default=None,
                        help="comma-separated subset of the ladder's kernels (default: all)")
    parser.add_argument("--arch", type=cli.cuda_archs, action="extend", default=None,
                        help="without a GPU: the static checks' target archs (default: every arch each kernel "
                             "targets)")


def _check(args) -> int:
    import deepgemm
    ok, why = deepgemm.gpu_available()
    if not ok:
        print(f"No GPU here ({why}): running the static checks only - the kernels compiled for each arch "
              f"they target, no spills, local memory or ptxas performance warnings, the SASS each ladder step claims.")
        if args.out is not None:   # said, not skipped silently: the folder would stay empty
            print(f"--out {args.out}: no ladder is written without a GPU; the static checks print their results here only.")
        return _static(args)
    from deepgemm import ladder
    return ladder.main_job(out_dir=args.out, size=args.size, kernels=args.kernels)


def _static_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernels", type=cli.kernel_names(purpose=None), action="extend", default=None,
                        help="comma-separated kernels to check (default: all, the accuracy report's included)")
    parser.add_argument("--arch", type=cli.cuda_archs, action="extend", default=None,
                        help="target archs to check, e.g. sm_80,sm_90a (default: every arch each kernel targets)")
    parser.add_argument("--all", action="store_true",
                        help="the full tier: every dtype x layout and every tuner config (as pytest "
                             "--sweep=full), not only the four variants per kernel and arch that reach every "
                             "code path and a config per code-path switch (a ping-pong or split-K V5)")


def _static(args) -> int:
    from deepgemm import registry, static_checks
    specs = [registry.get(n) for n in args.kernels] if args.kernels else registry.specs(purpose=None)
    targets = sorted({a for s in specs for a in s.archs})
    unknown = [a for a in args.arch or () if a not in targets]
    if unknown:
        raise cli.UsageError(f"--arch: {', '.join(unknown)} is not a target of "
                             f"{'these kernels' if args.kernels else 'any kernel'}; valid: {', '.join(targets)}")
    full = getattr(args, "all", False)
    todo = static_checks.plan(specs, args.arch, full)
    bar = cli.Progress(len(todo), "static checks (compile, disassemble)")
    results = static_checks.run_all(specs, args.arch, full, progress=lambda done, total: bar.update(done))
    bar.close()
    print(static_checks.summary_table(results))
    bad = [r for r in results if not r.ok]
    for r in bad:
        print(f"PROBLEM {r.variant}: {'; '.join(r.problems)}")
    print(f"{len(results) - len(bad)}/{len(results)} variants pass the static checks")
    return 1 if bad else 0


def _kernels_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true", help="also the accuracy report's FP16-accumulating kernels")


def _kernels(args) -> int:
    import deepgemm
    for k in deepgemm.kernels(include_report=args.all):
        print(f"{k['name']:12} cc>={k['min_compute_capability']:.1f}  accumulate={k['accumulate']:8} {k['summary']}")
    return 0


def _explain_arguments(parser: argparse.ArgumentParser) -> None:
    from deepgemm import tuner
    parser.add_argument("shape", type=tuner.shape_argument, help="M x N x K, e.g. 512x768x3072")
    parser.add_argument("--dtype", default="float16", help="input dtype: float16 or bfloat16 (default %(default)s)")
    parser.add_argument("--out-dtype", default=None, help="output dtype (default: the input's)")
    parser.add_argument("--layout", choices=("rc", "rr", "cr", "cc"), default="rc",
                        help="A then B, r = row-major (default rc: x @ w.T with an nn.Linear weight)")
    parser.add_argument("--epilogue", type=tuner.epilogue_argument, default=(),
                        help="the fused chain, e.g. bias+gelu+residual (vectors and C in the input dtype)")
    parser.add_argument("--kernel", default="auto", help="a kernel name, or auto (default)")
    parser.add_argument("--cc", type=cli.positive_int, default=None,
                        help="compute capability as an int, e.g. 90 (default: this GPU's, else 90)")


def _explain(args) -> int:
    from deepgemm import dispatch, tuner
    m, n, k = args.shape
    try:
        chain = tuner.epilogue_chain(args.epilogue, args.dtype) if args.epilogue else None
        print(dispatch.explain(m, n, k, args.dtype, args.cc, out_dtype=args.out_dtype, layout=args.layout,
                               epilogue=chain, kernel=args.kernel))
    except (TypeError, ValueError) as exc:   # an argument the dispatcher refuses: its message names it
        raise cli.UsageError(str(exc)) from None
    return 0


def _warm_cache_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernels", type=cli.kernel_names(), action="extend", default=None,
                        help="comma-separated subset of the ladder's kernels (default: all)")
    parser.add_argument("--arch", type=cli.cuda_archs, action="extend", default=None,
                        help="target archs, e.g. sm_90a (default: this GPU's; required without a GPU)")
    parser.add_argument("--sweep", choices=("quick", "full"), default="quick",
                        help="which verification tier's variants (default: quick)")


def _warm_cache(args) -> int:
    from deepgemm import device, jit, registry
    from deepgemm.testing import sweep
    archs = args.arch
    if not archs:
        import deepgemm
        ok, why = deepgemm.gpu_available()
        if not ok:
            raise cli.UsageError(f"--arch: no GPU here to take the arch from ({why}); name one, e.g. --arch sm_90a")
        archs = [device.arch_for_cc(device.compute_capability(device.current()))]
    names = args.kernels or registry.names()
    dev = device.current()   # its tuned table picks a named kernel's config by shape, as in the tests
    jobs = []
    for arch in archs:
        cc = device.cc_for_arch(arch)
        buildable = [n for n in names if registry.get(n).min_cc <= cc]
        for n in sorted(set(names) - set(buildable)):
            print(f"{n}: not built for {arch} (needs compute capability >= {registry.get(n).min_cc / 10:.1f})")
        cases = [c for n in buildable for c in (sweep.full_cases(n) if args.sweep == "full" else sweep.quick_cases(n))]
        jobs += sweep.compile_jobs(cases, arch, dev)
    if not jobs:
        raise cli.UsageError(f"--kernels {','.join(names)} --arch {','.join(archs)}: none of these kernels "
                             f"builds for these archs")
    print(f"compiling {len(jobs)} variants for {', '.join(archs)} into {jit.cache_dir()} ...", flush=True)
    bar = cli.Progress(len(jobs), "warm-cache (compile)")
    jit.compile_many(jobs, progress=lambda done, total: bar.update(done))
    bar.close()
    return 0


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    from deepgemm.report import accuracy
    reports = parser.add_subparsers(dest="report", metavar="report", required=True, title="reports")
    one = reports.add_parser("accuracy", help="FP32- vs FP16-accumulation accuracy report",
                             description="FP32- vs FP16-accumulation accuracy report (deepgemm.report.accuracy)",
                             prog="python -m deepgemm report accuracy")
    one.set_defaults(command_parser=one)   # usage errors show this parser's usage
    accuracy.add_arguments(one)


def _report(args) -> int:
    from deepgemm.report import accuracy
    return {"accuracy": accuracy.run}[args.report](args)


# --------------------------------------------------------------------------------------------
# The parser

def _commands() -> dict:
    """name -> (one-line help, add_arguments, run)."""
    from deepgemm import mutate, regress, tuner
    return {
        "check": ("the default: on a GPU verify every kernel, then the ladder vs cuBLAS at 4096^3; without "
                  "one, the static checks (and it says so)", _check_arguments, _check),
        "static": ("the static checks only, on any machine: compile, no spills, local memory or ptxas performance warnings, the SASS each "
                   "kernel claims", _static_arguments, _static),
        "kernels": ("list the kernels and what each supports", _kernels_arguments, _kernels),
        "explain": ("what gemm() would run for a shape here (kernel='auto' or a named kernel), and why",
                    _explain_arguments, _explain),
        "warm-cache": ("compile every variant the verification sweep launches, into the compile cache",
                       _warm_cache_arguments, _warm_cache),
        "tune": ("time kernel/config choices per shape bucket on this GPU, for kernel='auto'",
                 tuner.add_arguments, tuner.run),
        "report": ("reports: `report accuracy`, FP32- vs FP16-accumulation accuracy", _report_arguments, _report),
        "regress": ("the benchmark regression gate: `regress compare`, `regress history`",
                    regress.add_arguments, regress.run),
        "mutate": ("mutation testing: plant one bug at a time in the kernels' sources and report which "
                   "test killed it (without a GPU: which mutants compile and which the static checks kill)",
                   mutate.add_arguments, mutate.run),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m deepgemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="command", title="commands")
    for name, (text, add_arguments, run) in _commands().items():
        sub = commands.add_parser(name, help=text, description=text, prog=f"python -m deepgemm {name}")
        sub.set_defaults(run=run, command_parser=sub)
        add_arguments(sub)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["check", *argv]
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except cli.UsageError as exc:
        args.command_parser.error(str(exc))   # the command's usage, exit status 2


if __name__ == "__main__":
    sys.exit(main())

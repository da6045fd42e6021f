"""`python -m deepgemm [command]`: the main job and the project's tools.

  (no command) / check   on a GPU: verify every kernel, then the ladder vs cuBLAS at 4096^3;
                         without a GPU: the static checks (compile, spills, SASS), and it says so
  static                 the static checks only (any machine)
  kernels                list the kernels and what each supports
  warm-cache             compile every variant the verification sweep launches (--arch, --sweep)
  report accuracy        the FP32- vs FP16-accumulation accuracy report
  regress compare|history  the benchmark regression gate and its history
  tune                   measure kernel/config choices per shape bucket on this GPU for kernel="auto"
                         (`python -m deepgemm tune --help`)
"""
from __future__ import annotations

import argparse
import sys


def _static(args) -> int:
    from deepgemm import static_checks

    def progress(done, total):
        if done == total or done % 16 == 0:
            print(f"\r  compiled and checked {done}/{total} variants", end="" if done < total else "\n",
                  file=sys.stderr, flush=True)

    results = static_checks.run_all(archs=args.arch, progress=progress)
    print(static_checks.summary_table(results))
    bad = [r for r in results if not r.ok]
    for r in bad:
        print(f"PROBLEM {r.variant}: {'; '.join(r.problems)}")
    print(f"{len(results) - len(bad)}/{len(results)} variants pass the static checks")
    return 1 if bad else 0


def _check(args) -> int:
    import deepgemm
    ok, why = deepgemm.gpu_available()
    if not ok:
        print(f"No GPU here ({why}): running the static checks only - every kernel compiled for "
              f"sm_80 and sm_90a, no spills or local memory, the SASS each ladder step claims.")
        return _static(args)
    from deepgemm import ladder
    return ladder.main_job(out_dir=args.out, size=args.size, kernels=args.kernels)


def _kernels(args) -> int:
    import deepgemm
    for k in deepgemm.kernels():
        print(f"{k['name']:6} cc>={k['min_compute_capability']:.1f}  accumulate={k['accumulate']:8} {k['summary']}")
    return 0


def _warm_cache(args) -> int:
    from deepgemm import jit, registry
    from deepgemm.testing import sweep
    names = args.kernels or registry.names()
    cases = [c for n in names for c in (sweep.full_cases(n) if args.sweep == "full" else sweep.quick_cases(n))]
    arch = (args.arch or [None])[0]
    if arch is None:
        import cupy
        arch = registry.arch_for_cc(int(cupy.cuda.Device().compute_capability))
    jobs = sweep.compile_jobs(cases, arch)
    print(f"compiling {len(jobs)} variants for {arch} into {jit.cache_dir()} ...", flush=True)
    jit.compile_many(jobs)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        from deepgemm.report import accuracy
        if argv[1:2] != ["accuracy"]:
            print("usage: python -m deepgemm report accuracy [--out DIR] [--quick] [--emulated]")
            return 2
        return accuracy.main(argv[2:]) or 0
    if argv and argv[0] == "regress":
        from deepgemm import regress
        return regress.main(argv[1:]) or 0
    if argv and argv[0] == "tune":
        from deepgemm import tuner
        return tuner.main(argv[1:]) or 0
    parser = argparse.ArgumentParser(prog="python -m deepgemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="check", choices=("check", "static", "kernels", "warm-cache"))
    parser.add_argument("--out", default=None, help="write ladder.json / ladder.md here")
    parser.add_argument("--size", type=int, default=4096, help="ladder problem size (M=N=K)")
    parser.add_argument("--kernels", type=lambda s: s.split(","), default=None, help="comma-separated subset")
    parser.add_argument("--arch", action="append", default=None, help="target arch (static checks, warm-cache)")
    parser.add_argument("--sweep", choices=("quick", "full"), default="quick", help="warm-cache: which tier")
    args = parser.parse_args(argv)
    return {"check": _check, "static": _static, "kernels": _kernels, "warm-cache": _warm_cache}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

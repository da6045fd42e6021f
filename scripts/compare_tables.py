"""What a re-tuned table buys, measured before it ships: for each shape and dtype, cuBLAS, what
kernel="auto" runs with table OLD and what it runs with table NEW (each with the heuristics where
its table has no entry), on the same operands in one process. Device time (CUDA events), cold L2,
rounds alternating between the three, the best round's median; A row-major, B the transpose of a
row-major [N, K] weight (layout rc) unless --layout says otherwise.

    python3 -m deepgemm tune --preset decode --prune 1000 --force --out new.json
    python3 scripts/compare_tables.py deepgemm/configs/NVIDIA_H200.json new.json --preset decode
    python3 scripts/compare_tables.py deepgemm/configs/NVIDIA_H200.json none --preset models   # without a table

Prints one row per shape (cuBLAS / old / new µs, cuBLAS time over each) and the geometric means.
"""
import argparse
import math
import shutil
import tempfile
from pathlib import Path


def decisions(table_path, problems) -> list:
    """What kernel="auto" runs for each problem with `table_path` as this GPU's only table (None:
    no table, the heuristics alone): [(kernel name, full config, label)]."""
    from deepgemm import dispatch, tables, tuner
    saved = tables.SHIPPED_DIR, tables.user_dir
    with tempfile.TemporaryDirectory() as tmp:
        shipped = Path(tmp) / "shipped"
        shipped.mkdir()
        if table_path is not None:
            identity = tables.read(table_path)[0]["gpu"]
            shutil.copy(table_path, shipped / tables.file_name(identity["name"]))
        tables.SHIPPED_DIR, tables.user_dir = shipped, lambda: Path(tmp) / "no user tables"
        dispatch.reload_tables()
        try:
            out = []
            for problem in problems:
                spec, cfg = dispatch.choose(problem)
                out.append((spec.name, cfg, tuner.label(spec, cfg)))
            return out
        finally:
            tables.SHIPPED_DIR, tables.user_dir = saved
            dispatch.reload_tables()


def main(argv=None) -> int:
    from deepgemm import tuner
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="a tuned table (JSON, as `python -m deepgemm tune` writes), or 'none': no table")
    ap.add_argument("new", help="another table for the same GPU model, or 'none': no table (the heuristics alone)")
    ap.add_argument("--shapes", default=None, help="comma-separated MxNxK")
    ap.add_argument("--preset", choices=sorted(tuner.PRESETS), default=None, help="the tuner's model shapes")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated (default: float16,bfloat16)")
    ap.add_argument("--layout", default="rc", choices=("rr", "rc", "cr", "cc"), help="A then B (default: rc)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (default: 2)")
    ap.add_argument("--reps", type=int, default=15, help="timed calls per round and entry (default: 15)")
    args = ap.parse_args(argv)
    shapes = [tuner.parse_shape(s) for s in args.shapes.split(",")] if args.shapes else []
    if args.preset or not shapes:
        shapes += list(tuner.PRESETS[args.preset or "decode"].values())

    import cupy
    import numpy as np

    import deepgemm
    from deepgemm import bench, device, dispatch
    from deepgemm.reference import NUMPY_DTYPES

    cc = device.compute_capability(device.current())
    cases = [(dtype, shape) for dtype in args.dtypes.split(",") for shape in shapes]
    problems = [dispatch.shape_problem(*shape, dtype, dtype, args.layout, cc=cc, dev=device.current())
                for dtype, shape in cases]
    table = lambda arg: None if arg == "none" else arg
    picks = {"old": decisions(table(args.old), problems), "new": decisions(table(args.new), problems)}
    rng = np.random.default_rng(0)
    rows, ratios = [], {"old": [], "new": []}
    for i, (dtype, (m, n, k)) in enumerate(cases):
        dt = NUMPY_DTYPES[dtype]

        def mat(rows_, cols, row_major):
            x = cupy.asarray(rng.standard_normal((rows_, cols) if row_major else (cols, rows_), dtype=np.float32))
            return x.astype(dt) if row_major else x.astype(dt).T
        a, b = mat(m, k, args.layout[0] == "r"), mat(k, n, args.layout[1] == "r")
        out = cupy.empty((m, n), dt)
        fns = {"cublas": lambda: cupy.matmul(a, b)}
        for side in ("old", "new"):
            name, cfg, _ = picks[side][i]
            fns[side] = (lambda name, cfg: lambda: deepgemm.gemm(a, b, kernel=name, config=cfg, out=out))(name, cfg)
        times = {key: [] for key in fns}
        for _ in range(args.rounds):
            for key, fn in fns.items():
                times[key].append(bench.time_device(fn, warmup=3, reps=args.reps).median)
        best = {key: min(v) for key, v in times.items()}
        for side in ratios:
            ratios[side].append(best["cublas"] / best[side])
        rows.append((dtype, m, n, k, best, picks["old"][i][2], picks["new"][i][2]))
    print(f"{'dtype':9} {'M':>5} {'N':>6} {'K':>6} {'cublas':>8} {'old':>8} {'new':>8} {'cb/old':>7} {'cb/new':>7}"
          f"  old -> new")
    for dtype, m, n, k, best, old, new in rows:
        print(f"{dtype:9} {m:5} {n:6} {k:6} {best['cublas']:8.1f} {best['old']:8.1f} {best['new']:8.1f} "
              f"{best['cublas'] / best['old']:7.3f} {best['cublas'] / best['new']:7.3f}  {old} -> {new}")
    gmean = {side: math.exp(sum(map(math.log, r)) / len(r)) for side, r in ratios.items()}
    print(f"geometric mean of cuBLAS time / auto time: old {gmean['old']:.3f}, new {gmean['new']:.3f}; "
          f"lowest new {min(ratios['new']):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

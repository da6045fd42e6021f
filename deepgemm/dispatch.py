"""Which kernel and config serve a given problem: the one place that holds selection heuristics.

A named kernel is validated here (exists, runs on this GPU, takes these inputs, accumulates as
asked, supports() the problem); "auto" picks from the candidates, i.e. the public "gemm" kernels
that run on the device's compute capability, take the input dtype and whose supports(problem)
is None:
  1. a tuned entry for the problem's shape bucket, from the per-GPU-model tables (deepgemm.tables:
     the user's, written by `python -m deepgemm tune`, over the one shipped in deepgemm/configs/),
     if it names a candidate, its config suits the problem and the table was recorded on this GPU
     model (name, compute capability, SM count);
  2. else the heuristic below: small_m for M <= 64 (a weight stream; where v5 runs, M <= 16 and
     not x @ w.T with a weight of 4096 x 4096 or more, nor x @ w with a row-major weight of
     768 x 2304 or more), else the preferred large kernel (v5 on Hopper, which stages operands TMA
     cannot read; else v4, ...).
Batched and grouped problems (Problem.groups) go to the kernels with a grouped build (v5, then
v4), without tuned tables, configured by GROUPED_CONFIG_RULES.
A kernel chosen either way, or named without a config, gets its config the same way: the tuned
table's fastest measured config of that kernel for the bucket, else that kernel's config rule
(CONFIG_RULES: small_m covers M in one row block; v4 takes its smallest tile when 128x128 tiles
cannot fill the SMs, and its largest tile that fits where its default needs more shared memory
than the GPU gives a block; v5 sizes its tiles and K splits by how many fill the SMs), else its
default. Every config, however chosen, must pass KernelSpec.config_reason: the kernel's own
config_supports and the shared memory a block may have on the problem's compute capability.

Decisions are cached in memory by everything that can change them (exact shape, dtypes, layout,
the operands' 16-byte alignment classes, epilogue, compute capability, device), so a repeated call
costs one dict lookup; the cache "decisions" (deepgemm.caches) is derived from the tuned tables,
the device facts and the registry, and is cleared with them. deepgemm.explain() prints the
bucket, the candidates, the choice and why.

accumulate="fp32" (the default) is the ladder: purpose "gemm" kernels only. accumulate="fp16"
selects the accuracy report's FP16-accumulating variants (registry purpose "report"): "auto"
means fp16acc_mma, which takes fp16 inputs only; fp16acc_simt must be named (with bf16 inputs it
accumulates in bf16, the 16-bit format of its inputs).
"""
from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass, field, replace

from deepgemm import caches, device, dtypes, registry, tables

# Heuristic order for large problems: the first candidate in this list wins.
AUTO_PREFERENCE = ("v5", "v4", "v3", "v2", "v1", "v0")
ACCUMULATE = ("fp32", "fp16")
# kernel="auto" with accumulate="fp16": the tensor-core variant (what the accuracy report measures).
FP16_AUTO = "fp16acc_mma"

SMALL_M = "small_m"
# small_m's row blocks (16 * DG_SMALL_M_MT rows) re-stream B, so one row block should cover M.
SMALL_M_CONFIGS = ((16, {"DG_SMALL_M_NT": 2, "DG_SMALL_M_MT": 1, "DG_SMALL_M_WARPS": 8, "DG_SMALL_M_UNROLL": 4}),
                   (32, {"DG_SMALL_M_NT": 2, "DG_SMALL_M_MT": 2, "DG_SMALL_M_WARPS": 8, "DG_SMALL_M_UNROLL": 2}),
                   (64, {"DG_SMALL_M_NT": 2, "DG_SMALL_M_MT": 4, "DG_SMALL_M_WARPS": 8, "DG_SMALL_M_UNROLL": 1}))
# The SM count the heuristics assume when no device is known (explain without a GPU): an H200's.
SM_COUNT_GUESS = 132

# Shape buckets: powers of two rounded up, clamped (M: 1 .. 16384, N and K: 16 .. 65536).
M_CLASS_RANGE = (1, 16384)
NK_CLASS_RANGE = (16, 65536)


def check_accumulate(accumulate) -> None:
    if accumulate not in ACCUMULATE:
        raise ValueError(f"accumulate: must be one of {ACCUMULATE}, got {accumulate!r}")


# ---------------------------------------------------------------------------------------------
# Buckets

def size_class(x: int, lo: int, hi: int) -> int:
    """The smallest power of two >= x, clamped to [lo, hi]."""
    c = 1 << max(0, int(x) - 1).bit_length()
    return min(max(c, lo), hi)


def bucket_key(problem: registry.Problem) -> str:
    """Coarse and human-readable: 'm16.n16384.k4096.float16.rc.epi0.sm90' (the last part is the
    arch, sm_XX without the underscore). The epilogue only counts as present or not (its cost is
    the same for every kernel, to first order)."""
    epi = int(problem.epilogue != registry.NO_EPILOGUE)
    return (f"m{size_class(problem.m, *M_CLASS_RANGE)}.n{size_class(problem.n, *NK_CLASS_RANGE)}"
            f".k{size_class(problem.k, *NK_CLASS_RANGE)}.{problem.in_dtype}.{problem.layout}.epi{epi}.sm{problem.cc}")


def _lookup_keys(bucket: str) -> list[str]:
    """The bucket itself, then the nearest tuned stand-ins: without the epilogue (same data movement
    plus a per-element tail), then the other 16-bit input dtype (same bytes, same tensor-core rate)."""
    m, n, k, dtype, layout, epi, cc = bucket.split(".")
    other = {"float16": "bfloat16", "bfloat16": "float16"}.get(dtype, dtype)
    keys = [bucket, f"{m}.{n}.{k}.{dtype}.{layout}.epi0.{cc}", f"{m}.{n}.{k}.{other}.{layout}.{epi}.{cc}",
            f"{m}.{n}.{k}.{other}.{layout}.epi0.{cc}"]
    return list(dict.fromkeys(keys))


# ---------------------------------------------------------------------------------------------
# Per-kernel config rules (for a kernel chosen by the heuristic, or named without a config,
# when no tuned entry has a config of it for the bucket)

def small_m_config(problem: registry.Problem, sm_count: int) -> tuple[dict | None, str]:
    for limit, cfg in SMALL_M_CONFIGS:
        if problem.m <= limit:
            return dict(cfg), f"{16 * cfg['DG_SMALL_M_MT']}-row blocks: one row block covers M={problem.m}"
    return None, "its default"


def _v4_smallest() -> dict | None:
    """V4's config_space entry with the smallest tile."""
    return min(registry.get("v4").config_space, key=lambda c: c["DG_BM"] * c["DG_BN"], default=None)


def v4_config(problem: registry.Problem, sm_count: int) -> tuple[dict | None, str]:
    """The default (256x128 tiles) where 128x128 tiles fill the SMs; else the smallest tile, which
    measured 1.4-1.5x faster on BERT's 512-row shapes on the H200 (deepgemm/configs/NVIDIA_H200.json).
    On a GPU whose blocks may have less shared memory than the default's 144 KB (99 KB on compute
    capability 8.6 and 8.9), the largest tile of the config space that fits, swizzled and with the
    deeper ring first (not timed on such a GPU)."""
    tiles = -(-problem.m // 128) * -(-problem.n // 128)
    if tiles < sm_count:
        small = _v4_smallest()
        if small is not None:
            return dict(small), f"{tiles} tiles of 128x128 cannot fill {sm_count} SMs: v4 with its smallest tile"
    spec = registry.get("v4")
    over = spec.smem_over(spec.config_defines(None), problem.cc)
    if over is None:
        return None, f"{tiles} tiles of 128x128 fill {sm_count} SMs: v4's default tile"
    fits = [c for c in spec.config_space if spec.config_reason(spec.config_defines(c), problem) is None]
    best = max(fits, key=lambda c: (c["DG_BM"] * c["DG_BN"], c["DG_SWIZZLE"], c["DG_BK"] * c["DG_STAGES"]))
    return dict(best), (f"{tiles} tiles of 128x128 fill {sm_count} SMs, but v4's default config needs {over}; "
                        f"the largest tile that fits")


# V5's rule, fitted to the every-config timings of the H200 table (deepgemm/configs/NVIDIA_H200.json,
# 76 buckets from M = 1 to 4096): a tile count is "enough" at 70 % of the SMs, a split-K part
# keeps at least 768 of K (12 k-blocks: at K = 3072 four parts of 768 took 0.89-0.91x the time of
# two of 1536 at six shapes from 1 x 768 x 3072 to 256 x 768 x 3072, both B layouts, on the H200),
# and among widths that fill the SMs a wider tile is worth this much more per column (fewer loads
# of A per output element). On those buckets the rule's pick is 1.007x the fastest config on
# geometric mean and 1.06x at worst; V5's default (128x256) is up to 3.3x.
V5_FILL = 0.7
# 64-row tiles over the whole K are enough from 45 % of the SMs: at M = 32 and 64 with N = K = 4096,
# 64 tiles of 64x64 (48 % of 132 SMs) took 13.0-13.3 µs against 14.2-14.7 for the same tiles
# split in two (128 blocks), and tied with them at K = 16384 (the table's timings). Above 64 rows
# they come before splitting 128-row tiles: in every such bucket of the H200 table (M = 128 and
# 512, N = 512-4096, K = 64-16384) 64x64 over the whole K was the fastest config timed, 4-18 %
# ahead of 128x64 split in two or unsplit (512 x 768 x 3072: 10.9 µs against 11.8; with bias +
# GELU + residual 11.4 against 13.9).
V5_FILL_WHOLE_K_64_ROWS = 0.45
V5_SPLIT_MIN_K = 768
# A split tile is a cluster of that many blocks, and clusters of 4 do not all fit on the SMs at once
# when they ask for nearly all of them: 32 tiles of 128x64 in 4 parts (128 blocks) took 15.2-18.9 us
# at 128x2048x2048 and 512x512x4096 (M x N x K), in 2 parts 9.8-13.3; 24 tiles in 4 parts (96
# blocks, 256x768x3072) ran 10 % faster than in 2. So a split of 4 or more keeps its blocks within
# this share of the SMs.
V5_SPLIT_CLUSTER_SHARE = 0.75
V5_SPLIT_WIDE_CLUSTER = 4
# Where no split fills the SMs, the narrowest tiles in the most parts that fit, up to this many
# (the deepest measured): at 12-16 tiles (1x1024x4096, 64x1024x4096, 128x1024x4096), unsplit /
# 2 parts / 4 parts took 12.1-15.7 / 10.6-12.9 / 9.0-10.8 us; at 16 x 768 x 3072, 10.3 / 9.4 / 8.4
# (H200, one run, B row-major and column-major alike).
V5_SPLIT_DEEPEST_IDLE = 4
V5_WIDTH_EFFICIENCY = {256: 1.0, 192: 0.95, 128: 0.85, 96: 0.8, 64: 0.7}
# Tile shapes the rule leaves to the tuner (rows, width, split): 128 x 96 tiles in 4 parts took
# 1.17x and 1.25x the time of 128 x 64 tiles in 2 at 512 x 512 x 4096 and 128 x 2304 x 3072 (B
# column-major, H200): the two shapes measured where the rule took them.
V5_RULE_SKIPS = {(128, 96, 4)}
# Ping-pong consumers (one warpgroup's epilogue beside the other's main loop) where the main loop
# per tile is short and each block walks many tiles. Measured on the H200 against the 128x256
# cooperative tiles (fp16, B row-major, 1024-16384 rows): 128x128 ping-pong was 1-6 % faster at
# K = 512-1024 (plain and fused) and at K = 2048 with bias + GELU + residual, level or 1-4 % slower
# at K = 2048 plain and K = 4096; every shape measured had >= 1024 tiles of 128x128 (7.75 per SM).
V5_PINGPONG_MAX_K = {False: 1024, True: 2048}   # without, with an epilogue
V5_PINGPONG_TILES_PER_SM = 7
V5_PINGPONG_WIDTH = 128   # the ping-pong tile the rule takes (no split-K)


def _v5_rule_options() -> dict:
    """(rows, width, split, ping-pong) -> the first config_space entry of that tile shape with
    GROUP_M 8 and the TMA-store epilogue: what v5_config chooses from."""
    spec = registry.get("v5")
    out: dict = {}
    for c in spec.config_space:
        full = spec.config_defines(c)
        if full["DG_GROUP_M"] == 8 and full["DG_EPI_TMA"]:
            out.setdefault((full["DG_BM"], full["DG_BN"], full["DG_SPLIT_K"], full["DG_PINGPONG"]), c)
    return out


def v5_config(problem: registry.Problem, sm_count: int) -> tuple[dict | None, str]:
    """64-row tiles for M <= 64 (a 128-row tile would be half zero fill); ping-pong 128x128 tiles
    where K is short and every SM walks many tiles; else the width whose waves cost least among
    those whose tiles fill the SMs; else 64-row tiles over the whole K where those fill enough of
    them (V5_FILL_WHOLE_K_64_ROWS); else the fewest split-K parts (and the widest tile) that fill
    them; else the narrowest tile, in the most split-K parts (up to 4) K and the SMs allow. Only
    configs the problem's layout and alignment allow count."""
    spec = registry.get("v5")
    every = {key: c for key, c in _v5_rule_options().items()
             if key[:3] not in V5_RULE_SKIPS and spec.config_reason(spec.config_defines(c), problem) is None}
    rows = 64 if problem.m <= 64 and any(key[0] == 64 for key in every) else 128
    options = {(bn, split): c for (bm, bn, split, pp), c in every.items() if bm == rows and not pp}
    if not options:
        return None, "its default (no config_space entry suits the problem)"

    def tiles(width, split, tile_rows=rows):
        return -(-problem.m // tile_rows) * -(-problem.n // width) * split

    enough = V5_FILL * sm_count
    whole_k_enough = (V5_FILL_WHOLE_K_64_ROWS if rows == 64 else V5_FILL) * sm_count
    pingpong = every.get((rows, V5_PINGPONG_WIDTH, 1, 1))
    short_k = V5_PINGPONG_MAX_K[problem.epilogue != registry.NO_EPILOGUE]
    pp_tiles = tiles(V5_PINGPONG_WIDTH, 1)
    if pingpong is not None and problem.k <= short_k and pp_tiles >= V5_PINGPONG_TILES_PER_SM * sm_count:
        return dict(pingpong), (f"{pp_tiles} tiles of {rows}x{V5_PINGPONG_WIDTH} and K={problem.k} <= {short_k}: "
                                f"ping-pong consumers, one's epilogue beside the other's main loop")
    full_waves = [w for (w, s) in options if s == 1 and tiles(w, 1) >= whole_k_enough]
    if full_waves:
        def cost(w):   # waves x columns per unit of tile efficiency; ties go to the wider tile
            return -(-tiles(w, 1) // sm_count) * w / V5_WIDTH_EFFICIENCY.get(w, min(V5_WIDTH_EFFICIENCY.values())), -w
        width = min(full_waves, key=cost)
        return dict(options[(width, 1)]), (f"{tiles(width, 1)} tiles of {rows}x{width}: of the widths whose "
                                           f"tiles fill enough of {sm_count} SMs, the one whose waves cost least")

    # 128-row tiles that fill too few SMs unsplit: 64-row tiles over the whole K where those fill
    # enough (the narrowest: the most blocks), before any split (no partial sums to exchange)
    if rows == 128:
        whole_k_64 = {w: c for (bm, w, split, pp), c in every.items() if bm == 64 and split == 1 and not pp}
        filling = [w for w in whole_k_64 if tiles(w, 1, 64) >= V5_FILL_WHOLE_K_64_ROWS * sm_count]
        if filling:
            width = min(filling)
            return dict(whole_k_64[width]), (f"{tiles(min(options)[0], 1)} tiles of 128 rows leave SMs idle: "
                                             f"{tiles(width, 1, 64)} tiles of 64x{width} over the whole K")

    def fits(width, split):   # a wide cluster's blocks all on the SMs at once
        return split < V5_SPLIT_WIDE_CLUSTER or tiles(width, split) <= V5_SPLIT_CLUSTER_SHARE * sm_count

    splits = sorted({s for (_, s) in options if s > 1 and problem.k / s >= V5_SPLIT_MIN_K})
    for split in splits:
        for width in sorted((w for (w, s) in options if s == split), reverse=True):
            if tiles(width, split) >= enough and fits(width, split):
                return (dict(options[(width, split)]), f"{tiles(width, 1)} tiles of {rows}x{width} leave SMs "
                                                       f"idle: split K in {split} ({tiles(width, split)} tiles)")
    narrowest = min(w for (w, _) in options)
    deep = [s for s in splits if s <= V5_SPLIT_DEEPEST_IDLE and (narrowest, s) in options and fits(narrowest, s)]
    if deep:
        split = max(deep)
        return dict(options[(narrowest, split)]), (
            f"{tiles(narrowest, 1)} tiles of {rows}x{narrowest} leave SMs idle and no split of K={problem.k} into "
            f"parts of at least {V5_SPLIT_MIN_K} ({', '.join(map(str, splits))}) fills them: the most parts that "
            f"fit, up to {V5_SPLIT_DEEPEST_IDLE}: {split} ({tiles(narrowest, split)} tiles)")
    unsplit = [w for (w, s) in options if s == 1]
    if not unsplit:
        return None, "its default"
    width = min(unsplit)
    why = f"no split of {rows}x{narrowest} tiles fits them" if splits else f"K={problem.k} is too short to split"
    return dict(options[(width, 1)]), f"{tiles(width, 1)} tiles leave SMs idle and {why}: {rows}x{width} tiles"


CONFIG_RULES = {SMALL_M: small_m_config, "v4": v4_config, "v5": v5_config}


def rule_configs(kernel: str) -> list[dict]:
    """Every config the kernel's rule can hand out (full defines), for the verification sweep."""
    spec = registry.get(kernel)
    if kernel == "v5":
        partials = [c for (_, bn, split, pp), c in _v5_rule_options().items()
                    if not pp or (bn == V5_PINGPONG_WIDTH and split == 1)]
    elif kernel == "v4":
        partials = [None, _v4_smallest()]
    elif kernel == SMALL_M:
        partials = [cfg for _, cfg in SMALL_M_CONFIGS]
    else:
        partials = [None]
    out = []
    for partial in partials:
        full = spec.config_defines(partial)
        if full not in out:
            out.append(full)
    return out


# Batched and grouped problems (Problem.groups): no tuned tables (their buckets are single GEMMs),
# and the tile count is bounded without the group sizes, which may live on the device.

def _grouped_tile_rows(problem: registry.Problem) -> int:
    """Row tiles of 128 over every group: exact for batches, an estimate (the total rows) for
    contiguous groups, the capacity for masked ones."""
    g = problem.groups
    rows = -(-problem.m // 128)
    return rows * g.count if g.mode in ("batch", "masked") else rows


# V5 configs by tile width, each the config_space entry of that width without split-K.
V5_GROUPED_WIDTHS = (256, 128, 64)


def v5_short_config() -> dict:
    """V5's config for groups of at most 64 rows: its first 64-row config_space entry without split-K."""
    return dict(next(c for c in registry.get("v5").config_space
                     if c.get("DG_BM") == 64 and c.get("DG_SPLIT_K", 1) == 1))


def v5_grouped_config(problem: registry.Problem, sm_count: int) -> tuple[dict | None, str]:
    """64-row tiles where no group has more than 64 rows (masked decode: the half-empty 128-row
    tile cost 11 % at 8 experts x 64 x 14336 x 4096 on the H200); else the narrowest tile that
    covers N when N is small (attention's 64-wide heads waste no columns), else 256 columns where
    the groups' tiles still fill the SMs, else 128."""
    # the first 128-row cooperative config of each width without split-K: the one listed as its best
    by_width = {bn: c for (bm, bn, split, pp), c in _v5_rule_options().items() if bm == 128 and split == 1 and not pp}
    if problem.groups.mode in ("batch", "masked") and problem.m <= 64:
        return v5_short_config(), f"groups of at most {problem.m} rows: 64-row tiles"
    for width in sorted(V5_GROUPED_WIDTHS):
        if problem.n <= width and width < 256:
            return dict(by_width[width]), f"N={problem.n} fits one {width}-column tile"
    tiles = _grouped_tile_rows(problem) * -(-problem.n // 256)
    if tiles >= sm_count:
        return dict(by_width[256]), f"{tiles} tiles of 128x256 over the groups fill {sm_count} SMs"
    return dict(by_width[128]), f"{tiles} tiles of 128x256 over the groups leave SMs idle: 128-column tiles"


def v4_grouped_config(problem: registry.Problem, sm_count: int) -> tuple[dict | None, str]:
    """v4's rule, counting the tiles of every group."""
    return v4_config(replace(problem, m=_grouped_tile_rows(problem) * 128, groups=None), sm_count)


GROUPED_CONFIG_RULES = {"v5": v5_grouped_config, "v4": v4_grouped_config}


def _sm_count(dev) -> int:
    if dev is None:
        return SM_COUNT_GUESS
    try:
        return device.sm_count(dev)
    except Exception:   # a device id that cannot be asked (no GPU): the heuristics still answer
        return SM_COUNT_GUESS


# ---------------------------------------------------------------------------------------------
# Decisions

@dataclass
class Decision:
    spec: registry.KernelSpec
    config: dict
    source: str                   # "tuned", "heuristic", "named", "fp16"
    why: str
    bucket: str = ""
    candidates: tuple = ()
    rejected: dict = field(default_factory=dict)   # name -> reason


def candidates(problem: registry.Problem) -> tuple[list[registry.KernelSpec], dict]:
    """The kernels "auto" may pick for this problem, and why each other public kernel may not."""
    ok, rejected = [], {}
    for spec in registry.specs():
        if problem.groups is not None and not spec.grouped:
            rejected[spec.name] = "has no batched/grouped build"
        elif spec.min_cc > problem.cc:
            rejected[spec.name] = f"needs compute capability >= {spec.min_cc / 10:.1f}"
        elif problem.in_dtype not in spec.input_dtypes:
            rejected[spec.name] = f"takes {'/'.join(spec.input_dtypes)} only"
        else:
            reason = spec.supports(problem)
            if reason is None:
                ok.append(spec)
            else:
                rejected[spec.name] = reason
    return ok, rejected


# Where V5 runs too, small_m keeps only M <= 16: above that V5's 64-row, split-K tiles (v5_config)
# were 1.15-2.5x faster at M = 32 and 64 on the H200 (deepgemm/configs/NVIDIA_H200.json), and
# 0.89-1.03x at M = 8-16.
SMALL_M_BESIDE_V5 = 16
# ...and not even there for x @ w.T (layout rc) with a weight of at least 4096 x 2048: since A's
# TMA box is only M rounded up to 8 rows, V5's rule config took 14.0-14.3 us at 4096 x 4096 and
# 32.4-34.2 at 4096 x 16384 and 16384 x 4096 for M = 1-16, small_m's rule config 16.4-17.4 and
# 38.3-43.2 (the H200's decode re-tune, both timed in one run). Between 4096 x 2048 and 4096 x 4096
# (16 weights from 8.4M to 15.7M elements, M = 1, 8, 16, one run) small_m took 1.00-1.55x V5's
# time at all but 3072 x 3072 (0.93-1.00x): 1.36-1.38x at 7168 x 2048, 1.31-1.45x at 1024 x 8192.
# At 4.2M elements (2048 x 2048, 1024 x 4096, 4096 x 1024) it took 0.87-1.15x, and at smaller
# weights (768 x 2304 to 3072 x 768) 0.64-1.06x.
# ...nor for x @ w (both row-major), where small_m reads B across its rows: at M = 1, 8 and 16,
# V5's rule config took 6.2-32.4 us at nine weights from 768 x 2304 to 4096 x 14336, small_m
# 6.8-57.4 (1.01-1.78x V5's time; timed in one run on the H200). Below the smallest weight
# measured: small_m. A column-major A with K under A_COPY_MIN_K is left to small_m (from there "auto"
# copies A to row-major first, below): at M = 8, V5 (its box 8 rows wide, one 16-byte row per k)
# was up to 1.4x slower than small_m; at M = 16, up to 2.9x faster.
# Layout -> the smallest weight (N x K elements) V5 takes from small_m at M <= 16, and why.
V5_DECODE_MIN_WEIGHT = {"rc": 4096 * 2048, "rr": 768 * 2304}
_V5_DECODE_WHY = {"rc": "x @ w.T with a {n}x{k} weight: V5's tiles, with A's box only M rounded up to 8 rows, "
                        "outrun small_m's weight stream",
                  "rr": "x @ w with a row-major {k}x{n} weight: V5's tiles outrun small_m, which reads B across "
                        "its rows"}


# A column-major A at decode sizes (2 <= M <= 16; at M = 1 it is a row) is read slowly in place by
# both kernels: small_m gathers a lane's 8 values of a row with 8 two-byte loads instead of one
# 16-byte load, and V5's box holds one 16-byte line of M values per k. So "auto" first copies A
# to row-major (one more kernel: 3.5-5 us on the H200) and runs the row-major-A path. One run on
# the H200, M = 2, 4, 8, 16, B in both layouts: at five weights with K >= 2048 (2048 x 2048,
# 4096 x 4096, 14336 x 4096, 4096 x 14336, 768 x 3072) the copy and the row-major path took
# 0.34-1.02x the time of the column-major path (cuBLAS's time / theirs: 0.72-1.80); at K = 768
# (3072 x 768) 0.74-1.13x, where the column-major path was already faster than cuBLAS. The edge
# lies between those K.
A_COPY_MIN_K = 1024
A_COPY_MAX_M = 16


def copies_a(problem: registry.Problem, kernel="auto", config=None, accumulate="fp32") -> str | None:
    """Why "auto" runs this problem on a row-major copy of A (gemm() makes it on the caller's
    stream), or None where it reads A in place. Only where it was measured: beside V5 (sm_90),
    single GEMMs."""
    if (kernel != "auto" or config is not None or accumulate != "fp32" or problem.groups is not None
            or problem.a is None or problem.a.row_major or problem.cc != 90
            or not 1 < problem.m <= A_COPY_MAX_M or problem.k < A_COPY_MIN_K):
        return None
    return (f"A is column-major at M={problem.m} <= {A_COPY_MAX_M} with K={problem.k} >= {A_COPY_MIN_K}: "
            f"both kernels read it in place slowly; copied to row-major first (one more kernel)")


def heuristic(problem: registry.Problem, names) -> tuple[str, str]:
    """(kernel, the rule) among candidate names."""
    if SMALL_M in names and "v5" in names and SMALL_M_BESIDE_V5 < problem.m <= SMALL_M_CONFIGS[-1][0]:
        return "v5", (f"M={problem.m} > {SMALL_M_BESIDE_V5}: V5's 64-row tiles (split over K where they "
                      f"leave SMs idle) outrun small_m's weight stream")
    floor = V5_DECODE_MIN_WEIGHT.get(problem.layout)
    if (SMALL_M in names and "v5" in names and problem.m <= SMALL_M_BESIDE_V5 and floor is not None
            and problem.n * problem.k >= floor):
        return "v5", f"M={problem.m}, " + _V5_DECODE_WHY[problem.layout].format(n=problem.n, k=problem.k)
    if SMALL_M in names and problem.m <= SMALL_M_CONFIGS[-1][0]:
        return SMALL_M, (f"M={problem.m} <= {registry.SMALL_M_MAX}: the GEMM is a weight stream, small_m keeps "
                         f"every SM loading B")
    for name in AUTO_PREFERENCE:
        if name in names:
            return name, f"the preferred kernel among the candidates (order {', '.join(AUTO_PREFERENCE)})"
    return names[0], "the only kind of candidate left"


def _config_problem(spec, config, problem) -> tuple[dict | None, str | None]:
    """(the full config, None) if `config` (partial, from a table) is one spec runs for problem;
    else (None, why not)."""
    try:
        cfg = spec.config_defines(config or None)
    except ValueError as exc:
        return None, str(exc).removeprefix("config: ")
    why = spec.config_reason(cfg, problem)
    return (None, why) if why else (cfg, None)


def _table_hits(dev, bucket):
    """(bucket key, entry, origin, path) for the bucket and each stand-in the device's tables hold,
    in lookup order."""
    found = tables.for_device(dev)
    for key in _lookup_keys(bucket):
        hit = found.entries.get(key)
        if hit is not None:
            yield (key, *hit)


def _tuned_config(spec, problem, dev, bucket) -> tuple[dict | None, str]:
    """The fastest config of `spec` the tuned tables measured for this bucket (or its stand-ins)
    that suits the problem: (config, where from), or (None, notes on what was skipped)."""
    note = ""
    for key, entry, origin, path in _table_hits(dev, bucket):
        for us, kernel, config in tables.options(entry):
            if kernel != spec.name:
                continue
            cfg, bad = _config_problem(spec, config, problem)
            if cfg is not None:
                return cfg, (f"{origin} table {path}: bucket {key}, "
                             f"measured at {'x'.join(str(x) for x in entry.get('shape', ())) or '?'}"
                             + (f", {us:.1f} us" if us is not None else ""))
            note += f" (tuned config {config} of {key} ignored: {bad})"
    return None, note


def _config_for(spec, problem, dev, bucket) -> tuple[dict, str]:
    """A config for a kernel chosen without one: tuned, else its rule, else its default."""
    if problem.groups is not None:
        rule = GROUPED_CONFIG_RULES.get(spec.name)
        partial, why = rule(problem, _sm_count(dev)) if rule else (None, "its default")
        return spec.config_defines(partial), f"config (batched/grouped): {why}"
    cfg, where = _tuned_config(spec, problem, dev, bucket)
    if cfg is not None:
        return cfg, f"config from the {where}"
    rule = CONFIG_RULES.get(spec.name)
    partial, why = rule(problem, _sm_count(dev)) if rule else (None, "its default")
    return spec.config_defines(partial), f"config: {why}{where}"


def _valid_tuned(entry: dict, spec_by_name: dict, problem: registry.Problem) -> tuple[dict | None, str | None]:
    spec = spec_by_name.get(entry["kernel"])
    if spec is None:
        return None, f"names {entry['kernel']!r}, not a candidate for this problem"
    return _config_problem(spec, entry.get("config"), problem)


def decide(problem: registry.Problem, dev=None) -> Decision:
    """kernel="auto", accumulate="fp32", uncached: the full reasoning (explain() prints it)."""
    ok, rejected = candidates(problem)
    if not ok:
        raise ValueError(f"kernel: no registered kernel runs this problem on compute capability "
                         f"{problem.cc / 10:.1f}: " + "; ".join(f"{k}: {v}" for k, v in rejected.items()))
    by_name = {s.name: s for s in ok}
    bucket = bucket_key(problem)
    found = tables.for_device(dev)
    note = ""
    hits = _table_hits(dev, bucket) if problem.groups is None else ()
    for key, entry, origin, path in hits:
        cfg, bad = _valid_tuned(entry, by_name, problem)
        if cfg is not None:
            shape = "x".join(str(x) for x in entry.get("shape", ())) or "?"
            us = entry.get("us")
            return Decision(by_name[entry["kernel"]], cfg, "tuned",
                            f"{origin} table {path}: bucket {key}, tuned at {shape}"
                            + (f", {us:.1f} us" if isinstance(us, (int, float)) else ""),
                            bucket, tuple(by_name), rejected)
        note += f" (tuned entry {key} ignored: {bad})"
        if key == bucket:   # the table's own entry for this bucket is wrong: say so, once
            found.warn(path, f"entry {key} ignored: {bad}")
    name, rule = heuristic(problem, list(by_name))
    spec = by_name[name]
    cfg, how = _config_for(spec, problem, dev, bucket)
    return Decision(spec, cfg, "heuristic", f"{rule}; {how}{note}", bucket, tuple(by_name), rejected)


def _named(problem: registry.Problem, kernel, config, accumulate, dev) -> Decision:
    in_dtype, cc = problem.in_dtype, problem.cc
    if not isinstance(kernel, str):
        raise TypeError(f"kernel: expected a kernel name or 'auto', got {type(kernel).__name__}")
    spec = registry.get(kernel)
    if spec.accumulation != accumulate:
        raise ValueError(f"accumulate: kernel {kernel!r} accumulates in {spec.accumulation}, but "
                         f"accumulate={accumulate!r}; pass accumulate={spec.accumulation!r} to run it")
    if in_dtype is not None and in_dtype not in spec.input_dtypes:
        raise TypeError(f"kernel: {kernel!r} takes {'/'.join(spec.input_dtypes)} inputs only, got "
                        f"{in_dtype}" + (" (there is no bf16 mma with an f16 accumulator)"
                                         if spec.accumulation == "fp16" else ""))
    if spec.min_cc > cc:
        raise ValueError(f"kernel: {kernel!r} needs compute capability >= {spec.min_cc / 10:.1f}, "
                         f"this GPU has {cc / 10:.1f}")
    if problem.groups is not None and not spec.grouped:
        grouped = ", ".join(s.name for s in registry.specs() if s.grouped)
        raise ValueError(f"kernel: {kernel!r} has no batched/grouped build (kernels with one: {grouped})")
    reason = spec.supports(problem)
    if reason is not None:
        raise ValueError(f"kernel: {kernel!r} cannot run this problem: {reason}")
    if config is not None:
        if not isinstance(config, dict):
            raise TypeError(f"config: expected a dict of tile parameters, got {type(config).__name__}")
        cfg, why, bucket = spec.config_defines(config), "the caller's config", ""
    elif spec.purpose == "gemm":   # as "auto" would configure it
        bucket = bucket_key(problem)
        cfg, why = _config_for(spec, problem, dev, bucket)
    else:
        cfg, why, bucket = spec.config_defines(None), "its default config", ""
    reason = spec.config_reason(cfg, problem) or (registry.block_reason(spec, cfg) if config is not None else None)
    if reason is not None:
        raise ValueError(f"config: {reason} (kernel {kernel!r})")
    return Decision(spec, cfg, "named", why, bucket)


def _fp16_auto(problem: registry.Problem) -> Decision:
    spec = registry.get(FP16_AUTO)
    if problem.in_dtype not in spec.input_dtypes:
        raise TypeError(f"accumulate: 'fp16' with {problem.in_dtype} inputs: {FP16_AUTO} takes "
                        f"{'/'.join(spec.input_dtypes)} only (there is no bf16 mma with an f16 "
                        f"accumulator); kernel='fp16acc_simt' accumulates {problem.in_dtype} inputs in "
                        f"{problem.in_dtype} on CUDA cores")
    if spec.min_cc > problem.cc:
        raise ValueError(f"accumulate: 'fp16' needs compute capability >= {spec.min_cc / 10:.1f} "
                         f"({FP16_AUTO}), this GPU has {problem.cc / 10:.1f}")
    return Decision(spec, spec.config_defines(None), "fp16",
                    "the FP16-accumulating variant of the accuracy report (accumulate='fp16')")


def _operand_class(mat):
    """What supports() may look at beyond the shape: layout and 16-byte alignment of base and ld."""
    if mat is None:
        return None
    return (mat.row_major, mat.ptr & 15 == 0, mat.ld & 7 == 0, mat.device)


def _device_of(problem: registry.Problem):
    return problem.a.device if problem.a is not None else None


_decisions: dict = {}
_lock = threading.Lock()


def _groups_class(groups):
    """What choices may depend on in a batched/grouped problem: the mode, the count, which operands
    are shared, and each group stride's sign and 16-byte alignment, all that tma.stride_reason reads
    (never the sizes' address)."""
    if groups is None:
        return None
    strides = (groups.stride_a, groups.stride_b, groups.stride_d, groups.stride_c, groups.stride_bias)
    return groups.mode, groups.count, tuple((s == 0, s < 0, s % 8 == 0) for s in strides)


def cache_key(problem: registry.Problem, kernel, config, accumulate) -> tuple:
    return (problem.m, problem.n, problem.k, problem.in_dtype, problem.out_dtype,
            _operand_class(problem.a), _operand_class(problem.b), problem.epilogue, problem.cc,
            kernel, None if config is None else tuple(sorted(config.items())), accumulate,
            _groups_class(problem.groups))


def _decide_any(problem, kernel, config, accumulate) -> Decision:
    check_accumulate(accumulate)
    if kernel == "auto" and config is not None:
        raise ValueError("config: only meaningful with a named kernel (kernel='auto' picks its own)")
    if kernel == "auto" and accumulate == "fp16":
        return _fp16_auto(problem)
    if kernel == "auto":
        return decide(problem, _device_of(problem))
    return _named(problem, kernel, config, accumulate, _device_of(problem))


def choose(problem: registry.Problem, *, kernel="auto", config=None, accumulate="fp32"):
    """Return (KernelSpec, config dict) for the problem; raise ValueError/TypeError naming `kernel`,
    `config` or `accumulate` if impossible. The returned config is shared: do not modify it."""
    try:
        key = cache_key(problem, kernel, config, accumulate)
        hit = _decisions.get(key)
    except (TypeError, AttributeError):   # an unhashable kernel/config value: the checks below name it
        key = hit = None
    if hit is not None and registry._REGISTRY.get(hit[0].name) is hit[0]:
        return hit
    d = _decide_any(problem, kernel, config, accumulate)
    result = (d.spec, d.config)
    if key is not None:
        with _lock:
            _decisions[key] = result
    return result


def _clear_decisions() -> None:
    with _lock:
        _decisions.clear()


caches.register("decisions", __name__, "kernel and config chosen per problem class (dispatch.choose)",
                _clear_decisions, derived_from=("tables", "device", "registry"))


def clear_cache() -> None:
    """Forget cached decisions (and what was built from them, e.g. gemm()'s replayable plans)."""
    caches.clear("decisions")


def reload_tables() -> None:
    """Forget loaded tuned tables and every decision made from them, and gemm()'s plans that replay
    those decisions: the next call reads the tables again and decides anew (after a tune run)."""
    tables.reload()


# ---------------------------------------------------------------------------------------------
# explain

def _shape_only_operands(m, n, k, layout, dev):
    """Matrix descriptions with aligned pointers and tight leading dimensions, for explain()."""
    from deepgemm.arrays import Matrix
    a_row, b_row = layout[0] == "r", layout[1] == "r"
    a = Matrix(0, m, k, "", a_row, max(k if a_row else m, 1), dev)
    b = Matrix(0, k, n, "", b_row, max(n if b_row else k, 1), dev)
    return a, b


def shape_problem(m, n, k, in_dtype="float16", out_dtype=None, layout="rc", epilogue=None, cc=90,
                  dev=None) -> registry.Problem:
    """The Problem gemm() would see for 16-byte aligned, tightly packed operands of this shape
    (explain(), the tuner's planning, tests). Dtypes in any spelling deepgemm.dtypes accepts."""
    in_dtype = dtypes.canonical(in_dtype, "in_dtype", registry.INPUT_DTYPES)
    out_dtype = dtypes.optional(out_dtype, "out_dtype") or in_dtype
    if layout not in ("rr", "rc", "cr", "cc"):
        raise ValueError(f"layout: one of 'rr', 'rc', 'cr', 'cc' (A then B, r = row-major), got {layout!r}")
    for arg, size in (("m", m), ("n", n), ("k", k)):
        if not isinstance(size, numbers.Integral) or isinstance(size, bool):   # NumPy ints too
            raise TypeError(f"{arg}: expected a non-negative int, got {size!r}")
        if size < 0:
            raise ValueError(f"{arg}: expected a non-negative int, got {size!r}")
        registry.check_size(f"{arg}: {size}", size)   # as gemm() refuses it
    m, n, k = int(m), int(n), int(k)
    if epilogue is True:
        epilogue = registry.Epilogue(bias=in_dtype)
    elif epilogue is not None and not isinstance(epilogue, registry.Epilogue):
        raise TypeError(f"epilogue: expected None, True or a deepgemm.registry.Epilogue, got {epilogue!r}")
    a, b = _shape_only_operands(m, n, k, layout, dev)
    return registry.Problem(m, n, k, in_dtype, out_dtype, a, b, epilogue or registry.NO_EPILOGUE, cc)


def explain(m, n, k, in_dtype="float16", cc=None, *, out_dtype=None, layout="rc", epilogue=None,
            kernel="auto", config=None, accumulate="fp32", device="current") -> str:
    """What gemm() would run for an M x N x K problem, and why: the shape bucket, the tuned tables
    found for this GPU, the candidates (and why others are out), the choice and its source.

    in_dtype/out_dtype: any spelling deepgemm.dtypes accepts ('float16', 'bf16', numpy.float16,
    torch.bfloat16, ...); out_dtype defaults to in_dtype.
    layout: 'rc' (A row-major, B column-major: x @ w.T, the default), 'rr', 'cr', 'cc'; operands
    are taken as 16-byte aligned. epilogue: None, True (some epilogue) or a registry.Epilogue.
    cc: compute capability as an int (90); default the device's, else 90. device: a device id,
    "current" (the current GPU, if any) or None (no GPU: heuristics only)."""
    dev = _explain_device(device)
    if cc is None:
        facts = _device_module().summary(dev)
        cc = int(facts["cc"].replace(".", "")) if facts else 90
    elif isinstance(cc, bool) or not isinstance(cc, int) or cc <= 0:
        raise TypeError(f"cc: expected a compute capability as a positive int (e.g. 90 for 9.0), got {cc!r}")
    problem = shape_problem(m, n, k, in_dtype, out_dtype, layout, epilogue, cc, dev)
    copy_why = copies_a(problem, kernel, config, accumulate)
    if copy_why is not None:
        problem = replace(problem, a=_shape_only_operands(m, n, k, "r" + layout[1], dev)[0])
    d = _decide_any(problem, kernel, config, accumulate)
    lines = [f"{m}x{n}x{k} {problem.in_dtype}->{problem.out_dtype} layout {layout} epilogue {problem.epilogue} "
             f"on sm_{cc}" + (f", device {dev}" if dev is not None else ", no GPU (heuristics only)")]
    if copy_why is not None:
        lines.append(f"  a copied:   {copy_why}")
    if d.bucket:
        lines.append(f"  bucket:     {d.bucket}")
        for note in tables.for_device(dev).notes:
            lines.append(f"  table:      {note}")
    if d.source in ("tuned", "heuristic"):
        lines.append(f"  candidates: {', '.join(d.candidates)}")
        for name, why in d.rejected.items():
            lines.append(f"  not {name}: {why}")
    lines.append(f"  chosen:     {d.spec.name} ({d.spec.summary}) config {d.config}")
    lines.append(f"  why:        {d.source}: {d.why}")
    return "\n".join(lines)


def _device_module():
    return device   # explain's keyword `device` shadows the module inside explain()


def _explain_device(dev):
    if dev == "current":
        return device.current()
    if dev is not None and (not isinstance(dev, int) or isinstance(dev, bool) or dev < 0):
        raise TypeError(f"device: expected a device id, 'current' or None, got {dev!r}")
    return dev

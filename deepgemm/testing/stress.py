"""The stress tier's kernel variants: timing-perturbed and pipeline-checked builds of the real
kernels, and planted hand-over bugs (premature stage releases, staging tiles overwritten too
early, a split-K rank leaving before its partial sums are read, or parking them in a ring still
being read) that prove the tier can fail.

A variant is the real kernel's source with ``#define`` lines put in front (``DG_STRESS`` = a seed,
``DG_PIPE_CHECK`` = 1; see kernels/include/deepgemm/stress.cuh), optionally rewritten by a planted
bug, written to a directory of the caller's and registered as a hidden kernel that shares every
launch hook of the kernel it copies. The source is copied, not ``#include``d, so the JIT cache key
(which hashes the source file) changes whenever the real kernel does.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from deepgemm import registry

# Kernels with an asynchronous pipeline that the stress defines perturb.
STRESSED_KERNELS = ("v4", "v5")

# Planted bugs: V5's consumers hand a stage back to the producer before a wgmma.wait_group has
# covered the wgmmas that read it, so the producer may overwrite operands the tensor cores still read.
#   premature_release: the previous k-block's stage, released before the wait that retires it (the
#                      subtle form: that block's wgmmas have usually finished by then anyway);
#   release_in_flight: the current k-block's stage, released right after its wgmmas are committed.
_RELEASE_AFTER_WAIT = """            dg::wgmma_wait<1>(ledger);
            if (kb > kb_begin && threadIdx.x % 128 == 0) {
                ledger.release(prev_group);
                release(prev_stage);
            }
"""
_PREV_BEFORE_WAIT = """            if (kb > kb_begin && threadIdx.x % 128 == 0) {   // planted bug: before the wait that retires it
                ledger.release(prev_group);
                release(prev_stage);
            }
            dg::wgmma_wait<1>(ledger);
"""
_CURRENT_BEFORE_WAIT = """            if (threadIdx.x % 128 == 0) {   // planted bug: released while its wgmmas are in flight
                ledger.release(group);
                release(stage);
            }
            dg::wgmma_wait<1>(ledger);
"""
_FINAL_RELEASE = """        if (kb_end > kb_begin && threadIdx.x % 128 == 0) {
            ledger.release(prev_group);
            release(prev_stage);
        }
"""


def _check_anchors(source: str, anchors=(_RELEASE_AFTER_WAIT, _FINAL_RELEASE), what: str = "stage release") -> None:
    """Each anchor the planted rewrite replaces must be in the source exactly once."""
    for anchor in anchors:
        if source.count(anchor) != 1:
            raise ValueError(f"v5_wgmma.cu's {what} changed: update deepgemm.testing.stress")


def premature_release(source: str) -> str:
    """V5 releasing the previous k-block's stage before waiting for its wgmmas."""
    _check_anchors(source)
    return source.replace(_RELEASE_AFTER_WAIT, _PREV_BEFORE_WAIT)


def release_in_flight(source: str) -> str:
    """V5 releasing each stage right after committing the wgmmas that read it (each stage still gets
    exactly one release per use, so the pipeline neither deadlocks nor stalls)."""
    _check_anchors(source)
    return source.replace(_RELEASE_AFTER_WAIT, _CURRENT_BEFORE_WAIT).replace(_FINAL_RELEASE, "")


# A planted bug in the hand-over of V5's staging units between a consumer (whose TMA stores read
# a unit) and the C loader (whose TMA loads of the next tile's C overwrite it): the consumer hands
# its units back without waiting for its stores to have read them. The subtle form: a store reads
# 16-32 KB of shared memory, usually long done before the next C lands.
_UNIT_HAND_OVER = "            if (threadIdx.x % 128 == 0) dg::bulk_wait_read<0>(staging);\n"


def unit_freed_before_store_read(source: str) -> str:
    """V5's consumers handing a staging unit to the C loader while their TMA stores may still read it."""
    _check_anchors(source, (_UNIT_HAND_OVER,), "staging-unit hand-over")
    return source.replace(_UNIT_HAND_OVER, "                // planted bug: no wait for the stores' reads\n")


# Waits one group too shallow, with the release where it was: the ledgers are noted by the waits
# themselves (dg::wgmma_wait<N>(ledger), dg::bulk_wait_read<N>(ledger)), so they see the depth
# the kernel really waits for.
#   stage_wait_too_shallow: the main loop leaves two k-blocks' wgmmas in flight, then releases the
#                           older one's stage;
#   unit_rewritten_before_store_read: a consumer writes its next tile into a staging unit that its
#                           previous TMA store may still be reading (builds without the C loader,
#                           whose hand-over waits for every store anyway).
_MAIN_LOOP_WAIT = "            dg::wgmma_wait<1>(ledger);\n"
_UNIT_REWRITE_WAIT = "dg::bulk_wait_read<HALVES - 1>(staging);"


def stage_wait_too_shallow(source: str) -> str:
    """V5's main loop waiting for all but two wgmma groups before releasing the older stage."""
    _check_anchors(source, (_MAIN_LOOP_WAIT,))
    return source.replace(_MAIN_LOOP_WAIT, "            dg::wgmma_wait<2>(ledger);   // planted bug: one group short\n")


def unit_rewritten_before_store_read(source: str) -> str:
    """V5's consumers writing a staging unit while their previous TMA store may still read it."""
    _check_anchors(source, (_UNIT_REWRITE_WAIT,), "staging-unit rewrite")
    return source.replace(_UNIT_REWRITE_WAIT, "dg::bulk_wait_read<HALVES>(staging);   /* planted bug: one group short */")


# Split-K's hand-over between the ranks of a cluster: a rank that parked its partial sums in its
# shared memory moves on (and, its one tile done, exits) without the cluster barrier that waits for
# the owner of the rows to have read them. The subtle form: the owner's reads usually finish long
# before the freed shared memory is used again.
_PARKED_SUMS_HELD = "            dg::cluster_sync();\n            if (rank != owner) {"


def rank_leaves_before_its_sums_are_read(source: str) -> str:
    """V5's split-K: a rank leaving the tile while the owner may still read its parked partial sums."""
    _check_anchors(source, (_PARKED_SUMS_HELD,), "split-K hand-over")
    return source.replace(_PARKED_SUMS_HELD, "            // planted bug: no barrier for the owner's reads\n"
                                             "            if (rank != owner) {")


# Split-K inside a rank: the consumer that parks its sums in the ring writes them without the named
# barrier that waits for the other consumer's last wgmmas to have read the ring. The subtle form:
# both consumers wait on the same stages, so the other one is usually a few cycles from done.
_RING_IDLE = "            dg::named_barrier(3, 128 * CONSUMERS);"


def consumer_parks_while_the_ring_is_read(source: str) -> str:
    """V5's split-K: a consumer parking its partial sums in the ring the other consumer may still read."""
    _check_anchors(source, (_RING_IDLE,), "split-K parking")
    return source.replace(_RING_IDLE, "            /* planted bug: no barrier for the other consumer */")


PLANTED = {"premature_release": ("v5", premature_release), "release_in_flight": ("v5", release_in_flight),
           "stage_wait_too_shallow": ("v5", stage_wait_too_shallow),
           "unit_freed_before_store_read": ("v5", unit_freed_before_store_read),
           "unit_rewritten_before_store_read": ("v5", unit_rewritten_before_store_read),
           "rank_leaves_before_its_sums_are_read": ("v5", rank_leaves_before_its_sums_are_read),
           "consumer_parks_while_the_ring_is_read": ("v5", consumer_parks_while_the_ring_is_read)}
# Which of them break the stage releases, which the staging hand-over to the C loader (shown by a
# residual), which a consumer's own rewrite of its units (shown by a 16-bit D without C) and which
# the split-K hand-over between ranks (shown by a DG_SPLIT_K build).
STAGE_RELEASE_BUGS = ("premature_release", "release_in_flight", "stage_wait_too_shallow")
STAGING_BUGS = ("unit_freed_before_store_read",)
REWRITE_BUGS = ("unit_rewritten_before_store_read",)
SPLIT_K_BUGS = ("rank_leaves_before_its_sums_are_read", "consumer_parks_while_the_ring_is_read")
# The split-K build these run with: two ranks per tile, each the owner of one consumer's rows.
SPLIT_K_CONFIG = {"DG_BN": 128, "DG_STAGES": 4, "DG_SPLIT_K": 2}


def variant_source(like: str, *, seed: int = 0, pipe_check: bool = False, planted: str | None = None) -> str:
    """The source text of a stress variant of kernel `like`."""
    spec = registry.get(like)
    text = spec.source.read_text()
    if planted is not None:
        if planted not in PLANTED:
            raise ValueError(f"planted: unknown planted bug {planted!r}; known: {sorted(PLANTED)}")
        kernel, rewrite = PLANTED[planted]
        if kernel != like:
            raise ValueError(f"planted: {planted!r} is a bug of kernel {kernel!r}, not {like!r}")
        text = rewrite(text)
    if seed < 0 or seed >= 2**31:
        raise ValueError(f"seed: must be in [0, 2**31), got {seed}")
    header = f"#define DG_STRESS {int(seed)}\n#define DG_PIPE_CHECK {int(bool(pipe_check))}\n"
    return header + f'#line 1 "{spec.source.name}"\n' + text


def register_variant(like: str, directory: Path, *, seed: int = 0, pipe_check: bool = False,
                     planted: str | None = None) -> str:
    """Write the variant's source under `directory`, register it as a hidden kernel with the same
    geometry, configs and launch hooks as `like`, and return its name (unregister it after)."""
    tag = "_".join(p for p in (f"s{seed}" if seed else "", "check" if pipe_check else "", planted or "") if p)
    name = f"{like}_stress_{tag or 'plain'}"
    path = Path(directory) / f"{name}.cu"
    path.write_text(variant_source(like, seed=seed, pipe_check=pipe_check, planted=planted))
    registry.register(dataclasses.replace(registry.get(like), name=name, file=str(path), public=False,
                                          summary=f"stress variant of {like}"))
    return name

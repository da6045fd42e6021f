"""CPU tier: V5's staging copy (kernels/stage_copy.cu: an operand TMA cannot read, copied into a
buffer whose rows are whole 16 bytes) run on the host for every thread of its grid against a model
(tests/cpu/harness/stage_copy_host.cpp): the rows copied, the pad up to 8 elements zero, nothing
past it written, every 16-byte load aligned and none past the source operand's last element, at
every alignment of the source, with the grid `deepgemm.tma.stage_grid` launches and with fewer rows
of blocks than rows (the kernel strides)."""
import pytest

from deepgemm import jit, tma
from host_harness import assert_passes, build, mutated, planted, run

INNERS = list(range(1, 41)) + [255, 256, 257, 2047, 2048, 2049, 2056, 2063, 4100]
OUTERS = (1, 2, 5)
PADS = (0, 1, 3, 8)   # ld_src - inner


def _cases() -> list[tuple[int, ...]]:
    cases = []
    for inner in INNERS:
        staged = -(-inner // 8) * 8
        for outer in OUTERS:
            for pad in PADS:
                gx, gy, _ = tma.stage_grid(inner, outer)
                cases.append((inner, outer, inner + pad, staged, gx, gy, tma.STAGE_THREADS))
                # fewer rows of blocks than rows, and room past the pad that must stay untouched
                cases.append((inner, outer, inner + pad, staged + 8, gx, max(1, gy // 2), tma.STAGE_THREADS))
    return cases


def test_the_cases_reach_every_alignment_of_the_source():
    """The harness ends the source at a page's end, so its first element's alignment is set by its
    span: the vector path (inner >= 16) must meet all eight 2-byte offsets within 16 bytes."""
    offsets = {(-((outer - 1) * ld + inner)) % 8 for inner, outer, ld, *_ in _cases() if inner >= 16}
    assert offsets == set(range(8))


def _run(tmp_path, kernel_dir):
    exe = build(tmp_path, "stage_copy_host.cpp", kernel_dir, {}, None)   # host C++: the harness runs the kernel
    return run(exe, "".join(" ".join(map(str, c)) + "\n" for c in _cases()))


def test_the_staging_copy_copies_every_row_exactly(tmp_path):
    assert_passes(_run(tmp_path, jit.KERNEL_DIR), "elements", 100_000)



def test_the_half_grid_performance_mutant_still_copies_every_row(tmp_path):
    """`mutate`'s performance.half-grid is a slowdown and nothing else: with half the rows of blocks
    doing the whole stride loop, every row is still copied exactly once (else it would be a bug
    for the test tier, not a performance mutant for the gate)."""
    kernels = mutated(tmp_path, jit.KERNEL_DIR, "stage_copy.cu", "performance.half-grid")
    assert_passes(_run(tmp_path, kernels), "elements", 100_000)

# Planted bugs: (what stage_copy.cu says, what the bug makes it say).
PLANTED = {
    # the two-chunk path for a chunk whose second load passes the row's end: past the last
    # element of the source (the guard page) or reading padding into the copy
    "vector-past-row": ("if (i0 + 16 <= inner) {", "if (i0 + 8 <= inner) {"),
    "word-offset": ("const int q = (addr & 15) / 4", "const int q = (addr & 15) / 8"),
    "tail-guard": ("v[j] = (i0 + j < inner) ? s[j]", "v[j] = (i0 + j <= inner) ? s[j]"),
    "row-stride": ("row += gridDim.y", "row += 2 * gridDim.y"),
}


@pytest.mark.parametrize("bug", PLANTED.keys())
def test_the_staging_copy_harness_fails_a_planted_bug(tmp_path, bug):
    original, wrong = PLANTED[bug]
    kernels = planted(tmp_path, jit.KERNEL_DIR, "stage_copy.cu", original, wrong)
    done = _run(tmp_path, kernels)
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"

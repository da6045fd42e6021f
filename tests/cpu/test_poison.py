"""deepgemm.testing.poison: unwritten elements and stray stores into every guard region are caught."""
import ml_dtypes
import numpy as np
import pytest

from deepgemm.testing import poisoned_output

DTYPES = ["float16", "bfloat16", "float32", "float64"]
M, N, LD, GUARD = 5, 7, 10, 16


def fresh(dtype, ld=LD):
    return poisoned_output((M, N), dtype, guard=GUARD, ld=ld)


@pytest.mark.parametrize("dtype", DTYPES)
def test_view_geometry_and_initial_state(dtype):
    out = fresh(dtype)
    view = out.view
    assert view.shape == (M, N) and view.dtype == np.dtype(getattr(ml_dtypes, dtype, dtype))
    assert view.strides == (LD * view.itemsize, view.itemsize)
    assert out.buffer.size == GUARD + M * LD + GUARD
    with np.errstate(invalid="ignore"):                  # a signalling NaN narrowed to float32 still is NaN
        assert np.isnan(view.astype(np.float32)).all()   # poison reads as NaN in every float type
    out.check()                                          # untouched guards pass
    with pytest.raises(AssertionError, match=rf"{M * N} of {M * N} output elements never written, first at \(0, 0\)"):
        out.assert_all_written()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_written_output_passes(dtype):
    out = fresh(dtype)
    out.view[...] = np.arange(M * N, dtype=np.float32).reshape(M, N).astype(out.view.dtype)
    out.view[0, 0] = np.float32(np.nan)                  # a computed NaN is a written element
    out.check()
    out.assert_all_written()


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_unwritten_element_is_named(dtype):
    out = fresh(dtype)
    out.view[...] = 1
    out.bits[GUARD:GUARD + M * LD].reshape(M, LD)[3, 6] = out.poison   # the kernel skipped (3, 6)
    with pytest.raises(AssertionError, match=r"1 of 35 output elements never written, first at \(3, 6\)"):
        out.assert_all_written()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where, flat_index, message", [
    ("before", GUARD - 1, r"before the output: 1 guard element\(s\) overwritten, first at buffer index 15 "
                          r"\(1 elements before the view\)"),
    ("before", 0, r"before the output: .* first at buffer index 0"),
    ("after", GUARD + M * LD, r"after the output: .* first at 0 elements past the view's end"),
    ("after", GUARD + M * LD + GUARD - 1, r"after the output: .* first at 15 elements past"),
    ("padding", GUARD + 2 * LD + N, r"in the row padding: .* first at row 2, column 7"),
    ("padding", GUARD + (M - 1) * LD + LD - 1, r"in the row padding: .* first at row 4, column 9"),
])
def test_out_of_bounds_write_is_caught_in_each_guard_region(dtype, where, flat_index, message):
    out = fresh(dtype)
    out.view[...] = 2                                    # the kernel wrote its output correctly...
    out.buffer[flat_index] = 0                           # ...and one element outside it
    with pytest.raises(AssertionError, match=message):
        out.check()
    out.assert_all_written()                             # the view itself is complete


@pytest.mark.parametrize("m", [1, 2])
def test_row_padding_is_guarded_from_the_first_row_on(m):
    # A GEMV-shaped output (M = 1) has row padding too; a store there is out of bounds.
    out = poisoned_output((m, 4), "float16", guard=8, ld=6)
    out.view[...] = 1
    out.check()
    out.buffer[8 + (m - 1) * 6 + 5] = 0                  # the last row's last padding element
    with pytest.raises(AssertionError, match=f"in the row padding: 1 guard element.*row {m - 1}, column 5"):
        out.check()


def test_a_stray_nan_or_poison_value_is_still_caught():
    out = fresh("float16")
    out.buffer[GUARD + M * LD + 3] = np.nan              # NaN bits differ from the sentinel
    with pytest.raises(AssertionError, match="after the output"):
        out.check()
    out = fresh("float16")
    out.bits[2] = out.poison                             # even the poison pattern is not the sentinel
    with pytest.raises(AssertionError, match="before the output"):
        out.check()


def test_contiguous_default_and_argument_checks():
    out = poisoned_output((3, 4), "bfloat16")
    assert out.ld == 4 and out.guard == 64 and out.view.flags.c_contiguous
    out.view[...] = 0
    out.check()
    out.assert_all_written()
    assert poisoned_output((0, 4), "float32").view.shape == (0, 4)
    with pytest.raises(ValueError, match="need ld >= N"):
        poisoned_output((3, 4), "float16", ld=3)
    with pytest.raises(ValueError, match="guard >= 0"):
        poisoned_output((3, 4), "float16", guard=-1)
    # No guard at all is allowed: the view and its row padding are still checked.
    bare = poisoned_output((3, 4), "float16", guard=0, ld=5)
    assert bare.buffer.size == 3 * 5
    bare.view[...] = 1
    bare.check()
    bare.assert_all_written()
    bare.buffer[4] = 0                                   # row 0 padding
    with pytest.raises(AssertionError, match="row 0, column 4"):
        bare.check()


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_outputs_use_bit_patterns(dtype):
    out = poisoned_output((2, 3), dtype, guard=4, ld=5)
    out.view[...] = 7
    out.check()
    out.assert_all_written()
    out.buffer[4 + 3] = 1                                # row 0 padding
    with pytest.raises(AssertionError, match="row 0, column 3"):
        out.check()

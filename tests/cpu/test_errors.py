"""naming_case: a CUDA error (anything but a failed assertion) names the case it came from, since a
sticky fault makes every later case fail too and the first printed case is the culprit."""
import pytest

from deepgemm.testing.errors import naming_case


class CUDARuntimeError(RuntimeError):
    pass


def test_an_error_prints_the_case_and_is_raised_unchanged(capsys):
    error = CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered\nmore detail")
    with pytest.raises(CUDARuntimeError) as raised:
        with naming_case({"m": 129, "n": 257}):
            raise error
    assert raised.value is error
    assert capsys.readouterr().out == ("CUDARuntimeError in case {'m': 129, 'n': 257}: cudaErrorIllegalAddress: "
                                       "an illegal memory access was encountered\n")
    with pytest.raises(ValueError):
        with naming_case("3x4x5"):
            raise ValueError()
    assert capsys.readouterr().out == "ValueError in case '3x4x5': \n"


def test_a_failed_check_and_a_clean_case_print_nothing(capsys):
    with pytest.raises(AssertionError):
        with naming_case("case"):
            assert 1 == 2
    with naming_case("case"):
        pass
    assert capsys.readouterr().out == ""

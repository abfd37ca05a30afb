"""The numbers read back from records agree with ``float()`` and ``int()`` on every JSON value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.evaluation.numbers import float_of, int_of

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8) | st.sampled_from(["1", "2.5", " 3 ", "-0", "1e3"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _outcome(read, value):
    try:
        return "value", read(value)
    except (TypeError, ValueError) as error:
        return type(error).__name__, None


@given(JSON_VALUES)
def test_float_of_reads_every_json_value_as_float_does(value):
    """Same number, or the same error class, as ``float(value)``: readers keep what they accepted."""
    assert _outcome(lambda v: float_of(v, "field"), value) == _outcome(float, value)


@given(JSON_VALUES)
def test_int_of_reads_every_json_value_as_int_does(value):
    """Same number, or the same error class, as ``int(value)``."""
    assert _outcome(lambda v: int_of(v, "field"), value) == _outcome(int, value)


def test_a_value_that_is_no_number_names_its_field():
    with pytest.raises(TypeError, match="reward: expected a number, got NoneType"):
        float_of(None, "reward")
    with pytest.raises(TypeError, match="group_index: expected a number, got list"):
        int_of([1], "group_index")

"""One declaration per setting (:mod:`searchr1.core.settings`): the rule a value is held to, the
range ``--help`` shows, the flag a message names, and the field the declaration becomes.

A rule is checked against an independent statement of what it means: a value is refused exactly
when it is outside a bound (each bound inclusive or not as declared), not finite, or not a
choice, and the message names the first bound it breaks, in the declared order.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from searchr1.core.errors import UsageError
from searchr1.core.settings import (LARGEST, Rule, SettingError, check_settings, flag_of, key_value, rule_of, setting,
                                    settings_of)
from searchr1.core.settings import _shown as shown

BOUNDS = st.one_of(st.none(), st.integers(-10, 10), st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 1)))


@pytest.mark.parametrize(("number", "text"), [
    (262144, "262144"), (1_000_000, "1000000"), (4e-05, "4e-05"), (1e6, "1000000"), (2.5, "2.5"), (-3, "-3"),
    (-3.0, "-3"), (0.0, "0"), (9.999999e15, "9999999000000000"), (1e16, "1e+16"), (2**31 - 1, "2147483647"),
    (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan"),
    # six significant digits (%g), in either notation, unless they would look whole
    (0.1234567, "0.123457"), (1.0000001e20, "1e+20"), (1.0000001e-05, "1e-05"), (100000.5, "100000.5")])
def test_numbers_are_shown_whole_when_whole_and_short_otherwise(number, text):
    assert shown(number) == text


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15))
@example(100000.5)  # six significant digits would show it as 100000
def test_a_shown_number_reads_back_as_the_number_to_six_digits(number):
    text = shown(number)
    assert float(text) == pytest.approx(number, rel=1e-5, abs=1e-300)
    assert ("." in text or "e" in text) != number.is_integer()


@pytest.mark.parametrize(("rule", "text"), [
    (Rule(), ""), (Rule(at_least=1), "1<=x"), (Rule(above=0.0), "0<x"), (Rule(at_most=64), "x<=64"),
    (Rule(below=1.0), "x<1"), (Rule(at_least=4, at_most=64), "4<=x<=64"), (Rule(above=0.0, below=1.0), "0<x<1"),
    (Rule(at_least=0.5, below=2.5), "0.5<=x<2.5"), (Rule(above=-1, at_most=4e-05), "-1<x<=4e-05"),
    (Rule(at_least=1, above=5, at_most=2, below=9), "1<=x<=2")])  # at_least and at_most are shown first
def test_help_shows_the_range_of_a_rule(rule, text):
    assert rule.describe() == text


def broken_bound(rule: Rule, value: float) -> str | None:
    """The first bound ``value`` breaks, in the order they are checked, stated independently."""
    checks = [(rule.at_least, lambda b: value >= b, ">="), (rule.above, lambda b: value > b, ">"),
              (rule.at_most, lambda b: value <= b, "<="), (rule.below, lambda b: value < b, "<")]
    for bound, holds, sign in checks:
        if bound is not None and not holds(bound):
            return f"must be {sign} {shown(bound)}, got {shown(value)}"
    if abs(value) > LARGEST:
        return f"must be within ±{LARGEST} (the largest number a setting takes), got {shown(value)}"
    return None


@given(at_least=BOUNDS, above=BOUNDS, at_most=BOUNDS, below=BOUNDS,
       value=st.one_of(st.integers(-12, 12), st.floats(-12, 12, allow_nan=False).map(lambda x: round(x, 1)),
                       st.sampled_from([LARGEST, LARGEST + 1, -LARGEST - 1, 2.0**40])))
@example(at_least=1, above=None, at_most=None, below=None, value=1)
@example(at_least=1, above=None, at_most=None, below=None, value=0)
@example(at_least=None, above=0, at_most=None, below=None, value=0)
@example(at_least=None, above=0, at_most=None, below=None, value=0.1)
@example(at_least=None, above=None, at_most=5, below=None, value=5)
@example(at_least=None, above=None, at_most=5, below=None, value=6)
@example(at_least=None, above=None, at_most=None, below=1.0, value=1.0)
@example(at_least=None, above=None, at_most=None, below=1.0, value=0.9)
@example(at_least=None, above=None, at_most=None, below=None, value=LARGEST)
@example(at_least=None, above=None, at_most=None, below=None, value=LARGEST + 1)
def test_a_number_is_refused_exactly_when_it_breaks_a_bound(at_least, above, at_most, below, value):
    rule = Rule(at_least=at_least, above=above, at_most=at_most, below=below)
    assert rule.violation(value) == broken_bound(rule, value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_number_that_is_not_finite_is_refused_whatever_the_bounds(value):
    assert Rule().violation(value) == f"must be a finite number, got {value}"
    assert Rule(at_least=0).violation(value) == f"must be a finite number, got {value}"


def test_choices_and_checks_are_rules_too():
    rule = Rule(choices=("em", "f1"))
    assert rule.violation("em") is None and rule.violation(None) is None
    assert rule.violation("EM") == "must be one of em, f1, got 'EM'"
    seen = []

    def check(value):
        seen.append(value)
        return "is odd" if value == 3 or value == "odd" else None

    checked = Rule(at_least=0, check=check)
    assert checked.violation(-1) == "must be >= 0, got -1" and seen == []  # a broken bound comes first
    assert checked.violation(3) == "is odd" and checked.violation(4) is None
    assert checked.violation("odd") == "is odd" and checked.violation("even") is None
    assert checked.violation(True) is None and seen == [3, 4, "odd", "even", True]  # a bool is not a number
    assert Rule(at_least=5).violation(False) is None and Rule().violation("text") is None


def declared() -> type:
    """A configuration class declared when called: the declarations run inside the test (mutation
    testing plants its bugs after the modules are imported)."""

    @dataclasses.dataclass(frozen=True)
    class Declared:
        count: int = setting(3, at_least=1, help="How many.")
        named: str = setting("x", flag="--other-name", check=lambda v: None if v != "bad" else "is bad")
        secret: str = setting("", repr=False)
        items: list[int] = setting(default_factory=lambda: [1], cli=False)
        plain: int = 0

        def __post_init__(self):
            check_settings(self)

    return Declared


def test_a_declaration_is_a_field_with_its_default_its_rule_and_its_flag():
    Declared = declared()
    fields = {f.name: f for f in dataclasses.fields(Declared)}
    assert [f.name for f, _ in settings_of(Declared)] == ["count", "named", "secret", "items"]
    assert rule_of(fields["plain"]) is None
    assert rule_of(fields["count"]) == Rule(help="How many.", at_least=1)
    assert rule_of(fields["items"]).cli is False
    assert flag_of(fields["count"]) == "--count" and flag_of(fields["named"]) == "--other-name"
    assert flag_of(fields["plain"]) == "--plain" and flag_of(fields["secret"]) == "--secret"
    made = Declared()
    assert (made.count, made.named, made.secret, made.items) == (3, "x", "", [1])
    assert made.items is not Declared().items  # a fresh default per instance
    assert "secret=" not in repr(Declared(secret="hunter2")) and "count=3" in repr(made)


def test_a_broken_rule_raises_a_usage_error_naming_the_flag():
    Declared = declared()
    with pytest.raises(SettingError) as info:
        Declared(count=0)
    assert str(info.value) == "--count must be >= 1, got 0"
    assert (info.value.flag, info.value.rule) == ("--count", "must be >= 1, got 0")
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError) and info.value.exit_code == 2
    with pytest.raises(SettingError, match="^--other-name is bad$"):
        Declared(named="bad")


@pytest.mark.parametrize(("item", "pair"), [("k=v", ("k", "v")), (" k = v ", ("k", "v")), ("a=b=c", ("a", "b=c"))])
def test_key_value_splits_at_the_first_equals_sign_and_strips_both_sides(item, pair):
    assert key_value(item, "--opt", "KEY=VALUE") == pair


@pytest.mark.parametrize("item", ["k", "=v", "k=", " = ", ""])
def test_key_value_names_the_flag_the_item_and_the_form_expected(item):
    with pytest.raises(ValueError) as info:
        key_value(item, "--opt", "KEY=VALUE")
    assert str(info.value) == f"--opt {item!r}: expected KEY=VALUE"


def test_a_private_setting_is_left_out_of_repr_whether_its_default_is_a_value_or_a_factory():
    @dataclasses.dataclass
    class Private:
        url: str = setting("https://user:secret@host/", repr=False)
        headers: dict = setting(default_factory=lambda: {"Authorization": "secret"}, repr=False)
        shown: int = setting(3)

    assert "secret" not in repr(Private()) and "shown=3" in repr(Private())

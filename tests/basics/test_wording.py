"""Counts in printed text read as English: one shared helper, and no ``step(s)`` left in the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import searchr1
from searchr1.basics.wording import plural

PACKAGE = Path(searchr1.__file__).resolve().parent
# A placeholder, at most two words, then a noun with "(s)": "{n} step(s)", "{k} unhealthy step(s)".
COUNTED_WITH_S = re.compile(r"\{[^{}]*\} (?:[\w-]+ ){0,2}[\w-]+\(s\)|%d [\w ]*\(s\)")
NOT_OURS = {"searchr1/commands/mutants.py"}  # kept by another change (mutation testing)


@pytest.mark.parametrize(("count", "noun", "form", "expected"), [
    (0, "step", None, "0 steps"),
    (1, "step", None, "1 step"),
    (2, "step", None, "2 steps"),
    (1, "trajectory", "trajectories", "1 trajectory"),
    (3, "trajectory", "trajectories", "3 trajectories"),
    (1, "finished step", None, "1 finished step"),
])
def test_plural_puts_the_noun_in_the_plural_unless_the_count_is_one(count, noun, form, expected):
    assert plural(count, noun, form) == expected


def test_no_printed_count_says_noun_s_any_more():
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if str(path.relative_to(PACKAGE.parent)) not in NOT_OURS
             for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1)
             if COUNTED_WITH_S.search(line)]
    assert found == []


def test_the_probe_sees_the_forms_it_forbids():
    assert COUNTED_WITH_S.search('f"{len(paths)} golden file(s) match"')
    assert COUNTED_WITH_S.search('f"red lines: {len(flagged)} unhealthy step(s) (show)"')
    assert COUNTED_WITH_S.search('log.warning("%s failed after %d attempt(s)", name, n)')
    assert not COUNTED_WITH_S.search('f"backend {name!r} does not take option(s) {unknown}"')

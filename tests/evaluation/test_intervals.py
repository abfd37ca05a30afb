"""The eval summary's intervals: coverage simulated on seeded draws, and the invariants that make
them honest at a handful of questions (never a point, inside [0, 1], holding the estimate)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from searchr1.evaluation.intervals import (
    FEW_QUESTIONS,
    Z,
    Interval,
    effective_size,
    few_questions,
    largest_macro_variance,
    macro_interval,
    mean_interval,
    wilson_cc,
)

DRAWS = 4000  # per simulated setting: coverage 0.95 is estimated within about +-0.007 (2 standard errors)
FLOOR = 0.93  # the coverage every interval here must reach; a 95% interval should reach 0.95


def coverage(truth: float, samples: list[list[float]], interval: Callable[[list[float]], Interval]) -> float:
    """The share of samples whose interval holds ``truth`` (intervals cached per distinct sample)."""
    seen: dict[tuple[float, ...], bool] = {}
    for sample in samples:
        key = tuple(sorted(sample))
        if key not in seen:
            found = interval(sample)
            seen[key] = found.low - 1e-12 <= truth <= found.high + 1e-12
    return sum(seen[tuple(sorted(sample))] for sample in samples) / len(samples)


def binary_samples(p: float, n: int, seed: int) -> list[list[float]]:
    rows = np.random.default_rng(seed).random((DRAWS, n)) < p
    return rows.astype(float).tolist()


def plain_wilson(values: list[float]) -> Interval:
    """The textbook Wilson score interval without correction (Wilson 1927), to show the check fails it."""
    n, p = len(values), sum(values) / len(values)
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return Interval(centre - half, centre + half, wilson_cc(0.5, 1).rule)


@pytest.mark.slow  # simulates thousands of evals per example
@settings(max_examples=40, deadline=None)
@given(p=st.floats(0.001, 0.999), n=st.integers(1, 40), seed=st.integers(0, 2 ** 32 - 1))
def test_the_interval_of_a_proportion_covers_it_in_at_least_93_percent_of_draws_at_any_p_and_small_n(p, n, seed):
    """Coverage: for a true proportion p and n questions, the 95% interval of the share right
    holds p in at least 93% of simulated evals (pointwise: at every p, not on average over p)."""
    assert coverage(p, binary_samples(p, n, seed), mean_interval) >= FLOOR


def test_the_coverage_check_fails_an_interval_that_undercovers():
    """The check can fail: at one question the uncorrected Wilson interval of a right answer
    starts at 0.206, so it holds p = 0.2 only when the answer is wrong (80% of draws)."""
    assert coverage(0.2, binary_samples(0.2, 1, seed=7), plain_wilson) < FLOOR
    assert coverage(0.2, binary_samples(0.2, 1, seed=7), mean_interval) >= FLOOR


@pytest.mark.slow  # simulates thousands of evals per example
@settings(max_examples=25, deadline=None)
@given(zeros=st.floats(0.0, 1.0), ones=st.floats(0.0, 1.0), n=st.integers(1, 30), seed=st.integers(0, 2 ** 32 - 1))
def test_an_f1_like_score_is_covered_as_a_0_1_one_is(zeros, ones, n, seed):
    """Coverage for scores that are not 0/1: mostly 0, some 1, the rest partial matches (uniform
    in [0.1, 0.9]), as token F1 is. Its mean is covered in at least 93% of draws."""
    ones = min(ones, 1.0 - zeros)
    rng = np.random.default_rng(seed)
    kind = rng.random((DRAWS, n))
    values = np.where(kind < zeros, 0.0, np.where(kind < zeros + ones, 1.0, rng.uniform(0.1, 0.9, (DRAWS, n))))
    truth = ones + (1.0 - zeros - ones) * 0.5
    assert coverage(truth, values.tolist(), mean_interval) >= FLOOR


def macro_coverage(sources: list[tuple[int, float]], seed: int,
                   interval: Callable[[dict[str, list[float]]], Interval] = macro_interval) -> float:
    """The share of simulated evals (DRAWS / 2) whose macro interval holds the true macro, for
    sources of ``n`` questions each right with its own probability ``p``."""
    rng = np.random.default_rng(seed)
    truth = sum(p for _, p in sources) / len(sources)
    draws = [[(rng.random(n) < p).astype(float).tolist() for n, p in sources] for _ in range(DRAWS // 2)]
    seen: dict[tuple[tuple[float, ...], ...], bool] = {}
    held = 0
    for draw in draws:
        key = tuple(tuple(sorted(values)) for values in draw)
        if key not in seen:
            found = interval({f"s{i}": values for i, values in enumerate(draw)})
            seen[key] = found.low - 1e-12 <= truth <= found.high + 1e-12
        held += seen[key]
    return held / len(draws)


def kish_macro(groups: dict[str, list[float]]) -> Interval:
    """The rule before this one: Wilson-CC of the macro at Kish's effective size at every m."""
    macro = sum(sum(v) / len(v) for v in groups.values()) / len(groups)
    return wilson_cc(min(1.0, macro), effective_size([len(v) for v in groups.values()]))


def square_and_add(groups: dict[str, list[float]]) -> Interval:
    """Newcombe's square-and-add (MOVER, Zou & Donner 2008) of the sources' own Wilson-CC intervals."""
    means = [sum(v) / len(v) for v in groups.values()]
    own = [wilson_cc(min(1.0, p), len(v)) for p, v in zip(means, groups.values())]
    macro, count = sum(means) / len(means), len(means)
    low = macro - math.sqrt(sum((p - i.low) ** 2 for p, i in zip(means, own))) / count
    high = macro + math.sqrt(sum((i.high - p) ** 2 for p, i in zip(means, own))) / count
    return Interval(max(0.0, low), min(1.0, high), own[0].rule)


@pytest.mark.slow  # simulates thousands of evals per example
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10), st.floats(0.0, 1.0)), min_size=1, max_size=7),
       st.integers(0, 2 ** 32 - 1))
@example([(1, 0.3)] * 7, 0)  # the user's eval: a bootstrap within sources is a point; square-and-add gives 87%
@example([(8, 0.01), (5, 0.01)], 1)  # rare right answers in two small sources
@example([(1, 0.3)] + [(10, 0.0)] * 5, 2)  # the variance in the one small source: Kish's size gives 70%
@example([(1, 0.875), (4, 1.0)], 3)  # found by hypothesis against Kish's size (87.5%)
@example([(1, 0.3125), (1, 0.25), (3, 0.0), (4, 0.0)], 4)  # and against Kish's size and square-and-add (92%)
@example([(1, 0.2)] * 3 + [(7, 0.0)] * 3, 5)  # the wider of Kish's and square-and-add gives 90%
def test_the_macro_interval_covers_the_true_macro_in_at_least_93_percent_of_draws(sources, seed):
    """Coverage of the macro (the unweighted mean of per-source proportions) for up to seven
    sources of one to ten questions each, each with its own true proportion."""
    assert macro_coverage(sources, seed) >= FLOOR


def test_the_macro_coverage_check_fails_kish_size_and_square_and_add_where_they_undercover():
    """The check can fail: Kish's size takes every source to vary alike, so one small source at
    30% beside five sources at 0 is held only when its answer is wrong (70%); square-and-add of
    seven one-question sources at 30% misses when four or more are right (87%)."""
    one_small = [(1, 0.3)] + [(10, 0.0)] * 5
    assert macro_coverage(one_small, 2, kish_macro) < FLOOR <= macro_coverage(one_small, 2)
    seven_small = [(1, 0.3)] * 7
    assert macro_coverage(seven_small, 0, square_and_add) < FLOOR <= macro_coverage(seven_small, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 500), st.data())
def test_a_proportions_interval_holds_it_inside_0_1_and_is_never_a_point(n, data):
    """Invariants: 0 <= low <= k/n <= high <= 1, the interval has a width at every k (0 of 1
    right is no certainty either), and for 0 < k < n the estimate is strictly inside."""
    k = data.draw(st.integers(0, n))
    found = wilson_cc(k / n, n)
    assert 0.0 <= found.low <= k / n <= found.high <= 1.0
    assert found.width > 0.0
    if 0 < k < n:
        assert found.low < k / n < found.high


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.data())
def test_the_bounds_solve_the_continuity_corrected_score_equation(n, data):
    """What the interval is (Newcombe 1998, method 4): its bounds inside (0, 1) are the p where
    ``|k/n - p| - 1/(2n) = z sqrt(p (1 - p) / n)``, checked here on the equation itself."""
    k = data.draw(st.integers(0, n))
    found = wilson_cc(k / n, n)
    for bound, side in ((found.low, +1), (found.high, -1)):
        if 0.0 < bound < 1.0:
            left = side * (k / n - bound) - 1 / (2 * n)
            assert left == pytest.approx(Z * math.sqrt(bound * (1 - bound) / n), abs=1e-9)


SCORES = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["nq", "popqa", "hotpotqa", "musique"]), SCORES, min_size=1))
def test_the_macro_interval_holds_the_macro_inside_0_1_and_is_never_a_point(groups):
    """Invariants for any scores in [0, 1] (0/1 or not): low <= macro <= high, inside [0, 1],
    and a width however few the questions and whatever their values."""
    macro = sum(sum(v) / len(v) for v in groups.values()) / len(groups)
    found = macro_interval(groups)
    assert 0.0 <= found.low <= macro + 1e-12 and macro - 1e-12 <= found.high <= 1.0
    assert found.width > 0.0


def split_variance(shares: list[float], sizes: list[int]) -> float:
    """The macro estimate's variance when source s has true proportion shares[s]."""
    return sum(p * (1 - p) / n for p, n in zip(shares, sizes)) / len(sizes) ** 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10), st.floats(0.0, 1.0)), min_size=1, max_size=7))
def test_no_split_of_a_macro_over_sources_varies_more_than_the_largest_variance(sources):
    """``largest_macro_variance`` bounds the variance at every split of the macro, and is reached:
    at 1/2 by every source at 1/2 (Kish's size), near 0 and 1 by the smallest source alone, and by
    equal sources at the total's ``m (1 - m) / (S n)``."""
    sizes, shares = [n for n, _ in sources], [p for _, p in sources]
    macro, count = sum(shares) / len(shares), len(sizes)
    assert split_variance(shares, sizes) <= largest_macro_variance(macro, sizes) + 1e-15
    assert largest_macro_variance(0.5, sizes) == pytest.approx(0.25 / effective_size(sizes))
    smallest = sorted(sizes)[:2]
    if len(smallest) == 1 or smallest[0] < smallest[1]:
        m = 0.001 / count  # the smallest source alone at 0.001, the others at 0 (and mirrored at 1)
        alone = 0.001 * 0.999 / smallest[0] / count ** 2
        assert largest_macro_variance(m, sizes) == pytest.approx(alone)
        assert largest_macro_variance(1 - m, sizes) == pytest.approx(alone)
    assert largest_macro_variance(macro, [sizes[0]] * count) == pytest.approx(macro * (1 - macro) / (count * sizes[0]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))), min_size=1, max_size=7))
def test_the_macro_interval_is_every_m_the_corrected_score_test_keeps(counts):
    """What the macro interval is: on a grid, ``m`` lies inside it exactly when
    ``|macro - m| - V / (2 m (1 - m)) <= z sqrt(V)`` with ``V`` the largest variance at ``m``
    (Wilson-CC at the effective size ``m (1 - m) / V``); so the kept ``m`` are one interval."""
    sizes, rights = [n for n, _ in counts], [k for _, k in counts]
    groups = {f"s{i}": [1.0] * k + [0.0] * (n - k) for i, (n, k) in enumerate(zip(sizes, rights))}
    macro = sum(k / n for k, n in zip(rights, sizes)) / len(sizes)
    found = macro_interval(groups)
    for m in (i / 400 for i in range(1, 400)):
        variance = largest_macro_variance(m, sizes)
        kept = abs(macro - m) - variance / (2 * m * (1 - m)) <= Z * math.sqrt(variance)
        if min(abs(m - found.low), abs(m - found.high)) > 1e-9:
            assert kept == (found.low <= m <= found.high)


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=10))
def test_kish_effective_size_lies_between_the_sources_and_the_questions_and_is_the_total_for_equal_sizes(sizes):
    size = effective_size(sizes)
    assert len(sizes) - 1e-9 <= size <= sum(sizes) + 1e-9
    assert effective_size([sizes[0]] * len(sizes)) == pytest.approx(sizes[0] * len(sizes))


def test_scores_outside_0_1_are_refused():
    with pytest.raises(ValueError):
        mean_interval([1.5])
    with pytest.raises(ValueError):
        macro_interval({"nq": []})


def test_a_source_under_the_threshold_is_marked_and_one_at_it_is_not():
    assert few_questions(FEW_QUESTIONS - 1) and not few_questions(FEW_QUESTIONS)

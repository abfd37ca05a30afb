"""``compare``'s paired intervals: coverage simulated on seeded draws, what Tango's interval is,
and the invariants (holds the observed difference, inside [-1, 1], never a point, B - A is
A - B turned over)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from searchr1.evaluation.intervals import Z
from searchr1.evaluation.paired_intervals import (
    discordant,
    macro_paired_interval,
    paired_interval,
    tango_cc,
    tango_score,
)

DRAWS = 3000
FLOOR = 0.93


def trinomial_coverage(n: int, better: float, worse: float, seed: int, *, continuity: float | None = None) -> float:
    """The share of simulated paired evals of ``n`` questions (each right only in B with
    probability ``better``, only in A with ``worse``) whose interval holds ``better - worse``."""
    counts = np.random.default_rng(seed).multinomial(n, [better, worse, 1.0 - better - worse], size=DRAWS)
    truth = better - worse
    cache: dict[tuple[int, int], bool] = {}
    held = 0
    for b, c, _ in counts.tolist():
        if (b, c) not in cache:
            found = tango_cc(b, c, n) if continuity is None else tango_cc(b, c, n, continuity=continuity)
            cache[(b, c)] = found.low - 1e-9 <= truth <= found.high + 1e-9
        held += cache[(b, c)]
    return held / DRAWS


@pytest.mark.slow  # simulates thousands of evals per example
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 25), better=st.floats(0.0, 1.0), share=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 32 - 1))
@example(n=1, better=0.005, share=0.815, seed=0)  # the uncorrected interval's worst place: 81%
@example(n=15, better=0.693, share=0.945, seed=0)
def test_the_paired_interval_covers_the_true_difference_in_at_least_93_percent_of_draws(n, better, share, seed):
    """Coverage, pointwise: whatever the chances of a question being right only in B or only
    in A, the 95% interval holds their difference in at least 93% of simulated comparisons."""
    worse = (1.0 - better) * share
    assert trinomial_coverage(n, better, worse, seed) >= FLOOR


def test_the_coverage_check_fails_the_uncorrected_interval_where_it_undercovers():
    """The check can fail: without the continuity correction, one question that is almost
    always right only in A (81%) gives an interval that misses the difference about a fifth of
    the time."""
    assert trinomial_coverage(1, 0.005, 0.81, seed=3, continuity=0.0) < FLOOR
    assert trinomial_coverage(1, 0.005, 0.81, seed=3) >= FLOOR


@pytest.mark.slow  # simulates thousands of evals per example
@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 20), seed=st.integers(0, 2 ** 32 - 1), zeros=st.floats(0.2, 0.95), tied=st.floats(0, 0.9))
def test_an_f1_like_difference_is_covered_as_a_0_1_one_is(n, seed, zeros, tied):
    """Coverage for scores that are not 0/1 (F1: mostly 0, some 1, some partial): A's and B's
    scores drawn alike, B's equal to A's for a share ``tied`` of the questions; the true
    difference is 0 and is held in at least 93% of draws."""
    rng = np.random.default_rng(seed)

    def f1(shape: tuple[int, int]) -> np.ndarray:
        kind = rng.random(shape)
        return np.where(kind < zeros, 0.0, np.where(kind < (1 + zeros) / 2, 1.0, rng.uniform(0.1, 0.9, shape)))

    draws = DRAWS // 3  # no two draws share an interval here: fewer of them, coverage within about +-0.014
    a = f1((draws, n))
    b = np.where(rng.random((draws, n)) < tied, a, f1((draws, n)))
    held = sum(1 for x, y in zip(a.tolist(), b.tolist())
               if (found := paired_interval(x, y)).low - 1e-9 <= 0.0 <= found.high + 1e-9)
    assert held / draws >= FLOOR


@pytest.mark.slow  # simulates thousands of evals per example
@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.floats(0.0, 0.6), st.floats(0.0, 0.4)), min_size=1, max_size=7),
       st.integers(0, 2 ** 32 - 1))
@example([(1, 0.3, 0.0)] * 7, 0)  # seven sources of one question, B better in 30% of them
def test_the_macro_interval_covers_the_true_macro_difference_in_at_least_93_percent_of_draws(sources, seed):
    rng = np.random.default_rng(seed)
    truth = sum(up - down for _, up, down in sources) / len(sources)
    cache: dict[tuple[tuple[int, int], ...], bool] = {}
    held, draws = 0, DRAWS // 3
    for _ in range(draws):
        counts = tuple(tuple(rng.multinomial(n, [up, down, 1 - up - down])[:2].tolist()) for n, up, down in sources)
        if counts not in cache:
            groups = {f"s{i}": ([0.0] * b + [1.0] * c + [0.0] * (n - b - c),
                                [1.0] * b + [0.0] * c + [0.0] * (n - b - c))
                      for i, ((b, c), (n, _, _)) in enumerate(zip(counts, sources))}
            found = macro_paired_interval(groups)
            cache[counts] = found.low - 1e-9 <= truth <= found.high + 1e-9
        held += cache[counts]
    assert held / draws >= FLOOR


PAIRS = st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), min_size=n, max_size=n)))


@settings(max_examples=100, deadline=None)
@given(PAIRS)
def test_the_interval_holds_the_observed_difference_inside_minus_1_1_and_is_never_a_point(pair):
    a, b = pair
    difference = (math.fsum(b) - math.fsum(a)) / len(a)
    found = paired_interval(a, b)
    assert -1.0 <= found.low <= difference + 1e-12 and difference - 1e-12 <= found.high <= 1.0
    assert found.width > 0.0


@settings(max_examples=100, deadline=None)
@given(PAIRS)
def test_swapping_a_and_b_turns_the_interval_over(pair):
    a, b = pair
    forward, backward = paired_interval(a, b), paired_interval(b, a)
    assert (backward.low, backward.high) == pytest.approx((-forward.high, -forward.low), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.data())
def test_the_interval_is_every_difference_the_score_test_accepts(n, data):
    """What the interval is: on a grid over [-1, 1], a difference is inside exactly when Tango's
    corrected score at it is within +-z (the bisection found the whole accepted set)."""
    b = data.draw(st.integers(0, n))
    c = data.draw(st.integers(0, n - b))
    found = tango_cc(b, c, n)
    for delta in np.linspace(-1.0, 1.0, 401).tolist():
        if min(abs(delta - found.low), abs(delta - found.high)) < 1e-6:
            continue  # at a bound the two sides agree only to the bisection's precision
        accepted = abs(tango_score(b, c, n, delta)) <= Z
        assert accepted == (found.low <= delta <= found.high), (b, c, n, delta)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 200), st.data())
def test_with_as_many_questions_better_as_worse_the_uncorrected_bounds_are_the_closed_form(n, data):
    """Without the correction and with b = c, Tango's bounds are +-z sqrt(b + c + z^2) / (n + z^2),
    the special case of the non-iterative form of Yang, Sun & Hardin (Statistics in Medicine
    32:1336-1342, 2013); no discordant question gives z^2 / (n + z^2)."""
    b = data.draw(st.integers(0, n // 2))
    found = tango_cc(b, b, n, continuity=0.0)
    bound = Z * math.sqrt(2 * b + Z * Z) / (n + Z * Z)
    assert (found.low, found.high) == pytest.approx((-bound, bound), abs=1e-9)


def test_discordant_counts_are_the_questions_right_in_one_file_only_and_fractional_for_f1():
    assert discordant([0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]) == (1.0, 1.0)
    assert discordant([0.5, 0.0], [0.75, 0.25]) == pytest.approx((0.5, 0.0))


def test_impossible_counts_and_scores_are_refused():
    with pytest.raises(ValueError):
        tango_cc(3, 2, 4)
    with pytest.raises(ValueError):
        paired_interval([0.0, 1.0], [1.0])
    with pytest.raises(ValueError):
        paired_interval([2.0], [1.0])

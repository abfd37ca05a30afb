"""95% intervals of a paired difference ``B - A`` (``compare``) that stay honest at a handful of
questions.

Each question has a score under A and one under B, both in [0, 1]; the difference of the means
is the mean of the per-question differences ``d``. Its interval is Tango's score interval for
the difference of two paired proportions (Tango, "Equivalence test and confidence interval for
the difference in proportions for the paired-sample design", Statistics in Medicine 17:891-908,
1998) of the discordant counts ``b = sum(max(d, 0))`` (B better) and ``c = sum(max(-d, 0))``
(A better), with the continuity correction of the corrected McNemar test: ``|b - c - n delta| - 1``
in the numerator (Chang et al., "Continuity corrected score confidence interval for the
difference in proportions in paired data", J. Applied Statistics 51:139-152, 2024; ratesci's
``scorepairci(cc = 0.5)``).

* For 0/1 scores (EM, cover EM, the judge) ``b`` and ``c`` are the questions right only in B
  and only in A, and this is Tango's interval as published. Uncorrected, its coverage falls to
  about 81% at one question and 93% at ten for differences near +-1; corrected, it stays at or
  above 95% in ``tests/evaluation/test_paired_intervals.py``'s simulations. Newcombe's
  square-and-add interval (Statistics in Medicine 17:2635-2650, 1998, method 10) was not
  chosen: with no discordant question and half the questions right it is a point.
* For other scores (F1) ``b`` and ``c`` are fractional. Tango's variance of ``b - c`` is
  ``n (q_b + q_c - delta^2)``; a difference in [-1, 1] with positive and negative parts of
  means ``q_b`` and ``q_c`` has ``E[d^2] <= q_b + q_c``, equal when ``d`` is -1, 0 or 1, so
  the interval that holds for 0/1 scores holds for these, wide rather than narrow. (The paired
  t interval undercovers F1's mostly-zero differences, as in :mod:`searchr1.evaluation.intervals`.)
* **Macro over sources**: the same interval of the macro weights' discordant shares ``b_w`` and
  ``c_w`` (unweighted means over sources of ``b_s / n_s`` and ``c_s / n_s``) taken over Kish's
  effective sample size, as the eval summary's macro is.

The interval is every difference the score test does not reject, so it holds the observed one,
lies in [-1, 1], and is never a point (no discordant question of ``n``: wider than
``+-z^2 / (n + z^2)``, the uncorrected interval's width then). The exact McNemar p value that
``compare`` prints beside it is :func:`searchr1.evaluation.compare.mcnemar_exact`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from searchr1.evaluation.intervals import Z, Interval, IntervalRule, effective_size

CONTINUITY = 1.0  # subtracted from |b - c - n*delta|: the corrected McNemar statistic's |b - c| - 1
_BISECTION_STEPS = 100


def tango_score(b: float, c: float, n: float, delta: float, *, continuity: float = CONTINUITY) -> float:
    """Tango's score statistic at the difference ``delta`` (``b``: B better, ``c``: A better, of
    ``n`` pairs), ``continuity`` taken off ``|b - c - n delta|``. ``q`` is the maximum likelihood
    estimate of the A-better share under ``delta``, the root of
    ``2n q^2 + w q - c delta (1 - delta) = 0``."""
    w = -(b + c) + (2 * n - b + c) * delta
    product = 8 * n * c * delta * (1 - delta)
    root = math.sqrt(max(w * w + product, 0.0))
    q = max(product / (4 * n * (root + w)) if w > 0 else (root - w) / (4 * n), 0.0)
    offset = b - c - n * delta
    numerator = math.copysign(max(abs(offset) - continuity, 0.0), offset)
    variance = n * (2 * q + delta * (1 - delta))
    if numerator == 0.0:
        return 0.0
    if variance <= 0.0:
        return math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def tango_cc(b: float, c: float, n: float, *, continuity: float = CONTINUITY) -> Interval:
    """The differences ``delta`` in [-1, 1] whose score is within ``+-z``: Tango's interval of
    ``(b - c) / n`` (counts may be fractional, and ``n`` effective; ``n > 0``)."""
    if n <= 0 or b < 0 or c < 0 or b + c > n * (1 + 1e-9):
        raise ValueError(f"paired counts need 0 <= b, c and b + c <= n > 0, got b={b}, c={c}, n={n}")
    estimate = (b - c) / n

    def accepted(delta: float) -> bool:
        return abs(tango_score(b, c, n, delta, continuity=continuity)) <= Z

    def bound(edge: float) -> float:
        if accepted(edge):
            return edge
        inside, outside = estimate, edge
        for _ in range(_BISECTION_STEPS):
            middle = (inside + outside) / 2
            if middle in (inside, outside):
                break
            if accepted(middle):
                inside = middle
            else:
                outside = middle
        return inside

    return Interval(bound(-1.0), bound(1.0), IntervalRule.TANGO_CC)


def discordant(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(sum of max(b - a, 0), sum of max(a - b, 0))``: for 0/1 scores, the questions right only
    in B and only in A."""
    if not a or len(a) != len(b) or not all(0.0 <= v <= 1.0 for v in (*a, *b)):
        raise ValueError("paired scores are two equally long, non-empty lists of scores in [0, 1]")
    return (math.fsum(max(y - x, 0.0) for x, y in zip(a, b)), math.fsum(max(x - y, 0.0) for x, y in zip(a, b)))


def paired_interval(a: Sequence[float], b: Sequence[float]) -> Interval:
    """95% interval of ``mean(b) - mean(a)`` over paired scores in [0, 1] (module docstring)."""
    better, worse = discordant(a, b)
    return tango_cc(better, worse, len(a))


def macro_paired_interval(groups: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> Interval:
    """95% interval of the macro difference (the unweighted mean over groups of
    ``mean(b) - mean(a)``) at Kish's effective sample size (module docstring)."""
    if not groups:
        raise ValueError("macro_paired_interval needs at least one group")
    shares = [(better / len(a), worse / len(a)) for a, b in groups.values() for better, worse in [discordant(a, b)]]
    n_eff = effective_size([len(a) for a, _ in groups.values()])
    better = math.fsum(up for up, _ in shares) / len(shares)
    worse = math.fsum(down for _, down in shares) / len(shares)
    return tango_cc(better * n_eff, worse * n_eff, n_eff)

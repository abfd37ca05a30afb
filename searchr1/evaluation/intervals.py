"""95% intervals of eval scores that stay honest at a handful of questions.

An eval reports, per source, the mean of one score per question, and the macro mean (the
unweighted mean over sources). A source often has one or two questions (``eval --limit 8``, the
offline world), where a percentile bootstrap collapses to a point: every resample of two right
answers is two right answers. One rule here gives every score in [0, 1] an interval of positive
width at every size:

* **A mean over questions** (per source, micro): the Wilson score interval with continuity
  correction of ``k = sum(scores)`` right out of ``n`` (Newcombe, "Two-sided confidence intervals
  for the single proportion: comparison of seven methods", Statistics in Medicine 17:857-872,
  1998, method 4). Plain Wilson's coverage dips to 79% at one question and about 84% at twenty
  for proportions near 0 (Brown, Cai & DasGupta, "Interval estimation for a binomial
  proportion", Statistical Science 16:101-133, 2001); the corrected interval covers at least
  about 94.5% at every proportion and size (``tests/evaluation/test_intervals.py`` simulates it).
  It is never a point: 0 right of 2 gives ``[0, 0.80]``.
* **Scores that are not 0/1** (token F1; a score averaged over several samples of a question)
  take the same interval of their sum: of all scores in [0, 1] with a given mean, the 0/1 one
  varies most (Bhatia & Davis, "A better bound on the variance", American Mathematical Monthly
  107:353-357, 2000: ``Var <= mean (1 - mean)``), so the interval that holds for 0/1 scores holds
  for them too, wide rather than narrow when their values cluster. Student's t was measured and
  refused: F1 is mostly 0 with a few partial matches, and at nine questions of which one scored
  0.5 its interval is a sliver (simulated coverage 59% with 90% zeros; 83% at two questions of
  U-shaped scores).
* **Macro over sources**: the same score interval, at the variance the macro estimate has under
  the least favourable truth. The estimate's variance is ``sum p_s (1 - p_s) / n_s / S^2``; among
  all true proportions with mean ``m`` it is largest, ``V(m)``, when the smallest sources hold the
  macro (:func:`largest_macro_variance`, a closed form). The interval is every ``m`` that
  Wilson-CC keeps at the effective size ``n(m) = m (1 - m) / V(m)``:
  ``|macro - m| - 1 / (2 n(m)) <= z sqrt(V(m))``, its ends found by bisection. With sources of
  equal size ``n(m)`` is the total, so the macro gets the pooled proportion's interval; at
  ``m = 1/2`` it is Kish's effective sample size ``S^2 / sum(1 / n_s)`` (Kish, Survey Sampling,
  1965), and toward 0 and 1 it falls to ``S`` times the smallest source.
  Kish's size at every ``m`` (the rule before this one, as Franco, Little, Louis & Slud recommend
  for a stratified sample: "Comparative study of confidence intervals for proportions in complex
  sample surveys", J. Survey Statistics and Methodology 7:334-364, 2019) takes every source to
  vary as a common proportion would, and undercovers when the variance sits in small sources: a
  one-question source at 30% beside five ten-question sources at 0 is covered in 70% of
  simulated evals. Newcombe's square-and-add of the sources' own intervals (MOVER: Zou & Donner,
  "Construction of confidence limits about effect measures: a general approach", Statistics in
  Medicine 27:1693-1702, 2008) covers seven one-question sources at 30% in 87%, and the wider of
  the two covers three one-question sources at 20% beside three seven-question sources at 0 in
  90%. This rule's simulated coverage is at least 94.5% for up to seven sources of one to ten
  questions at any proportions, 0 and 1 included (the minimum is Wilson-CC's own, at one question
  right with probability near 0.055), at intervals 4% wider than Kish's on average over the settings
  simulated. A percentile bootstrap within sources has no spread at all when every source is all
  right or all wrong; this has.

Each interval holds its estimate and lies within [0, 1]. Paired differences (``compare``) are in
:mod:`searchr1.evaluation.paired_intervals`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist


CI_LEVEL = 0.95
Z = NormalDist().inv_cdf((1 + CI_LEVEL) / 2)
# A source with fewer questions than this is marked in every table and stored summary: its
# interval is wide, and one question moves its score by a tenth or more.
FEW_QUESTIONS = 10


class IntervalRule(StrEnum):
    """How an interval was computed (stored beside intervals that name it)."""

    WILSON_CC = "wilson-cc"  # Wilson score with continuity correction, of a (fractional) count or of the macro
    TANGO_CC = "tango-cc"  # Tango's paired score interval with continuity correction, of (fractional) counts


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    rule: IntervalRule

    @property
    def width(self) -> float:
        return self.high - self.low


def few_questions(n: int) -> bool:
    """Whether a source of ``n`` questions is marked as small (fewer than FEW_QUESTIONS)."""
    return n < FEW_QUESTIONS


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _scores(values: Sequence[float], what: str) -> None:
    if not values:
        raise ValueError(f"{what} needs at least one score")
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"{what} takes scores in [0, 1]")


def wilson_cc(proportion: float, n: float) -> Interval:
    """Wilson score interval with continuity correction of a proportion observed over ``n``
    trials (``n >= 1``; an effective, fractional ``n`` is allowed), Newcombe 1998, method 4."""
    if n < 1:
        raise ValueError(f"a proportion needs n >= 1 trials, got {n}")
    if not 0.0 <= proportion <= 1.0:
        raise ValueError(f"a proportion lies in [0, 1], got {proportion}")
    p, q, z2 = proportion, 1.0 - proportion, Z * Z
    low = 0.0 if p <= 0.0 else (
        (2 * n * p + z2 - 1 - Z * math.sqrt(z2 - 2 - 1 / n + 4 * p * (n * q + 1))) / (2 * (n + z2)))
    high = 1.0 if p >= 1.0 else (
        (2 * n * p + z2 + 1 + Z * math.sqrt(z2 + 2 - 1 / n + 4 * p * (n * q - 1))) / (2 * (n + z2)))
    return Interval(max(0.0, min(low, p)), min(1.0, max(high, p)), IntervalRule.WILSON_CC)


def mean_interval(values: Sequence[float]) -> Interval:
    """95% interval of the mean of per-question scores in [0, 1] (module docstring)."""
    _scores(values, "mean_interval")
    return wilson_cc(min(1.0, _mean(values)), len(values))


def effective_size(sizes: Sequence[int]) -> float:
    """Kish's effective sample size of an unweighted mean over groups of these sizes:
    ``S^2 / sum(1 / n_s)``; the total when the groups are equal, never less than ``S``."""
    return len(sizes) ** 2 / math.fsum(1 / n for n in sizes)


def largest_macro_variance(macro: float, sizes: Sequence[int]) -> float:
    """The largest variance the macro estimate can have when the sources' true proportions average
    ``macro``: the maximum over ``p_s`` in [0, 1] with mean ``macro`` of ``sum p_s (1 - p_s) / n_s / S^2``.

    It is concave in each ``p_s``, so its maximum is where the Lagrange condition holds
    (water-filling): below 1/2, ``p_s = (1 - lam n_s) / 2`` on the ``k`` smallest sources and 0 on
    the others, with ``lam = (k - 2 S macro) / sum of their n_s``; ``k`` is the largest for which the
    ``k``-th smallest source keeps a positive share (``lam n_k < 1``). Above 1/2 it is the mirror
    image. Equal sources give ``macro (1 - macro) / (S n)``, the total's variance."""
    m = min(macro, 1.0 - macro)
    if m <= 0.0:
        return 0.0
    ordered, count = sorted(sizes), len(sizes)
    k = next((k for k in range(count, 1, -1) if (k - 2 * count * m) * ordered[k - 1] < math.fsum(ordered[:k])),
             1)  # the smallest source alone always keeps a positive share
    lam = (k - 2 * count * m) / math.fsum(ordered[:k])
    return math.fsum(1 / n - lam * lam * n for n in ordered[:k]) / (4 * count * count)


def _macro_kept(estimate: float, m: float, sizes: Sequence[int]) -> bool:
    """Whether the continuity-corrected score test keeps ``m`` as the true macro: Wilson-CC's
    ``|estimate - m| - 1 / (2 n) <= Z sqrt(m (1 - m) / n)`` at the effective size
    ``n = m (1 - m) / V(m)`` of the least favourable split (``V``: :func:`largest_macro_variance`)."""
    variance = largest_macro_variance(m, sizes)
    # the correction's limit at 0 and 1, where only the smallest sources hold the macro
    correction = variance / (2 * m * (1 - m)) if 0.0 < m < 1.0 else 1 / (2 * len(sizes) * min(sizes))
    return abs(estimate - m) - correction <= Z * math.sqrt(variance)


def _macro_bound(estimate: float, sizes: Sequence[int], far: float) -> float:
    """The end of the macro's interval toward ``far`` (0 or 1), by bisection to below 1e-15: the
    kept ``m`` form one interval around the estimate (``tests/evaluation/test_intervals.py``)."""
    if _macro_kept(estimate, far, sizes):
        return far
    kept, refused = estimate, far
    for _ in range(60):
        middle = (kept + refused) / 2
        kept, refused = (middle, refused) if _macro_kept(estimate, middle, sizes) else (kept, middle)
    return kept


def macro_interval(groups: Mapping[str, Sequence[float]]) -> Interval:
    """95% interval of the unweighted mean over groups of their mean scores (macro): Wilson-CC at
    the effective size of the least favourable split of each candidate macro (module docstring)."""
    if not groups:
        raise ValueError("macro_interval needs at least one group")
    for name, values in groups.items():
        _scores(values, f"macro_interval's group {name!r}")
    macro = min(1.0, _mean([_mean(values) for values in groups.values()]))
    sizes = [len(values) for values in groups.values()]
    return Interval(min(_macro_bound(macro, sizes, 0.0), macro), max(_macro_bound(macro, sizes, 1.0), macro),
                    IntervalRule.WILSON_CC)


def describe_rules() -> str:
    """One line for cards and summaries: which interval each kind of score gets."""
    return (f"{CI_LEVEL:.0%} Wilson score interval with continuity correction (Newcombe 1998) of the summed "
            "scores (F1's too: a 0/1 score varies most, Bhatia & Davis 2000): per source over its questions, "
            "micro over all questions, macro at the effective size of its least favourable split over sources "
            "(Kish's S^2/sum(1/n_s) at 1/2, S times the smallest source near 0 and 1); "
            f"sources with fewer than {FEW_QUESTIONS} questions are marked")

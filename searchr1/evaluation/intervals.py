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
* **Macro over sources**: the same interval at Kish's effective sample size
  ``n_eff = S^2 / sum(1 / n_s)`` (Kish, Survey Sampling, 1965: weights ``1 / (S n_s)`` per
  question; the total when sources are equal), the approach Franco, Little, Louis & Slud
  recommend for a proportion from a stratified sample ("Comparative study of confidence
  intervals for proportions in complex sample surveys", J. Survey Statistics and Methodology
  7:334-364, 2019). Its variance is the one a common proportion would give; sources that differ
  have less (``p (1 - p)`` is concave), so it errs wide. A percentile bootstrap within sources
  has no spread at all when every source is all right or all wrong; this has.

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

    WILSON_CC = "wilson-cc"  # Wilson score with continuity correction, of a (fractional) count
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


def macro_interval(groups: Mapping[str, Sequence[float]]) -> Interval:
    """95% interval of the unweighted mean over groups of their mean scores (macro), at Kish's
    effective sample size (module docstring)."""
    if not groups:
        raise ValueError("macro_interval needs at least one group")
    for name, values in groups.items():
        _scores(values, f"macro_interval's group {name!r}")
    macro = _mean([_mean(values) for values in groups.values()])
    return wilson_cc(min(1.0, macro), effective_size([len(values) for values in groups.values()]))


def describe_rules() -> str:
    """One line for cards and summaries: which interval each kind of score gets."""
    return (f"{CI_LEVEL:.0%} Wilson score interval with continuity correction (Newcombe 1998) of the summed "
            "scores (F1's too: a 0/1 score varies most, Bhatia & Davis 2000): per source over its questions, "
            "micro over all questions, macro at Kish's effective sample size S^2/sum(1/n_s) (Franco et al. 2019); "
            f"sources with fewer than {FEW_QUESTIONS} questions are marked")

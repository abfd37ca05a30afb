"""Group-relative advantages (GRPO without a critic).

Every question is rolled out ``G`` times; a trajectory's advantage says how much better its
reward was than its siblings'. Groups are formed by ``question_index`` only, so no group can
influence another (a property the tests check).

Three decisions matter more than the formula:

* **Degenerate groups are decided on the rewards.** If every reward in a group is equal, the
  group carries no learning signal, and it gets advantage exactly ``0.0``. Equality of the
  rewards decides, not ``advantage == 0.0``: eight rewards of ``-0.1`` have a mean that is not
  exactly ``-0.1`` in floating point, so their advantages would be about ``-1.39e-17`` of noise.
* **Environment failures are not the policy's fault.** When a search failed (``env_error``)
  or sampling failed (``sampler_error``) anywhere in a group, the whole group is left out of
  the update by default: its siblings' advantages would be measured against a reward the
  policy did not earn. ``keep_env_failures=True`` keeps such groups; sampler-error
  trajectories then still take no part (their reward is a placeholder and they may have no
  tokens), while search-error trajectories are scored like any other. A group where the judge
  failed (``--judge-weight``) is always left out: that trajectory has no reward to be scored with.
* **Normalisation is a choice.** ``mode="mean"`` (default, as the lab port and Dr. GRPO):
  ``reward - group mean``. ``mode="zscore"``: divided by the group's sample standard
  deviation (``ddof=1``) plus ``ZSCORE_EPSILON``, as verl's GRPO that official Search-R1
  trains with. ``mode="rloo"``: the reward minus the mean of the *other* rewards of the group
  (leave-one-out), ``G / (G - 1) * (reward - group mean)``, so a trajectory is never compared
  with itself. ``mode="none"``: the raw reward. Degenerate groups never reach the division.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from searchr1.core.types import Exclusion, Trajectory

AdvantageMode = Literal["mean", "zscore", "rloo", "none"]
ADVANTAGE_MODES: tuple[AdvantageMode, ...] = get_args(AdvantageMode)

# Added to the standard deviation (not the variance), as in verl's GRPO estimator.
ZSCORE_EPSILON = 1e-6


@dataclass(frozen=True)
class GroupSummary:
    """Counts for metrics. Each group is counted in at most one of ``env_failure`` and
    ``degenerate`` (an environment failure is checked first: its rewards are not trusted)."""

    groups: int
    degenerate: int
    env_failure: int

    @classmethod
    def of(cls, kinds: list[Exclusion | None]) -> GroupSummary:
        """The counts of the groups classified as ``kinds``."""
        return cls(len(kinds), kinds.count(Exclusion.DEGENERATE_GROUP), kinds.count(Exclusion.ENV_FAILURE_GROUP))

    @property
    def trained(self) -> int:
        """Groups that may send datums to the trainer."""
        return self.groups - self.degenerate - self.env_failure


def group_by_question(trajectories: Iterable[Trajectory]) -> dict[int, list[Trajectory]]:
    """Groups in first-seen order of their question index."""
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.question_index].append(trajectory)
    return dict(groups)


def _scored_members(group: Sequence[Trajectory]) -> list[Trajectory]:
    """The trajectories whose rewards enter the group statistics (with kept env failures)."""
    return [t for t in group if not t.sampler_error]


def classify_group(group: Sequence[Trajectory], *, keep_env_failures: bool = False) -> Exclusion | None:
    """``Exclusion.ENV_FAILURE_GROUP``, ``Exclusion.DEGENERATE_GROUP`` or ``None`` (the group trains)."""
    if any(t.judge_failed or (not keep_env_failures and (t.env_error or t.sampler_error)) for t in group):
        return Exclusion.ENV_FAILURE_GROUP
    rewards = {t.reward for t in _scored_members(group)}
    if len(rewards) <= 1:  # all equal (or nothing scored): no signal
        return Exclusion.DEGENERATE_GROUP
    return None


def classified_groups(trajectories: Iterable[Trajectory], *,
                      keep_env_failures: bool = False) -> list[tuple[int, list[Trajectory], Exclusion | None]]:
    """Every group as ``(question index, trajectories, classification)``, in first-seen order:
    the one loop that decides which groups train (pure)."""
    return [(question, group, classify_group(group, keep_env_failures=keep_env_failures))
            for question, group in group_by_question(trajectories).items()]


def summarize_groups(trajectories: Iterable[Trajectory], *, keep_env_failures: bool = False) -> GroupSummary:
    """Pure: what :func:`assign_group_advantages` would decide, without touching anything."""
    kinds = [kind for _, _, kind in classified_groups(trajectories, keep_env_failures=keep_env_failures)]
    return GroupSummary.of(kinds)


def group_advantages(rewards: Sequence[float], *, mode: AdvantageMode = "mean") -> list[float]:
    """Advantages of one non-degenerate group (pure; the caller handles degenerate groups)."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")
    if mode == "none":
        return [float(r) for r in rewards]
    mean = math.fsum(rewards) / len(rewards)
    centred = [float(r) - mean for r in rewards]
    if mode == "mean":
        return centred
    if len(rewards) < 2:
        raise ValueError(f"{mode} advantages need at least two rewards")
    if mode == "rloo":
        total = math.fsum(rewards)
        others = len(rewards) - 1
        return [float(r) - (total - float(r)) / others for r in rewards]
    std = math.sqrt(math.fsum(c * c for c in centred) / (len(rewards) - 1))
    return [c / (std + ZSCORE_EPSILON) for c in centred]


def assign_group_advantages(
    trajectories: Sequence[Trajectory],
    *,
    mode: AdvantageMode = "mean",
    keep_env_failures: bool = False,
    surplus: Collection[int] = (),
) -> GroupSummary:
    """Set ``advantage`` and ``excluded`` on every trajectory, each turn carrying its trajectory's
    advantage (:meth:`~searchr1.core.types.Trajectory.credit`); return the groups' summary (each
    group classified once, here). ``surplus``: question indices of groups with a signal that
    dynamic sampling leaves out (``Exclusion.SURPLUS_GROUP``, advantage 0;
    :mod:`searchr1.training.dynamic_sampling`); they count as trained groups in the summary, as
    :func:`summarize_groups` counts them."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")
    kinds: list[Exclusion | None] = []
    for question, group, kind in classified_groups(trajectories, keep_env_failures=keep_env_failures):
        kinds.append(kind)
        for trajectory in group:
            trajectory.credit(0.0)
            trajectory.excluded = None
        if kind is None and question in surplus:
            kind = Exclusion.SURPLUS_GROUP
        if kind is not None:
            for trajectory in group:
                trajectory.excluded = kind
            continue
        scored = _scored_members(group)
        for trajectory, advantage in zip(
            scored, group_advantages([t.reward for t in scored], mode=mode), strict=True
        ):
            trajectory.credit(advantage)  # every turn of it carries its advantage
        for trajectory in group:
            if trajectory.sampler_error:
                trajectory.excluded = Exclusion.SAMPLER_ERROR
    return GroupSummary.of(kinds)

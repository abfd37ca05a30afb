"""Reward terms, opt-in: a judge's verdict mixed into the answer's score (``--judge-weight W``),
Kimi k1.5's length reward among a question's samples (``--length-reward W``) and DAPO's soft
over-long penalty (``--overlong-buffer N``).

The judge's term replaces the score's reward by its mix with the verdict; the others go to a
trajectory's ``shaping``, and its ``reward`` is its score plus them. The step assigns them once,
after scoring and before advantages (:mod:`searchr1.core.trainer`). Sources and choices:
docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from searchr1.core.types import Trajectory


def assign_judge_rewards(trajectories: Sequence[Trajectory], weight: float) -> dict[str, float]:
    """``--judge-weight W``: the score of each answer the judge gave a verdict on becomes
    ``(1 - W) * rule + W * judge`` (judge 1.0 for yes, 0.0 for no); an answer the judge failed on
    keeps its rule score and its group is left out (:func:`searchr1.core.advantage.classify_group`),
    and a trajectory without an answer is not judged. Returns the mean verdict, the share of
    verdicts that differ from the rule (a full rule score being right), and the share failed."""
    judged = [t for t in trajectories if t.verdict is not None and t.reward_result is not None]
    right = disagree = failed = 0
    for trajectory in judged:
        verdict, score = trajectory.verdict, trajectory.reward_result
        assert verdict is not None and score is not None
        if verdict.error is not None:
            failed += 1
            continue
        right += verdict.correct
        disagree += verdict.correct != (score.reward >= 1.0)
        trajectory.reward_result = replace(score, reward=(1.0 - weight) * score.reward + weight * verdict.correct)
    answered = max(len(judged) - failed, 1)
    return {"reward/judge": right / answered, "reward/judge_disagrees": disagree / answered,
            "reward/judge_failed": failed / max(len(judged), 1)}


def length_reward(length: int, shortest: int, longest: int, right: bool) -> float:
    """Kimi k1.5's length reward of one sample among its question's samples: with
    ``lam = 0.5 - (length - shortest) / (longest - shortest)``, a right answer gets ``lam`` and any
    other ``min(0, lam)`` (0 when every sample has the same length)."""
    lam = 0.0 if longest == shortest else 0.5 - (length - shortest) / (longest - shortest)
    return lam if right else min(0.0, lam)


def assign_length_rewards(trajectories: Sequence[Trajectory], weight: float) -> dict[str, float]:
    """``--length-reward W``: add ``W`` times :func:`length_reward` to each scored trajectory's
    reward, lengths (the tokens it generated) compared within its question's group, a right
    answer being one with full score; returns the step's metrics of the term."""
    groups: dict[int, list[Trajectory]] = {}
    for trajectory in trajectories:
        if not trajectory.sampler_error:
            groups.setdefault(trajectory.question_index, []).append(trajectory)
    terms = []
    for group in groups.values():
        lengths = [sum(len(turn.completion_tokens) for turn in t.turns) for t in group]
        for trajectory, length in zip(group, lengths):
            term = length_reward(length, min(lengths), max(lengths), trajectory.score.reward >= 1.0)
            trajectory.shaping = weight * term
            terms.append(weight * term)
    return {"reward/length": sum(terms) / len(terms) if terms else 0.0}


def overlong_penalty(length: int, limit: int, buffer: int) -> float:
    """DAPO's soft over-long punishment: 0 up to ``limit - buffer`` tokens, then falling linearly to
    -1 at ``limit`` (and -1 past it)."""
    return max(-1.0, min(0.0, (limit - buffer - length) / buffer))


def assign_overlong_penalties(trajectories: Sequence[Trajectory], limit: int, buffer: int) -> dict[str, float]:
    """``--overlong-buffer N``: add :func:`overlong_penalty` of each scored trajectory's whole
    length against ``limit`` (``--max-trajectory-tokens``, the budget that cuts it) to its reward."""
    penalties = []
    for trajectory in trajectories:
        if not trajectory.sampler_error:
            penalty = overlong_penalty(trajectory.whole_tokens, limit, buffer)
            trajectory.shaping += penalty
            penalties.append(penalty)
    return {"reward/overlong": sum(penalties) / len(penalties) if penalties else 0.0}

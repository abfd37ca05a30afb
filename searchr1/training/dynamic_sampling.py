"""Dynamic sampling (DAPO's ``filter_groups``): train only on groups that carry a signal.

A group whose rewards are all equal has advantage 0 everywhere and teaches nothing; late in
training most groups are all right, and a step of such groups is wasted. With
``--dynamic-sampling`` a step rolls out its ``--questions-per-batch`` questions, and while
fewer than that many groups carry a signal it draws the next batch of questions from the data
cursor (at most ``--max-oversample-batches`` more draws), then trains on the first
``questions-per-batch`` groups with a signal, in draw order. A step that still has fewer trains
on what it found.

What keeps a run exact: every draw of step ``b`` takes the next questions at the data cursor
(which advances by every question drawn and is recorded in each checkpoint), and its
trajectories are seeded by ``(step b, question index)`` with fresh question indices per draw
(``draw * questions_per_batch + i``). A resumed run therefore draws the same questions with
the same seeds as an uninterrupted one. The cursor is only known once a step has finished
drawing, so dynamic sampling needs on-policy steps (``--max-steps-off-policy 0``).

Metrics per step: ``dynamic/questions_drawn``, ``dynamic/groups_kept``, ``dynamic/groups_dropped``
(no signal, or an environment failure), ``dynamic/groups_surplus`` (with signal, beyond the
batch) and ``dynamic/draws``. Reward metrics cover every trajectory drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchr1.core.advantage import classify_group, group_by_question
from searchr1.core.types import Trajectory

SURPLUS_GROUP = "dynamic_sampling_surplus"  # a Trajectory.excluded value


def signal_groups(trajectories: Sequence[Trajectory], *, keep_env_failures: bool = False) -> int:
    """How many groups of ``trajectories`` would send datums (pure)."""
    return sum(classify_group(group, keep_env_failures=keep_env_failures) is None
               for group in group_by_question(trajectories).values())


def keep_first_groups(trajectories: Sequence[Trajectory], wanted: int, *,
                      keep_env_failures: bool = False) -> dict[str, float]:
    """Leave the first ``wanted`` groups with a signal (in question-index order) as they are;
    mark the later ones ``SURPLUS_GROUP`` with advantage 0. Returns the step's counters."""
    groups = sorted(group_by_question(trajectories).items())
    kept = dropped = surplus = 0
    for _, group in groups:
        if classify_group(group, keep_env_failures=keep_env_failures) is not None:
            dropped += 1
        elif kept < wanted:
            kept += 1
        else:
            surplus += 1
            for trajectory in group:
                trajectory.advantage = 0.0
                trajectory.excluded = SURPLUS_GROUP
    return {"dynamic/questions_drawn": float(len(groups)), "dynamic/groups_kept": float(kept),
            "dynamic/groups_dropped": float(dropped), "dynamic/groups_surplus": float(surplus)}

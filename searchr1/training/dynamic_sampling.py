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

from searchr1.core.advantage import classified_groups
from searchr1.core.types import Trajectory


def signal_groups(trajectories: Sequence[Trajectory], *, keep_env_failures: bool = False) -> int:
    """How many groups of (scored) ``trajectories`` would send datums (pure)."""
    return sum(kind is None for _, _, kind in classified_groups(trajectories, keep_env_failures=keep_env_failures))


def surplus_groups(trajectories: Sequence[Trajectory], wanted: int, *,
                   keep_env_failures: bool = False) -> tuple[frozenset[int], dict[str, float]]:
    """The question indices of the groups with a signal beyond the first ``wanted`` (in
    question-index order; the step leaves them out as ``Exclusion.SURPLUS_GROUP``), and the step's
    counters (pure)."""
    kept = dropped = 0
    surplus: set[int] = set()
    groups = sorted(classified_groups(trajectories, keep_env_failures=keep_env_failures), key=lambda g: g[0])
    for question, _, kind in groups:
        if kind is not None:
            dropped += 1
        elif kept < wanted:
            kept += 1
        else:
            surplus.add(question)
    return frozenset(surplus), {
        "dynamic/questions_drawn": float(len(groups)), "dynamic/groups_kept": float(kept),
        "dynamic/groups_dropped": float(dropped), "dynamic/groups_surplus": float(len(surplus))}

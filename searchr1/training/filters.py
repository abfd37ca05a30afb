"""Training questions left out before a run starts, from a ``probe-data`` file (``--probe``).

Two filters, each a declared setting of :class:`~searchr1.training.config.TrainConfig`:

* ``--drop-guessable K``: questions the probe's policy answered right closed-book (no tool offered)
  in at least ``K`` of its attempts. The RLVR chapter's rule for "hackable" prompts (Kimi k1.5:
  answered right within N = 8 tries without reasoning, removed) is ``K = 1`` over 8 attempts; for a
  search agent such a question rewards guessing and teaches nothing about search.
* ``--drop-solved``: questions the probe solved with tools in every attempt: their groups would
  carry no signal (all right), and pay for their sampling anyway.

Only training examples are filtered: evaluation reads its own data and never a probe. A question
the probe does not hold is kept (and counted). The run's ``config.json`` records the ids dropped
and why (``dropped_questions``), and a resumed run drops exactly those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from searchr1.core.types import SearchExample
from searchr1.evaluation.probe import Probe, ProbedQuestion


class DropReason(StrEnum):
    """Why a training question was left out (``config.json``'s ``dropped_questions`` keys)."""

    GUESSABLE = "guessable"  # right closed-book in at least --drop-guessable attempts
    SOLVED = "solved"  # right with tools in every attempt (--drop-solved)


class ProbeMismatch(ValueError):
    """The probe holds a question id whose text is not the training data's (another dataset)."""


@dataclass(frozen=True)
class Filtered:
    """What filtering kept, what it dropped (ids by reason, in data order) and how many questions
    the probe did not hold."""

    kept: list[SearchExample]
    dropped: dict[str, list[str]]
    unprobed: int


def drop_reason(probed: ProbedQuestion, *, drop_guessable: int, drop_solved: bool) -> DropReason | None:
    """Why ``probed`` is left out, or None (guessable first when both hold)."""
    if drop_guessable and probed.closed_book.right >= drop_guessable:
        return DropReason.GUESSABLE
    if drop_solved and probed.with_tools.attempts and probed.with_tools.right == probed.with_tools.attempts:
        return DropReason.SOLVED
    return None


def filter_examples(examples: Sequence[SearchExample], probe: Probe | Mapping[str, ProbedQuestion], *,
                    drop_guessable: int, drop_solved: bool) -> Filtered:
    """The training ``examples`` without the questions the probe marks (pure); a probe line whose
    id names an example with another question text is refused (:class:`ProbeMismatch`)."""
    questions = probe.questions if isinstance(probe, Probe) else probe
    kept: list[SearchExample] = []
    dropped: dict[str, list[str]] = {reason.value: [] for reason in DropReason}
    unprobed = 0
    for example in examples:
        probed = questions.get(example.id)
        if probed is None:
            unprobed += 1
            kept.append(example)
            continue
        if probed.question.strip() != example.question.strip():
            raise ProbeMismatch(f"question {example.id!r} reads {probed.question!r} in the probe but "
                                f"{example.question!r} in the data: the probe is of another dataset")
        reason = drop_reason(probed, drop_guessable=drop_guessable, drop_solved=drop_solved)
        if reason is None:
            kept.append(example)
        else:
            dropped[reason.value].append(example.id)
    return Filtered(kept, {reason: ids for reason, ids in dropped.items() if ids}, unprobed)


def apply_recorded_drops(examples: Sequence[SearchExample],
                         dropped: Mapping[str, Sequence[str]]) -> list[SearchExample]:
    """``examples`` without the ids a run recorded as dropped (a resumed run's, exactly as it started)."""
    left_out = {question for ids in dropped.values() for question in ids}
    return [example for example in examples if example.id not in left_out]

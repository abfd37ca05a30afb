"""Question/answer examples: the unit of work for rollouts, training and evaluation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchExample:
    id: str
    question: str
    answers: tuple[str, ...]
    data_source: str

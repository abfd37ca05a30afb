"""Outcome reward: a single ``Answer:`` line scored against the references.

A format failure (no single non-empty ``Answer:`` line) is exactly ``FORMAT_PENALTY`` (-0.1)
whatever the reward kind. Otherwise the reward is one of three scores of the normalised answer, each the best over
the references (``--reward``):

* ``em`` (default, the lab port): 1.0 for an exact match after normalisation, else 0.0;
* ``f1``: token F1, the harmonic mean of token precision and recall (tokens counted with
  multiplicity, as SQuAD's scorer; 0.0 with no common token);
* ``cover_em``: 1.0 when a normalised reference is a substring of the normalised answer, else
  0.0: exactly Search-R1's ``subem`` (``subem_check`` in ``verl/utils/reward_score/qa_em.py`` of
  github.com/PeterGriffinJin/Search-R1), so "Parisian" covers "Paris" and "in 1990" covers "1".
  With ``normalization="official"`` it is that function to the character.

An answer or a reference that normalises to the empty string ("The", "a") is scored the way
Search-R1's ``em_check`` and ``subem_check`` score it, and F1 follows (SQuAD 2.0's rule for
empty token lists): two empty strings match (EM, F1 and cover EM all 1); an empty reference is a
substring of every answer (cover EM 1 whatever the answer, EM and F1 0 unless the answer is
empty too); an empty answer against a non-empty reference scores 0 in all three. So EM 1 always
comes with F1 1 and cover EM 1.

There is no reward for searching, for format alone, or for intermediate steps. Every
:class:`RewardResult` carries all three scores, so evaluation reports them whatever the
training reward.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Literal, get_args

from searchr1.core.types import FORMAT_PENALTY, NOT_ANSWERED, RewardResult, Termination, Trajectory

ANSWER_PATTERN = re.compile(r"^\s*Answer:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
ARTICLE_PATTERN = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)

Normalization = Literal["unicode", "official"]
NORMALIZATIONS: tuple[Normalization, ...] = get_args(Normalization)
RewardKind = Literal["em", "f1", "cover_em"]
REWARD_KINDS: tuple[RewardKind, ...] = get_args(RewardKind)
_ASCII_PUNCTUATION = str.maketrans("", "", string.punctuation)


def extract_answer(text: str) -> str | None:
    """The text after ``Answer:`` when exactly one such line exists and it is not empty.

    The line must start (after optional whitespace) with ``Answer:``, case-insensitive; the
    answer may start on the next line (``\\s*`` crosses newlines). Text after the answer line
    is allowed.
    """
    matches = ANSWER_PATTERN.findall(text or "")
    if len(matches) != 1:
        return None
    answer = matches[0].strip()
    return answer or None


def normalize_answer(text: str, *, normalization: Normalization = "unicode") -> str:
    """Lowercase, drop punctuation, drop English articles, collapse whitespace.

    ``unicode`` (the lab port's rule) drops every character whose Unicode category is
    punctuation (P*), including curly quotes and dashes. ``official`` follows the official
    Search-R1 scorer and drops only ``string.punctuation`` (ASCII, symbols included); use it
    when comparing with paper numbers.
    """
    text = text.lower()
    if normalization == "unicode":
        text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    elif normalization == "official":
        text = text.translate(_ASCII_PUNCTUATION)
    else:
        raise ValueError(f"unknown normalization {normalization!r}; choose one of {NORMALIZATIONS}")
    text = ARTICLE_PATTERN.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """Token F1 of two *normalised* strings (whitespace tokens, counted with multiplicity); when
    either has no token, 1.0 if both have none, else 0.0 (as exact match decides it)."""
    predicted, gold = prediction.split(), reference.split()
    if not predicted or not gold:
        return float(predicted == gold)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def covers(prediction: str, reference: str) -> bool:
    """Search-R1's ``subem``: whether the *normalised* ``reference`` is a substring of the
    normalised ``prediction`` (not only on word boundaries; an empty reference is in every
    prediction)."""
    return reference in prediction


def score_answer(
    text: str, references: Iterable[str], *, normalization: Normalization = "unicode", reward: RewardKind = "em"
) -> RewardResult:
    """All three scores of ``text``'s answer; ``reward`` picks the one that is the reward."""
    if reward not in REWARD_KINDS:
        raise ValueError(f"unknown reward {reward!r}; choose one of {REWARD_KINDS}")
    answer = extract_answer(text)
    if answer is None:
        return RewardResult(FORMAT_PENALTY, False, False, None)
    predicted = normalize_answer(answer, normalization=normalization)
    golds = [normalize_answer(reference, normalization=normalization) for reference in references]
    matched = any(predicted == gold for gold in golds)
    f1 = max((token_f1(predicted, gold) for gold in golds), default=0.0)
    cover = any(covers(predicted, gold) for gold in golds)
    value = {"em": 1.0 if matched else 0.0, "f1": f1, "cover_em": 1.0 if cover else 0.0}[reward]
    return RewardResult(value, True, matched, answer, f1=f1, cover_em=cover)


def score_trajectories(trajectories: Iterable[Trajectory], *, reward: RewardKind = "em") -> None:
    """Set ``reward_result`` on every trajectory whose sampling did not fail (``reward``: em, f1 or
    cover_em; every score is recorded whichever is the reward). Only an ``answer`` termination
    is scored; any other ending earns the format penalty, even when its text carries an
    ``Answer:`` line (breaking the protocol is never rewarded).
    """
    for trajectory in trajectories:
        if trajectory.sampler_error:
            continue
        trajectory.reward_result = (score_answer(trajectory.final_text, trajectory.example.answers, reward=reward)
                            if trajectory.termination == Termination.ANSWER else NOT_ANSWERED)

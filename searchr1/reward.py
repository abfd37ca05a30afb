"""Outcome reward: exact match of a single ``Answer:`` line against the references.

Values are exactly -0.1 (no single non-empty ``Answer:`` line: a format failure), 0.0 (an
answer that matches no reference) and 1.0 (exact match after normalisation). There is no
reward for searching, for format alone, or for intermediate steps.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

ANSWER_PATTERN = re.compile(r"^\s*Answer:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
ARTICLE_PATTERN = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)

FORMAT_PENALTY = -0.1
NORMALIZATIONS = ("unicode", "official")
_ASCII_PUNCTUATION = str.maketrans("", "", string.punctuation)


@dataclass(frozen=True)
class RewardResult:
    reward: float
    valid_format: bool
    exact_match: bool
    answer: str | None


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


def normalize_answer(text: str, *, normalization: str = "unicode") -> str:
    """Lowercase, drop punctuation, drop English articles, collapse whitespace.

    ``unicode`` (the seed's rule) drops every character whose Unicode category is
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


def score_answer(
    text: str, references: Iterable[str], *, normalization: str = "unicode"
) -> RewardResult:
    answer = extract_answer(text)
    if answer is None:
        return RewardResult(FORMAT_PENALTY, False, False, None)
    predicted = normalize_answer(answer, normalization=normalization)
    matched = any(
        predicted == normalize_answer(reference, normalization=normalization)
        for reference in references
    )
    return RewardResult(1.0 if matched else 0.0, True, matched, answer)

"""The offline question set as knowledge: per question, its search hops and the answers.

``searchr1/offline/questions.json`` is the hand-written source of the offline world (see
:mod:`searchr1.offline`). This module reads it into small frozen records that the twin's
learning policy and its tests use: the question, its hops in order (the query, and the title
and passage the offline search service returns for it), the accepted answers and one
plausible wrong answer. Pure apart from :func:`load_world`, which reads the file.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.errors import UserError
from searchr1.offline import QUESTIONS
from searchr1.run.jsonl import read_json_object

SPLITS = ("train", "dev")


class WorldError(UserError, ValueError):
    """``questions.json`` is malformed; the message names the file, the question and the field."""


@dataclass(frozen=True)
class Hop:
    """One search step: the query and the passage the offline search returns for it."""

    query: str
    title: str
    text: str


@dataclass(frozen=True)
class WorldQuestion:
    id: str
    split: str
    question: str
    answers: tuple[str, ...]
    wrong: str
    hops: tuple[Hop, ...]
    data_source: str = "unknown"


def question_key(text: str) -> str:
    """How a question is recognised in a prompt: NFC (the tokenizer's normaliser), trimmed."""
    return unicodedata.normalize("NFC", text).strip()


def _field(item: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in item:
        raise WorldError(f"{where}: missing field {key!r}")
    value = item[key]
    if not isinstance(value, kind) or (isinstance(value, (str, list)) and not value):
        raise WorldError(f"{where}: field {key!r} must be a non-empty {kind.__name__}")
    return value


def _parse_question(item: Any, split: str, where: str) -> WorldQuestion:
    if not isinstance(item, Mapping):
        raise WorldError(f"{where}: must be an object")
    where = f"{where} ({item.get('id', '?')})"
    hops = []
    for index, hop in enumerate(_field(item, "hops", list, where)):
        at = f"{where}: hops[{index}]"
        if not isinstance(hop, Mapping):
            raise WorldError(f"{at}: must be an object")
        hops.append(Hop(_field(hop, "query", str, at), _field(hop, "title", str, at), _field(hop, "text", str, at)))
    answers = _field(item, "answers", list, where)
    if not all(isinstance(a, str) and a for a in answers):
        raise WorldError(f"{where}: field 'answers' must hold non-empty strings")
    return WorldQuestion(
        id=_field(item, "id", str, where),
        split=split,
        question=_field(item, "question", str, where),
        answers=tuple(answers),
        wrong=_field(item, "wrong", str, where),
        hops=tuple(hops),
        data_source=str(item.get("data_source") or "unknown"),
    )


def parse_world(source: Mapping[str, Any], *, where: str = str(QUESTIONS)) -> tuple[WorldQuestion, ...]:
    """The questions of every split, train first (pure). Question texts must be unique."""
    questions: list[WorldQuestion] = []
    seen: dict[str, str] = {}
    for split in SPLITS:
        items = source.get(split)
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise WorldError(f"{where}: field {split!r} must be a list of questions")
        for index, item in enumerate(items):
            question = _parse_question(item, split, f"{where}: {split}[{index}]")
            key = question_key(question.question)
            if key in seen:
                raise WorldError(f"{where}: {question.id} repeats the question of {seen[key]}")
            seen[key] = question.id
            questions.append(question)
    return tuple(questions)


def load_world(path: str | Path = QUESTIONS) -> tuple[WorldQuestion, ...]:
    source = read_json_object(path, WorldError, "offline question file")
    return parse_world(source, where=str(path))


def passages_by_query(questions: Sequence[WorldQuestion]) -> dict[str, Hop]:
    """Every hop query and its passage (a query shared by two questions has one passage)."""
    found: dict[str, Hop] = {}
    for question in questions:
        for hop in question.hops:
            if found.setdefault(hop.query, hop) != hop:
                raise WorldError(f"query {hop.query!r} ({question.id}) has two different passages")
    return found

"""The offline question set as knowledge: per question, its search hops and the answers.

``searchr1/offline/questions.json`` is the hand-written source of the offline world, and
``searchr1/offline/pages.json`` of its page questions (see :mod:`searchr1.offline`). This module
reads them, with the long-horizon questions and the known ones (``known.json``: answered right
without searching), into small frozen records that the twin's learning policy and its tests use: the
question, its hops in order (the query, and the title and passage the offline search service
returns for it), the accepted answers and one plausible wrong answer. A *page hop* also has the
page's ``lead`` (the passage search shows) and ``body`` (the passages after it, the evidence
among them): its evidence is reached only by opening the page. Pure apart from
:func:`load_world` and :func:`load_worlds`, which read the files.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from searchr1.core.errors import UserError
from searchr1.offline import KNOWN, LONG, PAGES, QUESTIONS
from searchr1.basics.jsonl import read_json_object

SPLITS = ("train", "dev")
T = TypeVar("T")


class WorldError(UserError, ValueError):
    """``questions.json`` is malformed; the message names the file, the question and the field."""


@dataclass(frozen=True)
class Hop:
    """One search step: the query and the passage the offline search returns for it; for a page
    hop, the passage search shows (``lead``) and the page's later passages (``body``), one of
    which is the evidence ``text``."""

    query: str
    title: str
    text: str
    lead: str = ""
    body: tuple[str, ...] = ()
    note: str = ""  # the fact in a few words (long-horizon questions): what a turn writes down

    @property
    def is_page(self) -> bool:
        return bool(self.lead)


@dataclass(frozen=True)
class WorldQuestion:
    id: str
    split: str
    question: str
    answers: tuple[str, ...]
    wrong: str
    hops: tuple[Hop, ...]
    data_source: str = "unknown"
    known: bool = False  # the base model knows the answer: it answers right without searching


def question_key(text: str) -> str:
    """How a question is recognised in a prompt: NFC (the tokenizer's normaliser), trimmed."""
    return unicodedata.normalize("NFC", text).strip()


def _field(item: Mapping[str, object], key: str, kind: type[T], where: str) -> T:
    if key not in item:
        raise WorldError(f"{where}: missing field {key!r}")
    value = item[key]
    empty = isinstance(value, (str, list)) and not value
    if not isinstance(value, kind) or empty:
        raise WorldError(f"{where}: field {key!r} must be a non-empty {kind.__name__}")
    return value


def _parse_question(item: object, split: str, where: str) -> WorldQuestion:
    if not isinstance(item, Mapping):
        raise WorldError(f"{where}: must be an object")
    where = f"{where} ({item.get('id', '?')})"
    hops = []
    for index, hop in enumerate(_field(item, "hops", list, where)):
        at = f"{where}: hops[{index}]"
        if not isinstance(hop, Mapping):
            raise WorldError(f"{at}: must be an object")
        text = _field(hop, "text", str, at)
        lead = ""
        body: tuple[str, ...] = ()
        if "lead" in hop:
            lead = _field(hop, "lead", str, at)
            body = tuple(_field(hop, "body", list, at))
            if not all(isinstance(passage, str) and passage for passage in body) or text not in body:
                raise WorldError(f"{at}: field 'body' must list the page's passages after the lead, "
                                 "'text' among them")
        note = _field(hop, "note", str, at) if "note" in hop else ""
        hops.append(Hop(_field(hop, "query", str, at), _field(hop, "title", str, at), text, lead, body, note))
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
        known=item.get("known") is True,
    )


def parse_world(source: Mapping[str, object], *, where: str = str(QUESTIONS)) -> tuple[WorldQuestion, ...]:
    """The questions of every split, train first (pure). Question texts must be unique."""
    questions: list[WorldQuestion] = []
    seen: dict[str, str] = {}
    for split in SPLITS:
        items = source.get(split)
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise WorldError(f"{where}: field {split!r} must be a list of questions")
        for index, item in enumerate(items):
            questions.append(_unseen(_parse_question(item, split, f"{where}: {split}[{index}]"), where, seen))
    return tuple(questions)


def _unseen(question: WorldQuestion, where: str, seen: dict[str, str]) -> WorldQuestion:
    """``question``, once no earlier one (``seen``: question key -> id, updated) asks the same."""
    key = question_key(question.question)
    if key in seen:
        raise WorldError(f"{where}: {question.id} repeats the question of {seen[key]}")
    seen[key] = question.id
    return question


def load_world(path: str | Path = QUESTIONS) -> tuple[WorldQuestion, ...]:
    source = read_json_object(path, WorldError, "offline question file")
    return parse_world(source, where=str(path))


def load_worlds(paths: Sequence[str | Path] = (QUESTIONS, PAGES, LONG, KNOWN)) -> tuple[WorldQuestion, ...]:
    """Every question of ``paths`` (the offline world, its page questions, its long-horizon
    questions and its known questions), each once."""
    seen: dict[str, str] = {}
    return tuple(_unseen(question, str(path), seen) for path in paths for question in load_world(path))


def passages_by_query(questions: Sequence[WorldQuestion]) -> dict[str, Hop]:
    """Every hop query and its passage (a query shared by two questions has one passage)."""
    found: dict[str, Hop] = {}
    for question in questions:
        for hop in question.hops:
            if found.setdefault(hop.query, hop) != hop:
                raise WorldError(f"query {hop.query!r} ({question.id}) has two different passages")
    return found

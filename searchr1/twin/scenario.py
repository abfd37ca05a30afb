"""The scripted scenario format: per question, per sample, per turn, the assistant text.

The twin's ``scripted`` policy replies from a scenario; golden scenarios and the shipped
offline world are scenarios too. Scenario file (JSON)::

    {"name": "...", "description": "...", "backend": "wikipedia",
     "cassette": "cassettes/wikipedia/demo.yaml",          # relative to the repository
     "rollout": {"group_size": 2, "max_search_calls": 2},   # RolloutConfig overrides
     "questions": [
        {"id": "lp-1", "question": "...", "answers": ["France"], "data_source": "nq",
         "samples": [["<tool_call>...</tool_call>", "Answer: France"], ["Answer: Spain"]]}]}

Parsing is pure; :func:`load_scenario` reads the file and names it (and the JSON line) in
every error.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from searchr1.core.errors import UserError
from searchr1.core.types import SearchExample
from searchr1.basics.jsonl import read_json_object

T = TypeVar("T")


class ScenarioError(UserError, ValueError):
    """A scenario file is malformed, or a prompt does not match any scripted conversation."""


@dataclass(frozen=True)
class ScriptedQuestion:
    example: SearchExample
    samples: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    questions: tuple[ScriptedQuestion, ...]
    description: str = ""
    backend: str | None = None
    cassette: str | None = None
    # RolloutConfig's keyword arguments as the file gives them: each setting's rule checks its value when
    # they are applied, and no one type holds the values of every setting
    rollout: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def examples(self) -> list[SearchExample]:
        return [q.example for q in self.questions]


def normalise(text: str) -> str:
    """How scripted text is compared: NFC (the tokenizer's normaliser), trimmed."""
    return unicodedata.normalize("NFC", text).strip()


def _require(mapping: Mapping[str, object], key: str, kind: type[T], where: str) -> T:
    if key not in mapping:
        raise ScenarioError(f"{where}: missing field {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ScenarioError(f"{where}: field {key!r} must be {getattr(kind, '__name__', kind)}, got "
                            f"{type(value).__name__}")
    return value


def parse_scenario(raw: Mapping[str, object], *, where: str = "scenario") -> Scenario:
    questions = []
    seen: set[str] = set()
    for index, item in enumerate(_require(raw, "questions", list, where)):
        at = f"{where}: questions[{index}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{at}: must be an object")
        question = _require(item, "question", str, at)
        key = normalise(question)
        if key in seen:
            raise ScenarioError(f"{at}: question {question!r} appears twice")
        seen.add(key)
        answers = _require(item, "answers", list, at)
        samples = _require(item, "samples", list, at)
        if not samples:
            raise ScenarioError(f"{at}: needs at least one scripted sample")
        scripted = []
        for j, turns in enumerate(samples):
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise ScenarioError(f"{at}.samples[{j}]: must be a non-empty list of turn texts")
            scripted.append(tuple(turns))
        example = SearchExample(
            id=str(item.get("id") or f"{index}"),
            question=question,
            answers=tuple(str(a) for a in answers),
            data_source=str(item.get("data_source") or "unknown"),
        )
        questions.append(ScriptedQuestion(example, tuple(scripted)))
    rollout = raw.get("rollout") or {}
    if not isinstance(rollout, Mapping):
        raise ScenarioError(f"{where}: 'rollout' must be an object of RolloutConfig overrides")
    return Scenario(
        name=str(raw.get("name") or where),
        description=str(raw.get("description") or ""),
        # as the file gives them, unchecked (a golden scenario must name both: tools/golden.py)
        backend=cast("str | None", raw.get("backend")),
        cassette=cast("str | None", raw.get("cassette")),
        rollout=dict(rollout),
        questions=tuple(questions),
    )


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    scenario = parse_scenario(read_json_object(path, ScenarioError, "scenario file"), where=str(path))
    return Scenario(**{**scenario.__dict__, "path": path})

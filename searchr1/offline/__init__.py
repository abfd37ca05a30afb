"""The shipped offline world: a small question set, a scripted policy for it, and the canned
search results its queries get. An offline run is served one of two twin policies
(:class:`OfflinePolicy`): the scripted one, or a small policy that learns on these questions.

``questions.json`` is the hand-written source. :func:`build_offline_files` turns it into

* ``scenario.json``: the scripted policy (8 samples per question, mixed behaviours: search
  every hop and answer, stop after one hop, guess, emit a JSON-style call, forget the
  ``Answer:`` line, search and still answer wrongly, repeat a search), used by
  the offline twin's scripted policy for ``train --offline``, ``eval --offline`` and ``rollout --offline``;
* ``train.jsonl`` / ``dev.jsonl``: the questions in the dataset format;
* ``pages_train.jsonl`` / ``pages_dev.jsonl``: the page questions of ``pages.json`` (evidence
  that only ``open_page`` reaches, over ``--backend local``) in the dataset format;
* ``cassettes/specs/offline.json``: a cassette spec with the canned passages for every query,
  from which ``python cli.py cassettes build`` records ``cassettes/<backend>/offline.yaml``.

Regenerate everything with ``python cli.py offline-data``; ``--check`` fails if a generated
file differs from what the source produces (a test runs it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from searchr1.basics import invocation
from searchr1.basics.json_types import JsonObject


class OfflinePolicy(StrEnum):
    """The twin policy an offline run trains, evaluates, asks or serves (``--offline-policy``;
    ``config.json``'s ``offline_policy``)."""

    LEARNING = "learning"  # a small model over whole assistant turns that improves from the updates
    SCRIPTED = "scripted"  # the fixed scenario of the golden tests (scenario.json)


OFFLINE_POLICIES: tuple[str, ...] = tuple(policy.value for policy in OfflinePolicy)  # a flag's choices

OFFLINE_DIR = Path(__file__).resolve().parent
_CHECKOUT = OFFLINE_DIR.parents[1]
# The folder holding cassettes/ and golden/: the checkout the package runs from, or the copy an
# installed wheel carries in searchr1/_shipped (setup.py).
REPO_ROOT = _CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file() else OFFLINE_DIR.parent / "_shipped"
QUESTIONS = OFFLINE_DIR / "questions.json"
PAGES = OFFLINE_DIR / "pages.json"  # the page questions: evidence only open_page reaches
PAGES_TRAIN = OFFLINE_DIR / "pages_train.jsonl"
PAGES_DEV = OFFLINE_DIR / "pages_dev.jsonl"
SCENARIO = OFFLINE_DIR / "scenario.json"
TRAIN = OFFLINE_DIR / "train.jsonl"
DEV = OFFLINE_DIR / "dev.jsonl"
CASSETTE_SPEC = REPO_ROOT / "cassettes" / "specs" / "offline.json"
CASSETTE_NAME = "offline"
BACKENDS = ("wikipedia", "zhihu", "deepseek", "retriever")

CALL = "<tool_call>\n<function=search>\n<parameter=query>\n{query}\n</parameter>\n</function>\n</tool_call>"

# One opening per sample index: every sample's first turn differs, so every later prompt
# differs too and the scripted policy stays a function of its prompt.
OPENINGS = (
    "I should look this up.",
    "Let me search for that first.",
    "I will check a source before answering.",
    "A quick search will confirm it.",
    "I need evidence for this.",
    "Let me find a reliable passage.",
    "Searching is safer than guessing here.",
    "I want to verify this.",
)
BEHAVIOURS = (
    "full",            # search every hop, then the right answer
    "one_hop",         # search the first hop only, then answer (wrong on two-hop questions)
    "guess_wrong",     # no search, wrong answer
    "guess_right",     # no search, right answer
    "json_call",       # a JSON-style tool call: invalid for Qwen3.5
    "no_answer",       # no Answer: line (format failure)
    "search_then_wrong",
    "double_search",   # repeats the first query once, then proceeds like "full"
)


class Hop(TypedDict):
    """One search of a question: its query and the canned passage it finds (a page question's hop
    also has the page: its ``lead`` passage, which the search finds, and the ``body`` after it)."""

    query: str
    title: str
    text: str
    lead: NotRequired[str]
    body: NotRequired[list[str]]


class Question(TypedDict):
    """One question of ``questions.json`` or ``pages.json``."""

    id: str
    data_source: str
    question: str
    answers: list[str]
    wrong: str  # the answer the scripted policy gives when it answers wrongly
    hops: list[Hop]
    behaviour: NotRequired[str]  # one of BEHAVIOURS for every sample (else they rotate)


class CannedPassage(TypedDict):
    """A result of an extra query; ``repeat`` > 1 makes one very long passage of numbered copies."""

    title: str
    text: str
    repeat: NotRequired[int]


class ExtraQuery(TypedDict):
    """A query of the cassette spec that no hop asks (the spec's vocabulary: searchr1.search.cassette_specs)."""

    query: str
    scenario: NotRequired[str]
    results: NotRequired[list[CannedPassage]]
    responses: NotRequired[list[JsonObject]]
    expect: NotRequired[JsonObject]


class OfflineSource(TypedDict):
    """``questions.json`` (or ``pages.json``, which has no extra queries)."""

    about: NotRequired[str]
    train: list[Question]
    dev: list[Question]
    extra_queries: NotRequired[list[ExtraQuery]]


def cassette_path(backend: str) -> Path:
    return REPO_ROOT / "cassettes" / backend / f"{CASSETTE_NAME}.yaml"


def _call(query: str, opening: str = "") -> str:
    text = CALL.format(query=query)
    return f"{opening}\n\n{text}" if opening else text


def script_sample(item: Question, behaviour: str, opening: str) -> list[str]:
    """The assistant turns of one scripted sample (pure)."""
    hops = [hop["query"] for hop in item["hops"]]
    right, wrong = item["answers"][0], item["wrong"]
    if behaviour == "full":
        return [_call(hops[0], opening)] + [_call(q) for q in hops[1:]] + [f"The passages agree.\n\nAnswer: {right}"]
    if behaviour == "one_hop":
        return [_call(hops[0], opening), f"Answer: {right if len(hops) == 1 else wrong}"]
    if behaviour == "guess_wrong":
        return [f"{opening} Actually, I am fairly sure already.\n\nAnswer: {wrong}"]
    if behaviour == "guess_right":
        return [f"{opening} Actually, I know this one.\n\nAnswer: {right}"]
    if behaviour == "json_call":
        payload = json.dumps({"name": "search", "arguments": {"query": hops[0]}})
        return [f"{opening}\n\n<tool_call>\n{payload}\n</tool_call>"]
    if behaviour == "no_answer":
        return [f"{opening} I cannot tell without more context."]
    if behaviour == "search_then_wrong":
        return [_call(hops[0], opening), f"Answer: {wrong}"]
    if behaviour == "double_search":
        return ([_call(hops[0], opening), _call(hops[0], "That was short; once more.")]
                + [_call(q) for q in hops[1:]] + [f"Answer: {right}"])
    raise ValueError(f"unknown behaviour {behaviour!r}")


def _question_entries(items: list[Question], offset: int, samples: int) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = []
    for index, item in enumerate(items):
        fixed = item.get("behaviour")
        if fixed is not None and fixed not in BEHAVIOURS:
            raise ValueError(f"{QUESTIONS}: {item['id']}: unknown behaviour {fixed!r}")
        scripted = [
            script_sample(item, fixed or BEHAVIOURS[(j + index + offset) % len(BEHAVIOURS)], OPENINGS[j])
            for j in range(samples)
        ]
        entries.append({
            "id": item["id"], "question": item["question"], "answers": item["answers"],
            "data_source": item["data_source"], "samples": scripted,
        })
    return entries


def _expand_repeats(query: ExtraQuery) -> ExtraQuery:
    """``{"text": t, "repeat": n}`` becomes n numbered copies of t (for very long passages)."""
    if "results" not in query:
        return query.copy()
    results = []
    for result in query["results"]:
        passage = result.copy()
        count = int(passage.pop("repeat", 1))
        if count > 1:
            passage["text"] = " ".join(f"({i}) {passage['text']}" for i in range(1, count + 1))
        results.append(passage)
    return {**query, "results": results}


def build_offline_files(source: OfflineSource, *, samples: int = 8) -> dict[Path, str]:
    """Every generated file's path and text (pure: nothing is written)."""
    train, dev = source["train"], source["dev"]
    scenario = {
        "name": "offline",
        "description": "Scripted policy for the shipped offline question set (generated from "
                       f"searchr1/offline/questions.json by `{invocation.command('offline-data', checkout=True)}`).",
        "backend": "wikipedia",
        "cassette": f"cassettes/wikipedia/{CASSETTE_NAME}.yaml",
        "questions": _question_entries(train, 0, samples) + _question_entries(dev, len(train), samples),
    }

    queries: dict[str, ExtraQuery] = {}
    for item in train + dev:
        for hop in item["hops"]:
            entry: ExtraQuery = {"query": hop["query"], "results": [{"title": hop["title"], "text": hop["text"]}]}
            if queries.setdefault(hop["query"], entry) != entry:
                raise ValueError(f"{QUESTIONS}: query {hop['query']!r} has two different results")
    for extra in source.get("extra_queries", []):
        if extra["query"] in queries:
            raise ValueError(f"{QUESTIONS}: extra query {extra['query']!r} duplicates a hop")
        queries[extra["query"]] = _expand_repeats(extra)
    spec = {
        "description": "Offline question set (generated from searchr1/offline/questions.json by "
                       f"`{invocation.command('offline-data', checkout=True)}`; do not edit by hand).",
        "backends": list(BACKENDS),
        "options": {"max_retries": 2},
        "queries": list(queries.values()),
    }

    def dump(payload: object) -> str:
        return json.dumps(payload, indent=1, ensure_ascii=False) + "\n"

    return {SCENARIO: dump(scenario), TRAIN: dataset_lines(train), DEV: dataset_lines(dev), CASSETTE_SPEC: dump(spec)}


def load_source(path: Path = QUESTIONS) -> OfflineSource:
    """``questions.json`` or ``pages.json``: hand-written files of this package, read as written."""
    return cast(OfflineSource, json.loads(path.read_text("utf-8")))


def dataset_lines(items: Sequence[Question]) -> str:
    """Questions in the dataset format (JSON lines of id, question, answers, data_source)."""
    rows = [{"id": i["id"], "question": i["question"], "answers": i["answers"], "data_source": i["data_source"]}
            for i in items]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def build_page_files(pages: OfflineSource) -> dict[Path, str]:
    """The page questions' datasets (pure): ``pages_train.jsonl`` and ``pages_dev.jsonl``. Their
    pages enter the shipped corpus through ``index offline-corpus``, not through a cassette: only
    the local backend has pages to open."""
    return {PAGES_TRAIN: dataset_lines(pages["train"]), PAGES_DEV: dataset_lines(pages["dev"])}

"""Offline twins of the two remote services a rollout talks to.

``ScriptedSampler`` has the call shape of ``pytrio.SamplingClient`` (``sample_async`` with
``prompt``, ``num_samples``, ``sampling_params``, ``return_text``; ``SampleResponse`` /
``SampleSequence`` results) and answers from a *scenario*: per question, per sample, per
turn, the assistant text. It behaves like a deterministic policy: the reply is a function of
the prompt. It finds the question and the turn by reading the prompt, tokenizes the scripted
text with the real tokenizer, appends ``<|im_end|>`` (or stops at ``max_tokens`` with stop
reason ``length``) and derives logprobs from a seed and the content, so replies do not
depend on the order requests arrive in.

``ScriptedSearch`` is an in-memory search backend (query -> result) with optional latency,
for tests and benchmarks that do not need the HTTP layer.

Scenario file (JSON)::

    {"name": "...", "description": "...", "backend": "wikipedia",
     "cassette": "cassettes/wikipedia/demo.yaml",          # relative to the repository
     "rollout": {"group_size": 2, "max_search_calls": 2},   # RolloutConfig overrides
     "questions": [
        {"id": "lp-1", "question": "...", "answers": ["France"], "data_source": "nq",
         "samples": [["<tool_call>...</tool_call>", "Answer: France"], ["Answer: Spain"]]}]}
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .data import SearchExample
from .search.types import SearchResult

_ASSISTANT_HEADER = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
_USER_HEADER = "<|im_start|>user\n"


class ScenarioError(ValueError):
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
    rollout: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def examples(self) -> list[SearchExample]:
        return [q.example for q in self.questions]


def _require(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in mapping:
        raise ScenarioError(f"{where}: missing field {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ScenarioError(f"{where}: field {key!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def parse_scenario(raw: Mapping[str, Any], *, where: str = "scenario") -> Scenario:
    questions = []
    seen: set[str] = set()
    for index, item in enumerate(_require(raw, "questions", list, where)):
        at = f"{where}: questions[{index}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{at}: must be an object")
        question = _require(item, "question", str, at)
        key = _normalise(question)
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
        backend=raw.get("backend"),
        cassette=raw.get("cassette"),
        rollout=dict(rollout),
        questions=tuple(questions),
    )


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"scenario file {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ScenarioError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{path}: the top level must be an object")
    scenario = parse_scenario(raw, where=str(path))
    return Scenario(**{**scenario.__dict__, "path": path})


def _normalise(text: str) -> str:
    return unicodedata.normalize("NFC", text).strip()


@dataclass
class SampleCall:
    """What one request asked for, and when it ran (for concurrency tests and benchmarks)."""

    question_id: str
    turn: int
    num_samples: int
    sample_indices: tuple[int, ...]
    max_tokens: int
    seed: int | None
    prompt_tokens: int
    start: float = 0.0
    end: float = 0.0


def _read_conversation(text: str) -> tuple[str, list[str]]:
    """The question and the assistant turns (text before each ``<|im_end|>``) of a prompt."""
    start = text.find(_USER_HEADER)
    if start < 0:
        raise ScenarioError("the prompt holds no user turn")
    question = text[start + len(_USER_HEADER):].split("<|im_end|>", 1)[0]
    parts = text.split(_ASSISTANT_HEADER)
    if len(parts) < 2 or parts[-1] != "":
        raise ScenarioError("the prompt does not end with a no-think assistant generation prompt")
    turns = [part.split("<|im_end|>", 1)[0] for part in parts[1:-1]]
    return question, turns


class ScriptedSampler:
    """A deterministic stand-in for ``pytrio.SamplingClient`` driven by a scenario."""

    def __init__(
        self,
        questions: Scenario | Sequence[ScriptedQuestion],
        tokenizer: Any,
        *,
        seed: int = 0,
        include_stop_token: bool = True,
        latency: Callable[[SampleCall, list[list[int]]], float] | None = None,
        faults: Callable[[SampleCall], BaseException | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        model_path: str | None = None,
    ) -> None:
        scripted = questions.questions if isinstance(questions, Scenario) else tuple(questions)
        self._by_question = {_normalise(q.example.question): q for q in scripted}
        self._tokenizer = tokenizer
        self._seed = seed
        self._include_stop = include_stop_token
        self._latency = latency
        self._faults = faults
        self._clock = clock
        self._im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.model_path = model_path
        self.calls: list[SampleCall] = []

    @property
    def model_id(self) -> str:
        return "scripted"

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    # -- the reply, as a pure function of the prompt ------------------------------------

    def _locate(self, tokens: list[int], num_samples: int) -> tuple[ScriptedQuestion, int, list[int]]:
        text = self._tokenizer.decode(tokens, skip_special_tokens=False)
        question_text, turns = _read_conversation(text)
        scripted = self._by_question.get(_normalise(question_text))
        if scripted is None:
            raise ScenarioError(
                f"no scripted question matches the prompt's question {question_text!r} "
                f"(turn {len(turns) + 1})"
            )
        qid, turn = scripted.example.id, len(turns)
        if turn == 0:
            if num_samples > len(scripted.samples):
                raise ScenarioError(
                    f"question {qid!r}: asked for {num_samples} samples on turn 1, "
                    f"the scenario scripts {len(scripted.samples)}"
                )
            return scripted, turn, list(range(num_samples))
        if num_samples != 1:
            raise ScenarioError(f"question {qid!r} turn {turn + 1}: later turns take num_samples=1")
        seen = [_normalise(t) for t in turns]
        matching = [
            j for j, sample in enumerate(scripted.samples)
            if len(sample) >= turn and [_normalise(t) for t in sample[:turn]] == seen
        ]
        if not matching:
            raise ScenarioError(
                f"question {qid!r} turn {turn + 1}: no scripted sample has the turns this prompt holds"
            )
        continuing = [j for j in matching if len(scripted.samples[j]) > turn]
        if not continuing:
            raise ScenarioError(
                f"question {qid!r} turn {turn + 1}: sample {matching[0]} has only {turn} scripted "
                "turn(s) but the engine asked for another"
            )
        replies = {scripted.samples[j][turn] for j in continuing}
        if len(replies) > 1:
            raise ScenarioError(
                f"question {qid!r} turn {turn + 1}: samples {continuing} share their history but "
                "script different replies (a scripted policy must be a function of its prompt)"
            )
        return scripted, turn, [continuing[0]]

    def _sequence(self, prompt: list[int], scripted: ScriptedQuestion, turn: int, j: int,
                  max_tokens: int) -> Any:
        from pytrio.types import SampleSequence

        text = scripted.samples[j][turn]
        tokens = list(self._tokenizer.encode(text, add_special_tokens=False)) + [self._im_end]
        stop_reason = "stop"
        if len(tokens) > max_tokens:
            tokens, stop_reason = tokens[:max_tokens], "length"
            text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        elif not self._include_stop:
            tokens = tokens[:-1]
        digest = hashlib.blake2b(
            np.asarray(prompt, dtype=np.int64).tobytes() + f"/{self._seed}/{j}".encode(), digest_size=8
        ).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "big"))
        logprobs = (-np.abs(rng.normal(0.0, 0.6, size=len(tokens)))).astype(np.float32)
        return SampleSequence(stop_reason=stop_reason, tokens=tokens, text=text,
                              logprobs=[float(x) for x in logprobs])

    def respond(self, prompt_tokens: list[int], num_samples: int, max_tokens: int,
                seed: int | None = None) -> tuple[SampleCall, Any]:
        from pytrio.types import SampleResponse

        if max_tokens is None or max_tokens <= 0:
            raise ValueError("sampling_params.max_tokens must be set and > 0")
        scripted, turn, indices = self._locate(prompt_tokens, num_samples)
        call = SampleCall(scripted.example.id, turn, num_samples, tuple(indices), max_tokens, seed,
                          len(prompt_tokens))
        sequences = [self._sequence(prompt_tokens, scripted, turn, j, max_tokens) for j in indices]
        response = SampleResponse(
            sequences=sequences,
            input_tokens=len(prompt_tokens),
            output_tokens=sum(len(s.tokens) for s in sequences),
        )
        return call, response

    # -- the pytrio call shape -----------------------------------------------------------

    async def sample_async(self, prompt: Any, num_samples: int = 1, sampling_params: Any = None,
                           include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
                           return_text: bool = True) -> Any:
        tokens = list(prompt.to_ints())
        max_tokens = getattr(sampling_params, "max_tokens", None)
        seed = getattr(sampling_params, "seed", None)
        call, response = self.respond(tokens, num_samples, max_tokens, seed)
        call.start = self._clock()
        self.calls.append(call)
        if self._faults is not None:
            error = self._faults(call)
            if error is not None:
                call.end = self._clock()
                raise error
        if self._latency is not None:
            await asyncio.sleep(self._latency(call, [s.tokens for s in response.sequences]))
        call.end = self._clock()
        if not return_text:
            for sequence in response.sequences:
                sequence.text = None
        return response

    def sample(self, prompt: Any, num_samples: int = 1, sampling_params: Any = None,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
               return_text: bool = True) -> Any:
        from pytrio.types import APIFuture

        max_tokens = getattr(sampling_params, "max_tokens", None)
        _, response = self.respond(list(prompt.to_ints()), num_samples, max_tokens,
                                   getattr(sampling_params, "seed", None))
        return APIFuture.completed(response)


@dataclass
class SearchCall:
    query: str
    start: float
    end: float


class ScriptedSearch:
    """In-memory search backend: a fixed result per query, optional latency and a cap."""

    name = "scripted"

    def __init__(
        self,
        results: Mapping[str, SearchResult],
        *,
        default: SearchResult | None = None,
        latency: Callable[[str], float] | None = None,
        concurrency: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._results = dict(results)
        self._default = default
        self._latency = latency
        self._semaphore = asyncio.Semaphore(concurrency) if concurrency else None
        self._clock = clock
        self.calls: list[SearchCall] = []

    async def _search(self, query: str) -> SearchResult:
        start = self._clock()
        if self._latency is not None:
            await asyncio.sleep(self._latency(query))
        self.calls.append(SearchCall(query, start, self._clock()))
        result = self._results.get(query, self._default)
        if result is None:
            raise KeyError(f"ScriptedSearch has no result for query {query!r}")
        return result

    async def search(self, query: str) -> SearchResult:
        if self._semaphore is None:
            return await self._search(query)
        async with self._semaphore:
            return await self._search(query)
